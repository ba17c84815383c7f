// Token sampling: penalties and logit biases, then greedy or temperature sampling: top-k, then the softmax at the
// temperature, then top-p and min-p on its probabilities (vLLM's order; llama.cpp's default chain cuts top-p and
// min-p before it applies the temperature). Scratch is reused across calls: no allocation per token after the first.
// Also the prompt lookup drafts of speculative decoding.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "engine/engine.h"

namespace magnetar {

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed >= 0 ? uint64_t(params.seed) : std::random_device{}()) {}

namespace {

bool by_logit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// A NaN logit ranks as -inf (by_logit needs an order).
float ranked(float x) { return x == x ? x : -INFINITY; }

// Whether any of x[0, 16) is above bar (false for NaN), as four 4-float compares: the compiler's generic vectors
// (SSE2 on any x86-64, NEON on arm64; no ISA flags), which a plain loop did not become at -O2 (GCC 12).
using Floats4 = float __attribute__((vector_size(16)));
using Ints4 = int __attribute__((vector_size(16)));
bool any_above(const float* x, float bar) {
  Floats4 a, b, c, d;
  std::memcpy(&a, x, sizeof(a));
  std::memcpy(&b, x + 4, sizeof(b));
  std::memcpy(&c, x + 8, sizeof(c));
  std::memcpy(&d, x + 12, sizeof(d));
  const Ints4 above = (a > bar) | (b > bar) | (c > bar) | (d > bar);
  uint64_t half[2];
  std::memcpy(half, &above, sizeof(half));
  return (half[0] | half[1]) != 0;
}

// The m best entries (by_logit, ties to the lower id) of the raw logits, unsorted, into out. One pass: the entries
// above the m-th best seen so far are kept, and every time 4 m (at least 1,024) are kept they are cut back to m
// (nth_element), which raises that bar. 151,936 logits and the default filters: ~30 us per token on the CPU box
// instead of ~150 for the copy of every (logit, id) pair and a partial sort (bench/engine/sampling_bench.cpp).
// skip (optional, n bytes): ids whose byte is set are left out.
void select_top(std::span<const float> logits, size_t m, std::vector<std::pair<float, int32_t>>& out,
                const uint8_t* skip = nullptr) {
  out.clear();
  const size_t n = logits.size();
  const size_t cap = std::max<size_t>(4 * m, 1024);
  float bar = -INFINITY;
  bool full = false;  // out has been cut back to m: `bar` is its m-th best
  constexpr size_t kBlock = 16;  // a block is looked into only when one of its logits passes the bar
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    if (full && e - b == kBlock && !any_above(logits.data() + b, bar)) continue;
    for (size_t i = b; i < e; ++i) {
      const float x = logits[i];
      if (full && !(x > bar)) continue;  // later ids lose the ties: nothing at the bar (or NaN) can enter
      if (skip != nullptr && skip[i] != 0) continue;
      out.push_back({ranked(x), int32_t(i)});
      if (out.size() == cap) {
        std::nth_element(out.begin(), out.begin() + ptrdiff_t(m - 1), out.end(), by_logit);
        out.resize(m);
        bar = out[m - 1].first;
        full = true;
      }
    }
  }
  if (out.size() > m) {
    std::nth_element(out.begin(), out.begin() + ptrdiff_t(m - 1), out.end(), by_logit);
    out.resize(m);
  }
}

}  // namespace

void Sampler::count_window(std::span<const int32_t> history, size_t begin) {
  // A step of a generation: the history is the one counted before and the new token(s); the window moved right.
  // Comparing the histories is a pass over their ints; counting afresh a hash insertion per token (32K tokens: 47.6
  // against 276 us a sample, docs/benchmarks/2026-12-05-sampling-penalties.md).
  const size_t old_end = counted_.size();
  const bool grew = history.size() >= old_end && begin >= count_begin_ &&
                    std::equal(counted_.begin(), counted_.end(), history.begin());
  if (!grew) {
    counts_.clear();
    counted_.clear();
    count_begin_ = begin;
  }
  auto drop = [&](int32_t id) {
    const auto it = counts_.find(id);
    if (--it->second == 0) counts_.erase(it);
  };
  for (size_t i = count_begin_; i < std::min(begin, counted_.size()); ++i) drop(counted_[i]);
  for (size_t i = std::max(begin, counted_.size()); i < history.size(); ++i) ++counts_[history[i]];
  counted_.insert(counted_.end(), history.begin() + ptrdiff_t(counted_.size()), history.end());
  count_begin_ = begin;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, const TokenFilter& allow) {
  const size_t n = logits.size();
  if (n == 0) return -1;

  // Penalties over the last penalty_last_n tokens: repeat and presence once per distinct token, frequency once per
  // occurrence (llama.cpp's penalties sampler). penalized_ holds each such token's new logit.
  penalized_.clear();
  if ((params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) &&
      params_.penalty_last_n != 0) {
    const size_t window = params_.penalty_last_n < 0 ? history.size()
                                                      : std::min(history.size(), size_t(params_.penalty_last_n));
    count_window(history, history.size() - window);
    for (const auto& [id, count] : counts_) {
      if (id < 0 || size_t(id) >= n) continue;
      float l = ranked(logits[size_t(id)]);
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      l -= params_.presence_penalty;
      if (params_.frequency_penalty != 0.0f) l -= params_.frequency_penalty * float(count);
      penalized_.push_back({l, id});
    }
  }
  // Logit biases on top (ids outside the vocabulary ignored; the server refuses them), one entry per id: penalized_
  // by id, each bias added to its token's entry or to a new one.
  if (!params_.logit_bias.empty()) {
    std::sort(penalized_.begin(), penalized_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    const size_t penalties = penalized_.size();
    for (const auto& [id, bias] : params_.logit_bias) {
      if (id < 0 || size_t(id) >= n) continue;
      const auto end = penalized_.begin() + ptrdiff_t(penalties);
      const auto it =
          std::lower_bound(penalized_.begin(), end, id, [](const auto& e, int32_t v) { return e.second < v; });
      if (it != end && it->second == id) {
        it->first += bias;
      } else {
        penalized_.push_back({ranked(logits[size_t(id)]) + bias, id});
      }
    }
  }
  // Every token's (penalized) logit, in id order: the constrained fallbacks' slow path.
  auto fill_all = [&] {
    candidates_.resize(n);
    for (size_t i = 0; i < n; ++i) candidates_[i] = {ranked(logits[i]), int32_t(i)};
    for (const auto& [l, id] : penalized_) candidates_[size_t(id)].first = l;
  };
  // The k best (penalized) tokens, sorted, in candidates_[0, k): the k best of the tokens without a penalty or bias,
  // which hold every one of them that can be among the k best, and each penalized token with its new logit.
  // `penalized`: logits holds the raw logits (else work_, the penalized ones). (Until 2026-12-05 the k + |penalized_|
  // best raw logits, merged by id with the penalized ones: ~1 ms a token with 4K distinct tokens penalized.)
  auto top = [&](size_t k, bool penalized = true) {
    if (penalized && k + penalized_.size() >= n) {
      fill_all();
    } else if (penalized && !penalized_.empty()) {
      skip_.resize(n);
      for (const auto& [l, id] : penalized_) skip_[size_t(id)] = 1;
      select_top(logits, k, candidates_, skip_.data());
      for (const auto& [l, id] : penalized_) skip_[size_t(id)] = 0;
      candidates_.insert(candidates_.end(), penalized_.begin(), penalized_.end());
    } else {
      select_top(penalized ? logits : std::span<const float>(work_), std::min(n, k), candidates_);
    }
    std::partial_sort(candidates_.begin(), candidates_.begin() + ptrdiff_t(k), candidates_.end(), by_logit);
    candidates_.resize(k);
  };
  // Constrained fallback: the best allowed token after the `from` best (penalized) tokens.
  auto best_allowed = [&](size_t from) -> int32_t {
    fill_all();
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
    for (size_t i = from; i < n; ++i) {
      if (allow(candidates_[i].second)) return candidates_[i].second;
    }
    return -1;
  };
  if (params_.temperature <= 0.0f) {
    top(1);
    const int32_t best = candidates_[0].second;
    if (!allow || allow(best)) return best;
    return best_allowed(0);
  }

  size_t k = n;
  if (params_.top_k > 0 && size_t(params_.top_k) < n) k = size_t(params_.top_k);
  const float T = params_.temperature;
  if (k == n && !allow) {
    // No top-k (a sort of 151,936 tokens took ~20 ms per token): the softmax's sum over every token in id order, and
    // only as many of the best sorted as the cuts (top-p, min-p) or the draw reach: 256, then 8 times more a round.
    work_.resize(n);
    for (size_t i = 0; i < n; ++i) work_[i] = ranked(logits[i]);
    for (const auto& [l, id] : penalized_) work_[size_t(id)] = l;
    const float max_logit = *std::max_element(work_.begin(), work_.end());
    double sum = 0;
    for (const float l : work_) sum += std::exp((l - max_logit) / T);
    const auto prob = [&](float l) { return float(std::exp((l - max_logit) / T) / sum); };
    const bool cuts = params_.top_p < 1.0f || params_.min_p > 0.0f;
    double r = 0;
    if (!cuts) {  // a draw over every token, their mass summed in id order
      double mass = 0;
      for (const float l : work_) mass += prob(l);
      r = std::uniform_real_distribution<double>(0.0, mass)(rng_);
    }
    for (size_t m = std::min<size_t>(n, 256);; m = std::min(n, 8 * m)) {
      top(m, false);
      for (auto& c : candidates_) c.first = prob(c.first);
      if (!cuts) {
        double cum = 0;
        for (const auto& [p, id] : candidates_) {
          cum += p;
          if (r < cum) return id;
        }
        if (m == n) return candidates_[n - 1].second;  // rounding left r at the end
        continue;
      }
      size_t keep_p = m + 1, keep_min = m + 1;  // m + 1: the cut is not among the m best
      if (params_.top_p < 1.0f) {
        double cum = 0;
        for (size_t j = 0; j < m && keep_p > m; ++j) {
          cum += candidates_[j].first;
          if (cum >= params_.top_p) keep_p = j + 1;
        }
      }
      if (params_.min_p > 0.0f) {
        const float floor = candidates_[0].first * params_.min_p;
        for (size_t j = 1; j < std::min(m, keep_p) && keep_min > m; ++j) {
          if (candidates_[j].first < floor) keep_min = j;
        }
      }
      if (keep_p <= m || keep_min <= m || m == n) {
        k = std::min({keep_p, keep_min, m});
        break;
      }
    }
  } else {
    const size_t k_sorted = k;  // the tokens after the k_sorted best are not in candidates_
    top(k);
    // Softmax at the temperature over the k best; probabilities replace logits in place.
    const float max_logit = candidates_[0].first;
    double sum = 0;
    for (size_t i = 0; i < k; ++i) {
      candidates_[i].first = std::exp((candidates_[i].first - max_logit) / T);
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
  // Rounding left r at the end: the last candidate (with a filter: the last allowed one; when every allowed survivor's
  // probability underflowed to 0, the best of them).
  if (!allow) return candidates_[k - 1].second;
  for (size_t i = k; i-- > 0;) {
    if (candidates_[i].first > 0.0f) return candidates_[i].second;
  }
  for (size_t i = 0; i < k; ++i) {
    if (allow(candidates_[i].second)) return candidates_[i].second;
  }
  return best_allowed(k);
}

std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, int32_t next, int64_t max_tokens, int* match) {
  const int64_t n = int64_t(tokens.size()) + 1;  // the sequence: tokens, then next
  const auto at = [&](int64_t i) { return i + 1 < n ? tokens[size_t(i)] : next; };
  if (max_tokens <= 0 || n < kLookupNgramMin + 1) return {};
  // Every earlier position i where the suffix's last token occurs, latest first: how many of the suffix's tokens
  // (up to kLookupNgramMax) end there. The longest match wins; among equal ones the latest (its continuation is the
  // likeliest to be the one being repeated).
  // Blocks of 16 positions without `next` are passed over by a comparison the compiler vectorizes: the scan runs every
  // decode step, and over 128K tokens without a match it took ~140 us element by element, ~40 us so (CPU box, -O3).
  constexpr int64_t kBlock = 16;
  int64_t best = -1, best_len = kLookupNgramMin - 1;
  for (int64_t i = n - 2; i >= 0 && best_len < kLookupNgramMax; --i) {
    if ((i + 1) % kBlock == 0) {
      while (i >= kBlock - 1) {
        const int32_t* block = tokens.data() + (i + 1 - kBlock);
        bool any = false;
        for (int64_t j = 0; j < kBlock; ++j) any |= block[j] == next;
        if (any) break;
        i -= kBlock;
      }
      if (i < 0) break;
    }
    if (tokens[size_t(i)] != next) continue;
    int64_t len = 1;
    while (len < kLookupNgramMax && len <= i && tokens[size_t(i - len)] == at(n - 1 - len)) ++len;
    if (len > best_len) {
      best = i;
      best_len = len;
    }
  }
  if (best < 0) return {};
  if (match != nullptr) *match = int(best_len);
  std::vector<int32_t> out;
  // The copy goes on past the sequence's end with what it copied: a repeat whose match is close behind (a loop)
  // continues with its period.
  const int64_t period = n - 1 - best;
  for (int64_t i = 0; i < max_tokens; ++i) out.push_back(i < period ? at(best + 1 + i) : out[size_t(i - period)]);
  return out;
}

LookupDecoder::LookupDecoder(Session& session, bool every_draft)
    : session_(session), every_draft_(every_draft || std::getenv("MAGNETAR_LOOKUP_EVERY_DRAFT") != nullptr) {}

std::span<const float> LookupDecoder::logits() const {
  if (drafts_.empty()) return session_.logits();
  const size_t V = size_t(session_.n_vocab());
  return session_.all_logits().subspan(row_ * V, V);
}

size_t LookupDecoder::committed() const {
  return drafts_.empty() ? session_.tokens().size() : size_t(session_.all_logits_first()) + row_ + 1;
}

std::span<const int32_t> LookupDecoder::history() const {
  return std::span<const int32_t>(session_.tokens()).first(committed());
}

int64_t LookupDecoder::drafts_worth(std::span<const double> cost, double p) {
  int64_t best = 0;
  double best_rate = 1.0, tokens = 1.0, pk = 1.0;
  for (size_t k = 1; k < cost.size(); ++k) {
    pk *= p;
    tokens += pk;
    const double rate = tokens / cost[k];
    if (rate > best_rate * 1.02) {  // a gain inside the measurements' noise is no gain
      best = int64_t(k);
      best_rate = rate;
    }
  }
  return best;
}

// The outcome of a step's drafts: `right` of the `tried` were confirmed (each right one was tried, and so was the
// first wrong one if any).
void LookupDecoder::learn(int64_t right, int64_t tried) {
  constexpr double kRate = 0.1;
  double& p = p_[size_t(match_)];
  for (int64_t i = 0; i < std::min(right + 1, tried); ++i) p += kRate * ((i < right ? 1.0 : 0.0) - p);
}

bool LookupDecoder::accept(int32_t id) {
  if (row_ < drafts_.size() && drafts_[row_] == id) {
    ++row_;
    if (row_ == drafts_.size()) learn(int64_t(row_), int64_t(row_));
    return true;
  }
  end();
  return false;
}

Status LookupDecoder::step(int32_t id, int64_t max_drafts) {
  end();
  const int64_t room = session_.n_ctx() - int64_t(session_.tokens().size()) - 1;  // after id
  drafts_ = lookup_draft(session_.tokens(), id, std::min({max_drafts, room, int64_t(kMaxLookupDrafts)}), &match_);
  if (!drafts_.empty() && !every_draft_) {
    // Untried, the chance drifts back to its prior (see the class).
    std::array<double, kMaxLookupDrafts + 1> cost;
    const size_t n = drafts_.size() + 1;
    cost[0] = 1.0;
    for (size_t k = 1; k < n; ++k) cost[k] = cost_[k] > 0 ? cost_[k] : cost[k - 1] + 0.3;
    double& p = p_[size_t(match_)];
    const int64_t k = plain_seconds_ > 0 ? drafts_worth(std::span<const double>(cost.data(), n), p) : 0;
    if (k == 0) p += 0.02 * (kPrior[match_] - p);
    drafts_.resize(size_t(k));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = session_.step(id, drafts_);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) {
    drafts_.clear();
    return s;
  }
  // A plain step's time follows drops at once and rises slowly: an outlier (the GPU's first step captures its graph)
  // would make drafts look cheap.
  if (steps_[drafts_.size()]++ == 0) {
    // the first step of its kind: not measured (see steps_)
  } else if (drafts_.empty()) {
    plain_seconds_ = plain_seconds_ > 0 && dt > plain_seconds_ ? plain_seconds_ + 0.05 * (dt - plain_seconds_) : dt;
  } else if (plain_seconds_ > 0) {
    double& c = cost_[drafts_.size()];
    const double ratio = std::max(1.0, dt / plain_seconds_);
    c = c > 0 ? c + 0.2 * (ratio - c) : ratio;
  }
  return s;
}

void LookupDecoder::end() {
  if (!drafts_.empty()) {
    if (row_ < drafts_.size()) learn(int64_t(row_), int64_t(drafts_.size()));
    session_.rewind(committed());
  }
  drafts_.clear();
  row_ = 0;
}

}  // namespace magnetar
