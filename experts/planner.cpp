// The memory planner (planner.h): budget, reserve, the resident-or-streamed decision and its refusals.
#include "experts/planner.h"

#include <algorithm>

#include "base/check.h"

namespace magnetar::experts {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);
constexpr double kMiB = double(uint64_t(1) << 20);

// Sums saturate, so absurd inputs read as "does not fit" instead of wrapping around into a plan.
uint64_t add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

std::string gib(uint64_t bytes) { return format("%.2f GiB", double(bytes) / kGiB); }

// 4096 -> "4,096".
std::string thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

// "weights 1.52 GiB + KV 0.38 GiB + scratch 0.10 GiB + reserve 2.40 GiB", the parts of a refusal.
std::string base_terms(const PlanInputs& in, uint64_t reserve, bool staging) {
  std::string s =
      "weights " + gib(in.model.non_expert_bytes) + " + KV " + gib(in.kv_bytes) + " + scratch " + gib(in.scratch_bytes);
  if (in.kv_disk_bytes > 0) s += " + disk KV buffers " + gib(in.kv_disk_bytes);
  if (staging && in.io_staging_bytes > 0) s += " + I/O staging " + gib(in.io_staging_bytes);
  return s + " + reserve " + gib(reserve);
}

std::string available(const Plan& p) { return gib(p.budget_bytes) + " available (" + p.budget_source + ")"; }

// The end of a refusal that the KV or the sessions could cure: the flags that shrink them.
std::string kv_levers(const PlanInputs& in) {
  if (in.kv_bytes == 0) return std::string();
  std::string s = "; a smaller --ctx or --kv-type q8_0";
  if (in.n_sessions > 1) s += format(", or fewer than the %lld sessions planned for,", (long long)in.n_sessions);
  return s + " needs less KV";
}

}  // namespace

int64_t min_cache_slots(const ModelFootprint& model) {
  if (model.n_moe_layers <= 0 || model.n_expert <= 0) return 0;
  const int64_t all = model.n_moe_layers * model.n_expert;
  return std::min(all, std::max(model.n_expert + model.n_expert_used, model.n_moe_layers * model.n_expert_used));
}

uint64_t memory_budget(const MachineSnapshot& machine, std::string* source) {
  uint64_t budget = machine.ram_available;
  std::string why = "MemAvailable";
  if (machine.cgroup_limit) {
    const uint64_t usage = machine.cgroup_usage.value_or(0);
    const uint64_t reclaimable = std::min(machine.cgroup_reclaimable.value_or(0), usage);
    const uint64_t used = usage - reclaimable;
    const uint64_t headroom = *machine.cgroup_limit > used ? *machine.cgroup_limit - used : 0;
    if (headroom < budget) {
      budget = headroom;
      why = "cgroup limit " + gib(*machine.cgroup_limit) + " - usage " + gib(usage) + " + reclaimable " +
            gib(reclaimable) + "; MemAvailable " + gib(machine.ram_available);
    } else {
      why = "MemAvailable; cgroup headroom " + gib(headroom);
    }
  }
  if (source != nullptr) *source = why;
  return budget;
}

uint64_t reserve_bytes(const MachineSnapshot& machine) {
  uint64_t ram = machine.ram_total;
  if (machine.cgroup_limit) ram = std::min(ram, *machine.cgroup_limit);
  const uint64_t fraction = uint64_t((unsigned __int128)ram * kReservePercent / 100);
  return std::max(kReserveMinBytes, fraction);
}

Result<Plan> plan_memory(const PlanInputs& in) {
  const ModelFootprint& m = in.model;
  const bool has_experts = m.n_moe_layers > 0 && m.n_expert > 0;
  if (has_experts) {
    MAGNETAR_CHECK(m.slab_bytes > 0);
    MAGNETAR_CHECK(m.n_expert_used > 0 && m.n_expert_used <= m.n_expert);
  }

  Plan p;
  p.budget_bytes = memory_budget(in.machine, &p.budget_source);
  p.reserve_bytes = reserve_bytes(in.machine);
  p.weight_bytes = m.non_expert_bytes;
  p.kv_bytes = in.kv_bytes;
  p.n_ctx = in.n_ctx;
  p.n_sessions = in.n_sessions;
  p.scratch_bytes = in.scratch_bytes;
  p.kv_disk_bytes = in.kv_disk_bytes;
  p.slab_bytes = m.slab_bytes;

  // ---- flag combinations that mean nothing ----
  if (in.cache_bytes > 0 && in.mode == MemoryMode::kResident) {
    return Status::error("--cache-gb cannot be combined with --resident: the cache holds streamed experts");
  }
  const bool wants_stream = in.mode == MemoryMode::kStream || in.cache_bytes > 0;
  if (wants_stream && !has_experts) {
    return Status::error(std::string(in.mode == MemoryMode::kStream ? "--stream" : "--cache-gb") +
                         ": the model has no routed experts to stream");
  }

  // ---- resident: everything mapped, nothing streamed ----
  const uint64_t base =
      add(add(add(add(m.non_expert_bytes, in.kv_bytes), in.scratch_bytes), in.kv_disk_bytes), p.reserve_bytes);
  const uint64_t resident_total = add(base, has_experts ? m.expert_bytes_total : 0);
  const bool resident_fits = resident_total <= p.budget_bytes;
  if (in.mode == MemoryMode::kResident || (!wants_stream && (resident_fits || !has_experts))) {
    if (!resident_fits) {
      const std::string who = in.mode == MemoryMode::kResident ? "--resident" : "memory plan: the model";
      std::string terms = "weights " + gib(m.non_expert_bytes);
      if (has_experts) terms += " + experts " + gib(m.expert_bytes_total);
      terms += " + KV " + gib(in.kv_bytes) + " + scratch " + gib(in.scratch_bytes);
      if (in.kv_disk_bytes > 0) terms += " + disk KV buffers " + gib(in.kv_disk_bytes);
      terms += " + reserve " + gib(p.reserve_bytes);
      return Status::error(who + " needs " + gib(resident_total) + " (" + terms + "), " + available(p) + kv_levers(in));
    }
    p.mode = PlanMode::kResident;
    p.expert_bytes = has_experts ? m.expert_bytes_total : 0;
    p.total_bytes = resident_total;
    if (in.mode == MemoryMode::kResident) {
      p.reason = "--resident";
    } else if (!has_experts) {
      p.reason = "no routed experts";
    } else {
      p.reason = "everything fits: " + gib(resident_total) + " of " + gib(p.budget_bytes) + " available, reserve " +
                 gib(p.reserve_bytes);
    }
    return p;
  }

  // ---- streamed: resident part plus a cache of whole slots ----
  const uint64_t stream_base = add(base, in.io_staging_bytes);
  const uint64_t room = stream_base <= p.budget_bytes ? p.budget_bytes - stream_base : 0;
  const int64_t fit_slots = int64_t(std::min<uint64_t>(room / m.slab_bytes, uint64_t(INT64_MAX)));
  const int64_t all_slots = m.n_moe_layers * m.n_expert;  // one per routed expert: more is never used
  const int64_t floor_slots = min_cache_slots(m);
  const uint64_t floor_bytes = uint64_t(floor_slots) * m.slab_bytes;
  const std::string floor_words =
      thousands(floor_slots) + " slots of " + format("%.1f MiB", double(m.slab_bytes) / kMiB) + " = " +
      gib(floor_bytes) + ": " +
      (floor_slots == all_slots
           ? std::string("one per routed expert")
           : "the larger of one layer's " + thousands(m.n_expert) + " experts + " + thousands(m.n_expert_used) +
                 " prefetched, and one token's " + thousands(m.n_moe_layers * m.n_expert_used) + " experts (" +
                 gib(m.expert_bytes_per_token_max) + ")");

  int64_t slots = 0;
  if (in.cache_bytes > 0) {
    const std::string flag = "--cache-gb " + format("%.2f", double(in.cache_bytes) / kGiB);
    const int64_t asked = int64_t(std::min<uint64_t>(in.cache_bytes / m.slab_bytes, uint64_t(INT64_MAX)));
    if (asked < floor_slots) {
      return Status::error(flag + " is below the smallest cache: it holds " + thousands(asked) +
                           " slots, a streamed plan needs at least " + floor_words);
    }
    slots = std::min(asked, all_slots);
    if (slots > fit_slots) {
      const uint64_t want = uint64_t(slots) * m.slab_bytes;
      return Status::error(flag + " does not fit: " + base_terms(in, p.reserve_bytes, true) + " + cache " + gib(want) +
                           " = " + gib(add(stream_base, want)) + ", " + available(p) + "; at most " +
                           gib(uint64_t(fit_slots) * m.slab_bytes) + " of cache fits" + kv_levers(in));
    }
    p.reason = flag;
  } else {
    slots = std::min(fit_slots, all_slots);
    if (slots < floor_slots) {
      const std::string need = gib(add(stream_base, floor_bytes)) + " (" + base_terms(in, p.reserve_bytes, true) +
                               " + the smallest cache " + floor_words + ")";
      if (in.mode == MemoryMode::kStream) {
        return Status::error("--stream needs at least " + need + ", " + available(p) + kv_levers(in));
      }
      return Status::error("memory plan: the model fits neither resident (needs " + gib(resident_total) +
                           ") nor streamed (needs at least " + need + "), " + available(p) + kv_levers(in));
    }
    p.reason = in.mode == MemoryMode::kStream
                   ? "--stream"
                   : "experts " + gib(m.expert_bytes_total) + " do not fit: " + gib(p.budget_bytes) +
                         " available, reserve " + gib(p.reserve_bytes);
  }
  if (slots == all_slots) p.reason += "; the cache holds every expert";

  p.mode = PlanMode::kStreamed;
  p.io_staging_bytes = in.io_staging_bytes;
  p.cache_slots = slots;
  p.cache_bytes = uint64_t(slots) * m.slab_bytes;
  p.min_cache_slots = floor_slots;
  p.total_bytes = add(stream_base, p.cache_bytes);
  MAGNETAR_CHECK(p.total_bytes <= p.budget_bytes);
  return p;
}

int64_t default_context(const ContextDefault& in) {
  const int64_t wanted = std::min(in.n_ctx_train > 0 ? in.n_ctx_train : kContextFloor, std::max<int64_t>(1, in.cap));
  const int64_t floor = std::min(wanted, kContextFloor);
  int64_t ctx = wanted;
  auto too_large = [&](int64_t n) {
    const uint64_t kv = uint64_t(n) * in.kv_bytes_per_token * uint64_t(std::max<int64_t>(1, in.n_sessions));
    return std::any_of(in.budgets.begin(), in.budgets.end(), [&](uint64_t budget) { return kv > budget / 4; });
  };
  while (ctx > floor && too_large(ctx)) ctx = std::max(floor, ctx / 2);
  return ctx;
}

std::string describe(const Plan& p) {
  const auto row = [](const char* label, uint64_t bytes) {
    return format("  %-16s%8.2f GiB", label, double(bytes) / kGiB);
  };
  std::string s =
      format("memory plan: %s (%s)\n", p.mode == PlanMode::kResident ? "resident" : "streamed", p.reason.c_str());
  s += row("resident weights", p.weight_bytes) + "\n";
  if (p.mode == PlanMode::kResident && p.expert_bytes > 0) s += row("routed experts", p.expert_bytes) + "\n";
  s += row("KV cache", p.kv_bytes) + format(" (ctx %lld", (long long)p.n_ctx) +
       (p.n_sessions > 1 ? format(", %lld sessions)\n", (long long)p.n_sessions) : ")\n");
  s += row("scratch", p.scratch_bytes) + "\n";
  if (p.kv_disk_bytes > 0) s += row("disk KV buffers", p.kv_disk_bytes) + "\n";
  if (p.mode == PlanMode::kStreamed) {
    if (p.io_staging_bytes > 0) s += row("I/O staging", p.io_staging_bytes) + "\n";
    s += row("expert cache", p.cache_bytes) + " (" + thousands(p.cache_slots) + " slots of " +
         format("%.1f MiB", double(p.slab_bytes) / kMiB) + ")\n";
  }
  s += row("reserve", p.reserve_bytes) + "\n";
  s += row("total", p.total_bytes) + " of " + gib(p.budget_bytes) + " available (" + p.budget_source + ")\n";
  return s;
}

}  // namespace magnetar::experts
