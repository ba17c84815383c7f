#include "server/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "base/json_shape.h"
#include "chat/chatml.h"
#include "chat/template.h"
#include "chat/tool_calls.h"
#include "server/conversation.h"
#include "server/output.h"
#include "server/requests.h"
#include "server/webui.h"
#include "server/worker.h"

namespace magnetar::server {

// Ordered: tools and arguments keep the client's key order into the prompt (chat/conversation.h), and responses
// list their fields in the order written here.
using json = nlohmann::ordered_json;

namespace {

// ---- errors: every HTTP status code the server sends is decided here -------------------------------------------

enum class ErrorKind {
  kInvalidRequest,
  kUnauthorized,  // --api-key set and the request has no key, or another one
  kForbidden,     // a Host header outside the allowlist (DNS rebinding)
  kNotFound,
  kPayloadTooLarge,  // a body over --max-body-mb
  kContextLength,    // a prompt the context cannot hold (400; agents look for its words to compact their history)
  kUnavailable,
  kInternal
};

int http_status(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextLength: return 400;
    case ErrorKind::kUnauthorized: return 401;
    case ErrorKind::kForbidden: return 403;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kPayloadTooLarge: return 413;
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
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextLength: return "invalid_request_error";
    case ErrorKind::kUnauthorized: return "authentication_error";
    case ErrorKind::kForbidden: return "permission_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kPayloadTooLarge: return api == Api::kAnthropic ? "request_too_large" : "invalid_request_error";
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
  json body = {{"error", {{"message", message}, {"type", error_type(api, kind)}}}};
  if (kind == ErrorKind::kContextLength) body["error"]["code"] = "context_length_exceeded";  // OpenAI's code
  return body;
}

void reply_error(httplib::Response& res, ErrorKind kind, const std::string& message, Api api = Api::kOpenAI) {
  res.status = http_status(kind);
  res.set_content(dump(error_body(kind, message, api)), "application/json");
}

void reply_json(httplib::Response& res, const json& body) { res.set_content(dump(body), "application/json"); }

// The error shape of a path: Anthropic's under /v1/messages, OpenAI's elsewhere.
Api api_of(const std::string& path) { return path.starts_with("/v1/messages") ? Api::kAnthropic : Api::kOpenAI; }
// The shape of the routes both APIs have (/v1/models): Anthropic's for a request with anthropic-version, which its
// SDKs send.
Api api_of_client(const httplib::Request& req) {
  return req.has_header("anthropic-version") ? Api::kAnthropic : Api::kOpenAI;
}

// A file's modification time (0 when it cannot be read).
std::time_t modified_time(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mtime : 0;
}

// ---- security: API key, Host allowlist, CORS (the pre-routing handler's checks) ---------------------------------

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Equal strings, in a time that depends on the length of `given` only, never on where it differs from `secret`
// (which must not be empty).
bool same_secret(std::string_view given, std::string_view secret) {
  unsigned diff = given.size() != secret.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= unsigned(uint8_t(given[i]) ^ uint8_t(secret[i % secret.size()]));
  return diff == 0;
}

// The key a request presents: `Authorization: Bearer KEY` (scheme case-insensitive) or `x-api-key: KEY`.
std::vector<std::string> presented_keys(const httplib::Request& req) {
  std::vector<std::string> keys;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.size() > 7 && lower(std::string_view(auth).substr(0, 7)) == "bearer ") {
    const size_t start = auth.find_first_not_of(' ', 7);
    if (start != std::string::npos) keys.push_back(auth.substr(start));
  }
  if (req.has_header("x-api-key")) keys.push_back(req.get_header_value("x-api-key"));
  return keys;
}

// Routes a browser loads before it could know a key: the page, its files, and the liveness probe.
bool is_public(const httplib::Request& req) {
  if (req.method != "GET" && req.method != "HEAD") return false;
  return req.path == "/" || req.path == "/health" || req.path.starts_with("/webui/");
}

// The name of a Host header value, lowercased, without its port: "LocalHost:8080" -> "localhost",
// "[::1]:8080" -> "[::1]".
std::string host_name(const std::string& host) {
  std::string name = lower(host);
  if (name.starts_with("[")) {
    const size_t close = name.find(']');
    return close == std::string::npos ? name : name.substr(0, close + 1);
  }
  const size_t colon = name.find(':');
  return colon == std::string::npos ? name : name.substr(0, colon);
}

bool is_loopback_address(const std::string& host) {
  const std::string h = lower(host);
  return h == "localhost" || h == "::1" || h == "[::1]" || h.starts_with("127.");
}

// The Host names a server accepts; empty: any (a server listening beyond loopback without --allowed-hosts).
std::vector<std::string> allowed_host_names(const ServerOptions& options) {
  if (!is_loopback_address(options.host) && options.allowed_hosts.empty()) return {};
  std::vector<std::string> names = {"localhost", "127.0.0.1", "[::1]"};
  for (const std::string& h : options.allowed_hosts) {
    // An IPv6 address written bare (fe80::1) is the bracketed name a Host header carries; else a port is cut off.
    const bool bare_ipv6 = !h.starts_with("[") && std::count(h.begin(), h.end(), ':') > 1;
    names.push_back(bare_ipv6 ? "[" + lower(h) + "]" : host_name(h));
  }
  return names;
}

// ---- request parsing: JSON -> plain structs, every failure a Status naming the field ----------------------------

Result<json> parse_body(const httplib::Request& req) {
  if (const std::string why = json_refusal(req.body); !why.empty()) return Status::error("the request body " + why);
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return Status::error("the request body is not valid JSON");
  if (!body.is_object()) return Status::error("the request body must be a JSON object");
  return body;
}

// ---- generation plan: conversation -> prompt text, output format, constraint ------------------------------------

// What the worker is asked to do for a chat request, and how its output is to be read.
struct Generation {
  std::string prompt;         // rendered, forced prefix included
  chat::OutputFormat format;  // how to parse the output
  chat::ConstraintSpec constraint;
  std::string output_prefix, output_suffix;  // Job's fields of the same names
  std::vector<std::string> notes;            // for the debug log
};

// Renders the conversation and decides the constraint: tool_choice "none" drops the tools; a forced tool call
// (required / a named function) appends `<tool_call>\n{"name": "NAME", "arguments":` to the prompt (without a
// name: `<tool_call>\n{"name": "` and the names are constrained) and constrains the arguments to a JSON object,
// closed by `}\n</tool_call>` once complete; json_object constrains the answer to one JSON object. Thinking is
// off when the model has no <think> token, and for constrained output (the constraint covers the whole answer; a
// think block the template opened is closed empty).
Result<Generation> plan_generation(const ChatInput& input, bool model_thinks, const chat::ChatTemplate& tmpl) {
  Generation g;
  g.notes = input.notes;
  chat::Conversation conversation = input.conversation;
  const ToolChoice& choice = input.tool_choice;
  const bool tools = !conversation.tools.empty() && choice.mode != ToolChoice::Mode::kNone;
  if (!tools) conversation.tools = json::array();
  const bool forced =
      tools && (choice.mode == ToolChoice::Mode::kRequired || choice.mode == ToolChoice::Mode::kFunction);
  if (conversation.enable_thinking && !model_thinks) {
    g.notes.push_back("thinking is ignored: the model has no <think> token");
    conversation.enable_thinking = false;
  }
  if (conversation.enable_thinking && (forced || input.json_object)) {
    g.notes.push_back("thinking is off for a constrained answer (forced tool call or JSON)");
    conversation.enable_thinking = false;
  }
  MAGNETAR_ASSIGN_OR_RETURN(g.prompt, tmpl.render(conversation, /*add_generation_prompt=*/true));
  // A template may open the think block itself (Qwen3's 2507 thinking models do, whether thinking was asked for or
  // not): the output then starts inside it, and its reasoning is parsed as reasoning (not the answer's text).
  const size_t last = g.prompt.find_last_not_of(" \n");
  const bool opened =
      model_thinks && last != std::string::npos && last >= 6 && g.prompt.compare(last - 6, 7, "<think>") == 0;
  if (opened && (forced || input.json_object)) {
    // The constraint covers the answer: the block the template opened is closed empty first (as Qwen renders a
    // turn without reasoning), else the forced call or the JSON would be written, and parsed, as reasoning.
    g.prompt += "\n</think>\n\n";
  }
  const bool reasoning = opened && !forced && !input.json_object;
  g.format = {
      .reasoning = conversation.enable_thinking || reasoning, .starts_in_reasoning = reasoning, .tool_calls = tools};
  if (forced) {
    g.output_prefix = "<tool_call>\n{\"name\": \"";
    if (choice.mode == ToolChoice::Mode::kFunction) {
      g.output_prefix += choice.name + "\", \"arguments\":";
    } else {
      for (const json& tool : conversation.tools) {
        g.constraint.choices.push_back(tool["function"]["name"].get<std::string>() + "\", \"arguments\":");
      }
    }
    g.constraint.json_object = true;
    g.output_suffix = "}\n</tool_call>";
    g.prompt += g.output_prefix;
  } else if (input.json_object) {
    g.constraint.json_object = true;
  }
  return g;
}

// ---- waiting on a job (HTTP threads) ----------------------------------------------------------------------------

// The first of this process's sockets (found among /proc/self/fd) whose address -- the peer's (peer) or its own --
// `match` accepts as (host, port); -1 when none does. httplib 0.11 hands out neither its accepted sockets nor its
// listening one.
template <typename Match>
int find_socket(bool peer, Match match) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    sockaddr* a = reinterpret_cast<sockaddr*>(&addr);
    if ((peer ? ::getpeername(fd, a, &len) : ::getsockname(fd, a, &len)) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {};
    int port = -1;
    if (addr.ss_family == AF_INET) {
      const auto* a4 = reinterpret_cast<const sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a4->sin_addr, host, sizeof(host));
      port = ntohs(a4->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof(host));
      port = ntohs(a6->sin6_port);
    }
    if (port >= 0 && match(fd, std::string_view(host), port)) {
      found = fd;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// The accepted socket a request came on, found by its peer address; -1 when not found.
int request_socket(const httplib::Request& req) {
  return find_socket(true, [&](int, std::string_view host, int port) {
    return port == req.remote_port && req.remote_addr == host;
  });
}

// The client closed its side: a peek reads end-of-file (a pipelined next request would read data instead).
bool peer_closed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

// Waits for a non-streamed job's end; a client that hangs up meanwhile cancels it (checked every 25 ms, shorter than
// a decode step of a large model: the worker then stops before its next token, or drops the job if still queued).
void wait_done(Job& job, const httplib::Request& req) {
  const int fd = request_socket(req);
  std::unique_lock<std::mutex> lock(job.mu);
  while (!job.cv.wait_for(lock, std::chrono::milliseconds(25), [&] { return job.done; })) {
    if (fd >= 0 && !job.cancelled.load() && peer_closed(fd)) job.cancelled = true;
  }
}

// How long a stream stays silent before it gets a keep-alive (--keepalive-seconds, at least 1 s here: 0 means "after
// every prefill chunk" to the worker).
std::chrono::milliseconds silence_limit(double keepalive_seconds) {
  return std::chrono::milliseconds(int64_t(std::max(1.0, keepalive_seconds) * 1000));
}

// Waits for the worker's next text, keep-alive or the end of the job; takes the text and says whether a keep-alive
// is due: asked for by the worker (a long prefill) or `silence` after the stream's last write (`last_sent`: the job
// queued, or text arriving that writes nothing yet, as a tool call's arguments being buffered until the call
// closes): its write finds a client that left, which cancels the job. After *done, the worker no longer writes the
// job and its fields may be read without the lock.
std::string take_text(Job& job, std::chrono::milliseconds silence, std::chrono::steady_clock::time_point last_sent,
                      bool* done, bool* keepalive) {
  std::unique_lock<std::mutex> lock(job.mu);
  job.cv.wait_for(lock, silence, [&] { return job.done || !job.pending_text.empty() || job.keepalives > 0; });
  std::string text = std::move(job.pending_text);
  job.pending_text.clear();
  *keepalive = job.keepalives > 0 || std::chrono::steady_clock::now() - last_sent >= silence;
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
                                   "/v1/responses",
                                   "/tokenize",
                                   "/detokenize",
                                   "/metrics",
                                   "/v1/status",
                                   "/v1/experts/map"};

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
  // Tokenizing takes ~28 bytes of memory per byte of a long run without spaces (BPE's symbols and merge heap): texts
  // over 1 MiB are tokenized one at a time, so concurrent 64 MiB bodies cost ~2 GB in all, not ~2 GB each.
  std::mutex large_text_mu;
  Result<std::vector<int32_t>> tokenize(const std::string& text, bool parse_special) {
    std::unique_lock<std::mutex> lock(large_text_mu, std::defer_lock);
    if (text.size() > (size_t(1) << 20)) lock.lock();
    return engine.tokenize(text, parse_special);
  }
  std::map<std::pair<std::string, int>, uint64_t> requests;  // guarded by requests_mu

  bool model_thinks = false;  // the vocabulary has <think> and </think> tokens (thinking can be turned on)
  std::optional<chat::ChatTemplate> chat_template;  // chosen at bind (chat/template.h)

  std::vector<std::string> allowed_hosts;  // Host names accepted (allowed_host_names); empty: any
  // /v1/models' time of the model: its file's (a release date is what both APIs mean; the file's is the nearest this
  // server knows).
  const std::time_t model_time;

  Impl(Engine& e, ServerOptions o)
      : engine(e),
        options(std::move(o)),
        allowed_hosts(allowed_host_names(options)),
        model_time(modified_time(engine.info().path)) {}
  void routes();
  // 403 (Host outside the allowlist) or 401 (API key missing or wrong) with its message; nullopt: let it in.
  std::optional<std::pair<ErrorKind, std::string>> refusal(const httplib::Request& req) const;
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  // http.Post(pattern, handler) behind refusal(): see pre_route.
  void post(const char* pattern, std::function<void(const httplib::Request&, httplib::Response&)> handler);
  // --cors is set and the request's Origin matches it.
  bool cors_allows(const httplib::Request& req) const;
  // Tokenizes a rendered prompt, checks that it leaves room to generate, and submits its job (with the
  // generation's constraint when `generation` is given). A refusal sets `refused`: kContextLength for a prompt the
  // context cannot hold, kInvalidRequest otherwise.
  Result<std::shared_ptr<Job>> submit(const std::string& prompt, ChatRequest& request, const Generation* generation,
                                      ErrorKind& refused);
  // GET /v1/models' model: Anthropic's ModelInfo or OpenAI's model.
  json model_object(Api api) const;
  // The plan of a chat request, its notes printed with --verbose.
  Result<Generation> plan(const ChatRequest& request, const char* route) const;
  // A chat route's start: the body parsed by `parse`, planned and submitted. A refusal is answered on `res` (in the
  // shape of `api`) and returns nothing.
  struct Started {
    ChatRequest request;
    Generation generation;
    std::shared_ptr<Job> job;
  };
  std::optional<Started> start_chat(const httplib::Request& req, httplib::Response& res, const char* route, Api api,
                                    const std::function<Result<ChatRequest>(const json&)>& parse);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  // pieces(text, done): the chunks for the next raw output text; when done (and the job did not fail) the
  // closing chunks too.
  using Pieces = std::function<std::vector<json>(const std::string& text, bool done)>;
  void stream_openai(httplib::Response& res, std::shared_ptr<Job> job, bool include_usage, json first, json usage_base,
                     Pieces pieces);
  void messages(const httplib::Request& req, httplib::Response& res);
  void count_tokens(const httplib::Request& req, httplib::Response& res);
  void responses(const httplib::Request& req, httplib::Response& res);
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

// A CORS preflight: OPTIONS with Access-Control-Request-Method, answered without the API key (browsers send none).
static bool is_preflight(const httplib::Request& req) {
  return req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method");
}

std::optional<std::pair<ErrorKind, std::string>> Server::Impl::refusal(const httplib::Request& req) const {
  if (!allowed_hosts.empty() && req.has_header("Host")) {
    const std::string host = req.get_header_value("Host");
    if (std::find(allowed_hosts.begin(), allowed_hosts.end(), host_name(host)) == allowed_hosts.end()) {
      return std::make_pair(ErrorKind::kForbidden,
                            format("Host header \"%s\" is not allowed (DNS rebinding protection): this server "
                                   "answers localhost, 127.0.0.1, [::1] and the names of --allowed-hosts",
                                   host.c_str()));
    }
  }
  // A web page's request carries its Origin: one from another origin than the server's own (its web UI) is refused
  // unless --cors names it, so a page the user visits cannot make the server work (a form's text/plain POST needs
  // no preflight, and without an API key nothing else would stop it).
  if (req.has_header("Origin") && !cors_allows(req)) {
    const std::string origin = lower(req.get_header_value("Origin"));
    const size_t scheme = origin.find("://");
    const std::string host = lower(req.get_header_value("Host"));
    if (scheme == std::string::npos || host.empty() || origin.substr(scheme + 3) != host) {
      return std::make_pair(ErrorKind::kForbidden,
                            format("a request from the web page of origin \"%s\" is refused: a page may use this "
                                   "server only when --cors names its origin",
                                   req.get_header_value("Origin").c_str()));
    }
  }
  if (options.api_key.empty() || is_public(req) || (is_preflight(req) && !options.cors_origin.empty())) {
    return std::nullopt;
  }
  const std::vector<std::string> keys = presented_keys(req);
  if (keys.empty()) {
    return std::make_pair(ErrorKind::kUnauthorized,
                          std::string("missing API key: send it as \"Authorization: Bearer KEY\" or \"x-api-key: KEY\""));
  }
  bool ok = false;
  for (const std::string& k : keys) ok |= same_secret(k, options.api_key);
  if (!ok) return std::make_pair(ErrorKind::kUnauthorized, std::string("invalid API key"));
  return std::nullopt;
}

// A body httplib would read without a bound, or leave on the connection: httplib 0.11 bounds a body by --max-body-mb
// only through its Content-Length (a chunked body, or a compressed one it inflates, grew until memory ran out), and
// does not read a GET's body (the next request would be parsed out of it).
static std::optional<std::string> framing_refusal(const httplib::Request& req) {
  if (req.has_header("Content-Encoding") && lower(req.get_header_value("Content-Encoding")) != "identity") {
    return "Content-Encoding \"" + req.get_header_value("Content-Encoding") +
           "\" is not accepted: send the body uncompressed";
  }
  if (req.has_header("Transfer-Encoding")) {
    return std::string("Transfer-Encoding is not accepted: send the body with a Content-Length");
  }
  const bool has_body = req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0";
  if (req.method == "POST" && !req.has_header("Content-Length")) return std::string("a POST needs a Content-Length");
  if (req.method != "POST" && has_body) return req.method + " carries no body here";
  return std::nullopt;
}

// Before any route: a request whose body cannot be read safely, or refused (403 Host or origin, 401 key), is answered
// here with Connection: close (httplib 0.11 still consumes a Content-Length body within --max-body-mb, and parses what
// follows an unbounded body as requests of its own, each refused: measured, 300 MiB of chunks sent to a refused
// request left the server's RSS at 82 MB). The POST routes (post()) and the error handler (unknown routes, 413)
// check refusal() again. CORS preflights get their 204 here.
httplib::Server::HandlerResponse Server::Impl::pre_route(const httplib::Request& req, httplib::Response& res) {
  const std::optional<std::string> framing = framing_refusal(req);
  const auto refused = framing ? std::make_pair(ErrorKind::kInvalidRequest, *framing) : refusal(req);
  if (refused) {
    reply_error(res, refused->first, refused->second, api_of(req.path));
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  }
  if (is_preflight(req) && !options.cors_origin.empty()) {
    res.status = 204;
    if (cors_allows(req)) {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers",
                     "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
      res.set_header("Access-Control-Max-Age", "600");
    }
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

void Server::Impl::post(const char* pattern, std::function<void(const httplib::Request&, httplib::Response&)> handler) {
  http.Post(pattern, [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    if (auto refused = refusal(req)) return reply_error(res, refused->first, refused->second, api_of(req.path));
    handler(req, res);
  });
}

bool Server::Impl::cors_allows(const httplib::Request& req) const {
  if (options.cors_origin.empty() || !req.has_header("Origin")) return false;
  return options.cors_origin == "*" || req.get_header_value("Origin") == options.cors_origin;
}

void Server::Impl::routes() {
  http.set_payload_max_length(size_t(options.max_body_mb) << 20);
  http.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  add_webui_routes(http, engine, *worker, options.model_name);  // GET / (and HEAD /), /webui/*, /v1/status, ...
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { reply_json(res, {{"status", "ok"}}); });
  // The model list and the model in the shape the client speaks: Anthropic's (its SDKs send anthropic-version) or
  // OpenAI's, with vLLM's max_model_len (the context) that clients read to size their conversations.
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    const Api api = api_of_client(req);
    const json model = model_object(api);
    if (api == Api::kAnthropic) {
      return reply_json(res, {{"data", json::array({model})},
                              {"has_more", false},
                              {"first_id", options.model_name},
                              {"last_id", options.model_name}});
    }
    reply_json(res, {{"object", "list"}, {"data", json::array({model})}});
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const Api api = api_of_client(req);
    if (req.matches[1].str() != options.model_name) {
      return reply_error(res, ErrorKind::kNotFound,
                         format("model '%s' does not exist (this server serves '%s')", req.matches[1].str().c_str(),
                                options.model_name.c_str()),
                         api);
    }
    reply_json(res, model_object(api));
  });
  post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { chat_completions(req, res); });
  post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) { messages(req, res); });
  post("/v1/messages/count_tokens",
            [this](const httplib::Request& req, httplib::Response& res) { count_tokens(req, res); });
  post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) { responses(req, res); });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
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
    Result<std::vector<int32_t>> ids = tokenize(content->get<std::string>(), parse_special);
    if (!ids.ok()) return reply_error(res, ErrorKind::kInvalidRequest, ids.status().message());
    reply_json(res, {{"tokens", ids.value()}});
  });
  post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
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
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const Api api = api_of(req.path);
    if (auto refused = refusal(req)) {  // a refused POST to an unknown route, or over the body limit
      reply_error(res, refused->first, refused->second, api);
    } else if (res.status == 404) {
      reply_error(res, ErrorKind::kNotFound, "no route " + req.method + " " + req.path, api);
    } else if (res.status == 413 &&
               req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded")) {
      // httplib takes such a body for a form and caps it at 8 KiB (curl -d sends this type unless told otherwise).
      reply_error(res, ErrorKind::kPayloadTooLarge,
                  "a body sent as application/x-www-form-urlencoded is limited to 8 KiB: send it as "
                  "Content-Type: application/json",
                  api);
    } else if (res.status == 413) {  // httplib refused a body over set_payload_max_length
      reply_error(res, ErrorKind::kPayloadTooLarge,
                  format("the request body is larger than the limit of %lld MiB (--max-body-mb)",
                         (long long)options.max_body_mb),
                  api);
    } else {
      res.set_content(dump(error_body(ErrorKind::kInvalidRequest, format("HTTP status %d", res.status), api)),
                      "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  // Runs once per response, after the handler and the error handler, before anything is written: the status is
  // final and a client that has read its answer finds it counted.
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (cors_allows(req)) {
      res.set_header("Access-Control-Allow-Origin", options.cors_origin);
      if (options.cors_origin != "*") res.set_header("Vary", "Origin");
    }
    std::lock_guard<std::mutex> lock(requests_mu);
    ++requests[{route_label(req.path), res.status}];
  });
}

json Server::Impl::model_object(Api api) const {
  if (api == Api::kAnthropic) {
    char at[32];
    std::tm tm{};
    gmtime_r(&model_time, &tm);
    std::strftime(at, sizeof(at), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return {{"type", "model"}, {"id", options.model_name}, {"display_name", options.model_name}, {"created_at", at}};
  }
  return {{"id", options.model_name},
          {"object", "model"},
          {"created", int64_t(model_time)},
          {"owned_by", "magnetar"},
          {"max_model_len", engine.options().n_ctx}};
}

Result<Generation> Server::Impl::plan(const ChatRequest& request, const char* route) const {
  MAGNETAR_ASSIGN_OR_RETURN(Generation g, plan_generation(request.chat, model_thinks, *chat_template));
  if (options.verbose) {
    for (const std::string& note : g.notes) std::fprintf(stderr, "magnetar serve: %s: %s\n", route, note.c_str());
  }
  return g;
}

Result<std::shared_ptr<Job>> Server::Impl::submit(const std::string& prompt, ChatRequest& request,
                                                  const Generation* generation, ErrorKind& refused) {
  // A prompt the context cannot hold is refused in the words of Anthropic's error ("prompt is too long: N tokens > M
  // maximum"), which coding agents (Claude Code, OpenCode) look for to compact their history and retry, and names
  // OpenAI's "maximum context length" too. One too long whatever its tokens is refused before it is tokenized: a
  // token covers at most max_token_bytes of the text after NFC, which shrinks a text at most 3 times (conjoining jamo).
  const int64_t n_ctx = engine.options().n_ctx;
  refused = ErrorKind::kInvalidRequest;
  if (const int64_t per_token = std::max<int64_t>(1, engine.info().max_token_bytes);
      int64_t(prompt.size()) / 3 / per_token >= n_ctx) {
    refused = ErrorKind::kContextLength;
    return Status::error(
        format("prompt is too long: %zu bytes, more than the maximum context length of %lld tokens "
               "can hold (at most %lld bytes a token)",
               prompt.size(), (long long)n_ctx, (long long)per_token));
  }
  Result<std::vector<int32_t>> ids = tokenize(prompt, true);
  if (!ids.ok()) return ids.status();
  const int64_t n_prompt = int64_t(ids->size());
  if (n_prompt == 0) return Status::error("the prompt is empty");
  if (n_prompt >= n_ctx) {
    refused = ErrorKind::kContextLength;
    return Status::error(
        format("prompt is too long: %lld tokens > %lld maximum (the maximum context length is %lld "
               "tokens and one must be left to generate; serve --ctx N sets it)",
               (long long)n_prompt, (long long)n_ctx - 1, (long long)n_ctx));
  }
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id >= engine.info().n_vocab) {
      return Status::error(
          format("logit_bias: token %d is outside the vocabulary of %lld", id, (long long)engine.info().n_vocab));
    }
  }
  auto job = std::make_shared<Job>();
  job->prompt = std::move(ids.value());
  job->sampling = request.sampling;
  // Penalties count the tokens generated for the request, all of them (OpenAI's; the worker passes those alone).
  job->sampling.penalty_last_n = -1;
  job->max_tokens = request.max_tokens > 0 ? request.max_tokens : n_ctx - n_prompt;
  job->stop = std::move(request.stop);
  job->stream = request.stream;
  job->ignore_eos = request.ignore_eos;
  if (generation) {
    job->constraint = generation->constraint;
    job->output_prefix = generation->output_prefix;
    job->output_suffix = generation->output_suffix;
  }
  worker->submit(job);
  return job;
}

// ---- OpenAI: /v1/chat/completions and /v1/completions -----------------------------------------------------------

// An OpenAI SSE stream: httplib calls the provider until sink.done(); each call waits for the worker's next text.
// `pieces` turns text into chunks; `first` (null: none) goes out before the first text; `usage_base` is the chunk
// that carries usage when include_usage (its choices empty). A failed write (the client is gone) cancels the job,
// and so does the releaser when the response ends unfinished.
void Server::Impl::stream_openai(httplib::Response& res, std::shared_ptr<Job> job, bool include_usage, json first,
                                 json usage_base, Pieces pieces) {
  auto sent_first = std::make_shared<bool>(first.is_null());
  auto last_sent = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, include_usage, first = std::move(first), usage_base = std::move(usage_base), pieces = std::move(pieces),
       silence = silence_limit(options.keepalive_seconds), sent_first, last_sent](size_t, httplib::DataSink& sink) {
        auto send = [&](const json& j) {
          const std::string event = "data: " + dump(j) + "\n\n";
          *last_sent = std::chrono::steady_clock::now();
          if (sink.write(event.data(), event.size())) return true;
          job->cancelled = true;
          return false;
        };
        bool done = false, keepalive = false;
        const std::string text = take_text(*job, silence, *last_sent, &done, &keepalive);
        if (keepalive) {
          *last_sent = std::chrono::steady_clock::now();
          if (!write_keepalive(sink, *job)) return false;
        }
        if ((!text.empty() || done) && !*sent_first) {
          *sent_first = true;
          if (!send(first)) return false;
        }
        const auto failure = done ? job_failure(*job) : std::nullopt;
        if (failure) {
          if (!send(error_body(failure->first, failure->second))) return false;
        } else {
          for (const json& chunk : pieces(text, done)) {
            if (!send(chunk)) return false;
          }
        }
        if (!done) return true;
        if (!failure && include_usage) {
          json usage = usage_base;
          usage["usage"] = usage_json(*job);
          if (!send(usage)) return false;
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

std::optional<Server::Impl::Started> Server::Impl::start_chat(
    const httplib::Request& req, httplib::Response& res, const char* route, Api api,
    const std::function<Result<ChatRequest>(const json&)>& parse) {
  auto refuse = [&](ErrorKind kind, const Status& status) {
    reply_error(res, kind, status.message(), api);
    return std::nullopt;
  };
  Result<json> body = parse_body(req);
  if (!body.ok()) return refuse(ErrorKind::kInvalidRequest, body.status());
  Result<ChatRequest> parsed = parse(body.value());
  if (!parsed.ok()) return refuse(ErrorKind::kInvalidRequest, parsed.status());
  Started started;
  started.request = std::move(parsed.value());
  Result<Generation> planned = plan(started.request, route);
  if (!planned.ok()) return refuse(ErrorKind::kInvalidRequest, planned.status());
  started.generation = std::move(planned.value());
  ErrorKind refused;
  Result<std::shared_ptr<Job>> submitted =
      submit(started.generation.prompt, started.request, &started.generation, refused);
  if (!submitted.ok()) return refuse(refused, submitted.status());
  started.job = std::move(submitted.value());
  return started;
}

void Server::Impl::chat_completions(const httplib::Request& req, httplib::Response& res) {
  std::optional<Started> started = start_chat(req, res, "/v1/chat/completions", Api::kOpenAI, [this](const json& body) {
    return parse_chat_request(body, options.sampling);
  });
  if (!started) return;
  const ChatRequest& request = started->request;
  const Generation& generation = started->generation;
  std::shared_ptr<Job> job = started->job;

  const std::string id = format("chatcmpl-%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  if (!request.stream) {
    wait_done(*job, req);
    if (auto failure = job_failure(*job)) return reply_error(res, failure->first, failure->second);
    std::string text, reasoning;
    json calls = json::array();
    for (const chat::OutputEvent& e : parse_output(generation.format, job->pending_text)) {
      switch (e.kind) {
        case chat::OutputEventKind::kText: text += e.text; break;
        case chat::OutputEventKind::kReasoning: reasoning += e.text; break;
        case chat::OutputEventKind::kToolCallBegin:
          calls.push_back({{"id", new_call_id("call_")},
                           {"type", "function"},
                           {"function", {{"name", e.text}, {"arguments", ""}}}});
          break;
        case chat::OutputEventKind::kToolCallArguments:
          calls.back()["function"]["arguments"] = calls.back()["function"]["arguments"].get<std::string>() + e.text;
          break;
        case chat::OutputEventKind::kToolCallEnd: break;
      }
    }
    json message = {{"role", "assistant"}, {"content", calls.empty() || !text.empty() ? json(text) : json()}};
    if (!reasoning.empty()) message["reasoning_content"] = reasoning;
    if (!calls.empty()) message["tool_calls"] = calls;
    return reply_json(res,
                      {{"id", id},
                       {"object", "chat.completion"},
                       {"created", created},
                       {"model", options.model_name},
                       {"choices", json::array({{{"index", 0},
                                                 {"message", std::move(message)},
                                                 {"finish_reason", finish_reason_name(job->finish, !calls.empty())}}})},
                       {"usage", usage_json(*job)}});
  }

  // Streaming: the role chunk goes with the first text (or the end); before it, only keep-alives. The parser
  // turns text into content / reasoning_content deltas and tool calls into tool_calls deltas: the call's index,
  // id, type and name with arguments "", then its argument pieces.
  struct State {
    std::unique_ptr<chat::OutputParser> parser;
    int calls = 0;  // tool calls begun
  };
  auto state = std::make_shared<State>(State{.parser = new_output_parser(generation.format)});
  json role = chunk(id, created, {{"role", "assistant"}, {"content", ""}}, nullptr);
  json usage_base = chunk(id, created, json::object(), nullptr);
  usage_base["choices"] = json::array();
  stream_openai(
      res, job, request.include_usage, std::move(role), std::move(usage_base),
      [this, id, created, state, job](const std::string& text, bool done) {
        std::vector<chat::OutputEvent> events;
        state->parser->feed(text, &events);
        if (done) state->parser->finish(&events);
        std::vector<json> out;
        for (const chat::OutputEvent& e : events) {
          switch (e.kind) {
            case chat::OutputEventKind::kText: out.push_back(chunk(id, created, {{"content", e.text}}, nullptr)); break;
            case chat::OutputEventKind::kReasoning:
              out.push_back(chunk(id, created, {{"reasoning_content", e.text}}, nullptr));
              break;
            case chat::OutputEventKind::kToolCallBegin:
              out.push_back(
                  chunk(id, created,
                        {{"tool_calls", json::array({{{"index", state->calls},
                                                      {"id", new_call_id("call_")},
                                                      {"type", "function"},
                                                      {"function", {{"name", e.text}, {"arguments", ""}}}}})}},
                        nullptr));
              break;
            case chat::OutputEventKind::kToolCallArguments:
              out.push_back(chunk(
                  id, created,
                  {{"tool_calls", json::array({{{"index", state->calls}, {"function", {{"arguments", e.text}}}}})}},
                  nullptr));
              break;
            case chat::OutputEventKind::kToolCallEnd: ++state->calls; break;
          }
        }
        if (done) out.push_back(chunk(id, created, json::object(), finish_reason_name(job->finish, state->calls > 0)));
        return out;
      });
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  Result<json> body = parse_body(req);
  if (!body.ok()) return reply_error(res, ErrorKind::kInvalidRequest, body.status().message());
  Result<ChatRequest> parsed = parse_completion_request(body.value(), options.sampling);
  if (!parsed.ok()) return reply_error(res, ErrorKind::kInvalidRequest, parsed.status().message());
  ChatRequest& request = parsed.value();
  ErrorKind refused;
  Result<std::shared_ptr<Job>> submitted = submit(request.prompt, request, nullptr, refused);
  if (!submitted.ok()) return reply_error(res, refused, submitted.status().message());
  std::shared_ptr<Job> job = std::move(submitted.value());

  const std::string id = format("cmpl-%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  if (!request.stream) {
    wait_done(*job, req);
    if (auto failure = job_failure(*job)) return reply_error(res, failure->first, failure->second);
    json r = text_chunk(id, created, job->pending_text, finish_reason_name(job->finish));
    r["usage"] = usage_json(*job);
    return reply_json(res, r);
  }
  json usage_base = text_chunk(id, created, "", nullptr);
  usage_base["choices"] = json::array();
  stream_openai(res, job, request.include_usage, nullptr, std::move(usage_base),
                [this, id, created, job](const std::string& text, bool done) {
                  std::vector<json> out;
                  if (!text.empty()) out.push_back(text_chunk(id, created, text, nullptr));
                  if (done) out.push_back(text_chunk(id, created, "", finish_reason_name(job->finish)));
                  return out;
                });
}

// ---- OpenAI Responses: /v1/responses -------------------------------------------------------------------------

void Server::Impl::responses(const httplib::Request& req, httplib::Response& res) {
  std::optional<Started> started = start_chat(req, res, "/v1/responses", Api::kOpenAI, [this](const json& body) {
    return parse_responses_request(body, options.sampling);
  });
  if (!started) return;
  const ChatRequest& request = started->request;
  const Generation& generation = started->generation;
  std::shared_ptr<Job> job = started->job;

  const std::string id = format("resp_%llu", (unsigned long long)next_id.fetch_add(1));
  const int64_t created = int64_t(std::time(nullptr));
  // The response object; usage once the job is done. A job cut by max_output_tokens (or the context) is incomplete.
  auto response = [id, created, model = options.model_name](const char* status, const json& output, const Job* done) {
    json r = {{"id", id},       {"object", "response"},   {"created_at", created},      {"status", status},
              {"model", model}, {"output", output},       {"error", nullptr},           {"incomplete_details", nullptr},
              {"store", false}, {"tools", json::array()}, {"parallel_tool_calls", true}};
    if (done != nullptr) {
      r["usage"] = responses_usage(*done);
      if (done->finish == FinishReason::kLength) {
        r["status"] = "incomplete";
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
      }
    }
    return r;
  };
  auto output = std::make_shared<ResponsesOutput>(request.chat.freeform_tools);
  if (!request.stream) {
    wait_done(*job, req);
    if (auto failure = job_failure(*job)) return reply_error(res, failure->first, failure->second);
    for (const chat::OutputEvent& e : parse_output(generation.format, job->pending_text)) output->on(e);
    output->close();
    return reply_json(res, response("completed", output->output(), job.get()));
  }

  // Streaming: response.created and response.in_progress at once, response.in_progress again as the keep-alive (an
  // event, which Codex's idle timer counts, where an SSE comment is not), the items' events, and response.completed
  // (or .incomplete, .failed) with the whole response; then the stream ends.
  struct State {
    std::unique_ptr<chat::OutputParser> parser;
    bool started = false;
    std::chrono::steady_clock::time_point last_sent;
  };
  auto state = std::make_shared<State>(
      State{.parser = new_output_parser(generation.format), .last_sent = std::chrono::steady_clock::now()});
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, state, output, response, silence = silence_limit(options.keepalive_seconds)](size_t,
                                                                                         httplib::DataSink& sink) {
        auto send = [&](const std::string& type, json data) {
          const std::string event = "event: " + type + "\ndata: " + dump(data) + "\n\n";
          state->last_sent = std::chrono::steady_clock::now();
          if (sink.write(event.data(), event.size())) return true;
          job->cancelled = true;
          return false;
        };
        auto send_events = [&] {
          for (auto& [type, data] : output->take_events()) {
            if (!send(type, std::move(data))) return false;
          }
          return true;
        };
        if (!state->started) {
          state->started = true;
          output->emit("response.created", {{"response", response("in_progress", json::array(), nullptr)}});
          output->emit("response.in_progress", {{"response", response("in_progress", json::array(), nullptr)}});
          return send_events();
        }
        bool done = false, keepalive = false;
        const std::string text = take_text(*job, silence, state->last_sent, &done, &keepalive);
        if (keepalive && !done) {
          output->emit("response.in_progress", {{"response", response("in_progress", output->output(), nullptr)}});
        }
        if (const auto failure = done ? job_failure(*job) : std::nullopt) {
          json failed = response("failed", output->output(), nullptr);
          failed["error"] = {{"code", "server_error"}, {"message", failure->second}};
          output->emit("response.failed", {{"response", std::move(failed)}});
          if (!send_events()) return false;
          sink.done();
          return true;
        }
        std::vector<chat::OutputEvent> events;
        state->parser->feed(text, &events);
        if (done) state->parser->finish(&events);
        for (const chat::OutputEvent& e : events) output->on(e);
        if (done) {
          output->close();
          json finished = response("completed", output->output(), job.get());
          const bool incomplete = finished["status"] == "incomplete";
          output->emit(incomplete ? "response.incomplete" : "response.completed", {{"response", std::move(finished)}});
        }
        if (!send_events()) return false;
        if (done) sink.done();
        return true;
      },
      [job](bool success) {
        if (!success) job->cancelled = true;
      });
}

// ---- Anthropic: /v1/messages and /v1/messages/count_tokens ------------------------------------------------------

void Server::Impl::messages(const httplib::Request& req, httplib::Response& res) {
  std::optional<Started> started = start_chat(req, res, "/v1/messages", Api::kAnthropic, [this](const json& body) {
    return parse_anthropic_request(body, options.sampling, /*require_max_tokens=*/true);
  });
  if (!started) return;
  const ChatRequest& request = started->request;
  const Generation& generation = started->generation;
  std::shared_ptr<Job> job = started->job;
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
    wait_done(*job, req);
    if (auto failure = job_failure(*job)) {
      return reply_error(res, failure->first, failure->second, Api::kAnthropic);
    }
    // Blocks in output order: thinking (when thinking was on), text, tool_use with the parsed arguments as input.
    json content = json::array();
    std::string arguments;
    for (const chat::OutputEvent& e : parse_output(generation.format, job->pending_text)) {
      switch (e.kind) {
        case chat::OutputEventKind::kReasoning:
          content.push_back({{"type", "thinking"}, {"thinking", e.text}, {"signature", thinking_signature(e.text)}});
          break;
        case chat::OutputEventKind::kText: content.push_back({{"type", "text"}, {"text", e.text}}); break;
        case chat::OutputEventKind::kToolCallBegin:
          content.push_back(
              {{"type", "tool_use"}, {"id", new_call_id("toolu_")}, {"name", e.text}, {"input", json::object()}});
          arguments.clear();
          break;
        case chat::OutputEventKind::kToolCallArguments: arguments += e.text; break;
        case chat::OutputEventKind::kToolCallEnd:
          content.back()["input"] = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
          break;
      }
    }
    const bool tool_use =
        std::any_of(content.begin(), content.end(), [](const json& b) { return b["type"] == "tool_use"; });
    if (content.empty()) content.push_back({{"type", "text"}, {"text", ""}});
    return reply_json(res, message(std::move(content), anthropic_stop_reason(*job, tool_use), stop_sequence(*job),
                                   anthropic_usage(*job)));
  }

  // Streaming: message_start (once the worker has taken the job, so its usage counts the reused prefix), ping; a
  // ping per keep-alive during the prefill; then per content block content_block_start, its deltas (thinking_delta,
  // text_delta, input_json_delta) and content_block_stop, a block per change of kind; then message_delta and
  // message_stop. An answer without any block gets an empty text block. Each SSE event is
  // "event: NAME\ndata: JSON\n\n".
  enum class Block { kNone, kThinking, kText, kToolUse };
  struct State {
    std::unique_ptr<chat::OutputParser> parser;
    bool started = false;
    int index = -1;  // the current (or last) block
    Block open = Block::kNone;
    std::string thinking = {};  // the open thinking block's text, for its signature
    bool tool_use = false;
    std::chrono::steady_clock::time_point last_sent;  // of the last event written
  };
  auto state = std::make_shared<State>(
      State{.parser = new_output_parser(generation.format), .last_sent = std::chrono::steady_clock::now()});
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, message, stop_sequence, state, silence = silence_limit(options.keepalive_seconds)](
          size_t, httplib::DataSink& sink) {
        auto send = [&](const char* event, const json& j) {
          const std::string text = std::string("event: ") + event + "\ndata: " + dump(j) + "\n\n";
          state->last_sent = std::chrono::steady_clock::now();
          if (sink.write(text.data(), text.size())) return true;
          job->cancelled = true;
          return false;
        };
        if (!state->started) {
          json usage;
          {
            // Until the worker has taken the job (queued, or its first prefill going), an SSE comment after each
            // silence or worker keep-alive: clients ignore it, and a write that fails (the client left) cancels.
            std::unique_lock<std::mutex> lock(job->mu);
            if (!job->cv.wait_for(lock, silence, [&] { return job->started || job->done || job->keepalives > 0; }) ||
                (!job->started && !job->done)) {
              job->keepalives = 0;
              lock.unlock();
              return write_keepalive(sink, *job);
            }
            state->started = true;
            usage = {{"input_tokens", job->prompt_tokens - job->cached_tokens},
                     {"output_tokens", 0},
                     {"cache_read_input_tokens", job->cached_tokens}};
          }
          return send("message_start",
                      {{"type", "message_start"}, {"message", message(json::array(), nullptr, nullptr, usage)}}) &&
                 send("ping", {{"type", "ping"}});
        }
        // A thinking block ends with its signature (signature_delta), as Anthropic's do.
        auto stop_block = [&] {
          if (state->open == Block::kNone) return true;
          const bool thinking = state->open == Block::kThinking;
          state->open = Block::kNone;
          if (thinking &&
              !send("content_block_delta",
                    {{"type", "content_block_delta"},
                     {"index", state->index},
                     {"delta", {{"type", "signature_delta"}, {"signature", thinking_signature(state->thinking)}}}})) {
            return false;
          }
          state->thinking.clear();
          return send("content_block_stop", {{"type", "content_block_stop"}, {"index", state->index}});
        };
        // Opens a block of `kind` (closing the open one) unless one of that kind is open.
        auto open_block = [&](Block kind, json block) {
          if (state->open == kind && kind != Block::kToolUse) return true;
          if (!stop_block()) return false;
          state->open = kind;
          ++state->index;
          return send("content_block_start",
                      {{"type", "content_block_start"}, {"index", state->index}, {"content_block", std::move(block)}});
        };
        auto delta = [&](json d) {
          return send("content_block_delta",
                      {{"type", "content_block_delta"}, {"index", state->index}, {"delta", std::move(d)}});
        };
        bool done = false, keepalive = false;
        const std::string text = take_text(*job, silence, state->last_sent, &done, &keepalive);
        if (keepalive && !send("ping", {{"type", "ping"}})) return false;
        const auto failure = done ? job_failure(*job) : std::nullopt;
        if (failure) {
          if (!send("error", error_body(failure->first, failure->second, Api::kAnthropic))) return false;
          sink.done();
          return true;
        }
        std::vector<chat::OutputEvent> events;
        state->parser->feed(text, &events);
        if (done) state->parser->finish(&events);
        for (const chat::OutputEvent& e : events) {
          bool ok = true;
          switch (e.kind) {
            case chat::OutputEventKind::kReasoning:
              ok = open_block(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
              state->thinking += e.text;
              ok = ok && delta({{"type", "thinking_delta"}, {"thinking", e.text}});
              break;
            case chat::OutputEventKind::kText:
              ok = open_block(Block::kText, {{"type", "text"}, {"text", ""}}) &&
                   delta({{"type", "text_delta"}, {"text", e.text}});
              break;
            case chat::OutputEventKind::kToolCallBegin:
              state->tool_use = true;
              ok = open_block(
                  Block::kToolUse,
                  {{"type", "tool_use"}, {"id", new_call_id("toolu_")}, {"name", e.text}, {"input", json::object()}});
              break;
            case chat::OutputEventKind::kToolCallArguments:
              ok = delta({{"type", "input_json_delta"}, {"partial_json", e.text}});
              break;
            case chat::OutputEventKind::kToolCallEnd: ok = stop_block(); break;
          }
          if (!ok) return false;
        }
        if (!done) return true;
        if (state->index < 0 && !open_block(Block::kText, {{"type", "text"}, {"text", ""}})) return false;
        if (!stop_block() ||
            !send("message_delta", {{"type", "message_delta"},
                                    {"delta",
                                     {{"stop_reason", anthropic_stop_reason(*job, state->tool_use)},
                                      {"stop_sequence", stop_sequence(*job)}}},
                                    // The counts so far, as Anthropic's (some clients read usage only here).
                                    {"usage", anthropic_usage(*job)}}) ||
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
  Result<Generation> planned = plan(parsed.value(), "/v1/messages/count_tokens");
  if (!planned.ok()) return reply_error(res, ErrorKind::kInvalidRequest, planned.status().message(), Api::kAnthropic);
  Result<std::vector<int32_t>> ids = tokenize(planned.value().prompt, true);
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
      {"magnetar_lookup_draft_tokens_total", "counter", "Drafts computed by speculative decoding (--lookup).",
       double(w.draft_tokens)},
      {"magnetar_lookup_drafts_accepted_total", "counter",
       "Drafts that were the sampled token (emitted without a forward pass of their own).", double(w.drafts_accepted)},
      {"magnetar_cached_tokens_total", "counter", "Prompt tokens whose KV was reused from the previous request.",
       double(w.cached_tokens)},
      {"magnetar_prompt_seconds_total", "counter", "Seconds spent computing prompts.", w.prompt_seconds},
      {"magnetar_generation_seconds_total", "counter", "Seconds spent generating.", w.generation_seconds},
      {"magnetar_slots", "gauge", "Slots (--parallel): requests computed at once.", double(w.slots)},
      {"magnetar_requests_active", "gauge", "Requests in a slot.", double(w.active)},
      {"magnetar_requests_queued", "gauge", "Requests waiting for a slot.", double(w.queued)},
      {"magnetar_expert_cache_hits_total", "counter", "Expert cache hits (0 when experts are resident).",
       double(w.experts.hits)},
      {"magnetar_expert_cache_misses_total", "counter", "Expert cache misses (0 when experts are resident).",
       double(w.experts.misses)},
      {"magnetar_expert_cache_bytes_read_total", "counter", "Bytes of experts read from disk.",
       double(w.experts.bytes_read)},
      {"magnetar_expert_cache_evictions_total", "counter", "Experts evicted from the cache.",
       double(w.experts.evictions)},
      {"magnetar_prefill_sweeps_total", "counter", "Prefill sweeps run (--sweep: streamed or tiered experts).",
       double(w.experts.sweeps)},
      {"magnetar_prefill_sweep_pauses_total", "counter",
       "Prefill sweeps paused midway for other requests' turns (continued later) or a client that left.",
       double(w.experts.sweep_pauses)},
      {"magnetar_kv_disk_blocks_saved_total", "counter", "Disk KV blocks written (--kv-disk-dir).",
       double(w.kv_disk.blocks_saved)},
      {"magnetar_kv_disk_blocks_restored_total", "counter", "Disk KV blocks loaded instead of computed.",
       double(w.kv_disk.blocks_restored)},
      {"magnetar_kv_disk_blocks_evicted_total", "counter", "Disk KV blocks deleted to keep the budget.",
       double(w.kv_disk.blocks_evicted)},
      {"magnetar_kv_disk_blocks_declined_total", "counter",
       "Disk KV blocks not saved: the budget had no room without deleting a block worth more.",
       double(w.kv_disk.blocks_declined)},
      {"magnetar_kv_disk_blocks_rejected_total", "counter", "Disk KV block files found damaged and deleted.",
       double(w.kv_disk.blocks_rejected)},
      {"magnetar_kv_disk_tokens_restored_total", "counter", "Prompt tokens restored from disk KV.",
       double(w.kv_disk.tokens_restored)},
      {"magnetar_kv_disk_bytes_written_total", "counter", "Bytes of disk KV written.", double(w.kv_disk.bytes_written)},
      {"magnetar_kv_disk_bytes_read_total", "counter", "Bytes of disk KV read.", double(w.kv_disk.bytes_read)},
      {"magnetar_kv_disk_restore_seconds_total", "counter", "Seconds spent restoring disk KV.",
       w.kv_disk.restore_seconds},
      {"magnetar_kv_disk_bytes", "gauge", "Bytes of disk KV blocks on disk.", double(w.kv_disk.bytes_on_disk)},
  };
  for (const Row& r : rows) {
    family(r.name, r.type, r.help);
    value(r.name, r.v);
  }
  return out;
}

constexpr size_t kHttpThreads = 128;  // concurrent connections served (see bind)
constexpr size_t kKeepAliveRequests = 1000;  // requests per kept-alive connection (httplib's default: 5)
constexpr int kListenBacklog = 1024;         // connections waiting to be accepted (httplib's: 5)

// Debian's compiled cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed in the library). When
// dozens of clients (re)connect while the server is busy, the accept queue overflows, and a handshake the kernel then
// drops can leave a client with a connection that fails its first read: the likely cause of the load test's rare
// "no response (Read)" (1 of 192 streamed requests, under `ctest -j2`, twice in ~8 runs). Linux lets listen() be
// called again on a listening socket to change the backlog: this does it on the process's listening socket bound to
// `port`. False when none was found.
bool raise_listen_backlog(int port) {
  const int fd = find_socket(false, [&](int sock, std::string_view, int bound) {
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    return bound == port && ::getsockopt(sock, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting != 0;
  });
  return fd >= 0 && ::listen(fd, kListenBacklog) == 0;
}

Result<std::unique_ptr<Server>> Server::bind(Engine& engine, const ServerOptions& options) {
  if (!engine.info().has_tokenizer)
    return Status::error(engine.info().path + ": the model has no tokenizer; serve needs one");
  // Slots: each a Session with its own KV cache and scratch (the first one the planner already counted).
  Result<int64_t> fit = engine.sessions_that_fit();
  if (!fit.ok()) return fit.status();
  const int64_t slots = options.parallel > 0 ? options.parallel : std::clamp<int64_t>(fit.value() + 1, 1, 4);
  if (slots > fit.value() + 1) {
    return Status::error(
        format("--parallel %lld: each slot takes %.2f GiB (KV for --ctx %lld, and scratch on the CPU) and only %lld "
               "more fit in the memory available beyond the reserve%s",
               (long long)slots, double(engine.session_bytes()) / double(1ull << 30), (long long)engine.options().n_ctx,
               (long long)fit.value(),
               std::string(engine.device()) == "cuda"
                   ? " (host RAM, and the GPU's free memory: a smaller --gpu-cache-gb or --ctx "
                     "leaves room for more)"
                   : ""));
  }
  std::vector<std::unique_ptr<Session>> sessions;
  for (int64_t i = 0; i < slots; ++i) {
    Result<std::unique_ptr<Session>> session = engine.new_session();
    if (!session.ok()) return session.status();
    sessions.push_back(std::move(session).value());
  }
  auto impl = std::make_unique<Impl>(engine, options);
  // Settings that open the server to more than the user's own clients, said once at start.
  if (options.api_key.empty() && impl->allowed_hosts.empty()) {
    std::fprintf(stderr,
                 "magnetar serve: warning: --host %s without --api-key: anyone who can reach the port can use the "
                 "server, and without --allowed-hosts any web page can too (DNS rebinding)\n",
                 options.host.c_str());
  }
  if (options.api_key.empty() && options.cors_origin == "*") {
    std::fprintf(stderr, "magnetar serve: warning: --cors * without --api-key: every web page can use the server\n");
  }
  auto one_token = [&engine](const char* text) {
    Result<std::vector<int32_t>> ids = engine.tokenize(text, true);
    return ids.ok() && ids->size() == 1;
  };
  impl->model_thinks = one_token("<think>") && one_token("</think>");
  std::string warning;
  Result<chat::ChatTemplate> tmpl = chat::ChatTemplate::choose({.builtin = options.chat_template,
                                                                .file_path = options.chat_template_file,
                                                                .gguf_template = engine.info().chat_template,
                                                                .architecture = engine.info().architecture,
                                                                .bos_token = engine.info().bos_token,
                                                                .eos_token = engine.info().eos_token,
                                                                .tokenizer_adds_bos = engine.info().adds_bos},
                                                               &warning);
  if (!tmpl.ok()) return tmpl.status();
  if (!warning.empty()) std::fprintf(stderr, "magnetar serve: warning: %s\n", warning.c_str());
  std::fprintf(stderr, "magnetar serve: chat template: %s\n", tmpl.value().origin().c_str());
  impl->chat_template.emplace(std::move(tmpl).value());
  impl->worker = Worker::start(engine, std::move(sessions), options.keepalive_seconds, options.lookup);
  // One HTTP thread per open connection: a streaming client (and a keep-alive one between requests) holds its
  // thread while the worker computes, so httplib's default pool (8 threads on a small machine) made the 9th of 32
  // concurrent clients wait past its timeout (the load test). The threads mostly sleep on a job's condition variable.
  impl->http.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  // A client keeps its connection: with httplib's 5 requests per connection, every 6th request of a busy client
  // reconnected.
  impl->http.set_keep_alive_max_count(kKeepAliveRequests);
  impl->routes();
  impl->port = options.port == 0 ? impl->http.bind_to_any_port(options.host)
                                 : (impl->http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (impl->port <= 0) return Status::error(format("cannot listen on %s:%d", options.host.c_str(), options.port));
  if (!raise_listen_backlog(impl->port)) {
    std::fprintf(stderr, "magnetar serve: warning: could not raise the listen backlog of port %d (it stays 5)\n",
                 impl->port);
  }
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
  impl_->worker->close();  // the handlers waiting for jobs return (503 "the server is stopping")
  if (impl_->in_run.load()) {
    // Bounded: a listener that failed to start never runs (1 s, then httplib's stop() is a no-op).
    for (int i = 0; i < 1000 && !impl_->http.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  impl_->http.stop();
}

}  // namespace magnetar::server
