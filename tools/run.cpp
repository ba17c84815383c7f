// `magnetar run`: one prompt in, generated text streamed to stdout, a stats line on stderr.
// Also the entry point of the golden tests: --tokens feeds ids, --dump-logits writes every position's logits.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/npy.h"

namespace magnetar::tools {
namespace {

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return Status::error(format("--tokens: '%s' is not a token id", item.c_str()));
    }
    ids.push_back(int32_t(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that must be
// held back because the next token may complete a stop string.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > hold; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

}  // namespace

int run_main(int argc, char** argv) {
  ModelFlags model;
  SamplingFlags sampling;
  std::string prompt, prompt_file, tokens_text, dump_logits;
  std::vector<std::string> stops;
  int64_t n_predict = 128;
  bool decode = false, no_special = false, ignore_eos = false, truncate = false, echo = false;
  cli::Args args("magnetar run -m MODEL.gguf (-p TEXT | -f FILE | --tokens IDS) [options]",
                 "Generates text from a prompt and streams it to stdout; a stats line (load time, prefill and decode\n"
                 "speed) goes to stderr. With --dump-logits, writes the logits of every prompt position instead.");
  model.add_to(args);
  args.option("-p", &prompt, "TEXT", "prompt text");
  args.option("-f", &prompt_file, "FILE", "read the prompt from a file");
  args.option("--tokens", &tokens_text, "1,2,3", "prompt as token ids instead of text");
  args.option("-n", &n_predict, "N", "tokens to generate (0: none, -1: until end of generation or full context)");
  sampling.add_to(args);
  args.option("--stop", &stops, "STR", "stop when the output contains STR (repeatable)");
  args.flag("--echo", &echo, "print the prompt (as the model sees it, after any --truncate) before the output");
  args.flag("--ignore-eos", &ignore_eos, "keep generating past end-of-generation tokens");
  args.flag("--no-special", &no_special, "tokenize special-token text in the prompt as plain text");
  args.flag("--truncate", &truncate,
            "keep the last tokens of a prompt longer than the context instead of failing, leaving room for -n tokens "
            "(at most half the context)");
  args.option("--dump-logits", &dump_logits, "FILE.npy",
              "write float32 logits [n_tokens, n_vocab] of every prompt position (teacher-forced) and exit");
  args.flag("--decode", &decode, "with --dump-logits: compute position by position through the KV cache");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "run")) return *code;
  if (const std::string e = sampling.error(); !e.empty()) {
    std::fprintf(stderr, "magnetar run: %s\n", e.c_str());
    return kExitBadInput;
  }
  const int given = int(!prompt.empty()) + int(!prompt_file.empty()) + int(!tokens_text.empty());
  if (given != 1) {
    std::fprintf(stderr, "magnetar run: give exactly one of -p, -f, --tokens (see --help)\n");
    return kExitBadInput;
  }
  if (!prompt_file.empty()) {
    Result<std::string> text = cli::read_file(prompt_file);
    if (!text.ok()) {
      std::fprintf(stderr, "magnetar run: %s\n", text.status().message().c_str());
      return kExitBadInput;
    }
    prompt = std::move(text).value();
  }
  std::unique_ptr<Engine> engine = model.load("run");
  if (!engine) return kExitBadInput;

  std::vector<int32_t> tokens;
  if (!tokens_text.empty()) {
    Result<std::vector<int32_t>> ids = parse_ids(tokens_text);
    if (!ids.ok()) {
      std::fprintf(stderr, "magnetar run: %s\n", ids.status().message().c_str());
      return kExitBadInput;
    }
    tokens = std::move(ids).value();
  } else {
    Result<std::vector<int32_t>> ids = engine->tokenize(prompt, !no_special);
    if (!ids.ok()) {
      std::fprintf(stderr, "magnetar run: %s\n", ids.status().message().c_str());
      return kExitBadInput;
    }
    tokens = std::move(ids).value();
  }
  const int64_t n_ctx = engine->options().n_ctx;
  if (tokens.empty()) {
    std::fprintf(stderr, "magnetar run: the prompt is empty\n");
    return kExitBadInput;
  }
  // Room for the generated tokens: the last one is sampled from the last position's logits, not computed.
  const int64_t room =
      n_predict == 0 || !dump_logits.empty() ? 0 : std::min(n_predict < 0 ? n_ctx / 2 : n_predict - 1, n_ctx / 2);
  if (truncate && int64_t(tokens.size()) > n_ctx - room) {
    tokens.erase(tokens.begin(), tokens.end() - std::max<int64_t>(1, n_ctx - room));
  }
  if (int64_t(tokens.size()) > n_ctx) {
    std::fprintf(stderr,
                 "magnetar run: the prompt has %zu tokens, more than the context of %lld (raise --ctx, or "
                 "--truncate to keep the last tokens)\n",
                 tokens.size(), (long long)n_ctx);
    return kExitBadInput;
  }

  Result<std::unique_ptr<Session>> opened = engine->new_session();
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar run: %s\n", opened.status().message().c_str());
    return kExitFailure;
  }
  Session& session = *opened.value();

  if (!dump_logits.empty()) {
    const int64_t V = session.n_vocab(), n = int64_t(tokens.size());
    std::vector<float> all;
    if (decode) {
      all.resize(size_t(n * V));
      for (int64_t i = 0; i < n; ++i) {
        const Status s = i == 0 ? session.sync(std::span<const int32_t>(tokens.data(), 1)) : session.step(tokens[size_t(i)]);
        if (!s.ok()) {
          std::fprintf(stderr, "magnetar run: %s\n", s.message().c_str());
          return kExitBadInput;
        }
        std::copy(session.logits().begin(), session.logits().end(), all.begin() + i * V);
      }
    } else {
      if (Status s = session.sync(tokens, Logits::kAll); !s.ok()) {
        std::fprintf(stderr, "magnetar run: %s\n", s.message().c_str());
        return kExitBadInput;
      }
      if (session.all_logits_first() != 0 || session.all_logits().size() != size_t(n * V)) {
        std::fprintf(stderr, "magnetar run: --dump-logits: the logits of positions 0..%lld were not all computed\n",
                     (long long)n - 1);
        return kExitFailure;
      }
      all.assign(session.all_logits().begin(), session.all_logits().end());
    }
    if (Status s = write_npy(dump_logits, all.data(), n, V); !s.ok()) {
      std::fprintf(stderr, "magnetar run: %s\n", s.message().c_str());
      return kExitFailure;
    }
    std::fprintf(stderr, "magnetar run: wrote logits [%lld, %lld] to %s\n", (long long)n, (long long)V, dump_logits.c_str());
    return kExitOk;
  }

  if (echo && engine->info().has_tokenizer) {
    std::unique_ptr<Detokenizer> prompt_text = engine->new_detokenizer();
    std::string text;  // written whole: a token may hold a NUL byte, where fputs would stop
    for (const int32_t id : tokens) text += prompt_text->push(id);
    text += prompt_text->flush();
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  const auto t_prompt = std::chrono::steady_clock::now();
  if (Status s = session.sync(tokens); !s.ok()) {
    std::fprintf(stderr, "magnetar run: %s\n", s.message().c_str());
    return kExitBadInput;
  }
  const double prompt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_prompt).count();
  session.reset_stats();
  Sampler sampler(sampling.resolved());
  std::unique_ptr<Detokenizer> detok = engine->new_detokenizer();
  const bool text_out = engine->info().has_tokenizer;
  std::string pending;  // generated text not yet printed (may start a stop string)
  int64_t generated = 0;
  bool stopped = false, full = false;
  LookupDecoder decoder(session);  // --lookup's drafts
  while (!stopped && (n_predict < 0 || generated < n_predict)) {
    const int32_t id = sampler.sample(decoder.logits(), decoder.history());
    ++generated;
    if (!ignore_eos && engine->is_end_of_generation(id)) break;
    if (text_out) {
      pending += detok->push(id);
    } else {
      if (generated > 1) pending += ',';
      pending += std::to_string(id);
    }
    for (const std::string& s : stops) {
      if (const size_t at = pending.find(s); !s.empty() && at != std::string::npos) {
        pending.resize(at);
        stopped = true;
      }
    }
    const size_t hold = stopped ? 0 : held_back(pending, stops);
    std::fwrite(pending.data(), 1, pending.size() - hold, stdout);
    std::fflush(stdout);
    pending.erase(0, pending.size() - hold);
    if (stopped) break;
    if (decoder.accept(id)) continue;  // a right guess: computed already
    if (int64_t(decoder.committed()) >= n_ctx) {
      full = n_predict < 0 || generated < n_predict;
      break;
    }
    // Drafts only for tokens that will be sampled: -n's last token is sampled, never computed.
    const int64_t drafts = n_predict < 0 ? sampling.lookup : std::min(sampling.lookup, n_predict - generated - 1);
    if (Status s = decoder.step(id, drafts); !s.ok()) {
      std::fprintf(stderr, "\nmagnetar run: %s\n", s.message().c_str());
      return kExitFailure;
    }
  }
  if (!stopped) pending += text_out ? detok->flush() : "";
  std::fwrite(pending.data(), 1, pending.size(), stdout);
  std::printf("\n");
  std::fflush(stdout);  // before the stats line on stderr, so a shared terminal or pipe shows them in order
  if (full)
    std::fprintf(stderr, "magnetar run: stopped: the context of %lld tokens is full (raise --ctx)\n", (long long)n_ctx);
  decoder.end();  // settles the statistics of the last drafts
  const SessionStats& st = session.stats();
  std::fprintf(stderr, "load %.2f s | prompt %zu tokens, %.2f t/s | generated %lld tokens, %.2f t/s | %d threads\n",
               engine->load_seconds(), tokens.size(), double(tokens.size()) / prompt_seconds, (long long)generated,
               st.decode_seconds > 0 ? double(st.decode_tokens) / st.decode_seconds : 0.0, engine->options().n_threads);
  if (st.draft_tokens > 0) {
    std::fprintf(stderr, "lookup: %lld of %lld drafts right (%.1f%%), %.2f tokens a step\n",
                 (long long)st.drafts_accepted, (long long)st.draft_tokens,
                 100.0 * double(st.drafts_accepted) / double(st.draft_tokens),
                 double(st.decode_tokens) / double(st.decode_tokens - st.drafts_accepted));
  }
  if (const ExpertStats es = engine->expert_stats(); es.streamed || es.gpu_tier) {
    std::fprintf(stderr, "%s\n", expert_summary(es, prompt_seconds + st.decode_seconds,
                                                 int64_t(tokens.size()) + generated).c_str());
  }
  return kExitOk;
}

}  // namespace magnetar::tools
