// What the CUDA benchmarks (bench/cuda/) share: setup steps that abort with a message when they fail (a
// benchmark without its device buffers has nothing to measure), and Google Benchmark's main().
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "backends/cuda/cuda_backend.h"
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
