// Engine::step over several sessions (the batched decode of concurrent sessions) on a tiny synthetic qwen3moe
// (F32 and Q8_0 weights, random): every session's logits after each batched step are bit-identical to the same
// session decoded alone, whatever the batch's composition, and bad input fails before any session changes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace {

std::unique_ptr<Engine> load_tiny(const std::string& path, quant::Type type, int64_t n_batch) {
  testing::write_tiny(path, type, 5);
  EngineOptions options;
  options.n_threads = 2;
  options.n_ctx = 64;
  options.n_batch = n_batch;
  options.kv_type = KvType::kF16;
  options.experts = ExpertMode::kResident;
  auto engine = Engine::load(path, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

std::vector<int32_t> prompt(size_t n, int salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7 + size_t(salt) * 13 + 3) % 61);
  return t;
}

// The next token of each decode: a fixed function of the step and the session, so both runs feed the same ids.
int32_t next_id(size_t session, int step) { return int32_t((session * 17 + size_t(step) * 5 + 1) % 61); }

class EngineBatchTest : public ::testing::TestWithParam<quant::Type> {};

TEST_P(EngineBatchTest, BatchedStepsEqualStepsAlone) {
  const std::string path = ::testing::TempDir() + "engine_batch_" + std::to_string(getpid()) + ".gguf";
  // n_batch 3: four sessions take two forward passes (3 + 1), covering the chunking too.
  std::unique_ptr<Engine> engine = load_tiny(path, GetParam(), 3);
  ASSERT_NE(engine, nullptr);
  const size_t kSessions = 4;
  const size_t lengths[kSessions] = {5, 1, 12, 7};  // different positions in one batch
  std::vector<std::unique_ptr<Session>> alone, batched;
  for (size_t i = 0; i < kSessions; ++i) {
    for (auto* group : {&alone, &batched}) {
      auto s = engine->new_session();
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE(s.value()->sync(prompt(lengths[i], int(i))).ok());
      group->push_back(std::move(s).value());
    }
  }
  const int64_t V = engine->info().n_vocab;
  for (int step = 0; step < 6; ++step) {
    // Session 1 sits out steps 2 and 3: batches change composition as sessions come and go.
    std::vector<Session*> members;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < kSessions; ++i) {
      if (i == 1 && (step == 2 || step == 3)) continue;
      members.push_back(batched[i].get());
      ids.push_back(next_id(i, step));
      ASSERT_TRUE(alone[i]->step(next_id(i, step)).ok());
    }
    ASSERT_TRUE(engine->step(members, ids).ok());
    for (size_t i = 0; i < kSessions; ++i) {
      ASSERT_EQ(batched[i]->tokens(), alone[i]->tokens()) << "session " << i << " step " << step;
      ASSERT_EQ(std::memcmp(batched[i]->logits().data(), alone[i]->logits().data(), size_t(V) * sizeof(float)), 0)
          << "session " << i << " step " << step;
    }
  }
  // A batched session continues like any other: a sync that extends its timeline reuses all of it.
  std::vector<int32_t> more = batched[2]->tokens();
  more.push_back(9);
  ASSERT_TRUE(batched[2]->sync(more).ok());
  ASSERT_TRUE(alone[2]->step(9).ok());
  EXPECT_EQ(std::memcmp(batched[2]->logits().data(), alone[2]->logits().data(), size_t(V) * sizeof(float)), 0);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Weights, EngineBatchTest, ::testing::Values(quant::Type::F32, quant::Type::Q8_0),
                         [](const auto& info) { return std::string(quant::type_name(info.param)); });

// --batch 0 (the default, auto) on the CPU: 512-token prompt chunks, at most the context; an explicit batch is kept
// (the GPU's choice: tests/cuda/cuda_engine_test.cpp, CudaEngineBatch).
TEST(EngineBatch, AutoIs512OnTheCpu) {
  const std::string path = ::testing::TempDir() + "engine_batch_auto_" + std::to_string(getpid()) + ".gguf";
  testing::write_tiny(path, quant::Type::F32, 5);
  auto batch_of = [&](int64_t n_ctx, int64_t n_batch) -> int64_t {
    EngineOptions options;
    options.n_threads = 2;
    options.n_ctx = n_ctx;
    options.n_batch = n_batch;
    options.device = Device::kCpu;
    auto engine = Engine::load(path, options);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? engine.value()->options().n_batch : -1;
  };
  EXPECT_EQ(EngineOptions{}.n_batch, 0);
  EXPECT_EQ(batch_of(4096, 0), 512);
  EXPECT_EQ(batch_of(100, 0), 100);
  EXPECT_EQ(batch_of(4096, 7), 7);
  unlink(path.c_str());
}

TEST(EngineBatch, BadInputFailsNamingTheSessionAndChangesNone) {
  const std::string path = ::testing::TempDir() + "engine_batch_bad_" + std::to_string(getpid()) + ".gguf";
  std::unique_ptr<Engine> engine = load_tiny(path, quant::Type::F32, 4);
  ASSERT_NE(engine, nullptr);
  auto a = engine->new_session(), b = engine->new_session();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a.value()->sync(prompt(4, 0)).ok());
  ASSERT_TRUE(b.value()->sync(prompt(63, 1)).ok());  // one row left of 64
  Session* both[2] = {a.value().get(), b.value().get()};
  const std::vector<int32_t> before_a = a.value()->tokens(), before_b = b.value()->tokens();

  const int32_t bad_id[2] = {3, 1 << 20};
  const Status s1 = engine->step(both, bad_id);
  ASSERT_FALSE(s1.ok());
  EXPECT_NE(s1.message().find("session 1"), std::string::npos) << s1.message();
  EXPECT_EQ(a.value()->tokens(), before_a);
  EXPECT_EQ(b.value()->tokens(), before_b);

  const int32_t ok_ids[2] = {3, 4};
  ASSERT_TRUE(engine->step(both, ok_ids).ok());  // b's last row
  const Status s2 = engine->step(both, ok_ids);  // b is full now
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.message().find("session 1: context of 64 tokens is full"), std::string::npos) << s2.message();
  EXPECT_EQ(a.value()->tokens().size(), before_a.size() + 1);
  std::remove(path.c_str());
}

// EngineOptions::n_sessions: the memory check and plan count every session planned for (serve --parallel, bench
// --sessions) and the disk KV's buffers. A context of 4M tokens takes 1 GiB of KV per session here (2 layers x K, V
// x 32 F16 values = 256 bytes a token): one session fits any machine that runs the tests, 1,024 none.
TEST(EngineBatch, TheMemoryPlanCountsTheSessionsPlannedFor) {
  const std::string dir = ::testing::TempDir() + "engine_sessions_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/m.gguf";
  testing::write_tiny(path, quant::Type::F32, 5);
  EngineOptions options;
  options.n_threads = 2;
  options.n_ctx = int64_t(1) << 22;
  options.device = Device::kCpu;
  options.experts = ExpertMode::kResident;
  ASSERT_TRUE(Engine::load(path, options).ok());
  options.n_sessions = 1024;
  Result<std::unique_ptr<Engine>> refused = Engine::load(path, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--ctx 4194304: 1024 sessions' KV caches and scratch take "),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("fewer sessions"), std::string::npos) << refused.status().message();
  options.n_sessions = 0;
  EXPECT_FALSE(Engine::load(path, options).ok());

  // A streamed plan counts and prints the sessions' KV (3 x 256 MiB at a context of 1M) and the disk KV's buffers:
  // 2 block copies of 2 layers x K, V x 8 tokens x 64 bytes, and 2 x 64 MiB of read buffers = 134,219,776 bytes.
  options.n_ctx = int64_t(1) << 20;
  options.n_sessions = 3;
  options.experts = ExpertMode::kStream;
  options.kv_disk = {.dir = dir + "/kv", .gb = 0.01, .block_tokens = 8};
  Result<std::unique_ptr<Engine>> streamed = Engine::load(path, options);
  ASSERT_TRUE(streamed.ok()) << streamed.status().message();
  const std::string plan = streamed.value()->memory_plan();
  EXPECT_NE(plan.find("KV cache            0.75 GiB (ctx 1048576, 3 sessions)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("disk KV buffers     0.13 GiB"), std::string::npos) << plan;
  streamed.value().reset();
  std::filesystem::remove_all(dir);
}

// --ctx 0: the model's training context up to the command's cap (serve: 32,768), cut when the planned sessions' KV
// would take more than a quarter of the memory, and said. 256 bytes of KV a token (above): 32,768 tokens are 8 MiB,
// which any machine running the tests holds; 64 sessions of 16M tokens are 256 GiB, which none holds a quarter of.
TEST(EngineBatch, TheDefaultContextIsTheModelsUpToTheCapAndFitsTheMemory) {
  const std::string path = ::testing::TempDir() + "engine_ctx_" + std::to_string(getpid()) + ".gguf";
  testing::write_tiny(path, quant::Type::F32, 5, false, 0, 1, int64_t(1) << 24);
  EngineOptions options;
  options.n_threads = 2;
  options.device = Device::kCpu;
  options.experts = ExpertMode::kResident;
  Result<std::unique_ptr<Engine>> plain = Engine::load(path, options);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain.value()->options().n_ctx, 4096);  // run/chat/bench's cap
  EXPECT_EQ(plain.value()->context_note(), "");
  plain.value().reset();
  options.n_ctx_default_max = 32768;
  Result<std::unique_ptr<Engine>> served = Engine::load(path, options);
  ASSERT_TRUE(served.ok()) << served.status().message();
  EXPECT_EQ(served.value()->options().n_ctx, 32768);
  EXPECT_EQ(served.value()->context_note(), "");
  served.value().reset();
  options.n_ctx_default_max = int64_t(1) << 24;
  options.n_sessions = 64;
  Result<std::unique_ptr<Engine>> cut = Engine::load(path, options);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  const int64_t n_ctx = cut.value()->options().n_ctx;
  EXPECT_GE(n_ctx, 4096);
  EXPECT_LT(n_ctx, int64_t(1) << 24);
  EXPECT_EQ(n_ctx & (n_ctx - 1), 0) << n_ctx;  // halved from a power of two
  const std::string note = cut.value()->context_note();
  EXPECT_EQ(note.rfind(format("context: %lld tokens (16777216 would put more than a quarter of the host memory into "
                              "64 sessions' KV",
                              (long long)n_ctx),
                       0),
            0u)
      << note;
  EXPECT_NE(cut.value()->memory_plan().find(note), std::string::npos) << cut.value()->memory_plan();
  cut.value().reset();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace magnetar
