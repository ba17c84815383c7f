// `magnetar synth`: writes a synthetic Qwen3-MoE GGUF of real geometry with random, well-conditioned,
// zero-mean weights, so that loading, caching and streaming can be exercised on models nobody can download
// here. Tensor names, shapes and metadata keys are llama.cpp's for `qwen3moe`.
//
// Weights are Gaussian with standard deviation 1/sqrt(fan_in) (token embeddings: 1); quantized types are
// assembled from pools of reference-quantized blocks (see make_rows), so a 16 GiB model takes about as long
// as writing it. Norms are 1, routers stay F32 and the LM head is Q8_0 for quantized types, as llama.cpp's
// quantizer leaves them (q4_k_m: Q6_K and the Q4_K_M mix, qwen3moe_tensors).
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "gguf/writer.h"
#include "quant/quant.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tokenizer/hf_import.h"
#include "tools/progress.h"

namespace magnetar::tools {
namespace {

struct Geometry {
  std::string_view preset;
  int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_expert, n_expert_used, n_ff_exp, n_vocab, n_ctx;
  double rope_theta;
};

// Published configs of the Qwen3-MoE family (config.json of each model) and a tiny one for tests and demos.
constexpr Geometry kPresets[] = {
    {"tiny", 2, 256, 4, 2, 64, 8, 2, 256, 1024, 4096, 1e6},
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 128, 8, 768, 151936, 40960, 1e6},
    {"qwen3-235b-a22b", 94, 4096, 64, 4, 128, 128, 8, 1536, 151936, 40960, 1e6},
};

enum class Init { kOne, kGaussian };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;  // ggml order
  quant::Type type;
  Init init;
  double sigma;
  std::vector<double> row_scale = {};  // per-row multiplier of sigma (routers with --skew); empty: 1
};

// --skew ALPHA: router row e of each layer gets standard deviation sigma * (1 + rank(e))^-ALPHA, ranks a
// seeded permutation per layer, scaled to unit mean square. A router row with a larger spread wins top-k more
// often, so expert popularity falls off with rank (Zipf-like, steeper with ALPHA); `synth --check` measures it.
std::vector<double> skewed_scales(int64_t n_expert, double alpha, uint64_t seed) {
  std::vector<int64_t> rank(static_cast<size_t>(n_expert));
  std::iota(rank.begin(), rank.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(rank.begin(), rank.end(), rng);
  std::vector<double> scale(static_cast<size_t>(n_expert));
  double mean_square = 0;
  for (int64_t e = 0; e < n_expert; ++e) {
    scale[size_t(e)] = std::pow(double(1 + rank[size_t(e)]), -alpha);
    mean_square += scale[size_t(e)] * scale[size_t(e)] / double(n_expert);
  }
  for (double& v : scale) v /= std::sqrt(mean_square);
  return scale;
}

// --type q4_k_m: the mix llama.cpp's llama-quantize makes for Q4_K_M (llama_tensor_get_type), the file most users
// download: Q4_K, with Q6_K for the output matrix and for attn_v and ffn_down(_exps) in the layers where
// use_more_bits holds (the first and last eighth of the layers and every third between: 24 of 48); routers and norms
// F32. (The 8-expert models' attn_k/attn_v rules do not apply to these presets' 128 experts.)
constexpr std::string_view kQ4KM = "q4_k_m";
constexpr int32_t kQ4KMFileType = 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
bool more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

std::vector<TensorSpec> qwen3moe_tensors(const Geometry& g, quant::Type type, bool q4_k_m, double skew, uint64_t seed) {
  const quant::Type f32 = quant::Type::F32;
  const bool quantized = quant::traits(type).is_quantized;
  const quant::Type head_type = q4_k_m ? quant::Type::Q6_K : quantized ? quant::Type::Q8_0 : type;
  const double embd_sigma = 1.0 / std::sqrt(double(g.n_embd));
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {g.n_embd, g.n_vocab}, type, Init::kGaussian, 1.0});
  for (int64_t l = 0; l < g.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const quant::Type more = q4_k_m && more_bits(l, g.n_layer) ? quant::Type::Q6_K : type;
    const int64_t q_dim = g.n_head * g.head_dim, kv_dim = g.n_head_kv * g.head_dim;
    t.push_back({p + "attn_norm.weight", {g.n_embd}, f32, Init::kOne, 0});
    t.push_back({p + "attn_q.weight", {g.n_embd, q_dim}, type, Init::kGaussian, embd_sigma});
    t.push_back({p + "attn_k.weight", {g.n_embd, kv_dim}, type, Init::kGaussian, embd_sigma});
    t.push_back({p + "attn_v.weight", {g.n_embd, kv_dim}, more, Init::kGaussian, embd_sigma});
    t.push_back({p + "attn_q_norm.weight", {g.head_dim}, f32, Init::kOne, 0});
    t.push_back({p + "attn_k_norm.weight", {g.head_dim}, f32, Init::kOne, 0});
    t.push_back({p + "attn_output.weight", {q_dim, g.n_embd}, type, Init::kGaussian, 1.0 / std::sqrt(double(q_dim))});
    t.push_back({p + "ffn_norm.weight", {g.n_embd}, f32, Init::kOne, 0});
    t.push_back({p + "ffn_gate_inp.weight", {g.n_embd, g.n_expert}, f32, Init::kGaussian, embd_sigma,
                 skew > 0 ? skewed_scales(g.n_expert, skew, seed * 1000003 + uint64_t(l)) : std::vector<double>{}});
    t.push_back({p + "ffn_gate_exps.weight", {g.n_embd, g.n_ff_exp, g.n_expert}, type, Init::kGaussian, embd_sigma});
    t.push_back({p + "ffn_up_exps.weight", {g.n_embd, g.n_ff_exp, g.n_expert}, type, Init::kGaussian, embd_sigma});
    t.push_back({p + "ffn_down_exps.weight",
                 {g.n_ff_exp, g.n_embd, g.n_expert},
                 more,
                 Init::kGaussian,
                 1.0 / std::sqrt(double(g.n_ff_exp))});
  }
  t.push_back({"output_norm.weight", {g.n_embd}, f32, Init::kOne, 0});
  t.push_back({"output.weight", {g.n_embd, g.n_vocab}, head_type, Init::kGaussian, embd_sigma});
  return t;
}

// splitmix64: a tiny, fast, well-mixed generator for picking pool blocks.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Quantized types are not quantized weight by weight (the reference quantizers run at tens of MB/s, a 16 GiB
// model would take hours): each (type, sigma) gets a pool of kPoolBlocks blocks quantized from N(0, sigma)
// once, and every block of every row is a random pick from the pool. Blocks stay zero-mean, rows are distinct
// (8 picks of 4096 per 2048-wide Q4_K row), and writing runs at memcpy speed.
constexpr int64_t kPoolBlocks = 4096;

struct BlockPool {
  quant::Type type;
  double sigma;
  std::vector<uint8_t> blocks;  // [kPoolBlocks, type_size]
};

const BlockPool& pool_for(std::deque<BlockPool>& pools, quant::Type type, double sigma, uint64_t seed) {
  for (const BlockPool& p : pools) {
    if (p.type == type && p.sigma == sigma) return p;
  }
  const quant::TypeTraits& tr = quant::traits(type);
  BlockPool p{.type = type, .sigma = sigma, .blocks = std::vector<uint8_t>(size_t(kPoolBlocks) * tr.type_size)};
  std::vector<float> values(static_cast<size_t>(kPoolBlocks * tr.block_size));
  std::mt19937_64 rng(seed ^ (uint64_t(type) << 48) ^ uint64_t(sigma * 1e9));
  std::normal_distribution<float> dist(0.0f, float(sigma));
  for (float& v : values) v = dist(rng);
  tr.from_float(values.data(), p.blocks.data(), int64_t(values.size()));
  pools.push_back(std::move(p));
  return pools.back();
}

// Fills rows [row_begin, row_end) of a tensor into `out` (which holds exactly those rows). Each row draws from
// its own stream seeded by (seed, tensor index, row), so the output does not depend on the thread count.
void make_rows(const TensorSpec& spec, const BlockPool* pool, uint64_t seed, uint64_t tensor_index,
               int64_t row_begin, int64_t row_end, uint8_t* out) {
  const quant::TypeTraits& tr = quant::traits(spec.type);
  const int64_t n = spec.dims[0];
  const size_t row_bytes = quant::row_size(spec.type, n);
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t r = row_begin; r < row_end; ++r) {
    uint8_t* dst = out + size_t(r - row_begin) * row_bytes;
    const uint64_t stream = mix(seed * 0x9E3779B97F4A7C15ull ^ (tensor_index << 40) ^ uint64_t(r));
    if (pool) {
      uint64_t state = stream;
      for (int64_t b = 0; b < n / tr.block_size; ++b) {
        state = mix(state);
        std::memcpy(dst + size_t(b) * tr.type_size, pool->blocks.data() + (state % kPoolBlocks) * tr.type_size,
                    tr.type_size);
      }
      continue;
    }
    if (spec.init == Init::kOne) {
      std::fill(row.begin(), row.end(), 1.0f);
    } else {
      std::mt19937_64 rng(stream);
      const double sigma = spec.row_scale.empty() ? spec.sigma : spec.sigma * spec.row_scale[size_t(r)];
      std::normal_distribution<float> dist(0.0f, float(sigma));
      for (float& v : row) v = dist(rng);
    }
    tr.from_float(row.data(), dst, n);
  }
}

// `synth --check MODEL`: runs N random tokens through the model and reports its routing diversity, so a
// synthetic model's expert popularity can be compared with a trained one's.
int check_routing(const std::string& path, int64_t n_tokens, int64_t threads, uint64_t seed) {
  // Mapped like llama.cpp: the check reads the routers and touches whatever experts the tokens pick, whatever
  // the model's size.
  EngineOptions options{.n_threads = int(threads), .n_ctx = n_tokens, .n_batch = std::min<int64_t>(n_tokens, 256),
                        .count_routing = true, .experts = ExpertMode::kMmap, .stream = {}, .kv_disk = {}};
  Result<std::unique_ptr<Engine>> engine = Engine::load(path, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "magnetar synth --check: %s\n", engine.status().message().c_str());
    return kExitBadInput;
  }
  const ModelInfo& info = (*engine)->info();
  if (info.n_expert == 0) {
    std::fprintf(stderr, "magnetar synth --check: %s has no routed experts\n", path.c_str());
    return kExitBadInput;
  }
  Result<std::unique_ptr<Session>> session = (*engine)->new_session();
  if (!session.ok()) return kExitFailure;
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n_tokens));
  for (int32_t& t : ids) t = int32_t(rng() % uint64_t(info.n_vocab));
  if (Status st = (*session)->sync(ids); !st.ok()) {
    std::fprintf(stderr, "magnetar synth --check: %s\n", st.message().c_str());
    return kExitFailure;
  }
  const std::vector<std::vector<uint64_t>> counts = (*session)->expert_counts();
  // Per layer: distinct experts touched and the share of selections taken by the most popular 10% / 25% /
  // 50% of experts (uniform routing gives about 10% / 25% / 50%).
  const double fractions[3] = {0.10, 0.25, 0.50};
  double share_sum[3] = {}, distinct_sum = 0;
  int layers = 0;
  std::printf("routing of %s over %lld random tokens (%lld of %lld experts per token)\n", path.c_str(),
              (long long)n_tokens, (long long)info.n_expert_used, (long long)info.n_expert);
  std::printf("%6s %10s %10s %10s %10s\n", "layer", "distinct", "top10%", "top25%", "top50%");
  for (size_t l = 0; l < counts.size(); ++l) {
    std::vector<uint64_t> c = counts[l];
    const uint64_t total = std::accumulate(c.begin(), c.end(), uint64_t(0));
    if (total == 0) continue;  // dense layer
    std::sort(c.rbegin(), c.rend());
    const int64_t distinct = std::count_if(c.begin(), c.end(), [](uint64_t v) { return v > 0; });
    double share[3];
    for (int k = 0; k < 3; ++k) {
      const size_t top = std::max<size_t>(1, size_t(fractions[k] * double(c.size())));
      share[k] = double(std::accumulate(c.begin(), c.begin() + ptrdiff_t(top), uint64_t(0))) / double(total);
      share_sum[k] += share[k];
    }
    distinct_sum += double(distinct);
    ++layers;
    std::printf("%6zu %6lld/%-3lld %9.1f%% %9.1f%% %9.1f%%\n", l, (long long)distinct, (long long)c.size(),
                100 * share[0], 100 * share[1], 100 * share[2]);
  }
  if (layers > 0) {
    std::printf("%6s %10.1f %9.1f%% %9.1f%% %9.1f%%\n", "mean", distinct_sum / layers, 100 * share_sum[0] / layers,
                100 * share_sum[1] / layers, 100 * share_sum[2] / layers);
  }
  return kExitOk;
}

}  // namespace

int synth_main(int argc, char** argv) {
  std::string preset = "tiny", type_name = "q4_k", out_path, tokenizer_dir;
  float skew = 0.0f;
  std::string check_path;
  constexpr int64_t kCheckTokens = 512;
  int64_t check_tokens = kCheckTokens;
  int64_t layers = 0, seed = 1, threads = int64_t(std::max(1u, std::thread::hardware_concurrency()));
  std::string presets_list;
  for (const Geometry& g : kPresets) {
    if (!presets_list.empty()) presets_list += '|';
    presets_list += g.preset;
  }
  cli::Args args("magnetar synth --preset NAME --type TYPE -o OUT.gguf [options]   |   magnetar synth --check MODEL.gguf",
                 "Writes a synthetic qwen3moe model of real geometry with random zero-mean weights (no tokenizer:\n"
                 "it runs from token ids). For benchmarks and tests of loading, caching and streaming.");
  args.option("--preset", &preset, presets_list, "model geometry");
  args.option("--type", &type_name, "TYPE",
              "weight type: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs mxfp4\n"
              "                           (quantized types: Q8_0 output matrix), or q4_k_m: llama.cpp's Q4_K_M mix\n"
              "                           (Q4_K; Q6_K output, and attn_v and ffn_down_exps in half the layers)");
  args.option("-o", &out_path, "OUT.gguf", "output file (written atomically)");
  args.option("--layers", &layers, "N", "keep only the first N layers (0: all)");
  args.option("--seed", &seed, "S", "random seed");
  args.option("--check", &check_path, "MODEL.gguf",
              "instead of writing: report MODEL's routing diversity over --check-tokens random tokens");
  args.option("--check-tokens", &check_tokens, "N", "tokens --check runs through the model");
  args.option("--skew", &skew, "ALPHA",
              "make expert popularity fall off with rank (router row spread ~ rank^-ALPHA; 0: uniform; try 1)");
  args.option("-t", &threads, "N", "threads");
  args.option("--tokenizer", &tokenizer_dir, "HF_DIR",
              "embed the tokenizer of a Hugging Face folder (tokenizer.json, tokenizer_config.json); the vocabulary\n"
              "                           size becomes max(preset, tokenizer)");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "synth")) return *code;
  threads = std::min<int64_t>(threads, 1024);  // as convert and quantize
  if (!check_path.empty()) {
    if (preset != "tiny" || type_name != "q4_k" || !out_path.empty() || layers != 0 || skew != 0.0f ||
        !tokenizer_dir.empty()) {
      std::fprintf(stderr,
                   "magnetar synth: --check reads MODEL.gguf: --preset, --type, -o, --layers, --skew and "
                   "--tokenizer do not apply\n");
      return kExitBadInput;
    }
    if (check_tokens < 1) {
      std::fprintf(stderr, "magnetar synth: --check-tokens must be >= 1\n");
      return kExitBadInput;
    }
    return check_routing(check_path, check_tokens, threads, uint64_t(seed));
  }
  const Geometry* found = nullptr;
  for (const Geometry& g : kPresets) {
    if (g.preset == preset) found = &g;
  }
  const bool q4_k_m = type_name == kQ4KM;
  const std::optional<quant::Type> type = q4_k_m ? quant::Type::Q4_K : quant::type_from_name(type_name);
  std::string error;
  if (!found) error = format("--preset '%s' is unknown (known: %s)", preset.c_str(), presets_list.c_str());
  else if (!type || !quant::is_weight_type(*type))
    error = format("--type '%s' is not a weight type (see --help)", type_name.c_str());
  else if (out_path.empty()) error = "-o OUT.gguf is required";
  else if (check_tokens != kCheckTokens)
    error = "--check-tokens applies to --check MODEL.gguf";
  else if (layers < 0 || threads < 1) error = "--layers must be >= 0 and -t >= 1";
  if (!error.empty()) {
    std::fprintf(stderr, "magnetar synth: %s\n", error.c_str());
    return kExitBadInput;
  }
  Geometry g = *found;
  if (layers > 0) g.n_layer = std::min(g.n_layer, layers);
  std::vector<gguf::KeyValue> tokenizer_kv;
  if (!tokenizer_dir.empty()) {
    // The tokenizer's own size first (no padding), then padded to the preset's vocabulary when that is larger.
    int64_t pad_to = 0;
    for (int pass = 0; pass < 2; ++pass) {
      Result<std::vector<gguf::KeyValue>> kv = tokenizer::gguf_metadata_from_hf(tokenizer_dir, pad_to);
      if (!kv.ok()) {
        std::fprintf(stderr, "magnetar synth: %s\n", kv.status().message().c_str());
        return kExitBadInput;
      }
      tokenizer_kv = std::move(kv).value();
      int64_t tokens = 0;
      for (const gguf::KeyValue& kv_pair : tokenizer_kv) {
        if (kv_pair.key == "tokenizer.ggml.tokens") tokens = int64_t(kv_pair.value.array.size());
      }
      if (tokens >= g.n_vocab) break;
      pad_to = g.n_vocab;
    }
    for (const gguf::KeyValue& kv_pair : tokenizer_kv) {
      if (kv_pair.key == "tokenizer.ggml.tokens") g.n_vocab = int64_t(kv_pair.value.array.size());
    }
  }
  const std::vector<TensorSpec> specs = qwen3moe_tensors(g, *type, q4_k_m, skew, uint64_t(seed));
  for (const TensorSpec& s : specs) {
    if (s.dims[0] % quant::traits(s.type).block_size != 0) {
      std::fprintf(stderr, "magnetar synth: tensor '%s' has rows of %lld, not a multiple of the %s block size\n",
                   s.name.c_str(), (long long)s.dims[0], std::string(quant::traits(s.type).name).c_str());
      return kExitBadInput;
    }
  }

  gguf::Writer w(out_path);
  using gguf::Value;
  using gguf::ValueType;
  auto u32 = [](int64_t v) { return Value::of_uint(ValueType::kUint32, uint64_t(v)); };
  const std::string arch = "qwen3moe";
  w.set("general.architecture", Value::of_string(arch));
  w.set("general.name", Value::of_string(format("synthetic %s %s", std::string(g.preset).c_str(), type_name.c_str())));
  w.set("general.file_type", u32(q4_k_m ? kQ4KMFileType : quant::traits(*type).file_type));
  w.set("general.quantization_version", u32(2));
  w.set(arch + ".block_count", u32(g.n_layer));
  w.set(arch + ".context_length", u32(g.n_ctx));
  w.set(arch + ".embedding_length", u32(g.n_embd));
  w.set(arch + ".attention.head_count", u32(g.n_head));
  w.set(arch + ".attention.head_count_kv", u32(g.n_head_kv));
  w.set(arch + ".attention.key_length", u32(g.head_dim));
  w.set(arch + ".attention.value_length", u32(g.head_dim));
  w.set(arch + ".attention.layer_norm_rms_epsilon", Value::of_float(ValueType::kFloat32, 1e-6));
  w.set(arch + ".rope.freq_base", Value::of_float(ValueType::kFloat32, g.rope_theta));
  w.set(arch + ".expert_count", u32(g.n_expert));
  w.set(arch + ".expert_used_count", u32(g.n_expert_used));
  w.set(arch + ".expert_feed_forward_length", u32(g.n_ff_exp));
  for (gguf::KeyValue& kv_pair : tokenizer_kv) w.set(kv_pair.key, std::move(kv_pair.value));
  uint64_t total_bytes = 0;
  for (const TensorSpec& s : specs) {
    if (Status st = w.add_tensor(s.name, uint32_t(s.type), s.dims); !st.ok()) {
      std::fprintf(stderr, "magnetar synth: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  for (const gguf::TensorInfo& t : w.tensors()) total_bytes += t.nbytes;
  if (Status st = w.begin(); !st.ok()) {
    std::fprintf(stderr, "magnetar synth: %s\n", st.message().c_str());
    return kExitFailure;
  }

  Progress progress("synth " + out_path, total_bytes);
  uint64_t done = 0;
  constexpr size_t kChunkBytes = 64ull << 20;  // rows generated per round, split across threads
  std::vector<uint8_t> buffer;
  std::deque<BlockPool> pools;  // deque: references stay valid as pools are added
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const TensorSpec& s = specs[ti];
    const bool pooled = s.init == Init::kGaussian && quant::traits(s.type).is_quantized;
    const BlockPool* pool = pooled ? &pool_for(pools, s.type, s.sigma, uint64_t(seed)) : nullptr;
    const int64_t n_rows = w.tensors()[ti].n_elements() / s.dims[0];
    const size_t row_bytes = quant::row_size(s.type, s.dims[0]);
    const int64_t rows_per_chunk = std::max<int64_t>(1, int64_t(kChunkBytes / row_bytes));
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t r1 = std::min(n_rows, r0 + rows_per_chunk);
      buffer.resize(size_t(r1 - r0) * row_bytes);
      const int64_t n_threads = std::min<int64_t>(threads, r1 - r0);
      std::vector<std::thread> workers;
      for (int64_t k = 0; k < n_threads; ++k) {
        const int64_t a = r0 + (r1 - r0) * k / n_threads, b = r0 + (r1 - r0) * (k + 1) / n_threads;
        workers.emplace_back(make_rows, std::cref(s), pool, uint64_t(seed), uint64_t(ti), a, b,
                             buffer.data() + size_t(a - r0) * row_bytes);
      }
      for (std::thread& th : workers) th.join();
      if (Status st = w.write(buffer); !st.ok()) {
        std::fprintf(stderr, "magnetar synth: %s\n", st.message().c_str());
        return kExitFailure;
      }
      done += buffer.size();
      progress.update(done);
    }
  }
  if (Status st = w.finish(); !st.ok()) {
    std::fprintf(stderr, "magnetar synth: %s\n", st.message().c_str());
    return kExitFailure;
  }
  progress.finish(format("%.2f GiB written", double(total_bytes) / double(1ull << 30)));
  std::fprintf(stderr, "magnetar synth: wrote %s (%s, %lld layers, %s)\n", out_path.c_str(), std::string(g.preset).c_str(),
               (long long)g.n_layer, type_name.c_str());
  return kExitOk;
}

}  // namespace magnetar::tools
