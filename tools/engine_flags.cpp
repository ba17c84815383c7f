#include "tools/engine_flags.h"

#include <algorithm>
#include <cstdio>

namespace magnetar::tools {

void ModelFlags::add_to(cli::Args& args) {
  args.option("-m", &model, "MODEL.gguf", "the model (first shard of a split set)");
  args.option("--ctx", &ctx, "N",
              ctx_default_max > kDefaultContext
                  ? format("context length in tokens (0: the model's, at most %lld, halved down to %lld while the KV "
                           "of the sessions planned for would take more than a quarter of the host's or the GPU's "
                           "memory)",
                           (long long)ctx_default_max, (long long)kDefaultContext)
                  : format("context length in tokens (0: the model's, at most %lld)", (long long)ctx_default_max));
  args.option("-t", &threads, "N", "threads (0: all cores)");
  args.option("--batch", &batch, "N",
              "prompt tokens per forward pass (bounds scratch memory; 0: 2048 when the whole model runs on the GPU "
              "with room for it, else 512)");
  args.option("--sweep", &sweep, "N",
              "experts streamed or tiered: prompt tokens per prefill sweep, computed layer by layer in --batch chunks "
              "so that each layer's experts are read (and copied to the GPU) once per sweep, not once per chunk (-1: "
              "as many as fit 256 MiB, at most --ctx; 0: off)");
  args.option("--kv-type", &kv_type, "f16|f32|q8_0|fp8",
              "KV cache precision (q8_0: 8.5 bits per element, about half of f16's memory; fp8: E4M3, 8 bits per "
              "element, the fastest at long contexts on the GPU, coarser than q8_0; f32: CPU only)");
  args.option("--device", &device, "auto|cpu|cuda",
              "where the model runs (auto: the GPU when there is one and the model fits it, whole or with its experts "
              "tiered)");
  args.option("--gpu-cache-gb", &gpu_cache_gb, "N",
              "CUDA: GPU expert pool in GiB; routed experts stay in host memory and the most used are cached on "
              "the GPU (0: every weight on the GPU when it fits, else the largest pool that does)");
  args.option("--gpu-cache-policy", &gpu_cache_policy, "lfu|lru",
              "CUDA, experts tiered: GPU pool eviction, frequency with decay or least recently used");
  args.flag("--cpu-experts", &cpu_experts,
            "CUDA, experts tiered: compute cold experts that miss the GPU pool on the CPU, in parallel with the GPU, "
            "instead of copying them up: as many as the CPU finishes within the time the bus needs for the other "
            "misses (both measured as it runs)");
  args.flag("--resident", &resident, "keep every routed expert in memory (mapped); refused when it does not fit");
  args.flag("--mmap", &mmap, "map every weight and let the page cache decide, unchecked (llama.cpp's way; thrashes when the model exceeds RAM)");
  args.flag("--stream", &stream, "stream routed experts from disk through the RAM expert cache");
  args.option("--cache-gb", &cache_gb, "N", "RAM expert cache in GiB (implies --stream; 0: what the memory plan allows)");
  args.option("--cache-policy", &cache_policy, "lfu|lru", "expert cache eviction: frequency with decay, or least recently used");
  args.flag("--prefetch", &prefetch, "streamed: read the next layer's predicted experts while this layer computes");
  args.flag("--no-census", &no_census, "streamed: neither read nor write MODEL.gguf.census (no warm start)");
  args.flag("--no-io-uring", &no_io_uring, "streamed: read with a pread thread pool instead of io_uring");
  args.flag("--no-direct", &no_direct, "streamed: buffered reads instead of O_DIRECT");
  args.option("--queue-depth", &queue_depth, "N", "streamed: io_uring queue depth");
  args.option("--read-gap-kib", &read_gap_kib, "N",
              "streamed, diagnostic: merge a layer's expert reads across gaps up to N KiB (-1: measured at load; 0: adjacent only)");
  args.flag("--show-plan", &show_plan, "print the memory plan even when every expert is resident");
  args.option("--kv-disk-dir", &kv_disk_dir, "DIR",
              "save KV as blocks under DIR and restore a prompt's saved prefix instead of computing it (also across restarts)");
  args.option("--kv-disk-gb", &kv_disk_gb, "N", "disk KV budget in GiB (0: min(16, half the free space of DIR))");
  args.option("--kv-block", &kv_block, "N", "disk KV: tokens per saved block");
}

std::unique_ptr<Engine> ModelFlags::load(const char* command) const {
  if (model.empty()) {
    std::fprintf(stderr, "magnetar %s: -m MODEL.gguf is required (see --help)\n", command);
    return nullptr;
  }
  if (kv_type != "f16" && kv_type != "f32" && kv_type != "q8_0" && kv_type != "fp8") {
    std::fprintf(stderr, "magnetar %s: --kv-type must be f16, f32, q8_0 or fp8, got '%s'\n", command, kv_type.c_str());
    return nullptr;
  }
  if (device != "auto" && device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "magnetar %s: --device must be auto, cpu or cuda, got '%s'\n", command, device.c_str());
    return nullptr;
  }
  if (ctx < 0 || threads < 0 || batch < 0) {
    std::fprintf(stderr, "magnetar %s: --ctx, -t and --batch must be >= 0\n", command);
    return nullptr;
  }
  if (threads > 1024) {  // the engine's limit, said here before the count is narrowed to an int
    std::fprintf(stderr, "magnetar %s: -t %lld: at most 1024 threads\n", command, (long long)threads);
    return nullptr;
  }
  if (read_gap_kib < -1) {
    std::fprintf(stderr, "magnetar %s: --read-gap-kib must be -1 (measured), 0 or a size in KiB\n", command);
    return nullptr;
  }
  if (sweep < -1) {
    std::fprintf(stderr, "magnetar %s: --sweep must be -1 (auto), 0 (off) or a token count\n", command);
    return nullptr;
  }
  if (int(resident) + int(mmap) + int(stream || cache_gb > 0) > 1) {
    std::fprintf(stderr, "magnetar %s: --resident, --mmap and --stream / --cache-gb exclude each other\n", command);
    return nullptr;
  }
  if (kv_disk_gb < 0 || kv_block < 1) {
    std::fprintf(stderr, "magnetar %s: --kv-disk-gb must be >= 0 and --kv-block >= 1\n", command);
    return nullptr;
  }
  if (gpu_cache_gb < 0) {
    std::fprintf(stderr, "magnetar %s: --gpu-cache-gb must be >= 0\n", command);
    return nullptr;
  }
  if (std::max({cache_gb, gpu_cache_gb, kv_disk_gb}) > 1e6f) {  // GiB to bytes must fit 64 bits
    std::fprintf(stderr, "magnetar %s: --cache-gb, --gpu-cache-gb and --kv-disk-gb must be at most 1,000,000\n",
                 command);
    return nullptr;
  }
  if (cache_gb < 0 || queue_depth < 1 || queue_depth > 4096) {
    std::fprintf(stderr, "magnetar %s: --cache-gb must be >= 0 and --queue-depth in 1..4096\n", command);
    return nullptr;
  }
  EngineOptions options{.n_threads = int(threads),
                        .n_ctx = ctx,
                        .n_ctx_default_max = ctx_default_max,
                        .n_sessions = sessions,
                        .n_batch = batch,
                        .n_sweep = sweep,
                        .kv_type = kv_type == "f32"    ? KvType::kF32
                                   : kv_type == "q8_0" ? KvType::kQ8_0
                                   : kv_type == "fp8"  ? KvType::kF8
                                                       : KvType::kF16,
                        .device = device == "cpu"    ? Device::kCpu
                                  : device == "cuda" ? Device::kCuda
                                                     : Device::kAuto,
                        .gpu_cache_gb = gpu_cache_gb,
                        .cpu_experts = cpu_experts,
                        .gpu_cache_policy = gpu_cache_policy,
                        .profile = profile,
                        .experts = resident                   ? ExpertMode::kResident
                                   : mmap                     ? ExpertMode::kMmap
                                   : (stream || cache_gb > 0) ? ExpertMode::kStream
                                                              : ExpertMode::kAuto,
                        .stream = {.cache_gb = cache_gb,
                                   .policy = cache_policy,
                                   .prefetch = prefetch,
                                   .census = !no_census,
                                   .io_uring = !no_io_uring,
                                   .direct_io = !no_direct,
                                   .queue_depth = int(queue_depth),
                                   .read_gap_kib = read_gap_kib},
                        .kv_disk = {.dir = kv_disk_dir, .gb = kv_disk_gb, .block_tokens = kv_block}};
  Result<std::unique_ptr<Engine>> engine = Engine::load(model, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "magnetar %s: %s\n", command, engine.status().message().c_str());
    return nullptr;
  }
  const int64_t chunk = engine.value()->options().n_batch;
  if (batch > chunk) {
    std::fprintf(stderr,
                 "magnetar %s: warning: --batch %lld: chunks of %lld tokens (the most the context, or the GPU's "
                 "kernels, take)\n",
                 command, (long long)batch, (long long)chunk);
  }
  if (sweep > 0 && sweep < 2 * chunk) {
    std::fprintf(stderr,
                 "magnetar %s: warning: --sweep %lld holds fewer than two --batch chunks of %lld tokens: prefill "
                 "sweeps are off\n",
                 command, (long long)sweep, (long long)chunk);
  }
  if (const int64_t train = engine.value()->info().n_ctx_train; train > 0 && engine.value()->options().n_ctx > train) {
    std::fprintf(stderr, "magnetar %s: warning: --ctx %lld is beyond the model's training context of %lld tokens\n",
                 command, (long long)engine.value()->options().n_ctx, (long long)train);
  }
  // The plan is news when experts stream, KV goes to disk, a GPU present could not be used, the default context was
  // cut to fit or --cpu-experts was asked for (the plan says what became of it; a resident plan, on the CPU or the GPU,
  // is the ordinary case); --show-plan prints it always.
  if (!engine.value()->memory_plan().empty() &&
      (show_plan || cpu_experts || engine.value()->expert_stats().streamed || engine.value()->expert_stats().gpu_tier ||
       engine.value()->kv_disk_stats().enabled || !engine.value()->gpu_unused().empty() ||
       !engine.value()->context_note().empty())) {
    std::fprintf(stderr, "%s\n", engine.value()->memory_plan().c_str());
  }
  return std::move(engine).value();
}

namespace {
double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }
}  // namespace

std::string expert_summary(const ExpertStats& s, double seconds, int64_t tokens) {
  std::string gpu;
  if (s.gpu_tier) {
    gpu = format("GPU pool: hit %.1f%% of %llu | copied up %.2f MiB/token, %.2f GB/s while copying, %.0f%% of the time",
                 100 * ratio(double(s.gpu_hits), double(s.gpu_lookups())), (unsigned long long)s.gpu_lookups(),
                 ratio(double(s.gpu_bytes_h2d), double(tokens)) / double(1 << 20),
                 ratio(double(s.gpu_bytes_h2d), s.gpu_miss_seconds) / 1e9, 100 * ratio(s.gpu_miss_seconds, seconds));
    if (s.gpu_cpu_experts > 0) {
      gpu += format(" | CPU lane: %.1f%% of lookups, %llu rows, busy %.0f%% of the time",
                    100 * ratio(double(s.gpu_cpu_experts), double(s.gpu_lookups())),
                    (unsigned long long)s.gpu_cpu_rows, 100 * ratio(s.gpu_cpu_seconds, seconds));
    }
  }
  if (!s.streamed) return gpu;
  const uint64_t acquired = s.hits + s.inflight_hits + s.misses;
  std::string line = (gpu.empty() ? "" : gpu + "\n") + format(
      "experts: hit %.1f%% of %llu | read %.2f MiB/token, %.0f MB/s over %.2f s, waited %.0f%%",
      100 * ratio(double(s.hits), double(acquired)), (unsigned long long)acquired,
      ratio(double(s.bytes_read), double(tokens)) / double(1 << 20), ratio(double(s.bytes_read), seconds) / 1e6, seconds,
      100 * ratio(s.wait_seconds, seconds));
  if (s.sweeps > 0) line += format(" | %llu prefill sweeps", (unsigned long long)s.sweeps);
  if (s.acquired_with_hint > 0) {
    line += format(" | prefetch: +%.1f%% hits in flight, %llu issued, %llu used, %llu wasted, next-layer recall %.1f%%",
                   100 * ratio(double(s.inflight_hits), double(acquired)), (unsigned long long)s.prefetch_issued,
                   (unsigned long long)s.prefetch_used, (unsigned long long)s.prefetch_wasted,
                   100 * ratio(double(s.predicted), double(s.acquired_with_hint)));
  }
  return line;
}

nlohmann::json expert_summary_json(const ExpertStats& s, double seconds, int64_t tokens) {
  const uint64_t acquired = s.hits + s.inflight_hits + s.misses;
  return {{"hits", s.hits}, {"inflight_hits", s.inflight_hits}, {"misses", s.misses}, {"evictions", s.evictions},
          {"hit_rate", ratio(double(s.hits), double(acquired))}, {"bytes_read", s.bytes_read}, {"reads", s.reads},
          {"bytes_per_token", ratio(double(s.bytes_read), double(tokens))},
          {"disk_mb_s", ratio(double(s.bytes_read), seconds) / 1e6}, {"wait_fraction", ratio(s.wait_seconds, seconds)},
          {"prefetch_issued", s.prefetch_issued}, {"prefetch_used", s.prefetch_used},
          {"prefetch_wasted", s.prefetch_wasted},
          {"prediction_recall", ratio(double(s.predicted), double(s.acquired_with_hint))},
          {"gpu_hits", s.gpu_hits}, {"gpu_misses", s.gpu_misses}, {"gpu_evictions", s.gpu_evictions},
          {"gpu_bytes_h2d", s.gpu_bytes_h2d}, {"gpu_miss_seconds", s.gpu_miss_seconds},
          {"gpu_cpu_experts", s.gpu_cpu_experts}, {"gpu_cpu_rows", s.gpu_cpu_rows},
          {"gpu_cpu_seconds", s.gpu_cpu_seconds}, {"sweeps", s.sweeps}};
}

void SamplingFlags::add_to(cli::Args& args) {
  args.option("--temp", &params.temperature, "T", "temperature (0: greedy)");
  args.option("--top-k", &top_k, "K", "keep the K most likely tokens (0: off)");
  args.option("--top-p", &params.top_p, "P", "keep the smallest set with probability mass P (1: off)");
  args.option("--min-p", &params.min_p, "P", "drop tokens below P times the best one's probability (0: off)");
  args.option("--repeat-penalty", &params.repeat_penalty, "R", "penalty for tokens in the last --penalty-last-n (1: off)");
  args.option("--presence-penalty", &params.presence_penalty, "P", "subtracted from logits of recent tokens (0: off)");
  args.option("--frequency-penalty", &params.frequency_penalty, "P",
              "subtracted from logits of recent tokens once per occurrence (0: off)");
  args.option("--penalty-last-n", &last_n, "N", "tokens the penalties look back over (-1: all)");
  args.option("--seed", &seed, "S", "random seed (negative: a random one, the default)");
  args.option("--lookup", &lookup, "N",
              "speculative decoding by prompt lookup: guess up to N tokens a step from earlier repeats of the "
              "context and check them in one forward pass; the text is the same, faster where the output repeats "
              "its context (0: off)");
}

std::string SamplingFlags::error() const {
  const SamplingParams& p = params;
  if (p.temperature < 0) return "--temp must be >= 0";
  if (top_k < 0 || top_k > INT32_MAX) return "--top-k must be in [0, 2147483647]";
  if (!(p.top_p >= 0 && p.top_p <= 1)) return "--top-p must be in [0, 1]";
  if (!(p.min_p >= 0 && p.min_p <= 1)) return "--min-p must be in [0, 1]";
  if (!(p.repeat_penalty > 0)) return "--repeat-penalty must be > 0 (1: off)";
  if (last_n < -1 || last_n > INT32_MAX) return "--penalty-last-n must be -1 (all) or in [0, 2147483647]";
  if (lookup < 0 || lookup > kMaxLookupDrafts) return format("--lookup must be in [0, %d]", kMaxLookupDrafts);
  return "";
}

SamplingParams SamplingFlags::resolved() const {
  SamplingParams p = params;
  p.top_k = int32_t(top_k);
  p.penalty_last_n = int32_t(last_n);
  p.seed = seed;
  return p;
}

}  // namespace magnetar::tools
