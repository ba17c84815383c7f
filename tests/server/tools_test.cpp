// `magnetar serve` end to end: tool calls, reasoning, response_format and frequency_penalty on both APIs
// (tests/server/harness.h starts the server on the demo model). The demo model was never trained on tools: the
// tool calls here are forced (tool_choice), which constrains its sampling to `<tool_call>` JSON, so they are
// deterministic. Expected prompts are written out by hand from Qwen3's chat template and compared through token
// counts (/tokenize); shapes and event orders are those of the OpenAI and Anthropic API references.
#include <fstream>

#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

const std::string kToolsBlock =
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather in "
    "a city\", \"parameters\": {\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], "
    "\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";
const std::string kQuestion = "What is the weather in Paris?";
// The round trip's prompt: the question, the call, its result, thinking off (the keys of the tool's parameters
// are sorted because this test's JSON sorts them when it sends the request; the server keeps the order it gets).
const std::string kRoundTripPrompt =
    kToolsBlock + "<|im_start|>user\n" + kQuestion +
    "<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
    "\"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21 degrees, sunny\n</tool_response>"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

json openai_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Get the current weather in a city"},
            {"parameters",
             {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};
}
json anthropic_tool() {
  return {
      {"name", "get_weather"},
      {"description", "Get the current weather in a city"},
      {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}};
}

class ServeTools : public ServeFixture {
 protected:
  // The demo model's own chat template renders no tools: these tests use the built-in ChatML (Qwen3's format).
  static void SetUpTestSuite() { start_server({"--chat-template", "chatml"}); }
  static json question() { return json::array({{{"role", "user"}, {"content", kQuestion}}}); }
  static json chat(json body, int expect_status = 200) {
    if (!body.contains("temperature")) body["temperature"] = 0;
    int status = 0;
    json r = post("/v1/chat/completions", body, &status);
    EXPECT_EQ(status, expect_status) << r.dump();
    return r;
  }
  static json messages(json body, int expect_status = 200) {
    if (!body.contains("temperature")) body["temperature"] = 0;
    if (!body.contains("max_tokens")) body["max_tokens"] = 120;
    int status = 0;
    json r = post("/v1/messages", body, &status);
    EXPECT_EQ(status, expect_status) << r.dump();
    return r;
  }
  static size_t n_tokens(const std::string& prompt) {
    return post("/tokenize", {{"content", prompt}})["tokens"].size();
  }
  static json forced_openai(json extra = json::object()) {
    json body = {{"messages", question()},
                 {"tools", json::array({openai_tool()})},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                 {"max_tokens", 120}};
    body.update(extra);
    return body;
  }
  static json forced_anthropic(json extra = json::object()) {
    json body = {{"messages", question()},
                 {"tools", json::array({anthropic_tool()})},
                 {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}}};
    body.update(extra);
    return body;
  }
  // The data of every `data:` line of an SSE body, [DONE] excluded.
  static std::vector<json> openai_chunks(const std::string& body) {
    std::vector<json> out;
    for (const auto& [name, data] : sse_events(body)) {
      if (data != "[DONE]") out.push_back(json::parse(data));
    }
    return out;
  }
};

// ---- OpenAI ---------------------------------------------------------------------------------------------------

TEST_F(ServeTools, OpenAIForcedToolCall) {
  const json r = chat(forced_openai());
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
  const json& message = choice["message"];
  EXPECT_TRUE(message["content"].is_null()) << r.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u) << r.dump();
  const json& call = message["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  ASSERT_TRUE(call["function"]["arguments"].is_string());
  const json arguments = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
  EXPECT_TRUE(arguments.is_object()) << call.dump();
  // The forced prefix is part of the prompt: the prompt is the tools block, the question and the opened call.
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(),
            n_tokens(kToolsBlock + "<|im_start|>user\n" + kQuestion +
                     "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{\"name\": "
                     "\"get_weather\", \"arguments\":"));
  EXPECT_GT(r["usage"]["completion_tokens"].get<int>(), 0);
}

// A forced call that max_tokens cuts is reported as cut (finish_reason "length", stop_reason "max_tokens") and comes
// back as its text, never as a call an agent would run with cut arguments.
TEST_F(ServeTools, AForcedCallCutByMaxTokensIsReportedAsTheLimit) {
  const json r = chat(forced_openai({{"max_tokens", 3}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << r.dump();
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls")) << r.dump();
  EXPECT_NE(r["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos)
      << r.dump();
  const json a = messages(forced_anthropic({{"max_tokens", 3}}));
  EXPECT_EQ(a["stop_reason"], "max_tokens") << a.dump();
  for (const json& block : a["content"]) EXPECT_NE(block["type"], "tool_use") << a.dump();
}

TEST_F(ServeTools, OpenAIStreamedToolCallReassemblesToTheSameCall) {
  const json want = chat(forced_openai())["choices"][0]["message"]["tool_calls"][0];
  int status = 0;
  const std::string body =
      raw_post("/v1/chat/completions", forced_openai({{"stream", true}, {"temperature", 0}}).dump(), &status);
  ASSERT_EQ(status, 200) << body;
  std::string name, arguments, id, finish;
  int begins = 0;
  for (const json& chunk : openai_chunks(body)) {
    const json& choice = chunk["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    const json& delta = choice["delta"];
    EXPECT_FALSE(delta.contains("content") && !delta["content"].get<std::string>().empty()) << chunk.dump();
    if (!delta.contains("tool_calls")) continue;
    ASSERT_EQ(delta["tool_calls"].size(), 1u);
    const json& call = delta["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    if (call.contains("id")) {
      ++begins;
      id = call["id"];
      EXPECT_EQ(call["type"], "function");
      name = call["function"]["name"];
      EXPECT_EQ(call["function"]["arguments"], "");
    } else {
      arguments += call["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(id.rfind("call_", 0), 0u);
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, want["function"]["arguments"].get<std::string>());
  EXPECT_EQ(finish, "tool_calls");
}

TEST_F(ServeTools, OpenAIRequiredPicksOneOfTheTools) {
  json other = openai_tool();
  other["function"]["name"] = "get_time";
  other["function"]["description"] = "Get the time in a city";
  const json r = chat(forced_openai({{"tools", {openai_tool(), other}}, {"tool_choice", "required"}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  const json& call = r["choices"][0]["message"]["tool_calls"][0];
  const std::string name = call["function"]["name"];
  EXPECT_TRUE(name == "get_weather" || name == "get_time") << name;
  EXPECT_TRUE(json::parse(call["function"]["arguments"].get<std::string>()).is_object());
}

// A stop sequence does not cut a forced call (the output constraint ends it): "name" appears in the call's JSON, and
// the cut call came back as its markup in the content with no tool_calls.
TEST_F(ServeTools, AStopSequenceDoesNotCutAForcedCall) {
  const json r = chat(forced_openai({{"tool_choice", "required"}, {"stop", {"name", "\"city"}}}));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  const json& message = r["choices"][0]["message"];
  ASSERT_EQ(message["tool_calls"].size(), 1u) << r.dump();
  EXPECT_TRUE(json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()).is_object());
  EXPECT_EQ(message["content"].dump().find("tool_call"), std::string::npos) << r.dump();
}

TEST_F(ServeTools, OpenAIToolRoundTrip) {
  // The call the model made, sent back with a result: a normal answer follows.
  const json first = chat(forced_openai())["choices"][0]["message"];
  json history = question();
  history.push_back(first);
  history.push_back(
      {{"role", "tool"}, {"tool_call_id", first["tool_calls"][0]["id"]}, {"content", "21 degrees, sunny"}});
  const json r = chat({{"messages", history}, {"tools", json::array({openai_tool()})}, {"max_tokens", 60}});
  const std::string finish = r["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << r.dump();
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string()) << r.dump();

  // A hand-written call renders as Qwen3's template renders it (checked through the prompt's token count).
  history = question();
  history.push_back({{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls",
                      {{{"id", "call_1"},
                        {"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 degrees, sunny"}});
  const json exact = chat({{"messages", history}, {"tools", json::array({openai_tool()})}, {"max_tokens", 8}});
  EXPECT_EQ(exact["usage"]["prompt_tokens"].get<size_t>(), n_tokens(kRoundTripPrompt)) << exact.dump();
}

TEST_F(ServeTools, OpenAIToolChoiceNoneRendersNoTools) {
  const json r = chat({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                       {"tools", json::array({openai_tool()})},
                       {"tool_choice", "none"}});
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), n_tokens(kPrompt));
  EXPECT_EQ(r["choices"][0]["message"]["content"].get<std::string>().rfind(kAnswerStart, 0), 0u) << r.dump();
}

TEST_F(ServeTools, OpenAIJsonObjectResponseFormat) {
  for (const json& format :
       {json{{"type", "json_object"}},
        json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}) {
    const json r = chat({{"messages", {{{"role", "user"}, {"content", "Describe yourself as JSON."}}}},
                         {"response_format", format},
                         {"temperature", 0},  // a random draw could run past max_tokens before the object closes
                         {"max_tokens", 200}});
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    const std::string content = r["choices"][0]["message"]["content"];
    EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << content;
  }
}

TEST_F(ServeTools, FrequencyPenalty) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"max_tokens", 60}};
  const std::string omitted = chat(body)["choices"][0]["message"]["content"];
  json zero = body;
  zero["frequency_penalty"] = 0;
  EXPECT_EQ(chat(zero)["choices"][0]["message"]["content"], omitted);
  json strong = body;
  strong["frequency_penalty"] = 2.0;
  EXPECT_NE(chat(strong)["choices"][0]["message"]["content"], omitted);
}

TEST_F(ServeTools, OpenAIBadToolRequestsAre400AndNameTheField) {
  json bad_arguments = question();
  bad_arguments.push_back(
      {{"role", "assistant"},
       {"tool_calls",
        {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{not json"}}}}}}});
  struct Case {
    json body;
    std::string field;
  };
  const Case cases[] = {
      {{{"messages", bad_arguments}}, "messages[1].tool_calls[0].function.arguments"},
      {forced_openai({{"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}), "tool_choice"},
      {{{"messages", question()}, {"tool_choice", "required"}}, "tool_choice"},
      {{{"messages", question()}, {"tools", {{{"type", "function"}, {"function", {{"name", 3}}}}}}},
       "tools[0].function.name"},
      {{{"messages", question()}, {"response_format", {{"type", "yaml"}}}}, "response_format"},
  };
  for (const Case& c : cases) {
    const json r = chat(c.body, 400);
    EXPECT_NE(r["error"]["message"].get<std::string>().find(c.field), std::string::npos) << r.dump();
  }
}

// ---- Anthropic ------------------------------------------------------------------------------------------------

TEST_F(ServeTools, AnthropicForcedToolUse) {
  const json r = messages(forced_anthropic());
  EXPECT_EQ(r["stop_reason"], "tool_use") << r.dump();
  ASSERT_EQ(r["content"].size(), 1u) << r.dump();
  const json& block = r["content"][0];
  EXPECT_EQ(block["type"], "tool_use");
  EXPECT_EQ(block["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(block["name"], "get_weather");
  EXPECT_TRUE(block["input"].is_object()) << r.dump();
  // The same prompt as the OpenAI route's (one conversation, one renderer).
  const json openai = chat(forced_openai());
  EXPECT_EQ(r["usage"]["input_tokens"].get<int>() + r["usage"]["cache_read_input_tokens"].get<int>(),
            openai["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(json::parse(openai["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            block["input"]);
}

TEST_F(ServeTools, AnthropicStreamedToolUseEventOrder) {
  const json want = messages(forced_anthropic());
  int status = 0;
  const std::string body = raw_post(
      "/v1/messages", forced_anthropic({{"stream", true}, {"temperature", 0}, {"max_tokens", 120}}).dump(), &status);
  ASSERT_EQ(status, 200) << body;
  const auto events = sse_events(body);
  ASSERT_GE(events.size(), 7u) << body;
  std::vector<std::string> names;
  std::string partial;
  for (const auto& [name, data] : events) {
    const json j = json::parse(data);
    EXPECT_EQ(j["type"], name);
    if (names.empty() || names.back() != name || name != "content_block_delta") names.push_back(name);
    if (name == "content_block_start") {
      EXPECT_EQ(j["index"], 0);
      EXPECT_EQ(j["content_block"]["type"], "tool_use");
      EXPECT_EQ(j["content_block"]["name"], "get_weather");
      EXPECT_EQ(j["content_block"]["id"].get<std::string>().rfind("toolu_", 0), 0u);
      EXPECT_EQ(j["content_block"]["input"], json::object());
    }
    if (name == "content_block_delta") {
      EXPECT_EQ(j["index"], 0);
      EXPECT_EQ(j["delta"]["type"], "input_json_delta");
      partial += j["delta"]["partial_json"].get<std::string>();
    }
    if (name == "message_delta") {
      EXPECT_EQ(j["delta"]["stop_reason"], "tool_use");
      EXPECT_EQ(j["usage"]["output_tokens"], want["usage"]["output_tokens"]);
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "ping", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"}))
      << body;
  EXPECT_EQ(json::parse(partial), want["content"][0]["input"]);
}

TEST_F(ServeTools, AnthropicToolResultRoundTrip) {
  const json first = messages(forced_anthropic());
  const json& use = first["content"][0];
  json history = question();
  history.push_back({{"role", "assistant"}, {"content", first["content"]}});
  history.push_back(
      {{"role", "user"},
       {"content", {{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "21 degrees, sunny"}}}}});
  const json r = messages({{"messages", history}, {"tools", json::array({anthropic_tool()})}, {"max_tokens", 60}});
  const std::string stop = r["stop_reason"];
  EXPECT_TRUE(stop == "end_turn" || stop == "max_tokens") << r.dump();
  ASSERT_FALSE(r["content"].empty());
  EXPECT_EQ(r["content"][0]["type"], "text") << r.dump();

  // A hand-written exchange (tool_result content as text blocks) renders as the template does.
  history = question();
  history.push_back(
      {{"role", "assistant"},
       {"content",
        {{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}});
  history.push_back({{"role", "user"},
                     {"content",
                      {{{"type", "tool_result"},
                        {"tool_use_id", "toolu_1"},
                        {"content", {{{"type", "text"}, {"text", "21 degrees, sunny"}}}}}}}});
  const json counted =
      post("/v1/messages/count_tokens", {{"messages", history}, {"tools", json::array({anthropic_tool()})}});
  EXPECT_EQ(counted["input_tokens"].get<size_t>(), n_tokens(kRoundTripPrompt)) << counted.dump();
}

// The content blocks of a streamed Anthropic message (SSE body), put together from content_block_start and the
// deltas as Anthropic's SDKs do; a thinking block must end with its signature_delta (else a failure).
json anthropic_stream_blocks(const std::string& body) {
  json blocks = json::array();
  bool signed_last = false;  // the last delta was a thinking block's signature_delta
  for (const auto& [name, data] : sse_events(body)) {
    const json j = json::parse(data);
    if (name == "content_block_start") blocks.push_back(j["content_block"]);
    if (name == "content_block_stop" && blocks.back()["type"] == "thinking") {
      EXPECT_TRUE(signed_last) << "a thinking block ends with its signature_delta: " << body;
    }
    if (name == "content_block_delta") {
      json& block = blocks.back();
      signed_last = false;
      if (block["type"] == "thinking" && j["delta"]["type"] == "signature_delta") {
        block["signature"] = block["signature"].get<std::string>() + j["delta"]["signature"].get<std::string>();
        signed_last = true;
      } else if (block["type"] == "thinking") {
        EXPECT_EQ(j["delta"]["type"], "thinking_delta");
        block["thinking"] = block["thinking"].get<std::string>() + j["delta"]["thinking"].get<std::string>();
      } else {
        EXPECT_EQ(j["delta"]["type"], "text_delta");
        block["text"] = block["text"].get<std::string>() + j["delta"]["text"].get<std::string>();
      }
    }
  }
  return blocks;
}

TEST_F(ServeTools, AnthropicThinking) {
  // Thinking on: the prompt ends at the assistant header (no empty think block), and a budget is accepted.
  const json r = messages({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                           {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                           {"max_tokens", 200}});
  EXPECT_EQ(r["usage"]["input_tokens"].get<size_t>() + r["usage"]["cache_read_input_tokens"].get<size_t>(),
            n_tokens("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"));
  // The demo model may or may not open a think block: when it does, the thinking block comes first and holds
  // text; the rest are text blocks.
  ASSERT_FALSE(r["content"].empty()) << r.dump();
  for (size_t i = 0; i < r["content"].size(); ++i) {
    const json& block = r["content"][i];
    if (block["type"] == "thinking") {
      EXPECT_EQ(i, 0u) << r.dump();
      EXPECT_FALSE(block["thinking"].get<std::string>().empty());
      ASSERT_TRUE(block["signature"].is_string());
      EXPECT_FALSE(block["signature"].get<std::string>().empty()) << "Claude Code drops unsigned thinking";
    } else {
      EXPECT_EQ(block["type"], "text") << r.dump();
    }
  }
  // The stream carries the same blocks: thinking_delta in a thinking block, text_delta in a text block.
  int status = 0;
  const std::string body = raw_post("/v1/messages",
                                    json({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                                          {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                                          {"max_tokens", 200},
                                          {"temperature", 0},
                                          {"stream", true}})
                                        .dump(),
                                    &status);
  ASSERT_EQ(status, 200);
  const json blocks = anthropic_stream_blocks(body);
  EXPECT_EQ(blocks, r["content"]);
  // Without a budget or with thinking disabled: the plain prompt.
  const json off =
      messages({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"thinking", {{"type", "disabled"}}}});
  EXPECT_EQ(off["usage"]["input_tokens"].get<size_t>() + off["usage"]["cache_read_input_tokens"].get<size_t>(),
            n_tokens(kPrompt));
}

TEST_F(ServeTools, OpenAIReasoningContent) {
  const json r = chat({{"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                       {"chat_template_kwargs", {{"enable_thinking", true}}},
                       {"max_tokens", 200}});
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(),
            n_tokens("<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"));
  const json& message = r["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_string());
  if (message.contains("reasoning_content")) {
    EXPECT_FALSE(message["reasoning_content"].get<std::string>().empty());
  }
  EXPECT_EQ(message["content"].get<std::string>().find("<think>"), std::string::npos) << r.dump();
}

// A template that always opens the think block (Qwen3's *-Thinking-2507): a request that did not ask for thinking
// still gets the reasoning as reasoning, not in the answer (before, everything up to and with </think> came back as
// content).
class ServeThinkingTemplate : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    path_ = ::testing::TempDir() + "thinking_" + std::to_string(getpid()) + ".jinja";
    std::ofstream(path_) << "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                            "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";
    start_server({"--chat-template-file", path_});
  }
  static void TearDownTestSuite() {
    ServeFixture::TearDownTestSuite();
    std::remove(path_.c_str());
  }
  inline static std::string path_;
};

// A forced tool call or a JSON answer is the answer, not reasoning: the block the template opened is closed empty
// before the constrained output (before, the call and the JSON came back as reasoning_content).
TEST_F(ServeThinkingTemplate, AForcedCallOrJsonClosesTheThinkBlockFirst) {
  int status = 0;
  const json question = {{"role", "user"}, {"content", "What is the weather in Paris?"}};
  const json forced = post("/v1/chat/completions",
                           {{"messages", {question}},
                            {"tools", json::array({openai_tool()})},
                            {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                            {"max_tokens", 120},
                            {"temperature", 0}},
                           &status);
  ASSERT_EQ(status, 200) << forced.dump();
  const json& choice = forced["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << forced.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << forced.dump();
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_FALSE(choice["message"].contains("reasoning_content")) << forced.dump();
  const json as_json = post("/v1/chat/completions",
                            {{"messages", {question}},
                             {"response_format", {{"type", "json_object"}}},
                             {"max_tokens", 60},
                             {"temperature", 0}},
                            &status);
  ASSERT_EQ(status, 200) << as_json.dump();
  const json& message = as_json["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content")) << as_json.dump();
  EXPECT_TRUE(json::parse(message["content"].get<std::string>(), nullptr, false).is_object()) << as_json.dump();
}

TEST_F(ServeThinkingTemplate, ReasoningIsNeverTheAnswer) {
  // The demo model answers with an empty think block ("<think>\n\n</think>\n\nI am ..."), inside the one the
  // template opened: its markup is reasoning, the answer is the text after </think>.
  int status = 0;
  const json question = {{"role", "user"}, {"content", "Who are you?"}};
  const json r =
      post("/v1/chat/completions", {{"messages", {question}}, {"max_tokens", 12}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const std::string content = r["choices"][0]["message"]["content"].get<std::string>();
  EXPECT_EQ(content.find("think>"), std::string::npos) << r.dump();
  EXPECT_NE(content.find("I am"), std::string::npos) << r.dump();
  const json a = post("/v1/messages", {{"messages", {question}}, {"max_tokens", 12}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << a.dump();
  EXPECT_EQ(a["content"][0]["type"], "thinking") << a.dump();
  for (const json& block : a["content"]) {
    if (block["type"] == "text") {
      EXPECT_EQ(block["text"].get<std::string>().find("think>"), std::string::npos) << a.dump();
    }
  }
}

// Anthropic's thinking blocks carry a signature that clients keep and send back: Claude Code drops a thinking block
// without one (and with it an answer of thinking only). The template opens the think block, so the answer starts
// with one: its signature is not empty, and the stream gives it in a signature_delta just before the block's
// content_block_stop, the same as the answer without streaming; a block sent back with it is accepted.
TEST_F(ServeThinkingTemplate, AnthropicThinkingBlocksAreSigned) {
  const json body = {
      {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}, {"max_tokens", 12}, {"temperature", 0}};
  int status = 0;
  const json r = post("/v1/messages", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["content"][0]["type"], "thinking") << r.dump();
  EXPECT_FALSE(r["content"][0]["signature"].get<std::string>().empty()) << r.dump();
  json streamed = body;
  streamed["stream"] = true;
  const std::string sse = raw_post("/v1/messages", streamed.dump(), &status);
  ASSERT_EQ(status, 200) << sse;
  EXPECT_EQ(anthropic_stream_blocks(sse), r["content"]) << sse;
  json again = body;
  again["messages"].push_back({{"role", "assistant"}, {"content", r["content"]}});
  again["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
  post("/v1/messages", again, &status);
  EXPECT_EQ(status, 200);
}

}  // namespace
}  // namespace magnetar
