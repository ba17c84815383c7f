// Sampler: each filter checked against its definition on hand-made logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "engine/engine.h"

namespace magnetar {
namespace {

std::map<int32_t, int> histogram(SamplingParams p, const std::vector<float>& logits, const std::vector<int32_t>& history,
                                 int draws) {
  p.seed = 1234;
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) h[s.sample(logits, history)]++;
  return h;
}

TEST(Sampler, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  SamplingParams p{.temperature = 0};
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.9f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 5.0f, 5.0f}, {}), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  const std::vector<float> logits = {0.5f, 0.4f, 2.0f, 1.9f};
  const auto h = histogram({.temperature = 1.5f, .top_k = 1, .top_p = 1, .min_p = 0}, logits, {}, 200);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 2);
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  // p = softmax([0, ln 3]) = [0.25, 0.75]
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  const auto h = histogram({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0}, logits, {}, 20000);
  EXPECT_NEAR(h.at(1) / 20000.0, 0.75, 0.02);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps {0, 1}; token 2 is never drawn
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  const auto h = histogram({.temperature = 1, .top_k = 0, .top_p = 0.7f, .min_p = 0}, logits, {}, 5000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_NEAR(h.at(0) / 5000.0, 0.5 / 0.8, 0.03);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // probabilities 0.6, 0.3, 0.1: min_p 0.2 drops token 2 (0.1 < 0.2 * 0.6)
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  const auto h = histogram({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0.2f}, logits, {}, 5000);
  EXPECT_EQ(h.count(2), 0u);
  EXPECT_EQ(h.size(), 2u);
}

TEST(Sampler, RepeatAndPresencePenaltiesApplyToRecentTokensOnly) {
  // Token 0 leads by 0.5; a repeat penalty of 2 halves its positive logit (1.0 -> 0.5 < 0.6).
  const std::vector<float> logits = {1.0f, 0.6f, -5.0f};
  Sampler greedy({.temperature = 0, .repeat_penalty = 2.0f, .penalty_last_n = 2});
  EXPECT_EQ(greedy.sample(logits, std::vector<int32_t>{0}), 1);
  EXPECT_EQ(greedy.sample(logits, std::vector<int32_t>{0, 2, 2}), 0);  // 0 is outside the last 2 tokens
  Sampler presence({.temperature = 0, .presence_penalty = 0.5f, .penalty_last_n = -1});
  EXPECT_EQ(presence.sample(logits, std::vector<int32_t>{0, 0, 0}), 1);  // 1.0 - 0.5 < 0.6, counted once
}

TEST(Sampler, FrequencyPenaltyCountsEveryOccurrence) {
  // Token 0 leads by 1.0: one occurrence costs 0.6 (still ahead), two cost 1.2 (behind).
  const std::vector<float> logits = {2.0f, 1.0f, -5.0f};
  Sampler s({.temperature = 0, .frequency_penalty = 0.6f, .penalty_last_n = -1});
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}), 0);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, 2, 0}), 1);
  // The same history under presence_penalty 0.6 counts token 0 once.
  Sampler p({.temperature = 0, .presence_penalty = 0.6f, .penalty_last_n = -1});
  EXPECT_EQ(p.sample(logits, std::vector<int32_t>{0, 2, 0}), 0);
  // Only the window counts: with the last 2 tokens, one occurrence of 0.
  Sampler w({.temperature = 0, .frequency_penalty = 0.6f, .penalty_last_n = 2});
  EXPECT_EQ(w.sample(logits, std::vector<int32_t>{0, 2, 0}), 0);
}

// logit_bias adds to a token's (penalized) logit: -100 moves the argmax away, a bias and a penalty on one token add
// up, ids outside the vocabulary are ignored; in the top-k path (more tokens than k) too.
TEST(Sampler, LogitBiasAddsToThePenalizedLogit) {
  const std::vector<float> logits = {1.0f, 0.6f, -5.0f, 0.2f};
  Sampler ban({.temperature = 0, .logit_bias = {{0, -100.0f}, {7, 50.0f}}});
  EXPECT_EQ(ban.sample(logits, {}), 1);
  Sampler lift({.temperature = 0, .logit_bias = {{2, 6.5f}}});
  EXPECT_EQ(lift.sample(logits, {}), 2);  // -5 + 6.5 = 1.5 > 1.0
  Sampler both({.temperature = 0, .presence_penalty = 0.3f, .penalty_last_n = -1, .logit_bias = {{0, -0.2f}}});
  EXPECT_EQ(both.sample(logits, std::vector<int32_t>{0}), 1);  // 1.0 - 0.3 - 0.2 = 0.5 < 0.6
  Sampler one({.temperature = 0, .presence_penalty = 0.3f, .penalty_last_n = -1});
  EXPECT_EQ(one.sample(logits, std::vector<int32_t>{0}), 0);  // 0.7 > 0.6: the bias above made the difference
  std::vector<float> many(1000, 0.0f);
  many[10] = 3.0f;
  many[20] = 2.0f;
  const auto h = histogram({.temperature = 0.01f, .top_k = 5, .top_p = 1, .min_p = 0, .logit_bias = {{10, -100.0f}}},
                           many, {}, 50);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 20);
}

// A seed of 0 is a seed like any other (OpenAI's and vLLM's; it drew a random one); a negative one is random.
TEST(Sampler, SeedZeroRepeatsItsDraws) {
  const std::vector<float> logits(64, 0.0f);  // uniform: 64 draws of one seed repeat only by the generator
  std::vector<int32_t> a, b;
  Sampler first({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 0});
  Sampler second({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 0});
  for (int i = 0; i < 64; ++i) {
    a.push_back(first.sample(logits, {}));
    b.push_back(second.sample(logits, {}));
  }
  EXPECT_EQ(a, b);
}

TEST(Sampler, FilterTakesTheBestAllowedToken) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.9f, 2.0f};
  Sampler greedy({.temperature = 0});
  const TokenFilter not_1 = [](int32_t id) { return id != 1; };
  const TokenFilter only_2 = [](int32_t id) { return id == 2; };
  const TokenFilter none = [](int32_t) { return false; };
  EXPECT_EQ(greedy.sample(logits, {}, not_1), 3);
  EXPECT_EQ(greedy.sample(logits, {}, only_2), 2);
  EXPECT_EQ(greedy.sample(logits, {}, none), -1);
  // Temperature sampling: drawn among the allowed survivors of top-k; when none survives, the best allowed rest.
  Sampler hot({.temperature = 1, .top_k = 2, .top_p = 1, .min_p = 0, .seed = 5});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(hot.sample(logits, {}, not_1), 3);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(hot.sample(logits, {}, only_2), 2);
  EXPECT_EQ(hot.sample(logits, {}, none), -1);
  // The one allowed survivor's probability underflows to 0 at a low temperature: it is still the one drawn (before,
  // the last survivor, a disallowed token, came back).
  Sampler cold({.temperature = 0.1f, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 5});
  const TokenFilter only_1 = [](int32_t id) { return id == 1; };
  const std::vector<float> steep = {100.0f, 0.0f, -10.0f};
  for (int i = 0; i < 20; ++i) EXPECT_EQ(cold.sample(steep, {}, only_1), 1);
}

// The sampler's definition on the whole vocabulary, spelled out plainly: NaN ranks as -inf, the penalties, every token
// sorted by (logit descending, id ascending), then greedy, or top-k, the softmax at the temperature, top-p, min-p, the
// filter and one uniform draw from the same generator. Without top-k and without a filter the softmax's denominator
// is summed in id order, and so is the mass of the draw when neither top-p nor min-p cuts (else in rank order). The
// sampler selects the few best tokens in one pass instead (Sampler::select_top) and sorts only as many as it needs:
// it must pick the same token every time.
struct FullSort {
  std::vector<float> l;         // penalized logits
  std::vector<int32_t> order;  // every token, best first
};
FullSort full_sort(const SamplingParams& p, const std::vector<float>& raw, const std::vector<int32_t>& history) {
  const size_t n = raw.size();
  std::vector<float> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = std::isnan(raw[i]) ? -INFINITY : raw[i];
  if (p.penalty_last_n != 0) {
    const size_t window = p.penalty_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.penalty_last_n));
    std::map<int32_t, int> count;
    for (size_t i = history.size() - window; i < history.size(); ++i) count[history[i]]++;
    for (const auto& [id, c] : count) {
      float& x = l[size_t(id)];
      x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
      x -= p.presence_penalty;
      x -= p.frequency_penalty * float(c);
    }
  }
  std::vector<int32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  return {std::move(l), std::move(order)};
}
int32_t sample_by_full_sort(const SamplingParams& p, std::mt19937_64& rng, const FullSort& sorted,
                            const TokenFilter& allow) {
  const std::vector<float>& l = sorted.l;
  const std::vector<int32_t>& order = sorted.order;
  const size_t n = l.size();
  auto first_allowed = [&](size_t from) -> int32_t {
    for (size_t i = from; i < n; ++i) {
      if (!allow || allow(order[i])) return order[i];
    }
    return -1;
  };
  if (p.temperature <= 0) return first_allowed(0);
  const size_t k_top = p.top_k > 0 && size_t(p.top_k) < n ? size_t(p.top_k) : n;
  const bool id_order = k_top == n && !allow;
  auto e = [&](int32_t id) { return std::exp((l[size_t(id)] - l[order[0]]) / p.temperature); };
  std::vector<float> prob(k_top);
  double sum = 0;
  for (size_t i = 0; i < k_top; ++i) sum += prob[i] = e(id_order ? int32_t(i) : order[i]);
  for (size_t i = 0; i < k_top; ++i) prob[i] = float(e(order[i]) / sum);
  size_t k = k_top;
  if (p.top_p < 1) {
    double cum = 0;
    for (k = 0; k < k_top;) {
      cum += prob[k++];
      if (cum >= p.top_p) break;
    }
  }
  if (p.min_p > 0) {
    size_t keep = 1;
    while (keep < k && prob[keep] >= prob[0] * p.min_p) ++keep;
    k = keep;
  }
  if (allow) {
    bool any = false;
    for (size_t i = 0; i < k; ++i) {
      if (allow(order[i])) {
        any = true;
      } else {
        prob[i] = 0;
      }
    }
    if (!any) return first_allowed(k);
  }
  double mass = 0;
  if (id_order && p.top_p >= 1 && p.min_p <= 0) {
    for (size_t i = 0; i < n; ++i) mass += float(e(int32_t(i)) / sum);
  } else {
    for (size_t i = 0; i < k; ++i) mass += prob[i];
  }
  const double r = std::uniform_real_distribution<double>(0.0, mass)(rng);
  double cum = 0;
  for (size_t i = 0; i < k; ++i) {
    cum += prob[i];
    if (r < cum) return order[i];
  }
  for (size_t i = k; i-- > 0;) {
    if (prob[i] > 0) return order[i];
  }
  return allow ? first_allowed(0) : order[k - 1];  // every allowed survivor's probability underflowed: the best
}

TEST(Sampler, LargeVocabularyPicksWhatAFullSortPicks) {
  std::mt19937 gen(42);
  std::normal_distribution<float> normal(0.0f, 2.5f);
  for (const size_t n : {size_t(1), size_t(37), size_t(5000), size_t(151936)}) {
    std::vector<float> logits(n);
    // Steps of 1/8: many ties, which the lower id wins. A few NaN and -inf logits besides.
    for (float& x : logits) x = std::round(normal(gen) * 8.0f) / 8.0f;
    if (n > 100) logits[n / 3] = NAN, logits[n / 2] = -INFINITY, logits[n - 1] = 20.0f;
    // A history with the best tokens in it (penalized away) and a low one (a negative presence penalty lifts it).
    std::vector<int32_t> history;
    for (size_t i = 0; i < 70; ++i) history.push_back(int32_t(gen() % n));
    history.push_back(int32_t(n - 1));
    history.push_back(int32_t(n - 1));
    const TokenFilter even = [](int32_t id) { return id % 2 == 0; };
    const TokenFilter rare = [n](int32_t id) { return size_t(id) == n / 2 || size_t(id) == n / 3; };
    const SamplingParams cases[] = {
        {.temperature = 0},
        {.temperature = 0, .repeat_penalty = 1.5f, .presence_penalty = -30.0f, .penalty_last_n = 3},
        {.temperature = 0.8f},
        {.temperature = 1.0f, .top_k = 200, .top_p = 1, .min_p = 0},
        {.temperature = 0.7f, .top_k = 3, .top_p = 0.9f, .min_p = 0.1f, .repeat_penalty = 1.3f,
         .presence_penalty = 0.4f, .frequency_penalty = 0.25f, .penalty_last_n = 64},
        {.temperature = 1.2f, .top_k = 50, .top_p = 0.5f, .min_p = 0, .presence_penalty = -6.0f, .penalty_last_n = -1},
        // No top-k: a top-p cut, a min-p cut (penalized), and no cut at all.
        {.temperature = 0.5f, .top_k = 0, .top_p = 0.9f, .min_p = 0},
        {.temperature = 0.9f, .top_k = 0, .top_p = 1, .min_p = 0.1f, .repeat_penalty = 1.3f, .presence_penalty = -3.0f},
        {.temperature = 1.1f, .top_k = 0, .top_p = 1, .min_p = 0},
    };
    for (size_t c = 0; c < std::size(cases); ++c) {
      const FullSort sorted = full_sort(cases[c], logits, history);
      for (const TokenFilter* filter : {static_cast<const TokenFilter*>(nullptr), &even, &rare}) {
        SamplingParams p = cases[c];
        p.seed = 99 + c;
        Sampler s(p);
        std::mt19937_64 rng(p.seed);
        const TokenFilter allow = filter ? *filter : TokenFilter{};
        for (int draw = 0; draw < (filter == &rare ? 2 : 20); ++draw) {  // `rare` takes the sampler's full sort
          ASSERT_EQ(s.sample(logits, history, allow), sample_by_full_sort(p, rng, sorted, allow))
              << "vocabulary " << n << ", case " << c << ", filter " << (filter ? (filter == &even ? "even" : "rare")
                                                                             : "none") << ", draw " << draw;
        }
      }
    }
  }
}

// The penalty counts a sampler keeps between calls (Sampler::count_window) follow the history it is given: one token
// more a step (a generation), a window that slides, then a history that is not an extension of the last (a token
// changed in the middle, one shorter, none, a longer one from scratch): every draw the reference's, which counts
// afresh.
TEST(Sampler, PenaltyCountsFollowAGrowingOrChangingHistory) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = 300;
  for (const int last_n : {-1, 5, 1}) {
    const SamplingParams p{.temperature = 0.7f,
                           .top_k = 0,
                           .top_p = 0.95f,
                           .min_p = 0,
                           .repeat_penalty = 1.3f,
                           .presence_penalty = 0.5f,
                           .frequency_penalty = 0.8f,
                           .penalty_last_n = last_n,
                           .seed = 17};
    Sampler s(p);
    std::mt19937_64 rng(p.seed);
    std::vector<int32_t> history;
    auto step = [&](const std::string& what) {
      std::vector<float> logits(n);
      for (float& x : logits) x = normal(gen);
      const int32_t got = s.sample(logits, history);
      EXPECT_EQ(got, sample_by_full_sort(p, rng, full_sort(p, logits, history), {})) << what << ", last_n " << last_n;
      return got;
    };
    for (int i = 0; i < 60; ++i) {  // a generation: few distinct tokens, so the counts matter
      const int32_t t = step("step " + std::to_string(i));
      history.push_back(i % 3 == 0 ? int32_t(gen() % 8) : t % 8);
    }
    history[history.size() / 2] = int32_t(n - 1);
    step("a token changed in the middle");
    history.resize(history.size() - 7);
    step("a shorter history");
    step("the same history again");
    history.clear();
    step("no history");
    for (int i = 0; i < 40; ++i) history.push_back(int32_t(gen() % 12));
    step("a longer history at once");
    history.push_back(3);
    step("one more token");
  }
}

TEST(Sampler, AFilterThatAllowsEverythingChangesNothing) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.45f};
  const TokenFilter all = [](int32_t) { return true; };
  for (const SamplingParams& params : {SamplingParams{.temperature = 0},
                                       SamplingParams{.temperature = 0.8f, .seed = 11},
                                       SamplingParams{.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 3}}) {
    Sampler a(params), b(params);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}, all));
  }
}

TEST(Sampler, SameSeedSameSequence) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  Sampler a({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 7});
  Sampler b({.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .seed = 7});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

}  // namespace
}  // namespace magnetar
