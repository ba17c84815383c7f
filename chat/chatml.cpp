#include "chat/chatml.h"

namespace magnetar::chat {
namespace {

std::string trim_newlines(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == '\n' || s[b] == ' ')) ++b;
  while (e > b && (s[e - 1] == '\n' || s[e - 1] == ' ')) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::string render_chatml(std::span<const Message> messages, bool add_generation_prompt, bool enable_thinking) {
  std::string out;
  for (const Message& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
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
