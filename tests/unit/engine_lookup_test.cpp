// Speculative decoding by prompt lookup: lookup_draft's choice of drafts; Session::step(id, drafts) computes rows
// bit-identical to single steps on the CPU, rewind() drops the wrong guesses; a generation through LookupDecoder
// is token for token the one without drafts (greedy and seeded sampling), drafts are counted, and the disk KV
// saves a block only once the drafts in it are confirmed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace lookup_test {

using Ids = std::vector<int32_t>;

TEST(LookupDraft, FollowsTheLatestLongestEarlierMatch) {
  // The suffix (7, 8) + 9 occurs at positions 1-3 (followed by 4 5) and as (8, 9) at 9-10 (followed by 6): the
  // longer match wins.
  EXPECT_EQ(lookup_draft(Ids{0, 7, 8, 9, 4, 5, 1, 2, 8, 9, 6, 3, 7, 8}, 9, 11), (Ids{4, 5, 1, 2, 8, 9, 6, 3, 7, 8, 9}));
  // max_tokens of them.
  EXPECT_EQ(lookup_draft(Ids{0, 7, 8, 9, 4, 5, 1, 2, 8, 9, 6, 3, 7, 8}, 9, 2), (Ids{4, 5}));
  // Two matches of the same length: the latest.
  EXPECT_EQ(lookup_draft(Ids{1, 2, 3, 9, 1, 2, 4, 5, 1}, 2, 3), (Ids{4, 5, 1}));
  EXPECT_EQ(lookup_draft(Ids{1, 2, 3, 9, 1, 2, 4, 5, 1}, 2, 6), (Ids{4, 5, 1, 2, 4, 5}));  // then as it copied
  // Two matches of kLookupNgramMax tokens: the latest (longer ones are not looked for).
  EXPECT_EQ(lookup_draft(Ids{1, 2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 7, 2, 3, 4}, 5, 4), (Ids{7, 2, 3, 4}));
  // The continuation runs into the suffix itself (a repeating pattern), and past `next` with the pattern's period.
  EXPECT_EQ(lookup_draft(Ids{1, 2, 1, 2, 1}, 2, 5), (Ids{1, 2, 1, 2, 1}));
  EXPECT_EQ(lookup_draft(Ids{7, 1, 2, 3, 9, 1, 2, 3}, 9, 7), (Ids{1, 2, 3, 9, 1, 2, 3}));
}

// The drafts by brute force: every earlier end position, its match length (at most kLookupNgramMax), the longest and
// then the latest; the continuation as the sequence, then as its own copy.
Ids brute_force_draft(const Ids& tokens, int32_t next, int64_t max_tokens) {
  Ids seq = tokens;
  seq.push_back(next);
  const int64_t n = int64_t(seq.size());
  int64_t best = -1, best_len = 0;
  for (int64_t i = 0; i + 1 < n; ++i) {
    int64_t len = 0;
    while (len < kLookupNgramMax && i - len >= 0 && seq[size_t(i - len)] == seq[size_t(n - 1 - len)]) ++len;
    if (len >= kLookupNgramMin && len >= best_len) {
      best = i;
      best_len = len;
    }
  }
  Ids out;
  if (best < 0 || max_tokens <= 0) return out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    out.push_back(best + 1 + i < n ? seq[size_t(best + 1 + i)] : out[size_t(i - (n - 1 - best))]);
  }
  return out;
}

TEST(LookupDraft, EqualsBruteForceOnRandomSequences) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int vocab = trial % 3 == 0 ? 3 : trial % 3 == 1 ? 20 : 1000;
    Ids t(rng() % 400);
    for (int32_t& x : t) x = int32_t(rng() % uint32_t(vocab));
    const int32_t next = int32_t(rng() % uint32_t(vocab));
    const int64_t max_tokens = int64_t(rng() % 10);
    ASSERT_EQ(lookup_draft(t, next, max_tokens), brute_force_draft(t, next, max_tokens))
        << "trial " << trial << ", " << t.size() << " tokens of " << vocab;
  }
}

TEST(LookupDraft, NothingWithoutAMatchOfTheShortestNgram) {
  static_assert(kLookupNgramMin == 2);
  EXPECT_TRUE(lookup_draft(Ids{1, 2, 3, 4}, 5, 8).empty());  // 5 never occurred
  EXPECT_TRUE(lookup_draft(Ids{5, 2, 3, 4}, 5, 8).empty());  // 5 did, but not after 4
  EXPECT_TRUE(lookup_draft(Ids{}, 5, 8).empty());
  EXPECT_TRUE(lookup_draft(Ids{4, 5, 6, 4}, 5, 0).empty());  // no drafts asked for
  EXPECT_EQ(lookup_draft(Ids{4, 5, 6, 4}, 5, 3), (Ids{6, 4, 5}));
}

// cost[k]: a step with k drafts in plain steps, for k drafts costing 1 + first + more (k - 1).
std::vector<double> costs(size_t available, double first, double more) {
  std::vector<double> c = {1.0};
  for (size_t k = 1; k <= available; ++k) c.push_back(1.0 + first + more * double(k - 1));
  return c;
}

TEST(LookupDecoder, DraftsOnlyWhatPays) {
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0, 0), 1.0), 8);  // free and always right: all of them
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(0, 0, 0), 1.0), 0);
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0.3, 0.3), 0.3), 0);  // 1.3 tokens for 1.3 steps: no gain
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0, 0), 0.0), 0);
  // p 0.9, 0.3 a draft: 1.46, 1.69, 1.81, 1.86, 1.87 for 1..5; the fifth is inside 2% of the fourth.
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0.3, 0.3), 0.9), 4);
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(2, 0.3, 0.3), 0.9), 2);
  // p 0.5, 0.1 a draft: 1.36, 1.46, 1.44: two.
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0.1, 0.1), 0.5), 2);
  // A dear first draft and cheap further ones (a GPU): p 0.9, 0.7 then 0.1: 1.12, 1.51, 1.81, 2.05, 2.23, 2.37,
  // 2.48, 2.55 for 1..8.
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0.7, 0.1), 0.9), 8);
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(1, 0.7, 0.1), 0.9), 1);
  EXPECT_EQ(LookupDecoder::drafts_worth(costs(8, 0.7, 0.1), 0.5), 0);  // 0.88, 0.97, 0.99, 0.97, ...
  // The same with a step of 8 drafts costing 5 plain steps (past the GPU's few-token kernels): seven.
  std::vector<double> jump = costs(8, 0.7, 0.1);
  jump[8] = 5.0;
  EXPECT_EQ(LookupDecoder::drafts_worth(jump, 0.9), 7);
}

class EngineLookup : public ::testing::TestWithParam<quant::Type> {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "engine_lookup_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    testing::write_tiny(dir_ + "/m.gguf", GetParam(), 5);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Engine> load(bool disk_kv = false) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 160;
    o.n_batch = 16;
    o.experts = ExpertMode::kResident;
    if (disk_kv) o.kv_disk = {.dir = dir_ + "/kv", .gb = 0.01, .block_tokens = 8};
    auto e = Engine::load(dir_ + "/m.gguf", o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  static std::unique_ptr<Session> session(Engine& e) {
    auto s = e.new_session();
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  // A prompt that repeats a phrase, so that prompt lookup finds drafts.
  static Ids repeating_prompt() {
    Ids t;
    for (int r = 0; r < 3; ++r) {
      for (int32_t id : {11, 23, 5, 40, 7, 19, 33, 2, 50, 14}) t.push_back(id);
    }
    t.push_back(11);
    return t;
  }
  // n tokens generated from `prompt` by `sampling`, through LookupDecoder with up to `lookup` drafts a step (all it
  // finds, or with every_draft false as many as its measurements say pay).
  static Ids generate(Session& s, const Ids& prompt, const SamplingParams& sampling, int64_t lookup, int n,
                      bool every_draft = true) {
    EXPECT_TRUE(s.sync(prompt).ok());
    Sampler sampler(sampling);
    LookupDecoder decoder(s, every_draft);
    Ids out;
    for (int i = 0; i < n; ++i) {
      const int32_t id = sampler.sample(decoder.logits(), decoder.history());
      out.push_back(id);
      if (i + 1 == n) break;
      if (decoder.accept(id)) continue;
      const Status st = decoder.step(id, std::min<int64_t>(lookup, n - i - 2));
      EXPECT_TRUE(st.ok()) << st.message();
    }
    decoder.end();
    return out;
  }
  std::string dir_;
};

bool same_floats(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_P(EngineLookup, DraftRowsEqualSingleStepsAndRewindKeepsThem) {
  std::unique_ptr<Engine> engine = load();
  ASSERT_NE(engine, nullptr);
  const size_t V = size_t(engine->info().n_vocab);
  std::unique_ptr<Session> spec = session(*engine), single = session(*engine);
  const Ids prompt = repeating_prompt();
  ASSERT_TRUE(spec->sync(prompt).ok());
  ASSERT_TRUE(single->sync(prompt).ok());
  const Ids drafts = {23, 5, 40, 9};
  ASSERT_TRUE(spec->step(11, drafts).ok());
  ASSERT_EQ(spec->all_logits_first(), int64_t(prompt.size()));
  ASSERT_EQ(spec->all_logits().size(), (drafts.size() + 1) * V);
  std::vector<std::vector<float>> rows;
  for (size_t r = 0; r <= drafts.size(); ++r) {
    ASSERT_TRUE(single->step(r == 0 ? 11 : drafts[r - 1]).ok());
    rows.emplace_back(single->logits().begin(), single->logits().end());
    EXPECT_TRUE(same_floats(spec->all_logits().subspan(r * V, V), single->logits())) << "row " << r;
  }
  EXPECT_TRUE(same_floats(spec->logits(), rows.back()));
  // Keep 11, 23, 5: the rows of 40 and 9 go; logits() is 5's row.
  spec->rewind(prompt.size() + 3);
  EXPECT_EQ(spec->tokens().size(), prompt.size() + 3);
  EXPECT_EQ(spec->tokens().back(), 5);
  EXPECT_TRUE(same_floats(spec->logits(), rows[2]));
  // The timeline goes on from there as if the drafts after it had never been computed.
  ASSERT_TRUE(spec->step(17).ok());
  Ids expect(prompt);
  for (int32_t id : {11, 23, 5, 17}) expect.push_back(id);
  ASSERT_TRUE(single->sync(expect).ok());
  EXPECT_TRUE(same_floats(spec->logits(), single->logits()));
  EXPECT_EQ(spec->tokens(), expect);
  // Counted: one decode step with four drafts, two of them kept, then one step.
  EXPECT_EQ(spec->stats().draft_tokens, 4);
  EXPECT_EQ(spec->stats().drafts_accepted, 2);
  EXPECT_EQ(spec->stats().decode_tokens, 4);
}

TEST_P(EngineLookup, StepWithDraftsChecksItsInput) {
  std::unique_ptr<Engine> engine = load();
  ASSERT_NE(engine, nullptr);
  std::unique_ptr<Session> s = session(*engine);
  ASSERT_TRUE(s->sync(repeating_prompt()).ok());
  const Ids before = s->tokens();
  const int32_t V = int32_t(engine->info().n_vocab);
  EXPECT_FALSE(s->step(3, Ids{4, V}).ok());
  EXPECT_FALSE(s->step(V, Ids{4}).ok());
  EXPECT_FALSE(s->step(3, Ids(size_t(s->n_ctx()), 4)).ok());  // no room for them
  EXPECT_EQ(s->tokens(), before);
}

TEST_P(EngineLookup, GenerationWithDraftsIsTheGenerationWithout) {
  std::unique_ptr<Engine> engine = load();
  ASSERT_NE(engine, nullptr);
  const Ids prompt = repeating_prompt();
  const SamplingParams greedy{.temperature = 0};
  const SamplingParams seeded{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .seed = 42};
  for (const SamplingParams& sampling : {greedy, seeded}) {
    std::unique_ptr<Session> plain = session(*engine), spec = session(*engine);
    const Ids expect = generate(*plain, prompt, sampling, 0, 60);
    const Ids got = generate(*spec, prompt, sampling, 6, 60);
    EXPECT_EQ(got, expect) << "temperature " << sampling.temperature;
    EXPECT_EQ(plain->stats().draft_tokens, 0);
    EXPECT_GT(spec->stats().draft_tokens, 0) << "no drafts were tried";
    EXPECT_LE(spec->stats().drafts_accepted, spec->stats().draft_tokens);
    // Every generated token but the last was computed: by a step of its own, or as a kept draft.
    EXPECT_EQ(spec->stats().decode_tokens, 59);
    EXPECT_EQ(plain->stats().decode_tokens, 59);
    Ids timeline(prompt);
    timeline.insert(timeline.end(), got.begin(), got.end() - 1);
    EXPECT_EQ(spec->tokens(), timeline);
    // The decoder's own choice of drafts (whatever this machine's timings make it) changes nothing either.
    std::unique_ptr<Session> chosen = session(*engine);
    EXPECT_EQ(generate(*chosen, prompt, sampling, 6, 60, /*every_draft=*/false), expect);
    EXPECT_EQ(chosen->stats().decode_tokens, 59);
  }
}

TEST_P(EngineLookup, DiskKvSavesABlockOnlyOnceItsDraftsAreConfirmed) {
  std::unique_ptr<Engine> engine = load(/*disk_kv=*/true);
  ASSERT_NE(engine, nullptr);
  std::unique_ptr<Session> s = session(*engine);
  const Ids phrases = repeating_prompt();
  const Ids prompt(phrases.begin(), phrases.begin() + 14);  // blocks of 8: one saved
  ASSERT_TRUE(s->sync(prompt).ok());
  ASSERT_EQ(engine->kv_disk_stats().blocks_saved, 1u);
  // Positions 14..17: the token and three drafts complete the second block (rows 8..15) with drafts at 15-17.
  ASSERT_TRUE(s->step(30, Ids{31, 32, 33}).ok());
  EXPECT_EQ(engine->kv_disk_stats().blocks_saved, 1u) << "a block holding unconfirmed drafts was saved";
  s->rewind(prompt.size() + 1);  // only the token stays: the block is not complete
  EXPECT_EQ(engine->kv_disk_stats().blocks_saved, 1u);
  // 31 (no draft) at 15 completes the second block; drafts fill the third (16..23).
  ASSERT_TRUE(s->step(31, Ids{32, 33, 34, 35, 36, 37, 38, 39}).ok());
  EXPECT_EQ(engine->kv_disk_stats().blocks_saved, 2u);
  ASSERT_TRUE(s->step(40).ok());  // confirms them: rows 16..23 are the timeline's
  EXPECT_EQ(engine->kv_disk_stats().blocks_saved, 3u);
  // A restart restores the confirmed block and gives the logits of computing it all.
  const Ids timeline = s->tokens();
  s.reset();
  engine.reset();
  std::unique_ptr<Engine> again = load(/*disk_kv=*/true), plain = load();
  std::unique_ptr<Session> restored = session(*again), ref = session(*plain);
  ASSERT_TRUE(restored->sync(timeline).ok());
  EXPECT_EQ(restored->stats().restored_tokens, 24);
  ASSERT_TRUE(ref->sync(timeline).ok());
  EXPECT_TRUE(same_floats(restored->logits(), ref->logits()));
}

INSTANTIATE_TEST_SUITE_P(Weights, EngineLookup, ::testing::Values(quant::Type::F32, quant::Type::Q8_0),
                         [](const ::testing::TestParamInfo<quant::Type>& info) {
                           return std::string(quant::type_name(info.param));
                         });

}  // namespace lookup_test
}  // namespace magnetar
