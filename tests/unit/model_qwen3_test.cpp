// The Qwen3-MoE forward pass on synthetic models (made by `magnetar synth`'s generator through the
// writer): prefill of a whole sequence and token-by-token decode through the KV cache must agree, batching
// must not change results, and a quantized model must stay close to its F32 original. Agreement with
// transformers itself is tested in tests/golden.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/threadpool.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "models/model.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::models {
namespace {

using gguf::Value;
using gguf::ValueType;

// A tiny qwen3moe: 2 layers (layer 1 dense), hidden 64, 4 heads / 2 kv heads of 16, 4 experts top-2.
// k_quant_rows: every product's input length a multiple of 256 (hidden 256, heads of 64, FFNs of 256), as
// the K-quants' super-blocks need.
void write_tiny(const std::string& path, quant::Type type, uint64_t seed, bool k_quant_rows = false) {
  const int64_t E = k_quant_rows ? 256 : 64, H = 4, HKV = 2, D = k_quant_rows ? 64 : 16, X = 4,
                FE = k_quant_rows ? 256 : 32, FF = k_quant_rows ? 256 : 96, V = 97;
  gguf::Writer w(path);
  auto u32 = [](int64_t v) { return Value::of_uint(ValueType::kUint32, uint64_t(v)); };
  w.set("general.architecture", Value::of_string("qwen3moe"));
  w.set("qwen3moe.block_count", u32(2));
  w.set("qwen3moe.context_length", u32(256));
  w.set("qwen3moe.embedding_length", u32(E));
  w.set("qwen3moe.feed_forward_length", u32(FF));
  w.set("qwen3moe.attention.head_count", u32(H));
  w.set("qwen3moe.attention.head_count_kv", u32(HKV));
  w.set("qwen3moe.attention.key_length", u32(D));
  w.set("qwen3moe.attention.layer_norm_rms_epsilon", Value::of_float(ValueType::kFloat32, 1e-6));
  w.set("qwen3moe.rope.freq_base", Value::of_float(ValueType::kFloat32, 10000.0));
  w.set("qwen3moe.expert_count", u32(X));
  w.set("qwen3moe.expert_used_count", u32(2));
  w.set("qwen3moe.expert_feed_forward_length", u32(FE));
  struct Spec {
    std::string name;
    std::vector<int64_t> dims;
    bool norm;
  };
  std::vector<Spec> specs = {{"token_embd.weight", {E, V}, false}, {"output_norm.weight", {E}, true},
                             {"output.weight", {E, V}, false}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (auto& s : std::vector<Spec>{{p + "attn_norm.weight", {E}, true}, {p + "attn_q.weight", {E, H * D}, false},
                                     {p + "attn_k.weight", {E, HKV * D}, false}, {p + "attn_v.weight", {E, HKV * D}, false},
                                     {p + "attn_output.weight", {H * D, E}, false}, {p + "attn_q_norm.weight", {D}, true},
                                     {p + "attn_k_norm.weight", {D}, true}, {p + "ffn_norm.weight", {E}, true}}) {
      specs.push_back(s);
    }
    if (l == 0) {
      specs.push_back({p + "ffn_gate_inp.weight", {E, X}, false});
      specs.push_back({p + "ffn_gate_exps.weight", {E, FE, X}, false});
      specs.push_back({p + "ffn_up_exps.weight", {E, FE, X}, false});
      specs.push_back({p + "ffn_down_exps.weight", {FE, E, X}, false});
    } else {
      specs.push_back({p + "ffn_gate.weight", {E, FF}, false});
      specs.push_back({p + "ffn_up.weight", {E, FF}, false});
      specs.push_back({p + "ffn_down.weight", {FF, E}, false});
    }
  }
  std::vector<quant::Type> types;
  for (const Spec& s : specs) {
    const bool keep_f32 = s.norm || s.name.find("gate_inp") != std::string::npos;
    types.push_back(keep_f32 ? quant::Type::F32 : type);
    ASSERT_TRUE(w.add_tensor(s.name, uint32_t(types.back()), s.dims).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    std::normal_distribution<float> dist(specs[i].norm ? 1.0f : 0.0f, specs[i].norm ? 0.1f : 0.25f);
    for (float& v : values) v = dist(rng);
    std::vector<uint8_t> bytes(quant::row_size(types[i], specs[i].dims[0]) * size_t(n / specs[i].dims[0]));
    for (int64_t r = 0; r < n / specs[i].dims[0]; ++r) {
      quant::traits(types[i]).from_float(values.data() + r * specs[i].dims[0],
                                         bytes.data() + size_t(r) * quant::row_size(types[i], specs[i].dims[0]),
                                         specs[i].dims[0]);
    }
    ASSERT_TRUE(w.write(bytes).ok());
  }
  ASSERT_TRUE(w.finish().ok());
}

struct Loaded {
  std::unique_ptr<gguf::Model> file;
  std::unique_ptr<Model> model;
};

Loaded load(const std::string& path) {
  Loaded out;
  auto file = gguf::Model::open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  out.file = std::move(file).value();
  const Architecture* arch = find_architecture(out.file->architecture());
  EXPECT_NE(arch, nullptr);
  auto model = arch->load(*out.file);
  EXPECT_TRUE(model.ok()) << model.status().message();
  out.model = std::move(model).value();
  return out;
}

// Logits of every position of `tokens`, computed `chunk` tokens per forward call.
std::vector<float> run(const Model& m, const std::vector<int32_t>& tokens, int64_t chunk, quant::Type kv_type, int threads) {
  const HParams& hp = m.hparams();
  cpu::ThreadPool pool(threads);
  kv::KvCache kv(kv_type, hp.n_layer, 256, hp.n_head_kv * hp.head_dim);
  auto ws = m.make_workspace(chunk, 256, threads);
  std::vector<float> logits(tokens.size() * size_t(hp.n_vocab));
  for (size_t b = 0; b < tokens.size(); b += size_t(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(tokens.size() - b));
    m.forward(pool, *ws, kv, {.tokens = tokens.data() + b, .n_tok = n, .pos0 = int64_t(b), .all_logits = true,
                              .logits = logits.data() + b * size_t(hp.n_vocab)});
  }
  return logits;
}

std::vector<int32_t> sample_tokens(size_t n, int32_t vocab) {
  std::mt19937 rng(11);
  std::vector<int32_t> t(n);
  for (int32_t& v : t) v = int32_t(rng() % uint32_t(vocab));
  return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST(Qwen3Forward, DecodeMatchesPrefillAndBatchingDoesNotMatter) {
  testing::TempDir dir;
  write_tiny(dir.file("m.gguf"), quant::Type::F32, 5);
  Loaded m = load(dir.file("m.gguf"));
  ASSERT_TRUE(m.model);
  const std::vector<int32_t> tokens = sample_tokens(40, 97);
  const std::vector<float> prefill = run(*m.model, tokens, 64, quant::Type::F32, 2);
  for (float v : prefill) ASSERT_TRUE(std::isfinite(v));
  const std::vector<float> decode = run(*m.model, tokens, 1, quant::Type::F32, 2);
  const std::vector<float> chunked = run(*m.model, tokens, 7, quant::Type::F32, 1);
  EXPECT_LE(max_abs_diff(prefill, decode), 1e-4);
  EXPECT_LE(max_abs_diff(prefill, chunked), 1e-4);
  // Different positions give different distributions (the model is not degenerate).
  EXPECT_GT(max_abs_diff(std::vector<float>(prefill.begin(), prefill.begin() + 97),
                         std::vector<float>(prefill.begin() + 97, prefill.begin() + 194)), 1e-2);
}

// Prefill multiplies weight rows with token pairs through the 2x2 tile kernels, decode with single dots;
// the tiles reproduce the single dots bit for bit (backends/cpu/kernels.h), so quantized models give
// identical logits whichever way a sequence is batched.
TEST(Qwen3Forward, QuantizedDecodeMatchesPrefillExactly) {
  for (quant::Type type : {quant::Type::Q8_0, quant::Type::Q4_K, quant::Type::Q6_K}) {
    testing::TempDir dir;
    write_tiny(dir.file("m.gguf"), type, 5, /*k_quant_rows=*/true);
    Loaded m = load(dir.file("m.gguf"));
    ASSERT_TRUE(m.model);
    const std::vector<int32_t> tokens = sample_tokens(23, 97);
    const std::vector<float> prefill = run(*m.model, tokens, 64, quant::Type::F32, 2);
    const std::vector<float> decode = run(*m.model, tokens, 1, quant::Type::F32, 2);
    const std::vector<float> chunked = run(*m.model, tokens, 7, quant::Type::F32, 1);
    EXPECT_EQ(max_abs_diff(prefill, decode), 0.0) << quant::type_name(type);
    EXPECT_EQ(max_abs_diff(prefill, chunked), 0.0) << quant::type_name(type);
  }
}

TEST(Qwen3Forward, F16KvCacheAndQ8_0WeightsStayClose) {
  testing::TempDir dir;
  write_tiny(dir.file("f32.gguf"), quant::Type::F32, 5);
  write_tiny(dir.file("q8.gguf"), quant::Type::Q8_0, 5);
  Loaded f = load(dir.file("f32.gguf"));
  Loaded q = load(dir.file("q8.gguf"));
  ASSERT_TRUE(f.model && q.model);
  const std::vector<int32_t> tokens = sample_tokens(24, 97);
  const std::vector<float> ref = run(*f.model, tokens, 64, quant::Type::F32, 2);
  const std::vector<float> kv16 = run(*f.model, tokens, 64, quant::Type::F16, 2);
  const std::vector<float> q8 = run(*q.model, tokens, 64, quant::Type::F32, 2);
  double scale = 0;
  for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
  EXPECT_LE(max_abs_diff(ref, kv16), 5e-3 * scale);
  EXPECT_LE(max_abs_diff(ref, q8), 5e-2 * scale);
  EXPECT_GT(max_abs_diff(ref, q8), 0.0);  // the quantized model really is a different computation
}

TEST(Qwen3Load, MismatchesNameTheTensor) {
  testing::TempDir dir;
  write_tiny(dir.file("m.gguf"), quant::Type::F32, 5);
  auto file = gguf::Model::open(dir.file("m.gguf"));
  ASSERT_TRUE(file.ok());
  // Rewrite with a wrong shape for one tensor.
  gguf::Writer w(dir.file("bad.gguf"));
  for (const gguf::KeyValue& kv : (*file)->metadata()) w.set(kv.key, kv.value);
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    std::vector<int64_t> dims(t.ne.begin(), t.ne.begin() + t.n_dims);
    if (t.name == "blk.0.attn_k.weight") dims[1] = 16;
    ASSERT_TRUE(w.add_tensor(t.name, t.type_id, dims).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  for (const gguf::TensorInfo& t : w.tensors()) ASSERT_TRUE(w.write(std::vector<uint8_t>(t.nbytes)).ok());
  ASSERT_TRUE(w.finish().ok());
  auto bad = gguf::Model::open(dir.file("bad.gguf"));
  ASSERT_TRUE(bad.ok());
  auto model = find_architecture("qwen3moe")->load(**bad);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("tensor 'blk.0.attn_k.weight' has shape [64, 16], expected [64, 32]"),
            std::string::npos)
      << model.status().message();
  EXPECT_EQ(find_architecture("llama4"), nullptr);
  EXPECT_EQ(supported_architectures(), "qwen3, qwen3moe");
}

}  // namespace
}  // namespace magnetar::models
