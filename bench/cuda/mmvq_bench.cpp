// CUDA matrix-vector benchmarks (Google Benchmark, manual time from CUDA events), one per (weight type,
// shape, activation vectors):
//   matvec/<TYPE>/<rows>x<cols>/v<n>   cuda::matvec of a [rows, cols] weight matrix with n float32 vectors,
//                                      activation quantization included (two kernels per matvec)
//   matvec_preq/<TYPE>/...             the same from activations quantized beforehand (x_quantized: one
//                                      kernel), the case of matrices that share an x (q/k/v, gate/up, experts)
//   prefill_mmq/<TYPE>/<rows>x<cols>/n<n> cuda::matmul_q (int8 tensor cores) of n activation rows quantized
//                                      beforehand: the prefill path for quantized types
//   prefill_mmvq/<TYPE>/...            the same product as n / 8 matvec launches of 8 rows: the baseline
//                                      (prefill before mmq)
// Shapes: 4096 x 4096 (7B-class projections) and 2048 x 7168 (a DeepSeek-V3-sized row length).
// Prefill counters: us_per_product and int8_TOPS = 2 rows cols n / time (the H200's dense int8 peak is 1,979).
//
// The weights must stream from HBM, as a decode step's do, not from the H200's 50 MB L2 (a 4096 x 4096 Q4_0
// matrix is 9.4 MB): the benchmark keeps enough distinct copies of the matrix for >= kFootprintBytes and one
// iteration replays a CUDA graph of one matvec per copy, so no copy is still in L2 when it is read again,
// and launch overhead (the CPU side of a launch takes longer than a 2 us matvec) is out of the measurement.
// Time per iteration is cudaEventElapsedTime around the graph launch (the Time column: one graph of
// `copies` matvecs). Counters: us_per_matvec = that time / copies; weight_GBps = weight bytes of one matvec
// / us_per_matvec; roofline_pct = that over the H200's nominal 4.8 TB/s HBM3e bandwidth (bytes_per_second
// is the same figure in bytes).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "bench/cuda/cuda_bench.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

using quant::Type;
using quant::TypeTraits;

constexpr size_t kFootprintBytes = size_t(1) << 30;  // >= 20x the H200's L2
constexpr int64_t kMaxCopies = 512;
constexpr int64_t kDistinctRows = 16;      // rows quantized by the reference, then tiled (as bench/quant_bench)
constexpr double kRooflineGBps = 4800.0;   // H200 HBM3e, vendor datasheet
constexpr int64_t kVectorCounts[] = {1, 4};
constexpr int64_t kPrefillRows = 512;  // pp512's chunk
constexpr Type kPrefillTypes[] = {Type::Q4_0, Type::Q8_0, Type::Q4_K, Type::Q6_K};

struct Shape {
  int64_t rows;
  int64_t cols;
};
constexpr Shape kShapes[] = {{4096, 4096}, {2048, 7168}};

// Everything one (type, shape) needs on the device; the benchmarks of one (type, shape) share it.
struct Setup {
  Type type;
  Shape shape;
  size_t matrix_bytes = 0;
  size_t copy_stride = 0;  // matrix_bytes rounded up to 256
  int64_t copies = 0;
  cuda::Stream stream;
  cuda::DeviceBuffer weights;  // [copies, copy_stride]
  cuda::DeviceBuffer x;        // [kPrefillRows, cols] float32
  cuda::DeviceBuffer y;        // [kPrefillRows, rows] float32
  cuda::DeviceBuffer xq;       // x quantized to the type's activation format (quantized types)
  cuda::MatvecWorkspace workspace;
};

std::vector<float> gaussian(std::mt19937_64& gen, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(gen);
  return v;
}

using bench::must;
using bench::must_ok;

std::unique_ptr<Setup> build_setup(Type type, Shape shape) {
  const TypeTraits& t = quant::traits(type);
  auto s = std::make_unique<Setup>();
  s->type = type;
  s->shape = shape;
  const size_t row_bytes = quant::row_size(type, shape.cols);
  s->matrix_bytes = row_bytes * size_t(shape.rows);
  s->copy_stride = (s->matrix_bytes + 255) / 256 * 256;
  s->copies = std::clamp<int64_t>(int64_t((kFootprintBytes + s->matrix_bytes - 1) / s->matrix_bytes), 2, kMaxCopies);

  std::mt19937_64 gen(uint64_t(type) + 1);
  const std::vector<float> source = gaussian(gen, kDistinctRows * shape.cols);
  std::vector<uint8_t> tile(size_t(kDistinctRows) * row_bytes);
  t.from_float(source.data(), tile.data(), kDistinctRows * shape.cols);
  std::vector<uint8_t> matrix(s->matrix_bytes);
  for (int64_t r = 0; r < shape.rows; ++r) {
    std::memcpy(matrix.data() + size_t(r) * row_bytes, tile.data() + size_t(r % kDistinctRows) * row_bytes, row_bytes);
  }

  s->stream = must(cuda::Stream::create(), "stream");
  s->weights = must(cuda::DeviceBuffer::allocate(s->copy_stride * size_t(s->copies)), "weights");
  for (int64_t c = 0; c < s->copies; ++c) {
    must_ok(s->weights.upload(matrix.data(), matrix.size(), size_t(c) * s->copy_stride), "upload");
  }
  const std::vector<float> x = gaussian(gen, kPrefillRows * shape.cols);
  s->x = must(cuda::DeviceBuffer::allocate(x.size() * sizeof(float)), "x");
  must_ok(s->x.upload(x.data(), x.size() * sizeof(float)), "upload x");
  s->y = must(cuda::DeviceBuffer::allocate(size_t(kPrefillRows * shape.rows) * sizeof(float)), "y");
  s->workspace = must(cuda::MatvecWorkspace::create(shape.cols, cuda::kMaxMatvecVectors), "workspace");
  if (t.is_quantized) {
    const size_t act_row = quant::row_size(t.vec_dot_type, shape.cols);
    s->xq = must(cuda::DeviceBuffer::allocate(act_row * size_t(kPrefillRows)), "xq");
    must_ok(cuda::quantize_activations(t.vec_dot_type, s->x.as<float>(), s->xq.data(), shape.cols, kPrefillRows,
                                       s->stream),
            "quantize_activations");
    s->stream.synchronize();
  }
  return s;
}

// Benchmarks are registered grouped by (type, shape): keeping only the latest setup bounds device memory.
Setup& setup(Type type, Shape shape) {
  static std::unique_ptr<Setup> cached;
  if (!cached || cached->type != type || cached->shape.rows != shape.rows || cached->shape.cols != shape.cols) {
    cached.reset();
    cached = build_setup(type, shape);
  }
  return *cached;
}

// Captures one call of `queue(c)` per weight copy c into a graph, then times graph launches with CUDA events.
// Returns the seconds per call (one product on one copy).
template <typename Queue>
double time_per_copy(benchmark::State& state, Setup& s, Queue queue) {
  cudaStream_t stream = s.stream.raw();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int64_t c = 0; c < s.copies; ++c) queue(s.weights.as<uint8_t>() + size_t(c) * s.copy_stride);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up: first launch uploads the graph
  CUDA_CHECK(cudaStreamSynchronize(stream));

  double total_seconds = 0;
  for (auto _ : state) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(double(ms) * 1e-3);  // one graph: s.copies products
    total_seconds += double(ms) * 1e-3;
  }
  state.SetLabel(std::to_string(s.copies) + " copies of " + std::to_string(s.matrix_bytes) + " B");
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  const double calls = double(state.iterations()) * double(s.copies);
  return calls > 0 ? total_seconds / calls : 0;
}

void bm_matvec(benchmark::State& state, Type type, Shape shape, int64_t n_vectors, bool prequantized) {
  Setup& s = setup(type, shape);
  const double seconds = time_per_copy(state, s, [&](const uint8_t* weights) {
    const cuda::MatvecArgs args{.type = type,
                                .weights = weights,
                                .rows = shape.rows,
                                .cols = shape.cols,
                                .x = s.x.as<float>(),
                                .y = s.y.as<float>(),
                                .n_vectors = n_vectors,
                                .x_quantized = prequantized ? s.xq.data() : nullptr};
    must_ok(cuda::matvec(args, s.workspace, s.stream), "matvec");
  });
  const double gbps = seconds > 0 ? double(s.matrix_bytes) / seconds / 1e9 : 0;
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(s.copies)) * int64_t(s.matrix_bytes));
  state.counters["us_per_matvec"] = seconds * 1e6;
  state.counters["weight_GBps"] = gbps;
  state.counters["roofline_pct"] = 100.0 * gbps / kRooflineGBps;
}

// n activation rows (quantized beforehand) through one weight matrix: mmq, or matvec launches of 8 rows.
void bm_prefill(benchmark::State& state, Type type, Shape shape, int64_t n, bool mmq) {
  Setup& s = setup(type, shape);
  const size_t act_row = quant::row_size(quant::traits(type).vec_dot_type, shape.cols);
  const double seconds = time_per_copy(state, s, [&](const uint8_t* weights) {
    if (mmq) {
      must_ok(cuda::matmul_q({.type = type, .weights = weights, .rows = shape.rows, .cols = shape.cols,
                              .x = s.xq.data(), .y = s.y.as<float>(), .n = n},
                             s.stream),
              "matmul_q");
      return;
    }
    for (int64_t c = 0; c < n; c += cuda::kMaxMatvecVectors) {
      const cuda::MatvecArgs args{.type = type,
                                  .weights = weights,
                                  .rows = shape.rows,
                                  .cols = shape.cols,
                                  .x = s.x.as<float>() + c * shape.cols,
                                  .y = s.y.as<float>() + c * shape.rows,
                                  .n_vectors = std::min(cuda::kMaxMatvecVectors, n - c),
                                  .x_quantized = s.xq.as<uint8_t>() + size_t(c) * act_row};
      must_ok(cuda::matvec(args, s.workspace, s.stream), "matvec");
    }
  });
  state.counters["us_per_product"] = seconds * 1e6;
  state.counters["int8_TOPS"] = seconds > 0 ? 2.0 * double(shape.rows * shape.cols * n) / seconds / 1e12 : 0;
}

void register_all() {
  for (const TypeTraits& t : quant::all_types()) {
    if (!quant::is_weight_type(t.type)) continue;
    for (const Shape& shape : kShapes) {
      for (bool prequantized : {false, true}) {
        if (prequantized && !t.is_quantized) continue;
        for (int64_t n : kVectorCounts) {
          const std::string name = std::string(prequantized ? "matvec_preq/" : "matvec/") + std::string(t.name) +
                                   "/" + std::to_string(shape.rows) + "x" + std::to_string(shape.cols) + "/v" +
                                   std::to_string(n);
          benchmark::RegisterBenchmark(name.c_str(), bm_matvec, t.type, shape, n, prequantized)
              ->UseManualTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  for (const Type type : kPrefillTypes) {
    for (const Shape& shape : kShapes) {
      for (bool mmq : {true, false}) {
        const std::string name = std::string(mmq ? "prefill_mmq/" : "prefill_mmvq/") +
                                 std::string(quant::traits(type).name) + "/" + std::to_string(shape.rows) + "x" +
                                 std::to_string(shape.cols) + "/n" + std::to_string(kPrefillRows);
        benchmark::RegisterBenchmark(name.c_str(), bm_prefill, type, shape, kPrefillRows, mmq)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace
}  // namespace magnetar

int main(int argc, char** argv) {
  return magnetar::bench::cuda_main(argc, argv, "magnetar_bench_cuda", magnetar::register_all, "weights",
                                    ">= 1 GiB of distinct matrix copies per benchmark (HBM, not L2)");
}
