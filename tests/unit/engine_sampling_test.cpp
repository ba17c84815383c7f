// Sampler: each filter checked against its definition on hand-made logits.
#include <gtest/gtest.h>

#include <map>

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
