// The conversations the Jinja parity test renders with Magnetar and with Python jinja2: a seeded
// generator over what chat templates branch on. With or without a system message; 1-6 turns; strictly
// alternating chats (what Gemma's template insists on) and agentic ones (tool definitions in the OpenAI
// function shape, assistant tool_calls with object or string arguments, `tool` results with tool_call_id and
// name, reasoning_content, content null); content with unicode, quotes, newlines, braces, Jinja-looking text,
// <think> blocks, surrounding whitespace, occasionally a list of parts; add_generation_prompt and
// enable_thinking each on, off or absent.
//
// Deterministic: a private splitmix64 generator (no std:: distributions, which differ between standard
// libraries). Returns the context of each case without bos_token/eos_token, which the test adds per template.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace magnetar::testing {

class ConversationGenerator {
 public:
  explicit ConversationGenerator(uint64_t seed) : state_(seed) {}

  std::vector<nlohmann::ordered_json> generate(size_t count) {
    std::vector<nlohmann::ordered_json> out;
    for (size_t i = 0; i < count; ++i) out.push_back(one());
    return out;
  }

 private:
  using J = nlohmann::ordered_json;

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return size_t(next() % n); }
  bool chance(int percent) { return int(next() % 100) < percent; }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

  std::string fragment() {
    static const std::vector<std::string> kFragments = {
        "Hello!",
        "What is the capital of France?",
        "Paris is the capital of France.",
        "Explain recursion in one sentence.",
        "Write a haiku about the sea",
        "请用中文回答：今天天气怎么样？",
        "日本語のテキストです。",
        "Ça va? Très bien, merci — à bientôt.",
        "Привет, как дела?",
        "مرحبا بالعالم",
        "emoji: 😀🎉👍🏽 and 👨‍👩‍👧",
        "quotes: \"double\" and 'single' and `back`",
        "a backslash \\ and \\n literally",
        "braces {{ not a tag }} and {% neither %} and {# nor #}",
        "json: {\"a\": [1, 2, {\"b\": null}]}",
        "line one\nline two\n\nline four",
        "tabs\tand\ttabs",
        "  leading and trailing spaces  ",
        "\n\nnewlines around\n\n",
        "<tool_response>not really</tool_response>",
        "code:\n```python\nprint('hi')\n```",
        "math: 2 < 3 && 5 > 4, 10% off",
        "",
        "OK",
        "Σ σ ς ÀÉÎ ß ﬁ",
        "nbsp\u00a0inside\u00a0text\u00a0",
    };
    std::string s = pick(kFragments);
    if (chance(30)) s += " " + pick(kFragments);
    return s;
  }

  std::string assistant_text() {
    std::string s = fragment();
    if (chance(15)) s = "<think>\n" + fragment() + "\n</think>\n\n" + s;  // reasoning left inside content
    return s;
  }

  J tool_definition(size_t k) {
    static const std::vector<std::string> kNames = {"get_weather", "search_web", "calculate", "send_email"};
    J params = J::object();
    params["type"] = "object";
    J props = J::object();
    switch (k % 4) {
      case 0:
        props["location"] = {{"type", "string"}, {"description", "City name, e.g. Zürich"}};
        props["unit"] = {{"type", "string"}, {"enum", {"celsius", "fahrenheit"}}};
        params["properties"] = props;
        params["required"] = {"location"};
        break;
      case 1:
        props["query"] = {{"type", "string"}};
        props["max_results"] = {{"type", "integer"}, {"default", 5}, {"minimum", 1}};
        params["properties"] = props;
        break;
      case 2:
        props["expression"] = {{"type", "string"}, {"description", "e.g. \"2 * (3 + 4)\""}};
        props["precision"] = {{"type", "number"}, {"default", 0.5}};
        params["properties"] = props;
        params["required"] = {"expression"};
        break;
      default:
        props["to"] = {{"type", "array"}, {"items", {{"type", "string"}}}};
        props["body"] = {{"type", "string"}, {"description", "Texte du message — 本文"}};
        props["urgent"] = {{"type", "boolean"}};
        params["properties"] = props;
        break;
    }
    J fn = J::object();
    fn["name"] = kNames[k % 4];
    fn["description"] = k % 4 == 2 ? "Evaluate {{ math }} safely\nwith \"quotes\"" : "Does " + kNames[k % 4];
    fn["parameters"] = params;
    J tool = J::object();
    tool["type"] = "function";
    tool["function"] = fn;
    return tool;
  }

  J tool_call(const std::string& name, size_t id) {
    J args = J::object();
    if (name == "get_weather") {
      args["location"] = chance(50) ? "Paris" : "東京";
      if (chance(50)) args["unit"] = "celsius";
    } else if (name == "search_web") {
      args["query"] = fragment();
      args["max_results"] = int(below(10)) + 1;
    } else if (name == "calculate") {
      args["expression"] = "2 * (3 + 4)";
      args["precision"] = chance(50) ? 0.25 : 2.0;
    } else {
      args["to"] = {"a@example.com", "b@example.com"};
      args["body"] = fragment();
      args["urgent"] = chance(50);
    }
    J fn = J::object();
    fn["name"] = name;
    fn["arguments"] = chance(50) ? J(args) : J(args.dump());
    J call = J::object();
    if (chance(70)) call["id"] = "call_" + std::to_string(id);
    call["type"] = "function";
    call["function"] = fn;
    return call;
  }

  J content_value(bool allow_parts) {
    if (allow_parts && chance(4)) {
      J parts = J::array();
      parts.push_back({{"type", "text"}, {"text", fragment()}});
      return parts;
    }
    return fragment();
  }

  J message(const std::string& role, J content) {
    J m = J::object();
    m["role"] = role;
    m["content"] = std::move(content);
    return m;
  }

  J one() {
    J messages = J::array();
    const bool agentic = chance(55);
    if (chance(50)) messages.push_back(message("system", content_value(true)));
    J tools = J::array();
    if (agentic && chance(80)) {
      const size_t n = 1 + below(3), first = below(4);
      for (size_t k = 0; k < n; ++k) tools.push_back(tool_definition(first + k));
    }
    const size_t turns = 1 + below(6);
    size_t call_id = 0;
    for (size_t t = 0; t < turns; ++t) {
      messages.push_back(message("user", content_value(true)));
      const bool last = t + 1 == turns;
      if (last && chance(60)) break;  // ends with the user: the prompt asks for the next reply
      J reply = message("assistant", assistant_text());
      if (chance(25)) reply["reasoning_content"] = chance(85) ? J(fragment()) : J(nullptr);
      if (agentic && !tools.empty() && chance(50)) {
        const size_t n_calls = 1 + below(2);
        J calls = J::array();
        std::vector<std::string> names;
        for (size_t c = 0; c < n_calls; ++c) {
          const std::string name = tools[below(tools.size())]["function"]["name"];
          calls.push_back(tool_call(name, call_id++));
          names.push_back(name);
        }
        reply["tool_calls"] = calls;
        if (chance(40)) reply["content"] = chance(30) ? J(nullptr) : J("");
        messages.push_back(reply);
        for (size_t c = 0; c < n_calls; ++c) {
          J result = message("tool", chance(50) ? fragment() : "{\"temperature\": 21.5, \"ok\": true}");
          if (chance(70)) result["tool_call_id"] = "call_" + std::to_string(call_id - n_calls + c);
          result["name"] = names[c];
          messages.push_back(result);
        }
        if (last && chance(50)) break;  // ends with tool results
        messages.push_back(message("assistant", assistant_text()));
      } else {
        messages.push_back(reply);
      }
    }
    J context = J::object();
    context["messages"] = messages;
    if (!tools.empty() || chance(10)) context["tools"] = tools.empty() ? J(nullptr) : tools;
    const std::string last_role = messages.back()["role"];
    if (chance(92)) context["add_generation_prompt"] = last_role != "assistant" ? chance(90) : chance(20);
    const size_t thinking = below(3);
    if (thinking < 2) context["enable_thinking"] = thinking == 0;
    return context;
  }

  uint64_t state_;
};

inline std::vector<nlohmann::ordered_json> chat_conversations(uint64_t seed, size_t count) {
  return ConversationGenerator(seed).generate(count);
}

}  // namespace magnetar::testing
