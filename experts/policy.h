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

}  // namespace magnetar::experts
