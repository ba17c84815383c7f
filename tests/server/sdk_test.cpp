// `magnetar serve` driven by the official SDKs (the npm packages openai and @anthropic-ai/sdk, pinned, installed on
// first use into the parity tests' npm cache; SKIPPED without node, npm or the registry): chat (chat completions,
// responses and messages), streaming through
// each SDK's own stream helpers (which assemble tool-call and input_json deltas themselves), and a forced tool call
// sent back with its result. tests/server/sdk_clients.mjs runs the clients and prints what they got.
#include <cstdio>
#include <fstream>

#include "tests/npm_cache.h"
#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

constexpr const char* kSdkPackages = "openai@7.59.0 @anthropic-ai/sdk@1.14.0";

class ServeSdk : public ServeFixture {};

TEST_F(ServeSdk, OfficialClientsChatStreamAndToolRoundTrip) {
  const std::string skip = testing::ensure_npm_packages(kSdkPackages);
  if (!skip.empty()) GTEST_SKIP() << skip;
  const std::string out = std::string(MAGNETAR_BUILD_DIR) + "/tests/sdk_clients.json";
  const std::string err = std::string(MAGNETAR_BUILD_DIR) + "/tests/sdk_clients.err";
  const std::string cmd = "timeout 120 node " +
                          testing::shell_quote(std::string(MAGNETAR_SOURCE_DIR) + "/tests/server/sdk_clients.mjs") + " " +
                          testing::shell_quote(testing::npm_dir()) + " " + std::to_string(server->port) + " >" +
                          testing::shell_quote(out) + " 2>" + testing::shell_quote(err);
  ASSERT_EQ(testing::run_shell(cmd), 0) << testing::tail_of(err, 2000);
  std::ifstream in(out);
  const json r = json::parse(in, nullptr, false);
  ASSERT_TRUE(r.is_object()) << testing::tail_of(out, 2000);

  // OpenAI: a chat, the same text streamed, a forced call through chat.completions.stream(), its answer.
  const std::string text = r["openai_chat"]["content"];
  EXPECT_EQ(text.rfind(kAnswerStart, 0), 0u) << text;
  EXPECT_EQ(r["openai_chat"]["finish"], "length");
  EXPECT_EQ(r["openai_stream"], text);
  const json& call = r["openai_call"];
  EXPECT_EQ(call["finish"], "tool_calls") << call.dump();
  ASSERT_EQ(call["tool_calls"].size(), 1u) << call.dump();
  EXPECT_EQ(call["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["tool_calls"][0]["function"]["name"], "get_weather");
  const json arguments = json::parse(call["tool_calls"][0]["function"]["arguments"].get<std::string>(), nullptr, false);
  EXPECT_TRUE(arguments.is_object()) << call.dump();
  const std::string finish = r["openai_answer"]["finish"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << r["openai_answer"].dump();
  EXPECT_TRUE(r["openai_answer"]["content"].is_string());

  // Responses: the same text, cut by max_output_tokens (incomplete); the stream helper's final response the same;
  // the forced call a function_call item with the chat route's arguments; the answer after its output.
  EXPECT_EQ(r["responses_plain"]["text"], text) << r["responses_plain"].dump();
  EXPECT_EQ(r["responses_plain"]["status"], "incomplete");
  EXPECT_EQ(r["responses_plain"]["usage"]["output_tokens"], 30);
  EXPECT_EQ(r["responses_stream"]["text"], text);
  EXPECT_EQ(r["responses_stream"]["status"], "incomplete");
  const json& item = r["responses_call"];
  EXPECT_EQ(item["status"], "completed") << item.dump();
  EXPECT_EQ(item["types"], json::array({"function_call"})) << item.dump();
  EXPECT_EQ(item["call"]["name"], "get_weather");
  EXPECT_EQ(json::parse(item["call"]["arguments"].get<std::string>(), nullptr, false), arguments) << item.dump();
  const std::string after = r["responses_answer"]["status"];
  EXPECT_TRUE(after == "completed" || after == "incomplete") << r["responses_answer"].dump();
  EXPECT_TRUE(r["responses_answer"]["text"].is_string());

  // Anthropic: the same answers as content blocks; the stream helper's final message equals the plain one; the
  // forced tool_use carries the arguments the OpenAI route produced for the same prompt.
  EXPECT_EQ(r["anthropic_chat"]["content"], json::array({{{"type", "text"}, {"text", text}}}));
  EXPECT_EQ(r["anthropic_chat"]["stop"], "max_tokens");
  EXPECT_EQ(r["anthropic_stream"], r["anthropic_chat"]);
  const json& use = r["anthropic_call"];
  EXPECT_EQ(use["stop"], "tool_use") << use.dump();
  ASSERT_EQ(use["content"].size(), 1u) << use.dump();
  EXPECT_EQ(use["content"][0]["type"], "tool_use");
  EXPECT_EQ(use["content"][0]["name"], "get_weather");
  EXPECT_EQ(use["content"][0]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(use["content"][0]["input"], arguments);
  const std::string stop = r["anthropic_answer"]["stop"];
  EXPECT_TRUE(stop == "end_turn" || stop == "max_tokens") << r["anthropic_answer"].dump();
  EXPECT_EQ(r["anthropic_answer"]["content"][0]["type"], "text");
}

}  // namespace
}  // namespace magnetar
