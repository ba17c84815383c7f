// Which cached expert to evict (STYLE.md rule 9: the policy sits behind one small interface). The store asks
// for a score of each evictable entry and evicts the lowest; the policy sees every access by key
// (layer * n_expert + expert), so an expert's history survives its eviction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace magnetar::experts {

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual const char* name() const = 0;
  // `tick` grows by one per layer acquired (so decode advances n_moe_layers ticks per token).
  virtual void touch(uint32_t key, uint64_t tick) = 0;
  // Lower is evicted first.
  virtual double score(uint32_t key, uint64_t tick) const = 0;
};

// "lru": least recently used. "lfu": frequency with exponential decay (half-life `half_life` ticks), which
// also rewards recency: an entry used often long ago decays below one used a few times just now.
// nullptr for an unknown name.
std::unique_ptr<CachePolicy> make_policy(std::string_view name, size_t n_keys, double half_life);
inline constexpr const char* kPolicyNames = "lfu, lru";

// The CPU expert lane's share of a layer's misses (the tiered GPU mode's --cpu-experts): the lane computes some of
// them on the CPU while the bus copies the others up; both run at once, so the layer waits for the slower side.
// LaneBalance keeps what both took (averages that follow the latest measurements: the bus's time per copied expert,
// the lane's wall time per number of experts) and gives the lane the count that ends both soonest.
class LaneBalance {
 public:
  static constexpr int64_t kSizes = 16;       // lane sizes measured one by one; others are scaled per expert
  static constexpr int64_t kProbeEvery = 64;  // layers with cold misses but no lane before it gets one again
  static constexpr int64_t kProbeMax = 4096;  // the longest interval between probes (each doubles it)
  // Of n misses, at most `cold` may go to the lane: the count L minimizing max(lane time of L, (n - L) copy times),
  // the larger L on ties (fewer bytes over the bus). A lane size not measured is scaled from the nearest measured
  // one. Until both sides have been measured: `cold` (all of them, which measures the lane). After kProbeEvery calls
  // that gave the lane nothing although it could have taken some, at least 1: its time is measured again (a machine
  // whose load changed, a first measurement that was slow), at the cost of one expert on the slower side. A lane
  // that stays idle is probed ever more rarely (each probe doubles the interval, up to kProbeMax: on one H200 host a
  // probe took ~2.7 ms, the CPU pool's threads asleep, 8-10% of decode at a probe per 64 layers); the interval is
  // kProbeEvery again once the split gives the lane experts of its own accord.
  int64_t lane_count(int64_t n, int64_t cold);
  // The lane's first run is not kept: it pays the first touches of its buffers and threads.
  void lane_ran(int64_t experts, double seconds);
  void copies_ran(int64_t experts, double seconds);

 private:
  double lane_seconds_[kSizes + 1] = {};  // [L]: 0 until a lane of L experts has run
  double copy_seconds_ = 0;               // per copied expert
  bool lane_warm_ = false;
  int64_t idle_ = 0;  // calls since the lane last got an expert (counted where it could have)
  int64_t probe_every_ = kProbeEvery;
};

}  // namespace magnetar::experts
