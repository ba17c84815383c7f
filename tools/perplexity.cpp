// `magnetar perplexity`: perplexity of a text file under the model, in one of two stated modes.
//   windowed   (llama.cpp's llama-perplexity): independent windows of --ctx tokens, only the second half of
//              each window scored, so every scored token sees at least ctx/2 tokens of context;
//   continuous: windows of --ctx tokens, every token after each window's first scored (lower numbers than
//              windowed on the same text, because early tokens of a window see little context).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/progress.h"

namespace magnetar::tools {

int perplexity_main(int argc, char** argv) {
  ModelFlags model;
  model.ctx = 512;
  std::string text_file, mode = "windowed";
  int64_t max_windows = 0;
  cli::Args args("magnetar perplexity -m MODEL.gguf -f TEXT_FILE [--ctx N] [--mode windowed|continuous]",
                 "Scores a text file: prints the mode, the number of tokens scored, the perplexity and its standard\n"
                 "error. windowed = llama.cpp's method (independent --ctx windows, second half of each scored);\n"
                 "continuous = every token after the first of each window scored.");
  model.add_to(args);
  args.option("-f", &text_file, "FILE", "text to score");
  args.option("--mode", &mode, "windowed|continuous", "which tokens are scored");
  args.option("--max-windows", &max_windows, "N", "score at most N windows (0: all)");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "perplexity")) return *code;
  if (mode != "windowed" && mode != "continuous") {
    std::fprintf(stderr, "magnetar perplexity: --mode must be windowed or continuous, got '%s'\n", mode.c_str());
    return kExitBadInput;
  }
  if (text_file.empty()) {
    std::fprintf(stderr, "magnetar perplexity: -f TEXT_FILE is required\n");
    return kExitBadInput;
  }
  Result<std::string> read = cli::read_file(text_file);
  if (!read.ok()) {
    std::fprintf(stderr, "magnetar perplexity: %s\n", read.status().message().c_str());
    return kExitBadInput;
  }
  const std::string& text = read.value();
  std::unique_ptr<Engine> engine = model.load("perplexity");
  if (!engine) return kExitBadInput;
  Result<std::vector<int32_t>> tokenized = engine->tokenize(text, false);
  if (!tokenized.ok()) {
    std::fprintf(stderr, "magnetar perplexity: %s\n", tokenized.status().message().c_str());
    return kExitBadInput;
  }
  const std::vector<int32_t>& tokens = tokenized.value();
  const int64_t n_ctx = engine->options().n_ctx;
  int64_t n_windows = int64_t(tokens.size()) / n_ctx;
  if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  if (n_windows == 0) {
    std::fprintf(stderr, "magnetar perplexity: %s: %zu tokens, fewer than one window of --ctx %lld\n",
                 text_file.c_str(), tokens.size(), (long long)n_ctx);
    return kExitBadInput;
  }
  Result<std::unique_ptr<Session>> opened = engine->new_session();
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar perplexity: %s\n", opened.status().message().c_str());
    return kExitFailure;
  }
  Session& session = *opened.value();
  const int64_t first_scored = mode == "windowed" ? n_ctx / 2 : 0;  // logits row predicting the next token
  const int64_t V = session.n_vocab();
  double sum_nll = 0, sum_nll2 = 0;
  int64_t count = 0;
  Progress progress("perplexity", uint64_t(n_windows));
  std::vector<int32_t> window(static_cast<size_t>(n_ctx));
  for (int64_t w = 0; w < n_windows; ++w) {
    std::copy(tokens.begin() + w * n_ctx, tokens.begin() + (w + 1) * n_ctx, window.begin());
    session.clear();  // windows are independent: nothing is reused between them
    if (Status s = session.sync(window, Logits::kAll); !s.ok()) {
      std::fprintf(stderr, "magnetar perplexity: %s\n", s.message().c_str());
      return kExitFailure;
    }
    const std::span<const float> logits = session.all_logits();
    for (int64_t j = first_scored; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + j * V;
      float max_logit = row[0];
      for (int64_t v = 1; v < V; ++v) max_logit = std::max(max_logit, row[v]);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v] - max_logit));
      const double nll = std::log(z) - double(row[window[size_t(j + 1)]] - max_logit);
      sum_nll += nll;
      sum_nll2 += nll * nll;
      ++count;
    }
    progress.update(uint64_t(w + 1));
    std::fprintf(stderr, "[%lld] %.4f\n", (long long)(w + 1), std::exp(sum_nll / double(count)));
  }
  progress.finish(format("%lld windows", (long long)n_windows));
  const double mean = sum_nll / double(count);
  const double var = count > 1 ? (sum_nll2 / double(count) - mean * mean) * double(count) / double(count - 1) : 0;
  const double ppl = std::exp(mean);
  const double ppl_err = ppl * std::sqrt(std::max(0.0, var) / double(count));
  std::printf("mode: %s (ctx %lld, %lld windows)\ntokens scored: %lld\nPPL = %.4f +/- %.4f\n", mode.c_str(),
              (long long)n_ctx, (long long)n_windows, (long long)count, ppl, ppl_err);
  return kExitOk;
}

}  // namespace magnetar::tools
