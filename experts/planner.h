// The memory planner: pure functions from (machine snapshot, model footprint, context, user overrides) to a
// byte budget per tier, or a refusal whose message carries the numbers. It runs before anything large is
// allocated or mapped, so a plan that cannot fit stops the process with an explanation instead of letting the
// kernel OOM-kill it (or the host) later.
//
// Tiers (all in bytes):
//   resident weights  every non-expert tensor (attention, norms, embeddings, router, shared experts). They are
//                     mmap'd, so they live in the page cache: counted in full, never as "free because clean".
//   experts           (resident plan only) every routed expert, mmap'd like the rest.
//   KV cache          for the requested context, times the sessions planned for; scratch: their workspaces.
//   disk KV buffers   (--kv-disk-dir) the background writer's block copies and the restore's read buffers.
//   I/O staging       (streamed plan only) read buffers outside the cache, if the store uses any.
//   expert cache      (streamed plan only) whole slots of slab_bytes, one routed expert each.
//   reserve           headroom the plan never hands out (kReserve*).
// Budget = min(MemAvailable, cgroup limit - (cgroup usage - reclaimable page cache)). Swap is not counted:
// a weight paged to swap costs a random read plus a write, worse than streaming it from the model file.
// The planner assumes the process holds nothing large yet (it is called before the model is mapped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "experts/machine.h"

namespace magnetar::experts {

// The reserve is max(kReserveMinBytes, kReservePercent % of effective RAM), where effective RAM is MemTotal,
// or the cgroup limit when that is smaller. Why: MemAvailable is the kernel's estimate, not a promise (it
// counts page cache that may be dirty or mapped by others); the kernel's own needs (page tables for our
// mappings, slab, network buffers) and other processes' growth scale with the machine, hence a fraction; and
// a small machine still needs about a gigabyte for the kernel and a desktop or ssh session, hence the floor.
// Neither number is a measurement: they are safety margins, and --cache-gb lets a user trade them away
// explicitly by naming a cache size (the reserve still applies).
inline constexpr uint64_t kReserveMinBytes = uint64_t(1) << 30;
inline constexpr uint64_t kReservePercent = 10;

// What the user asked for (--resident, --stream, neither).
enum class MemoryMode { kAuto, kResident, kStream };
// What the plan decided.
enum class PlanMode { kResident, kStreamed };

// The model's memory footprint, from the expert layout and the binder (bytes unless said otherwise).
struct ModelFootprint {
  uint64_t non_expert_bytes = 0;            // every tensor that is not a routed expert
  uint64_t expert_bytes_total = 0;          // every routed expert of every layer (no padding)
  uint64_t expert_bytes_per_token_max = 0;  // sum over MoE layers of n_expert_used x that layer's per-expert
                                            // bytes: what one token reads when nothing is cached
  uint64_t slab_bytes = 0;                  // one cache slot: the largest per-expert record incl. alignment
  int64_t n_moe_layers = 0;                 // layers with routed experts
  int64_t n_expert = 0;                     // routed experts per MoE layer
  int64_t n_expert_used = 0;                // experts each token routes to per layer (top-k)
};

struct PlanInputs {
  MachineSnapshot machine;
  ModelFootprint model;
  uint64_t kv_bytes = 0;                // KV cache for n_ctx tokens, of all n_sessions
  int64_t n_ctx = 0;                    // only for the printed plan
  int64_t n_sessions = 1;               // sessions kv_bytes and scratch_bytes hold (only for the printed plan)
  uint64_t scratch_bytes = 0;           // the sessions' workspaces
  uint64_t kv_disk_bytes = 0;           // disk KV buffers (kv::DiskCache::memory_bytes), 0 without --kv-disk-dir
  uint64_t io_staging_bytes = 0;        // read buffers outside the cache slots (0 when reads land in slots)
  MemoryMode mode = MemoryMode::kAuto;  // --resident / --stream
  uint64_t cache_bytes = 0;             // --cache-gb in bytes; 0 = as large as fits. Implies streaming.
};

struct Plan {
  PlanMode mode = PlanMode::kResident;
  uint64_t budget_bytes = 0;  // what the plan may use in all, reserve included
  std::string budget_source;  // how the budget was derived, e.g. "MemAvailable" or the cgroup arithmetic
  uint64_t reserve_bytes = 0;
  uint64_t weight_bytes = 0;  // resident non-expert weights
  uint64_t expert_bytes = 0;  // routed experts held resident (resident plan), 0 when streamed
  uint64_t kv_bytes = 0;
  int64_t n_ctx = 0;
  int64_t n_sessions = 1;
  uint64_t scratch_bytes = 0;
  uint64_t kv_disk_bytes = 0;
  uint64_t io_staging_bytes = 0;  // streamed plan only
  uint64_t cache_bytes = 0;       // cache_slots x slab_bytes (streamed plan only)
  int64_t cache_slots = 0;
  uint64_t slab_bytes = 0;
  int64_t min_cache_slots = 0;  // the floor the cache was checked against (streamed plan only)
  uint64_t total_bytes = 0;     // every tier plus the reserve; <= budget_bytes
  std::string reason;           // why this mode, one line
};

// The smallest expert cache (in slots) a streamed plan accepts:
//   min(every expert, max(n_expert + n_expert_used, n_moe_layers x n_expert_used)).
// The first term is what must be pinned at once to make progress: a prefill batch can route to every expert
// of a layer, and the layer's forward pins all of them together, while the prefetch for the next layer
// (n_expert_used experts, the router's prediction) is already in flight. The second is one token's working
// set over all layers: below it even a single decode step evicts its own experts before the next token
// reuses them, every token rereads everything, and the hit rate is zero by construction.
// A cache with a slot for every routed expert (n_moe_layers x n_expert) always suffices, hence the min
// (it only binds for models with one or two MoE layers).
int64_t min_cache_slots(const ModelFootprint& model);

// The available budget of a snapshot (see the header comment) and its derivation in words.
uint64_t memory_budget(const MachineSnapshot& machine, std::string* source = nullptr);
// max(kReserveMinBytes, kReservePercent % of min(MemTotal, cgroup limit)), rounded down to a byte.
uint64_t reserve_bytes(const MachineSnapshot& machine);

// Auto: resident when weights + experts + KV + scratch + disk KV buffers + reserve <= budget, else streamed with a
// cache of whole slots filling budget - (weights + KV + scratch + disk KV buffers + staging + reserve), at most one
// slot per expert.
// Refusals (messages name the flag, sizes in GiB with two decimals): --resident that does not fit;
// --stream or --cache-gb on a model without routed experts; --cache-gb with --resident; a --cache-gb larger
// than what fits or smaller than min_cache_slots(); an auto or --stream plan whose cache would fall below the
// floor. A returned plan always has total_bytes <= budget_bytes, and a streamed one cache_slots >= the floor.
Result<Plan> plan_memory(const PlanInputs& in);

// The context of a run that names none (--ctx 0): the model's training context (kContextFloor when the file states
// none), at most `cap`, halved while the KV of `n_sessions` sessions at that length takes more than a quarter of
// any of `budgets` (the host's memory budget and, for a model on a GPU, its free memory), but not below
// kContextFloor (or the training context when that is shorter). A quarter: the KV of the default leaves the weights,
// an expert cache or GPU pool and the other sessions most of the memory; what is chosen is then checked like an
// explicit --ctx (a floor that does not fit is refused with the sizes).
inline constexpr int64_t kContextFloor = 4096;
struct ContextDefault {
  int64_t n_ctx_train = 0;          // 0: unknown
  int64_t cap = kContextFloor;      // the command's default maximum (serve: 32,768)
  uint64_t kv_bytes_per_token = 0;  // K and V of one token over all layers
  int64_t n_sessions = 1;
  std::vector<uint64_t> budgets;  // bytes; empty: no limit known
};
int64_t default_context(const ContextDefault& in);

// The block printed at start: a headline with the decision and its reason, then bytes per tier, e.g.
//   memory plan: streamed (experts 31.20 GiB do not fit: 22.10 GiB available, reserve 2.40 GiB)
//     resident weights   1.52 GiB
//     KV cache           0.38 GiB (ctx 4096)          "(ctx 4096, 4 sessions)" when planned for several
//     scratch            0.10 GiB
//     disk KV buffers    0.53 GiB                     only with --kv-disk-dir
//     expert cache      16.00 GiB (4,096 slots of 4.0 MiB)
//     reserve            2.40 GiB
//     total             20.40 GiB of 22.10 GiB available (MemAvailable)
std::string describe(const Plan& plan);

}  // namespace magnetar::experts
