// Token sampling: penalties, then greedy or temperature sampling through top-k, top-p and min-p filters
// (llama.cpp's default order). Scratch is reused across calls: no allocation per token after the first.
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "engine/engine.h"

namespace magnetar {

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed != 0 ? params.seed : std::random_device{}()) {}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, const TokenFilter& allow) {
  const size_t n = logits.size();
  candidates_.resize(n);
  for (size_t i = 0; i < n; ++i) candidates_[i] = {logits[i], int32_t(i)};

  // Penalties over the last penalty_last_n tokens: repeat and presence once per distinct token, frequency once per
  // occurrence (llama.cpp's penalties sampler).
  if ((params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) &&
      params_.penalty_last_n != 0) {
    const size_t window = params_.penalty_last_n < 0 ? history.size()
                                                      : std::min(history.size(), size_t(params_.penalty_last_n));
    std::unordered_map<int32_t, int> counts;
    for (size_t i = history.size() - window; i < history.size(); ++i) {
      const int32_t id = history[i];
      if (id >= 0 && size_t(id) < n) ++counts[id];
    }
    // In history order of first appearance, as before frequency_penalty existed (the result is order-free).
    for (size_t i = history.size() - window; i < history.size(); ++i) {
      const int32_t id = history[i];
      auto it = counts.find(id);
      if (it == counts.end() || it->second == 0) continue;
      float& l = candidates_[size_t(id)].first;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      l -= params_.presence_penalty;
      if (params_.frequency_penalty != 0.0f) l -= params_.frequency_penalty * float(it->second);
      it->second = 0;  // applied
    }
  }

  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // Constrained fallback: the best allowed token among candidates_[from, n), which hold (penalized) logits.
  auto best_allowed = [&](size_t from) -> int32_t {
    std::sort(candidates_.begin() + ptrdiff_t(from), candidates_.end(), by_logit);
    for (size_t i = from; i < n; ++i) {
      if (allow(candidates_[i].second)) return candidates_[i].second;
    }
    return -1;
  };
  if (params_.temperature <= 0.0f) {
    const int32_t best = std::min_element(candidates_.begin(), candidates_.end(), by_logit)->second;
    if (!allow || allow(best)) return best;
    return best_allowed(0);
  }

  size_t k = n;
  if (params_.top_k > 0 && size_t(params_.top_k) < n) k = size_t(params_.top_k);
  const size_t k_sorted = k;  // candidates_[k_sorted, n) keep their logits, unsorted
  std::partial_sort(candidates_.begin(), candidates_.begin() + ptrdiff_t(k), candidates_.end(), by_logit);
  // Softmax at the temperature over the k best; probabilities replace logits in place.
  const float max_logit = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    candidates_[i].first = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    sum += candidates_[i].first;
  }
  for (size_t i = 0; i < k; ++i) candidates_[i].first = float(candidates_[i].first / sum);
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = 0;
    while (keep < k) {
      cum += candidates_[keep].first;
      ++keep;
      if (cum >= params_.top_p) break;
    }
    k = keep;
  }
  // min-p: drop tokens less likely than min_p times the best one.
  if (params_.min_p > 0.0f) {
    const float floor = candidates_[0].first * params_.min_p;
    size_t keep = 1;
    while (keep < k && candidates_[keep].first >= floor) ++keep;
    k = keep;
  }
  // A filter removes the disallowed survivors (their probability becomes 0); when none is left, the best allowed
  // token of the rest: first the sorted ones that the filters dropped, then the unsorted tail.
  if (allow) {
    bool any = false;
    for (size_t i = 0; i < k; ++i) {
      if (allow(candidates_[i].second)) {
        any = true;
      } else {
        candidates_[i].first = 0.0f;
      }
    }
    if (!any) {
      for (size_t i = k; i < k_sorted; ++i) {
        if (allow(candidates_[i].second)) return candidates_[i].second;
      }
      return best_allowed(k_sorted);
    }
  }
  double mass = 0;
  for (size_t i = 0; i < k; ++i) mass += candidates_[i].first;
  std::uniform_real_distribution<double> uniform(0.0, mass);
  const double r = uniform(rng_);
  double cum = 0;
  for (size_t i = 0; i < k; ++i) {
    cum += candidates_[i].first;
    if (r < cum) return candidates_[i].second;
  }
  // Rounding left r at the end: the last candidate (with a filter: the last allowed one).
  if (!allow) return candidates_[k - 1].second;
  for (size_t i = k; i-- > 0;) {
    if (candidates_[i].first > 0.0f) return candidates_[i].second;
  }
  return candidates_[k - 1].second;
}

}  // namespace magnetar
