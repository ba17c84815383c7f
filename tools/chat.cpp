// `magnetar chat`: interactive multi-turn chat in the Qwen ChatML format. The session's KV is kept across
// turns: each turn re-renders the whole conversation and Session::sync reuses the common prefix.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "chat/chatml.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace magnetar::tools {

int chat_main(int argc, char** argv) {
  ModelFlags model;
  SamplingFlags sampling;
  sampling.params.temperature = 0.6f;  // Qwen3's recommended thinking-mode settings
  sampling.params.top_p = 0.95f;
  sampling.top_k = 20;
  sampling.params.min_p = 0.0f;
  std::string system;
  int64_t n_predict = 4096;
  bool no_think = false, hide_think = false;
  cli::Args args("magnetar chat -m MODEL.gguf [--system TEXT] [options]",
                 "Interactive chat. Type a message and press Enter; a line ending in '\\' continues on the next line.\n"
                 "Commands: /reset (forget the conversation), /exit (or end of input).");
  model.add_to(args);
  sampling.add_to(args);
  args.option("--system", &system, "TEXT", "system message");
  args.option("-n", &n_predict, "N", "maximum tokens per answer (-1: until the end of generation or a full context)");
  args.flag("--no-think", &no_think, "ask the model to answer without a thinking block");
  args.flag("--hide-think", &hide_think, "do not print the thinking block");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "chat")) return *code;
  if (const std::string e = sampling.error(); !e.empty() || n_predict < -1 || n_predict == 0) {
    std::fprintf(stderr, "magnetar chat: %s\n", e.empty() ? "-n must be -1 or >= 1" : e.c_str());
    return kExitBadInput;
  }
  std::unique_ptr<Engine> engine = model.load("chat");
  if (!engine) return kExitBadInput;
  if (!engine->info().has_tokenizer) {
    std::fprintf(stderr, "magnetar chat: %s has no tokenizer; chat needs one\n", engine->info().path.c_str());
    return kExitBadInput;
  }
  Result<std::unique_ptr<Session>> opened = engine->new_session();
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar chat: %s\n", opened.status().message().c_str());
    return kExitFailure;
  }
  Session& session = *opened.value();
  Sampler sampler(sampling.resolved());
  LookupDecoder decoder(session);  // --lookup's drafts, its measurements kept from turn to turn
  const bool tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
  std::vector<chat::Message> history;
  if (!system.empty()) history.push_back({.role = "system", .content = system});

  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    std::string input;
    bool got = false;
    while (std::getline(std::cin, line)) {
      got = true;
      if (!line.empty() && line.back() == '\\') {
        input += line.substr(0, line.size() - 1) + "\n";
        continue;
      }
      input += line;
      break;
    }
    if (!got) break;
    if (input == "/exit") break;
    if (input == "/reset") {
      history.resize(system.empty() ? 0 : 1);
      std::fprintf(stderr, "(conversation reset)\n");
      continue;
    }
    if (input.empty()) continue;
    // A scripted chat (stdin from a file or pipe) echoes each message so the transcript reads as a dialogue.
    if (!isatty(STDIN_FILENO)) std::printf("> %s\n", input.c_str());
    history.push_back({.role = "user", .content = input});
    const std::string prompt = chat::render_chatml(history, true, !no_think);
    Result<std::vector<int32_t>> tokens = engine->tokenize(prompt, true);
    if (tokens.ok() && int64_t(tokens->size()) >= session.n_ctx()) {
      tokens = Status::error(format("the conversation has %zu tokens, the context %lld: /reset or raise --ctx",
                                    tokens->size(), (long long)session.n_ctx()));
    }
    Status synced = tokens.ok() ? session.sync(tokens.value()) : tokens.status();
    if (!synced.ok()) {
      std::fprintf(stderr, "magnetar chat: %s\n", synced.message().c_str());
      history.pop_back();
      continue;
    }
    std::unique_ptr<Detokenizer> detok = engine->new_detokenizer();
    std::string reply;
    bool in_think = false;
    for (int64_t n = 0; (n_predict < 0 || n < n_predict) && int64_t(decoder.committed()) < session.n_ctx(); ++n) {
      const int32_t id = sampler.sample(decoder.logits(), decoder.history());
      if (engine->is_end_of_generation(id)) break;
      const std::string piece = detok->push(id);
      reply += piece;
      if (reply.find("<think>") != std::string::npos && reply.find("</think>") == std::string::npos) in_think = true;
      const bool show = !(hide_think && (in_think || piece.find("</think>") != std::string::npos));
      if (show) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);  // a token may hold a NUL byte, where fputs would stop
        std::fflush(stdout);
      }
      if (reply.find("</think>") != std::string::npos) in_think = false;
      if (decoder.accept(id)) continue;                       // a right guess: computed already
      if (int64_t(decoder.committed()) >= session.n_ctx()) {  // the context is full: this token is the last
        std::fprintf(stderr, "\nmagnetar chat: the context of %lld tokens is full (raise --ctx)\n",
                     (long long)session.n_ctx());
        break;
      }
      const int64_t drafts = n_predict < 0 ? sampling.lookup : std::min(sampling.lookup, n_predict - n - 2);
      if (Status s = decoder.step(id, drafts); !s.ok()) {
        std::fprintf(stderr, "\nmagnetar chat: %s\n", s.message().c_str());
        break;
      }
    }
    decoder.end();
    const std::string tail = detok->flush();  // a cut character at the end (U+FFFD)
    reply += tail;
    if (!(hide_think && in_think)) std::fwrite(tail.data(), 1, tail.size(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    chat::Message answer{.role = "assistant"};
    chat::split_reasoning(reply, &answer.reasoning, &answer.content);
    history.push_back(answer);
  }
  if (const SessionStats& st = session.stats(); st.draft_tokens > 0) {
    std::fprintf(stderr, "lookup: %lld of %lld drafts right\n", (long long)st.drafts_accepted,
                 (long long)st.draft_tokens);
  }
  return kExitOk;
}

}  // namespace magnetar::tools
