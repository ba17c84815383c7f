#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sys/statvfs.h>
#include <thread>

#include "backends/cpu/threadpool.h"
#include "experts/machine.h"
#include "experts/planner.h"
#include "experts/policy.h"
#include "experts/census.h"
#include "experts/store.h"
#include "gguf/reader.h"
#include "kv/disk_cache.h"
#include "kv/kv_cache.h"
#include "models/model.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

namespace magnetar {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// ---- Engine ---------------------------------------------------------------------------------------------------

struct Engine::Impl {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<models::Model> model;
  std::unique_ptr<experts::StreamedExperts> store;  // streamed plans only; uses model's layout and file
  std::string plan_text;
  std::optional<tokenizer::Tokenizer> tok;
  std::unique_ptr<cpu::ThreadPool> pool;
  EngineOptions options;
  ModelInfo info;
  double load_seconds = 0;
  std::unique_ptr<kv::DiskCache> disk_kv;  // --kv-disk-dir
  std::optional<uint64_t> plan_spare;      // the memory plan's budget less its total (one session in it); no plan: none
  models::RoutingCounts uses;              // every session's routing, for expert_map() (MoE models)
  bool on_gpu = false;                     // the model runs on the CUDA device (weights, KV and scratch there)
  bool gpu_tier = false;                   // ... with routed experts in host memory through a GPU pool
  double gpu_peak_bandwidth = 0;           // models::GpuInfo::peak_bytes_per_s when on_gpu, else 0
  std::string gpu_unused;                  // why auto stayed on the CPU although a GPU is present
  std::string context_note;                // why n_ctx is shorter than the model's (Engine::context_note)
  bool batch_auto = false;                 // --batch 0: choose_device picks the prefill chunk
  int64_t sweep_tokens = 0;                // the longest prefill sweep (EngineOptions::n_sweep; 0: none)
  int64_t sweep_min = 0;                   // ... and the shortest remaining prompt computed in one
  uint64_t sweeps = 0;                     // prefill sweeps run since load or reset_expert_stats
  uint64_t sweep_pauses = 0;               // ... stopped midway by a progress hook
  // A model that keeps a paused sweep's state itself (Model::sweep_state_in_model) holds one sweep: the last one
  // started (its serial), whether it is paused, and the compute call in which another session first found it
  // paused (0: none since it last ran).
  uint64_t sweep_serial = 0;
  bool sweep_paused = false;
  uint64_t sweep_contested = 0;
  uint64_t compute_calls = 0;
  // The model lets go of the store's memory (a GPU tier page-locked it) before the store unmaps it.
  ~Impl() {
    if (model && store) (void)model->attach_host_experts(nullptr);
  }
};

namespace {

// Prompt tokens per forward pass when --batch is 0 (auto): kGpuBatch when the whole model runs on the GPU with room
// for that scratch (choose_device), else kCpuBatch.
constexpr int64_t kCpuBatch = 512;
constexpr int64_t kMaxCtx = int64_t(1) << 24;  // --ctx: 16,777,216 tokens (byte counts stay far from overflowing)
constexpr int kMaxThreads = 1024;              // -t
constexpr int64_t kMaxSessions = 1024;         // EngineOptions::n_sessions
constexpr int64_t kGpuBatch = 2048;
// The GPU's largest prefill chunk: its kernels index a chunk's tokens, and its experts' items (k per token, 8 rows to
// an item, one more per expert for the groups left part full), in a grid dimension of at most 65,535.
int64_t gpu_max_batch(const models::HParams& hp) {
  const int64_t k = std::max<int64_t>(1, hp.n_expert_used);
  return std::min<int64_t>(16384, (65535 - std::max<int64_t>(hp.n_expert, 0)) * 8 / k);
}
// EngineOptions::n_sweep -1 (auto): the longest prefill sweep whose residual stream fits this.
constexpr uint64_t kSweepBytes = 256ull << 20;
// With the GPU tier and n_sweep -1, a prompt of fewer chunks goes chunk by chunk: on the H200 host a sweep of 4 chunks
// was 8% slower, one of 8 even and one of 16 37% faster (docs/benchmarks/2026-12-03-prefill-sweeps.md).
constexpr int64_t kGpuSweepMinChunks = 8;
// The longest prefill sweep for options o whose residual stream takes bytes_per_token: a whole number of chunks (so
// that consecutive sweeps chunk a prompt as single chunks would) or the whole context; 0 when not longer than a chunk.
int64_t sweep_for(const EngineOptions& o, uint64_t bytes_per_token) {
  const int64_t cap = o.n_sweep >= 0 ? o.n_sweep : int64_t(kSweepBytes / bytes_per_token);
  const int64_t sweep = std::min(o.n_ctx, cap / o.n_batch * o.n_batch);
  return sweep > o.n_batch ? sweep : 0;
}

quant::Type kv_quant_type(KvType t) {
  return t == KvType::kF32    ? quant::Type::F32
         : t == KvType::kQ8_0 ? quant::Type::Q8_0
         : t == KvType::kF8   ? quant::Type::F8_E4M3
                              : quant::Type::F16;
}

// K and V of one cached token over all layers.
uint64_t kv_bytes_per_token(const Engine::Impl& impl) {
  const models::HParams& hp = impl.model->hparams();
  return uint64_t(hp.n_layer) * 2 * quant::row_size(kv_quant_type(impl.options.kv_type), hp.n_head_kv * hp.head_dim);
}

// The routed experts one token reads: n_expert_used of every MoE layer's.
uint64_t routed_bytes_per_token(const experts::ExpertLayout& layout, int64_t n_expert_used) {
  uint64_t bytes = 0;
  for (int64_t l = 0; l < layout.n_layer(); ++l) {
    if (layout.has_experts(l)) bytes += uint64_t(n_expert_used) * layout.expert_bytes(l);
  }
  return bytes;
}

// One session's KV cache for the context, and its scratch (make_workspace: activations of a batch, the experts'
// rows, attention scratch), as the memory planner and the session count count them.
uint64_t session_kv_bytes(const Engine::Impl& impl) { return uint64_t(impl.options.n_ctx) * kv_bytes_per_token(impl); }
uint64_t session_scratch_bytes(const Engine::Impl& impl) {
  const models::HParams& hp = impl.model->hparams();
  const EngineOptions& o = impl.options;
  const uint64_t rows = uint64_t(o.n_batch) * uint64_t(std::max<int64_t>(1, hp.n_expert_used));
  // On the CPU a session's workspace also holds its prefill sweeps' residual stream (on the GPU the model holds it).
  const uint64_t sweep = impl.on_gpu ? 0 : uint64_t(impl.sweep_tokens) * uint64_t(hp.n_embd);
  // FFN activations (gate, up and the down input): a dense model's n_batch rows of n_ff, else rows of n_ff_exp.
  const uint64_t ffn = hp.n_expert > 0 ? rows * uint64_t(hp.n_ff_exp) : uint64_t(o.n_batch) * uint64_t(hp.n_ff);
  return 4 * (uint64_t(o.n_batch) * uint64_t(8 * hp.n_embd + 4 * hp.n_head * hp.head_dim + hp.n_expert + hp.n_vocab) +
              3 * ffn + rows * uint64_t(2 * hp.n_embd) + sweep);
}

// "one session's", "4 sessions'".
std::string sessions_words(int64_t n) {
  return n == 1 ? std::string("one session's") : format("%lld sessions'", (long long)n);
}

// The disk KV checkpoints' layout (--kv-disk-dir) for this model; `identity` as the files must match it.
kv::KvFormat disk_kv_format(const Engine::Impl& impl, uint64_t identity) {
  const models::HParams& hp = impl.model->hparams();
  return {.model_identity = identity,
          .type = kv_quant_type(impl.options.kv_type),
          .n_layer = hp.n_layer,
          .row_elements = hp.n_head_kv * hp.head_dim};
}

// Host memory the disk KV checkpoints take besides the KV rows (block copies, read buffers); 0 without them.
uint64_t kv_disk_buffer_bytes(const Engine::Impl& impl) {
  const KvDiskOptions& o = impl.options.kv_disk;
  return o.dir.empty() ? 0 : kv::DiskCache::memory_bytes(disk_kv_format(impl, 0), o.block_tokens);
}

// The planned sessions' host memory (EngineOptions::n_sessions) must fit the memory available: on the CPU their KV
// caches and scratch (a streamed plan counts them with the experts; a dense model or --mmap has no plan, and a --ctx
// far beyond the memory failed its allocation or was killed), on the GPU the host copies of their KV caches (the
// GPU's checks cover the device); and the disk KV's buffers.
Status check_session_memory(const Engine::Impl& impl, const Result<experts::MachineSnapshot>& machine) {
  if (!machine.ok()) return Status();  // nothing to check against (the planner reports it where it needs one)
  std::string source;
  const uint64_t budget = experts::memory_budget(machine.value(), &source);
  const int64_t n = impl.options.n_sessions;
  const uint64_t disk_buffers = kv_disk_buffer_bytes(impl);
  const uint64_t need =
      uint64_t(n) * (session_kv_bytes(impl) + (impl.on_gpu ? 0 : session_scratch_bytes(impl))) + disk_buffers;
  if (need <= budget) return Status();
  const double gib = double(1ull << 30);
  const std::string what = n > 1 ? format("%lld sessions' KV caches", (long long)n) : "a session's KV cache";
  return Status::error(
      format("--ctx %lld: %s%s%s take%s %.1f GiB of host memory, more than the %.1f GiB available (%s; a smaller "
             "--ctx%s or --kv-type q8_0 needs less)",
             (long long)impl.options.n_ctx, what.c_str(), impl.on_gpu ? " (host copies)" : " and scratch",
             disk_buffers > 0 ? " with the disk KV's buffers" : "", n > 1 ? "" : "s", double(need) / gib,
             double(budget) / gib, source.c_str(), n > 1 ? ", fewer sessions" : ""));
}

// --ctx 0 (experts::default_context): the training context, at most n_ctx_default_max, less when the planned sessions'
// KV would take more than a quarter of the host's memory or, when the model may run on a GPU, of its free memory.
// Said in the plan when it is less than the model's.
static_assert(kDefaultContext == experts::kContextFloor);
int64_t default_context(Engine::Impl& impl, const models::Architecture& entry) {
  const EngineOptions& o = impl.options;
  const models::HParams& hp = impl.model->hparams();
  experts::ContextDefault in{.n_ctx_train = hp.n_ctx_train,
                             .cap = std::min(o.n_ctx_default_max, kMaxCtx),
                             .kv_bytes_per_token = kv_bytes_per_token(impl),
                             .n_sessions = o.n_sessions,
                             .budgets = {}};
  std::string where;
  if (const Result<experts::MachineSnapshot> machine = experts::read_machine(); machine.ok()) {
    in.budgets.push_back(experts::memory_budget(machine.value()));
    where = "host memory";
  }
  if (o.device != Device::kCpu && entry.load_cuda && o.kv_type != KvType::kF32) {
    if (const models::GpuInfo gpu = models::gpu_info(); gpu.present) {
      in.budgets.push_back(gpu.free_bytes);
      where += where.empty() ? "GPU memory" : " or GPU memory";
    }
  }
  const int64_t ctx = experts::default_context(in);
  const int64_t unbounded = experts::default_context({.n_ctx_train = in.n_ctx_train, .cap = in.cap, .budgets = {}});
  if (ctx < unbounded) {
    impl.context_note = format(
        "context: %lld tokens (%lld would put more than a quarter of the %s into %s KV; "
        "--ctx N chooses)",
        (long long)ctx, (long long)unbounded, where.c_str(), sessions_words(o.n_sessions).c_str());
  }
  return ctx;
}

// Decides where the routed experts live (experts/planner.h) and opens the store for a streamed plan.
Status plan_experts(Engine::Impl& impl, const std::string& path, const Result<experts::MachineSnapshot>& machine) {
  const experts::ExpertLayout* layout = impl.model->expert_layout();
  const EngineOptions& o = impl.options;
  if (!layout) {
    if (o.experts == ExpertMode::kStream || o.stream.cache_gb > 0) {
      return Status::error(path + ": --stream / --cache-gb: the model has no routed experts");
    }
    return Status();
  }
  if (o.experts == ExpertMode::kMmap) {
    impl.plan_text += std::string(impl.plan_text.empty() ? "" : "\n") +
                      "memory plan: mmap (--mmap: every weight mapped, the page cache decides; not checked against RAM)";
    return Status();
  }
  const models::HParams& hp = impl.model->hparams();
  if (!machine.ok()) return machine.status();
  experts::ModelFootprint fp;
  fp.expert_bytes_total = layout->total_expert_bytes();
  fp.non_expert_bytes = impl.file->file_bytes() - std::min(impl.file->file_bytes(), fp.expert_bytes_total);
  for (int64_t l = 0; l < layout->n_layer(); ++l) fp.n_moe_layers += layout->has_experts(l) ? 1 : 0;
  fp.expert_bytes_per_token_max = routed_bytes_per_token(*layout, hp.n_expert_used);
  fp.slab_bytes = experts::StreamedExperts::slab_bytes(*layout);
  fp.n_expert = layout->n_expert();
  fp.n_expert_used = hp.n_expert_used;
  // On the CPU a streamed plan's sessions may each grow a prefill sweep's residual stream (4 bytes per n_embd; not
  // in session_scratch_bytes before sweep_tokens is set below).
  const uint64_t cpu_row = 4 * uint64_t(hp.n_embd);
  const uint64_t cpu_sweep = impl.on_gpu ? 0 : cpu_row * uint64_t(sweep_for(o, cpu_row));
  // On the GPU the scratch is the model's, in device memory: the host holds the sessions' KV copies.
  const uint64_t n = uint64_t(o.n_sessions);
  const uint64_t kv_bytes = n * session_kv_bytes(impl);
  const uint64_t scratch = impl.on_gpu ? 0 : n * (session_scratch_bytes(impl) + cpu_sweep);
  const experts::MemoryMode mode = o.experts == ExpertMode::kResident ? experts::MemoryMode::kResident
                                   : o.experts == ExpertMode::kStream ? experts::MemoryMode::kStream
                                                                      : experts::MemoryMode::kAuto;
  MAGNETAR_ASSIGN_OR_RETURN(experts::Plan plan,
                            experts::plan_memory({.machine = machine.value(),
                                                  .model = fp,
                                                  .kv_bytes = kv_bytes,
                                                  .n_ctx = o.n_ctx,
                                                  .n_sessions = o.n_sessions,
                                                  .scratch_bytes = scratch,
                                                  .kv_disk_bytes = kv_disk_buffer_bytes(impl),
                                                  .mode = mode,
                                                  .cache_bytes = uint64_t(o.stream.cache_gb * double(1ull << 30))}));
  if (!impl.plan_text.empty()) impl.plan_text += '\n';
  impl.plan_text += experts::describe(plan);
  impl.plan_spare = plan.budget_bytes > plan.total_bytes ? plan.budget_bytes - plan.total_bytes : 0;
  while (!impl.plan_text.empty() && impl.plan_text.back() == '\n') impl.plan_text.pop_back();
  if (plan.mode == experts::PlanMode::kResident) return Status();
  if (!impl.on_gpu) {
    impl.sweep_tokens = std::min(impl.model->sweep_tokens(), sweep_for(o, cpu_row));
    impl.sweep_min = o.n_batch + 1;
    if (impl.sweep_tokens > 0) {
      impl.plan_text += format("\n  prefill sweeps of up to %lld tokens (--sweep: layer by layer over --batch chunks, "
                               "each layer's experts read once per sweep)", (long long)impl.sweep_tokens);
    }
  }
  experts::StoreOptions so{.cache_bytes = plan.cache_bytes,
                           .queue_depth = o.stream.queue_depth,
                           .use_uring = o.stream.io_uring,
                           .direct = o.stream.direct_io,
                           .policy = o.stream.policy,
                           .census_path = o.stream.census ? path + ".census" : std::string(),
                           .merge_gap_bytes = o.stream.read_gap_kib < 0 ? experts::kMeasureGap
                                                                        : uint64_t(o.stream.read_gap_kib) << 10};
  MAGNETAR_ASSIGN_OR_RETURN(impl.store, experts::StreamedExperts::open(*impl.file, *layout, so));
  impl.plan_text += "\n  expert store: " + impl.store->describe();
  if (impl.gpu_tier) {
    // The GPU pool copies its misses from the store's slots: page-locked, those copies are DMA at bus speed
    // (pageable memory goes through the driver's staging buffers, ~7 GB/s on the H200 host).
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = impl.model->attach_host_experts(impl.store.get()); !s.ok()) {
      impl.plan_text += "\n  warning: " + s.message() + "; the GPU pool copies from pageable memory (slower)";
    } else {
      impl.plan_text += format("\n  expert store page-locked for the GPU pool's copies (%.1f s)",
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  // The disk's speed sets the floor when the cache misses: measured (64 MiB of expert bytes, O_DIRECT, ~0.1 s)
  // and put next to the bytes one token needs when nothing is cached.
  for (int64_t l = 0; l < layout->n_layer(); ++l) {
    if (!layout->has_experts(l)) continue;
    const experts::Extent first = layout->extent(l, 0, experts::Part::kGate);
    Result<double> bw = experts::measure_read_bandwidth(impl.file->shards()[first.shard]->path(), first.offset, 64ull << 20);
    if (bw.ok() && bw.value() > 0) {
      impl.plan_text += format("\n  disk: %.0f MB/s (64 MiB, O_DIRECT); a token needs %.0f MiB of experts, so %.2f t/s "
                               "if nothing were cached",
                               bw.value() / 1e6, double(fp.expert_bytes_per_token_max) / double(1 << 20),
                               bw.value() / double(fp.expert_bytes_per_token_max));
    }
    break;
  }
  return Status();
}

// Moves the model to the GPU when asked (--device cuda) or when it fits (auto). The CPU model, bound zero-copy,
// gives the shapes; the CUDA loader uploads every weight. An explicit --device cuda that cannot be honoured is an
// error naming why; auto falls back to the CPU and says why in the plan.
Status choose_device(Engine::Impl& impl, const models::Architecture& entry, const std::string& path) {
  const EngineOptions& o = impl.options;
  if (o.device == Device::kCpu) return Status();
  const bool forced = o.device == Device::kCuda;
  const int64_t asked_batch = o.n_batch;
  auto fall_back = [&](const std::string& why) {
    if (forced) return Status::error(path + ": --device cuda: " + why);
    // The CPU's chunk (auto), or the one asked for (the GPU's may have been cut to gpu_max_batch).
    impl.options.n_batch = impl.batch_auto ? std::min(kCpuBatch, impl.options.n_ctx) : asked_batch;
    impl.gpu_unused = why;
    impl.plan_text = "device: CPU (" + why + ")";
    return Status();
  };
  const models::GpuInfo gpu = models::gpu_info();
  if (!gpu.present) return forced ? fall_back("no CUDA device (or this build has no CUDA backend)") : Status();
  if (!entry.load_cuda) return fall_back("architecture '" + std::string(entry.name) + "' has no CUDA forward pass yet");
  if (o.kv_type == KvType::kF32) {
    return fall_back("the CUDA backend keeps KV in F16, Q8_0 or FP8 (--kv-type f32 runs on the CPU)");
  }
  if (o.gpu_cache_gb < 0) return Status::error("--gpu-cache-gb must be >= 0");
  constexpr uint64_t kReserve = 1ull << 30;  // the CUDA context, the kernels' launch state, fragmentation
  const double gib = double(1ull << 30);
  const experts::ExpertLayout* layout = impl.model->expert_layout();
  const uint64_t expert_bytes = layout ? layout->total_expert_bytes() : 0;
  // Q8_0 and FP8 KV add the prefill's F16 copy of the attended rows (one per model, K and V: qwen3_moe_cuda.cpp).
  const models::HParams hp = impl.model->hparams();  // a copy: the CPU model is replaced below
  const uint64_t kv_f16 = o.kv_type == KvType::kQ8_0 || o.kv_type == KvType::kF8
                              ? uint64_t(o.n_ctx) * uint64_t(hp.n_head_kv * hp.head_dim) * 4
                              : 0;
  // --batch 0 (auto): prefill chunks of kGpuBatch tokens when every weight, the KV and that scratch fit (the
  // tensor-core products run ~30% faster on 2,048 rows than on 4 x 512: docs/benchmarks/2026-12-01-cuda-prefill-int-
  // epilogue.md), else 512 (a GPU pool keeps that memory for experts).
  const bool host_experts = o.experts == ExpertMode::kStream || o.experts == ExpertMode::kMmap;
  // The planned sessions' KV (EngineOptions::n_sessions), the scratch (the model's, for the current n_batch) and the
  // reserve.
  auto kv_scratch_bytes = [&] {
    return uint64_t(o.n_sessions) * session_kv_bytes(impl) + session_scratch_bytes(impl) + kv_f16 + kReserve;
  };
  if (impl.batch_auto) {
    impl.options.n_batch = std::min(kGpuBatch, o.n_ctx);
    if (o.gpu_cache_gb > 0 || host_experts || impl.file->file_bytes() + kv_scratch_bytes() > gpu.free_bytes) {
      impl.options.n_batch = std::min(kCpuBatch, o.n_ctx);
    }
  }
  impl.options.n_batch = std::min(impl.options.n_batch, gpu_max_batch(hp));
  const uint64_t kv_scratch = kv_scratch_bytes();
  const uint64_t resident_need = impl.file->file_bytes() + kv_scratch;
  // Tiered: prefill sweeps of up to `sweep` tokens (their residual stream on the GPU too).
  const int64_t sweep = expert_bytes > 0 ? sweep_for(o, models::CudaLoad::sweep_bytes(hp.n_embd, 1)) : 0;
  const uint64_t fixed_need = impl.file->file_bytes() - std::min(impl.file->file_bytes(), expert_bytes) + kv_scratch +
                              models::CudaLoad::sweep_bytes(hp.n_embd, sweep);
  // The pool: asked for, or needed because the experts do not fit (or asked to stay in host memory).
  uint64_t pool = expert_bytes > 0 ? uint64_t(o.gpu_cache_gb * gib) : 0;  // a dense model has no pool
  if (pool == 0 && expert_bytes > 0 && (host_experts || resident_need > gpu.free_bytes)) {
    pool = gpu.free_bytes > fixed_need ? std::min(gpu.free_bytes - fixed_need, expert_bytes) : 0;
    if (pool == 0) {
      return fall_back(
          format("%s: the non-expert weights, %s KV, scratch and prefill sweeps (--sweep) need %.1f GiB, "
                 "%.1f GiB free",
                 gpu.name.c_str(), sessions_words(o.n_sessions).c_str(), double(fixed_need) / gib,
                 double(gpu.free_bytes) / gib));
    }
  }
  if (pool == 0 && resident_need > gpu.free_bytes) {
    return fall_back(format("%s: the model needs %.1f GiB (weights, %s KV, scratch, 1 GiB reserve), %.1f GiB free",
                            gpu.name.c_str(), double(resident_need) / gib, sessions_words(o.n_sessions).c_str(),
                            double(gpu.free_bytes) / gib));
  }
  if (pool > 0 && fixed_need + pool > gpu.free_bytes) {
    return fall_back(format("%s: --gpu-cache-gb %.2f plus the non-expert weights, KV, scratch and prefill sweeps "
                            "(--sweep; %.1f GiB) exceed the %.1f GiB free",
                            gpu.name.c_str(), o.gpu_cache_gb, double(fixed_need) / gib, double(gpu.free_bytes) / gib));
  }
  Result<std::unique_ptr<models::Model>> model =
      entry.load_cuda(*impl.file, {.n_batch = o.n_batch, .expert_pool_bytes = pool, .cpu_experts = o.cpu_experts,
                                   .policy = o.gpu_cache_policy, .kv_type = kv_quant_type(o.kv_type),
                                   .sweep_tokens = pool > 0 ? sweep : 0});
  if (!model.ok()) return fall_back(model.status().message());
  impl.model = std::move(model).value();
  impl.on_gpu = true;
  impl.gpu_tier = pool > 0;
  impl.gpu_peak_bandwidth = gpu.peak_bytes_per_s;
  const char* kv_name = o.kv_type == KvType::kQ8_0 ? "Q8_0" : o.kv_type == KvType::kF8 ? "FP8 E4M3" : "F16";
  if (impl.gpu_tier) {
    const models::Model::GpuTierStats t = impl.model->gpu_tier_stats();
    impl.plan_text = format("device: CUDA %s: non-expert weights resident (%.1f GiB), routed experts (%.1f GiB) from "
                            "host memory through a GPU pool of %llu experts (%.2f GiB, %s), KV in %s on the GPU "
                            "(%.2f GiB per session), %.1f of %.1f GiB free before load",
                            gpu.name.c_str(), double(impl.file->file_bytes() - expert_bytes) / gib,
                            double(expert_bytes) / gib, (unsigned long long)t.slots,
                            o.gpu_cache_policy.c_str(), double(t.slots * t.slot_bytes) / gib, kv_name,
                            double(session_kv_bytes(impl)) / gib, double(gpu.free_bytes) / gib,
                            double(gpu.total_bytes) / gib);
    if (o.cpu_experts) {
      impl.plan_text +=
          "\n  CPU expert lane (--cpu-experts): cold experts that miss the pool are computed on the CPU, as "
          "many as finish within the bus's time for the other misses";
    }
    impl.sweep_tokens = impl.model->sweep_tokens();
    impl.sweep_min = o.n_sweep < 0 ? kGpuSweepMinChunks * o.n_batch : o.n_batch + 1;
    if (impl.sweep_tokens > 0) {
      impl.plan_text += format("\n  prefill sweeps of up to %lld tokens (--sweep: layer by layer over --batch chunks, "
                               "each layer's experts copied up once; %.0f MiB), for prompts of at least %lld",
                               (long long)impl.model->sweep_tokens(),
                               double(models::CudaLoad::sweep_bytes(hp.n_embd, impl.model->sweep_tokens())) /
                                   double(1 << 20),
                               (long long)impl.sweep_min);
    }
  } else {
    impl.plan_text = format("device: CUDA %s: every weight resident (%.1f GiB), KV in %s on the GPU (%.2f GiB per "
                            "session), %.1f of %.1f GiB free before load",
                            gpu.name.c_str(), double(impl.file->file_bytes()) / gib, kv_name,
                            double(session_kv_bytes(impl)) / gib, double(gpu.free_bytes) / gib,
                            double(gpu.total_bytes) / gib);
    if (o.cpu_experts) impl.plan_text += "\n  --cpu-experts: every expert is on the GPU, the CPU lane stays idle";
  }
  return Status();
}

// Opens the disk KV checkpoints (--kv-disk-dir) for this model and KV layout.
Status open_disk_kv(Engine::Impl& impl) {
  const KvDiskOptions& o = impl.options.kv_disk;
  if (o.dir.empty()) return Status();
  uint64_t budget = uint64_t(o.gb * double(1ull << 30));
  // The identity names the model and how this build computes its KV: a change to what rows hold (RoPE, attention
  // scaling, a KV type's rounding) bumps kKvComputeVersion, and the blocks of older builds are foreign.
  constexpr uint64_t kKvComputeVersion = 1;
  const kv::KvFormat kv_format =
      disk_kv_format(impl, impl.file->fingerprint() ^ (kKvComputeVersion * 0x9E3779B97F4A7C15ull));
  if (!impl.plan_text.empty()) impl.plan_text += "\n";
  if (budget == 0) {
    // Half the free space, counting the block files already there as free (else each restart would halve the
    // cache), at most 16 GiB. The directory may not exist yet (DiskCache creates it): the free space of its nearest
    // existing ancestor.
    struct statvfs fs;
    std::filesystem::path at = std::filesystem::absolute(o.dir);
    while (::statvfs(at.c_str(), &fs) != 0 && at.has_parent_path() && at != at.parent_path()) at = at.parent_path();
    uint64_t free_bytes = ::statvfs(at.c_str(), &fs) == 0 ? uint64_t(fs.f_bavail) * fs.f_frsize : 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(o.dir, ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      if (it->path().extension() == ".kvb" && it->is_regular_file(ec)) free_bytes += it->file_size(ec);
    }
    budget = std::min<uint64_t>(16ull << 30, free_bytes / 2);
    const uint64_t block = kv::DiskCache::block_file_bytes(kv_format, o.block_tokens);
    if (budget < block) {
      impl.plan_text += format(
          "disk KV: off: half the free space of %s (%.2f GiB) holds no block of %.2f GiB "
          "(--kv-disk-gb sets the budget, --kv-block the block size)",
          o.dir.c_str(), double(budget) / double(1ull << 30), double(block) / double(1ull << 30));
      return Status();
    }
  }
  MAGNETAR_ASSIGN_OR_RETURN(
      impl.disk_kv,
      kv::DiskCache::open({.dir = o.dir, .budget_bytes = budget, .block_tokens = o.block_tokens}, kv_format));
  impl.plan_text += "disk KV: " + impl.disk_kv->describe();
  return Status();
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

const std::string& Engine::memory_plan() const { return impl_->plan_text; }
const char* Engine::device() const { return impl_->on_gpu ? "cuda" : "cpu"; }
double Engine::peak_bandwidth() const { return impl_->gpu_peak_bandwidth; }

double DecodeBytes::at(double rows) const {
  const double attended = window > 0 ? std::min(rows, double(window)) : rows;
  return double(weights) + double(experts) + double(kv_per_row) * attended;
}

DecodeBytes Engine::decode_bytes() const {
  const Impl& impl = *impl_;
  const models::HParams& hp = impl.model->hparams();
  DecodeBytes d;
  uint64_t routed = 0;
  if (const experts::ExpertLayout* layout = impl.model->expert_layout()) {
    routed = layout->total_expert_bytes();
    d.experts = routed_bytes_per_token(*layout, hp.n_expert_used);
  }
  uint64_t tensors = 0;
  for (const gguf::TensorInfo& t : impl.file->tensors()) tensors += t.nbytes;
  d.weights = tensors - std::min(tensors, routed);
  // A token reads one row of its embedding, unless the output head is the embedding (tied) and reads it all.
  const gguf::TensorInfo* embd = impl.file->find_tensor("token_embd.weight");
  if (embd != nullptr && embd->ne[1] > 0 && impl.file->find_tensor("output.weight") != nullptr) {
    d.weights -= embd->nbytes - embd->nbytes / uint64_t(embd->ne[1]);
  }
  d.kv_per_row = kv_bytes_per_token(impl);
  d.window = hp.sliding_window;
  return d;
}
const std::string& Engine::gpu_unused() const { return impl_->gpu_unused; }
const std::string& Engine::context_note() const { return impl_->context_note; }

namespace {
ExpertStats to_public(const experts::LayerStats& t) {
  ExpertStats out;
  out.streamed = true;
  out.hits = t.hits;
  out.inflight_hits = t.inflight_hits;
  out.misses = t.misses;
  out.reads = t.reads;
  out.bytes_read = t.bytes_read;
  out.read_seconds = t.read_seconds;
  out.wait_seconds = t.wait_seconds;
  out.prefetch_issued = t.prefetch_issued;
  out.prefetch_used = t.prefetch_used;
  out.prefetch_wasted = t.prefetch_wasted;
  out.predicted = t.predicted;
  out.acquired_with_hint = t.acquired;
  return out;
}
}  // namespace

ExpertStats Engine::expert_stats() const {
  ExpertStats out;
  if (impl_->store) {
    out = to_public(impl_->store->stats().total());
    out.store = impl_->store->describe();
    out.evictions = impl_->store->stats().evictions;
  }
  if (impl_->gpu_tier) {
    const models::Model::GpuTierStats t = impl_->model->gpu_tier_stats();
    out.gpu_tier = true;
    out.gpu_slots = t.slots;
    out.gpu_hits = t.hits;
    out.gpu_misses = t.misses;
    out.gpu_evictions = t.evictions;
    out.gpu_bytes_h2d = t.bytes_h2d;
    out.gpu_miss_seconds = t.h2d_seconds;
    out.gpu_cpu_experts = t.cpu_experts;
    out.gpu_cpu_rows = t.cpu_rows;
    out.gpu_cpu_seconds = t.cpu_seconds;
  }
  out.sweeps = impl_->sweeps;
  out.sweep_pauses = impl_->sweep_pauses;
  return out;
}

std::vector<ExpertStats> Engine::expert_layer_stats() const {
  std::vector<ExpertStats> out;
  if (!impl_->store) return out;
  for (const experts::LayerStats& l : impl_->store->stats().layers) out.push_back(to_public(l));
  out.resize(size_t(impl_->model->hparams().n_layer));
  return out;
}

ExpertStats& ExpertStats::operator+=(const ExpertStats& o) {
  streamed = o.streamed;
  store = o.store;
  hits += o.hits, inflight_hits += o.inflight_hits, misses += o.misses, evictions += o.evictions;
  reads += o.reads, bytes_read += o.bytes_read, read_seconds += o.read_seconds, wait_seconds += o.wait_seconds;
  prefetch_issued += o.prefetch_issued, prefetch_used += o.prefetch_used, prefetch_wasted += o.prefetch_wasted;
  predicted += o.predicted, acquired_with_hint += o.acquired_with_hint;
  gpu_tier = o.gpu_tier;
  gpu_slots = o.gpu_slots;
  gpu_hits += o.gpu_hits, gpu_misses += o.gpu_misses, gpu_evictions += o.gpu_evictions;
  gpu_bytes_h2d += o.gpu_bytes_h2d, gpu_miss_seconds += o.gpu_miss_seconds;
  gpu_cpu_experts += o.gpu_cpu_experts, gpu_cpu_rows += o.gpu_cpu_rows, gpu_cpu_seconds += o.gpu_cpu_seconds;
  sweeps += o.sweeps, sweep_pauses += o.sweep_pauses;
  return *this;
}

void Engine::reset_expert_stats() {
  if (impl_->store) impl_->store->reset_stats();
  impl_->model->reset_gpu_tier_stats();
  impl_->sweeps = 0;
  impl_->sweep_pauses = 0;
}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::load(const std::string& path, const EngineOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  Result<std::unique_ptr<gguf::Model>> file = gguf::Model::open(path);
  if (!file.ok()) return file.status();
  impl->file = std::move(file).value();
  const std::string arch = impl->file->architecture();
  const models::Architecture* entry = models::find_architecture(arch);
  if (!entry) {
    return Status::error(format("%s: architecture '%s' is not supported (supported: %s)", path.c_str(),
                                arch.empty() ? "(none)" : arch.c_str(), models::supported_architectures().c_str()));
  }
  Result<std::unique_ptr<models::Model>> model = entry->load(*impl->file);
  if (!model.ok()) return model.status();
  impl->model = std::move(model).value();
  const models::HParams hp = impl->model->hparams();  // a copy: choose_device may replace the model

  if (impl->file->find("tokenizer.ggml.model")) {
    Result<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::from_gguf(impl->file->metadata(), path);
    if (!tok.ok()) return tok.status();
    impl->tok.emplace(std::move(tok).value());
    if (impl->tok->n_vocab() > hp.n_vocab) {
      return Status::error(format("%s: tokenizer has %lld tokens but the embedding only %lld rows", path.c_str(),
                                  (long long)impl->tok->n_vocab(), (long long)hp.n_vocab));
    }
  }

  impl->options = options;
  if (options.kv_type == KvType::kQ8_0 && (hp.head_dim % 32 != 0 || hp.head_dim > 512)) {
    return Status::error(format("%s: --kv-type q8_0 needs a head size that is a multiple of 32 up to 512 (this "
                                "model's is %lld)", path.c_str(), (long long)hp.head_dim));
  }
  if (impl->options.n_threads <= 0) impl->options.n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  if (impl->options.n_ctx <= 0) impl->options.n_ctx = default_context(*impl, *entry);
  if (impl->options.n_ctx > kMaxCtx) {
    return Status::error(format("--ctx %lld: at most %lld tokens", (long long)impl->options.n_ctx, (long long)kMaxCtx));
  }
  if (impl->options.n_sessions < 1 || impl->options.n_sessions > kMaxSessions) {
    return Status::error(format("%lld sessions to plan for: at least 1 and at most %lld",
                                (long long)impl->options.n_sessions, (long long)kMaxSessions));
  }
  if (impl->options.n_threads > kMaxThreads) {
    return Status::error(format("-t %d: at most %d threads", impl->options.n_threads, kMaxThreads));
  }
  // Checked whether or not the plan uses them (they were refused only when it did).
  for (const auto& [flag, name] : {std::pair{"--cache-policy", &impl->options.stream.policy},
                                   std::pair{"--gpu-cache-policy", &impl->options.gpu_cache_policy}}) {
    if (!experts::make_policy(*name, 1, 1.0)) {
      return Status::error(format("%s must be one of %s, got '%s'", flag, experts::kPolicyNames, name->c_str()));
    }
  }
  impl->batch_auto = impl->options.n_batch <= 0;  // choose_device may raise it for a GPU
  if (impl->batch_auto) impl->options.n_batch = kCpuBatch;
  impl->options.n_batch = std::min(impl->options.n_batch, impl->options.n_ctx);
  impl->pool = std::make_unique<cpu::ThreadPool>(impl->options.n_threads);
  MAGNETAR_RETURN_IF_ERROR(choose_device(*impl, *entry, path));
  // The disk KV's block size sizes its buffers in the memory checks below.
  if (const KvDiskOptions& kd = impl->options.kv_disk; !kd.dir.empty()) {
    if (kd.gb < 0 || kd.block_tokens < 1) return Status::error("--kv-disk-gb must be >= 0 and the block size >= 1");
    if (kd.block_tokens > impl->options.n_ctx) {
      return Status::error(
          format("--kv-block %lld is longer than the context of %lld tokens: no block would ever be saved",
                 (long long)kd.block_tokens, (long long)impl->options.n_ctx));
    }
  }
  const Result<experts::MachineSnapshot> machine = experts::read_machine();  // one reading for both
  MAGNETAR_RETURN_IF_ERROR(check_session_memory(*impl, machine));
  if (!impl->on_gpu || impl->gpu_tier) MAGNETAR_RETURN_IF_ERROR(plan_experts(*impl, path, machine));
  if (impl->options.cpu_experts && !impl->on_gpu) {
    impl->plan_text += "\n  --cpu-experts: no effect, the model runs on the CPU (the lane is the CUDA tiered mode's)";
  }
  MAGNETAR_RETURN_IF_ERROR(open_disk_kv(*impl));
  if (!impl->context_note.empty()) impl->plan_text += (impl->plan_text.empty() ? "" : "\n") + impl->context_note;
  if (hp.n_expert > 0) impl->uses = {.n_expert = hp.n_expert, .counts = std::vector<uint64_t>(size_t(hp.n_layer * hp.n_expert))};

  ModelInfo& info = impl->info;
  info.path = path;
  info.architecture = arch;
  info.name = impl->file->get_string("general.name");
  info.n_vocab = hp.n_vocab;
  info.n_ctx_train = hp.n_ctx_train;
  info.n_layer = hp.n_layer;
  info.n_embd = hp.n_embd;
  info.n_expert = hp.n_expert;
  info.n_expert_used = hp.n_expert_used;
  for (const gguf::TensorInfo& t : impl->file->tensors()) info.n_params += uint64_t(t.n_elements());
  info.file_bytes = impl->file->file_bytes();
  info.has_tokenizer = impl->tok.has_value();
  info.chat_template = impl->file->get_string("tokenizer.chat_template");
  if (impl->tok) {
    if (impl->tok->bos_id() != tokenizer::kNoToken) info.bos_token = std::string(impl->tok->token_text(impl->tok->bos_id()));
    info.adds_bos = impl->tok->add_bos();
    info.max_token_bytes = int64_t(impl->tok->max_token_bytes());
    if (impl->tok->eos_id() != tokenizer::kNoToken) info.eos_token = std::string(impl->tok->token_text(impl->tok->eos_id()));
  }
  impl->load_seconds = seconds_since(t0);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

uint64_t Engine::session_bytes() const {
  return session_kv_bytes(*impl_) + (impl_->on_gpu ? 0 : session_scratch_bytes(*impl_));  // GPU: the model's scratch
}

Result<int64_t> Engine::sessions_that_fit() const {
  const uint64_t one = std::max<uint64_t>(1, session_bytes());
  int64_t fit = 0;
  if (impl_->plan_spare) {
    // The sessions the memory plan counted (n_sessions) and what it left beyond them: mapped weights not yet read
    // and a cache not yet filled would look free to a fresh reading of the machine.
    fit = int64_t(*impl_->plan_spare / one) + impl_->options.n_sessions - 1;
  } else {
    MAGNETAR_ASSIGN_OR_RETURN(const experts::MachineSnapshot machine, experts::read_machine());
    const uint64_t available = experts::memory_budget(machine);
    const uint64_t reserve = experts::reserve_bytes(machine);
    const uint64_t free_bytes = available > reserve ? available - reserve : 0;
    fit = std::max<int64_t>(0, int64_t(free_bytes / one) - 1);  // the first session is not allocated yet
  }
  if (impl_->on_gpu) {
    // Each session also takes its KV on the GPU, allocated at its first forward pass: what is free there now,
    // less the 1 GiB reserve the load kept and the first session's share (not allocated yet, counted at load).
    const models::GpuInfo gpu = models::gpu_info();
    const uint64_t kv = std::max<uint64_t>(1, session_kv_bytes(*impl_));
    const uint64_t usable = gpu.free_bytes > (1ull << 30) ? gpu.free_bytes - (1ull << 30) : 0;
    fit = std::min(fit, std::max<int64_t>(0, int64_t(usable / kv) - 1));
  }
  return fit;
}

ExpertMap Engine::expert_map() const {
  ExpertMap map;
  const models::HParams& hp = impl_->model->hparams();
  if (hp.n_expert == 0) return map;
  map.n_layer = hp.n_layer;
  map.n_expert = hp.n_expert;
  map.uses = impl_->uses.counts;
  if (impl_->store) {
    map.tier = impl_->store->cached();  // 1 = kRam, 0 = kDisk
  } else {
    map.tier.assign(map.uses.size(), ExpertMap::kResident);
  }
  if (impl_->gpu_tier) {
    const std::vector<uint8_t> on_gpu = impl_->model->gpu_cached();
    for (size_t i = 0; i < on_gpu.size() && i < map.tier.size(); ++i) {
      if (on_gpu[i]) map.tier[i] = ExpertMap::kGpu;
    }
  }
  return map;
}

KvDiskStats Engine::kv_disk_stats(bool settle) const {
  KvDiskStats out;
  if (!impl_->disk_kv) return out;
  if (settle) impl_->disk_kv->flush();  // blocks still being written count once they are on disk
  const kv::DiskCacheStats s = impl_->disk_kv->stats();
  out.enabled = true;
  out.where = impl_->disk_kv->describe();
  out.blocks_on_disk = s.blocks_on_disk;
  out.bytes_on_disk = s.bytes_on_disk;
  out.foreign_blocks = s.foreign_blocks;
  out.foreign_bytes = s.foreign_bytes;
  out.blocks_saved = s.blocks_saved;
  out.blocks_restored = s.blocks_restored;
  out.blocks_evicted = s.blocks_evicted;
  out.blocks_rejected = s.blocks_rejected;
  out.tokens_restored = s.tokens_restored;
  out.bytes_written = s.bytes_written;
  out.bytes_read = s.bytes_read;
  out.save_seconds = s.save_seconds;
  out.blocks_failed = s.blocks_failed;
  out.blocks_declined = s.blocks_declined;
  out.copy_seconds = s.copy_seconds;
  out.restore_seconds = s.restore_seconds;
  return out;
}

const ModelInfo& Engine::info() const { return impl_->info; }
const EngineOptions& Engine::options() const { return impl_->options; }
double Engine::load_seconds() const { return impl_->load_seconds; }

Result<std::vector<int32_t>> Engine::tokenize(std::string_view text, bool parse_special) const {
  if (!impl_->tok) return Status::error(impl_->info.path + ": the model has no tokenizer (give token ids instead)");
  return impl_->tok->encode(text, parse_special);
}

std::string Engine::detokenize(std::span<const int32_t> ids) const {
  return impl_->tok ? impl_->tok->decode(ids) : std::string();
}

bool Engine::is_end_of_generation(int32_t id) const { return impl_->tok && impl_->tok->is_eog(id); }

std::string_view Engine::token_bytes(int32_t id) const {
  if (!impl_->tok || impl_->tok->token_type(id) == tokenizer::TokenType::kControl) return {};
  return impl_->tok->token_text(id);
}

namespace {
class StreamDetokenizer final : public Detokenizer {
 public:
  explicit StreamDetokenizer(const tokenizer::Tokenizer& tok) : decoder_(tok) {}
  std::string push(int32_t id) override { return decoder_.push(id); }
  std::string flush() override { return decoder_.flush(); }

 private:
  tokenizer::StreamDecoder decoder_;
};

// A model without a tokenizer has no text: its detokenizer produces none.
class NoDetokenizer final : public Detokenizer {
 public:
  std::string push(int32_t) override { return {}; }
  std::string flush() override { return {}; }
};
}  // namespace

std::unique_ptr<Detokenizer> Engine::new_detokenizer() const {
  if (!impl_->tok) return std::make_unique<NoDetokenizer>();
  return std::make_unique<StreamDetokenizer>(*impl_->tok);
}

// ---- Session --------------------------------------------------------------------------------------------------

struct Session::Impl {
  Engine::Impl* engine = nullptr;
  std::unique_ptr<kv::KvCache> kv;
  std::unique_ptr<models::Workspace> ws;
  std::vector<int32_t> tokens;   // timeline whose KV is valid
  std::span<float> last_logits;   // [n_vocab]: ws->logits_row() where the model has one, else own_logits
  std::vector<float> own_logits;
  bool have_logits = false;
  std::vector<float> all_logits;
  int64_t all_first = 0;
  int64_t all_rows = 0;
  SessionStats stats;
  models::Profile profile;
  models::RoutingCounts routing;
  // A prefill sweep that sync's progress hook stopped midway: tokens [b, b + tokens.size()) of the timeline, whose KV
  // rows are computed at the layers before `at`. A later sync whose timeline extends this one with those tokens
  // continues it; anything else that moves the timeline drops it.
  struct PausedSweep {
    int64_t b = 0;
    std::vector<int32_t> tokens;
    models::SweepCursor at;
    uint64_t serial = 0;  // Engine::Impl::sweep_serial when it started
  };
  std::optional<PausedSweep> paused;
  // The drafts of the last step(id, drafts) not settled yet: the last `drafts` tokens of the timeline, computed but
  // neither counted nor checkpointed until settle() knows which of them stay.
  int64_t drafts = 0;

  // Computes positions [from, tokens.size()) of `tokens` (already the whole new timeline; rows before
  // `from` are valid in the KV cache) and keeps logits as asked. Calls `progress` after each chunk (when set);
  // on its false, or a failed forward, truncates `tokens` to the computed prefix.
  Status compute(int64_t from, Logits mode, const SyncProgress& progress = {});
  // Disk KV: queues the full blocks of tokens[0, n_valid) not saved yet, when [from, n_valid) completed one (their
  // rows are copied now, the files written in the background). A failed save is a warning (the computation
  // stands; the disk may be full).
  void checkpoint(int64_t from, int64_t n_valid);
  // Settles the unsettled drafts for a timeline that keeps its first `keep` tokens: those before `keep` count as
  // decoded tokens and are checkpointed, the rest are rejected.
  void settle(size_t keep);
  // Whether a new sweep may start in compute call `call`: always, unless the model holds another session's paused
  // sweep that has not had a call of its own since a session first found it so (then that one is dropped).
  bool may_start_sweep(uint64_t call);
  void drop_paused();
};

bool Session::Impl::may_start_sweep(uint64_t call) {
  Engine::Impl& e = *engine;
  if (!e.model->sweep_state_in_model() || !e.sweep_paused) return true;
  if (e.sweep_contested == 0 || e.sweep_contested == call) {
    e.sweep_contested = call;
    return false;
  }
  return true;
}

void Session::Impl::drop_paused() {
  if (paused && paused->serial == engine->sweep_serial) engine->sweep_paused = false;
  paused.reset();
}

void Session::Impl::settle(size_t keep) {
  if (drafts == 0) return;
  const int64_t first = int64_t(tokens.size()) - drafts;
  const int64_t kept = std::clamp<int64_t>(int64_t(keep) - first, 0, drafts);
  drafts = 0;
  stats.drafts_accepted += kept;
  stats.decode_tokens += kept;
  checkpoint(first, first + kept);
}

void Session::Impl::checkpoint(int64_t from, int64_t n_valid) {
  kv::DiskCache* disk = engine->disk_kv.get();
  if (!disk || n_valid / disk->block_tokens() == from / disk->block_tokens()) return;
  disk->save_async(std::span<const int32_t>(tokens).first(size_t(n_valid)), n_valid, *kv);
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Engine::new_session() {
  auto s = std::make_unique<Session::Impl>();
  s->engine = impl_.get();
  const models::HParams& hp = impl_->model->hparams();
  const quant::Type kv_type = kv_quant_type(impl_->options.kv_type);
  s->kv = std::make_unique<kv::KvCache>(kv_type, hp.n_layer, impl_->options.n_ctx, hp.n_head_kv * hp.head_dim);
  s->ws = impl_->model->make_workspace(impl_->options.n_batch, impl_->options.n_ctx, impl_->options.n_threads);
  s->last_logits = s->ws->logits_row();
  if (s->last_logits.size() != size_t(hp.n_vocab)) {
    s->own_logits.resize(size_t(hp.n_vocab));
    s->last_logits = s->own_logits;
  }
  if (impl_->options.count_routing && hp.n_expert > 0) {
    s->routing = {.n_expert = hp.n_expert, .counts = std::vector<uint64_t>(size_t(hp.n_layer * hp.n_expert))};
  }
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

Status Session::Impl::compute(int64_t from, Logits mode, const SyncProgress& progress) {
  const std::vector<int32_t>& next = tokens;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n_vocab = engine->model->hparams().n_vocab;
  const int64_t total = int64_t(next.size()) - from;
  const int64_t n_batch = engine->options.n_batch;
  const uint64_t call = ++engine->compute_calls;
  const bool model_state = engine->model->sweep_state_in_model();
  // Tokens per forward call: a prefill sweep of the remaining prompt when it is long enough for one (sweep_min).
  const int64_t sweep = engine->sweep_tokens, sweep_min = std::max(engine->sweep_min, n_batch + 1);
  if (paused && (paused->b != from || (model_state && paused->serial != engine->sweep_serial))) drop_paused();
  if (mode == Logits::kAll) {
    all_logits.resize(size_t(total) * size_t(n_vocab));
    all_first = from;
    all_rows = total;
  }
  for (int64_t b = from, n = 0; b < int64_t(next.size()); b += n) {
    const int64_t left = int64_t(next.size()) - b;
    const bool resume = paused.has_value();  // sync() kept it: it starts here
    n = resume ? int64_t(paused->tokens.size())
               : std::min(sweep > 0 && left >= sweep_min && may_start_sweep(call) ? sweep : n_batch, left);
    const bool last_chunk = b + n == int64_t(next.size());
    float* out = mode == Logits::kAll ? all_logits.data() + size_t(b - from) * size_t(n_vocab) : last_logits.data();
    const models::SeqSpan seq{.kv = kv.get(), .pos0 = b, .n_tok = n};
    // A sweep goes in steps: `progress` is asked after each (a layer of a chunk), with the share of the sweep done.
    models::SweepCursor at = resume ? paused->at : models::SweepCursor{};
    const int64_t step0 = at.step;
    bool stopped = false;
    std::function<bool()> pause;
    if (n > n_batch) {
      if (progress) {
        pause = [&] {
          stopped = !progress(b - from + n * (at.step - step0) / at.steps, total);
          return stopped;
        };
      }
      if (!resume) {
        paused = PausedSweep{.b = b, .tokens = {next.begin() + b, next.begin() + b + n}, .at = {},
                             .serial = model_state ? ++engine->sweep_serial : 0};
      }
      if (model_state) {
        engine->sweep_paused = false;  // running
        engine->sweep_contested = 0;
      }
    }
    const Status s = engine->model->forward(
        *engine->pool, *ws,
        {.tokens = next.data() + b, .n_tok = n, .seqs = {&seq, 1}, .all_logits = mode == Logits::kAll,
         .logits = mode == Logits::kAll ? out : nullptr,
         .seq_logits = mode == Logits::kAll ? std::span<float* const>() : std::span<float* const>(&out, 1),
         .profile = engine->options.profile ? &profile : nullptr,
         .routing = routing.counts.empty() ? (engine->uses.counts.empty() ? nullptr : &engine->uses) : &routing,
         .experts = engine->store.get(),
         .prefetch = engine->store != nullptr && engine->options.stream.prefetch,
         .sweep = n > n_batch ? &at : nullptr,
         .pause = pause ? &pause : nullptr});
    if (s.ok() && stopped) {
      // The sweep stays where it stopped; the timeline is the prefix before it.
      paused->at = at;
      ++engine->sweep_pauses;
      if (model_state) engine->sweep_paused = true;
      tokens.resize(size_t(b));
      all_rows = 0;
      stats.prefill_tokens += b - from;
      stats.prefill_seconds += seconds_since(t0);
      return Status::error("cancelled");
    }
    if (n > n_batch) drop_paused();
    if (!s.ok()) {
      tokens.resize(size_t(b));
      all_rows = 0;
      return s;
    }
    if (n > n_batch) ++engine->sweeps;
    checkpoint(b, std::clamp<int64_t>(int64_t(next.size()) - drafts, b, b + n));  // drafts: once settled
    if (last_chunk && mode == Logits::kAll) {
      std::copy(out + size_t(n - 1) * size_t(n_vocab), out + size_t(n) * size_t(n_vocab), last_logits.begin());
    }
    if (progress && !progress(b + n - from, total) && !last_chunk) {
      // The KV of [0, b + n) is valid: that prefix is the timeline a later sync resumes from.
      tokens.resize(size_t(b + n));
      all_rows = 0;
      stats.prefill_tokens += b + n - from;
      stats.prefill_seconds += seconds_since(t0);
      return Status::error("cancelled");
    }
  }
  have_logits = true;
  const double dt = seconds_since(t0);
  if (total - drafts == 1) {  // step(), or step(id, drafts): the drafts count once settled
    stats.decode_tokens += 1;
    stats.decode_seconds += dt;
    stats.draft_tokens += drafts;
  } else {
    stats.prefill_tokens += total;
    stats.prefill_seconds += dt;
  }
  return Status();
}

Status Session::sync(std::span<const int32_t> next, Logits mode, const SyncProgress& progress) {
  Impl& s = *impl_;
  const int64_t n_vocab = s.engine->model->hparams().n_vocab;
  if (next.empty()) return Status::error("sync: empty token sequence");
  if (int64_t(next.size()) > s.kv->n_ctx()) {
    return Status::error(format("%zu tokens do not fit the context of %lld tokens (raise --ctx)", next.size(),
                                (long long)s.kv->n_ctx()));
  }
  for (size_t i = 0; i < next.size(); ++i) {
    if (next[i] < 0 || next[i] >= n_vocab) {
      return Status::error(format("token %d at position %zu is outside the vocabulary [0, %lld)", next[i], i,
                                  (long long)n_vocab));
    }
  }
  size_t lcp = 0;
  while (lcp < s.tokens.size() && lcp < next.size() && s.tokens[lcp] == next[lcp]) ++lcp;
  s.settle(lcp);
  // A paused sweep continues when the new timeline extends the current one (the rows it attended) with its tokens.
  if (s.paused) {
    const std::vector<int32_t>& t = s.paused->tokens;
    if (lcp != s.tokens.size() || next.size() < lcp + t.size() || !std::equal(t.begin(), t.end(), next.begin() + lcp)) {
      s.drop_paused();
    }
  }
  if (mode == Logits::kLast && lcp == next.size() && s.tokens.size() == next.size() && s.have_logits) {
    s.stats.reused_tokens += int64_t(next.size());  // all of it (a repeated prompt: cached_tokens said 0)
    return Status();
  }
  int64_t keep = int64_t(std::min(lcp, next.size() - 1));
  s.stats.reused_tokens += keep;
  s.have_logits = false;
  s.all_rows = 0;
  s.tokens.assign(next.begin(), next.end());
  // Disk KV: whole blocks beyond the kept prefix come from the disk when it has them (at least one token is
  // still computed, for the logits; with Logits::kAll none: a restored row has no logits). A block that fails its
  // checks ends the restore there. A paused sweep does not survive a restore: the restore overwrites rows of its
  // computed layers (all of them when a block fails its checks after its rows were written). Block by block, with
  // `progress` asked between blocks as between chunks: a long restore (seconds for a 100K-token history) yields to
  // other sessions and stops for a client that left, the timeline then being the prefix restored so far.
  kv::DiskCache* disk = s.engine->disk_kv.get();
  if (disk && mode == Logits::kLast) {
    const int64_t B = disk->block_tokens();
    const int64_t limit = (int64_t(next.size()) - 1) / B * B;
    const int64_t saved = limit > keep ? disk->match(next.first(size_t(limit)), keep / B) : 0;
    if (saved > keep) {
      s.drop_paused();
      const int64_t first = keep, total = int64_t(next.size()) - first;
      for (;;) {
        const int64_t until = std::min(saved, (keep / B + 1) * B);
        const int64_t got = disk->restore(next, keep / B, until, *s.kv);
        if (got > keep) {
          s.stats.restored_tokens += got - keep;
        } else if (got < keep) {  // the block holding row `keep` failed its checks after its rows were overwritten
          s.stats.reused_tokens -= keep - got;
        }
        keep = got;
        if (keep < until || keep >= saved) break;
        if (progress && !progress(keep - first, total)) {
          s.tokens.resize(size_t(keep));  // the KV of [0, keep) is valid: a later sync resumes from it
          return Status::error("cancelled");
        }
      }
    }
  }
  return s.compute(keep, mode, progress);
}

Status Session::step(int32_t id) {
  Impl& s = *impl_;
  if (id < 0 || id >= s.engine->model->hparams().n_vocab) {
    return Status::error(format("token %d is outside the vocabulary", id));
  }
  if (int64_t(s.tokens.size()) + 1 > s.kv->n_ctx()) {
    return Status::error(format("context of %lld tokens is full (raise --ctx)", (long long)s.kv->n_ctx()));
  }
  s.settle(s.tokens.size());
  s.drop_paused();
  s.tokens.push_back(id);
  s.all_rows = 0;
  return s.compute(int64_t(s.tokens.size()) - 1, Logits::kLast);  // compute() checkpoints a completed block
}

Status Session::step(int32_t id, std::span<const int32_t> drafts) {
  if (drafts.empty()) return step(id);
  Impl& s = *impl_;
  const int64_t n_vocab = s.engine->model->hparams().n_vocab;
  if (id < 0 || id >= n_vocab) return Status::error(format("token %d is outside the vocabulary", id));
  for (const int32_t d : drafts) {
    if (d < 0 || d >= n_vocab) return Status::error(format("draft token %d is outside the vocabulary", d));
  }
  if (int64_t(s.tokens.size() + 1 + drafts.size()) > s.kv->n_ctx()) {
    return Status::error(format("context of %lld tokens has no room for a token and %zu drafts (raise --ctx)",
                                (long long)s.kv->n_ctx(), drafts.size()));
  }
  s.settle(s.tokens.size());
  s.drop_paused();
  const int64_t from = int64_t(s.tokens.size());
  s.tokens.push_back(id);
  s.tokens.insert(s.tokens.end(), drafts.begin(), drafts.end());
  s.drafts = int64_t(drafts.size());
  const Status st = s.compute(from, Logits::kAll);
  if (!st.ok()) s.drafts = 0;  // compute() cut the timeline back to what it computed
  return st;
}

void Session::rewind(size_t n) {
  Impl& s = *impl_;
  MAGNETAR_CHECK(n <= s.tokens.size());
  s.settle(n);
  s.drop_paused();
  s.tokens.resize(n);
  const int64_t last = int64_t(n) - 1;
  s.all_rows = std::clamp<int64_t>(int64_t(n) - s.all_first, 0, s.all_rows);
  s.have_logits = last >= s.all_first && last < s.all_first + s.all_rows;
  if (s.have_logits) {
    const auto row = s.all_logits.begin() + ptrdiff_t(last - s.all_first) * ptrdiff_t(s.last_logits.size());
    std::copy(row, row + ptrdiff_t(s.last_logits.size()), s.last_logits.begin());
  }
}

Status Engine::step(std::span<Session* const> sessions, std::span<const int32_t> ids) {
  MAGNETAR_CHECK(sessions.size() == ids.size());
  const int64_t n_vocab = impl_->model->hparams().n_vocab;
  for (size_t i = 0; i < sessions.size(); ++i) {
    const Session::Impl& s = *sessions[i]->impl_;
    MAGNETAR_CHECK(s.engine == impl_.get());
    for (size_t j = 0; j < i; ++j) MAGNETAR_CHECK(sessions[j] != sessions[i]);
    if (ids[i] < 0 || ids[i] >= n_vocab) {
      return Status::error(format("session %zu: token %d is outside the vocabulary", i, ids[i]));
    }
    if (int64_t(s.tokens.size()) + 1 > s.kv->n_ctx()) {
      return Status::error(format("session %zu: context of %lld tokens is full (raise --ctx)", i, (long long)s.kv->n_ctx()));
    }
  }
  const size_t n_batch = size_t(impl_->options.n_batch);
  std::vector<models::SeqSpan> seqs;
  std::vector<float*> rows;  // the sessions' logits rows: the model writes each session's own
  for (size_t b = 0; b < sessions.size(); b += n_batch) {
    const size_t n = std::min(n_batch, sessions.size() - b);
    const auto t0 = std::chrono::steady_clock::now();
    seqs.clear();
    for (size_t i = b; i < b + n; ++i) {
      Session::Impl& s = *sessions[i]->impl_;
      s.settle(s.tokens.size());
      seqs.push_back({.kv = s.kv.get(), .pos0 = int64_t(s.tokens.size()), .n_tok = 1});
      s.drop_paused();
      s.tokens.push_back(ids[i]);
      s.have_logits = false;
      s.all_rows = 0;
    }
    rows.clear();
    for (size_t i = b; i < b + n; ++i) rows.push_back(sessions[i]->impl_->last_logits.data());
    Session::Impl& lead = *sessions[b]->impl_;  // its scratch, profile and routing counts serve the batch
    const Status st = impl_->model->forward(
        *impl_->pool, *lead.ws,
        {.tokens = ids.data() + b, .n_tok = int64_t(n), .seqs = seqs, .seq_logits = rows,
         .profile = impl_->options.profile ? &lead.profile : nullptr,
         .routing = lead.routing.counts.empty() ? (impl_->uses.counts.empty() ? nullptr : &impl_->uses) : &lead.routing,
         .experts = impl_->store.get(),
         .prefetch = impl_->store != nullptr && impl_->options.stream.prefetch});
    const double dt = seconds_since(t0);
    for (size_t i = b; i < b + n; ++i) {
      Session::Impl& s = *sessions[i]->impl_;
      if (!st.ok()) {
        s.tokens.pop_back();  // its KV row was not (fully) written: the timeline is what it was
        continue;
      }
      s.have_logits = true;
      s.stats.decode_tokens += 1;
      s.stats.decode_seconds += dt;
      s.checkpoint(int64_t(s.tokens.size()) - 1, int64_t(s.tokens.size()));
    }
    if (!st.ok()) return st;
  }
  return Status();
}

void Session::clear() {
  impl_->settle(0);
  impl_->drop_paused();
  impl_->tokens.clear();
  impl_->have_logits = false;
  impl_->all_rows = 0;
}

std::span<const float> Session::logits() const { return impl_->last_logits; }
std::span<const float> Session::all_logits() const {
  return {impl_->all_logits.data(), size_t(impl_->all_rows) * impl_->last_logits.size()};
}
int64_t Session::all_logits_first() const { return impl_->all_first; }
const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }
int64_t Session::n_ctx() const { return impl_->kv->n_ctx(); }
int64_t Session::n_vocab() const { return int64_t(impl_->last_logits.size()); }
const SessionStats& Session::stats() const { return impl_->stats; }
void Session::reset_stats() {
  impl_->stats = {};
  impl_->profile = {};
  std::fill(impl_->routing.counts.begin(), impl_->routing.counts.end(), 0);
}

std::vector<std::vector<uint64_t>> Session::expert_counts() const {
  const models::RoutingCounts& r = impl_->routing;
  std::vector<std::vector<uint64_t>> out;
  if (r.n_expert == 0) return out;
  for (size_t at = 0; at < r.counts.size(); at += size_t(r.n_expert)) {
    out.emplace_back(r.counts.begin() + ptrdiff_t(at), r.counts.begin() + ptrdiff_t(at + size_t(r.n_expert)));
  }
  return out;
}

std::vector<std::pair<std::string, double>> Session::op_profile() const {
  std::vector<std::pair<std::string, double>> out;
  for (int op = 0; op < int(models::Op::kCount); ++op) {
    out.emplace_back(models::op_name(models::Op(op)), impl_->profile.seconds[op]);
  }
  return out;
}

}  // namespace magnetar
