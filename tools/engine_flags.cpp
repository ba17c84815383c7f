#include "tools/engine_flags.h"

#include <cstdio>

namespace magnetar::tools {

void ModelFlags::add_to(cli::Args& args) {
  args.option("-m", &model, "MODEL.gguf", "the model (first shard of a split set)");
  args.option("--ctx", &ctx, "N", "context length in tokens (0: the model's, at most 4096)");
  args.option("-t", &threads, "N", "threads (0: all cores)");
  args.option("--batch", &batch, "N", "prompt tokens per forward pass (bounds scratch memory)");
  args.option("--kv-type", &kv_type, "f16|f32", "KV cache precision");
}

std::unique_ptr<Engine> ModelFlags::load(const char* command) const {
  if (model.empty()) {
    std::fprintf(stderr, "magnetar %s: -m MODEL.gguf is required (see --help)\n", command);
    return nullptr;
  }
  if (kv_type != "f16" && kv_type != "f32") {
    std::fprintf(stderr, "magnetar %s: --kv-type must be f16 or f32, got '%s'\n", command, kv_type.c_str());
    return nullptr;
  }
  if (ctx < 0 || threads < 0 || batch < 1) {
    std::fprintf(stderr, "magnetar %s: --ctx and -t must be >= 0, --batch >= 1\n", command);
    return nullptr;
  }
  EngineOptions options{.n_threads = int(threads), .n_ctx = ctx, .n_batch = batch,
                        .kv_type = kv_type == "f32" ? KvType::kF32 : KvType::kF16, .profile = profile};
  Result<std::unique_ptr<Engine>> engine = Engine::load(model, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "magnetar %s: %s\n", command, engine.status().message().c_str());
    return nullptr;
  }
  return std::move(engine).value();
}

void SamplingFlags::add_to(cli::Args& args) {
  args.option("--temp", &params.temperature, "T", "temperature (0: greedy)");
  args.option("--top-k", &top_k, "K", "keep the K most likely tokens (0: off)");
  args.option("--top-p", &params.top_p, "P", "keep the smallest set with probability mass P (1: off)");
  args.option("--min-p", &params.min_p, "P", "drop tokens below P times the best one's probability (0: off)");
  args.option("--repeat-penalty", &params.repeat_penalty, "R", "penalty for tokens in the last --penalty-last-n (1: off)");
  args.option("--presence-penalty", &params.presence_penalty, "P", "subtracted from logits of recent tokens (0: off)");
  args.option("--penalty-last-n", &last_n, "N", "tokens the penalties look back over (-1: all)");
  args.option("--seed", &seed, "S", "random seed (0: random)");
}

SamplingParams SamplingFlags::resolved() const {
  SamplingParams p = params;
  p.top_k = int32_t(top_k);
  p.penalty_last_n = int32_t(last_n);
  p.seed = uint64_t(seed);
  return p;
}

}  // namespace magnetar::tools
