// The memory planner over synthetic machines, and the machine snapshot reader over fake /proc and /sys trees.
// Expected numbers are worked out by hand in the comments beside them, never by calling the planner.
#include "experts/planner.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "experts/machine.h"

namespace magnetar::experts {
namespace {

constexpr uint64_t kKiB = uint64_t(1) << 10;
constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kGiB = uint64_t(1) << 30;

// ---- synthetic machines and models ----------------------------------------------------------------------

MachineSnapshot machine(uint64_t total, uint64_t available) {
  MachineSnapshot m;
  m.ram_total = total;
  m.ram_available = available;
  return m;
}

// A Qwen3-30B-A3B-like shape, inflated: 48 MoE layers x 128 experts, top-8, 7 MiB slots; experts 42 GiB,
// everything else 3 GiB: 45 GiB of weights, about 1.4x a 32 GiB machine.
PlanInputs big_model(MachineSnapshot m) {
  PlanInputs in;
  in.machine = m;
  in.model = ModelFootprint{
      .non_expert_bytes = 3 * kGiB,
      .expert_bytes_total = 42 * kGiB,
      .expert_bytes_per_token_max = 48 * 8 * 7 * kMiB,
      .slab_bytes = 7 * kMiB,
      .n_moe_layers = 48,
      .n_expert = 128,
      .n_expert_used = 8,
  };
  in.kv_bytes = kGiB;
  in.n_ctx = 4096;
  in.scratch_bytes = kGiB / 4;
  return in;
}

// ---- the floor and the reserve --------------------------------------------------------------------------

TEST(Planner, FloorIsOneLayerPlusPrefetchOrOneTokenWhicheverIsLarger) {
  // 3 layers x 256 experts, top-8: one layer + prefetch = 264 > one token = 24.
  EXPECT_EQ(min_cache_slots({.n_moe_layers = 3, .n_expert = 256, .n_expert_used = 8}), 264);
  // 94 layers x 128 experts, top-8: one token = 752 > 136.
  EXPECT_EQ(min_cache_slots({.n_moe_layers = 94, .n_expert = 128, .n_expert_used = 8}), 752);
  // 1 layer x 64 experts, top-8: 72 > 64 slots exist; every expert (64) is the most a cache can hold.
  EXPECT_EQ(min_cache_slots({.n_moe_layers = 1, .n_expert = 64, .n_expert_used = 8}), 64);
  EXPECT_EQ(min_cache_slots({}), 0);  // dense model
}

TEST(Planner, ReserveIsTenPercentOfTheSmallerOfRamAndCgroupWithAOneGiBFloor) {
  EXPECT_EQ(reserve_bytes(machine(64 * kGiB, 60 * kGiB)), 6871947673u);  // 68719476736 / 10, rounded down
  EXPECT_EQ(reserve_bytes(machine(4 * kGiB, 3 * kGiB)), kGiB);           // 0.4 GiB < the 1 GiB floor
  MachineSnapshot m = machine(256 * kGiB, 200 * kGiB);
  m.cgroup_limit = 40 * kGiB;
  m.cgroup_usage = 0;
  EXPECT_EQ(reserve_bytes(m), 4 * kGiB);  // 10% of the 40 GiB limit, not of 256 GiB
}

// ---- the default context --------------------------------------------------------------------------------

TEST(Planner, DefaultContextIsTheModelsWithinTheCapAndAQuarterOfEachBudget) {
  // Qwen3-30B-A3B's F16 KV: 48 layers x K and V x 4 heads x 128 x 2 bytes = 96 KiB a token.
  const uint64_t per_token = 48 * 2 * 4 * 128 * 2;
  ContextDefault in{
      .n_ctx_train = 40960, .cap = 32768, .kv_bytes_per_token = per_token, .n_sessions = 1, .budgets = {}};
  EXPECT_EQ(default_context(in), 32768);  // no budget known: the cap
  in.budgets = {100 * kGiB, 80 * kGiB};
  EXPECT_EQ(default_context(in), 32768);  // 3 GiB of KV, far below a quarter of either
  in.budgets = {100 * kGiB, 8 * kGiB};    // a quarter of 8 GiB is 2 GiB: 32K (3 GiB) no, 16K (1.5 GiB) yes
  EXPECT_EQ(default_context(in), 16384);
  in.n_sessions = 4;  // 4 x 16K = 6 GiB, 4 x 8K = 3 GiB, 4 x 4K = 1.5 GiB
  EXPECT_EQ(default_context(in), 4096);
  in.budgets = {kGiB};  // nothing fits: the floor, left to the memory check that follows
  EXPECT_EQ(default_context(in), 4096);
  // A quarter exactly is accepted: 4 x 8K x 96 KiB = 3 GiB, budget 12 GiB.
  in.budgets = {12 * kGiB};
  EXPECT_EQ(default_context(in), 8192);
  in.budgets = {12 * kGiB - 1};
  EXPECT_EQ(default_context(in), 4096);
  // A model that states no training context gets 4,096; a shorter one keeps its own; the run/chat cap is 4,096.
  EXPECT_EQ(default_context({.n_ctx_train = 0, .cap = 32768, .kv_bytes_per_token = per_token, .budgets = {}}), 4096);
  EXPECT_EQ(default_context({.n_ctx_train = 512, .cap = 32768, .kv_bytes_per_token = per_token, .budgets = {1}}), 512);
  EXPECT_EQ(default_context({.n_ctx_train = 262144, .cap = 4096, .kv_bytes_per_token = per_token, .budgets = {}}),
            4096);
  // Not a power of two: halved from the training context, stopping at the floor.
  EXPECT_EQ(
      default_context(
          {.n_ctx_train = 40960, .cap = 65536, .kv_bytes_per_token = per_token, .budgets = {4 * 10240 * per_token}}),
      10240);
  EXPECT_EQ(
      default_context(
          {.n_ctx_train = 40960, .cap = 65536, .kv_bytes_per_token = per_token, .budgets = {4 * 5120 * per_token - 1}}),
      4096);
}

// ---- the decision ---------------------------------------------------------------------------------------

TEST(Planner, EverythingFitsIsResident) {
  PlanInputs in = big_model(machine(64 * kGiB, 60 * kGiB));
  Result<Plan> plan = plan_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->mode, PlanMode::kResident);
  EXPECT_EQ(plan->reserve_bytes, 6871947673u);
  EXPECT_EQ(plan->expert_bytes, 42 * kGiB);
  EXPECT_EQ(plan->cache_slots, 0);
  // 3 + 42 + 1 + 0.25 GiB = 46.25 GiB = 49660559360, + reserve 6871947673
  EXPECT_EQ(plan->total_bytes, 56532507033u);
  EXPECT_EQ(plan->budget_bytes, 60 * kGiB);
}

TEST(Planner, ModelLargerThanRamIsStreamedAndTheCacheLeavesTheReserve) {
  Result<Plan> plan = plan_memory(big_model(machine(32 * kGiB, 30 * kGiB)));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->mode, PlanMode::kStreamed);
  // reserve = 34359738368 / 10 = 3435973836; resident part = 3 + 1 + 0.25 GiB = 4563402752;
  // room = 32212254720 - 4563402752 - 3435973836 = 24212878132 -> 3298 slots of 7340032 (3298.74...).
  EXPECT_EQ(plan->reserve_bytes, 3435973836u);
  EXPECT_EQ(plan->cache_slots, 3298);
  EXPECT_EQ(plan->cache_bytes, 24207425536u);  // 3298 x 7340032
  EXPECT_EQ(plan->total_bytes, 32206802124u);  // 4563402752 + 3435973836 + 24207425536
  EXPECT_LE(plan->total_bytes, plan->budget_bytes);
  EXPECT_EQ(plan->min_cache_slots, 384);  // 48 layers x top-8 > 128 + 8
  EXPECT_EQ(plan->expert_bytes, 0u);

  EXPECT_EQ(describe(*plan),
            "memory plan: streamed (experts 42.00 GiB do not fit: 30.00 GiB available, reserve 3.20 GiB)\n"
            "  resident weights    3.00 GiB\n"
            "  KV cache            1.00 GiB (ctx 4096)\n"
            "  scratch             0.25 GiB\n"
            "  expert cache       22.54 GiB (3,298 slots of 7.0 MiB)\n"
            "  reserve             3.20 GiB\n"
            "  total              29.99 GiB of 30.00 GiB available (MemAvailable)\n");
}

TEST(Planner, SessionsAndDiskKvBuffersComeOutOfTheCache) {
  // Four sessions (KV 4 x 1 GiB, scratch 4 x 0.25 GiB) and 0.5 GiB of disk KV buffers: resident part
  // 3 + 4 + 1 + 0.5 = 8.5 GiB = 9126805504; room = 32212254720 - 9126805504 - 3435973836 = 19649475380
  // -> 2677 slots of 7340032 (2677.03...), 621 fewer than one session's 3298.
  PlanInputs in = big_model(machine(32 * kGiB, 30 * kGiB));
  in.n_sessions = 4;
  in.kv_bytes = 4 * kGiB;
  in.scratch_bytes = kGiB;
  in.kv_disk_bytes = kGiB / 2;
  Result<Plan> plan = plan_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->cache_slots, 2677);
  EXPECT_EQ(plan->total_bytes, 32212045004u);  // 9126805504 + 3435973836 + 2677 x 7340032 (19649265664)
  EXPECT_EQ(describe(*plan),
            "memory plan: streamed (experts 42.00 GiB do not fit: 30.00 GiB available, reserve 3.20 GiB)\n"
            "  resident weights    3.00 GiB\n"
            "  KV cache            4.00 GiB (ctx 4096, 4 sessions)\n"
            "  scratch             1.00 GiB\n"
            "  disk KV buffers     0.50 GiB\n"
            "  expert cache       18.30 GiB (2,677 slots of 7.0 MiB)\n"
            "  reserve             3.20 GiB\n"
            "  total              30.00 GiB of 30.00 GiB available (MemAvailable)\n");

  // Forty sessions leave no room for the smallest cache: 3 + 40 + 10 + 0.5 + 6.4 reserve = 59.9 GiB, plus 384 x
  // 7 MiB (2.625 GiB) > 60 GiB; the refusal names the sessions.
  in.machine = machine(64 * kGiB, 60 * kGiB);
  in.n_sessions = 40;
  in.kv_bytes = 40 * kGiB;
  in.scratch_bytes = 10 * kGiB;
  plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  const std::string& msg = plan.status().message();
  EXPECT_NE(msg.find("KV 40.00 GiB + scratch 10.00 GiB + disk KV buffers 0.50 GiB + reserve 6.40 GiB"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.substr(msg.size() - 93),
            "; a smaller --ctx or --kv-type q8_0, or fewer than the 40 sessions planned for, needs less KV")
      << msg;
}

TEST(Planner, CgroupLimitSmallerThanMemAvailableBinds) {
  MachineSnapshot m = machine(256 * kGiB, 200 * kGiB);
  m.cgroup_limit = 40 * kGiB;
  m.cgroup_usage = 12 * kGiB;
  m.cgroup_reclaimable = 2 * kGiB;
  Result<Plan> plan = plan_memory(big_model(m));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  // budget = 40 - (12 - 2) = 30 GiB; reserve = 4 GiB; room = 30 - 4.25 - 4 = 21.75 GiB = 23353884672
  // -> 3181 slots (3181.67...).
  EXPECT_EQ(plan->budget_bytes, 30 * kGiB);
  EXPECT_EQ(plan->reserve_bytes, 4 * kGiB);
  EXPECT_EQ(plan->mode, PlanMode::kStreamed);
  EXPECT_EQ(plan->cache_slots, 3181);
  EXPECT_EQ(plan->total_bytes, 32207011840u);  // 4563402752 + 4294967296 + 3181 x 7340032
  EXPECT_NE(plan->budget_source.find("cgroup limit 40.00 GiB - usage 12.00 GiB + reclaimable 2.00 GiB"),
            std::string::npos)
      << plan->budget_source;
}

TEST(Planner, MemAvailableBindsWhenTheCgroupHasMoreHeadroom) {
  MachineSnapshot m = machine(64 * kGiB, 20 * kGiB);
  m.cgroup_limit = 48 * kGiB;
  m.cgroup_usage = kGiB;
  m.cgroup_reclaimable = 0;
  EXPECT_EQ(memory_budget(m), 20 * kGiB);
  // Usage beyond the limit (possible for a moment in v1) leaves no headroom rather than wrapping around.
  m.cgroup_usage = 50 * kGiB;
  EXPECT_EQ(memory_budget(m), 0u);
}

TEST(Planner, ResidentThatDoesNotFitIsRefusedWithTheNumbers) {
  PlanInputs in = big_model(machine(32 * kGiB, 30 * kGiB));
  in.mode = MemoryMode::kResident;
  Result<Plan> plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  // 3 + 42 + 1 + 0.25 + 3.1999999993 = 49.4499999993 GiB
  EXPECT_EQ(plan.status().message(),
            "--resident needs 49.45 GiB (weights 3.00 GiB + experts 42.00 GiB + KV 1.00 GiB + scratch 0.25 GiB + "
            "reserve 3.20 GiB), 30.00 GiB available (MemAvailable); a smaller --ctx or --kv-type q8_0 needs less KV");
}

TEST(Planner, ResidentThatFitsIsHonoredAndStreamOverridesAFit) {
  PlanInputs in = big_model(machine(64 * kGiB, 60 * kGiB));
  in.mode = MemoryMode::kResident;
  ASSERT_TRUE(plan_memory(in).ok());
  EXPECT_EQ(plan_memory(in)->reason, "--resident");

  in.mode = MemoryMode::kStream;
  Result<Plan> plan = plan_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->mode, PlanMode::kStreamed);
  // Room (60 - 4.25 GiB - reserve) exceeds all 48 x 128 experts: the cache stops at one slot per expert.
  EXPECT_EQ(plan->cache_slots, 48 * 128);
  EXPECT_EQ(plan->reason, "--stream; the cache holds every expert");
}

TEST(Planner, CacheGbTooLargeIsRefused) {
  PlanInputs in = big_model(machine(32 * kGiB, 30 * kGiB));
  in.cache_bytes = 25 * kGiB;  // 3657 slots (25600 MiB / 7 MiB = 3657.1); at most 3298 fit
  Result<Plan> plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  // 3 + 1 + 0.25 + 3.2 = 7.45 GiB resident part; cache 3657 x 7 MiB = 25599 MiB = 24.999 GiB
  EXPECT_EQ(
      plan.status().message(),
      "--cache-gb 25.00 does not fit: weights 3.00 GiB + KV 1.00 GiB + scratch 0.25 GiB + reserve 3.20 GiB + "
      "cache 25.00 GiB = 32.45 GiB, 30.00 GiB available (MemAvailable); at most 22.54 GiB of cache fits; a smaller "
      "--ctx or --kv-type q8_0 needs less KV");
}

TEST(Planner, CacheGbBelowTheFloorIsRefused) {
  PlanInputs in = big_model(machine(32 * kGiB, 30 * kGiB));
  in.cache_bytes = kGiB;  // 1024 MiB / 7 MiB = 146 slots < 384
  Result<Plan> plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  const std::string& msg = plan.status().message();
  EXPECT_EQ(msg.rfind("--cache-gb 1.00 is below the smallest cache: it holds 146 slots, a streamed plan needs at "
                      "least 384 slots of 7.0 MiB",
                      0),
            0u)
      << msg;
}

TEST(Planner, CacheGbThatFitsIsUsedInWholeSlots) {
  PlanInputs in = big_model(machine(32 * kGiB, 30 * kGiB));
  in.cache_bytes = 10 * kGiB;  // 10240 MiB / 7 MiB = 1462.86 -> 1462 slots
  Result<Plan> plan = plan_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->mode, PlanMode::kStreamed);
  EXPECT_EQ(plan->cache_slots, 1462);
  EXPECT_EQ(plan->cache_bytes, 10731126784u);  // 1462 x 7340032
  EXPECT_EQ(plan->reason, "--cache-gb 10.00");
}

TEST(Planner, TheFloorIsRespectedAtItsEdge) {
  // Budget = resident part + reserve + exactly 384 slots: the smallest plan that is accepted.
  // resident part 4563402752 + reserve 3435973836 + 384 x 7340032 (2818572288) = 10817948876.
  PlanInputs in = big_model(machine(32 * kGiB, 10817948876u));
  Result<Plan> plan = plan_memory(in);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->cache_slots, 384);
  EXPECT_EQ(plan->total_bytes, 10817948876u);

  in.machine.ram_available -= 1;  // one byte less: 383 slots, refused
  plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message().rfind("memory plan: the model fits neither resident (needs 49.45 GiB) nor "
                                          "streamed (needs at least 10.07 GiB",
                                          0),
            0u)
      << plan.status().message();

  in.mode = MemoryMode::kStream;
  plan = plan_memory(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message().rfind("--stream needs at least 10.07 GiB (weights 3.00 GiB", 0), 0u)
      << plan.status().message();
}

TEST(Planner, ContradictoryFlagsAndDenseModels) {
  PlanInputs in = big_model(machine(64 * kGiB, 60 * kGiB));
  in.mode = MemoryMode::kResident;
  in.cache_bytes = 8 * kGiB;
  EXPECT_EQ(plan_memory(in).status().message(),
            "--cache-gb cannot be combined with --resident: the cache holds streamed experts");

  PlanInputs dense;
  dense.machine = machine(16 * kGiB, 12 * kGiB);
  dense.model.non_expert_bytes = 4 * kGiB;
  Result<Plan> plan = plan_memory(dense);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->mode, PlanMode::kResident);
  EXPECT_EQ(plan->reason, "no routed experts");
  dense.mode = MemoryMode::kStream;
  EXPECT_EQ(plan_memory(dense).status().message(), "--stream: the model has no routed experts to stream");
  dense.mode = MemoryMode::kAuto;
  dense.model.non_expert_bytes = 12 * kGiB;  // 12 + reserve 1.6 > 12
  EXPECT_EQ(plan_memory(dense).status().message(),
            "memory plan: the model needs 13.60 GiB (weights 12.00 GiB + KV 0.00 GiB + scratch 0.00 GiB + reserve "
            "1.60 GiB), 12.00 GiB available (MemAvailable)");
}

// ---- the promise: never more than the budget ------------------------------------------------------------
// Over random machines, models and flags: a plan's tiers plus the reserve never exceed the budget, a
// streamed cache is whole slots at or above the floor, and a refusal happens exactly when the rules say
// nothing fits. The expectations are recomputed here from the rules in planner.h.

TEST(Planner, RandomSnapshotsNeverExceedTheBudget) {
  std::mt19937_64 rng(20240611);
  const auto pick = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  int n_resident = 0, n_streamed = 0, n_refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    MachineSnapshot m;
    m.ram_total = pick(2 * kGiB, 2048 * kGiB);
    m.ram_available = pick(0, m.ram_total);
    if (pick(0, 1)) {
      m.cgroup_limit = pick(kGiB, 1024 * kGiB);
      m.cgroup_usage = pick(0, *m.cgroup_limit + 4 * kGiB);
      m.cgroup_reclaimable = pick(0, 8 * kGiB);
    }
    PlanInputs in;
    in.machine = m;
    ModelFootprint& f = in.model;
    const bool dense = pick(0, 9) == 0;
    if (!dense) {
      f.n_moe_layers = int64_t(pick(1, 100));
      f.n_expert = int64_t(pick(4, 512));
      f.n_expert_used = int64_t(pick(1, uint64_t(std::min<int64_t>(f.n_expert, 16))));
      f.slab_bytes = pick(1, 16 * 1024) * 4 * kKiB;  // 4 KiB .. 64 MiB, 4 KiB aligned
      const uint64_t per_expert = f.slab_bytes - pick(0, 4095);
      f.expert_bytes_total = uint64_t(f.n_moe_layers * f.n_expert) * per_expert;
      f.expert_bytes_per_token_max = uint64_t(f.n_moe_layers * f.n_expert_used) * per_expert;
    }
    f.non_expert_bytes = pick(0, 64 * kGiB);
    in.kv_bytes = pick(0, 32 * kGiB);
    in.scratch_bytes = pick(0, kGiB);
    in.io_staging_bytes = pick(0, 3) == 0 ? pick(0, kGiB) : 0;
    in.kv_disk_bytes = pick(0, 3) == 0 ? pick(0, kGiB) : 0;
    in.mode = MemoryMode(pick(0, 2));
    if (!dense && in.mode != MemoryMode::kResident && pick(0, 3) == 0) in.cache_bytes = pick(1, 256 * kGiB);

    // The rules, independently.
    uint64_t budget = m.ram_available;
    uint64_t ram = m.ram_total;
    if (m.cgroup_limit) {
      const uint64_t used = *m.cgroup_usage - std::min(*m.cgroup_reclaimable, *m.cgroup_usage);
      budget = std::min(budget, *m.cgroup_limit > used ? *m.cgroup_limit - used : 0);
      ram = std::min(ram, *m.cgroup_limit);
    }
    const uint64_t reserve = std::max(kGiB, ram / 10);
    const uint64_t base = f.non_expert_bytes + in.kv_bytes + in.scratch_bytes + in.kv_disk_bytes + reserve;
    const bool resident_fits = base + f.expert_bytes_total <= budget;
    const int64_t all = f.n_moe_layers * f.n_expert;
    const int64_t floor =
        dense ? 0 : std::min(all, std::max(f.n_expert + f.n_expert_used, f.n_moe_layers * f.n_expert_used));
    const uint64_t stream_base = base + in.io_staging_bytes;
    const int64_t fit = dense ? 0 : int64_t((budget > stream_base ? budget - stream_base : 0) / f.slab_bytes);

    Result<Plan> plan = plan_memory(in);
    SCOPED_TRACE(::testing::Message() << "iteration " << iter);
    if (!plan.ok()) {
      ++n_refused;
      const std::string& msg = plan.status().message();
      EXPECT_FALSE(msg.empty());
      if (in.mode == MemoryMode::kResident || (dense && in.mode == MemoryMode::kAuto)) {
        EXPECT_FALSE(resident_fits) << msg;
      } else if (dense) {
        EXPECT_EQ(in.mode, MemoryMode::kStream) << msg;
      } else if (in.cache_bytes > 0) {
        const int64_t asked = int64_t(in.cache_bytes / f.slab_bytes);
        EXPECT_TRUE(asked < floor || std::min(asked, all) > fit) << msg;
      } else {
        EXPECT_LT(std::min(fit, all), floor) << msg;
        if (in.mode == MemoryMode::kAuto) {
          EXPECT_FALSE(resident_fits) << msg;
        }
      }
      continue;
    }
    const Plan& p = *plan;
    EXPECT_EQ(p.budget_bytes, budget);
    EXPECT_EQ(p.reserve_bytes, reserve);
    const uint64_t tiers = p.weight_bytes + p.expert_bytes + p.kv_bytes + p.scratch_bytes + p.kv_disk_bytes +
                           p.io_staging_bytes + p.cache_bytes;
    EXPECT_EQ(p.total_bytes, tiers + p.reserve_bytes);
    EXPECT_LE(tiers, budget - reserve);  // never more than the budget less the reserve
    if (p.mode == PlanMode::kResident) {
      ++n_resident;
      EXPECT_TRUE(resident_fits);
      EXPECT_NE(in.mode, MemoryMode::kStream);
      EXPECT_EQ(in.cache_bytes, 0u);
      EXPECT_EQ(p.expert_bytes, f.expert_bytes_total);
      EXPECT_EQ(p.cache_bytes, 0u);
    } else {
      ++n_streamed;
      EXPECT_FALSE(dense);
      EXPECT_NE(in.mode, MemoryMode::kResident);
      if (in.mode == MemoryMode::kAuto && in.cache_bytes == 0) {
        EXPECT_FALSE(resident_fits);
      }
      EXPECT_GE(p.cache_slots, floor);
      EXPECT_LE(p.cache_slots, all);
      EXPECT_EQ(p.cache_bytes, uint64_t(p.cache_slots) * f.slab_bytes);
      const int64_t expected =
          in.cache_bytes > 0 ? std::min(int64_t(in.cache_bytes / f.slab_bytes), all) : std::min(fit, all);
      EXPECT_EQ(p.cache_slots, expected);
    }
  }
  // Every branch was exercised.
  EXPECT_GT(n_resident, 1000);
  EXPECT_GT(n_streamed, 1000);
  EXPECT_GT(n_refused, 1000);
}

// ---- read_machine over fake trees -----------------------------------------------------------------------

class FakeRoot {
 public:
  FakeRoot() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "magnetar-machine-XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }
  const std::string& root() const { return root_; }
  void write(const std::string& rel, const std::string& text) const {
    const std::filesystem::path p = root_ + "/" + rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void mkdir(const std::string& rel) const { std::filesystem::create_directories(root_ + "/" + rel); }

 private:
  std::string root_;
};

const char* kMeminfo =
    "MemTotal:       16384000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   12000000 kB\n"
    "Buffers:            8436 kB\n"
    "SwapTotal:       2097148 kB\n"
    "SwapFree:        2000000 kB\n"
    "HugePages_Total:       0\n";

TEST(ReadMachine, MeminfoWithoutCgroup) {
  FakeRoot fake;
  fake.write("proc/meminfo", kMeminfo);
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->ram_total, 16777216000u);  // 16384000 kB
  EXPECT_EQ(m->ram_available, 12288000000u);
  EXPECT_EQ(m->swap_free, 2048000000u);
  EXPECT_FALSE(m->cgroup_limit.has_value());
  EXPECT_FALSE(m->cgroup_usage.has_value());
}

TEST(ReadMachine, CgroupV2Max) {
  FakeRoot fake;
  fake.write("proc/meminfo", kMeminfo);
  fake.write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  fake.write("sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  fake.write("sys/fs/cgroup/user.slice/session-1.scope/memory.current", "123456\n");
  fake.write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->cgroup_limit.has_value());
  EXPECT_EQ(m->cgroup_dir, "");
}

TEST(ReadMachine, CgroupV2LimitAndTheTightestAncestorWins) {
  FakeRoot fake;
  fake.write("proc/meminfo", kMeminfo);
  fake.write("proc/self/cgroup", "0::/a/b\n");
  // Leaf: 8 GiB limit, 1 GiB used of which 100 MiB inactive file cache: headroom 7.1 GiB.
  fake.write("sys/fs/cgroup/a/b/memory.max", "8589934592\n");
  fake.write("sys/fs/cgroup/a/b/memory.current", "1073741824\n");
  fake.write("sys/fs/cgroup/a/b/memory.stat", "anon 900000000\nfile 150000000\ninactive_file 104857600\n");
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->cgroup_limit, 8589934592u);
  EXPECT_EQ(m->cgroup_usage, 1073741824u);
  EXPECT_EQ(m->cgroup_reclaimable, 104857600u);

  // Parent: 4 GiB limit with 3 GiB used: headroom 1 GiB < 7.1 GiB, so the parent binds.
  fake.write("sys/fs/cgroup/a/memory.max", "4294967296\n");
  fake.write("sys/fs/cgroup/a/memory.current", "3221225472\n");
  m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->cgroup_limit, 4294967296u);
  EXPECT_EQ(m->cgroup_usage, 3221225472u);
  EXPECT_EQ(m->cgroup_reclaimable, 0u);  // no memory.stat there
  EXPECT_EQ(m->cgroup_dir, fake.root() + "/sys/fs/cgroup/a");
  EXPECT_EQ(memory_budget(*m), kGiB);
}

TEST(ReadMachine, CgroupV1MemoryControllerOnAHybridSystem) {
  FakeRoot fake;
  fake.write("proc/meminfo", kMeminfo);
  fake.write("proc/self/cgroup", "5:devices:/\n4:memory:/jobs/42\n0::/\n");
  fake.write("sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes", "2147483648\n");
  fake.write("sys/fs/cgroup/memory/jobs/42/memory.usage_in_bytes", "536870912\n");
  fake.write("sys/fs/cgroup/memory/jobs/42/memory.stat", "inactive_file 4096\ntotal_inactive_file 8192\n");
  fake.write("sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", "9223372036854771712\n");  // v1 "unlimited"
  fake.write("sys/fs/cgroup/memory/jobs/memory.usage_in_bytes", "536870912\n");
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->cgroup_limit, 2147483648u);
  EXPECT_EQ(m->cgroup_usage, 536870912u);
  EXPECT_EQ(m->cgroup_reclaimable, 8192u);  // hierarchical total_inactive_file
}

TEST(ReadMachine, ContainerThatMountsOnlyItsOwnCgroupReadsTheMountPoint) {
  FakeRoot fake;
  fake.write("proc/meminfo", kMeminfo);
  fake.write("proc/self/cgroup", "0::/docker/abc123\n");  // not below the mount: the container sees its own root
  fake.write("sys/fs/cgroup/memory.max", "1073741824\n");
  fake.write("sys/fs/cgroup/memory.current", "1048576\n");
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->cgroup_limit, 1073741824u);
  EXPECT_EQ(m->cgroup_dir, fake.root() + "/sys/fs/cgroup");
}

TEST(ReadMachine, MalformedFilesAreErrorsNamingTheFile) {
  FakeRoot fake;
  Result<MachineSnapshot> m = read_machine(fake.root());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind(fake.root() + "/proc/meminfo: cannot read", 0), 0u) << m.status().message();

  fake.write("proc/meminfo", "MemTotal:       lots kB\nMemAvailable:   12 kB\n");
  m = read_machine(fake.root());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), fake.root() + "/proc/meminfo: MemTotal: expected '<number> kB', got 'lots kB'");

  fake.write("proc/meminfo", "MemTotal:       16384000 kB\nMemFree: 1 kB\n");
  m = read_machine(fake.root());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            fake.root() + "/proc/meminfo: no MemAvailable line (Linux 3.14 or later is required)");

  fake.write("proc/meminfo", kMeminfo);
  fake.write("proc/self/cgroup", "0::/\n");
  fake.write("sys/fs/cgroup/memory.max", "12abc\n");
  m = read_machine(fake.root());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            fake.root() + "/sys/fs/cgroup/memory.max: expected a byte count or 'max', got '12abc'");
}

TEST(ReadMachine, ThisMachine) {
  Result<MachineSnapshot> m = read_machine();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_GT(m->ram_total, 0u);
  EXPECT_LE(m->ram_available, m->ram_total);
}

// ---- the read probe ---------------------------------------------------------------------------------------

TEST(ReadBandwidth, ReadsAFileOrSaysODirectIsUnsupported) {
  FakeRoot fake;
  fake.write("data.bin", std::string(1 << 20, 'x'));
  Result<double> bw = measure_read_bandwidth(fake.root() + "/data.bin", 0, 1 << 20);
  if (bw.ok()) {
    EXPECT_GT(*bw, 0.0);
  } else {
    EXPECT_NE(bw.status().message().find("O_DIRECT is not supported"), std::string::npos) << bw.status().message();
  }
  bw = measure_read_bandwidth(fake.root() + "/missing.bin", 0, 4096);
  ASSERT_FALSE(bw.ok());
  EXPECT_EQ(bw.status().message().rfind(fake.root() + "/missing.bin: cannot open", 0), 0u) << bw.status().message();
}

}  // namespace
}  // namespace magnetar::experts
