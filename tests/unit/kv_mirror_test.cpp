// kv::KvCache's device copy bookkeeping (kv/kv_cache.h, used by the CUDA forward pass) with a fake mirror that
// keeps its rows in host vectors: which rows each copy holds after forward passes, rewinds and disk restores,
// that reading the host (sync_host) downloads exactly the stale rows once, and that a disk checkpoint saved from a
// cache whose newest rows exist only on the "device" stores those rows, not the stale host ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "kv/disk_cache.h"
#include "kv/kv_cache.h"

namespace magnetar::kv {
namespace mirror_test {

constexpr int64_t kLayers = 2, kRow = 8, kCtx = 64;
constexpr size_t kRowBytes = kRow * sizeof(float);

// The "device": per layer K and V rows in vectors; download() copies into the cache's host rows and records
// the range.
class FakeMirror final : public KvCache::Mirror {
 public:
  FakeMirror() : k(kLayers, std::vector<float>(kCtx * kRow)), v(kLayers, std::vector<float>(kCtx * kRow)) {}
  void download(KvCache& cache, int64_t from, int64_t to) override {
    downloads.emplace_back(from, to);
    for (int64_t l = 0; l < kLayers; ++l) {
      std::memcpy(static_cast<uint8_t*>(cache.k(l)) + from * kRowBytes, k[l].data() + from * kRow, (to - from) * kRowBytes);
      std::memcpy(static_cast<uint8_t*>(cache.v(l)) + from * kRowBytes, v[l].data() + from * kRow, (to - from) * kRowBytes);
    }
  }
  // A forward pass on the device: rows [from, to) get values that name (layer, row, generation).
  void write(int64_t from, int64_t to, float generation) {
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t r = from; r < to; ++r) {
        for (int64_t i = 0; i < kRow; ++i) {
          k[l][r * kRow + i] = generation * 1000 + float(l * 100 + r);
          v[l][r * kRow + i] = -(generation * 1000 + float(l * 100 + r));
        }
      }
    }
  }
  std::vector<std::vector<float>> k, v;
  std::vector<std::pair<int64_t, int64_t>> downloads;
};

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST(KvMirror, TracksWhichCopyIsCurrent) {
  KvCache cache(quant::Type::F32, kLayers, kCtx, kRow);
  cache.sync_host(kCtx);  // no mirror: the host is the only copy, nothing to do
  auto owned = std::make_unique<FakeMirror>();
  FakeMirror* m = owned.get();
  cache.set_mirror(std::move(owned));
  EXPECT_EQ(cache.device_rows(), 0);

  m->write(0, 20, 1);
  cache.wrote_device(0, 20);  // a 20-token prefill on the device
  EXPECT_EQ(cache.device_rows(), 20);
  EXPECT_EQ(cache.host_rows(), 0);
  cache.sync_host(16);  // a checkpoint of one 16-token block
  cache.sync_host(16);  // nothing new: no second copy
  EXPECT_EQ(m->downloads, (Ranges{{0, 16}}));

  m->write(20, 21, 1);
  cache.wrote_device(20, 21);  // a decode step
  cache.sync_host(21);
  EXPECT_EQ(m->downloads, (Ranges{{0, 16}, {16, 21}}));

  m->write(10, 12, 2);
  cache.wrote_device(10, 12);  // the timeline rewound to 10 and recomputed two tokens
  EXPECT_EQ(cache.host_rows(), 10);
  cache.sync_host(12);
  EXPECT_EQ(m->downloads.back(), (std::pair<int64_t, int64_t>{10, 12}));
  EXPECT_EQ(static_cast<float*>(cache.k(1))[11 * kRow], 2000.0f + 111.0f);

  cache.wrote_host(12, 32);  // a disk restore filled rows 12..31 of the host copy
  EXPECT_EQ(cache.host_rows(), 32);
  EXPECT_EQ(cache.device_rows(), 12);  // the device must receive them before computing from row 32
  cache.copied_to_device(32);
  EXPECT_EQ(cache.device_rows(), 32);
  cache.sync_host(32);  // both current: nothing to download
  EXPECT_EQ(m->downloads.size(), 3u);

  cache.set_mirror(std::make_unique<FakeMirror>());  // a new device copy starts empty
  EXPECT_EQ(cache.device_rows(), 0);
}

TEST(KvMirror, CheckpointSavesTheDeviceRows) {
  const std::string dir = ::testing::TempDir() + "kv_mirror_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const KvFormat format{.model_identity = 7, .type = quant::Type::F32, .n_layer = kLayers, .row_elements = kRow};
  auto disk = DiskCache::open({.dir = dir, .budget_bytes = 1ull << 30, .block_tokens = 16}, format);
  ASSERT_TRUE(disk.ok()) << disk.status().message();
  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 3 + 1);

  KvCache on_gpu(quant::Type::F32, kLayers, kCtx, kRow);  // host rows stay zero: only the "device" computes
  auto owned = std::make_unique<FakeMirror>();
  FakeMirror* m = owned.get();
  on_gpu.set_mirror(std::move(owned));
  m->write(0, 40, 3);
  on_gpu.wrote_device(0, 40);
  ASSERT_TRUE(disk.value()->save(tokens, 40, on_gpu).ok());  // blocks [0, 16) and [16, 32)
  EXPECT_EQ(m->downloads, (Ranges{{0, 32}}));

  KvCache fresh(quant::Type::F32, kLayers, kCtx, kRow);
  ASSERT_EQ(disk.value()->restore(tokens, 0, 32, fresh), 32);
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t r = 0; r < 32; ++r) {
      ASSERT_EQ(static_cast<float*>(fresh.k(l))[r * kRow], 3000.0f + float(l * 100 + r)) << "layer " << l << " row " << r;
      ASSERT_EQ(static_cast<float*>(fresh.v(l))[r * kRow], -(3000.0f + float(l * 100 + r)));
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace mirror_test
}  // namespace magnetar::kv
