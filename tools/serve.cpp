// `magnetar serve`: the OpenAI- and Anthropic-compatible HTTP server (server/server.h) over one loaded model. SIGINT
// and SIGTERM are taken by a thread that waits for them (blocked everywhere else, so no handler runs inside the
// libraries) and stop the server, which then exits 0.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "server/server.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace magnetar::tools {

int serve_main(int argc, char** argv) {
  ModelFlags model;
  SamplingFlags sampling;
  std::string host = "127.0.0.1", alias;
  int64_t port = 8080;
  cli::Args args("magnetar serve -m MODEL.gguf [--host ADDR] [--port N] [options]",
                 "OpenAI- and Anthropic-compatible HTTP server: /v1/chat/completions, /v1/completions and\n"
                 "/v1/messages (streaming or not), /v1/messages/count_tokens, /v1/models, /health, /metrics,\n"
                 "/tokenize, /detokenize, and a web UI at /. One worker computes the requests of --parallel slots\n"
                 "together (one batched forward pass per token); the sampling flags are the defaults for what a request\n"
                 "leaves out.");
  // Agents send long prompts (a coding agent's system prompt and tool definitions alone are well over 4K tokens): the
  // default context is the model's up to 32K, where run/chat/bench keep 4K.
  model.ctx_default_max = 32768;
  model.add_to(args);
  sampling.add_to(args);
  args.option("--host", &host, "ADDR", "address to listen on");
  args.option("--port", &port, "N", "port to listen on (0: any free port)");
  args.option("--alias", &alias, "NAME", "model id reported to clients (default: the file name without .gguf)");
  float keepalive = float(server::kKeepAliveSeconds);
  args.option(
      "--keepalive-seconds", &keepalive, "S",
      "a stream that has written nothing for this long (a prompt's prefill, a queued request, a tool call being "
      "generated) gets a keep-alive (0: also after every --batch chunk of a prefill)");
  int64_t parallel = 0;
  args.option(
      "--parallel", &parallel, "N",
      "slots: requests computed at once, each slot keeping its conversation's KV; a request goes to the slot "
      "sharing the longest prefix with it; the memory plan makes room for N (a streamed plan's expert cache or the "
      "GPU pool shrinks for them) (0: min(4, what fits beside the plan for one))");
  std::string chat_template_file, chat_template;
  args.option("--chat-template-file", &chat_template_file, "FILE",
              "render prompts with this Jinja chat template instead of the model's (tokenizer.chat_template)");
  args.option("--chat-template", &chat_template, "chatml",
              "render prompts with the built-in ChatML (Qwen3's format, tools included) instead of the model's template");
  std::string api_key, api_key_file, cors_origin;
  std::vector<std::string> allowed_hosts_flags;
  int64_t max_body_mb = 64;
  args.option("--api-key", &api_key, "KEY",
              "require this key (\"Authorization: Bearer KEY\" or \"x-api-key: KEY\") on every route but /health and "
              "the web UI's page and files (default: no key)");
  args.option("--api-key-file", &api_key_file, "FILE",
              "the key of --api-key read from FILE's first line (other users of the machine see command lines)");
  args.option("--allowed-hosts", &allowed_hosts_flags, "H1,H2",
              "Host header names accepted besides localhost, 127.0.0.1 and [::1] (DNS rebinding protection; on a "
              "non-loopback --host, any Host is accepted unless this is given); repeatable");
  args.option("--max-body-mb", &max_body_mb, "N", "refuse request bodies larger than N MiB with 413");
  args.option("--cors", &cors_origin, "ORIGIN",
              "allow browsers on ORIGIN (exact, e.g. http://app.example, or *) to call the API (default: no CORS "
              "headers)");
  bool verbose = false;
  args.flag("--verbose", &verbose, "print the parts of requests that are accepted and ignored (a json_schema's schema, a thinking budget)");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "serve")) return *code;
  if (const std::string e = sampling.error(); !e.empty()) {
    std::fprintf(stderr, "magnetar serve: %s\n", e.c_str());
    return kExitBadInput;
  }
  if (!api_key_file.empty()) {
    std::ifstream in(api_key_file);
    std::string line;
    const bool opened = in.is_open();
    if (opened) std::getline(in, line);
    line.erase(line.find_last_not_of(" \t\r") + 1);
    const char* problem = !api_key.empty() ? "give --api-key or --api-key-file, not both"
                          : !opened        ? "cannot be read"
                          : line.empty()   ? "its first line holds no key"
                                           : nullptr;
    if (problem) {
      std::fprintf(stderr, "magnetar serve: --api-key-file %s: %s\n", api_key_file.c_str(), problem);
      return kExitBadInput;
    }
    api_key = line;
  }
  if (keepalive < 0) {
    std::fprintf(stderr, "magnetar serve: --keepalive-seconds must be >= 0\n");
    return kExitBadInput;
  }
  if (parallel < 0 || parallel > 256) {
    std::fprintf(stderr, "magnetar serve: --parallel must be in [0, 256]\n");
    return kExitBadInput;
  }
  if (max_body_mb < 1 || max_body_mb > (int64_t(1) << 20)) {
    std::fprintf(stderr, "magnetar serve: --max-body-mb must be in [1, 1048576]\n");
    return kExitBadInput;
  }
  std::vector<std::string> allowed_hosts;
  for (const std::string& flag : allowed_hosts_flags) {
    for (size_t at = 0; at <= flag.size();) {
      const size_t comma = std::min(flag.find(',', at), flag.size());
      if (comma > at) allowed_hosts.push_back(flag.substr(at, comma - at));
      at = comma + 1;
    }
  }
  if (port < 0 || port > 65535) {
    std::fprintf(stderr, "magnetar serve: --port must be in [0, 65535]\n");
    return kExitBadInput;
  }
  // Block the stop signals in every thread created from here on; one thread waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that goes away must fail a write, not kill the server

  model.sessions = std::max<int64_t>(1, parallel);  // the memory plan makes room for every slot asked for
  std::unique_ptr<Engine> engine = model.load("serve");
  if (!engine) return kExitBadInput;
  const std::string name = alias.empty() ? std::filesystem::path(model.model).stem().string() : alias;
  Result<std::unique_ptr<server::Server>> bound =
      server::Server::bind(*engine, {.host = host,
                                     .port = int(port),
                                     .model_name = name,
                                     .sampling = sampling.resolved(),
                                     .keepalive_seconds = keepalive,
                                     .lookup = sampling.lookup,
                                     .verbose = verbose,
                                     .parallel = parallel,
                                     .chat_template_file = chat_template_file,
                                     .chat_template = chat_template,
                                     .api_key = api_key,
                                     .allowed_hosts = allowed_hosts,
                                     .max_body_mb = max_body_mb,
                                     .cors_origin = cors_origin});
  if (!bound.ok()) {
    std::fprintf(stderr, "magnetar serve: %s\n", bound.status().message().c_str());
    return kExitBadInput;
  }
  server::Server& srv = *bound.value();
  // The first SIGINT/SIGTERM stops the server (running and queued requests end as cancelled); a second one exits at
  // once.
  std::thread([&srv, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "magnetar serve: stopping (again to exit at once)\n");
    srv.stop();
    sigwait(&stop_signals, &sig);
    std::_Exit(130);
  }).detach();
  std::fprintf(stderr, "magnetar serve: listening on http://%s:%d (model %s)\n", host.c_str(), srv.port(),
               name.c_str());
  std::fflush(stderr);
  if (Status s = srv.run(); !s.ok()) {
    std::fprintf(stderr, "magnetar serve: %s\n", s.message().c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "magnetar serve: stopped\n");
  return kExitOk;
}

}  // namespace magnetar::tools
