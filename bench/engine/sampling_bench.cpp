// Sampler::sample over a 151,936-token vocabulary (Qwen3's), Google Benchmark, one thread:
//   sample/<mode>     the sampler (engine/sampling.cpp: one pass selects the few best tokens, Sampler::select_top)
//   full_pass/<mode>  the baseline measured in the same run: what the sampler did before 2026-12-02, every
//                     (logit, id) pair copied, then std::min_element (greedy) or std::partial_sort of the top k
// mode: greedy (temperature 0), default (SamplingParams' defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05)
// or no_top_k (the defaults with top-k 0: every token sorted before, now the softmax's sum over all and only the best
// sorted); penalties/<how> below. Logits ~N(0, 2.5), fixed seed. Both read the same logits row, which stays in cache
// between iterations; after a GPU decode step it comes from memory (the device-to-host copy's row).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <span>
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

enum Mode { kGreedy, kDefault, kNoTopK };

SamplingParams params(Mode mode) {
  SamplingParams p;
  p.seed = 1;
  if (mode == kGreedy) p.temperature = 0;
  if (mode == kNoTopK) p.top_k = 0;
  return p;
}

void sample(benchmark::State& state, Mode mode) {
  Sampler s(params(mode));
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(logits(), {}));
}

// The selection the sampler made before (no penalties, no filter): the softmax, cuts and draw after it are left out
// (a few microseconds with top-k; without it the old code's softmax over every token is left out too).
void full_pass(benchmark::State& state, Mode mode) {
  const SamplingParams p = params(mode);
  const size_t k = p.top_k > 0 ? size_t(p.top_k) : kVocab;
  const std::vector<float>& row = logits();
  std::vector<std::pair<float, int32_t>> c;
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (auto _ : state) {
    c.resize(row.size());
    for (size_t i = 0; i < row.size(); ++i) c[i] = {row[i], int32_t(i)};
    if (mode == kGreedy) {
      benchmark::DoNotOptimize(std::min_element(c.begin(), c.end(), by_logit)->second);
    } else {
      std::partial_sort(c.begin(), c.begin() + ptrdiff_t(k), c.end(), by_logit);
      benchmark::DoNotOptimize(c[0].second);
    }
  }
}

// Presence and frequency penalties (the server's: every generated token) after 32K generated tokens of ~4K distinct
// ids, the history one token longer each call as in a generation: the sampler that keeps its counts between calls
// (Sampler::count_window), and the baseline measured in the same run, a new sampler each call (what every call did
// before 2026-12-05: the whole history counted again).
std::vector<int32_t> generated(size_t n) {
  std::mt19937 gen(3);
  std::uniform_int_distribution<int32_t> id(0, 4095);
  std::vector<int32_t> h(n);
  for (int32_t& t : h) t = id(gen) * 37;
  return h;
}
void penalties(benchmark::State& state, bool keep) {
  constexpr size_t kStart = 32768, kMore = 65536;
  static const std::vector<int32_t> history = generated(kStart + kMore);
  SamplingParams p = params(kDefault);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.5f;
  p.penalty_last_n = -1;
  Sampler kept(p);
  size_t len = kStart;
  for (auto _ : state) {
    const std::span<const int32_t> h(history.data(), len);
    if (keep) {
      benchmark::DoNotOptimize(kept.sample(logits(), h));
    } else {
      Sampler fresh(p);
      benchmark::DoNotOptimize(fresh.sample(logits(), h));
    }
    len = len + 1 < history.size() ? len + 1 : kStart;
  }
}

BENCHMARK_CAPTURE(penalties, kept_counts, true)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(penalties, recount, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, greedy, kGreedy)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_pass, greedy, kGreedy)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, default, kDefault)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_pass, default, kDefault)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(sample, no_top_k, kNoTopK)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(full_pass, no_top_k, kNoTopK)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace magnetar

BENCHMARK_MAIN();
