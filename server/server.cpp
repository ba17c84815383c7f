#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

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

const char* error_type(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return "invalid_request_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kUnavailable: return "unavailable_error";
    case ErrorKind::kInternal: return "server_error";
  }
  return "server_error";
}

// Generated text may hold invalid UTF-8 (a model can emit any bytes): replace it rather than throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(ErrorKind kind, const std::string& message) {
  return {{"error", {{"message", message}, {"type", error_type(kind)}}}};
}

void reply_error(httplib::Response& res, ErrorKind kind, const std::string& message) {
  res.status = http_status(kind);
  res.set_content(dump(error_body(kind, message)), "application/json");
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

struct ChatRequest {
  std::vector<chat::Message> messages;
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
  return r;
}

const char* finish_reason_name(FinishReason f) { return f == FinishReason::kLength ? "length" : "stop"; }

json usage_json(const Job& job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", job.cached_tokens}}}};
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

  Impl(Engine& e, ServerOptions o) : engine(e), options(std::move(o)) {}
  void routes();
  void chat_completions(const httplib::Request& req, httplib::Response& res);
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
  // Routes nobody registered (404) and any other error without a body get the JSON error object.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      reply_error(res, ErrorKind::kNotFound, "no route " + req.method + " " + req.path);
    } else {
      res.set_content(dump(error_body(ErrorKind::kInvalidRequest, format("HTTP status %d", res.status))),
                      "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
  Result<ChatRequest> parsed = parse_chat_request(body.value(), options.sampling);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message());
  ChatRequest& request = parsed.value();
  const std::string prompt = chat::render_chatml(request.messages, true, /*enable_thinking=*/false);
  Result<std::vector<int32_t>> ids = engine.tokenize(prompt, true);
  if (!ids.ok()) return reply_error(res, ErrorKind::kInvalidRequest, ids.status().message());
  const int64_t n_ctx = engine.options().n_ctx, n_prompt = int64_t(ids->size());
  if (n_prompt >= n_ctx) {
    return reply_error(res, ErrorKind::kInvalidRequest,
                       format("the prompt has %lld tokens, the context %lld (no room to generate)", (long long)n_prompt,
                              (long long)n_ctx));
  }
  auto job = std::make_shared<Job>();
  job->prompt = std::move(ids.value());
  job->sampling = request.sampling;
  job->max_tokens = request.max_tokens > 0 ? request.max_tokens : n_ctx - n_prompt;
  job->stop = std::move(request.stop);
  worker->submit(job);

  const std::string id = format("chatcmpl-%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  if (!request.stream) {
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done; });
    if (job->finish == FinishReason::kError) return reply_error(res, ErrorKind::kInternal, job->error);
    if (job->finish == FinishReason::kCancelled)
      return reply_error(res, ErrorKind::kUnavailable, "the server is stopping");
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

  // Streaming: httplib calls the provider until sink.done(); each call waits for the worker's next text. A failed
  // write (the client is gone) cancels the job, and so does the releaser when the response ends unfinished.
  const bool include_usage = request.include_usage;
  auto sent_role = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, id, created, include_usage, sent_role](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string event = "data: " + dump(j) + "\n\n";
          if (sink.write(event.data(), event.size())) return true;
          job->cancelled = true;
          return false;
        };
        if (!*sent_role) {
          *sent_role = true;
          return send(chunk(id, created, {{"role", "assistant"}, {"content", ""}}, nullptr));
        }
        std::unique_lock<std::mutex> lock(job->mu);
        job->cv.wait(lock, [&] { return job->done || !job->pending_text.empty(); });
        const std::string text = std::move(job->pending_text);
        job->pending_text.clear();
        const bool done = job->done;
        lock.unlock();
        if (!text.empty() && !send(chunk(id, created, {{"content", text}}, nullptr))) return false;
        if (!done) return true;
        // done is final: the worker no longer writes the job.
        if (job->finish == FinishReason::kError || job->finish == FinishReason::kCancelled) {
          const ErrorKind kind = job->finish == FinishReason::kError ? ErrorKind::kInternal : ErrorKind::kUnavailable;
          if (!send(error_body(kind, job->finish == FinishReason::kError ? job->error : "the server is stopping"))) {
            return false;
          }
        } else {
          if (!send(chunk(id, created, json::object(), finish_reason_name(job->finish)))) return false;
          if (include_usage) {
            json usage = {{"id", id},
                          {"object", "chat.completion.chunk"},
                          {"created", created},
                          {"model", options.model_name},
                          {"choices", json::array()},
                          {"usage", usage_json(*job)}};
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

Result<std::unique_ptr<Server>> Server::bind(Engine& engine, const ServerOptions& options) {
  if (!engine.info().has_tokenizer)
    return Status::error(engine.info().path + ": the model has no tokenizer; serve needs one");
  Result<std::unique_ptr<Session>> session = engine.new_session();
  if (!session.ok()) return session.status();
  auto impl = std::make_unique<Impl>(engine, options);
  impl->worker = Worker::start(engine, std::move(session.value()));
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
