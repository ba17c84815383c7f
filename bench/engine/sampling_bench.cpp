// Sampler::sample over a 151,936-token vocabulary (Qwen3's), Google Benchmark, one thread:
//   sample/<mode>     the sampler (engine/sampling.cpp: one pass selects the few best tokens, Sampler::select_top)
//   full_pass/<mode>  the baseline measured in the same run: what the sampler did before 2026-12-02, every
//                     (logit, id) pair copied, then std::min_element (greedy) or std::partial_sort of the top k
// mode: greedy (temperature 0) or default (SamplingParams' defaults: temperature 0.8, top-k 40, top-p 0.95,
// min-p 0.05). Logits ~N(0, 2.5), fixed seed. Both read the same logits row, which stays in cache between
// iterations; after a GPU decode step it comes from memory (the device-to-host copy's row).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace magnetar {
namespace {

constexpr size_t kVocab = 151936;

const std::vector<float>& logits() {
  static const std::vector<float> row = [] {
    std::mt19937 gen(7);
    std::normal_distribution<float> normal(0.0f, 2.5f);
    std::vector<float> v(kVocab);
    for (float& x : v) x = normal(gen);
    return v;
  }();
  return row;
}

SamplingParams params(bool greedy) {
  SamplingParams p;
  p.seed = 1;
  if (greedy) p.temperature = 0;
  return p;
}

void sample(benchmark::State& state, bool greedy) {
  Sampler s(params(greedy));
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(logits(), {}));
}

// The selection the sampler made before (no penalties, no filter): the rest of sample() is the same in both.
void full_pass(benchmark::State& state, bool greedy) {
  const SamplingParams p = params(greedy);
  const std::vector<float>& row = logits();
  std::vector<std::pair<float, int32_t>> c;
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (auto _ : state) {
    c.resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) c[i] = {row[i], int32_t(i)};
    if (greedy) {
      benchmark::DoNotOptimize(std::min_element(c.begin(), c.end(), by_logit)->second);
    } else {
      std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(), by_logit);
      benchmark::DoNotOptimize(c[0].second);
    }
  }
}

BENCHMARK_CAPTURE(sample, greedy, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_pass, greedy, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, default, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_pass, default, false)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace magnetar

BENCHMARK_MAIN();
