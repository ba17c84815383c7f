// The model's output in the APIs' shapes: the output parser of the model's family, the call ids, finish and stop
// reasons, usage objects, Anthropic's thinking signature, and the /v1/responses output items with their stream events
// (ResponsesOutput). Built from the parser's events and the job's counts: no HTTP, no engine.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat/tool_calls.h"
#include "server/worker.h"

namespace magnetar::server {

// The output parser of the model's family: Qwen3/Hermes markup, the only family the built-in ChatML renderer
// serves (DeepSeek and gpt-oss get theirs with their architectures).
std::unique_ptr<chat::OutputParser> new_output_parser(const chat::OutputFormat& format);

// Parses a whole output (non-streamed answers).
std::vector<chat::OutputEvent> parse_output(const chat::OutputFormat& format, const std::string& text);

// Call ids: call_ / toolu_ and 24 random alphanumerics, as the two APIs' own ids look.
std::string new_call_id(const char* prefix);

// The signature of an Anthropic thinking block: Anthropic's is an opaque token that clients keep and send back with
// the block; Claude Code drops a thinking block without one (and with it an answer that had only thinking). Ours is
// "magnetar" and the FNV-1a hash of the text in hex (nothing checks it when a client sends the block back).
std::string thinking_signature(const std::string& thinking);

// OpenAI's finish_reason: length (max_tokens or the context), tool_calls, or stop.
const char* finish_reason_name(FinishReason f, bool tool_calls = false);

// Anthropic's stop_reason: max_tokens, stop_sequence (one of the request's stop_sequences matched), tool_use or
// end_turn.
const char* anthropic_stop_reason(const Job& job, bool tool_use);

// OpenAI's usage object of a finished job.
nlohmann::ordered_json usage_json(const Job& job);

// Anthropic counts cache reads apart: input_tokens are the prompt tokens that were computed, so
// input_tokens + cache_read_input_tokens is the prompt (what count_tokens returns).
nlohmann::ordered_json anthropic_usage(const Job& job);

// The Responses API's usage object (input_tokens counts the whole prompt, cached_tokens those reused).
nlohmann::ordered_json responses_usage(const Job& job);

// The output of a /v1/responses answer, item by item, as the parser's events arrive: the stream's events (each
// item opened with response.output_item.added, its deltas, then its done events and response.output_item.done with
// the whole item; Codex records items from output_item.done only and wants one open at a time) and the finished
// items. Reasoning goes out as reasoning_text (the item's content, which Codex sends back with the next request);
// a call of a freeform tool (offered as a function of one string "input") goes out as a custom_tool_call of that
// string, whole at its end.
class ResponsesOutput {
 public:
  using json = nlohmann::ordered_json;
  explicit ResponsesOutput(std::vector<std::string> freeform) : freeform_(std::move(freeform)) {}

  // Takes the parser's next event.
  void on(const chat::OutputEvent& e);
  // Closes the open item.
  void close();
  // Emits `type` with `fields`, numbered.
  void emit(const char* type, json fields);
  // The events emitted since the last call.
  std::vector<std::pair<std::string, json>> take_events() { return std::exchange(events_, {}); }
  const json& output() const { return output_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kCall, kCustomCall };
  static json text_part(const std::string& text);
  int64_t index() const { return int64_t(output_.size()); }
  void open(Kind kind, json item);

  std::vector<std::string> freeform_;
  Kind open_ = Kind::kNone;
  json item_;         // the open item
  std::string text_;  // its text, reasoning or arguments so far
  json output_ = json::array();
  std::vector<std::pair<std::string, json>> events_;
  int64_t sequence_ = 0;
};

}  // namespace magnetar::server
