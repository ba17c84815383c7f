// `magnetar serve --lookup N` (speculative decoding by prompt lookup): a completion that repeats its prompt, streamed
// (several tokens a step reach the SSE stream) and not, greedy and sampled with a seed, is the text `magnetar run`
// gives for the same prompt without drafts; /metrics counts the drafts and the right ones. The server runs with
// MAGNETAR_LOOKUP_EVERY_DRAFT=1 so that it drafts whatever the drafts cost on this machine (without it the decoder
// drafts only what pays, which on the tiny demo model is next to nothing).
#include <fstream>

#include "tests/server/harness.h"
#include "tests/tools/invoke.h"

namespace magnetar {
namespace lookup_test {

using namespace test;

const std::string kRepeating =
    "The cat sat on the mat. The dog sat on the log. The bird sat on the wire.\n"
    "The cat sat on the mat. The dog sat on the log. The bird sat on the wire.\n"
    "The cat sat on the mat. The dog sat on the log. The bird sat on the wire.\n"
    "The cat sat on the mat.";

class ServeLookup : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    start_server({"--ctx", "512", "--lookup", "8"}, {{"MAGNETAR_LOOKUP_EVERY_DRAFT", "1"}});
  }
  // `magnetar run`'s text for the prompt (no drafts), as the completion's: the output without run's final newline.
  static std::string run_text(const std::string& prompt, int n, const std::string& sampling) {
    testing::TempDir dir;
    std::ofstream(dir.file("prompt.txt")) << prompt;
    const testing::Invocation r =
        testing::run_magnetar("run -m " + kModel + " --ctx 512 -t 2 -f " + dir.file("prompt.txt") + " -n " +
                              std::to_string(n) + " " + sampling);
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out.empty() || r.out.back() != '\n' ? r.out : r.out.substr(0, r.out.size() - 1);
  }
};

TEST_F(ServeLookup, AnswersAreTheTextWithoutDrafts) {
  const int kTokens = 48;
  const std::string greedy = run_text(kRepeating, kTokens, "--temp 0");
  const std::string sampled = run_text(kRepeating, kTokens, "--temp 1 --seed 7");
  ASSERT_FALSE(greedy.empty());
  ASSERT_NE(greedy, sampled);
  const json body = {{"prompt", kRepeating}, {"max_tokens", kTokens}, {"temperature", 0}};
  int status = 0;
  const json r = post("/v1/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), greedy);
  json seeded = body;
  seeded["temperature"] = 1;
  seeded["seed"] = 7;
  EXPECT_EQ(post("/v1/completions", seeded, &status)["choices"][0]["text"].get<std::string>(), sampled);
  json streamed = body;
  streamed["stream"] = true;
  httplib::Client c = client();
  httplib::Result s = c.Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  std::string text;
  for (size_t at = 0; (at = s->body.find("data: {", at)) != std::string::npos;) {
    const size_t end = s->body.find("\n\n", at);
    const json chunk = json::parse(s->body.substr(at + 6, end - at - 6));
    text += chunk["choices"][0]["text"].get<std::string>();
    at = end;
  }
  EXPECT_EQ(text, greedy);
  const double drafts = metric("magnetar_lookup_draft_tokens_total");
  const double right = metric("magnetar_lookup_drafts_accepted_total");
  std::printf("lookup: %.0f drafts, %.0f right\n", drafts, right);
  EXPECT_GT(drafts, 0);
  EXPECT_GT(right, 0);
  EXPECT_LE(right, drafts);
}

}  // namespace lookup_test
}  // namespace magnetar
