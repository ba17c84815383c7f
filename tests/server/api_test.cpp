// `magnetar serve` end to end: the Anthropic Messages routes, /metrics and the legacy /v1/completions
// (tests/server/harness.h starts the server). Expectations are independent of the server's code: the greedy answer
// comes from PyTorch (models/magnetar-demo.report.json), prompts are ChatML written out by hand, token counts come
// from /tokenize, and event names and fields are those of the Anthropic and OpenAI API references.
#include <sys/stat.h>

#include <ctime>
#include <map>
#include <sstream>

#include "tests/server/harness.h"

namespace magnetar {
namespace {

using namespace test;

const std::string kSystemPrompt = "<|im_start|>system\nBe brief.<|im_end|>\n" + kPrompt;

class ServeApi : public ServeFixture {
 protected:
  static json who_are_you(json extra = json::object()) {
    json body = {{"model", "claude-sonnet-4-5"},
                 {"max_tokens", 400},
                 {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
                 {"temperature", 0}};
    body.update(extra);
    return body;
  }
  static json messages(const json& body, int expect_status = 200) {
    int status = 0;
    json r = post("/v1/messages?beta=true", body, &status);
    EXPECT_EQ(status, expect_status) << r.dump();
    return r;
  }
  static size_t n_tokens(const std::string& prompt) {
    return post("/tokenize", {{"content", prompt}})["tokens"].size();
  }
  // GET /metrics as {series (name with its labels) -> value}.
  static std::map<std::string, double> metrics() {
    httplib::Client c = client();
    httplib::Result r = c.Get("/metrics");
    EXPECT_TRUE(r);
    std::map<std::string, double> out;
    if (!r) return out;
    EXPECT_EQ(r->status, 200);
    std::istringstream lines(r->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] == '#') continue;
      const size_t space = line.rfind(' ');
      out[line.substr(0, space)] = std::stod(line.substr(space + 1));
    }
    return out;
  }
};

TEST_F(ServeApi, AnthropicNonStream) {
  // Fields the server has no use for are accepted, as Claude Code sends them (tools change the prompt: their
  // tests are in tools_test.cpp).
  const json r = messages(who_are_you({{"metadata", {{"user_id", "u"}}},
                                       {"thinking", {{"type", "disabled"}}},
                                       {"context_management", json::object()},
                                       {"tool_choice", {{"type", "auto"}}}}));
  EXPECT_EQ(r["id"].get<std::string>().rfind("msg_", 0), 0u) << r.dump();
  EXPECT_EQ(r["type"], "message");
  EXPECT_EQ(r["role"], "assistant");
  EXPECT_EQ(r["model"], "magnetar-demo-q8_0");
  ASSERT_EQ(r["content"].size(), 1u) << r.dump();
  EXPECT_EQ(r["content"][0]["type"], "text");
  const std::string text = r["content"][0]["text"];
  EXPECT_EQ(text.rfind(kAnswerStart, 0), 0u) << text;
  EXPECT_EQ(r["stop_reason"], "end_turn");
  EXPECT_TRUE(r["stop_sequence"].is_null());
  const json& usage = r["usage"];
  EXPECT_EQ(usage["input_tokens"].get<size_t>() + usage["cache_read_input_tokens"].get<size_t>(), n_tokens(kPrompt));
  EXPECT_GT(usage["output_tokens"].get<int>(), 3);
}

TEST_F(ServeApi, AnthropicStreamMatchesNonStream) {
  const json want = messages(who_are_you());
  int status = 0;
  const std::string body = raw_post("/v1/messages?beta=true", who_are_you({{"stream", true}}).dump(), &status);
  ASSERT_EQ(status, 200) << body;
  const auto events = sse_events(body);
  ASSERT_GE(events.size(), 7u) << body;
  const std::vector<std::string> head = {"message_start", "ping", "content_block_start"};
  const std::vector<std::string> tail = {"content_block_stop", "message_delta", "message_stop"};
  std::string text;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& [name, data] = events[i];
    const json j = json::parse(data);
    EXPECT_EQ(j["type"], name) << data;  // every data object repeats its event name
    if (i < 3) {
      EXPECT_EQ(name, head[i]);
    } else if (i + 3 >= events.size()) {
      EXPECT_EQ(name, tail[i + 3 - events.size()]);
    } else {
      ASSERT_EQ(name, "content_block_delta") << data;
      EXPECT_EQ(j["index"], 0);
      EXPECT_EQ(j["delta"]["type"], "text_delta");
      text += j["delta"]["text"].get<std::string>();
    }
  }
  const json start = json::parse(events[0].second)["message"];
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["content"], json::array());
  EXPECT_EQ(start["usage"]["input_tokens"].get<size_t>() + start["usage"]["cache_read_input_tokens"].get<size_t>(),
            n_tokens(kPrompt));
  const json block = json::parse(events[2].second);
  EXPECT_EQ(block["index"], 0);
  EXPECT_EQ(block["content_block"], json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(text, want["content"][0]["text"].get<std::string>());
  const json delta = json::parse(events[events.size() - 2].second);
  EXPECT_EQ(delta["delta"]["stop_reason"], "end_turn");
  EXPECT_TRUE(delta["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(delta["usage"]["output_tokens"], want["usage"]["output_tokens"]);
  EXPECT_EQ(delta["usage"]["input_tokens"], start["usage"]["input_tokens"]);  // counts so far, as Anthropic's
  EXPECT_EQ(delta["usage"]["cache_read_input_tokens"], start["usage"]["cache_read_input_tokens"]);
}

TEST_F(ServeApi, AnthropicStopReasons) {
  const json length = messages(who_are_you({{"max_tokens", 3}}));
  EXPECT_EQ(length["stop_reason"], "max_tokens");
  EXPECT_TRUE(length["stop_sequence"].is_null());
  EXPECT_EQ(length["usage"]["output_tokens"], 3);
  const json stop = messages(who_are_you({{"stop_sequences", {"nothing like this", "language"}}}));
  EXPECT_EQ(stop["stop_reason"], "stop_sequence");
  EXPECT_EQ(stop["stop_sequence"], "language");
  EXPECT_EQ(stop["content"][0]["text"], "I am a tiny ");
  // The same in a stream: message_delta carries the matched string.
  int status = 0;
  const std::string body =
      raw_post("/v1/messages", who_are_you({{"stream", true}, {"stop_sequences", {"language"}}}).dump(), &status);
  ASSERT_EQ(status, 200);
  const auto events = sse_events(body);
  ASSERT_GE(events.size(), 2u) << body;
  const json delta = json::parse(events[events.size() - 2].second);
  EXPECT_EQ(delta["delta"]["stop_reason"], "stop_sequence") << body;
  EXPECT_EQ(delta["delta"]["stop_sequence"], "language") << body;
}

TEST_F(ServeApi, AnthropicErrorsHaveAnthropicShape) {
  json body = who_are_you();
  body.erase("max_tokens");
  struct Case {
    std::string body, field;
  };
  const Case cases[] = {
      {body.dump(), "max_tokens"},
      {who_are_you({{"max_tokens", 0}}).dump(), "max_tokens"},
      {"{not json", "JSON"},
      {who_are_you({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}).dump(), "messages[0].role"},
      {who_are_you({{"stop_sequences", "language"}}).dump(), "stop_sequences"},
      {who_are_you({{"messages", {{{"role", "user"}}}}}).dump(), "messages[0].content is required"},
      {who_are_you({{"messages", {{{"role", "user"}, {"content", {{{"type", "video"}}}}}}}}).dump(),
       "messages[0].content[0]"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const json r = json::parse(raw_post("/v1/messages?beta=true", c.body, &status), nullptr, false);
    EXPECT_EQ(status, 400) << c.body;
    ASSERT_TRUE(r.is_object()) << c.body;
    EXPECT_EQ(r["type"], "error") << r.dump();
    EXPECT_EQ(r["error"]["type"], "invalid_request_error") << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(c.field), std::string::npos) << r.dump();
  }
  httplib::Client c = client();
  httplib::Result missing = c.Post("/v1/messages/nothing", "{}", "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["type"], "not_found_error");
}

// A prompt the context cannot hold is refused with the words coding agents look for to compact their history and
// retry: Anthropic's "prompt is too long: N tokens > M maximum" (N the prompt's tokens as count_tokens counts them, M
// the context less the one token to generate), OpenAI's "maximum context length" and code context_length_exceeded.
TEST_F(ServeApi, APromptTooLongIsRefusedInTheWordsAgentsLookFor) {
  httplib::Client c = client();
  httplib::Result st = c.Get("/v1/status");
  ASSERT_TRUE(st);
  const long long n_ctx = json::parse(st->body)["model"]["n_ctx"].get<long long>();
  std::string longer;
  for (long long i = 0; i < n_ctx; ++i) longer += "word ";
  const json conversation = {{"messages", {{{"role", "user"}, {"content", longer}}}}};
  const long long n_prompt = post("/v1/messages/count_tokens", conversation)["input_tokens"].get<long long>();
  ASSERT_GE(n_prompt, n_ctx);
  json body = conversation;
  body["max_tokens"] = 16;
  int status = 0;
  const json anthropic = post("/v1/messages", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(anthropic["type"], "error") << anthropic.dump();
  EXPECT_EQ(anthropic["error"]["type"], "invalid_request_error") << anthropic.dump();
  const std::string expected =
      "prompt is too long: " + std::to_string(n_prompt) + " tokens > " + std::to_string(n_ctx - 1) + " maximum";
  EXPECT_EQ(anthropic["error"]["message"].get<std::string>().substr(0, expected.size()), expected) << anthropic.dump();
  const json openai = post("/v1/chat/completions", conversation, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(openai["error"]["code"], "context_length_exceeded") << openai.dump();
  EXPECT_EQ(openai["error"]["type"], "invalid_request_error") << openai.dump();
  EXPECT_NE(openai["error"]["message"].get<std::string>().find("maximum context length is " + std::to_string(n_ctx) +
                                                               " tokens"),
            std::string::npos)
      << openai.dump();
  // Other refusals carry no such code.
  const json bad = post("/v1/chat/completions", {{"messages", "x"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_FALSE(bad["error"].contains("code")) << bad.dump();
}

// GET /v1/models and /v1/models/{id} in the shape of the API the client speaks: OpenAI's model object (id, object,
// created, owned_by) with vLLM's max_model_len, the context; Anthropic's ModelInfo (type, id, display_name, created_at
// in RFC 3339) and list fields where the request carries anthropic-version, as Anthropic's SDKs send it. The time is
// the model file's; an unknown id is a 404 in the API's error shape.
TEST_F(ServeApi, ModelsInTheShapeOfEachApi) {
  httplib::Client c = client();
  httplib::Result st = c.Get("/v1/status");
  ASSERT_TRUE(st);
  const long long n_ctx = json::parse(st->body)["model"]["n_ctx"].get<long long>();
  struct stat file {};
  ASSERT_EQ(::stat(kModel.c_str(), &file), 0);
  char at[32];
  std::tm tm{};
  gmtime_r(&file.st_mtime, &tm);
  std::strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string id = "magnetar-demo-q8_0";  // the file's name without .gguf

  httplib::Result openai = c.Get("/v1/models");
  ASSERT_TRUE(openai);
  const json o = json::parse(openai->body);
  EXPECT_EQ(o["object"], "list");
  ASSERT_EQ(o["data"].size(), 1u) << o.dump();
  const json expected_openai = {{"id", id},
                                {"object", "model"},
                                {"created", int64_t(file.st_mtime)},
                                {"owned_by", "magnetar"},
                                {"max_model_len", n_ctx}};
  EXPECT_EQ(o["data"][0], expected_openai);
  httplib::Result one = c.Get(("/v1/models/" + id).c_str());
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(json::parse(one->body), expected_openai);

  const httplib::Headers anthropic_headers = {{"anthropic-version", "2023-06-01"}};
  httplib::Result anthropic = c.Get("/v1/models", anthropic_headers);
  ASSERT_TRUE(anthropic);
  const json a = json::parse(anthropic->body);
  const json expected_anthropic = {{"type", "model"}, {"id", id}, {"display_name", id}, {"created_at", at}};
  ASSERT_EQ(a["data"].size(), 1u) << a.dump();
  EXPECT_EQ(a["data"][0], expected_anthropic);
  EXPECT_EQ(a["has_more"], false);
  EXPECT_EQ(a["first_id"], id);
  EXPECT_EQ(a["last_id"], id);
  httplib::Result a_one = c.Get(("/v1/models/" + id).c_str(), anthropic_headers);
  ASSERT_TRUE(a_one);
  EXPECT_EQ(json::parse(a_one->body), expected_anthropic);

  httplib::Result missing = c.Get("/v1/models/claude-sonnet-4-5");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["type"], "not_found_error") << missing->body;
  httplib::Result a_missing = c.Get("/v1/models/claude-sonnet-4-5", anthropic_headers);
  ASSERT_TRUE(a_missing);
  EXPECT_EQ(a_missing->status, 404);
  EXPECT_EQ(json::parse(a_missing->body)["type"], "error") << a_missing->body;
  EXPECT_EQ(json::parse(a_missing->body)["error"]["type"], "not_found_error") << a_missing->body;
}

// A valid body nested a million levels deep is refused before it is parsed (copying its parse recursed until the
// stack overflowed: the process died); the server goes on.
TEST_F(ServeApi, ADeeplyNestedBodyIsRefused) {
  const std::string deep =
      "{\"messages\":[{\"role\":\"user\",\"content\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}]}";
  for (const char* path : {"/v1/chat/completions", "/v1/messages"}) {
    int status = 0;
    const json r = json::parse(raw_post(path, deep, &status), nullptr, false);
    EXPECT_EQ(status, 400) << path;
    EXPECT_NE(r.dump().find("deeper than 256 levels"), std::string::npos) << r.dump();
  }
  int status = 0;
  post("/v1/messages", who_are_you(), &status);
  EXPECT_EQ(status, 200);
}

// A body with an object of a million members is refused before it is parsed (ordered_json's parse inserts each
// member after a linear search: hours of a core); tool call arguments sent as a string are held to the same limits
// as a body (a million levels deep, they were parsed unchecked and copied recursively).
TEST_F(ServeApi, AWideBodyAndDeepArgumentsAreRefused) {
  std::string wide = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"metadata\":{";
  for (int i = 0; i < 1000000; ++i) wide += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  wide += "}}";
  const std::string args = "{\\\"a\\\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  const std::string deep_args =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
      "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"" +
      args + "\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]}";
  int status = 0;
  json r = json::parse(raw_post("/v1/chat/completions", wide, &status), nullptr, false);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r.dump().find("the request body has too many object members to parse in reasonable time (1000000 in its "
                          "largest object"),
            std::string::npos)
      << r.dump().substr(0, 500);
  r = json::parse(raw_post("/v1/chat/completions", deep_args, &status), nullptr, false);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r.dump().find("messages[1].tool_calls[0].function.arguments nests arrays and objects deeper than 256"),
            std::string::npos)
      << r.dump().substr(0, 500);
  post("/v1/messages", who_are_you(), &status);
  EXPECT_EQ(status, 200);
}

TEST_F(ServeApi, CountTokensEqualsTokenizeOfTheChatmlPrompt) {
  int status = 0;
  const json plain = post("/v1/messages/count_tokens?beta=true",
                          {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}}, &status);
  EXPECT_EQ(status, 200) << plain.dump();
  EXPECT_EQ(plain["input_tokens"].get<size_t>(), n_tokens(kPrompt));
  // System as a string or as text blocks, content as text blocks: the same prompt.
  const json as_string =
      post("/v1/messages/count_tokens",
           {{"system", "Be brief."}, {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}}});
  const json as_blocks =
      post("/v1/messages/count_tokens",
           {{"system", {{{"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}}}},
            {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Who are you?"}}}}}}}});
  EXPECT_EQ(as_string["input_tokens"].get<size_t>(), n_tokens(kSystemPrompt));
  EXPECT_EQ(as_blocks["input_tokens"].get<size_t>(), n_tokens(kSystemPrompt));
  // Tool blocks are accepted (rendered as Qwen3's <tool_call> and <tool_response>) and count.
  const json with_tools =
      post("/v1/messages/count_tokens",
           {{"messages",
             {{{"role", "user"}, {"content", "List files."}},
              {{"role", "assistant"},
               {"content", {{{"type", "tool_use"}, {"id", "t1"}, {"name", "Bash"}, {"input", {{"command", "ls"}}}}}}},
              {{"role", "user"},
               {"content", {{{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", "README.md"}}}}}}}},
           &status);
  EXPECT_EQ(status, 200) << with_tools.dump();
  EXPECT_GT(with_tools["input_tokens"].get<size_t>(), n_tokens("List files.") + n_tokens("README.md"));
}

// Claude Code opens its system prompt with `x-anthropic-billing-header: ...; cch=HASH;`, a hash that changes with
// every request: the line is dropped (as a block of its own, or the first line of a string), so the prompt is the one
// without it, and a second request that differs only in the hash reuses the whole cached prompt (with the line kept,
// the prompts part within the first few tokens and each request computed everything again).
TEST_F(ServeApi, ClaudeCodesBillingHeaderDoesNotBreakThePromptCache) {
  auto with_header = [](const std::string& hash, bool as_string) {
    const std::string header =
        "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=" + hash + ";";
    json system =
        as_string
            ? json(header + "\nBe brief.")
            : json::array({{{"type", "text"}, {"text", header}},
                           {{"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}}});
    return who_are_you({{"system", system}, {"max_tokens", 2}});
  };
  for (const bool as_string : {false, true}) {
    const json counted = post("/v1/messages/count_tokens", with_header("fa690", as_string));
    EXPECT_EQ(counted["input_tokens"].get<size_t>(), n_tokens(kSystemPrompt)) << counted.dump();
  }
  messages(with_header("fa690", false));
  const json again = messages(with_header("0aaa9", false));
  EXPECT_EQ(again["usage"]["input_tokens"].get<size_t>() + again["usage"]["cache_read_input_tokens"].get<size_t>(),
            n_tokens(kSystemPrompt));
  EXPECT_GE(again["usage"]["cache_read_input_tokens"].get<size_t>() + 2, n_tokens(kSystemPrompt)) << again.dump();
}

// Claude Code (2.1.154 on) sends system messages inside `messages`: accepted (before: a 400 on every request) and
// rendered where they stand, as Qwen3's template renders a system message after the first.
TEST_F(ServeApi, SystemMessagesAmongTheMessages) {
  const json first = post("/v1/messages/count_tokens",
                          {{"messages",
                            {{{"role", "system"}, {"content", {{{"type", "text"}, {"text", "Be brief."}}}}},
                             {{"role", "user"}, {"content", "Who are you?"}}}}});
  EXPECT_EQ(first["input_tokens"].get<size_t>(), n_tokens(kSystemPrompt)) << first.dump();
  const json between = post("/v1/messages/count_tokens", {{"system", "Be brief."},
                                                          {"messages",
                                                           {{{"role", "user"}, {"content", "Hi."}},
                                                            {{"role", "assistant"}, {"content", "Hello."}},
                                                            {{"role", "system"}, {"content", "Answer in English."}},
                                                            {{"role", "user"}, {"content", "Who are you?"}}}}});
  EXPECT_EQ(between["input_tokens"].get<size_t>(),
            n_tokens("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\n"
                     "Hello.<|im_end|>\n<|im_start|>system\nAnswer in English.<|im_end|>\n" +
                     kPrompt))
      << between.dump();
  const json r = messages(who_are_you(
      {{"messages",
        {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Who are you?"}}}}}));
  EXPECT_EQ(r["content"][0]["type"], "text") << r.dump();
}

// An image (Claude Code's Read tool answers with one for a picture file), a document or audio is a line saying what
// was there, in user content and in tool results, on both APIs: the models read text only, and a client keeps the
// block in every later request, so a refusal would end the session. A plain-text document is its text; a tool
// result's tool_reference (Claude Code's tool search) a line naming the tool.
TEST_F(ServeApi, ImagesAndToolReferencesBecomeALineSayingSo) {
  const std::string image = "[an image was here: this model reads text only and cannot see it]";
  const json png = {{"type", "image"},
                    {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}};
  const json anthropic =
      post("/v1/messages/count_tokens",
           {{"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Who are you?"}}, png}}}}}});
  EXPECT_EQ(anthropic["input_tokens"].get<size_t>(),
            n_tokens("<|im_start|>user\nWho are you?\n\n" + image + kPrompt.substr(kPrompt.find("<|im_end|>"))))
      << anthropic.dump();
  const json text_document = {{"type", "document"},
                              {"source", {{"type", "text"}, {"media_type", "text/plain"}, {"data", "Who are you?"}}}};
  const json as_document =
      post("/v1/messages/count_tokens", {{"messages", {{{"role", "user"}, {"content", {text_document}}}}}});
  EXPECT_EQ(as_document["input_tokens"].get<size_t>(), n_tokens(kPrompt)) << as_document.dump();
  // In a tool result, then a request that goes on after it.
  const json read_tool = {{"name", "Read"}, {"input_schema", {{"type", "object"}}}};
  const json history = {
      {{"role", "user"}, {"content", "Read cat.png."}},
      {{"role", "assistant"},
       {"content", {{{"type", "tool_use"}, {"id", "t1"}, {"name", "Read"}, {"input", {{"file", "cat.png"}}}}}}},
      {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", {png}}}}}}};
  const json r = messages(who_are_you({{"messages", history}, {"tools", {read_tool}}, {"max_tokens", 4}}));
  EXPECT_EQ(r["type"], "message") << r.dump();
  const json counted = post("/v1/messages/count_tokens", {{"messages", history}, {"tools", {read_tool}}});
  json as_text = history;
  as_text[2]["content"][0]["content"] = image;
  EXPECT_EQ(counted["input_tokens"],
            post("/v1/messages/count_tokens", {{"messages", as_text}, {"tools", {read_tool}}})["input_tokens"]);
  // Claude Code's tool search answers with a tool_reference (every tool is in the prompt here): a line naming it.
  json searched = history;
  searched[2]["content"][0]["content"] = {{{"type", "tool_reference"}, {"tool_name", "Read"}}};
  as_text[2]["content"][0]["content"] = "[tool Read is loaded]";
  EXPECT_EQ(post("/v1/messages/count_tokens", {{"messages", searched}, {"tools", {read_tool}}})["input_tokens"],
            post("/v1/messages/count_tokens", {{"messages", as_text}, {"tools", {read_tool}}})["input_tokens"]);
  // OpenAI's image_url part.
  int status = 0;
  const json openai =
      post("/v1/chat/completions",
           {{"messages",
             {{{"role", "user"},
               {"content",
                {{{"type", "text"}, {"text", "Who are you?"}},
                 {{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,iVBORw0KGgo="}}}}}}}}},
            {"max_tokens", 1}},
           &status);
  ASSERT_EQ(status, 200) << openai.dump();
  EXPECT_EQ(openai["usage"]["prompt_tokens"].get<size_t>(),
            n_tokens("<|im_start|>user\nWho are you?" + image + kPrompt.substr(kPrompt.find("<|im_end|>"))))
      << openai.dump();
}

TEST_F(ServeApi, MetricsCountAKnownRequest) {
  const std::map<std::string, double> before = metrics();
  const json r = messages(who_are_you({{"max_tokens", 3}, {"system", "Count me."}}));
  int status = 0;
  raw_post("/v1/messages", "{not json", &status);
  EXPECT_EQ(status, 400);
  const std::map<std::string, double> after = metrics();
  auto delta = [&](const std::string& series) {
    EXPECT_TRUE(after.count(series)) << series;
    auto b = before.find(series);
    return after.count(series) ? after.at(series) - (b == before.end() ? 0.0 : b->second) : -1.0;
  };
  const double input = r["usage"]["input_tokens"], cached = r["usage"]["cache_read_input_tokens"];
  EXPECT_EQ(input + cached, double(n_tokens("<|im_start|>system\nCount me.<|im_end|>\n" + kPrompt)));
  EXPECT_EQ(delta(R"(magnetar_requests_total{endpoint="/v1/messages",status="200"})"), 1);
  EXPECT_EQ(delta(R"(magnetar_requests_total{endpoint="/v1/messages",status="400"})"), 1);
  EXPECT_EQ(delta(R"(magnetar_requests_total{endpoint="/metrics",status="200"})"), 1);  // the first GET
  EXPECT_EQ(delta("magnetar_generated_tokens_total"), 3);
  EXPECT_EQ(delta("magnetar_prompt_tokens_total"), input + cached);
  EXPECT_EQ(delta("magnetar_cached_tokens_total"), cached);
  EXPECT_GT(delta("magnetar_prompt_seconds_total"), 0);
  EXPECT_GE(delta("magnetar_generation_seconds_total"), 0);
  EXPECT_EQ(after.at("magnetar_requests_active"), 0);
  EXPECT_EQ(after.at("magnetar_requests_queued"), 0);
  // The demo model's experts are resident: the cache counters exist and stay zero.
  for (const char* series : {"magnetar_expert_cache_hits_total", "magnetar_expert_cache_misses_total",
                             "magnetar_expert_cache_bytes_read_total", "magnetar_expert_cache_evictions_total"}) {
    ASSERT_TRUE(after.count(series)) << series;
    EXPECT_EQ(after.at(series), 0) << series;
  }
}

TEST_F(ServeApi, LegacyCompletions) {
  int status = 0;
  const json r = post("/v1/completions", {{"prompt", kPrompt}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "magnetar-demo-q8_0");
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["index"], 0);
  EXPECT_EQ(choice["finish_reason"], "stop");
  const std::string text = choice["text"];
  EXPECT_EQ(text.rfind(kAnswerStart, 0), 0u) << text;
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), n_tokens(kPrompt));

  const json length = post("/v1/completions", {{"prompt", kPrompt}, {"temperature", 0}, {"max_tokens", 3}});
  EXPECT_EQ(length["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(length["usage"]["completion_tokens"], 3);

  const std::string body =
      raw_post("/v1/completions", json({{"prompt", kPrompt}, {"temperature", 0}, {"stream", true}}).dump(), &status);
  ASSERT_EQ(status, 200);
  const auto events = sse_events(body);
  ASSERT_GE(events.size(), 3u) << body;
  EXPECT_EQ(events.back().second, "[DONE]");
  std::string got, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i].second);
    EXPECT_EQ(chunk["object"], "text_completion");
    got += chunk["choices"][0]["text"].get<std::string>();
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(got, text);
  EXPECT_EQ(finish, "stop");

  // ignore_eos: the end-of-generation token that ended the answer is never sampled, so the same greedy text goes on
  // to max_tokens.
  const int64_t n_natural = r["usage"]["completion_tokens"].get<int64_t>();
  const json on =
      post("/v1/completions",
           {{"prompt", kPrompt}, {"temperature", 0}, {"ignore_eos", true}, {"max_tokens", n_natural + 8}}, &status);
  ASSERT_EQ(status, 200) << on.dump();
  EXPECT_EQ(on["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(on["usage"]["completion_tokens"].get<int64_t>(), n_natural + 8);
  const std::string longer = on["choices"][0]["text"];
  EXPECT_GT(longer.size(), text.size());
  EXPECT_EQ(longer.rfind(text, 0), 0u) << longer;
  // Usage counted the end token of the natural answer (vLLM's count): n_natural tokens without it are the answer's
  // tokens and one more.
  const json one_more = post(
      "/v1/completions", {{"prompt", kPrompt}, {"temperature", 0}, {"ignore_eos", true}, {"max_tokens", n_natural}});
  EXPECT_EQ(one_more["choices"][0]["finish_reason"], "length");
  const std::string next = one_more["choices"][0]["text"];
  EXPECT_GT(next.size(), text.size()) << next;
  EXPECT_EQ(next.rfind(text, 0), 0u) << next;
  const json not_bool = post("/v1/completions", {{"prompt", kPrompt}, {"ignore_eos", "yes"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(not_bool["error"]["message"], "ignore_eos must be a boolean") << not_bool.dump();

  const json bad = post("/v1/completions", {{"temperature", 0}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("prompt"), std::string::npos) << bad.dump();
}

}  // namespace
}  // namespace magnetar
