#include "server/requests.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <system_error>

#include "base/status.h"

namespace magnetar::server {

using json = nlohmann::ordered_json;

Status read_float(const json& body, const char* key, float* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_number()) return Status::error(format("%s must be a number", key));
  *out = it->get<float>();
  return Status();
}

Status read_int(const json& body, const char* key, int64_t* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_number_integer()) return Status::error(format("%s must be an integer", key));
  *out = it->get<int64_t>();
  return Status();
}

Status read_bool(const json& body, const char* key, bool* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return Status();
  if (!it->is_boolean()) return Status::error(format("%s must be a boolean", key));
  *out = it->get<bool>();
  return Status();
}

namespace {

// A request's sampling fields in range.
Status check_sampling(const SamplingParams& p, int64_t top_k) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return Status::error("temperature must be a finite number >= 0");
  }
  if (top_k < -1 || top_k > INT32_MAX) return Status::error("top_k must be -1 or 0 (off) or in [1, 2147483647]");
  if (!(p.top_p >= 0 && p.top_p <= 1)) return Status::error("top_p must be in [0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return Status::error("min_p must be in [0, 1]");
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty)) {
    return Status::error("presence_penalty and frequency_penalty must be finite numbers");
  }
  return Status();
}

// A field whose value asks for something the server does not do: refused rather than answered without it.
// `wanted` says whether the value (present, not null) asks for it.
Status refuse_if(const json& body, const char* key, bool (*wanted)(const json&), const char* why) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null() || !wanted(*it)) return Status();
  return Status::error(format("%s: %s", key, why));
}
bool is_true(const json& v) { return !v.is_boolean() || v.get<bool>(); }
bool above_zero(const json& v) { return !v.is_number() || v.get<double>() > 0; }
bool not_one(const json& v) { return !v.is_number_integer() || v.get<int64_t>() != 1; }
bool not_one_number(const json& v) { return !v.is_number() || v.get<double>() != 1.0; }
bool non_empty(const json& v) { return !v.is_array() || !v.empty(); }
bool any_value(const json&) { return true; }  // /v1/completions' logprobs: 0 asks for the sampled token's
bool is_object(const json& v) { return v.is_object(); }

// The OpenAI sampling and limit fields, shared by /v1/chat/completions and /v1/completions.
Status parse_openai_sampling(const json& body, const SamplingParams& defaults, ChatRequest* out) {
  ChatRequest& r = *out;
  for (Status s :
       {refuse_if(body, "n", not_one, "one choice per request (n must be 1)"),
        refuse_if(body, "best_of", not_one, "one choice per request (best_of must be 1)"),
        refuse_if(body, "top_logprobs", above_zero, "log probabilities are not supported"),
        refuse_if(body, "functions", non_empty, "not supported (deprecated by OpenAI): send tools"),
        refuse_if(body, "function_call", is_object, "not supported (deprecated by OpenAI): send tool_choice"),
        refuse_if(body, "repetition_penalty", not_one_number,
                  "not supported (send presence_penalty or frequency_penalty)"),
        refuse_if(body, "repeat_penalty", not_one_number,
                  "not supported (send presence_penalty or frequency_penalty)")}) {
    if (!s.ok()) return s;
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto it = body.find(key); it != body.end() && it->is_number_integer() && it->get<int64_t>() < 1) {
      return Status::error(format("%s must be >= 1", key));
    }
  }
  r.sampling = defaults;
  int64_t top_k = r.sampling.top_k, seed = int64_t(r.sampling.seed), max_tokens = 0, max_completion = 0;
  for (Status s :
       {read_float(body, "temperature", &r.sampling.temperature), read_float(body, "top_p", &r.sampling.top_p),
        read_float(body, "min_p", &r.sampling.min_p), read_int(body, "top_k", &top_k), read_int(body, "seed", &seed),
        read_float(body, "presence_penalty", &r.sampling.presence_penalty),
        read_float(body, "frequency_penalty", &r.sampling.frequency_penalty), read_int(body, "max_tokens", &max_tokens),
        read_int(body, "max_completion_tokens", &max_completion), read_bool(body, "stream", &r.stream),
        read_bool(body, "ignore_eos", &r.ignore_eos)}) {
    if (!s.ok()) return s;
  }
  MAGNETAR_RETURN_IF_ERROR(check_sampling(r.sampling, top_k));
  r.sampling.top_k = int32_t(std::max<int64_t>(top_k, 0));  // -1: off, as vLLM's
  r.sampling.seed = seed;                                   // negative: a random one (llama.cpp's -1)
  if (auto bias = body.find("logit_bias"); bias != body.end() && !bias->is_null()) {
    if (!bias->is_object()) return Status::error("logit_bias must be an object of token ids to numbers");
    for (const auto& [key, value] : bias->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
        return Status::error(format("logit_bias: key '%s' is not a token id", key.c_str()));
      }
      if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
        return Status::error(
            format("logit_bias: the bias of token %lld must be a number in [-100, 100]", (long long)id));
      }
      r.sampling.logit_bias.push_back({int32_t(id), value.get<float>()});
    }
  }
  r.max_tokens = max_completion > 0 ? max_completion : max_tokens;
  if (auto stop = body.find("stop"); stop != body.end() && !stop->is_null()) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string()) return Status::error("stop must be a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      return Status::error("stop must be a string or an array of strings");
    }
    std::erase_if(r.stop, [](const std::string& s) { return s.empty(); });
  }
  if (auto options = body.find("stream_options"); options != body.end() && !options->is_null()) {
    if (!options->is_object()) return Status::error("stream_options must be an object");
    if (Status s = read_bool(*options, "include_usage", &r.include_usage); !s.ok()) {
      return Status::error("stream_options." + s.message());
    }
  }
  return Status();
}

}  // namespace

Result<ChatRequest> parse_chat_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  Result<ChatInput> input = openai_chat_input(body);
  if (!input.ok()) return input.status();
  r.chat = std::move(input.value());
  if (Status s = refuse_if(body, "logprobs", is_true, "log probabilities are not supported"); !s.ok()) return s;
  if (Status s = parse_openai_sampling(body, defaults, &r); !s.ok()) return s;
  return r;
}

Result<ChatRequest> parse_completion_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  auto prompt = body.find("prompt");
  if (prompt != body.end() && prompt->is_array() && prompt->size() == 1) prompt = prompt->begin();
  if (prompt == body.end() || !prompt->is_string()) return Status::error("prompt must be a string");
  r.prompt = prompt->get<std::string>();
  if (r.prompt.empty()) return Status::error("prompt must not be empty");
  for (Status s : {refuse_if(body, "logprobs", any_value, "log probabilities are not supported"),
                   refuse_if(body, "echo", is_true, "echoing the prompt is not supported"),
                   refuse_if(
                       body, "suffix", [](const json& v) { return !v.is_string() || !v.get<std::string>().empty(); },
                       "insertion (a suffix) is not supported")}) {
    if (!s.ok()) return s;
  }
  if (Status s = parse_openai_sampling(body, defaults, &r); !s.ok()) return s;
  return r;
}

Result<ChatRequest> parse_anthropic_request(const json& body, const SamplingParams& defaults, bool require_max_tokens) {
  ChatRequest r;
  Result<ChatInput> input = anthropic_chat_input(body);
  if (!input.ok()) return input.status();
  r.chat = std::move(input.value());
  r.sampling = defaults;
  int64_t top_k = r.sampling.top_k;
  for (Status s : {read_float(body, "temperature", &r.sampling.temperature),
                   read_float(body, "top_p", &r.sampling.top_p), read_int(body, "top_k", &top_k),
                   read_int(body, "max_tokens", &r.max_tokens), read_bool(body, "stream", &r.stream)}) {
    if (!s.ok()) return s;
  }
  MAGNETAR_RETURN_IF_ERROR(check_sampling(r.sampling, top_k));
  r.sampling.top_k = int32_t(std::max<int64_t>(top_k, 0));
  if (auto max_tokens = body.find("max_tokens");
      require_max_tokens && (max_tokens == body.end() || max_tokens->is_null())) {
    return Status::error("max_tokens is required");
  }
  if (require_max_tokens && r.max_tokens < 1) return Status::error("max_tokens must be >= 1");
  if (auto stop = body.find("stop_sequences"); stop != body.end() && !stop->is_null()) {
    if (!stop->is_array()) return Status::error("stop_sequences must be an array of strings");
    for (const json& s : *stop) {
      if (!s.is_string()) return Status::error("stop_sequences must be an array of strings");
      if (!s.get<std::string>().empty()) r.stop.push_back(s.get<std::string>());
    }
  }
  return r;
}

Result<ChatRequest> parse_responses_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  Result<ChatInput> input = responses_chat_input(body);
  if (!input.ok()) return input.status();
  r.chat = std::move(input.value());
  r.sampling = defaults;
  for (Status s :
       {read_float(body, "temperature", &r.sampling.temperature), read_float(body, "top_p", &r.sampling.top_p),
        read_int(body, "max_output_tokens", &r.max_tokens), read_bool(body, "stream", &r.stream)}) {
    if (!s.ok()) return s;
  }
  MAGNETAR_RETURN_IF_ERROR(check_sampling(r.sampling, r.sampling.top_k));
  if (auto max = body.find("max_output_tokens"); max != body.end() && !max->is_null() && r.max_tokens < 1) {
    return Status::error("max_output_tokens must be >= 1");
  }
  if (auto previous = body.find("previous_response_id"); previous != body.end() && !previous->is_null()) {
    return Status::error("previous_response_id is not supported: responses are not stored (send the whole input)");
  }
  return r;
}

}  // namespace magnetar::server
