// Disk KV restore throughput (kv/disk_cache.h) against the disk's own sequential read bandwidth, on KV of a
// realistic geometry (default: Qwen3-235B-A22B, 94 layers x 4 KV heads x 128 x K+V in f16 = 188 KiB per token).
//
//   magnetar_bench_kv DIR [--layers 94] [--row 512] [--block 2048] [--blocks 8] [--reps 5]
//
// Saves one timeline of `blocks` full blocks from a KV cache filled with random bytes, then per repetition:
// drops the page cache (root; otherwise says so), reads every block file raw (O_DIRECT, 64 MiB requests, queue
// depth 1: the disk's bandwidth for this data) and, after dropping the cache again, restores the timeline into a
// fresh KV cache through a new DiskCache (a restart: the directory is scanned). Prints medians and the ratio.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kv/disk_cache.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool drop_page_cache() {
  ::sync();
  FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (!f) return false;
  const bool ok = std::fputs("3\n", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// Reads `path` whole with O_DIRECT in 64 MiB requests; returns bytes read.
uint64_t raw_read(const std::string& path, uint8_t* buf, uint64_t buf_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return 0;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, buf_bytes, off_t(total));
    if (n <= 0) break;
    total += uint64_t(n);
  }
  ::close(fd);
  return total;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace magnetar;
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: magnetar_bench_kv DIR [--layers N] [--row N] [--block N] [--blocks N] [--reps N]\n");
    return 2;
  }
  const std::string dir = argv[1];
  int64_t layers = 94, row = 512, block = 2048, blocks = 8, reps = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (flag == "--layers") layers = v;
    else if (flag == "--row") row = v;
    else if (flag == "--block") block = v;
    else if (flag == "--blocks") blocks = v;
    else if (flag == "--reps") reps = v;
    else {
      std::fprintf(stderr, "magnetar_bench_kv: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (layers < 1 || row < 1 || block < 1 || blocks < 1 || reps < 1) {
    std::fprintf(stderr, "magnetar_bench_kv: every number must be >= 1\n");
    return 2;
  }
  std::filesystem::remove_all(dir);
  const int64_t n_ctx = block * blocks;
  const kv::KvFormat format{.model_identity = 42, .type = quant::Type::F16, .n_layer = layers, .row_elements = row};
  const kv::DiskCacheOptions options{.dir = dir, .budget_bytes = 1ull << 50, .block_tokens = block};

  kv::KvCache source(quant::Type::F16, layers, n_ctx, row);
  std::mt19937_64 rng(1);
  for (int64_t l = 0; l < layers; ++l) {
    for (void* p : {source.k(l), source.v(l)}) {
      auto* w = static_cast<uint64_t*>(p);
      for (int64_t i = 0; i < n_ctx * row * 2 / 8; ++i) w[i] = rng();
    }
  }
  std::vector<int32_t> tokens(static_cast<size_t>(n_ctx));
  for (int32_t& t : tokens) t = int32_t(rng() % 150000);

  auto cache = kv::DiskCache::open(options, format);
  if (!cache.ok()) {
    std::fprintf(stderr, "magnetar_bench_kv: %s\n", cache.status().message().c_str());
    return 1;
  }
  const Clock::time_point t_save = Clock::now();
  if (Status s = cache.value()->save(tokens, n_ctx, source); !s.ok()) {
    std::fprintf(stderr, "magnetar_bench_kv: %s\n", s.message().c_str());
    return 1;
  }
  const double save_s = since(t_save);
  const uint64_t bytes = cache.value()->stats().bytes_on_disk;
  std::printf("kv geometry: %lld layers x %lld elements x K+V, f16 = %.1f KiB per token; %lld blocks of %lld tokens, "
              "%.2f GiB on disk (%.2f MiB per block)\n",
              (long long)layers, (long long)row, double(layers * row * 4) / 1024, (long long)blocks, (long long)block,
              double(bytes) / double(1ull << 30), double(cache.value()->block_file_bytes()) / double(1 << 20));
  std::printf("save (write + fsync, from a warm KV cache): %.2f s, %.0f MB/s\n", save_s, double(bytes) / save_s / 1e6);
  cache.value().reset();

  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, 64ull << 20));
  std::memset(buf, 0, 64ull << 20);
  kv::KvCache restored(quant::Type::F16, layers, n_ctx, row);
  bool dropped = true;
  std::vector<double> raw_mbs, restore_mbs;
  for (int64_t r = 0; r < reps; ++r) {
    dropped = drop_page_cache() && dropped;
    Clock::time_point t0 = Clock::now();
    uint64_t got = 0;
    for (const std::string& f : files) got += raw_read(f, buf, 64ull << 20);
    raw_mbs.push_back(double(got) / since(t0) / 1e6);

    dropped = drop_page_cache() && dropped;
    t0 = Clock::now();
    auto again = kv::DiskCache::open(options, format);
    if (!again.ok()) return 1;
    const int64_t n = again.value()->restore(tokens, 0, n_ctx, restored);
    const double dt = since(t0);
    if (n != n_ctx) {
      std::fprintf(stderr, "magnetar_bench_kv: restored %lld of %lld tokens\n", (long long)n, (long long)n_ctx);
      return 1;
    }
    restore_mbs.push_back(double(again.value()->stats().bytes_read) / dt / 1e6);
    std::printf("rep %lld: raw O_DIRECT read %.0f MB/s, restore %.0f MB/s\n", (long long)r, raw_mbs.back(),
                restore_mbs.back());
  }
  for (int64_t l = 0; l < layers; ++l) {
    if (std::memcmp(source.k(l), restored.k(l), size_t(n_ctx * row * 2)) != 0 ||
        std::memcmp(source.v(l), restored.v(l), size_t(n_ctx * row * 2)) != 0) {
      std::fprintf(stderr, "magnetar_bench_kv: restored rows differ from the saved ones (layer %lld)\n", (long long)l);
      return 1;
    }
  }
  if (!dropped) std::printf("warning: could not drop the page cache (not root): reads may be served from memory\n");
  const double raw = median(raw_mbs), rest = median(restore_mbs);
  std::printf("median of %lld: raw read %.0f MB/s, restore %.0f MB/s = %.0f%% of raw\n", (long long)reps, raw, rest,
              100 * rest / raw);
  std::free(buf);
  std::filesystem::remove_all(dir);
  return 0;
}
