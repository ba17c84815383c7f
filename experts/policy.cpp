#include "experts/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace magnetar::experts {
namespace {

class Lru final : public CachePolicy {
 public:
  explicit Lru(size_t n) : last_(n, 0) {}
  const char* name() const override { return "lru"; }
  void touch(uint32_t key, uint64_t tick) override { last_[key] = tick; }
  double score(uint32_t key, uint64_t) const override { return double(last_[key]); }

 private:
  std::vector<uint64_t> last_;
};

// f(t) = f(t0) * 2^(-(t - t0) / half_life), plus one at each touch.
class DecayedFrequency final : public CachePolicy {
 public:
  DecayedFrequency(size_t n, double half_life) : freq_(n, 0.0), last_(n, 0), rate_(std::log(2.0) / half_life) {}
  const char* name() const override { return "lfu"; }
  void touch(uint32_t key, uint64_t tick) override {
    freq_[key] = decayed(key, tick) + 1.0;
    last_[key] = tick;
  }
  double score(uint32_t key, uint64_t tick) const override { return decayed(key, tick); }

 private:
  double decayed(uint32_t key, uint64_t tick) const {
    return freq_[key] * std::exp(-rate_ * double(tick - last_[key]));
  }
  std::vector<double> freq_;
  std::vector<uint64_t> last_;
  double rate_;
};

}  // namespace

std::unique_ptr<CachePolicy> make_policy(std::string_view name, size_t n_keys, double half_life) {
  if (name == "lru") return std::make_unique<Lru>(n_keys);
  if (name == "lfu") return std::make_unique<DecayedFrequency>(n_keys, half_life);
  return nullptr;
}

namespace {

// An average that follows the latest measurements (weight 1/8 each; the first one as it is).
void follow(double& average, double x) { average = average > 0 ? average + (x - average) / 8 : x; }

}  // namespace

int64_t LaneBalance::lane_count(int64_t n, int64_t cold) {
  // The lane's time for L experts: measured, else scaled per expert from the nearest measured size (0: none is).
  auto lane_time = [&](int64_t L) {
    int64_t near = 0;
    for (int64_t at = 1; at <= kSizes; ++at) {
      if (lane_seconds_[at] > 0 && (near == 0 || std::abs(at - L) < std::abs(near - L))) near = at;
    }
    return near == 0 ? 0.0 : lane_seconds_[near] * double(L) / double(near);
  };
  if (copy_seconds_ <= 0 || lane_time(1) <= 0) return cold;
  int64_t best = cold;
  double best_time = INFINITY;
  for (int64_t L = cold; L >= 0; --L) {
    const double t = std::max(lane_time(L), double(n - L) * copy_seconds_);
    if (t < best_time) {
      best_time = t;
      best = L;
    }
  }
  if (best > 0) {
    probe_every_ = kProbeEvery;
  } else if (cold > 0 && ++idle_ >= probe_every_) {
    best = 1;
    probe_every_ = std::min(2 * probe_every_, kProbeMax);
  }
  return best;
}

void LaneBalance::lane_ran(int64_t experts, double seconds) {
  idle_ = 0;
  if (!lane_warm_) {
    lane_warm_ = true;
    return;
  }
  if (experts >= 1 && experts <= kSizes) follow(lane_seconds_[experts], seconds);
}

void LaneBalance::copies_ran(int64_t experts, double seconds) {
  if (experts >= 1) follow(copy_seconds_, seconds / double(experts));
}

}  // namespace magnetar::experts
