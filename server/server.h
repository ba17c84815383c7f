// `magnetar serve`: an OpenAI- and Anthropic-compatible HTTP server over one Engine.
//
// Threads (STYLE.md rule 10): cpp-httplib's pool parses and validates requests, renders the chat template and
// tokenizes (Engine::tokenize is const and thread-safe); one Worker thread owns the slots' Sessions and does all
// compute.
// Only plain Job structs cross between them. httplib stays inside server.cpp and webui.cpp: callers see only this
// header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace magnetar::server {

// A streaming request that has produced nothing for this long during its prefill gets a keep-alive (an SSE comment
// `: keep-alive` on the OpenAI routes, a ping event on /v1/messages), so that clients with read timeouts see bytes
// while a long prompt is computed.
inline constexpr double kKeepAliveSeconds = 5;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: an ephemeral port (see Server::port)
  std::string model_name;   // the id reported by /v1/models and in responses
  SamplingParams sampling;  // defaults for what a request leaves out
  double keepalive_seconds = kKeepAliveSeconds;  // 0: a keep-alive after every prefill chunk
  // Speculative decoding by prompt lookup (lookup_draft): drafts per step of a slot that decodes alone (0: off).
  int64_t lookup = 0;
  bool verbose = false;  // print what requests asked for and did not get (a json_schema's schema, a thinking budget)
  // Slots (sessions with their own KV): 0 picks min(4, what fits in the memory available beyond the planner's
  // reserve); a number that does not fit is refused with the sizes.
  int64_t parallel = 0;
  // A Jinja chat template that replaces the model's (chat/template.h); empty: the GGUF's, else the built-in.
  std::string chat_template_file;
  std::string chat_template;  // "chatml": the built-in ChatML instead of the model's

  // Security and limits (server.cpp's pre-routing handler enforces them before any route runs).
  // Non-empty: every route but GET /health, GET|HEAD / and GET /webui/* needs `Authorization: Bearer KEY` or
  // `x-api-key: KEY` (compared in constant time); otherwise 401.
  std::string api_key;
  // Host header names (without port) accepted besides localhost, 127.0.0.1 and [::1]. Listening on a loopback
  // address, any other Host gets 403 (DNS rebinding); listening elsewhere, any Host is accepted unless this is set.
  std::vector<std::string> allowed_hosts;
  int64_t max_body_mb = 64;  // request bodies larger than this many MiB get 413
  // Empty: no CORS headers at all. An origin ("http://app.example") or "*": responses to requests whose Origin
  // matches get Access-Control-Allow-Origin, and OPTIONS preflights on any route get 204.
  std::string cors_origin;
};

class Server {
 public:
  // Creates the sessions and the worker and binds the socket (so port() is known); fails naming host:port, or
  // the memory a --parallel that does not fit would need.
  // `engine` must outlive the server.
  static Result<std::unique_ptr<Server>> bind(Engine& engine, const ServerOptions& options);
  ~Server();
  int port() const;
  // Serves until stop(); fails when the listener does.
  Status run();
  // Ends run(): thread-safe, callable from any thread (a signal-waiting one) before or during run().
  void stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace magnetar::server
