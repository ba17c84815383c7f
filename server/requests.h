// Request bodies of the generating routes -> ChatRequest (the conversation through server/conversation.h, sampling,
// limits, stops). Pure functions of the body: every failure is a Status whose message names the field, which the
// server answers with a 400; a field asking for something the server does not do is refused, not ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "server/conversation.h"

namespace magnetar::server {

// What every generating route reads from its body: the conversation (or, for /v1/completions, the raw prompt),
// sampling and limits.
struct ChatRequest {
  ChatInput chat;      // the chat routes
  std::string prompt;  // /v1/completions only
  SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;  // OpenAI routes (as llama.cpp's and vLLM's servers): end-of-generation tokens never sampled
};

// A field of `body` into *out when present and not null; a value of another type is an error naming the key.
Status read_float(const nlohmann::ordered_json& body, const char* key, float* out);
Status read_int(const nlohmann::ordered_json& body, const char* key, int64_t* out);
Status read_bool(const nlohmann::ordered_json& body, const char* key, bool* out);

// POST /v1/chat/completions.
Result<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);
// POST /v1/completions: `prompt` is a string (or an array holding one), tokenized with special-token text parsed, so a
// client may send a chat template it rendered itself.
Result<ChatRequest> parse_completion_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);
// POST /v1/messages (and /v1/messages/count_tokens, which has no max_tokens). Fields the engine has no use for
// (metadata, context_management, ...) are ignored, never an error: clients such as Claude Code send them on every
// request.
Result<ChatRequest> parse_anthropic_request(const nlohmann::ordered_json& body, const SamplingParams& defaults,
                                            bool require_max_tokens);

// POST /v1/responses: responses_chat_input's conversation, temperature, top_p, max_output_tokens, stream. Responses
// are not stored: previous_response_id is refused; store, include, prompt_cache_key, service_tier are ignored.
Result<ChatRequest> parse_responses_request(const nlohmann::ordered_json& body, const SamplingParams& defaults);

}  // namespace magnetar::server
