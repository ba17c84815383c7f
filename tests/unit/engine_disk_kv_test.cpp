// Disk KV through the engine (KvDiskOptions) on a tiny synthetic qwen3moe: a prompt's full blocks are saved as
// they complete; a new engine on the same directory (a restart) restores them and its logits are bit-identical to
// a run that computed everything; a prompt rewritten in the middle restores only the blocks before the change;
// decoding across a block boundary saves that block.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace {

class EngineDiskKv : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "engine_disk_kv_" + std::to_string(getpid());
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_);
    model_ = base_ + "/m.gguf";
    testing::write_tiny(model_, quant::Type::F32, 5);
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::unique_ptr<Engine> load(bool disk) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.n_batch = 4;
    o.kv_type = KvType::kF16;
    o.experts = ExpertMode::kResident;
    if (disk) o.kv_disk = {.dir = base_ + "/kv", .gb = 0.01, .block_tokens = 8};
    auto e = Engine::load(model_, o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::unique_ptr<Session> session(Engine& e) {
    auto s = e.new_session();
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  std::string base_, model_;
};

std::vector<int32_t> prompt(size_t n, int salt = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7 + 3 + size_t(salt)) % 61);
  return t;
}

TEST_F(EngineDiskKv, RestartRestoresSavedBlocksWithIdenticalLogits) {
  const std::vector<int32_t> p = prompt(43);
  {
    std::unique_ptr<Engine> e = load(true);
    std::unique_ptr<Session> s = session(*e);
    ASSERT_TRUE(s->sync(std::span<const int32_t>(p).first(41)).ok());
    EXPECT_EQ(e->kv_disk_stats().blocks_saved, 5u);  // 41 tokens: 5 full blocks of 8
    EXPECT_EQ(s->stats().restored_tokens, 0);
  }
  std::unique_ptr<Engine> e = load(true);  // a restart: the index comes from the directory
  EXPECT_EQ(e->kv_disk_stats().blocks_on_disk, 5u);
  std::unique_ptr<Session> s = session(*e);
  ASSERT_TRUE(s->sync(p).ok());
  EXPECT_EQ(s->stats().restored_tokens, 40);
  EXPECT_EQ(e->kv_disk_stats().tokens_restored, 40u);

  std::unique_ptr<Engine> plain = load(false);
  std::unique_ptr<Session> ref = session(*plain);
  ASSERT_TRUE(ref->sync(p).ok());
  ASSERT_EQ(s->logits().size(), ref->logits().size());
  EXPECT_EQ(std::memcmp(s->logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)), 0);
  // Decoding on: identical step by step, and crossing 48 saves block 5.
  for (int32_t id : {5, 9, 11, 2, 7}) {
    ASSERT_TRUE(s->step(id).ok());
    ASSERT_TRUE(ref->step(id).ok());
    ASSERT_EQ(std::memcmp(s->logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)), 0);
  }
  EXPECT_EQ(e->kv_disk_stats().blocks_saved, 1u);
  EXPECT_EQ(e->kv_disk_stats().blocks_on_disk, 6u);
}

TEST_F(EngineDiskKv, ARewrittenHistoryRestoresTheBlocksBeforeTheChange) {
  std::unique_ptr<Engine> e = load(true);
  std::vector<int32_t> p = prompt(60, 1);
  {
    std::unique_ptr<Session> a = session(*e);
    ASSERT_TRUE(a->sync(p).ok());  // 7 blocks saved
  }
  p[21] = (p[21] + 1) % 61;        // inside block 2
  std::unique_ptr<Session> b = session(*e);
  ASSERT_TRUE(b->sync(p).ok());
  EXPECT_EQ(b->stats().restored_tokens, 16);
  std::unique_ptr<Engine> plain = load(false);
  std::unique_ptr<Session> ref = session(*plain);
  ASSERT_TRUE(ref->sync(p).ok());
  EXPECT_EQ(std::memcmp(b->logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)), 0);
}

TEST_F(EngineDiskKv, BatchedDecodeSavesCompletedBlocks) {
  std::unique_ptr<Engine> e = load(true);
  std::unique_ptr<Session> a = session(*e), b = session(*e);
  ASSERT_TRUE(a->sync(prompt(7, 2)).ok());
  ASSERT_TRUE(b->sync(prompt(6, 3)).ok());
  EXPECT_EQ(e->kv_disk_stats().blocks_saved, 0u);
  Session* both[2] = {a.get(), b.get()};
  const int32_t ids[2] = {4, 4};
  ASSERT_TRUE(e->step(both, ids).ok());  // a reaches 8 tokens: its block 0 is saved
  EXPECT_EQ(e->kv_disk_stats().blocks_saved, 1u);
  ASSERT_TRUE(e->step(both, ids).ok());  // b reaches 8
  EXPECT_EQ(e->kv_disk_stats().blocks_saved, 2u);
}

}  // namespace
}  // namespace magnetar
