// Session::sync's progress hook on a tiny synthetic qwen3moe (F32, random weights): called once per chunk, and a
// prefill it cancels keeps the computed prefix so that finishing it later gives the same logits bit for bit. With
// streamed experts a prompt goes in prefill sweeps: the hook is called after every step of a sweep (a layer of a
// chunk), and a sweep it stops continues from that step in a later sync (other sessions computing in between),
// with the logits of the resident model computed chunk by chunk, bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

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
  // The same file with its experts streamed through the RAM store, prompts in sweeps of up to 12 tokens.
  std::unique_ptr<Engine> streamed() {
    EngineOptions options = engine_->options();
    options.experts = ExpertMode::kStream;
    options.stream.census = false;
    options.n_sweep = 12;
    auto engine = Engine::load(path_, options);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(engine).value() : nullptr;
  }
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

// Two layers (write_tiny), chunks of 4: a sweep of n tokens has 2 + 2 * ceil(n / 4) steps (the embeddings, each layer
// over each chunk, the head); the hook gets the sweep's share of its tokens after each step but the last.
std::vector<int64_t> sweep_done(int64_t before, int64_t n, int64_t from_step = 0) {
  const int64_t steps = 2 + 2 * ((n + 3) / 4);
  std::vector<int64_t> done;
  for (int64_t k = from_step + 1; k < steps; ++k) done.push_back(before + n * (k - from_step) / steps);
  done.push_back(before + n);
  return done;
}

std::vector<float> logits_of(Session& s) { return {s.logits().begin(), s.logits().end()}; }

TEST_F(SyncProgressTest, SweepsReportEveryStep) {
  std::unique_ptr<Engine> engine = streamed();
  ASSERT_TRUE(engine);
  auto s = engine->new_session();
  ASSERT_TRUE(s.ok());
  std::vector<int64_t> done;
  ASSERT_TRUE(s.value()->sync(prompt(18), Logits::kLast, [&](int64_t d, int64_t total) {
                 EXPECT_EQ(total, 18);
                 done.push_back(d);
                 return true;
               }).ok());
  // A sweep of 12 tokens (8 steps), then the 6 left (5 or more: a sweep of 2 chunks, 6 steps).
  std::vector<int64_t> want = sweep_done(0, 12);
  for (const int64_t d : sweep_done(12, 6)) want.push_back(d);
  EXPECT_EQ(done, want);
  EXPECT_EQ(engine->expert_stats().sweeps, 2u);
  std::unique_ptr<Session> reference = session();
  ASSERT_TRUE(reference->sync(prompt(18)).ok());
  EXPECT_EQ(logits_of(*s.value()), logits_of(*reference));
}

TEST_F(SyncProgressTest, AStoppedSweepContinuesWhereItStopped) {
  const std::vector<int32_t> tokens = prompt(18);
  std::unique_ptr<Session> reference = session();
  ASSERT_TRUE(reference->sync(tokens).ok());
  const std::vector<float> want = logits_of(*reference);

  std::unique_ptr<Engine> engine = streamed();
  ASSERT_TRUE(engine);
  auto made = engine->new_session(), other = engine->new_session();
  ASSERT_TRUE(made.ok() && other.ok());
  Session& s = *made.value();
  // Stopped at the third step of the first sweep: nothing of the prompt is valid yet.
  int calls = 0;
  Status stopped = s.sync(tokens, Logits::kLast, [&](int64_t, int64_t) { return ++calls < 3; });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.message(), "cancelled");
  EXPECT_TRUE(s.tokens().empty());
  EXPECT_EQ(engine->expert_stats().sweeps, 0u);
  // Another session's prompt and decode in between (its own sweeps and chunks).
  std::vector<int32_t> mine = prompt(23);
  std::reverse(mine.begin(), mine.end());
  ASSERT_TRUE(other.value()->sync(mine).ok());
  ASSERT_TRUE(other.value()->step(5).ok());
  const uint64_t sweeps = engine->expert_stats().sweeps;
  // Continued from the third step (the progress of this call only), then the last 6 tokens.
  std::vector<int64_t> done;
  ASSERT_TRUE(s.sync(tokens, Logits::kLast, [&](int64_t d, int64_t) {
                 done.push_back(d);
                 return true;
               }).ok());
  std::vector<int64_t> want_done = sweep_done(0, 12, 3);
  for (const int64_t d : sweep_done(12, 6)) want_done.push_back(d);
  EXPECT_EQ(done, want_done);
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps + 2);
  EXPECT_EQ(logits_of(s), want);

  // Stopped in the second sweep, then a step instead: the sweep is dropped, the step computes position 12.
  auto again = engine->new_session();
  ASSERT_TRUE(again.ok());
  calls = 0;
  stopped = again.value()->sync(tokens, Logits::kLast, [&](int64_t d, int64_t) { return d < 12 || ++calls < 2; });
  ASSERT_FALSE(stopped.ok());
  ASSERT_EQ(again.value()->tokens(), std::vector<int32_t>(tokens.begin(), tokens.begin() + 12));
  ASSERT_TRUE(again.value()->step(tokens[12]).ok());
  ASSERT_TRUE(reference->sync(std::vector<int32_t>(tokens.begin(), tokens.begin() + 13)).ok());
  EXPECT_EQ(logits_of(*again.value()), logits_of(*reference));
  // A stopped sweep whose tokens the next timeline changes: dropped too (the new tokens computed from the prefix).
  calls = 0;
  stopped = again.value()->sync(prompt(40), Logits::kLast, [&](int64_t, int64_t) { return ++calls < 4; });
  ASSERT_FALSE(stopped.ok());
  std::vector<int32_t> changed = again.value()->tokens();
  for (int i = 0; i < 20; ++i) changed.push_back(int32_t((i * 5 + 1) % 61));
  ASSERT_TRUE(again.value()->sync(changed).ok());
  ASSERT_TRUE(reference->sync(changed).ok());
  EXPECT_EQ(logits_of(*again.value()), logits_of(*reference));
}

// A paused sweep and a disk KV restore: a restore overwrites the rows of the sweep's computed layers (all of them when
// its block fails its checks after the rows were written), so the sweep starts again instead of going on from them.
// Session B's sweep over [8, 20) stops after layer 0; block 1 ([8, 16)) is on disk again (session C) but damaged in
// layer 0's K row of position 8; B's next sync tries to restore it. Layer 0's K rows are read only by later tokens:
// a step after the sync compares against a session that never paused.
TEST_F(SyncProgressTest, ARestoreUnderAPausedSweepStartsTheSweepAgain) {
  const std::string dir = ::testing::TempDir() + "engine_progress_kv_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  EngineOptions options = engine_->options();
  options.experts = ExpertMode::kStream;
  options.stream.census = false;
  options.n_sweep = 12;
  options.kv_disk = {.dir = dir, .gb = 0.01, .block_tokens = 8};
  auto loaded = Engine::load(path_, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Engine& engine = *loaded.value();
  auto new_session = [&] {
    auto made = engine.new_session();
    EXPECT_TRUE(made.ok());
    return std::move(made).value();
  };
  // Flips the high byte of the first K value of layer 0 in block 1's file (payload after the 4 KiB header and the
  // token page; layer 0's K rows first).
  auto damage_block_1 = [&] {
    (void)engine.kv_disk_stats();  // the background writes are done
    int found = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      int64_t index = -1;
      f.seekg(48);  // Header::index
      f.read(reinterpret_cast<char*>(&index), 8);
      if (index != 1) continue;
      char c = 0;
      f.seekg(8192 + 3);
      f.read(&c, 1);
      c = char(c ^ 0x40);
      f.seekp(8192 + 3);
      f.write(&c, 1);
      ++found;
    }
    ASSERT_EQ(found, 1);
  };
  const std::vector<int32_t> tokens = prompt(20);
  ASSERT_TRUE(new_session()->sync(tokens).ok());  // A: blocks 0 and 1 saved
  damage_block_1();
  std::unique_ptr<Session> b = new_session();
  int calls = 0;
  // Block 0 restored, block 1 rejected: a sweep over [8, 20), stopped after its embeddings and layer 0's 3 chunks.
  ASSERT_FALSE(b->sync(tokens, Logits::kLast, [&](int64_t, int64_t) { return ++calls < 4; }).ok());
  ASSERT_EQ(b->tokens().size(), 8u);
  ASSERT_TRUE(new_session()->sync(tokens).ok());  // C: block 1 saved again
  damage_block_1();
  ASSERT_TRUE(b->sync(tokens).ok());
  ASSERT_TRUE(b->step(7).ok());
  std::unique_ptr<Session> reference = new_session();
  ASSERT_TRUE(reference->sync(tokens).ok());  // block 1 rejected again: [8, 20) computed
  ASSERT_TRUE(reference->step(7).ok());
  EXPECT_EQ(logits_of(*b), logits_of(*reference));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace magnetar
