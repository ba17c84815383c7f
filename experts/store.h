// The streamed expert store: routed experts read from the model's files on demand into a RAM cache of
// fixed-size slots with a byte budget (a buffer manager, STYLE.md rule 9).
//
// - Reads: O_DIRECT (falls back to buffered reads where the filesystem refuses it) through io_uring, or a
//   pread thread pool when io_uring is unavailable. Packed files: one read per expert record, adjacent
//   records of one acquire or prefetch coalesced into one vectored read. Standard files: three reads per
//   expert (gate, up, down), each widened to 4 KiB boundaries.
// - Cache: slots of slab_bytes (the largest expert of any layer, as read); an entry is free, loading or
//   ready, and pinned while the layer that acquired it computes. Eviction takes the lowest CachePolicy
//   score among ready, unpinned entries.
// - Prefetch: loads hinted experts into free slots, or evicts an entry only when no token used it in the
//   last 16 tokens: a hint never displaces a warm entry.
// - Census: every acquire counts toward MODEL.gguf.census (when a path is given); the store merges its
//   counts into the file at close and every `census_save_seconds`, and a new store loads the hottest
//   experts of the census up to its budget before the first token (warm start).
//
// Thread-safety: one thread (the forward pass) uses a store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "experts/census.h"
#include "experts/io.h"
#include "experts/layout.h"
#include "experts/policy.h"
#include "experts/source.h"

namespace magnetar::experts {

inline constexpr uint64_t kMeasureGap = UINT64_MAX;

struct StoreOptions {
  uint64_t cache_bytes = 0;                 // budget of the slot pool (whole slots are used)
  int queue_depth = 32;                     // io_uring entries
  bool use_uring = true;                    // false: the pread pool
  int pread_threads = 4;
  bool direct = true;                       // O_DIRECT when the filesystem allows it
  std::string policy = "lfu";               // make_policy names
  double half_life_tokens = 16;             // lfu decay, in tokens (converted to ticks by n_moe_layers)
  std::string census_path = {};             // empty: no census
  bool warm_start = true;                   // load the census's hottest experts at open
  double census_save_seconds = 60;
  // Reads through gaps of at most this many bytes between the records (packed) or part slices (standard) one
  // acquire or prefetch needs, into a scratch buffer, so that a prefill touching most of a layer's experts
  // becomes a few large reads instead of one per expert. Where reading the gap costs less than issuing one more
  // request. kMeasureGap: measured at open (calibrate_gap()); 0 merges adjacent reads only.
  uint64_t merge_gap_bytes = kMeasureGap;
};

struct LayerStats {
  uint64_t hits = 0;              // acquired and ready at acquire()
  uint64_t inflight_hits = 0;     // acquired while a prefetch read was still in flight
  uint64_t misses = 0;            // acquired and not cached: read on demand
  uint64_t reads = 0;             // read requests issued (demand + prefetch + warm start)
  uint64_t bytes_read = 0;
  uint64_t gap_bytes = 0;         // ... of bytes_read, read through gaps between needed experts and dropped
  double read_seconds = 0;        // sum over reads, submit to completion
  double read_seconds_max = 0;
  double wait_seconds = 0;        // time wait() blocked
  uint64_t prefetch_issued = 0;   // experts read because of a hint
  uint64_t prefetch_used = 0;     // ... later acquired
  uint64_t prefetch_wasted = 0;   // ... evicted without being acquired
  uint64_t predicted = 0;         // acquired experts that the last hint for this layer named
  uint64_t acquired = 0;          // acquired experts whose layer had a hint
};

struct StoreStats {
  std::vector<LayerStats> layers;
  uint64_t evictions = 0;
  uint64_t warm_experts = 0, warm_bytes = 0;
  double warm_seconds = 0;
  LayerStats total() const;
};

class StreamedExperts final : public ExpertSource {
 public:
  static Result<std::unique_ptr<StreamedExperts>> open(const gguf::Model& model, const ExpertLayout& layout,
                                                       const StoreOptions& options);
  ~StreamedExperts() override;

  void acquire(int64_t layer, std::span<const int32_t> experts, std::span<ExpertPtrs> ptrs,
               std::span<uint8_t> ready) override;
  Status wait(std::span<ExpertPtrs> ptrs) override;
  void release() override;
  void prefetch(int64_t layer, std::span<const int32_t> experts) override;
  void touch(int64_t layer, std::span<const int32_t> experts) override;
  std::span<uint8_t> host_memory() override { return {pool_, size_t(pool_bytes_)}; }

  // Bytes one slot takes: what open() needs per cached expert (the planner sizes budgets with it).
  static uint64_t slab_bytes(const ExpertLayout& layout);
  // "io_uring (queue depth 32), O_DIRECT, 1,024 slots of 10.13 MiB (10.13 GiB), policy lfu, census 12,345"
  std::string describe() const;
  const StoreStats& stats() const { return stats_; }
  // Whether each (layer, expert) is in the cache and ready: [n_layer * n_expert] of 0/1.
  std::vector<uint8_t> cached() const;
  void reset_stats();
  size_t n_slots() const { return slots_.size(); }
  // Merges this store's counts into the census file. `wait`: for the lock other processes may hold (at close); the
  // periodic save does not wait and keeps its counts for the next one.
  Status save_census(bool wait = true);

 private:
  enum class State : uint8_t { kFree, kLoading, kReady };
  struct Slot {
    uint32_t key = 0;
    State state = State::kFree;
    uint16_t pins = 0;
    bool prefetched = false;  // loaded by a hint and not yet acquired
    bool failed = false;      // one of its reads failed
    uint8_t pending = 0;      // reads still in flight
    uint64_t last_use = 0;    // tick of the last acquire (0: never)
  };
  // A page two neighbouring part slices share (standard layout: tensors are only 32-byte aligned) is read once,
  // into the first slice's buffer, and copied into the second's when the read completes.
  struct Fixup {
    const uint8_t* src;
    uint8_t* dst;
    uint64_t bytes;
  };
  struct Op {                 // one read in flight: the slots it fills (a slot once per part slice it gets)
    std::vector<uint32_t> slots;
    std::vector<Fixup> fixups;
    uint64_t gap_bytes = 0;
    uint64_t bytes_needed = 0;  // the read must return at least this many bytes
    int64_t layer = 0;
    uint32_t shard = 0;
    bool busy = false;
  };

  StreamedExperts(const gguf::Model& model, const ExpertLayout& layout, const StoreOptions& options);
  Status init();
  uint8_t* slot_data(uint32_t slot) const { return pool_ + uint64_t(slot) * slab_bytes_; }
  ExpertPtrs pointers(uint32_t slot) const;
  // A slot for `key`: a free one, else the lowest-scoring evictable one (for a prefetch, only one not used
  // in the last n_moe_layers ticks). UINT32_MAX when none.
  uint32_t allocate(bool for_prefetch);
  // A use of expert `key` (layer * n_expert + expert): its census count and eviction score.
  void count_use(uint32_t key) {
    census_delta_.counts[key]++;
    policy_->touch(key, tick_);
  }
  void evict(uint32_t slot);
  // Issues the reads that fill `slots` (all kLoading): adjacent records or part slices, and those separated by
  // at most merge_gap_bytes, go into one vectored read.
  void read_slots(int64_t layer, std::vector<uint32_t>& slots);
  void submit_op(uint32_t shard, uint64_t offset, std::vector<iovec>& iov, std::vector<uint32_t> slots,
                 std::vector<Fixup> fixups, uint64_t needed, uint64_t gap_bytes, int64_t layer);
  // Processes completions (waiting for at least `min`).
  void pump(size_t min);
  Status warm_start();
  // Sets gap_buffer_bytes_ from this reader on this disk: the time one more request costs at the queue depth
  // (64 small reads submitted together) times the bandwidth of large reads (4 x 16 MiB together), both read
  // into the empty pool at open. Reading a gap smaller than that beats splitting the read in two.
  Status calibrate_gap();
  void maybe_save_census();
  Status save_census_file(const Census& census);

  const gguf::Model& model_;
  const ExpertLayout& layout_;
  StoreOptions options_;
  std::unique_ptr<Reader> reader_;
  std::unique_ptr<CachePolicy> policy_;
  std::vector<int> fds_;
  bool direct_ = false;
  uint64_t slab_bytes_ = 0;
  uint64_t part_base_[kParts] = {};  // standard layout: where each part's read starts in a slot
  uint8_t* pool_ = nullptr;
  uint8_t* gap_buffer_ = nullptr;    // merge_gap_bytes (aligned), the destination of every gap read
  uint64_t gap_buffer_bytes_ = 0;
  double request_seconds_ = 0, bandwidth_ = 0;  // calibrate_gap()'s measurements (0: not measured)
  uint64_t pool_bytes_ = 0;
  double pool_seconds_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> where_;       // [n_layer * n_expert] -> slot or -1
  std::vector<uint32_t> free_;
  std::vector<Op> ops_;              // indexed by the read's tag
  std::vector<uint32_t> free_ops_;
  std::vector<Completion> done_;
  uint64_t tick_ = 0;
  int64_t n_moe_layers_ = 0;
  // The acquired layer.
  int64_t layer_ = -1;
  std::vector<uint32_t> pinned_;     // slots, in the order of the acquire's experts
  std::vector<uint32_t> miss_scratch_, prefetch_scratch_;
  // The eviction candidates of the current acquire / prefetch call (ready, unpinned; for a prefetch, not used in the
  // last kPrefetchColdTokens tokens), the lowest score last: scored once per call when its first miss needs a slot
  // (no score changes within a call: the experts it touches are pinned or loading), where every miss scored every
  // slot again (O(slots) each: ~10k slots x ~450 misses and prefetches a token on a 235B model with a 100 GiB cache).
  std::vector<std::pair<double, uint32_t>> victims_;
  int victims_for_ = -1;  // -1: none built in this call; else whether they were built for a prefetch
  void build_victims(bool for_prefetch);
  Status io_error_;
  // Prefetch prediction bookkeeping: the last hinted set per layer.
  std::vector<std::vector<int32_t>> hinted_;
  // Census: counts on disk at the last load/save and the increments since.
  uint64_t identity_ = 0;
  bool census_open_ = false;  // identity_ and the census counts are set: the destructor saves them
  bool census_unwritable_ = false;  // its folder refused a write: not tried again (one message)
  Census census_delta_;
  Census census_seen_;
  std::chrono::steady_clock::time_point census_saved_;
  StoreStats stats_;
};

}  // namespace magnetar::experts
