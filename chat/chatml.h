// The Qwen ChatML conversation format, built in until the server brings Jinja templates:
//   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
// with Qwen3's thinking block: the model opens its answer with <think>...</think>; earlier assistant turns
// are rendered without their reasoning (as Qwen3's own template does), and with thinking off the assistant
// prefix carries an empty <think></think> block.
#pragma once

#include <span>
#include <string>

namespace magnetar::chat {

struct Message {
  std::string role = {};       // "system", "user", "assistant"
  std::string content = {};    // for assistant turns: the answer without its reasoning
  std::string reasoning = {};  // assistant only: text of the <think> block (not rendered in later turns)
};

std::string render_chatml(std::span<const Message> messages, bool add_generation_prompt, bool enable_thinking);

// Splits generated text "<think>R</think>A" (leading whitespace and the think block optional) into
// reasoning R and answer A, both trimmed of surrounding newlines.
void split_reasoning(const std::string& text, std::string* reasoning, std::string* answer);

}  // namespace magnetar::chat
