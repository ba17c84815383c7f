// What the CUDA benchmarks (bench/cuda/) share: setup steps that abort with a message when they fail (a
// benchmark without its device buffers has nothing to measure), and Google Benchmark's main().
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "base/status.h"

namespace magnetar::bench {

template <typename T>
T must(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "magnetar CUDA benchmark: %s: %s\n", what, r.status().message().c_str());
    std::abort();
  }
  return std::move(r).value();
}

inline void must_ok(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "magnetar CUDA benchmark: %s: %s\n", what, s.message().c_str());
    std::abort();
  }
}

// Times launches of a captured graph with CUDA events around each (the first launch uploads the graph: make one
// untimed first).
class GraphTimer {
 public:
  GraphTimer() {
    CUDA_CHECK(cudaEventCreate(&start_));
    CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~GraphTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  GraphTimer(const GraphTimer&) = delete;
  GraphTimer& operator=(const GraphTimer&) = delete;
  // Seconds of one launch of graph on stream.
  double seconds(cuda::Graph& graph, cuda::Stream& stream) {
    CUDA_CHECK(cudaEventRecord(start_, stream.raw()));
    graph.launch(stream);
    CUDA_CHECK(cudaEventRecord(stop_, stream.raw()));
    CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms) * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// main() of a CUDA benchmark binary `name`: registers its benchmarks and runs them, with one line of context;
// without a CUDA device it says so and measures nothing (exit 0).
inline int cuda_main(int argc, char** argv, const char* name, void (*register_all)(), const char* context_key,
                     const char* context_value) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (cuda::device_count() == 0) {
    std::printf("%s: no CUDA device, nothing measured\n", name);
    return 0;
  }
  register_all();
  benchmark::AddCustomContext(context_key, context_value);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace magnetar::bench
