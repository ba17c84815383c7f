// POST /v1/responses, OpenAI's Responses API (Codex's): the same model answer as /v1/chat/completions for the same
// conversation; a Codex-style history (instructions, developer message, reasoning, function call and its output)
// renders as the chat conversation it means; the stream's events are well formed for Codex (every item opened by
// response.output_item.added before its deltas and closed by response.output_item.done holding the whole item, one
// item open at a time, response.completed last with the usage) and give the answer the non-streamed request gives;
// function and freeform (custom) tool calls come back as function_call / custom_tool_call items; tools and items of
// other types are left out, not refused.
#include <string>
#include <utility>

#include "tests/server/harness.h"

namespace magnetar::test {
namespace {

class ServeResponses : public ServeFixture {
 protected:
  static json responses(const json& body, int expect_status = 200) {
    int status = 0;
    json r = post("/v1/responses", body, &status);
    EXPECT_EQ(status, expect_status) << r.dump();
    return r;
  }
  // The texts of the output's message items, joined.
  static std::string output_text(const json& r) {
    std::string text;
    for (const json& item : r["output"]) {
      if (item["type"] != "message") continue;
      for (const json& part : item["content"]) text += part["text"].get<std::string>();
    }
    return text;
  }
  // An output without its items' ids and call ids (random per answer).
  static json without_ids(json output) {
    for (json& item : output) {
      item.erase("id");
      item.erase("call_id");
    }
    return output;
  }
};

const json kUser = {
    {"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Who are you?"}}}}};

TEST_F(ServeResponses, AnswersAsChatCompletionsDoes) {
  const json r = responses({{"model", "m"}, {"instructions", "Be brief."}, {"input", {kUser}}, {"temperature", 0}});
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "completed") << r.dump();
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  int status = 0;
  const json chat = post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Who are you?"}}}},
       {"temperature", 0}},
      &status);
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(output_text(r), chat["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
  EXPECT_EQ(r["usage"]["total_tokens"], chat["usage"]["total_tokens"]);
  EXPECT_TRUE(r["usage"]["input_tokens_details"]["cached_tokens"].is_number_integer());
  // A string input is one user message; max_output_tokens cuts the answer: incomplete, saying why.
  const json cut = responses({{"input", "Who are you?"}, {"max_output_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cut["usage"]["output_tokens"], 3);
}

// Instructions and the developer message before the conversation make one leading system message; a run of
// reasoning, assistant message and function call items is one assistant message; a function call output is a tool
// message: the prompt is the one chat completions renders for that conversation.
TEST_F(ServeResponses, ACodexHistoryRendersAsTheChatConversation) {
  const json shell = {{"type", "function"},
                      {"name", "shell"},
                      {"description", "Runs a command."},
                      {"parameters", {{"type", "object"}, {"properties", {{"command", {{"type", "string"}}}}}}}};
  const json input = {
      {{"type", "message"}, {"role", "developer"}, {"content", {{{"type", "input_text"}, {"text", "Sandbox: none."}}}}},
      {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "List files."}}}}},
      {{"type", "reasoning"},
       {"summary", json::array()},
       {"content", {{{"type", "reasoning_text"}, {"text", "I should run ls."}}}}},
      {{"type", "function_call"}, {"name", "shell"}, {"arguments", "{\"command\":\"ls\"}"}, {"call_id", "call_1"}},
      {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "README.md"}},
      {{"type", "message"},
       {"role", "assistant"},
       {"content", {{{"type", "output_text"}, {"text", "There is a README."}}}}},
      {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Thanks."}}}}}};
  const json r =
      responses({{"instructions", "You code."}, {"input", input}, {"tools", {shell}}, {"max_output_tokens", 1}});
  int status = 0;
  const json chat = post(
      "/v1/chat/completions",
      {{"messages",
        {{{"role", "system"}, {"content", "You code.\n\nSandbox: none."}},
         {{"role", "user"}, {"content", "List files."}},
         {{"role", "assistant"},
          {"content", ""},
          {"reasoning_content", "I should run ls."},
          {"tool_calls",
           {{{"id", "call_1"},
             {"type", "function"},
             {"function", {{"name", "shell"}, {"arguments", "{\"command\":\"ls\"}"}}}}}}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "README.md"}},
         {{"role", "assistant"}, {"content", "There is a README."}},
         {{"role", "user"}, {"content", "Thanks."}}}},
       {"tools",
        {{{"type", "function"},
          {"function", {{"name", "shell"}, {"description", "Runs a command."}, {"parameters", shell["parameters"]}}}}}},
       {"max_tokens", 1}},
      &status);
  ASSERT_EQ(status, 200) << chat.dump();
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]) << r.dump();
}

// The stream, event by event, as Codex reads it; its items are the non-streamed answer's. A plain answer and a
// forced function call (its arguments' deltas add up to the done item's arguments).
TEST_F(ServeResponses, TheStreamIsWellFormedAndGivesTheSameAnswer) {
  const json shell = {{"type", "function"},
                      {"name", "shell"},
                      {"parameters", {{"type", "object"}, {"properties", {{"command", {{"type", "string"}}}}}}}};
  const json bodies[] = {{{"instructions", "Be brief."}, {"input", {kUser}}, {"temperature", 0}},
                         {{"input", {kUser}},
                          {"tools", {shell}},
                          {"tool_choice", {{"type", "function"}, {"name", "shell"}}},
                          {"max_output_tokens", 200},
                          {"temperature", 0}}};
  for (const json& body : bodies) {
    const json want = responses(body);
    json streamed = body;
    streamed["stream"] = true;
    int status = 0;
    const std::string sse = raw_post("/v1/responses", streamed.dump(), &status);
    ASSERT_EQ(status, 200) << sse;
    const auto events = sse_events(sse);
    ASSERT_GE(events.size(), 4u) << sse;
    json open;  // the item opened and not yet done
    json items = json::array();
    std::string text, arguments;
    int64_t last_sequence = -1;
    for (size_t i = 0; i < events.size(); ++i) {
      const auto& [name, data] = events[i];
      ASSERT_NE(data, "[DONE]") << "the Responses API ends with response.completed, not [DONE]";
      const json e = json::parse(data);
      EXPECT_EQ(e["type"], name) << data;
      EXPECT_GT(e["sequence_number"].get<int64_t>(), last_sequence) << data;
      last_sequence = e["sequence_number"].get<int64_t>();
      if (i == 0) {
        EXPECT_EQ(name, "response.created");
      }
      if (i + 1 == events.size()) {
        EXPECT_EQ(name, "response.completed");
      }
      if (name == "response.output_item.added") {
        EXPECT_TRUE(open.is_null()) << "an item opened while another is open: " << data;
        open = e["item"];
        EXPECT_EQ(e["output_index"], items.size());
        arguments.clear();
      } else if (name == "response.output_text.delta" || name == "response.reasoning_text.delta" ||
                 name == "response.function_call_arguments.delta") {
        ASSERT_FALSE(open.is_null()) << "a delta without an open item: " << data;
        EXPECT_EQ(e["item_id"], open["id"]);
        if (name == "response.output_text.delta") text += e["delta"].get<std::string>();
        if (name == "response.function_call_arguments.delta") arguments += e["delta"].get<std::string>();
      } else if (name == "response.output_item.done") {
        ASSERT_FALSE(open.is_null()) << data;
        EXPECT_EQ(e["item"]["id"], open["id"]);
        if (e["item"]["type"] == "function_call") {
          EXPECT_EQ(e["item"]["arguments"], arguments);
        }
        items.push_back(e["item"]);
        open = json();
      } else if (name == "response.completed") {
        EXPECT_EQ(e["response"]["output"], items);
        for (const char* key : {"input_tokens", "output_tokens", "total_tokens"}) {  // cached_tokens: the cache's state
          EXPECT_EQ(e["response"]["usage"][key], want["usage"][key]) << key;
        }
        EXPECT_EQ(e["response"]["status"], "completed");
      }
    }
    EXPECT_TRUE(open.is_null());
    EXPECT_EQ(without_ids(items), without_ids(want["output"]));
    EXPECT_EQ(text, output_text(want));
  }
}

// A forced call of a function tool is a function_call item (arguments a JSON string); of a freeform tool (Codex's
// apply_patch) a custom_tool_call item with the raw input. Other tool types (web search, ...) and items (a
// web_search_call) are left out, not refused; previous_response_id is refused (nothing is stored).
TEST_F(ServeResponses, ToolCallsComeBackAsItems) {
  const json shell = {{"type", "function"},
                      {"name", "shell"},
                      {"parameters", {{"type", "object"}, {"properties", {{"command", {{"type", "string"}}}}}}}};
  const json patch = {{"type", "custom"},
                      {"name", "apply_patch"},
                      {"description", "Applies a patch."},
                      {"format", {{"type", "grammar"}, {"syntax", "lark"}, {"definition", "start: /.+/"}}}};
  const json others = {{{"type", "web_search"}}, {{"type", "image_generation"}, {"output_format", "png"}}};
  json tools = {shell, patch};
  for (const json& t : others) tools.push_back(t);
  const json input = {kUser, {{"type", "web_search_call"}, {"status", "completed"}}};
  const json call = responses({{"input", input},
                               {"tools", tools},
                               {"tool_choice", {{"type", "function"}, {"name", "shell"}}},
                               {"max_output_tokens", 200},
                               {"temperature", 0}});
  ASSERT_EQ(call["output"].size(), 1u) << call.dump();
  const json& fc = call["output"][0];
  EXPECT_EQ(fc["type"], "function_call") << call.dump();
  EXPECT_EQ(fc["name"], "shell");
  EXPECT_EQ(fc["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_TRUE(json::parse(fc["arguments"].get<std::string>(), nullptr, false).is_object()) << call.dump();
  const json custom = responses({{"input", input},
                                 {"tools", tools},
                                 {"tool_choice", {{"type", "custom"}, {"name", "apply_patch"}}},
                                 {"max_output_tokens", 200},
                                 {"temperature", 0}});
  ASSERT_EQ(custom["output"].size(), 1u) << custom.dump();
  EXPECT_EQ(custom["output"][0]["type"], "custom_tool_call") << custom.dump();
  EXPECT_EQ(custom["output"][0]["name"], "apply_patch");
  EXPECT_TRUE(custom["output"][0]["input"].is_string()) << custom.dump();
  const json refused = responses({{"input", "Hi."}, {"previous_response_id", "resp_1"}}, 400);
  EXPECT_NE(refused.dump().find("previous_response_id"), std::string::npos) << refused.dump();
}

// Bad input is a 400 naming the field as this API names it (tools[0].name, not the chat route's
// tools[0].function.name).
TEST_F(ServeResponses, BadInputIsRefusedNamingTheField) {
  const std::pair<json, std::string> cases[] = {
      {json::object(), "input must be"},
      {{{"input", {5}}}, "input[0] must be an object"},
      {{{"input", {{{"type", "message"}, {"role", "bot"}, {"content", "x"}}}}}, "input[0].role"},
      {{{"input", {{{"type", "function_call"}, {"name", "f"}}}}}, "input[0].call_id"},
      {{{"input", {{{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}}}}}}}},
       "input[0].content[0].text"},
      {{{"input", {{{"type", "function_call_output"}, {"call_id", "c"}, {"output", {{"a", 1}}}}}}}, "input[0].output"},
      {{{"input", "Hi."}, {"tools", {{{"type", "function"}}}}}, "tools[0].name"},
      {{{"input", "Hi."}, {"tools", json::array()}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}},
       "tool_choice.name \"nope\""},
      {{{"input", "Hi."}, {"max_output_tokens", 0}}, "max_output_tokens"},
      {{{"input", "Hi."}, {"temperature", "x"}}, "temperature"},
  };
  for (const auto& [body, field] : cases) {
    const json r = responses(body, 400);
    EXPECT_NE(r["error"]["message"].get<std::string>().find(field), std::string::npos)
        << body.dump() << " -> " << r.dump();
  }
}

}  // namespace
}  // namespace magnetar::test
