// CUDA attention benchmarks (Google Benchmark, manual time from CUDA events) on the Qwen3-30B-A3B attention shape
// (32 query heads, 4 KV heads, head_dim 128, F16 KV: 2 KiB of K and V per cached row):
//   attention_decode/ctx<C>        cuda::attention of one token over C cached rows, as a decode graph queues it
//                                  (position read from device memory, grid sized for kMaxCtx rows): the baseline
//   attention_decode_mma/ctx<C>    the same on cuda::attention_decode_mma (tensor cores)
//   attention_decode_mma_q8/ctx<C> the same over a Q8_0 cache (34 bytes per 32 elements: 53% of the bytes); the
//                                  host position is the device's, so the kernel variant is the model's (12 warps
//                                  at head_dim 128: cuda::attention_decode_variant)
//   attention_decode_mma_f8/ctx<C> the same over an FP8 E4M3 cache (quant::Type::F8_E4M3, a byte per element: 50% of
//                                  the bytes; the F16 regions' bytes read as e4m3, NaN codes included: the time
//                                  does not depend on the values)
//   attention_decode_mma_one_kv/ctx<C>  the F16 bytes of C rows as 4 C rows of one KV head (8 query heads): each
//                                  CTA's rows contiguous (4 KV heads: a quarter of every 1 KiB row per CTA); its plan
//                                  has 4x the splits per KV head, so its last CTA merges 4x the records
//   attention_prefill_mma/ctx<C>   cuda::attention_prefill_mma of a kChunk-token chunk after C cached rows
//   attention_prefill_rows/ctx<C>  the same chunk on cuda::attention (per-token CTAs): the baseline
// One iteration replays a CUDA graph of `copies` calls, each over its own region of K/V (>= kFootprintBytes in all,
// so K/V come from HBM, not from the H200's 50 MB L2). Counters: us_per_call; kv_GBps = the K/V bytes one call must
// read at least once / us_per_call, roofline_pct of that against 4.8 TB/s; TFLOPS = 4 * n_head * head_dim * (query,
// key) pairs / us_per_call (scores and p * V; the H200's dense f16 tensor peak is ~990).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "bench/cuda/cuda_bench.h"
#include "quant/fp16.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

constexpr int64_t kHeads = 32, kHeadsKv = 4, kHeadDim = 128;
constexpr int64_t kRowElems = kHeadsKv * kHeadDim;          // per cached row, K or V
constexpr int64_t kMaxCtx = 65536 + 2048;                    // rows of one region
constexpr size_t kFootprintBytes = size_t(1) << 30;          // K and V bytes read per graph, >= 20x L2
constexpr int64_t kChunk = 2048;                             // prefill chunk (bench --batch 2048)
constexpr double kRooflineGBps = 4800.0;                     // H200 HBM3e, vendor datasheet
constexpr int64_t kContexts[] = {512, 2048, 16384, 65536};

using bench::GraphTimer;
using bench::must;
using bench::must_ok;

// Device buffers shared by every benchmark: K and V of `regions` regions of kMaxCtx rows (Gaussian values, 4,096
// random rows tiled), the queries of a prefill chunk, the output and the decode position.
struct Setup {
  int64_t regions = 0;
  cuda::Stream stream;
  cuda::DeviceBuffer k, v, q, out, positions;
  cuda::AttentionWorkspace workspace;
};

Setup& setup() {
  static Setup* s = [] {
    auto* s = new Setup;
    s->regions = 4;  // 4 x 66K rows x 2 KiB = 544 MiB of K and V
    const size_t region_bytes = size_t(kMaxCtx * kRowElems) * 2;
    s->stream = must(cuda::Stream::create(), "stream");
    s->k = must(cuda::DeviceBuffer::allocate(region_bytes * size_t(s->regions)), "k");
    s->v = must(cuda::DeviceBuffer::allocate(region_bytes * size_t(s->regions)), "v");
    std::mt19937_64 gen(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> tile(size_t(4096 * kRowElems));
    for (uint16_t& h : tile) h = quant::float_to_fp16(dist(gen));
    const size_t tile_bytes = tile.size() * 2;
    for (size_t off = 0; off < region_bytes * size_t(s->regions); off += tile_bytes) {
      const size_t n = std::min(tile_bytes, region_bytes * size_t(s->regions) - off);
      must_ok(s->k.upload(tile.data(), n, off), "upload k");
      must_ok(s->v.upload(tile.data(), n, off), "upload v");
    }
    std::vector<float> q(size_t(kChunk * kHeads * kHeadDim));
    for (float& f : q) f = dist(gen);
    s->q = must(cuda::DeviceBuffer::allocate(q.size() * sizeof(float)), "q");
    must_ok(s->q.upload(q.data(), q.size() * sizeof(float)), "upload q");
    s->out = must(cuda::DeviceBuffer::allocate(q.size() * sizeof(float)), "out");
    s->positions = must(cuda::DeviceBuffer::allocate(sizeof(int32_t)), "positions");
    s->workspace = must(cuda::AttentionWorkspace::create(kHeads, kHeadDim), "workspace");
    return s;
  }();
  return *s;
}

// Captures `copies` calls of queue(k, v) into a graph, each call's K/V a distinct window of `rows` rows of the
// regions while there are enough of them (then round-robin), and times graph launches with CUDA events; returns the
// seconds per call.
template <typename Queue>
double time_per_call(benchmark::State& state, Setup& s, int64_t rows, int64_t copies, Queue queue) {
  const int64_t per_region = kMaxCtx / rows, windows = per_region * s.regions;
  cuda::Graph::begin_capture(s.stream);
  for (int64_t c = 0; c < copies; ++c) {
    const int64_t w = c % windows;
    const size_t off = size_t((w / per_region) * kMaxCtx + (w % per_region) * rows) * size_t(kRowElems);
    queue(s.k.as<uint16_t>() + off, s.v.as<uint16_t>() + off);
  }
  cuda::Graph graph = must(cuda::Graph::end_capture(s.stream), "capture");
  GraphTimer timer;
  graph.launch(s.stream);  // warm-up: the first launch uploads the graph
  s.stream.synchronize();
  double total = 0;
  for (auto _ : state) {
    const double seconds = timer.seconds(graph, s.stream);
    state.SetIterationTime(seconds);
    total += seconds;
  }
  state.SetLabel(std::to_string(copies) + " calls per graph");
  const double calls = double(state.iterations()) * double(copies);
  return calls > 0 ? total / calls : 0;
}

cuda::AttentionArgs args_for(Setup& s, const uint16_t* k, const uint16_t* v, int64_t n_tok, int64_t pos0) {
  return {.q = s.q.as<float>(),
          .k_cache = k,
          .v_cache = v,
          .out = s.out.as<float>(),
          .n_tok = n_tok,
          .pos0 = pos0,
          .n_head = kHeads,
          .n_head_kv = kHeadsKv,
          .head_dim = kHeadDim,
          .scale = float(1.0 / std::sqrt(double(kHeadDim)))};
}

// kv_row_bytes: a cached row's bytes (F16: 2 per element; Q8_0: 34 per 32).
void counters(benchmark::State& state, double seconds, int64_t ctx_rows, double pairs,
              double kv_row_bytes = 2.0 * double(kRowElems)) {
  const double kv_bytes = double(ctx_rows) * kv_row_bytes * 2.0;  // K and V
  const double gbps = seconds > 0 ? kv_bytes / seconds / 1e9 : 0;
  state.counters["us_per_call"] = seconds * 1e6;
  state.counters["kv_GBps"] = gbps;
  state.counters["roofline_pct"] = 100.0 * gbps / kRooflineGBps;
  state.counters["TFLOPS"] = seconds > 0 ? 4.0 * double(kHeads * kHeadDim) * pairs / seconds / 1e12 : 0;
}

// q8 (mma only): the regions read as a Q8_0 cache (the F16 tile's bytes as blocks: finite scales), each call's K/V
// at the same offsets as the F16 case (rows of 544 bytes from there: a distinct window per call still). one_kv (mma,
// F16): the same bytes laid out for one KV head of 8 query heads, 4 ctx rows of 256 bytes, so that a CTA's rows are
// contiguous in memory (with 4 KV heads each CTA reads one 256-byte quarter of every 1 KiB row).
void bm_decode(benchmark::State& state, int64_t ctx, bool mma, bool q8, bool one_kv, bool f8) {
  Setup& s = setup();
  const int64_t rows = one_kv ? kHeadsKv * ctx : ctx;
  const int32_t pos = int32_t(rows - 1);
  must_ok(s.positions.upload(&pos, sizeof pos), "position");
  const int64_t copies = std::max<int64_t>(8, int64_t(kFootprintBytes / size_t(ctx * kRowElems * 4)));
  const double seconds = time_per_call(state, s, ctx, copies, [&](const uint16_t* k, const uint16_t* v) {
    cuda::AttentionArgs a = args_for(s, k, v, 1, rows - 1);  // the host position picks the kernel variant
    if (one_kv) {
      a.n_head = kHeads / kHeadsKv;
      a.n_head_kv = 1;
    }
    a.pos0_device = s.positions.as<int32_t>();
    a.max_rows = rows;
    if (q8) a.kv_type = quant::Type::Q8_0;
    if (f8) a.kv_type = quant::Type::F8_E4M3;
    must_ok(mma ? cuda::attention_decode_mma(a, s.workspace, s.stream) : cuda::attention(a, s.workspace, s.stream),
            "attention");
  });
  // one_kv: 8 heads x 4 ctx rows, the bytes and (query, key) pairs of 32 heads x ctx rows
  const double row_bytes =
      f8 ? double(kRowElems) : double(quant::row_size(q8 ? quant::Type::Q8_0 : quant::Type::F16, kRowElems));
  counters(state, seconds, ctx, double(ctx), row_bytes);
}

void bm_prefill(benchmark::State& state, int64_t ctx, bool mma) {
  Setup& s = setup();
  const int64_t copies = 2;
  const double seconds = time_per_call(state, s, ctx + kChunk, copies, [&](const uint16_t* k, const uint16_t* v) {
    const cuda::AttentionArgs a = args_for(s, k, v, kChunk, ctx);
    must_ok(mma ? cuda::attention_prefill_mma(a, s.stream) : cuda::attention(a, s.workspace, s.stream), "attention");
  });
  counters(state, seconds, ctx + kChunk, double(kChunk) * double(ctx) + double(kChunk) * double(kChunk + 1) / 2);
}

void register_all() {
  for (const int64_t ctx : kContexts) {
    for (const int arm : {0, 1, 3, 2}) {  // tensor cores over F16, over Q8_0, over FP8; FP32 cores over F16
      const bool mma = arm != 2, q8 = arm == 1, f8 = arm == 3;
      const std::string name = std::string(arm == 0   ? "attention_decode_mma/ctx"
                                           : arm == 1 ? "attention_decode_mma_q8/ctx"
                                           : arm == 3 ? "attention_decode_mma_f8/ctx"
                                                      : "attention_decode/ctx") +
                               std::to_string(ctx);
      benchmark::RegisterBenchmark(name.c_str(), bm_decode, ctx, mma, q8, false, f8)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const int64_t ctx : {int64_t(16384), int64_t(65536)}) {
    const std::string name = "attention_decode_mma_one_kv/ctx" + std::to_string(ctx);
    benchmark::RegisterBenchmark(name.c_str(), bm_decode, ctx, true, false, true, false)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (const int64_t ctx : {int64_t(0), int64_t(16384), int64_t(65536)}) {
    for (const bool mma : {true, false}) {
      const std::string name =
          std::string(mma ? "attention_prefill_mma/ctx" : "attention_prefill_rows/ctx") + std::to_string(ctx);
      benchmark::RegisterBenchmark(name.c_str(), bm_prefill, ctx, mma)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace magnetar

int main(int argc, char** argv) {
  return magnetar::bench::cuda_main(argc, argv, "magnetar_bench_cuda_attention", magnetar::register_all, "kv",
                                    "32/4 heads x 128, F16; >= 1 GiB of K/V read per timed graph (HBM, not L2)");
}
