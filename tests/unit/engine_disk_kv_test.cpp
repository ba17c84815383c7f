// Disk KV through the engine (KvDiskOptions) on a tiny synthetic qwen3moe: a prompt's full blocks are saved as
// they complete; a new engine on the same directory (a restart) restores them and its logits are bit-identical to
// a run that computed everything; a prompt rewritten in the middle restores only the blocks before the change;
// decoding across a block boundary saves that block.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace disk_kv_test {

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
  std::unique_ptr<Engine> load(bool disk, const std::string& model = "") {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.n_batch = 4;
    o.kv_type = kv_;
    o.experts = ExpertMode::kResident;
    if (disk) o.kv_disk = {.dir = base_ + "/kv", .gb = 0.01, .block_tokens = 8};
    auto e = Engine::load(model.empty() ? model_ : model, o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::unique_ptr<Session> session(Engine& e) {
    auto s = e.new_session();
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  // Whether `s`'s logits are bit-identical to those of a session that computed `tokens` without disk KV.
  bool logits_as_computed(Session& s, const std::vector<int32_t>& tokens) {
    std::unique_ptr<Engine> plain = load(false);
    std::unique_ptr<Session> ref = session(*plain);
    EXPECT_TRUE(ref->sync(tokens).ok());
    return s.logits().size() == ref->logits().size() &&
           std::memcmp(s.logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)) == 0;
  }
  std::string base_, model_;
  KvType kv_ = KvType::kF16;  // the KV type load() gives the engine
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

// An FP8 cache's blocks (a byte per element) restore as F16's do: the logits of a computation with FP8 KV, bit for bit.
// A restart with another KV type loads none of them (the blocks' header names their type): it computes the prompt.
TEST_F(EngineDiskKv, Fp8BlocksRestoreAndOtherTypesLeaveThem) {
  const std::vector<int32_t> p = prompt(43);
  kv_ = KvType::kF8;
  {
    std::unique_ptr<Engine> e = load(true);
    ASSERT_TRUE(session(*e)->sync(std::span<const int32_t>(p).first(41)).ok());
    EXPECT_EQ(e->kv_disk_stats().blocks_saved, 5u);
  }
  {
    kv_ = KvType::kF16;
    std::unique_ptr<Engine> e = load(true);
    std::unique_ptr<Session> s = session(*e);
    ASSERT_TRUE(s->sync(p).ok());
    EXPECT_EQ(s->stats().restored_tokens, 0);
    EXPECT_TRUE(logits_as_computed(*s, p));
  }
  kv_ = KvType::kF8;
  std::unique_ptr<Engine> e = load(true);
  std::unique_ptr<Session> s = session(*e);
  ASSERT_TRUE(s->sync(p).ok());
  EXPECT_EQ(s->stats().restored_tokens, 40);
  EXPECT_TRUE(logits_as_computed(*s, p));  // against FP8 KV computed without the disk
  for (int32_t id : {5, 9, 11}) ASSERT_TRUE(s->step(id).ok());
  std::unique_ptr<Engine> plain = load(false);
  std::unique_ptr<Session> ref = session(*plain);
  ASSERT_TRUE(ref->sync(p).ok());
  for (int32_t id : {5, 9, 11}) ASSERT_TRUE(ref->step(id).ok());
  EXPECT_EQ(std::memcmp(s->logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)), 0);
}

// A restore goes block by block and asks `progress` between blocks: stopped after the second, the timeline is the
// two restored blocks; the next sync restores the rest (not computing it) and the logits equal a full computation.
TEST_F(EngineDiskKv, ARestoreStopsBetweenBlocksAndResumes) {
  const std::vector<int32_t> p = prompt(43);
  {
    std::unique_ptr<Engine> e = load(true);
    ASSERT_TRUE(session(*e)->sync(std::span<const int32_t>(p).first(41)).ok());
  }
  std::unique_ptr<Engine> e = load(true);
  std::unique_ptr<Session> s = session(*e);
  std::vector<int64_t> seen;
  const Status stopped = s->sync(p, Logits::kLast, [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 43);
    seen.push_back(done);
    return done < 16;
  });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{8, 16}));  // after each block, no chunk computed yet
  EXPECT_EQ(s->tokens().size(), 16u);
  EXPECT_EQ(s->stats().restored_tokens, 16);
  ASSERT_TRUE(s->sync(p).ok());
  EXPECT_EQ(s->stats().restored_tokens, 40);
  EXPECT_TRUE(logits_as_computed(*s, p));
}

// Two models of one layout and file size (another fine-tune, another quantization) never share blocks: the disk
// KV's identity samples the weights (before, it hashed the file size and tensor directory, and the second model
// restored the first one's KV).
TEST_F(EngineDiskKv, AModelOfTheSameLayoutWithOtherWeightsRestoresNothing) {
  const std::string other = base_ + "/other.gguf";
  testing::write_tiny(other, quant::Type::F32, 6);
  ASSERT_EQ(std::filesystem::file_size(other), std::filesystem::file_size(model_));
  const std::vector<int32_t> p = prompt(20);
  {
    std::unique_ptr<Engine> e = load(true);
    ASSERT_TRUE(session(*e)->sync(p).ok());
    EXPECT_EQ(e->kv_disk_stats().blocks_saved, 2u);
  }
  std::unique_ptr<Engine> e = load(true, other);
  EXPECT_EQ(e->kv_disk_stats().blocks_on_disk, 0u);
  EXPECT_EQ(e->kv_disk_stats().foreign_blocks, 2u);
  std::unique_ptr<Session> s = session(*e);
  ASSERT_TRUE(s->sync(p).ok());
  EXPECT_EQ(s->stats().restored_tokens, 0);
  std::unique_ptr<Engine> plain = load(false, other);
  std::unique_ptr<Session> ref = session(*plain);
  ASSERT_TRUE(ref->sync(p).ok());
  EXPECT_EQ(std::memcmp(s->logits().data(), ref->logits().data(), ref->logits().size() * sizeof(float)), 0);
}

// A session that holds rows up to the middle of a block extends its history, and that block's file is damaged: the
// restore overwrites the block's rows from the disk before the checksum fails, so the rows from the block's start
// are computed again (before, the session kept its rows up to the middle and went on from the damaged ones).
TEST_F(EngineDiskKv, ADamagedBlockUnderTheKeptRowsIsComputedAgain) {
  const std::vector<int32_t> p = prompt(41, 2);
  const std::string dir = base_ + "/kv";
  auto files = [&] {
    std::set<std::string> out;
    for (const auto& f : std::filesystem::directory_iterator(dir)) out.insert(f.path().string());
    return out;
  };
  std::unique_ptr<Engine> e = load(true);
  std::string block2;
  {
    std::unique_ptr<Session> a = session(*e);
    ASSERT_TRUE(a->sync(std::span<const int32_t>(p).first(17)).ok());
    EXPECT_EQ(e->kv_disk_stats().blocks_saved, 2u);
    const std::set<std::string> before = files();
    ASSERT_TRUE(a->sync(std::span<const int32_t>(p).first(25)).ok());
    EXPECT_EQ(e->kv_disk_stats().blocks_saved, 3u);
    for (const std::string& f : files()) {
      if (!before.contains(f)) block2 = f;
    }
    ASSERT_TRUE(a->sync(p).ok());
  }
  ASSERT_FALSE(block2.empty());
  {  // damage a byte of row 17's K in layer 0: the payload starts after the 4 KiB header and the token ids' page, a
     // row of K is 2 KV heads x 16 dims of F16 = 64 bytes
    const std::streamoff at = 4096 + 4096 + 64 + 36;
    std::fstream f(block2, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    const char c = char(f.get() ^ 0x5a);
    f.seekp(at);
    f.put(c);
  }
  std::unique_ptr<Session> b = session(*e);
  ASSERT_TRUE(b->sync(std::span<const int32_t>(p).first(20)).ok());  // blocks 0 and 1 restored, rows 16..19 computed
  EXPECT_EQ(b->stats().restored_tokens, 16);
  ASSERT_TRUE(b->sync(p).ok());  // keeps 20 rows; block 2 (rows 16..23) fails its checksum
  EXPECT_EQ(b->stats().restored_tokens, 16) << "nothing more restored";
  EXPECT_EQ(e->kv_disk_stats().blocks_rejected, 1u);
  EXPECT_TRUE(logits_as_computed(*b, p));
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
  EXPECT_TRUE(logits_as_computed(*b, p));
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

}  // namespace disk_kv_test
}  // namespace magnetar
