// Keep-alives during a long prefill: with --batch 4 and --keepalive-seconds 0 the worker asks for one after every
// prefill chunk, so a streamed answer to a prompt of a few hundred tokens starts with SSE keep-alives (`: keep-alive`
// comments on the OpenAI routes, ping events on /v1/messages) before any content, and its text is still the
// non-stream answer.
#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

class ServeKeepAlive : public ServeFixture {
 protected:
  static void SetUpTestSuite() { start_server({"--batch", "4", "--keepalive-seconds", "0"}); }
  static std::string long_question(const std::string& topic) {
    std::string text = "Read this and answer about " + topic + ".";
    for (int i = 0; i < 12; ++i) text += " The quick brown fox jumps over the lazy dog number " + std::to_string(i) + ".";
    return text;
  }
};

TEST_F(ServeKeepAlive, OpenAIStreamSendsCommentsBeforeTheFirstChunk) {
  const json body = {{"messages", {{{"role", "user"}, {"content", long_question("foxes")}}}},
                     {"max_tokens", 12},
                     {"temperature", 0}};
  EXPECT_GT(post("/tokenize", {{"content", body["messages"][0]["content"]}})["tokens"].size(), 200u);
  json stream_body = body;
  stream_body["stream"] = true;
  int status = 0;
  // Streamed first, so that its prefill is the long one (the second request reuses the cached prompt).
  const std::string raw = raw_post("/v1/chat/completions", stream_body.dump(), &status);
  ASSERT_EQ(status, 200) << raw;
  const size_t first_data = raw.find("data: ");
  ASSERT_NE(first_data, std::string::npos) << raw;
  EXPECT_EQ(raw.rfind(": keep-alive\n\n", 0), 0u) << raw.substr(0, 200);
  EXPECT_LT(raw.find(": keep-alive\n\n"), first_data);
  std::string streamed;
  for (const auto& [name, data] : sse_events(raw)) {
    if (data == "[DONE]") continue;
    const json j = json::parse(data);
    const json& delta = j["choices"][0]["delta"];
    if (delta.contains("content")) streamed += delta["content"].get<std::string>();
  }
  const json r = post("/v1/chat/completions", body);
  EXPECT_EQ(streamed, r["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_FALSE(streamed.empty());
}

TEST_F(ServeKeepAlive, AnthropicStreamSendsPingsBeforeContentBlockStart) {
  const json body = {{"model", "m"},
                     {"max_tokens", 12},
                     {"messages", {{{"role", "user"}, {"content", long_question("dogs")}}}},
                     {"temperature", 0}};
  json stream_body = body;
  stream_body["stream"] = true;
  int status = 0;
  const std::string raw = raw_post("/v1/messages", stream_body.dump(), &status);
  ASSERT_EQ(status, 200) << raw;
  const auto events = sse_events(raw);
  ASSERT_GE(events.size(), 4u) << raw;
  EXPECT_EQ(events[0].first, "message_start");
  size_t pings = 0, block_start = events.size();
  std::string streamed;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].first == "ping" && block_start == events.size()) ++pings;
    if (events[i].first == "content_block_start" && block_start == events.size()) block_start = i;
    if (events[i].first == "content_block_delta") streamed += json::parse(events[i].second)["delta"]["text"];
  }
  ASSERT_LT(block_start, events.size()) << raw;
  EXPECT_GE(pings, 2u) << raw.substr(0, 400);  // the one after message_start, and at least one keep-alive
  const json r = post("/v1/messages", body);
  ASSERT_EQ(r["content"].size(), 1u) << r.dump();
  EXPECT_EQ(streamed, r["content"][0]["text"].get<std::string>());
  EXPECT_FALSE(streamed.empty());
}

}  // namespace
}  // namespace magnetar
