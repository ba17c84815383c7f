// Session::sync's progress hook on a tiny synthetic qwen3moe (F32, random weights): called once per chunk, and a
// prefill it cancels keeps the computed prefix so that finishing it later gives the same logits bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "engine/engine.h"
#include "gguf/writer.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

using gguf::Value;
using gguf::ValueType;

// 2 layers (layer 0 MoE with 4 experts top-2, layer 1 dense), hidden 32, 4 heads / 2 kv heads of 8, vocab 61.
void write_tiny(const std::string& path) {
  const int64_t E = 32, H = 4, HKV = 2, D = 8, X = 4, FE = 16, FF = 48, V = 61;
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
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs = {
      {"token_embd.weight", {E, V}}, {"output_norm.weight", {E}}, {"output.weight", {E, V}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    specs.insert(specs.end(), {{p + "attn_norm.weight", {E}},
                               {p + "attn_q.weight", {E, H * D}},
                               {p + "attn_k.weight", {E, HKV * D}},
                               {p + "attn_v.weight", {E, HKV * D}},
                               {p + "attn_output.weight", {H * D, E}},
                               {p + "attn_q_norm.weight", {D}},
                               {p + "attn_k_norm.weight", {D}},
                               {p + "ffn_norm.weight", {E}}});
    if (l == 0) {
      specs.insert(specs.end(), {{p + "ffn_gate_inp.weight", {E, X}},
                                 {p + "ffn_gate_exps.weight", {E, FE, X}},
                                 {p + "ffn_up_exps.weight", {E, FE, X}},
                                 {p + "ffn_down_exps.weight", {FE, E, X}}});
    } else {
      specs.insert(specs.end(), {{p + "ffn_gate.weight", {E, FF}},
                                 {p + "ffn_up.weight", {E, FF}},
                                 {p + "ffn_down.weight", {FF, E}}});
    }
  }
  for (const auto& [name, dims] : specs) ASSERT_TRUE(w.add_tensor(name, uint32_t(quant::Type::F32), dims).ok());
  ASSERT_TRUE(w.begin().ok());
  std::mt19937 rng(5);
  for (const auto& [name, dims] : specs) {
    const bool norm = name.find("norm") != std::string::npos;
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    std::normal_distribution<float> dist(norm ? 1.0f : 0.0f, norm ? 0.1f : 0.25f);
    for (float& v : values) v = dist(rng);
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    ASSERT_TRUE(w.write(bytes).ok());
  }
  ASSERT_TRUE(w.finish().ok());
}

class SyncProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "engine_progress_" + std::to_string(getpid()) + ".gguf";
    write_tiny(path_);
    EngineOptions options;
    options.n_threads = 2;
    options.n_ctx = 128;
    options.n_batch = 4;
    options.kv_type = KvType::kF32;
    options.experts = ExpertMode::kResident;
    auto engine = Engine::load(path_, options);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    engine_ = std::move(engine).value();
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::unique_ptr<Session> session() {
    auto s = engine_->new_session();
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  std::string path_;
  std::unique_ptr<Engine> engine_;
};

std::vector<int32_t> prompt(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7 + 3) % 61);
  return t;
}

TEST_F(SyncProgressTest, CalledOncePerChunkWithIncreasingDone) {
  std::unique_ptr<Session> s = session();
  std::vector<std::pair<int64_t, int64_t>> calls;
  ASSERT_TRUE(s->sync(prompt(18), Logits::kLast, [&](int64_t done, int64_t total) {
                 calls.emplace_back(done, total);
                 return true;
               }).ok());
  // ceil(18 / 4) = 5 chunks
  const std::vector<std::pair<int64_t, int64_t>> want = {{4, 18}, {8, 18}, {12, 18}, {16, 18}, {18, 18}};
  EXPECT_EQ(calls, want);
  // A continuation computes only the new tokens (the last prompt token is reused).
  calls.clear();
  std::vector<int32_t> longer = prompt(18);
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  ASSERT_TRUE(s->sync(longer, Logits::kLast, [&](int64_t done, int64_t total) {
                 calls.emplace_back(done, total);
                 return true;
               }).ok());
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{4, 5}, {5, 5}}));
}

TEST_F(SyncProgressTest, CancelKeepsTheComputedPrefixAndResumesBitIdentically) {
  const std::vector<int32_t> tokens = prompt(18);
  std::unique_ptr<Session> reference = session();
  ASSERT_TRUE(reference->sync(tokens).ok());
  const std::vector<float> want(reference->logits().begin(), reference->logits().end());

  std::unique_ptr<Session> s = session();
  int calls = 0;
  const Status cancelled = s->sync(tokens, Logits::kLast, [&](int64_t, int64_t) {
    ++calls;
    return false;
  });
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.message(), "cancelled");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(s->tokens(), std::vector<int32_t>(tokens.begin(), tokens.begin() + 4));

  std::vector<int64_t> done;
  ASSERT_TRUE(s->sync(tokens, Logits::kLast, [&](int64_t d, int64_t) {
                 done.push_back(d);
                 return true;
               }).ok());
  EXPECT_EQ(done, (std::vector<int64_t>{4, 8, 12, 14}));  // the 4 cached tokens are not recomputed
  EXPECT_EQ(s->stats().reused_tokens, 4);
  ASSERT_EQ(s->logits().size(), want.size());
  EXPECT_EQ(std::memcmp(s->logits().data(), want.data(), want.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace magnetar
