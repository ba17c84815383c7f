// Parsing a model's output as it is generated: answer text, reasoning and tool calls. One interface, one
// implementation per output family (Qwen3/Hermes here; DeepSeek and gpt-oss come with their architectures).
//
// The server feeds every piece of generated text to a parser and maps the events to its API's shapes (OpenAI
// deltas, Anthropic content blocks); a non-streamed answer is the same parser fed the whole text. A parser holds
// back only the bytes that could still turn into markup (the start of a tag, whitespace that may turn out to
// separate a tool call), so streams stay as live as the raw text. Model output is untrusted: markup that does
// not parse becomes plain text with its original bytes, never an error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace magnetar::chat {

enum class OutputEventKind {
  kText,               // text: a piece of the answer
  kReasoning,          // text: a piece of the reasoning (thinking) block
  kToolCallBegin,      // text: the function's name
  kToolCallArguments,  // text: a piece of the arguments' JSON (the pieces of one call join into a JSON object)
  kToolCallEnd,        // the call's arguments are complete
};

struct OutputEvent {
  OutputEventKind kind;
  std::string text;
  bool operator==(const OutputEvent&) const = default;
};

// What the prompt asked the model for (how it was rendered).
struct OutputFormat {
  bool reasoning = false;            // thinking was enabled: the answer may open with a reasoning block
  bool starts_in_reasoning = false;  // the prompt itself opened the reasoning block (the output starts inside it)
  bool tool_calls = false;           // tools were offered: tool-call markup is parsed (else it is text)
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Feeds the next piece of output; appends the events it completes to `events`.
  virtual void feed(std::string_view text, std::vector<OutputEvent>* events) = 0;
  // The output has ended: flushes what was held back (an unfinished tag becomes text).
  virtual void finish(std::vector<OutputEvent>* events) = 0;
};

// Qwen3 / Hermes: `<think>\nREASONING\n</think>\n\nANSWER` (the think block optional, or opened by the prompt),
// and tool calls as `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`, any number of them, usually
// after the answer text. A tool call's body must be a JSON object with a string "name" and an object "arguments",
// else the whole block (tags included, and the whitespace before it) is text. The reasoning is trimmed of
// surrounding whitespace, the answer of leading whitespace after the think block, and whitespace that only
// separates tool calls from the text or from each other is dropped (Qwen3's template re-renders it).
// A tool call missing its closing tag at the very end of the output is accepted when its body is complete.
std::unique_ptr<OutputParser> new_hermes_parser(const OutputFormat& format);

// Events with adjacent text (or reasoning, or argument) pieces merged: the form in which a stream and a
// non-streamed answer are compared.
std::vector<OutputEvent> merge_events(const std::vector<OutputEvent>& events);

}  // namespace magnetar::chat
