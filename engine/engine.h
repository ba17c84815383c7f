// Magnetar's engine boundary (STYLE.md rule 1): the only header that tools/, server/ and chat/ include.
//
// An Engine is a loaded model (weights bound, tokenizer, immutable, shareable by sessions). A Session is one
// timeline: its token ids, its KV cache and the logits of its last computed position. Callers never see
// tensors: they hand a session the full token sequence they want continued and the engine decides what to
// reuse and what to compute.
//
// Thread-safety: an Engine may be used by many sessions, but each Session by one thread at a time, and all
// sessions of an engine share its thread pool, so compute calls must not overlap (the server's single worker
// thread guarantees that).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"

namespace magnetar {

// KV cache precision (--kv-type): F16 (default), F32, Q8_0 (ggml's blocks of 32 with an f16 scale: 8.5 bits per
// element, ~0.53 of F16's bytes; needs a head size that is a multiple of 32) or FP8 (E4M3, one byte per element, half
// F16's bytes, no scales: quant/fp8.h). F32 runs on the CPU only.
enum class KvType { kF16, kF32, kQ8_0, kF8 };
// Where the forward pass runs. kAuto: the GPU when this build has the CUDA backend, a GPU is present, the
// architecture has a CUDA forward pass and the whole model fits its free memory; otherwise the CPU (the memory
// plan says why).
enum class Device { kAuto, kCpu, kCuda };
// Where routed experts live: decided by the memory planner (auto), or forced. kMmap maps everything and lets
// the page cache decide, without checking that it fits (llama.cpp's way; the baseline streaming is measured
// against: a model larger than RAM thrashes).
enum class ExpertMode { kAuto, kResident, kStream, kMmap };

// The streamed expert store's knobs (ignored when experts are resident).
struct StreamOptions {
  double cache_gb = 0;          // RAM expert cache; 0: as large as the plan allows
  std::string policy = "lfu";   // eviction: lfu (frequency with decay) or lru
  // Next-layer prefetch (the next router on the current hidden state). Off by default: measured on the CPU box
  // (docs/benchmarks/2026-11-30-expert-streaming.md) it was neutral with a large cache and cost 10% of decode
  // speed with a small one (its wrong guesses evict entries the next token needs).
  bool prefetch = false;
  bool census = true;           // MODEL.gguf.census: count, persist, warm-start from the hottest experts
  bool io_uring = true;         // false: pread thread pool
  bool direct_io = true;        // O_DIRECT
  int queue_depth = 32;
  // Diagnostic: reads of one layer's misses merge across gaps up to this many KiB;
  // -1: measured at load (the default, see experts::StoreOptions::merge_gap_bytes); 0: adjacent pieces only.
  int64_t read_gap_kib = -1;
};

// Disk KV checkpoints (kv/disk_cache.h): every full block of a session's timeline is saved under `dir` as it
// completes (during prefill and decode), and sync() loads the longest saved prefix of a new timeline instead of
// computing it, across sessions and restarts. Off when `dir` is empty.
struct KvDiskOptions {
  std::string dir;
  double gb = 0;               // disk budget; 0: min(16 GiB, half the free space of dir)
  int64_t block_tokens = 2048;
};

// The default context of run, chat, perplexity and bench, and the floor below which serve's larger default is not
// cut (EngineOptions::n_ctx).
inline constexpr int64_t kDefaultContext = 4096;

struct EngineOptions {
  int n_threads = 0;          // 0: one per available core
  int64_t n_ctx = 0;          // context per session; 0: the training context, at most n_ctx_default_max, less when
                              // its KV does not fit (experts::default_context; context_note() says so)
  int64_t n_ctx_default_max = kDefaultContext;  // the command's (serve: 32,768)
  // Sessions the memory checks and plans make room for (KV and scratch of each; serve --parallel, bench --sessions):
  // a streamed plan's expert cache, or a GPU pool, shrinks for them. More can be opened while memory allows
  // (sessions_that_fit).
  int64_t n_sessions = 1;
  int64_t n_batch = 0;        // tokens per forward call during prefill (bounds scratch memory); 0: 2048 when the
                              // whole model runs on the GPU with room for that scratch, else 512
  // Experts streamed or tiered (not all resident): prompt tokens per prefill sweep (a whole number of n_batch chunks,
  // or n_ctx), which runs the prompt layer by layer over n_batch-token chunks so that each layer's experts are read
  // (and on the GPU copied up) once per sweep instead of once per chunk. Its residual stream takes 8 bytes per token
  // and n_embd of GPU memory (tiered), 4 of host memory per session (CPU). -1: as many as fit 256 MiB, at most n_ctx,
  // on the GPU for prompts of 8 chunks or more; 0: off (one chunk through every layer at a time).
  int64_t n_sweep = -1;
  KvType kv_type = KvType::kF16;
  Device device = Device::kAuto;
  // CUDA: bytes of the GPU expert pool in GiB. 0: every weight resident on the GPU when the model fits its free
  // memory, else (or with --stream / --mmap) the largest pool that fits; > 0: that pool, the experts staying in
  // host memory (the RAM store / mapped file) and the most used ones (gpu_cache_policy) cached on the GPU.
  double gpu_cache_gb = 0;
  // CUDA, experts tiered: a routed expert that misses the GPU pool and is no hotter than the pool's coldest is
  // computed on the CPU from host memory (while the GPU computes the rest) instead of copied up.
  bool cpu_experts = false;
  // CUDA, experts tiered: the GPU pool's eviction, "lfu" or "lru" (experts/policy.h); lfu measured better on
  // skewed routing (docs/benchmarks/2026-11-30-cuda-forward.md), as the RAM store's default.
  std::string gpu_cache_policy = "lfu";
  bool profile = false;       // time every op of the forward pass (Session::op_profile)
  bool count_routing = false; // count expert selections per layer (Session::expert_counts)
  ExpertMode experts = ExpertMode::kAuto;
  StreamOptions stream;
  KvDiskOptions kv_disk;
};

// Disk KV statistics since load (all zero when disk KV is off).
struct KvDiskStats {
  bool enabled = false;
  std::string where;  // "DIR: N blocks of B tokens (X of Y GiB, Z MiB per block)"
  uint64_t blocks_on_disk = 0, bytes_on_disk = 0;  // of this model and KV format
  uint64_t foreign_blocks = 0, foreign_bytes = 0;  // of other models or KV formats, in the budget too
  uint64_t blocks_saved = 0, blocks_restored = 0, blocks_evicted = 0, blocks_rejected = 0;
  uint64_t tokens_restored = 0, bytes_written = 0, bytes_read = 0;
  double save_seconds = 0, restore_seconds = 0;
  uint64_t blocks_failed = 0;    // background saves that could not be written
  uint64_t blocks_declined = 0;  // saves skipped: no room without deleting a block worth more (kv/disk_cache.h)
  double copy_seconds = 0;     // compute-thread time spent copying blocks out for the background writer
};

// Expert cache statistics since load or the last reset (all zero when experts are resident).
struct ExpertStats {
  bool streamed = false;
  std::string store;            // reader, O_DIRECT, slots, policy, layout, warm start
  uint64_t hits = 0, inflight_hits = 0, misses = 0, evictions = 0;
  uint64_t reads = 0, bytes_read = 0;
  double read_seconds = 0, wait_seconds = 0;
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_wasted = 0;
  uint64_t predicted = 0, acquired_with_hint = 0;  // prefetch accuracy: predicted / acquired_with_hint
  // The GPU expert pool (device cuda with a pool): experts found there / copied up from host memory.
  bool gpu_tier = false;
  uint64_t gpu_slots = 0, gpu_hits = 0, gpu_misses = 0, gpu_evictions = 0, gpu_bytes_h2d = 0;
  double gpu_miss_seconds = 0;  // GPU time of the pool's copies of missed experts
  // The CPU expert lane (--cpu-experts): pool misses computed on the CPU instead of copied up (not in gpu_misses).
  uint64_t gpu_cpu_experts = 0, gpu_cpu_rows = 0;
  double gpu_cpu_seconds = 0;
  uint64_t sweeps = 0;          // prefill sweeps (EngineOptions::n_sweep) run
  uint64_t sweep_pauses = 0;    // ... stopped midway by a sync progress hook (the server: another request's turn)
  uint64_t gpu_lookups() const { return gpu_hits + gpu_misses + gpu_cpu_experts; }

  // Sums the counters of two periods (`store` and `streamed` are taken from `other`).
  ExpertStats& operator+=(const ExpertStats& other);
};

// Where each routed expert is and how often it was used: the web UI's expert map. Empty for dense models.
struct ExpertMap {
  // kRam: in the streamed cache; kResident: mapped (CPU) or uploaded (GPU); kGpu: in the GPU expert pool now
  enum Tier : uint8_t { kDisk = 0, kRam = 1, kResident = 2, kGpu = 3 };
  int64_t n_layer = 0, n_expert = 0;
  std::vector<uint8_t> tier;   // [n_layer * n_expert]
  std::vector<uint64_t> uses;  // [n_layer * n_expert]: times a token was routed to it since load
};

// What one decode token reads from memory (bench's bandwidth columns): every weight but the routed experts in full (of
// the token embedding one row, unless it is also the output head), n_expert_used routed experts in every MoE layer,
// and K and V of every cached row it attends to.
struct DecodeBytes {
  uint64_t weights = 0;     // the weights other than routed experts that a token reads
  uint64_t experts = 0;     // its routed experts
  uint64_t kv_per_row = 0;  // K and V of one cached token, all layers
  int64_t window = 0;       // > 0: a token attends to at most this many rows
  // All of it for a token that attends `rows` cached rows (its own included).
  double at(double rows) const;
};

struct ModelInfo {
  std::string path;
  std::string architecture;
  std::string name;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  uint64_t n_params = 0;
  uint64_t file_bytes = 0;
  bool has_tokenizer = false;
  std::string chat_template;  // empty when the file has none
  std::string bos_token, eos_token;  // their text (empty when the tokenizer has none), for chat templates
  bool adds_bos = false;             // tokenize() puts the BOS token before every text (tokenizer.ggml.add_bos_token)
  int64_t max_token_bytes = 0;       // the longest token's text (a text of N bytes is at least N / 3 / this tokens)
};

class Session;
class Detokenizer;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> load(const std::string& path, const EngineOptions& options);
  ~Engine();
  // The memory plan chosen at load, as printed at start (several lines; empty for dense models).
  const std::string& memory_plan() const;
  // "cpu" or "cuda" (the device chosen at load).
  const char* device() const;
  // Why the model runs on the CPU although a usable GPU is present (--device auto); empty otherwise.
  const std::string& gpu_unused() const;
  // Why the context is shorter than the model's (a default reduced to fit memory: EngineOptions::n_ctx 0); "" if not.
  const std::string& context_note() const;
  ExpertStats expert_stats() const;
  // The same per layer ([n_layer]; layers without routed experts stay zero); empty when resident.
  std::vector<ExpertStats> expert_layer_stats() const;
  void reset_expert_stats();
  // Thread-safe. `settle`: first waits for the blocks being saved in the background (at most a couple of block
  // writes), so that they count; without it, blocks still being written are not counted yet.
  KvDiskStats kv_disk_stats(bool settle = true) const;
  // Like expert_stats(): not while a forward pass runs (the server's worker takes it between steps).
  ExpertMap expert_map() const;

  const ModelInfo& info() const;
  DecodeBytes decode_bytes() const;
  // The peak bandwidth (bytes/s) of the GPU's memory when the model runs there (its memory clock and bus width: the
  // roofline of a resident decode); 0 on the CPU or when the driver does not report it.
  double peak_bandwidth() const;
  const EngineOptions& options() const;  // with defaults resolved (n_threads, n_ctx)
  double load_seconds() const;

  // Tokenizer. Fail when the model has none. `parse_special`: special-token text in `text` becomes the
  // special token (for rendered chat templates); otherwise it is tokenized as plain text (user input).
  Result<std::vector<int32_t>> tokenize(std::string_view text, bool parse_special) const;
  std::string detokenize(std::span<const int32_t> ids) const;
  bool is_end_of_generation(int32_t id) const;  // EOS, EOT, <|im_end|>, ...
  std::unique_ptr<Detokenizer> new_detokenizer() const;
  // The raw bytes one token adds to the text (possibly part of a UTF-8 sequence), for token filters; empty for
  // control tokens (<|im_end|>, ...), ids outside the vocabulary and models without a tokenizer.
  std::string_view token_bytes(int32_t id) const;

  Result<std::unique_ptr<Session>> new_session();
  // Host memory one more session takes (its KV cache for options().n_ctx, and on the CPU its scratch), and how many
  // such sessions besides the first fit: the ones the memory plan made room for (EngineOptions::n_sessions) and those
  // the memory left beyond the planner's reserve takes (the server's --parallel default); on the GPU also in its free
  // memory (each session's KV lives there too).
  uint64_t session_bytes() const;
  Result<int64_t> sessions_that_fit() const;
  // The decode steps of several sessions in one forward pass (per n_batch sessions), so concurrent sessions read
  // the weights once, not once each: appends ids[i] to sessions[i] and computes them. Each session's logits()
  // becomes that of its new token, bit-identical to sessions[i]->step(ids[i]). Every id and context is checked
  // first: a bad one fails naming the session's index and changes no session. Sessions must be distinct and
  // come from this engine. Not thread-safe (like a Session: one thread computes).
  Status step(std::span<Session* const> sessions, std::span<const int32_t> ids);

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class Logits { kLast, kAll };

// Session::sync's progress hook: called after each forward chunk (at most EngineOptions::n_batch tokens), within a
// prefill sweep after each of its steps (one layer of one chunk), and between the disk KV blocks a restore loads
// (when more follow), with the tokens this call has computed or restored so far (a sweep's share in proportion to its
// steps) and the number it has to compute or restore. Returning false stops the prefill (or the restore).
using SyncProgress = std::function<bool(int64_t done, int64_t total)>;

struct SessionStats {
  int64_t prefill_tokens = 0;   // tokens computed by sync() calls that computed more than one token
  double prefill_seconds = 0;
  int64_t decode_tokens = 0;  // tokens computed one at a time (step()), and the drafts of step(id, drafts) kept
  double decode_seconds = 0;
  int64_t draft_tokens = 0;     // drafts computed by step(id, drafts)
  int64_t drafts_accepted = 0;  // ... of them kept: not dropped by rewind() or by a sync() to another timeline
  int64_t reused_tokens = 0;    // tokens kept from the previous timeline by sync()
  int64_t restored_tokens = 0;  // tokens sync() loaded from disk KV checkpoints instead of computing
};

class Session {
 public:
  ~Session();
  // Makes the timeline equal `tokens`: keeps the longest common prefix with the current one, computes the
  // rest (always at least the last token, so logits() is that of tokens.back()). Fails (and leaves the
  // session empty) when tokens is empty, longer than n_ctx(), or holds ids outside the vocabulary.
  // Logits::kAll keeps the logits of every position computed by this call (see all_logits()): every position after
  // the prefix kept from the current timeline (none is restored from the disk KV, which holds no logits).
  // `progress`, when set, is called after every chunk (ceil(to compute / n_batch) times), every step of a prefill
  // sweep and every restored disk KV block but the last, with increasing `done`. Returning false before the last chunk
  // stops there: sync fails with "cancelled", and the timeline becomes the prefix whose KV was computed or restored
  // (tokens() tells how far it got), so a later sync reuses
  // it; logits() and all_logits() are then meaningless until the next successful sync. A sweep stopped midway keeps
  // its place: a later sync whose timeline extends tokens() with the sweep's tokens continues it. Other sessions may
  // compute in between; on a model that holds only one sweep (the GPU tier), another session's prompt goes chunk by
  // chunk in the call that finds the sweep paused, and a later call that finds it still paused (not continued in
  // between) replaces it. Returning false after the last chunk has no effect. A failing forward pass likewise leaves
  // the computed prefix as the timeline.
  Status sync(std::span<const int32_t> tokens, Logits mode = Logits::kLast, const SyncProgress& progress = {});
  // Forgets the timeline (the next sync computes everything).
  void clear();
  // Appends one token and computes it: sync(tokens() + id) without re-scanning the prefix.
  Status step(int32_t id);
  // Speculative decoding: appends `id`, then `drafts` (guesses of the tokens that follow it, e.g. lookup_draft()),
  // and computes them in one forward pass. all_logits() then holds the rows of id and of every draft
  // (all_logits_first() is id's position): the caller samples the token after id from the first row, keeps the
  // draft that equals it and samples on from the next row, and drops the drafts after the first mismatch with
  // rewind(). Drafts never decide a token, so the text is what step() one token at a time makes wherever this
  // backend's logits of a few tokens in one pass equal those of single steps (the CPU's do, bit for bit). Empty
  // drafts: step(id). Fails like step() when the context has no room for id and every draft.
  Status step(int32_t id, std::span<const int32_t> drafts);
  // Shortens the timeline to its first n tokens (n <= tokens().size()); the KV rows after them are left for later
  // computations to overwrite. logits() becomes position n - 1's when the last computation kept its row
  // (all_logits()), else it is meaningless until the next step or sync.
  void rewind(size_t n);

  std::span<const float> logits() const;      // [n_vocab] for the last position
  // [n_rows, n_vocab] for positions all_logits_first() .. tokens().size()-1 after sync(.., Logits::kAll)
  std::span<const float> all_logits() const;
  int64_t all_logits_first() const;
  const std::vector<int32_t>& tokens() const;
  int64_t n_ctx() const;
  int64_t n_vocab() const;
  const SessionStats& stats() const;
  // (op name, seconds) accumulated since the last reset_stats(), when EngineOptions::profile is on.
  std::vector<std::pair<std::string, double>> op_profile() const;
  // How often each (layer, expert) was chosen since the last reset_stats(): [n_layer][n_expert], when
  // EngineOptions::count_routing is on (empty otherwise, and for dense models).
  std::vector<std::vector<uint64_t>> expert_counts() const;
  void reset_stats();

  struct Impl;

 private:
  friend class Engine;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prompt lookup, the drafts of Session::step(id, drafts) that need no draft model. Of the sequence `tokens` then
// `next`: max_tokens tokens that follow the latest earlier occurrence of its longest suffix of kLookupNgramMin ..
// kLookupNgramMax tokens, as the sequence continues after it (and then as the copy itself does: a loop goes on
// with its period); empty when no such suffix occurs earlier. It pays where the output repeats its context (code an
// agent edits, quoted text, tool arguments). One pass over `tokens`. `match`, when given: the suffix's length.
inline constexpr int kLookupNgramMin = 2, kLookupNgramMax = 4;
// The most drafts a LookupDecoder step takes (--lookup's bound): more are rarely all right.
inline constexpr int kMaxLookupDrafts = 64;
std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, int32_t next, int64_t max_tokens,
                                  int* match = nullptr);

// A generation's decode loop over a session, with prompt lookup drafts (speculative decoding) or without:
//   sample `id` from logits() with history() (the timeline before the sampled position);
//   if the generation ends at id: end(); else if !accept(id): step(id, max_drafts) computes it (or the caller
//   computes it with others: Engine::step).
// A right guess is accepted without computing anything: its row was computed with the step that drafted it.
// Drafts cost compute (a token more in the forward pass, on a MoE model its experts), so step() drafts only as many
// of what lookup_draft() finds as pay: it keeps the chance that a draft is right (after a right one) for each length of
// the match that found it and the time a step with k drafts takes, both measured as it goes, and takes the number of
// drafts that maximizes the expected tokens per second (none when none beats a plain step). A chance that fell drifts
// back to its prior while the drafts go untried, so that a stretch of wrong guesses does not end drafting for good.
class LookupDecoder {
 public:
  // every_draft: every draft lookup_draft() finds, whatever they cost (tests; MAGNETAR_LOOKUP_EVERY_DRAFT=1 in the
  // environment does the same for every decoder: the server's and the CLI's).
  explicit LookupDecoder(Session& session, bool every_draft = false);
  std::span<const float> logits() const;
  // The timeline up to the position the next token is sampled from (without the drafts not confirmed yet).
  size_t committed() const;
  std::span<const int32_t> history() const;
  // The token sampled next is id: true when it is the current draft (nothing to compute; sample on), else the wrong
  // guesses are dropped (the session is rewound) and id must be computed.
  bool accept(int32_t id);
  // Computes id and, with max_drafts > 0, up to that many drafts by prompt lookup (at most kMaxLookupDrafts, and as
  // many as the context holds after id) in the same forward pass.
  Status step(int32_t id, int64_t max_drafts);
  // The generation ended: the drafts not confirmed leave the timeline.
  void end();

  // The policy, for tests: the number of drafts k (< cost.size()) that maximizes (1 + p + p^2 + ... + p^k) / cost[k],
  // a step's expected tokens over its time in plain steps (cost[0] = 1), for a chance p that a draft is right after a
  // right one; 0 when no number beats a plain step.
  static int64_t drafts_worth(std::span<const double> cost, double p);

 private:
  void learn(int64_t right, int64_t tried);
  static constexpr double kPrior[kLookupNgramMax + 1] = {0, 0, 0.5, 0.65, 0.8};  // by match length
  Session& session_;
  const bool every_draft_;
  std::vector<int32_t> drafts_;  // drafts_[row_] is the guess at the token sampled from all_logits()'s row row_
  size_t row_ = 0;
  // A draft's chance of being right after a right one, by the length of the match that found it (moving averages).
  std::array<double, kLookupNgramMax + 1> p_ = {0, 0, kPrior[2], kPrior[3], kPrior[4]};
  int match_ = 0;  // the current drafts' match length
  // A step's time with k drafts in plain steps (moving averages of the steps measured; 0: none yet). A k not
  // measured yet is taken as the next measured k below it plus 0.3 a draft (a GPU step leaves its few-token
  // kernels past some k: a measured jump stops the drafts there).
  std::array<double, kMaxLookupDrafts + 1> cost_{};
  // Steps taken with k drafts (k = 0: plain ones); the first of each k is not measured: a GPU's first launch of a shape
  // loads its kernels (milliseconds), and one such step would keep k from ever being tried again.
  std::array<uint32_t, kMaxLookupDrafts + 1> steps_{};
  double plain_seconds_ = 0;  // a plain step's time (a slow moving average that follows drops at once; 0: none yet)
};

// Turns a stream of token ids into text, never emitting an incomplete UTF-8 sequence.
class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  virtual std::string push(int32_t id) = 0;  // text completed by this token (may be empty)
  virtual std::string flush() = 0;           // what is still held back (invalid bytes as U+FFFD)
};

// ---- sampling ------------------------------------------------------------------------------------------------

struct SamplingParams {
  float temperature = 0.8f;   // 0: greedy
  int32_t top_k = 40;         // 0: off
  float top_p = 0.95f;        // 1: off
  float min_p = 0.05f;        // 0: off
  float repeat_penalty = 1.0f;  // 1: off; divides positive / multiplies negative logits of recent tokens
  float presence_penalty = 0.0f;   // subtracted once from the logit of each token in the window
  float frequency_penalty = 0.0f;  // subtracted per occurrence of the token in the window (OpenAI's semantics)
  int32_t penalty_last_n = 64;     // the window: the last N tokens of the history (-1: all; 0: no penalties)
  int64_t seed = -1;               // the random generator's seed; negative: a random one
  // Added to the (penalized) logits of these token ids (OpenAI's logit_bias: -100 bans, +100 forces in practice).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
};

// Constrained sampling (structured output): says whether a candidate token may come next. Called for candidates
// in the sampler's order until one is allowed, so it should be cheap (the server's tests the token's bytes
// against a JSON prefix validator).
using TokenFilter = std::function<bool(int32_t id)>;

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from logits [n_vocab] given the tokens so far (for the penalties).
  // With `allow`, the pick is restricted to allowed tokens: greedy takes the best allowed one; temperature
  // sampling draws among the allowed tokens that survive top-k / top-p / min-p and, when none does, takes the
  // best allowed token of the rest. Without it (or when the unrestricted pick is allowed, in greedy mode) the
  // result is the unconstrained one. Returns -1 when no token of the vocabulary is allowed.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, const TokenFilter& allow = {});
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // scratch, reused across calls: (logit, id)
  std::vector<std::pair<float, int32_t>> penalized_;   // (penalized logit, id) of the penalty window's tokens and
                                                       // the biased ones, one entry per id
  std::vector<uint8_t> skip_;                          // scratch, all zero between calls: penalized_'s ids marked
  std::vector<float> work_;                            // without top-k: every token's penalized logit
  // The penalty window's token counts, kept from call to call while the history only grows (a generation appends
  // one token a step): counted_ is the history they were made from, its tokens [count_begin_, end) counted. A
  // history that does not extend counted_ is counted afresh.
  void count_window(std::span<const int32_t> history, size_t begin);
  std::vector<int32_t> counted_;
  size_t count_begin_ = 0;
  std::unordered_map<int32_t, int> counts_;
};

}  // namespace magnetar
