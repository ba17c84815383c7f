// The seam between the engine and an architecture (STYLE.md rule 2): an architecture binds its weights
// once at load (typed structs, every mismatch named) and implements forward() over a batch of tokens of one
// sequence. It knows nothing about sessions, prompts or sampling; the engine knows nothing about tensors.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/threadpool.h"
#include "base/check.h"
#include "base/status.h"
#include "experts/source.h"
#include "gguf/reader.h"
#include "kv/kv_cache.h"

namespace magnetar::models {

// Hyper-parameters every decoder-only architecture reports (the engine sizes sessions from them).
struct HParams {
  std::string arch;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t n_expert = 0;       // 0 for dense models
  int64_t n_expert_used = 0;
  int64_t n_ff = 0;           // dense FFN width (0 when every layer is MoE)
  int64_t n_ff_exp = 0;       // expert FFN width
  int64_t sliding_window = 0; // 0: full attention
  float rope_theta = 10000.0f;
  float rms_eps = 1e-6f;
  bool norm_topk_prob = true;
};

// Per-session scratch of one architecture, sized for at most `n_batch` tokens per forward call.
class Workspace {
 public:
  virtual ~Workspace() = default;
  // Host memory of n_vocab floats for a sequence's logits (ForwardArgs::seq_logits) that the model fills fastest (a
  // GPU model's page-locked row: its device-to-host copy lands there), or empty where any memory does as well. Valid
  // while the workspace lives.
  virtual std::span<float> logits_row() { return {}; }
};

// Where forward() spends its time, by op (a diagnostic: `magnetar bench --profile`). Wall-clock seconds,
// accumulated; each op is one or more parallel regions that finish before the next starts.
// The CUDA backend queues a whole forward pass before waiting for it: it reports kEmbed (the host's embedding rows),
// kDevice (the GPU's time from the first queued operation to the last, from events) and kHost (the rest of the
// call's wall time: queueing or the graph's launch, waiting for the device to finish, copying the logits out).
enum class Op { kEmbed, kNorm, kQkv, kRope, kAttention, kAttnOut, kRouter, kExpertsGateUp, kExpertsDown,
                kExpertsOther, kExpertsWait, kDenseFfn, kLmHead, kDevice, kHost, kCount };
const char* op_name(Op op);

struct Profile {
  double seconds[int(Op::kCount)] = {};
};

// Times one op into a Profile when profiling is on (a null profile costs one branch).
class OpTimer {
 public:
  OpTimer(Profile* profile, Op op) : profile_(profile), op_(op) {
    if (profile_) start_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (profile_) {
      profile_->seconds[int(op_)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
  }

 private:
  Profile* profile_;
  Op op_;
  std::chrono::steady_clock::time_point start_;
};

// How often each routed expert was chosen: counts[layer * n_expert + expert] (layers without experts stay 0).
// The popularity census of the expert store and `synth --check` read it.
struct RoutingCounts {
  int64_t n_expert = 0;
  std::vector<uint64_t> counts;
};

// One sequence's share of a forward pass: the KV cache its tokens extend and the position of its first token
// (KV rows 0..pos0-1 of `kv` are valid).
struct SeqSpan {
  kv::KvCache* kv = nullptr;
  int64_t pos0 = 0;
  int64_t n_tok = 0;
};

// A prefill sweep's progress in steps: the embeddings, then one step per (layer, n_batch-token chunk) layer by layer,
// then the head (steps = 2 + n_layer * chunks, set by the model at the first call; 0 before it).
struct SweepCursor {
  int64_t step = 0, steps = 0;
  // Sets steps at a sweep's first call, checks them at a continuing one.
  void begin(int64_t n_layer, int64_t chunks) {
    if (steps == 0) steps = 2 + n_layer * chunks;
    MAGNETAR_CHECK(steps == 2 + n_layer * chunks && step < steps);
  }
  bool at_embeddings() const { return step == 0; }
  bool at_head() const { return step == steps - 1; }
  // A layer step's layer and chunk index.
  int64_t layer(int64_t chunks) const { return (step - 1) / chunks; }
  int64_t chunk(int64_t chunks) const { return (step - 1) % chunks; }
};

// A forward pass over one or more sequences (several: the decode steps of concurrent sessions, so the weights
// are read once for all of them). Every token's result is bit-identical to computing its sequence alone.
struct ForwardArgs {
  const int32_t* tokens = nullptr;  // [n_tok]: the sequences' tokens, one sequence after the other
  int64_t n_tok = 0;
  std::span<const SeqSpan> seqs;    // their n_tok sum to n_tok
  bool all_logits = false;          // logits of every token, else of each sequence's last token
  float* logits = nullptr;          // [all_logits ? n_tok : seqs.size(), n_vocab]
  // Instead of `logits` (then unused), when not all_logits: sequence i's row of n_vocab floats goes to seq_logits[i]
  // (sessions' own rows: a GPU model's copies land in each directly, Workspace::logits_row).
  std::span<float* const> seq_logits = {};
  Profile* profile = nullptr;       // non-null: accumulate time per op
  RoutingCounts* routing = nullptr; // non-null: count expert selections (sized n_layer * n_expert)
  experts::ExpertSource* experts = nullptr;  // routed experts from here (null: the model's own mapping)
  bool prefetch = false;            // hint the next MoE layer's likely experts to `experts`
  // A prefill sweep (Model::sweep_tokens) in steps: where it stands (null: the whole sweep in this call), and a hook
  // asked after every step but the last. Its true ends the call there (OK, *sweep at the next step); a later call with
  // the same arguments and cursor continues the sweep, and other calls may come in between (but no other sweep when
  // the model keeps a sweep's state itself: Model::sweep_state_in_model).
  SweepCursor* sweep = nullptr;
  const std::function<bool()>* pause = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const HParams& hparams() const = 0;
  // Scratch for forward() calls of at most n_batch tokens over a KV cache of n_ctx positions.
  virtual std::unique_ptr<Workspace> make_workspace(int64_t n_batch, int64_t n_ctx, int n_threads) const = 0;
  // Computes the tokens, appends each sequence's K/V to its cache at rows pos0.., writes logits. Fails only when
  // the expert source does (a read error names the file).
  virtual Status forward(cpu::ThreadPool& pool, Workspace& ws, const ForwardArgs& args) const = 0;
  // Where the routed experts live in the file (null for dense models).
  virtual const experts::ExpertLayout* expert_layout() const { return nullptr; }
  // Tokens of one sequence that one forward() call may take when that is more than the workspace's n_batch (0: no
  // more). Such a call is a prefill sweep: the model runs the prompt layer by layer, each layer over n_batch-token
  // chunks from the first token, so that a layer's streamed experts are brought in once for all the chunks instead
  // of once per chunk. Its logits and KV are bit for bit those of one call per chunk.
  virtual int64_t sweep_tokens() const { return 0; }
  // Whether a paused sweep's state (ForwardArgs::pause) lives in the model, so that only one sweep can be in flight
  // at a time, rather than in the workspace.
  virtual bool sweep_state_in_model() const { return false; }

  // A GPU expert tier's counters since load or the last reset (all zero without one).
  struct GpuTierStats {
    uint64_t slots = 0, slot_bytes = 0;
    uint64_t hits = 0, misses = 0, evictions = 0, bytes_h2d = 0;
    double h2d_seconds = 0;  // GPU time of the pool's copies (CUDA events around each layer's copies)
    uint64_t cpu_experts = 0, cpu_rows = 0;  // CPU lane: experts (per layer call) and rows computed there
    double cpu_seconds = 0;                  // wall time of the CPU lane (runs while the GPU computes)
  };
  virtual GpuTierStats gpu_tier_stats() const { return {}; }
  // [n_layer * n_expert]: 1 where the expert is in the GPU pool now (empty without one).
  virtual std::vector<uint8_t> gpu_cached() const { return {}; }
  virtual void reset_gpu_tier_stats() {}
  // A GPU tier copies experts from `source`'s host memory (ExpertSource::host_memory); the model may page-lock
  // it for the copies. Called with null before the source goes away, so the model lets go of it first.
  virtual Status attach_host_experts(experts::ExpertSource* /*source*/) { return Status(); }
};

// How a model is put on the CUDA device (Architecture::load_cuda).
struct CudaLoad {
  int64_t n_batch = 512;           // scratch for forward calls of up to this many tokens
  uint64_t expert_pool_bytes = 0;  // 0: every weight on the device; > 0: the routed experts tiered (below)
  bool cpu_experts = false;        // tiered: cold experts that miss the pool are computed on the CPU (the lane)
  std::string policy = "lfu";      // tiered: the pool's eviction (experts::make_policy: lfu, lru)
  quant::Type kv_type =
      quant::Type::F16;  // the sessions' KV caches (F16, or Q8_0 / F8_E4M3 where the kernels take the shape)
  // Tiered: the longest prefill sweep (Model::sweep_tokens; a multiple of n_batch, 0: none). Its residual stream
  // takes sweep_bytes(n_embd, sweep_tokens) of device memory.
  int64_t sweep_tokens = 0;
  static uint64_t sweep_bytes(int64_t n_embd, int64_t tokens) { return uint64_t(tokens) * uint64_t(n_embd) * 8; }
};

// One row per architecture (models/registry.cpp).
struct Architecture {
  const char* name;  // general.architecture
  Result<std::unique_ptr<Model>> (*load)(const gguf::Model& file);
  // Loads the model onto the CUDA device, with scratch for forward calls of up to n_batch tokens: every weight
  // when expert_pool_bytes is 0, else every weight but the routed experts, which then come from the forward
  // call's ExpertSource (or the mapped file) through a device pool of that many bytes, and with cpu_experts
  // the cold ones that miss it are computed on the CPU from host memory instead of copied up. Null when the
  // architecture has no CUDA forward pass or this build no CUDA backend.
  Result<std::unique_ptr<Model>> (*load_cuda)(const gguf::Model& file, const CudaLoad& options);
};

// The first CUDA device: absent when this build has no CUDA backend or the machine no GPU.
struct GpuInfo {
  bool present = false;
  std::string name;
  uint64_t free_bytes = 0, total_bytes = 0;
  double peak_bytes_per_s = 0;  // memory bandwidth (cuda::DeviceInfo), 0 when not reported
};
GpuInfo gpu_info();

// nullptr when `arch` is unknown.
const Architecture* find_architecture(const std::string& arch);
// "qwen3, qwen3moe" for error messages.
std::string supported_architectures();

}  // namespace magnetar::models
