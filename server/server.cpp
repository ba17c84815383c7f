#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "chat/chatml.h"
#include "server/worker.h"

namespace magnetar::server {

using nlohmann::json;

namespace {

// ---- errors: every HTTP status code the server sends is decided here -------------------------------------------

enum class ErrorKind { kInvalidRequest, kNotFound, kUnavailable, kInternal };

int http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return 400;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kUnavailable: return 503;
    case ErrorKind::kInternal: return 500;
  }
  return 500;
}

// The two error shapes: OpenAI's {"error": {message, type}} and Anthropic's {"type": "error", "error": {type,
// message}}. The route decides which; the status code comes from http_status() either way.
enum class Api { kOpenAI, kAnthropic };

const char* error_type(Api api, ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return "invalid_request_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kUnavailable: return api == Api::kAnthropic ? "overloaded_error" : "unavailable_error";
    case ErrorKind::kInternal: return api == Api::kAnthropic ? "api_error" : "server_error";
  }
  return "server_error";
}

// Generated text may hold invalid UTF-8 (a model can emit any bytes): replace it rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(ErrorKind kind, const std::string& message, Api api = Api::kOpenAI) {
  if (api == Api::kAnthropic) {
    return {{"type", "error"}, {"error", {{"type", error_type(api, kind)}, {"message", message}}}};
  }
  return {{"error", {{"message", message}, {"type", error_type(api, kind)}}}};
}

void reply_error(httplib::Response& res, ErrorKind kind, const std::string& message, Api api = Api::kOpenAI) {
  res.status = http_status(kind);
  res.set_content(dump(error_body(kind, message, api)), "application/json");
}

void reply_json(httplib::Response& res, const json& body) { res.set_content(dump(body), "application/json"); }

// ---- request parsing: JSON -> plain structs, every failure a Status naming the field ----------------------------

Result<json> parse_body(const httplib::Request& req) {
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Status::error("the request body is not valid JSON");
  if (!body.is_object()) return Status::error("the request body must be a JSON object");
  return body;
}

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

// What every generating route reads from its body: the conversation (or, for /v1/completions, the raw prompt),
// sampling and limits.
struct ChatRequest {
  std::vector<chat::Message> messages;
  std::string prompt;  // /v1/completions only
  SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: until the context is full
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
};

Result<std::string> message_content(const json& content, size_t i) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  const std::string field = format("messages[%zu].content", i);
  if (!content.is_array()) return Status::error(field + " must be a string or an array of text parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    auto type = part.is_object() ? part.find("type") : part.end();
    auto t = part.is_object() ? part.find("text") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text" || t == part.end() || !t->is_string()) {
      return Status::error(format("%s[%zu] must be {\"type\": \"text\", \"text\": STRING}", field.c_str(), k));
    }
    text += t->get<std::string>();
  }
  return text;
}

// The OpenAI sampling and limit fields, shared by /v1/chat/completions and /v1/completions.
Status parse_openai_sampling(const json& body, const SamplingParams& defaults, ChatRequest* out) {
  ChatRequest& r = *out;
  r.sampling = defaults;
  int64_t top_k = r.sampling.top_k, seed = int64_t(r.sampling.seed), max_tokens = 0, max_completion = 0;
  float frequency_penalty = 0;
  for (Status s :
       {read_float(body, "temperature", &r.sampling.temperature), read_float(body, "top_p", &r.sampling.top_p),
        read_float(body, "min_p", &r.sampling.min_p), read_int(body, "top_k", &top_k), read_int(body, "seed", &seed),
        read_float(body, "presence_penalty", &r.sampling.presence_penalty),
        read_float(body, "frequency_penalty", &frequency_penalty), read_int(body, "max_tokens", &max_tokens),
        read_int(body, "max_completion_tokens", &max_completion), read_bool(body, "stream", &r.stream)}) {
    if (!s.ok()) return s;
  }
  if (r.sampling.temperature < 0) return Status::error("temperature must be >= 0");
  if (top_k < 0) return Status::error("top_k must be >= 0");
  if (frequency_penalty != 0) return Status::error("frequency_penalty is not supported (use presence_penalty)");
  r.sampling.top_k = int32_t(top_k);
  r.sampling.seed = uint64_t(seed);
  if (max_tokens < 0 || max_completion < 0) return Status::error("max_tokens must be >= 1");
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

Result<ChatRequest> parse_chat_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  auto messages = body.find("messages");
  if (messages == body.end()) return Status::error("messages is required");
  if (!messages->is_array() || messages->empty()) return Status::error("messages must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object()) return Status::error(format("messages[%zu] must be an object", i));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || (*role != "system" && *role != "user" && *role != "assistant")) {
      return Status::error(format("messages[%zu].role must be \"system\", \"user\" or \"assistant\"", i));
    }
    auto content = m.find("content");
    Result<std::string> text = message_content(content == m.end() ? json() : *content, i);
    if (!text.ok()) return text.status();
    r.messages.push_back({.role = role->get<std::string>(), .content = std::move(text.value())});
  }
  if (Status s = parse_openai_sampling(body, defaults, &r); !s.ok()) return s;
  return r;
}

// /v1/completions: `prompt` is a string (or an array holding one), tokenized with special-token text parsed, so a
// client may send a chat template it rendered itself.
Result<ChatRequest> parse_completion_request(const json& body, const SamplingParams& defaults) {
  ChatRequest r;
  auto prompt = body.find("prompt");
  if (prompt != body.end() && prompt->is_array() && prompt->size() == 1) prompt = prompt->begin();
  if (prompt == body.end() || !prompt->is_string()) return Status::error("prompt must be a string");
  r.prompt = prompt->get<std::string>();
  if (r.prompt.empty()) return Status::error("prompt must not be empty");
  if (Status s = parse_openai_sampling(body, defaults, &r); !s.ok()) return s;
  return r;
}

// ---- Anthropic Messages requests --------------------------------------------------------------------------------

// The text of an Anthropic `content` (a string or an array of blocks); blocks are joined by a blank line.
// Tool calls come later: until then tool_use and tool_result blocks are rendered as plain text so that a
// conversation that holds them still runs. Thinking blocks of earlier turns are dropped, as the ChatML template
// drops earlier reasoning.
Result<std::string> anthropic_text(const json& content, const std::string& field) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Status::error(field + " must be a string or an array of content blocks");
  std::string text;
  auto append = [&text](const std::string& part) {
    if (!text.empty() && !part.empty()) text += "\n\n";
    text += part;
  };
  for (size_t k = 0; k < content.size(); ++k) {
    const json& block = content[k];
    const std::string at = format("%s[%zu]", field.c_str(), k);
    auto type = block.is_object() ? block.find("type") : block.end();
    if (!block.is_object() || type == block.end() || !type->is_string()) {
      return Status::error(at + " must be an object with a string \"type\"");
    }
    if (*type == "text") {
      auto t = block.find("text");
      if (t == block.end() || !t->is_string()) return Status::error(at + ".text must be a string");
      append(t->get<std::string>());
    } else if (*type == "tool_use") {
      auto name = block.find("name");
      if (name == block.end() || !name->is_string()) return Status::error(at + ".name must be a string");
      append("[tool_use " + name->get<std::string>() + " " + dump(block.value("input", json::object())) + "]");
    } else if (*type == "tool_result") {
      Result<std::string> inner = anthropic_text(block.value("content", json()), at + ".content");
      if (!inner.ok()) return inner.status();
      append("[tool_result] " + inner.value());
    } else if (*type != "thinking" && *type != "redacted_thinking") {
      return Status::error(at + ".type \"" + type->get<std::string>() + "\" is not supported");
    }
  }
  return text;
}

// POST /v1/messages (and /v1/messages/count_tokens, which has no max_tokens). Fields the engine has no use for
// (metadata, thinking, tools, tool_choice, context_management, ...) are ignored, never an error: clients such as
// Claude Code send them on every request.
Result<ChatRequest> parse_anthropic_request(const json& body, const SamplingParams& defaults, bool require_max_tokens) {
  ChatRequest r;
  if (auto system = body.find("system"); system != body.end()) {
    Result<std::string> text = anthropic_text(*system, "system");
    if (!text.ok()) return text.status();
    if (!text->empty()) r.messages.push_back({.role = "system", .content = std::move(text.value())});
  }
  auto messages = body.find("messages");
  if (messages == body.end()) return Status::error("messages is required");
  if (!messages->is_array() || messages->empty()) return Status::error("messages must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object()) return Status::error(format("messages[%zu] must be an object", i));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant")) {
      return Status::error(format("messages[%zu].role must be \"user\" or \"assistant\"", i));
    }
    auto content = m.find("content");
    Result<std::string> text =
        anthropic_text(content == m.end() ? json() : *content, format("messages[%zu].content", i));
    if (!text.ok()) return text.status();
    r.messages.push_back({.role = role->get<std::string>(), .content = std::move(text.value())});
  }
  r.sampling = defaults;
  int64_t top_k = r.sampling.top_k;
  for (Status s : {read_float(body, "temperature", &r.sampling.temperature),
                   read_float(body, "top_p", &r.sampling.top_p), read_int(body, "top_k", &top_k),
                   read_int(body, "max_tokens", &r.max_tokens), read_bool(body, "stream", &r.stream)}) {
    if (!s.ok()) return s;
  }
  if (r.sampling.temperature < 0) return Status::error("temperature must be >= 0");
  if (top_k < 0) return Status::error("top_k must be >= 0");
  r.sampling.top_k = int32_t(top_k);
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

const char* finish_reason_name(FinishReason f) { return f == FinishReason::kLength ? "length" : "stop"; }

// Anthropic's stop_reason: max_tokens, stop_sequence (one of the request's stop_sequences matched) or end_turn.
const char* anthropic_stop_reason(const Job& job) {
  if (job.finish == FinishReason::kLength) return "max_tokens";
  return job.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json usage_json(const Job& job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
}

// Anthropic counts cache reads apart: input_tokens are the prompt tokens that were computed, so
// input_tokens + cache_read_input_tokens is the prompt (what count_tokens returns).
json anthropic_usage(const Job& job) {
  return {{"input_tokens", job.prompt_tokens - job.cached_tokens},
          {"output_tokens", job.completion_tokens},
          {"cache_read_input_tokens", job.cached_tokens}};
}

// ---- waiting on a job (HTTP threads) ----------------------------------------------------------------------------

void wait_done(Job& job) {
  std::unique_lock<std::mutex> lock(job.mu);
  job.cv.wait(lock, [&] { return job.done; });
}

// Waits for the worker's next text, keep-alive or the end of the job; takes the text and says whether a keep-alive
// is due. After *done, the worker no longer writes the job and its fields may be read without the lock.
std::string take_text(Job& job, bool* done, bool* keepalive) {
  std::unique_lock<std::mutex> lock(job.mu);
  job.cv.wait(lock, [&] { return job.done || !job.pending_text.empty() || job.keepalives > 0; });
  std::string text = std::move(job.pending_text);
  job.pending_text.clear();
  *keepalive = job.keepalives > 0;
  job.keepalives = 0;
  *done = job.done;
  return text;
}

// The keep-alive of the OpenAI streams: an SSE comment, which clients ignore.
bool write_keepalive(httplib::DataSink& sink, Job& job) {
  static const std::string kComment = ": keep-alive\n\n";
  if (sink.write(kComment.data(), kComment.size())) return true;
  job.cancelled = true;
  return false;
}

// A job that ended without an answer (the engine failed, or the server is stopping): what to report.
std::optional<std::pair<ErrorKind, std::string>> job_failure(const Job& job) {
  if (job.finish == FinishReason::kError) return std::make_pair(ErrorKind::kInternal, job.error);
  if (job.finish == FinishReason::kCancelled) return std::make_pair(ErrorKind::kUnavailable, "the server is stopping");
  return std::nullopt;
}

// The routes /metrics counts requests of; anything else is counted as "other" (bounded label values).
constexpr const char* kRoutes[] = {"/",
                                   "/health",
                                   "/v1/models",
                                   "/v1/chat/completions",
                                   "/v1/completions",
                                   "/v1/messages",
                                   "/v1/messages/count_tokens",
                                   "/tokenize",
                                   "/detokenize",
                                   "/metrics"};

std::string route_label(const std::string& path) {
  for (const char* r : kRoutes) {
    if (path == r) return r;
  }
  return "other";
}

}  // namespace

// ---- the server: routes over httplib, one worker ---------------------------------------------------------------

struct Server::Impl {
  Engine& engine;
  ServerOptions options;
  std::unique_ptr<Worker> worker;
  httplib::Server http;
  int port = 0;
  // stop() may come from another thread before listen_after_bind() has started, when httplib's stop() does
  // nothing: run() announces itself (in_run) before checking stop_requested, and stop() waits for the listener.
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> in_run{false};
  std::atomic<uint64_t> next_id{1};
  // Requests answered, by (route label, HTTP status); counted as the status line is about to be written.
  std::mutex requests_mu;
  std::map<std::pair<std::string, int>, uint64_t> requests;  // guarded by requests_mu

  Impl(Engine& e, ServerOptions o) : engine(e), options(std::move(o)) {}
  void routes();
  // Tokenizes a rendered prompt, checks that it leaves room to generate, and submits its job.
  Result<std::shared_ptr<Job>> submit(const std::string& prompt, ChatRequest& request);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void stream_openai(httplib::Response& res, std::shared_ptr<Job> job, bool include_usage, json first,
                     std::function<json(const std::string&, const char*)> piece);
  void messages(const httplib::Request& req, httplib::Response& res);
  void count_tokens(const httplib::Request& req, httplib::Response& res);
  std::string metrics();
  // The chunk of a stream: object chat.completion.chunk with one choice.
  json chunk(const std::string& id, int64_t created, json delta, const char* finish) const {
    return {{"id", id},
            {"object", "chat.completion.chunk"},
            {"created", created},
            {"model", options.model_name},
            {"choices",
             json::array(
                 {{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish ? json(finish) : json()}}})}};
  }
  // The chunk of a /v1/completions stream (also its non-stream body's choice, with usage added).
  json text_chunk(const std::string& id, int64_t created, const std::string& text, const char* finish) const {
    return {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", options.model_name},
            {"choices", json::array({{{"text", text},
                                      {"index", 0},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish ? json(finish) : json()}}})}};
  }
};

void Server::Impl::routes() {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content("magnetar\n", "text/plain"); });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { reply_json(res, {{"status", "ok"}}); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    reply_json(res,
               {{"object", "list"},
                {"data", json::array({{{"id", options.model_name}, {"object", "model"}, {"owned_by", "magnetar"}}})}});
  });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { chat_completions(req, res); });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) { messages(req, res); });
  http.Post("/v1/messages/count_tokens",
            [this](const httplib::Request& req, httplib::Response& res) { count_tokens(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Result<json> body = parse_body(req);
    if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
    auto content = body->find("content");
    if (content == body->end() || !content->is_string()) {
      return reply_error(res, ErrorKind::kInvalidRequest, "content must be a string");
    }
    // Special-token text becomes the special token by default (as llama.cpp's /tokenize), so a rendered chat
    // prompt tokenizes as the server tokenizes it.
    bool parse_special = true;
    if (Status s = read_bool(*body, "parse_special", &parse_special); !s.ok()) {
      return reply_error(res, ErrorKind::kInvalidRequest, s.message());
    }
    Result<std::vector<int32_t>> ids = engine.tokenize(content->get<std::string>(), parse_special);
    if (!ids.ok()) return reply_error(res, ErrorKind::kInvalidRequest, ids.status().message());
    reply_json(res, {{"tokens", ids.value()}});
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Result<json> body = parse_body(req);
    if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
    auto tokens = body->find("tokens");
    if (tokens == body->end() || !tokens->is_array()) {
      return reply_error(res, ErrorKind::kInvalidRequest, "tokens must be an array of token ids");
    }
    std::vector<int32_t> ids;
    for (const json& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= engine.info().n_vocab) {
        return reply_error(res, ErrorKind::kInvalidRequest,
                           format("tokens must hold ids in [0, %lld)", (long long)engine.info().n_vocab));
      }
      ids.push_back(t.get<int32_t>());
    }
    reply_json(res, {{"content", engine.detokenize(ids)}});
  });
  // Routes nobody registered (404) and any other error without a body get the JSON error object, in Anthropic's
  // shape under /v1/messages.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const Api api = req.path.starts_with("/v1/messages") ? Api::kAnthropic : Api::kOpenAI;
    if (res.status == 404) {
      reply_error(res, ErrorKind::kNotFound, "no route " + req.method + " " + req.path, api);
    } else {
      res.set_content(dump(error_body(ErrorKind::kInvalidRequest, format("HTTP status %d", res.status), api)),
                      "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  // Runs once per response, after the handler and the error handler, before anything is written: the status is
  // final and a client that has read its answer finds it counted.
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(requests_mu);
    ++requests[{route_label(req.path), res.status}];
  });
}

Result<std::shared_ptr<Job>> Server::Impl::submit(const std::string& prompt, ChatRequest& request) {
  Result<std::vector<int32_t>> ids = engine.tokenize(prompt, true);
  if (!ids.ok()) return ids.status();
  const int64_t n_ctx = engine.options().n_ctx, n_prompt = int64_t(ids->size());
  if (n_prompt == 0) return Status::error("the prompt is empty");
  if (n_prompt >= n_ctx) {
    return Status::error(format("the prompt has %lld tokens, the context %lld (no room to generate)",
                                (long long)n_prompt, (long long)n_ctx));
  }
  auto job = std::make_shared<Job>();
  job->prompt = std::move(ids.value());
  job->sampling = request.sampling;
  job->max_tokens = request.max_tokens > 0 ? request.max_tokens : n_ctx - n_prompt;
  job->stop = std::move(request.stop);
  job->stream = request.stream;
  worker->submit(job);
  return job;
}

// ---- OpenAI: /v1/chat/completions and /v1/completions -----------------------------------------------------------

// An OpenAI SSE stream: httplib calls the provider until sink.done(); each call waits for the worker's next text.
// `piece(text, finish)` builds one chunk (a text piece with finish null, or the closing chunk with text ""); `first`
// (null: none) goes out before the first text. A failed write (the client is gone) cancels the job, and so does the
// releaser when the response ends unfinished.
void Server::Impl::stream_openai(httplib::Response& res, std::shared_ptr<Job> job, bool include_usage, json first,
                                 std::function<json(const std::string&, const char*)> piece) {
  auto sent_first = std::make_shared<bool>(first.is_null());
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, include_usage, first = std::move(first), piece = std::move(piece), sent_first](size_t,
                                                                                          httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string event = "data: " + dump(j) + "\n\n";
          if (sink.write(event.data(), event.size())) return true;
          job->cancelled = true;
          return false;
        };
        bool done = false, keepalive = false;
        const std::string text = take_text(*job, &done, &keepalive);
        if (keepalive && !write_keepalive(sink, *job)) return false;
        if ((!text.empty() || done) && !*sent_first) {
          *sent_first = true;
          if (!send(first)) return false;
        }
        if (!text.empty() && !send(piece(text, nullptr))) return false;
        if (!done) return true;
        if (auto failure = job_failure(*job)) {
          if (!send(error_body(failure->first, failure->second))) return false;
        } else {
          if (!send(piece("", finish_reason_name(job->finish)))) return false;
          if (include_usage) {
            json usage = piece("", nullptr);
            usage["choices"] = json::array();
            usage["usage"] = usage_json(*job);
            if (!send(usage)) return false;
          }
        }
        const std::string last = "data: [DONE]\n\n";
        if (!sink.write(last.data(), last.size())) return false;
        sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancelled = true;
      });
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
  Result<ChatRequest> parsed = parse_chat_request(body.value(), options.sampling);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message());
  ChatRequest& request = parsed.value();
  const std::string prompt = chat::render_chatml(request.messages, true, /*enable_thinking=*/false);
  Result<std::shared_ptr<Job>> submitted = submit(prompt, request);
  if (!submitted.ok()) return reply_error(res, ErrorKind::kInvalidRequest, submitted.status().message());
  std::shared_ptr<Job> job = std::move(submitted.value());

  const std::string id = format("chatcmpl-%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  if (!request.stream) {
    wait_done(*job);
    if (auto failure = job_failure(*job)) return reply_error(res, failure->first, failure->second);
    return reply_json(res,
                      {{"id", id},
                       {"object", "chat.completion"},
                       {"created", created},
                       {"model", options.model_name},
                       {"choices", json::array({{{"index", 0},
                                                 {"message", {{"role", "assistant"}, {"content", job->pending_text}}},
                                                 {"finish_reason", finish_reason_name(job->finish)}}})},
                       {"usage", usage_json(*job)}});
  }

  // Streaming: the role chunk goes with the first text (or the end); before it, only keep-alives.
  json role = chunk(id, created, {{"role", "assistant"}, {"content", ""}}, nullptr);
  stream_openai(res, job, request.include_usage, std::move(role), [this, id, created](const std::string& text, const char* finish) {
    return chunk(id, created, finish ? json::object() : json{{"content", text}}, finish);
  });
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
  Result<ChatRequest> parsed = parse_completion_request(body.value(), options.sampling);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message());
  ChatRequest& request = parsed.value();
  Result<std::shared_ptr<Job>> submitted = submit(request.prompt, request);
  if (!submitted.ok()) return reply_error(res, ErrorKind::kInvalidRequest, submitted.status().message());
  std::shared_ptr<Job> job = std::move(submitted.value());

  const std::string id = format("cmpl-%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  if (!request.stream) {
    wait_done(*job);
    if (auto failure = job_failure(*job)) return reply_error(res, failure->first, failure->second);
    json r = text_chunk(id, created, job->pending_text, finish_reason_name(job->finish));
    r["usage"] = usage_json(*job);
    return reply_json(res, r);
  }
  stream_openai(res, job, request.include_usage, nullptr, [this, id, created](const std::string& text, const char* finish) {
    return text_chunk(id, created, text, finish);
  });
}

// ---- Anthropic: /v1/messages and /v1/messages/count_tokens ------------------------------------------------------

void Server::Impl::messages(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message(), Api::kAnthropic);
  Result<ChatRequest> parsed = parse_anthropic_request(body.value(), options.sampling, /*require_max_tokens=*/true);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message(), Api::kAnthropic);
  ChatRequest& request = parsed.value();
  const std::string prompt = chat::render_chatml(request.messages, true, /*enable_thinking=*/false);
  Result<std::shared_ptr<Job>> submitted = submit(prompt, request);
  if (!submitted.ok()) {
    return reply_error(res, ErrorKind::kInvalidRequest, submitted.status().message(), Api::kAnthropic);
  }
  std::shared_ptr<Job> job = std::move(submitted.value());
  const std::string id =
      format("msg_%08llx%08llx", (unsigned long long)std::time(nullptr), (unsigned long long)next_id.fetch_add(1));
  // The message object; `content` and the stop fields are filled in once known.
  auto message = [this, id](json content, json stop_reason, json stop_sequence, json usage) {
    return json{{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", options.model_name},
                {"content", std::move(content)},
                {"stop_reason", std::move(stop_reason)},
                {"stop_sequence", std::move(stop_sequence)},
                {"usage", std::move(usage)}};
  };
  auto stop_sequence = [](const Job& j) { return j.stop_sequence.empty() ? json() : json(j.stop_sequence); };
  if (!request.stream) {
    wait_done(*job);
    if (auto failure = job_failure(*job)) {
      return reply_error(res, failure->first, failure->second, Api::kAnthropic);
    }
    return reply_json(res, message(json::array({{{"type", "text"}, {"text", job->pending_text}}}),
                                   anthropic_stop_reason(*job), stop_sequence(*job), anthropic_usage(*job)));
  }

  // Streaming: message_start (once the worker has taken the job, so its usage counts the reused prefix), ping; a
  // ping per keep-alive during the prefill; content_block_start with the first text (or the end), then a
  // content_block_delta per piece of text; then content_block_stop, message_delta and message_stop. Each SSE event
  // is "event: NAME\ndata: JSON\n\n".
  auto started = std::make_shared<bool>(false);
  auto block_started = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, message, stop_sequence, started, block_started](size_t, httplib::DataSink& sink) {
        auto send = [&](const char* event, const json& j) {
          const std::string text = std::string("event: ") + event + "\ndata: " + dump(j) + "\n\n";
          if (sink.write(text.data(), text.size())) return true;
          job->cancelled = true;
          return false;
        };
        if (!*started) {
          *started = true;
          json usage;
          {
            std::unique_lock<std::mutex> lock(job->mu);
            job->cv.wait(lock, [&] { return job->started || job->done; });
            usage = {{"input_tokens", job->prompt_tokens - job->cached_tokens},
                     {"output_tokens", 0},
                     {"cache_read_input_tokens", job->cached_tokens}};
          }
          return send("message_start",
                      {{"type", "message_start"}, {"message", message(json::array(), nullptr, nullptr, usage)}}) &&
                 send("ping", {{"type", "ping"}});
        }
        bool done = false, keepalive = false;
        const std::string text = take_text(*job, &done, &keepalive);
        if (keepalive && !send("ping", {{"type", "ping"}})) return false;
        if ((!text.empty() || (done && !job_failure(*job))) && !*block_started) {
          *block_started = true;
          if (!send("content_block_start", {{"type", "content_block_start"},
                                            {"index", 0},
                                            {"content_block", {{"type", "text"}, {"text", ""}}}})) {
            return false;
          }
        }
        if (!text.empty() && !send("content_block_delta", {{"type", "content_block_delta"},
                                                           {"index", 0},
                                                           {"delta", {{"type", "text_delta"}, {"text", text}}}})) {
          return false;
        }
        if (!done) return true;
        if (auto failure = job_failure(*job)) {
          if (!send("error", error_body(failure->first, failure->second, Api::kAnthropic))) return false;
        } else if (!send("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) ||
                   !send("message_delta",
                         {{"type", "message_delta"},
                          {"delta",
                           {{"stop_reason", anthropic_stop_reason(*job)}, {"stop_sequence", stop_sequence(*job)}}},
                          {"usage", {{"output_tokens", job->completion_tokens}}}}) ||
                   !send("message_stop", {{"type", "message_stop"}})) {
          return false;
        }
        sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancelled = true;
      });
}

// The prompt's token count as /v1/messages would render it (input_tokens + cache_read_input_tokens there).
void Server::Impl::count_tokens(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message(), Api::kAnthropic);
  Result<ChatRequest> parsed = parse_anthropic_request(body.value(), options.sampling, /*require_max_tokens=*/false);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message(), Api::kAnthropic);
  Result<std::vector<int32_t>> ids =
      engine.tokenize(chat::render_chatml(parsed->messages, true, /*enable_thinking=*/false), true);
  if (!ids.ok()) return reply_error(res, ErrorKind::kInvalidRequest, ids.status().message(), Api::kAnthropic);
  reply_json(res, {{"input_tokens", ids->size()}});
}

// ---- /metrics: Prometheus text format ---------------------------------------------------------------------------

std::string Server::Impl::metrics() {
  const WorkerStats w = worker->stats();
  std::string out;
  auto family = [&out](const char* name, const char* type, const char* help) {
    out += format("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  };
  // Counts print as exact integers, seconds with 9 significant digits.
  auto value = [&out](const char* name, double v) {
    out += format(v == std::floor(v) ? "%s %.0f\n" : "%s %.9g\n", name, v);
  };
  family("magnetar_requests_total", "counter", "HTTP requests answered, by route and status.");
  {
    std::lock_guard<std::mutex> lock(requests_mu);
    for (const auto& [key, n] : requests) {
      out += format("magnetar_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", key.first.c_str(), key.second,
                    (unsigned long long)n);
    }
  }
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    double v;
  };
  const Row rows[] = {
      {"magnetar_prompt_tokens_total", "counter", "Prompt tokens of the requests run (cached ones included).",
       double(w.prompt_tokens)},
      {"magnetar_generated_tokens_total", "counter", "Tokens generated.", double(w.generated_tokens)},
      {"magnetar_cached_tokens_total", "counter", "Prompt tokens whose KV was reused from the previous request.",
       double(w.cached_tokens)},
      {"magnetar_prompt_seconds_total", "counter", "Seconds spent computing prompts.", w.prompt_seconds},
      {"magnetar_generation_seconds_total", "counter", "Seconds spent generating.", w.generation_seconds},
      {"magnetar_requests_active", "gauge", "Requests being generated (0 or 1: one worker).", double(w.active)},
      {"magnetar_requests_queued", "gauge", "Requests waiting for the worker.", double(w.queued)},
      {"magnetar_expert_cache_hits_total", "counter", "Expert cache hits (0 when experts are resident).",
       double(w.experts.hits)},
      {"magnetar_expert_cache_misses_total", "counter", "Expert cache misses (0 when experts are resident).",
       double(w.experts.misses)},
      {"magnetar_expert_cache_bytes_read_total", "counter", "Bytes of experts read from disk.",
       double(w.experts.bytes_read)},
      {"magnetar_expert_cache_evictions_total", "counter", "Experts evicted from the cache.",
       double(w.experts.evictions)},
  };
  for (const Row& r : rows) {
    family(r.name, r.type, r.help);
    value(r.name, r.v);
  }
  return out;
}

Result<std::unique_ptr<Server>> Server::bind(Engine& engine, const ServerOptions& options) {
  if (!engine.info().has_tokenizer)
    return Status::error(engine.info().path + ": the model has no tokenizer; serve needs one");
  Result<std::unique_ptr<Session>> session = engine.new_session();
  if (!session.ok()) return session.status();
  auto impl = std::make_unique<Impl>(engine, options);
  impl->worker = Worker::start(engine, std::move(session.value()), options.keepalive_seconds);
  impl->routes();
  impl->port = options.port == 0 ? impl->http.bind_to_any_port(options.host)
                                 : (impl->http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (impl->port <= 0) return Status::error(format("cannot listen on %s:%d", options.host.c_str(), options.port));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;
int Server::port() const { return impl_->port; }

Status Server::run() {
  impl_->in_run = true;
  if (impl_->stop_requested.load()) return Status();
  if (!impl_->http.listen_after_bind()) return Status::error("the HTTP listener failed");
  return Status();
}

void Server::stop() {
  impl_->stop_requested = true;
  if (impl_->in_run.load()) {
    // Bounded: a listener that failed to start never runs (1 s, then httplib's stop() is a no-op).
    for (int i = 0; i < 1000 && !impl_->http.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  impl_->http.stop();
}

}  // namespace magnetar::server
