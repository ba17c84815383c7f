// The Qwen3-MoE forward pass on synthetic models (made by `magnetar synth`'s generator through the
// writer): prefill of a whole sequence and token-by-token decode through the KV cache must agree, batching
// must not change results, and a quantized model must stay close to its F32 original. Agreement with
// transformers itself is tested in tests/golden.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "backends/cpu/threadpool.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "models/model.h"
#include "tests/unit/gguf_test_util.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar::models {
namespace {

using testing::write_tiny;

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
    const SeqSpan seq{.kv = &kv, .pos0 = int64_t(b), .n_tok = n};
    m.forward(pool, *ws, {.tokens = tokens.data() + b, .n_tok = n, .seqs = {&seq, 1}, .all_logits = true,
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

// A Q8_0 KV cache (--kv-type q8_0): each row is rounded once, when it is stored, so decode, chunked prefill and
// whole-prompt prefill give the same logits bit for bit, as with float caches, and differ from the F32 cache's (the
// rows really are rounded). How close they stay is measured on the trained demo model (engine_batch_test.cpp): this
// random model's near-one-hot attention turns the rounding of a score into a different winner.
// The same for an FP8 cache (--kv-type fp8).
TEST(Qwen3Forward, Q8KvCacheDecodeMatchesPrefillExactly) {
  testing::TempDir dir;
  write_tiny(dir.file("m.gguf"), quant::Type::F32, 5, /*k_quant_rows=*/true);
  Loaded m = load(dir.file("m.gguf"));
  ASSERT_TRUE(m.model);
  ASSERT_EQ(m.model->hparams().head_dim % 32, 0);
  const std::vector<int32_t> tokens = sample_tokens(23, 97);
  for (const quant::Type kv : {quant::Type::Q8_0, quant::Type::F8_E4M3}) {
    const std::vector<float> prefill = run(*m.model, tokens, 64, kv, 2);
    const std::vector<float> decode = run(*m.model, tokens, 1, kv, 2);
    const std::vector<float> chunked = run(*m.model, tokens, 7, kv, 1);
    EXPECT_EQ(max_abs_diff(prefill, decode), 0.0) << quant::type_name(kv);
    EXPECT_EQ(max_abs_diff(prefill, chunked), 0.0) << quant::type_name(kv);
    EXPECT_GT(max_abs_diff(prefill, run(*m.model, tokens, 64, quant::Type::F32, 2)), 0.0) << quant::type_name(kv);
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

// The tiny model's metadata with `edit` applied; its load's error ("" when it loads).
std::string load_error_after(const std::function<void(gguf::Writer&)>& edit) {
  testing::TempDir dir;
  write_tiny(dir.file("m.gguf"), quant::Type::F32, 5);
  auto file = gguf::Model::open(dir.file("m.gguf"));
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return "(cannot open)";
  gguf::Writer w(dir.file("edited.gguf"));
  for (const gguf::KeyValue& kv : (*file)->metadata()) w.set(kv.key, kv.value);
  edit(w);
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    EXPECT_TRUE(w.add_tensor(t.name, t.type_id, std::span<const int64_t>(t.ne.data(), size_t(t.n_dims))).ok());
  }
  EXPECT_TRUE(w.begin().ok());
  for (const gguf::TensorInfo& t : (*file)->tensors()) {
    EXPECT_TRUE(w.write(std::span<const uint8_t>(t.data, size_t(t.nbytes))).ok());
  }
  EXPECT_TRUE(w.finish().ok());
  auto edited = gguf::Model::open(dir.file("edited.gguf"));
  EXPECT_TRUE(edited.ok());
  if (!edited.ok()) return "(cannot open the edited file)";
  auto model = find_architecture((*edited)->architecture())->load(**edited);
  return model.ok() ? "" : model.status().message();
}

// Head counts whose products with the head size wrap int64 to the tensors' real widths (2^59 + 4 heads of 64: q_dim
// 256) passed every shape check and broke the workspace (std::length_error, an abort); a sliding-window pattern of
// integers read as all zeros (every layer full attention) though the error asks for bools.
TEST(Qwen3Load, SizesBeyondAnyModelAndAMistypedPatternAreRefused) {
  ASSERT_EQ(load_error_after([](gguf::Writer&) {}), "");
  const std::string heads = load_error_after([](gguf::Writer& w) {
    w.set("qwen3moe.attention.head_count", gguf::Value::of_uint(gguf::ValueType::kUint64, (1ull << 59) + 4));
    w.set("qwen3moe.attention.head_count_kv", gguf::Value::of_uint(gguf::ValueType::kUint64, (1ull << 58) + 2));
  });
  EXPECT_NE(heads.find("inconsistent hyper-parameters"), std::string::npos) << heads;
  const std::string ffn = load_error_after([](gguf::Writer& w) {
    w.set("qwen3moe.expert_feed_forward_length", gguf::Value::of_uint(gguf::ValueType::kUint64, 1ull << 40));
  });
  EXPECT_NE(ffn.find("inconsistent hyper-parameters"), std::string::npos) << ffn;
  const std::string pattern = load_error_after([](gguf::Writer& w) {
    w.set("qwen3moe.attention.sliding_window", gguf::Value::of_uint(gguf::ValueType::kUint32, 8));
    std::vector<gguf::Value> ones;
    for (int i = 0; i < 2; ++i) ones.push_back(gguf::Value::of_int(gguf::ValueType::kInt32, 1));  // one per layer
    w.set("qwen3moe.attention.sliding_window_pattern", gguf::Value::of_array(gguf::ValueType::kInt32, ones));
  });
  EXPECT_NE(pattern.find("attention.sliding_window_pattern' must be an array of"), std::string::npos) << pattern;
}

}  // namespace
}  // namespace magnetar::models
