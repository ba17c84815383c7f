// `magnetar perplexity`: perplexity of a text file under the model, in one of two stated modes.
//   windowed   (llama.cpp's llama-perplexity): independent windows of --ctx tokens, only the second half of
//              each window scored, so every scored token sees at least ctx/2 tokens of context;
//   continuous: windows of --ctx tokens, every token after each window's first scored (higher numbers than
//              windowed on the same text, because early tokens of a window see little context: the demo model
//              gives 25.64 vs 24.37, docs/benchmarks/2026-11-30-demo-quant-quality.md).
// With --kl-base FILE it also saves the model's distribution at every scored position; with --kl FILE (run on
// a quantized copy) it compares against that file: KL divergence, top-1 agreement, the base model's PPL
// (llama-perplexity's --kl-divergence-base / --kl-divergence).
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/temp_files.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/progress.h"

namespace magnetar::tools {
namespace {

// ---- one row of logits ------------------------------------------------------------------------------------

// The log-softmax normalizer of one row: log p(v) = row[v] - max - lse.
struct RowStats {
  float max = 0;
  int32_t argmax = 0;  // first index of the maximum
  double lse = 0;      // log sum_v exp(row[v] - max)
};

RowStats row_stats(const float* row, int64_t n_vocab) {
  RowStats s{.max = row[0]};
  for (int64_t v = 1; v < n_vocab; ++v) {
    if (row[v] > s.max) {
      s.max = row[v];
      s.argmax = int32_t(v);
    }
  }
  double z = 0;
  for (int64_t v = 0; v < n_vocab; ++v) z += std::exp(double(row[v] - s.max));
  s.lse = std::log(z);
  return s;
}

double nll_of(const float* row, const RowStats& s, int32_t next) { return s.lse - double(row[next] - s.max); }

// ---- the KL base file -------------------------------------------------------------------------------------
// Little-endian: a 48-byte Header, the int32 token ids of every window (n_windows * n_ctx; they pin the text,
// the tokenizer and the window layout), then one record per scored position, in scoring order, of
// record_bytes(n_vocab): a RecordHead and n_vocab uint16 log-probabilities (padded to an even count). As in
// llama.cpp's --kl-divergence-base, log-probabilities are stored in 16 bits over a range clamped to 16 nats
// below the top (step <= 16/65535 nats) and values at or below -16 are left out of the KL sum. The head keeps
// what the 16 bits would blur: the exact argmax (top-1 agreement) and the exact NLL of the next token (the
// base PPL), so a model compared with its own file gets top-1 100% and the same PPL.

constexpr char kKlMagic[4] = {'M', 'G', 'K', 'L'};
constexpr uint32_t kKlVersion = 2;        // 2: every window begins with BOS when the model adds one
constexpr float kLogProbRange = 16.0f;    // llama.cpp's: min logit clamped to max - 16
constexpr double kLogProbCutoff = -16.0;  // llama.cpp's: smaller base log-probs are left out of the KL sum

struct Header {
  char magic[4];
  uint32_t version;
  uint32_t n_vocab;
  uint32_t n_ctx;
  uint32_t mode;  // 0 windowed, 1 continuous
  uint32_t first_scored;
  uint64_t n_windows;
  uint64_t n_scored;  // records in the file: n_windows * (n_ctx - 1 - first_scored)
  uint64_t n_tokens;  // token ids in the file: n_windows * n_ctx
};
static_assert(sizeof(Header) == 48);

struct RecordHead {
  double nll;   // -log p(next token), exact
  float scale;  // log p(v) = min_log_prob + scale * q[v]
  float min_log_prob;
  int32_t argmax;  // exact
  int32_t reserved;
};
static_assert(sizeof(RecordHead) == 24);

size_t record_bytes(int64_t n_vocab) { return sizeof(RecordHead) + size_t((n_vocab + 1) / 2 * 2) * sizeof(uint16_t); }

void encode_record(const float* row, int64_t n_vocab, const RowStats& s, int32_t next, uint8_t* out) {
  float min_logit = row[0];
  for (int64_t v = 1; v < n_vocab; ++v) min_logit = std::min(min_logit, row[v]);
  min_logit = std::max(min_logit, s.max - kLogProbRange);
  RecordHead h{.nll = nll_of(row, s, next),
               .scale = (s.max - min_logit) / 65535.0f,
               .min_log_prob = float(double(min_logit - s.max) - s.lse),
               .argmax = s.argmax,
               .reserved = 0};
  std::memcpy(out, &h, sizeof(h));
  uint16_t* q = reinterpret_cast<uint16_t*>(out + sizeof(h));  // 2-byte aligned: records are multiples of 4 bytes
  for (int64_t v = 0; v < n_vocab; ++v) {
    const float x = h.scale > 0 ? (row[v] - min_logit) / h.scale : 0.0f;
    q[v] = uint16_t(std::clamp(std::lround(x), 0l, 65535l));
  }
  if (n_vocab % 2) q[n_vocab] = 0;
}

// KL(base || this model) at one position, from its record and this model's logits: over the tokens whose base
// log-prob is above the cutoff (llama.cpp's sum), each term p log(p/q) - p + q, and the tokens below it as one
// outcome of base mass P_o = 1 - (the included p) and this model's Q_o, P_o log(P_o/Q_o) - P_o + Q_o. The extra
// -p + q terms sum to 0 for normalized distributions, but here they cancel the first-order error of the 16-bit base
// log-probs (p = q e^d with rounding errors |d| <= step/2): every term is q (d e^d - e^d + 1) >= 0, and a model
// compared with its own file gets KL ~ step^2 / 24 (< 1e-8) instead of +-1e-5. Without the excluded outcome the
// extra terms summed to P_o - Q_o: a model that moved 5% of the mass onto tokens the base rules out lost 0.05 of its
// KL (and with only Q_o added, a model compared with itself gained its excluded mass).
double kl_of(const uint8_t* record, const float* row, int64_t n_vocab, const RowStats& s) {
  RecordHead h;
  std::memcpy(&h, record, sizeof(h));
  const uint16_t* q = reinterpret_cast<const uint16_t*>(record + sizeof(h));
  double kl = 0, p_in = 0, q_out = 0;
  for (int64_t v = 0; v < n_vocab; ++v) {
    const double base = double(h.min_log_prob) + double(h.scale) * double(q[v]);
    const double log_q = double(row[v] - s.max) - s.lse;
    if (base <= kLogProbCutoff) {
      q_out += std::exp(log_q);
      continue;
    }
    const double p = std::exp(base);
    p_in += p;
    kl += p * (base - log_q) - p + std::exp(log_q);
  }
  const double p_out = std::max(0.0, 1.0 - p_in);
  if (p_out > 0 && q_out > 0) kl += p_out * std::log(p_out / q_out);
  return kl - p_out + q_out;
}

Status put(std::FILE* f, const std::string& path, const void* data, size_t n) {
  if (std::fwrite(data, 1, n, f) != n)
    return Status::error(format("%s: write failed: %s", path.c_str(), std::strerror(errno)));
  return Status();
}

Status get(std::FILE* f, const std::string& path, void* data, size_t n) {
  if (std::fread(data, 1, n, f) != n) return Status::error(format("%s: truncated (read failed)", path.c_str()));
  return Status();
}

// Writes PATH.tmp and renames it onto PATH in commit(); destroyed before that, it removes the temporary.
class KlWriter {
 public:
  explicit KlWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  ~KlWriter() {
    temp_files::forget(temp_handle_);
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  // `bytes`: the whole file's size, checked against the free space first (a run can take hours).
  Status open(const Header& h, std::span<const int32_t> tokens, uint64_t bytes) {
    // An existing file is replaced only when it is a KL base file: --kl-base naming the model or the text would
    // have destroyed it.
    if (struct stat st; ::stat(path_.c_str(), &st) == 0) {
      char magic[4] = {};
      std::FILE* existing = S_ISREG(st.st_mode) ? std::fopen(path_.c_str(), "rb") : nullptr;
      const bool kl = existing && std::fread(magic, 1, 4, existing) == 4 && std::memcmp(magic, kKlMagic, 4) == 0;
      if (existing) std::fclose(existing);
      if (!kl) {
        return Status::error(
            format("--kl-base %s: exists and is not a KL base file: not replaced (name a new file)", path_.c_str()));
      }
    }
    const std::filesystem::path dir = std::filesystem::absolute(path_).parent_path();
    if (struct statvfs fs; ::statvfs(dir.c_str(), &fs) == 0 && uint64_t(fs.f_bavail) * fs.f_frsize < bytes) {
      return Status::error(format("--kl-base %s: needs %.2f GiB, %.2f GiB free in %s", path_.c_str(),
                                  double(bytes) / double(1ull << 30),
                                  double(uint64_t(fs.f_bavail) * fs.f_frsize) / double(1ull << 30), dir.c_str()));
    }
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) return Status::error(format("%s: cannot create: %s", tmp_.c_str(), std::strerror(errno)));
    temp_handle_ = temp_files::add(tmp_);  // an interrupted run removes it
    MAGNETAR_RETURN_IF_ERROR(put(f_, tmp_, &h, sizeof(h)));
    return put(f_, tmp_, tokens.data(), tokens.size_bytes());
  }
  Status write(std::span<const uint8_t> bytes) { return put(f_, tmp_, bytes.data(), bytes.size()); }
  Status commit() {
    const bool failed = std::fflush(f_) != 0 || std::ferror(f_) != 0;
    std::fclose(f_);
    f_ = nullptr;
    if (failed) return Status::error(format("%s: write failed: %s", tmp_.c_str(), std::strerror(errno)));
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return Status::error(format("%s: cannot rename to %s: %s", tmp_.c_str(), path_.c_str(), std::strerror(errno)));
    }
    committed_ = true;
    temp_files::forget(temp_handle_);
    temp_handle_ = -1;
    return Status();
  }

 private:
  std::string path_, tmp_;
  int temp_handle_ = -1;
  std::FILE* f_ = nullptr;
  bool committed_ = false;
};

// Reads a base file window by window after checking that it was made for this run.
class KlReader {
 public:
  ~KlReader() {
    if (f_) std::fclose(f_);
  }
  // Opens `path` and checks its header and token ids against this run's; every mismatch is one line.
  Status open(const std::string& path, const Header& want, std::span<const int32_t> text_tokens) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) return Status::error(format("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
    if (std::fread(&h_, 1, sizeof(h_), f_) != sizeof(h_) || std::memcmp(h_.magic, kKlMagic, 4) != 0) {
      return Status::error(format("%s: not a KL base file (written by perplexity --kl-base)", path.c_str()));
    }
    if (h_.version != kKlVersion) {
      return Status::error(
          format("%s: KL base file version %u, this build reads %u", path.c_str(), h_.version, kKlVersion));
    }
    auto mode_name = [](uint32_t m) { return m == 0 ? "windowed" : "continuous"; };
    if (h_.n_vocab != want.n_vocab) {
      return Status::error(
          format("%s: made with a vocabulary of %u, this model has %u", path.c_str(), h_.n_vocab, want.n_vocab));
    }
    if (h_.n_ctx != want.n_ctx) {
      return Status::error(
          format("%s: made with --ctx %u, this run uses --ctx %u", path.c_str(), h_.n_ctx, want.n_ctx));
    }
    if (h_.mode != want.mode || h_.first_scored != want.first_scored) {
      return Status::error(format("%s: made with --mode %s, this run uses --mode %s", path.c_str(), mode_name(h_.mode),
                                  mode_name(want.mode)));
    }
    const uint64_t per_window = h_.n_ctx - 1 - h_.first_scored;
    if (h_.n_tokens != h_.n_windows * h_.n_ctx || h_.n_scored != h_.n_windows * per_window || h_.n_windows == 0) {
      return Status::error(format("%s: inconsistent header (%llu windows, %llu tokens, %llu scored)", path.c_str(),
                                  (unsigned long long)h_.n_windows, (unsigned long long)h_.n_tokens,
                                  (unsigned long long)h_.n_scored));
    }
    const uint64_t expected = sizeof(Header) + h_.n_tokens * 4 + h_.n_scored * record_bytes(h_.n_vocab);
    if (std::fseek(f_, 0, SEEK_END) != 0 || uint64_t(std::ftell(f_)) != expected) {
      return Status::error(format("%s: %lld bytes, the header promises %llu (truncated?)", path.c_str(),
                                  (long long)std::ftell(f_), (unsigned long long)expected));
    }
    bytes_ = expected;
    std::fseek(f_, long(sizeof(Header)), SEEK_SET);
    std::vector<int32_t> ids(static_cast<size_t>(h_.n_tokens));
    MAGNETAR_RETURN_IF_ERROR(get(f_, path, ids.data(), ids.size() * 4));
    const size_t n = std::min(ids.size(), text_tokens.size());
    const size_t at =
        size_t(std::mismatch(ids.begin(), ids.begin() + ptrdiff_t(n), text_tokens.begin()).first - ids.begin());
    if (at < ids.size()) {
      return Status::error(
          format("%s: token %zu of the text differs from the base run's (%s); different text or tokenizer",
                 path.c_str(), at, at < text_tokens.size() ? "another id" : "the text is shorter"));
    }
    return Status();
  }
  const Header& header() const { return h_; }
  uint64_t bytes() const { return bytes_; }
  // The next window's records: [n_ctx - 1 - first_scored, record_bytes(n_vocab)].
  Status next_window(std::vector<uint8_t>& buffer) {
    buffer.resize(size_t(h_.n_ctx - 1 - h_.first_scored) * record_bytes(h_.n_vocab));
    return get(f_, path_, buffer.data(), buffer.size());
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  Header h_{};
  uint64_t bytes_ = 0;
};

// ---- statistics -------------------------------------------------------------------------------------------

// Mean of the values summed into (sum, sum2) over n, and its standard error.
std::pair<double, double> mean_and_error(double sum, double sum2, int64_t n) {
  const double mean = sum / double(n);
  const double var = n > 1 ? (sum2 / double(n) - mean * mean) * double(n) / double(n - 1) : 0;
  return {mean, std::sqrt(std::max(0.0, var) / double(n))};
}

// Linear interpolation between the closest ranks; `sorted` ascending and not empty.
double percentile(const std::vector<double>& sorted, double q) {
  const double at = q * double(sorted.size() - 1);
  const size_t lo = size_t(at);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (at - double(lo)) * (sorted[hi] - sorted[lo]);
}

}  // namespace

int perplexity_main(int argc, char** argv) {
  ModelFlags model;
  model.ctx = 512;
  std::string text_file, mode = "windowed", kl_base_path, kl_path;
  int64_t max_windows = 0;
  bool json = false, special = false;
  cli::Args args(
      "magnetar perplexity -m MODEL.gguf -f TEXT_FILE [--ctx N] [--mode windowed|continuous] "
      "[--kl-base FILE | --kl FILE] [--json]",
      "Scores a text file: prints the mode, the number of tokens scored, the perplexity and its standard\n"
      "error. windowed = llama.cpp's method (independent --ctx windows, second half of each scored);\n"
      "continuous = every token after the first of each window scored.\n"
      "KL divergence of a quantized model (llama-perplexity --kl-divergence-base / --kl-divergence): run the\n"
      "base model with --kl-base FILE (saves its distribution at every scored position: about\n"
      "2 * n_vocab bytes per position), then the quantized one with --kl FILE and the same text, --ctx and\n"
      "--mode; it adds ppl_base, kl_mean, kl_median, kl_p99, kl_max and top1_agreement lines.");
  model.add_to(args);
  args.option("-f", &text_file, "FILE", "text to score");
  args.option("--mode", &mode, "windowed|continuous", "which tokens are scored");
  args.option("--max-windows", &max_windows, "N", "score at most N windows (0: all)");
  args.option("--kl-base", &kl_base_path, "FILE", "save this model's distributions for a later --kl run");
  args.option("--kl", &kl_path, "FILE", "compare this model with the distributions saved by --kl-base");
  args.flag("--json", &json, "print the results as one JSON object");
  args.flag("--special", &special, "tokenize special-token text in the file (e.g. <|endoftext|> between documents) "
            "as the special token, not as plain text (llama-perplexity reads it as text)");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "perplexity")) return *code;
  if (mode != "windowed" && mode != "continuous") {
    std::fprintf(stderr, "magnetar perplexity: --mode must be windowed or continuous, got '%s'\n", mode.c_str());
    return kExitBadInput;
  }
  if (text_file.empty()) {
    std::fprintf(stderr, "magnetar perplexity: -f TEXT_FILE is required\n");
    return kExitBadInput;
  }
  if (max_windows < 0) {
    std::fprintf(stderr, "magnetar perplexity: --max-windows must be >= 0 (0: all), got %lld\n",
                 (long long)max_windows);
    return kExitBadInput;
  }
  if (!kl_base_path.empty() && !kl_path.empty()) {
    std::fprintf(stderr, "magnetar perplexity: --kl-base and --kl exclude each other (make the base file first)\n");
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
  Result<std::vector<int32_t>> tokenized = engine->tokenize(text, special);
  if (!tokenized.ok()) {
    std::fprintf(stderr, "magnetar perplexity: %s\n", tokenized.status().message().c_str());
    return kExitBadInput;
  }
  const std::vector<int32_t>& tokens = tokenized.value();
  const int64_t n_ctx = engine->options().n_ctx;
  const int64_t n_vocab = engine->info().n_vocab;
  const int64_t first_scored = mode == "windowed" ? n_ctx / 2 : 0;  // logits row predicting the next token
  if (n_ctx - 1 - first_scored < 1) {
    std::fprintf(stderr, "magnetar perplexity: --ctx %lld scores no token in %s mode (needs at least %d)\n",
                 (long long)n_ctx, mode.c_str(), mode == "windowed" ? 3 : 2);
    return kExitBadInput;
  }
  const Header run{.magic = {},
                   .version = kKlVersion,
                   .n_vocab = uint32_t(n_vocab),
                   .n_ctx = uint32_t(n_ctx),
                   .mode = mode == "windowed" ? 0u : 1u,
                   .first_scored = uint32_t(first_scored),
                   .n_windows = 0,
                   .n_scored = 0,
                   .n_tokens = 0};
  int64_t n_windows = int64_t(tokens.size()) / n_ctx;
  KlReader kl_reader;
  if (!kl_path.empty()) {
    if (Status s = kl_reader.open(kl_path, run, tokens); !s.ok()) {
      std::fprintf(stderr, "magnetar perplexity: %s\n", s.message().c_str());
      return kExitBadInput;
    }
    n_windows = int64_t(kl_reader.header().n_windows);  // the base file's windows, all in the text (checked)
  }
  if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  if (n_windows == 0) {
    std::fprintf(stderr, "magnetar perplexity: %s: %zu tokens, fewer than one window of --ctx %lld\n",
                 text_file.c_str(), tokens.size(), (long long)n_ctx);
    return kExitBadInput;
  }
  const int64_t per_window = n_ctx - 1 - first_scored;
  std::unique_ptr<KlWriter> kl_writer;
  uint64_t kl_base_bytes = 0;
  if (!kl_base_path.empty()) {
    Header h = run;
    std::memcpy(h.magic, kKlMagic, 4);
    h.n_windows = uint64_t(n_windows);
    h.n_scored = uint64_t(n_windows * per_window);
    h.n_tokens = uint64_t(n_windows * n_ctx);
    kl_base_bytes = sizeof(Header) + h.n_tokens * 4 + h.n_scored * record_bytes(n_vocab);
    std::fprintf(stderr, "magnetar perplexity: writing %s: %llu positions x %lld log-probs, %.1f MiB\n",
                 kl_base_path.c_str(), (unsigned long long)h.n_scored, (long long)n_vocab,
                 double(kl_base_bytes) / (1024.0 * 1024.0));
    kl_writer = std::make_unique<KlWriter>(kl_base_path);
    if (Status s = kl_writer->open(h, {tokens.data(), size_t(h.n_tokens)}, kl_base_bytes); !s.ok()) {
      std::fprintf(stderr, "magnetar perplexity: %s\n", s.message().c_str());
      return kExitBadInput;
    }
  }

  Result<std::unique_ptr<Session>> opened = engine->new_session();
  if (!opened.ok()) {
    std::fprintf(stderr, "magnetar perplexity: %s\n", opened.status().message().c_str());
    return kExitFailure;
  }
  Session& session = *opened.value();
  double sum_nll = 0, sum_nll2 = 0, sum_base = 0, sum_base2 = 0, sum_kl = 0, sum_kl2 = 0;
  int64_t count = 0, same_top = 0;
  std::vector<double> kls;       // [n_scored] per position, for the median and p99 (8 bytes a position)
  std::vector<uint8_t> records;  // [per_window, record_bytes(n_vocab)] one window of the base file
  Progress progress("perplexity", uint64_t(n_windows));
  std::vector<int32_t> window(static_cast<size_t>(n_ctx));
  for (int64_t w = 0; w < n_windows; ++w) {
    std::copy(tokens.begin() + w * n_ctx, tokens.begin() + (w + 1) * n_ctx, window.begin());
    // As llama-perplexity: a model that adds BOS sees it first in every window (the text's first token is it).
    if (engine->info().adds_bos) window[0] = tokens[0];
    session.clear();  // windows are independent: nothing is reused between them
    Status s = session.sync(window, Logits::kAll);
    if (s.ok() && (session.all_logits_first() != 0 || session.all_logits().size() != window.size() * size_t(n_vocab))) {
      s = Status::error("the logits of the window's positions were not all computed");
    }
    if (s.ok() && !kl_path.empty()) s = kl_reader.next_window(records);
    if (!s.ok()) {
      std::fprintf(stderr, "magnetar perplexity: %s\n", s.message().c_str());
      return kExitFailure;
    }
    if (kl_writer) records.resize(size_t(per_window) * record_bytes(n_vocab));
    const std::span<const float> logits = session.all_logits();
    for (int64_t j = first_scored; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + j * n_vocab;
      const RowStats st = row_stats(row, n_vocab);
      const int32_t next = window[size_t(j + 1)];
      const double nll = nll_of(row, st, next);
      sum_nll += nll;
      sum_nll2 += nll * nll;
      ++count;
      uint8_t* record = records.data() + size_t(j - first_scored) * record_bytes(n_vocab);
      if (kl_writer) encode_record(row, n_vocab, st, next, record);
      if (!kl_path.empty()) {
        RecordHead h;
        std::memcpy(&h, record, sizeof(h));
        const double kl = kl_of(record, row, n_vocab, st);
        sum_kl += kl;
        sum_kl2 += kl * kl;
        kls.push_back(kl);
        sum_base += h.nll;
        sum_base2 += h.nll * h.nll;
        same_top += h.argmax == st.argmax;
      }
    }
    if (kl_writer) {
      if (Status ws = kl_writer->write(records); !ws.ok()) {
        std::fprintf(stderr, "magnetar perplexity: %s\n", ws.message().c_str());
        return kExitFailure;
      }
    }
    progress.update(uint64_t(w + 1));
    std::fprintf(stderr, "[%lld] %.4f\n", (long long)(w + 1), std::exp(sum_nll / double(count)));
  }
  if (kl_writer) {
    if (Status s = kl_writer->commit(); !s.ok()) {
      std::fprintf(stderr, "magnetar perplexity: %s\n", s.message().c_str());
      return kExitFailure;
    }
  }
  progress.finish(format("%lld windows", (long long)n_windows));

  const auto [mean, mean_err] = mean_and_error(sum_nll, sum_nll2, count);
  const double ppl = std::exp(mean), ppl_err = ppl * mean_err;
  nlohmann::json j = {{"mode", mode},           {"n_ctx", n_ctx}, {"n_windows", n_windows},
                      {"tokens_scored", count}, {"ppl", ppl},     {"ppl_err", ppl_err}};
  std::string lines = format("mode: %s (ctx %lld, %lld windows)\ntokens scored: %lld\nPPL = %.4f +/- %.4f\n",
                             mode.c_str(), (long long)n_ctx, (long long)n_windows, (long long)count, ppl, ppl_err);
  if (kl_writer) {
    j["kl_base_file"] = kl_base_path;
    j["kl_base_bytes"] = kl_base_bytes;
    lines += format("kl_base_file %s\nkl_base_bytes %llu (%.1f MiB)\n", kl_base_path.c_str(),
                    (unsigned long long)kl_base_bytes, double(kl_base_bytes) / (1024.0 * 1024.0));
  }
  if (!kl_path.empty()) {
    const auto [base_mean, base_err] = mean_and_error(sum_base, sum_base2, count);
    const double ppl_base = std::exp(base_mean), ppl_base_err = ppl_base * base_err;
    const auto [kl_mean, kl_err] = mean_and_error(sum_kl, sum_kl2, count);
    std::sort(kls.begin(), kls.end());
    const double top1 = double(same_top) / double(count);
    const double top1_err = count > 1 ? std::sqrt(top1 * (1 - top1) / double(count - 1)) : 0;
    j.update({{"kl_file", kl_path},
              {"kl_file_bytes", kl_reader.bytes()},
              {"ppl_base", ppl_base},
              {"ppl_base_err", ppl_base_err},
              {"kl_mean", kl_mean},
              {"kl_mean_err", kl_err},
              {"kl_median", percentile(kls, 0.5)},
              {"kl_p99", percentile(kls, 0.99)},
              {"kl_max", kls.back()},
              {"top1_agreement", 100 * top1},
              {"top1_agreement_err", 100 * top1_err}});
    lines += format(
        "kl_file %s\nppl_base %.4f +/- %.4f\nkl_mean %.6g +/- %.6g\nkl_median %.6g\nkl_p99 %.6g\n"
        "kl_max %.6g\ntop1_agreement %.3f +/- %.3f %%\n",
        kl_path.c_str(), ppl_base, ppl_base_err, kl_mean, kl_err, percentile(kls, 0.5), percentile(kls, 0.99),
        kls.back(), 100 * top1, 100 * top1_err);
  }
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputs(lines.c_str(), stdout);
  }
  return kExitOk;
}

}  // namespace magnetar::tools
