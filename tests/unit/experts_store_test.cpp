// The streamed expert store against the mapping: whatever the cache size, reader, O_DIRECT setting, policy or
// prefetch hints, every acquired expert's gate / up / down bytes equal the model file's; the census persists,
// merges across stores and rejects foreign or corrupted files; a failed read is an error naming the file.
// Uses the bundled demo model (standard layout, 8 MoE layers x 16 experts).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "experts/census.h"
#include "experts/layout.h"
#include "experts/store.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::experts {
namespace {

const std::string kDemo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";

struct Opened {
  std::unique_ptr<gguf::Model> model;
  std::unique_ptr<ExpertLayout> layout;
};

Opened open_model(const std::string& path) {
  Opened o;
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  o.model = std::move(m).value();
  Result<ExpertLayout> l = ExpertLayout::from_model(*o.model);
  EXPECT_TRUE(l.ok()) << l.status().message();
  o.layout = std::make_unique<ExpertLayout>(std::move(l).value());
  return o;
}

// Acquires random expert sets layer by layer (with random hints) and checks every byte against the mapping.
void exercise(StreamedExperts& store, const Opened& o, uint64_t seed, int steps) {
  MappedExperts mapped(*o.model, *o.layout);
  std::mt19937_64 rng(seed);
  const int64_t X = o.layout->n_expert();
  for (int step = 0; step < steps; ++step) {
    for (int64_t layer = 0; layer < o.layout->n_layer(); ++layer) {
      std::vector<int32_t> ids(static_cast<size_t>(X));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(size_t(1 + rng() % uint64_t(X)));  // 1 .. all experts (prefill touches many)
      std::vector<ExpertPtrs> got(ids.size()), want(ids.size());
      std::vector<uint8_t> ready(ids.size()), all(ids.size());
      store.acquire(layer, ids, got, ready);
      if (rng() % 2) {
        std::vector<int32_t> hint = {int32_t(rng() % uint64_t(X)), int32_t(rng() % uint64_t(X))};
        store.prefetch((layer + 1) % o.layout->n_layer(), hint);
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!ready[i]) continue;
        for (int p = 0; p < kParts; ++p) ASSERT_NE(got[i].part[p], nullptr);
      }
      ASSERT_TRUE(store.wait(got).ok());
      mapped.acquire(layer, ids, want, all);
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int p = 0; p < kParts; ++p) {
          const uint64_t n = o.layout->part(layer, Part(p)).bytes_per_expert;
          ASSERT_EQ(std::memcmp(got[i].part[p], want[i].part[p], n), 0)
              << "layer " << layer << " expert " << ids[i] << " part " << p;
        }
      }
      store.release();
    }
  }
}

TEST(ExpertStore, BytesEqualTheFileUnderConstantEviction) {
  const Opened o = open_model(kDemo);
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  struct Arm {
    bool uring, direct;
    const char* policy;
    uint64_t slots;
    uint64_t merge_gap;  // 1 MiB: reads run through gaps of up to 15 experts' slices
  };
  for (const Arm arm : {Arm{true, true, "lfu", 16, 0}, Arm{false, true, "lru", 17, 1 << 20},
                        Arm{true, false, "lru", 40, 1 << 20}, Arm{false, false, "lfu", 128, kMeasureGap},
                        Arm{true, true, "lfu", 24, 1 << 20}}) {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout,
                              {.cache_bytes = arm.slots * slab, .use_uring = arm.uring, .direct = arm.direct,
                               .policy = arm.policy, .merge_gap_bytes = arm.merge_gap});
    ASSERT_TRUE(store.ok()) << store.status().message();
    exercise(*store.value(), o, arm.slots, 6);
    const LayerStats t = store.value()->stats().total();
    EXPECT_GT(t.misses, 0u);
    if (arm.slots < 128) {
      EXPECT_GT(store.value()->stats().evictions, 0u);
    } else {
      EXPECT_GT(t.hits, 0u);  // everything fits: later steps hit
    }
  }
}

// Which reads a layer's misses become. The demo's expert slices are S = 17 pages each, but its tensors start
// wherever GGUF's 32-byte alignment put them: a slice read as whole pages spans S + pad bytes, pad = 4096 when
// its tensor starts mid-page (neighbouring slices then share a page, read once), else 0. So per part: k
// adjacent experts are one read of k*S + pad bytes; a gap of one expert is S - pad bytes, read through when
// merge_gap_bytes allows it; a wider gap splits the read.
TEST(ExpertStore, MergesReadsAcrossGapsUpToTheLimit) {
  const Opened o = open_model(kDemo);
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  const uint64_t S = o.layout->part(0, Part::kGate).bytes_per_expert;
  uint64_t pad = 0;  // summed over the three parts
  for (int p = 0; p < kParts; ++p) {
    ASSERT_EQ(o.layout->part(0, Part(p)).bytes_per_expert, S);
    ASSERT_EQ(S % 4096, 0u);
    pad += o.layout->extent(0, 0, Part(p)).offset % 4096 ? 4096 : 0;
  }
  struct Case {
    std::vector<int32_t> experts;
    uint64_t merge_gap;
    uint64_t reads, gap_bytes, bytes_read;
  };
  const Case cases[] = {
      {{0, 1, 2}, 0, 3, 0, 3 * 3 * S + pad},                          // adjacent: one read per part
      {{0, 2}, 0, 6, 0, 3 * 2 * S + 2 * pad},                         // a gap, not allowed: two per part
      {{0, 2}, S, 3, 3 * S - pad, 3 * 3 * S + pad},                   // the gap read through
      {{0, 3}, S, 6, 0, 3 * 2 * S + 2 * pad},                         // two experts' gap > S
      {{5, 1, 3}, 2 * S, 3, 2 * (3 * S - pad), 3 * 5 * S + pad},      // any order, two gaps
  };
  for (const Case& c : cases) {
    Result<std::unique_ptr<StreamedExperts>> store = StreamedExperts::open(
        *o.model, *o.layout, {.cache_bytes = 16 * slab, .merge_gap_bytes = c.merge_gap});
    ASSERT_TRUE(store.ok()) << store.status().message();
    std::vector<ExpertPtrs> got(c.experts.size()), want(c.experts.size());
    std::vector<uint8_t> ready(c.experts.size()), all(c.experts.size());
    store.value()->acquire(0, c.experts, got, ready);
    ASSERT_TRUE(store.value()->wait(got).ok());
    MappedExperts mapped(*o.model, *o.layout);
    mapped.acquire(0, c.experts, want, all);
    for (size_t i = 0; i < c.experts.size(); ++i) {
      for (int p = 0; p < kParts; ++p) ASSERT_EQ(std::memcmp(got[i].part[p], want[i].part[p], S), 0);
    }
    store.value()->release();
    const LayerStats& st = store.value()->stats().layers[0];
    const std::string what = std::to_string(c.experts.size()) + " experts, gap " + std::to_string(c.merge_gap);
    EXPECT_EQ(st.reads, c.reads) << what;
    EXPECT_EQ(st.gap_bytes, c.gap_bytes) << what;
    EXPECT_EQ(st.bytes_read, c.bytes_read) << what;
  }
}

TEST(ExpertStore, RefusesACacheSmallerThanOneLayer) {
  const Opened o = open_model(kDemo);
  Result<std::unique_ptr<StreamedExperts>> store =
      StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 15 * StreamedExperts::slab_bytes(*o.layout)});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("holds 15 experts"), std::string::npos) << store.status().message();
}

TEST(ExpertStore, CensusPersistsMergesAndWarmStarts) {
  testing::TempDir dir;
  const Opened o = open_model(kDemo);
  const std::string census = dir.file("demo.census");
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  const std::vector<int32_t> hot = {3, 5};
  auto run = [&](int times) {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 64 * slab, .census_path = census});
    EXPECT_TRUE(store.ok()) << store.status().message();
    for (int i = 0; i < times; ++i) {
      std::vector<ExpertPtrs> ptrs(2);
      std::vector<uint8_t> ready(2);
      store.value()->acquire(1, hot, ptrs, ready);
      EXPECT_TRUE(store.value()->wait(ptrs).ok());
      store.value()->release();
    }
    return store.value()->stats().warm_experts;
  };
  EXPECT_EQ(run(3), 0u);  // no census yet: cold start
  const uint64_t id = model_identity(*o.model);
  Result<Census> c = load_census(census, id, o.layout->n_layer(), o.layout->n_expert());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().counts[size_t(1 * 16 + 3)], 3u);
  EXPECT_EQ(c.value().total(), 6u);
  EXPECT_EQ(run(2), 2u);  // warm start loads the two experts the census knows
  c = load_census(census, id, o.layout->n_layer(), o.layout->n_expert());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().counts[size_t(1 * 16 + 5)], 5u);  // 3 + 2: merged, not overwritten

  EXPECT_FALSE(load_census(census, id + 1, o.layout->n_layer(), o.layout->n_expert()).ok());  // another model
  EXPECT_FALSE(load_census(census, id, o.layout->n_layer(), 8).ok());                         // another geometry
  std::vector<uint8_t> bytes = testing::read_all(census);
  bytes[40] ^= 1;
  testing::write_all(census, bytes);
  Result<Census> bad = load_census(census, id, o.layout->n_layer(), o.layout->n_expert());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checksum"), std::string::npos) << bad.status().message();
  EXPECT_TRUE(load_census(dir.file("absent"), id, 8, 16).ok());  // no file: empty census
}

// A miss never evicts an expert that the same acquire asks for after it. Sixteen slots hold layer 1's experts 0 and
// 2..15 (2..15 used four times, 0 once: the lowest score) and layer 0's expert 0 (four uses). acquire(1, {1, 0})
// misses 1 first: the victim must not be layer 1's expert 0, which the call hits next.
TEST(ExpertStore, AMissKeepsTheCallsOtherExperts) {
  const Opened o = open_model(kDemo);
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  Result<std::unique_ptr<StreamedExperts>> opened =
      StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 16 * slab});
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  StreamedExperts& store = *opened.value();
  auto use = [&](int64_t layer, const std::vector<int32_t>& experts) {
    std::vector<ExpertPtrs> ptrs(experts.size());
    std::vector<uint8_t> ready(experts.size());
    store.acquire(layer, experts, ptrs, ready);
    EXPECT_TRUE(store.wait(ptrs).ok());
    store.release();
  };
  std::vector<int32_t> warm = {0};
  for (int32_t e = 2; e < 16; ++e) warm.push_back(e);
  use(1, warm);
  for (int i = 0; i < 3; ++i) use(1, std::vector<int32_t>(warm.begin() + 1, warm.end()));
  for (int i = 0; i < 4; ++i) use(0, {0});
  ASSERT_EQ(store.stats().total().misses, 16u) << "the sixteen slots filled, nothing evicted yet";
  use(1, {1, 0});
  const LayerStats t = store.stats().total();
  EXPECT_EQ(t.misses, 17u) << "only expert 1 is read";
  EXPECT_EQ(store.stats().evictions, 1u);
}

// A prefetch is a hint: expert ids out of range (and layers out of range) are ignored, the valid ones read.
TEST(ExpertStore, APrefetchIgnoresIdsOutOfRange) {
  const Opened o = open_model(kDemo);
  Result<std::unique_ptr<StreamedExperts>> opened =
      StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 32 * StreamedExperts::slab_bytes(*o.layout)});
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  StreamedExperts& store = *opened.value();
  const int32_t X = int32_t(o.layout->n_expert());
  store.prefetch(1, std::vector<int32_t>{-1, X, 3, X + 1000, INT32_MIN});
  store.prefetch(-1, std::vector<int32_t>{3});
  store.prefetch(o.layout->n_layer(), std::vector<int32_t>{3});
  EXPECT_EQ(store.stats().total().prefetch_issued, 1u);
  exercise(store, o, 9, 1);  // the store still serves the file's bytes
}

// A store that fails to open (here: a cache smaller than a layer) leaves the census as it was: neither replaced by an
// empty one of no model (the history lost) nor read past its counts; without a census file it creates none.
TEST(ExpertStore, AFailedOpenLeavesTheCensusAlone) {
  testing::TempDir dir;
  const Opened o = open_model(kDemo);
  const std::string census = dir.file("demo.census");
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 15 * slab, .census_path = census});
    ASSERT_FALSE(store.ok());
  }
  EXPECT_FALSE(std::filesystem::exists(census)) << "a failed open wrote a census";
  {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 64 * slab, .census_path = census});
    ASSERT_TRUE(store.ok()) << store.status().message();
    const std::vector<int32_t> hot = {3, 5};
    std::vector<ExpertPtrs> ptrs(2);
    std::vector<uint8_t> ready(2);
    store.value()->acquire(1, hot, ptrs, ready);
    ASSERT_TRUE(store.value()->wait(ptrs).ok());
    store.value()->release();
  }
  const std::vector<uint8_t> saved = testing::read_all(census);
  {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 15 * slab, .census_path = census});
    ASSERT_FALSE(store.ok());
  }
  EXPECT_EQ(testing::read_all(census), saved) << "a failed open rewrote the census";
  Result<Census> c = load_census(census, model_identity(*o.model), o.layout->n_layer(), o.layout->n_expert());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().total(), 2u);
}

// A census path that cannot be read is an error (it threw out of the reader: a directory there ended the process,
// at open and at every save), and a file longer than a census is refused.
TEST(ExpertStore, ACensusThatCannotBeReadIsAnError) {
  testing::TempDir dir;
  const Opened o = open_model(kDemo);
  const uint64_t id = model_identity(*o.model);
  std::filesystem::create_directories(dir.file("census.dir"));
  Result<Census> d = load_census(dir.file("census.dir"), id, o.layout->n_layer(), o.layout->n_expert());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("cannot read"), std::string::npos) << d.status().message();
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  {
    Result<std::unique_ptr<StreamedExperts>> store = StreamedExperts::open(
        *o.model, *o.layout,
        {.cache_bytes = 64 * slab, .census_path = dir.file("census.dir"), .census_save_seconds = 0});
    ASSERT_TRUE(store.ok()) << store.status().message();  // the census is ignored
    const std::vector<int32_t> hot = {3};
    std::vector<ExpertPtrs> ptrs(1);
    std::vector<uint8_t> ready(1);
    store.value()->acquire(1, hot, ptrs, ready);
    ASSERT_TRUE(store.value()->wait(ptrs).ok());
    store.value()->release();  // saves (the folder is writable; the rename over a directory fails: a message)
  }
  testing::write_all(dir.file("long.census"), std::vector<uint8_t>(1 << 20, 7));
  EXPECT_FALSE(load_census(dir.file("long.census"), id, o.layout->n_layer(), o.layout->n_expert()).ok());
}

// Processes sharing a model merge their counts under a lock: eight at once, each saving after every use, add up to
// every use (without the lock a quarter to a third of the counts were lost).
TEST(ExpertStore, ConcurrentCensusSavesAddUp) {
  testing::TempDir dir;
  const Opened o = open_model(kDemo);
  const std::string census = dir.file("demo.census");
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  constexpr int kProcesses = 8, kUses = 10;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      Result<std::unique_ptr<StreamedExperts>> store = StreamedExperts::open(
          *o.model, *o.layout,
          {.cache_bytes = 64 * slab, .census_path = census, .warm_start = false, .census_save_seconds = 0});
      if (!store.ok()) _exit(3);
      const std::vector<int32_t> hot = {3, 5};
      for (int i = 0; i < kUses; ++i) {
        std::vector<ExpertPtrs> ptrs(2);
        std::vector<uint8_t> ready(2);
        store.value()->acquire(1, hot, ptrs, ready);
        if (!store.value()->wait(ptrs).ok()) _exit(4);
        store.value()->release();
      }
      store.value().reset();
      _exit(0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  Result<Census> c = load_census(census, model_identity(*o.model), o.layout->n_layer(), o.layout->n_expert());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().counts[size_t(1 * 16 + 3)], uint64_t(kProcesses * kUses));
  EXPECT_EQ(c.value().total(), uint64_t(2 * kProcesses * kUses));
}

// The census's warm start is a hint, and the disk measurement at open a measurement: a read error in either (the
// file cut before the hot experts) is a warning, and the store opens (it failed to open, and the model with it).
TEST(ExpertStore, AWarmStartReadErrorOnlyEndsTheWarmStart) {
  testing::TempDir dir;
  const std::string copy = dir.file("demo.gguf");
  std::filesystem::copy_file(kDemo, copy);
  const Opened o = open_model(copy);
  const std::string census = dir.file("demo.census");
  const uint64_t slab = StreamedExperts::slab_bytes(*o.layout);
  const int64_t last = o.layout->n_layer() - 1;
  {
    Result<std::unique_ptr<StreamedExperts>> store =
        StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 64 * slab, .direct = false, .census_path = census});
    ASSERT_TRUE(store.ok());
    const std::vector<int32_t> hot = {3};
    std::vector<ExpertPtrs> ptrs(1);
    std::vector<uint8_t> ready(1);
    store.value()->acquire(last, hot, ptrs, ready);
    ASSERT_TRUE(store.value()->wait(ptrs).ok());
    store.value()->release();
  }
  std::filesystem::resize_file(copy, o.layout->extent(last, 0, Part::kGate).offset);
  Result<std::unique_ptr<StreamedExperts>> store =
      StreamedExperts::open(*o.model, *o.layout, {.cache_bytes = 64 * slab, .direct = false, .census_path = census});
  ASSERT_TRUE(store.ok()) << store.status().message();
}

TEST(ExpertStore, AFailedReadIsAnErrorNamingTheFile) {
  testing::TempDir dir;
  const std::string copy = dir.file("demo.gguf");
  std::filesystem::copy_file(kDemo, copy);
  const Opened o = open_model(copy);
  Result<std::unique_ptr<StreamedExperts>> store = StreamedExperts::open(
      *o.model, *o.layout, {.cache_bytes = 16 * StreamedExperts::slab_bytes(*o.layout), .direct = false});
  ASSERT_TRUE(store.ok());
  // Cut the file before the last layer's experts: their reads come back short.
  const Extent last = o.layout->extent(o.layout->n_layer() - 1, 0, Part::kGate);
  std::filesystem::resize_file(copy, last.offset);
  std::vector<int32_t> ids = {0};
  std::vector<ExpertPtrs> ptrs(1);
  std::vector<uint8_t> ready(1);
  store.value()->acquire(o.layout->n_layer() - 1, ids, ptrs, ready);
  const Status s = store.value()->wait(ptrs);
  store.value()->release();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("demo.gguf"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace magnetar::experts
