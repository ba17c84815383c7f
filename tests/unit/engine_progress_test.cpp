// Session::sync's progress hook on a tiny synthetic qwen3moe (F32, random weights): called once per chunk, and a
// prefill it cancels keeps the computed prefix so that finishing it later gives the same logits bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace {

class SyncProgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "engine_progress_" + std::to_string(getpid()) + ".gguf";
    testing::write_tiny(path_, quant::Type::F32, 5);
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
