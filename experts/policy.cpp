#include "experts/policy.h"

#include <cmath>
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

}  // namespace magnetar::experts
