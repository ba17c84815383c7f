// CPU attention benchmarks (Google Benchmark, wall time) on the Qwen3-30B-A3B attention shape (32 query heads over
// 4 KV heads of 128) with the default thread pool (one thread per core):
//   attention/<f16|q8_0|fp8>/ctx:<C>/tok:<T>  cpu::attention of T tokens after C - T cached rows: T = 1 a decode step,
//                                         T > 1 a prefill chunk at that depth
//   read_floor/ctx:<C>                    the same threads summing the F16 K and V bytes of C rows: what memory gives
// Every iteration takes the next of several layers' caches (at least kMinCacheBytes in all), so the rows come from
// DRAM as in a model's forward pass rather than from a cache that one layer's rows would fit in. Bytes per second
// count the K and V rows read once per step (the floor of the decode step).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cpu/threadpool.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

constexpr int64_t kHead = 32, kHeadKv = 4, kDim = 128;
constexpr size_t kMinCacheBytes = size_t(256) << 20;  // 8x the CPU box's 32 MiB L3

cpu::ThreadPool& pool() {
  static cpu::ThreadPool p(int(std::max(1u, std::thread::hardware_concurrency())));
  return p;
}

struct Caches {
  quant::Type type;
  int64_t ctx = 0;
  size_t layer_bytes = 0;  // K (or V) bytes of one layer
  int layers = 0;
  std::vector<uint8_t> k, v;  // [layers][layer_bytes]
};

const Caches& caches(quant::Type type, int64_t ctx) {
  static std::unique_ptr<Caches> cached;
  if (cached && cached->type == type && cached->ctx == ctx) return *cached;
  cached.reset();
  auto c = std::make_unique<Caches>();
  c->type = type;
  c->ctx = ctx;
  const int64_t row = kHeadKv * kDim;
  c->layer_bytes = quant::row_size(type, row) * size_t(ctx);
  c->layers = int(std::max<size_t>(2, (kMinCacheBytes / 2 + c->layer_bytes - 1) / c->layer_bytes));
  c->k.resize(c->layer_bytes * size_t(c->layers));
  c->v.resize(c->k.size());
  std::mt19937_64 gen{uint64_t(ctx)};
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> rows(size_t(row) * 64);
  for (float& f : rows) f = dist(gen);
  const size_t block = quant::row_size(type, row) * 64;  // 64 distinct rows, tiled
  for (uint8_t* base : {c->k.data(), c->v.data()}) {
    cpu::store_kv(rows.data(), 64, row, type, base, 0);
    for (size_t off = block; off < c->k.size(); off += block) {
      std::copy_n(base, std::min(block, c->k.size() - off), base + off);
    }
  }
  cached = std::move(c);
  return *cached;
}

void bm_attention(benchmark::State& state, quant::Type type) {
  const int64_t ctx = state.range(0), n_tok = state.range(1);
  const Caches& c = caches(type, ctx);
  std::mt19937_64 gen(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(size_t(n_tok * kHead * kDim)), out(q.size());
  for (float& f : q) f = dist(gen);
  std::vector<float> scratch(cpu::attention_scratch_floats(ctx, kHead, kHeadKv, kDim, pool().size()));
  int layer = 0;
  for (auto _ : state) {
    cpu::attention(pool(), {.q = q.data(), .k_cache = c.k.data() + size_t(layer) * c.layer_bytes,
                            .v_cache = c.v.data() + size_t(layer) * c.layer_bytes, .kv_type = type, .out = out.data(),
                            .n_tok = n_tok, .pos0 = ctx - n_tok, .n_head = kHead, .n_head_kv = kHeadKv,
                            .head_dim = kDim, .scale = float(1.0 / std::sqrt(double(kDim))),
                            .scratch = scratch.data()});
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % c.layers;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * c.layer_bytes));
}

void bm_read_floor(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  const Caches& c = caches(quant::Type::F16, ctx);
  int layer = 0;
  uint64_t sums[64] = {};
  for (auto _ : state) {
    pool().run([&](int ith, int nth) {
      uint64_t acc[4] = {};  // four lanes the compiler keeps in one vector register
      for (const uint8_t* base : {c.k.data(), c.v.data()}) {
        const uint64_t* p = reinterpret_cast<const uint64_t*>(base + size_t(layer) * c.layer_bytes);
        const size_t words = c.layer_bytes / 8;
        const size_t lo = words * size_t(ith) / size_t(nth) / 4 * 4, hi = words * size_t(ith + 1) / size_t(nth) / 4 * 4;
        for (size_t i = lo; i < hi; i += 4) {
          for (int l = 0; l < 4; ++l) acc[l] += p[i + l];
        }
      }
      sums[ith % 64] += acc[0] + acc[1] + acc[2] + acc[3];
    });
    benchmark::DoNotOptimize(sums);
    layer = (layer + 1) % c.layers;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * c.layer_bytes));
}

void register_all() {
  for (quant::Type type : {quant::Type::F16, quant::Type::Q8_0, quant::Type::F8_E4M3}) {
    const char* name = type == quant::Type::F16    ? "attention/f16"
                       : type == quant::Type::Q8_0 ? "attention/q8_0"
                                                   : "attention/fp8";
    auto* b = benchmark::RegisterBenchmark(name, bm_attention, type);
    b->ArgNames({"ctx", "tok"})->UseRealTime()->Unit(benchmark::kMicrosecond);
    for (int64_t ctx : {4096, 16384}) b->Args({ctx, 1});
    b->Args({4096, 64});
  }
  benchmark::RegisterBenchmark("read_floor", bm_read_floor)
      ->ArgNames({"ctx"})
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond)
      ->Arg(4096)
      ->Arg(16384);
}

}  // namespace
}  // namespace magnetar

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  magnetar::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
