// Qwen3 / Qwen3-MoE on a CUDA device: the model class (defined in qwen3_moe_cuda.cpp and, for the GPU expert tier and
// prefill sweeps, qwen3_moe_tier_cuda.cpp). The same weights binding (weights.h) and the same math as the CPU forward
// pass (qwen3_moe.cpp), op for op through backends/cuda. Everything is resident in device memory: the weights
// (uploaded at load), the activations and scratch (sized at load for n_batch tokens, so no forward call
// allocates except a new session's first one, which gives its KV cache a device mirror) and each session's KV.
//
// Per layer: rms_norm (fused with the previous residual add), q/k/v matvecs from one quantized input, q/k norm
// + RoPE and the KV store (one launch; F16, Q8_0 or FP8 KV: CudaLoad::kv_type), attention (a Q8_0 or FP8 cache read
// directly by decode, through an F16 copy of the attended rows by prefill), output projection, add + norm, then the
// router (matvec, softmax top-k on the device) and the experts as grouped launches: every (token, slot) row carries its
// expert's device pointers (cuda::GroupItem). Decode (at most kMaxMatvecVectors tokens) builds those items on the
// device from the router's ids; a prefill chunk downloads the ids once per layer and groups rows by expert on the
// host.
// Products of more than kMaxMatvecVectors rows (prefill's projections and each expert's group of rows) run on
// the int8 tensor-core kernel (cuda::matmul_q / grouped_matmul_q) when it takes the weight type, else as
// matrix-vector launches of up to 8 rows.
//
// The host KV cache stays the session's official copy (disk checkpoints read it): the device holds a mirror
// (DeviceKv) and kv::KvCache tracks which rows of which copy are current; rows are copied only when a disk
// restore wrote the host or a checkpoint reads it.
//
// Tiered mode (load_qwen3_cuda with expert_pool_bytes > 0, for models whose experts do not fit the device):
// the routed experts stay in host memory (the engine's RAM expert store, which streams from disk, or the mapped
// file) and a device pool of fixed slots caches some (a miss evicts the lowest-scored expert of the pool's
// experts::CachePolicy, lru or lfu; the current layer's experts are pinned). Misses are copied up on a stream of
// their own (copy_stream_), at bus speed when the RAM store's slots are page-locked (attach_host_experts), while
// the layer's hits compute; the misses' rows come last (group_rows_on_host) and their launches wait for the copies.
// The same kernels compute the same rows, so the logits are bit-identical to the resident mode.
//
// The CPU expert lane (CudaLoad::cpu_experts, tiered mode): a miss with few rows (at most kCpuLaneMaxRows: decode's,
// or a prefill chunk's rarely routed experts) that the policy scores no higher than the pool's lowest-scored expert
// (before this use) may be left in host memory (as many as experts::LaneBalance gives the lane); its group item
// carries null pointers (the GPU skips it), the CPU computes its rows from host memory with the CPU backend's kernels
// while the GPU computes the others, and the rows are uploaded before the combine. Those rows carry the CPU
// kernels' rounding (not bit-identical).
//
// Decode steps with every weight resident replay a CUDA graph of the whole pass (decode_graph): the token's
// position is read on the device (KV store row, attention's length and split plan), the embeddings and positions
// come up from fixed pinned buffers, so one capture serves every later step of the same sequences; the logits go
// down after it, into the sessions' own pinned rows (ForwardArgs::seq_logits, CudaWorkspace).
//
// Not here yet (issue #6): disk reads pipelined into the copies expert by expert (the misses already in host memory
// are copied first, those read from disk once all of them have landed), per-op profiles (Session::op_profile gets
// the device and host spans only).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cpu/ops.h"
#include "backends/cuda/cuda_backend.h"
#include "experts/layout.h"
#include "experts/policy.h"
#include "experts/source.h"
#include "models/model.h"
#include "models/qwen3_moe/cuda_switches.h"
#include "models/qwen3_moe/qwen3_moe.h"
#include "models/qwen3_moe/weights.h"

namespace magnetar::models::qwen3_cuda {

using cuda::DeviceBuffer;
using cuda::GroupItem;
using qwen3::Layer;

constexpr int64_t kVec = cuda::kMaxMatvecVectors;
constexpr int64_t kSeqs = cuda::kMaxDecodeSeqs;  // sequences of one decode attention launch


// A weight matrix in device memory: [rows, row_size(type, cols)] (ggml's ne[1] x ne[0]).
struct DevTensor {
  const void* p = nullptr;
  quant::Type type = quant::Type::F32;
  int64_t rows = 0, cols = 0;
  const float* f32() const { return static_cast<const float*>(p); }
};

struct DevLayer {
  int64_t window = 0;
  DevTensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm;
  DevTensor wqkv;  // wq, wk, wv as one matrix when they share type and width (upload_qkv); p null otherwise
  DevTensor gate_inp, ffn_gate, ffn_up, ffn_down;
  bool moe = false;
  quant::Type exp_type = quant::Type::F32, down_type = quant::Type::F32;
  const void* const* table = nullptr;  // device: [n_expert * 3] gate, up, down pointers
  std::vector<const void*> host_table; // the same pointers, for prefill grouping on the host
  // The same as one buffer: expert e's part p at expert_base + e * expert_stride + part_offset[p] (routes_in_products).
  const void* expert_base = nullptr;
  size_t expert_stride = 0;
  size_t part_offset[3] = {0, 0, 0};
};

// A session's KV cache on the device: per layer K and V, [n_ctx, n_head_kv * head_dim] in the host cache's type (F16,
// Q8_0 or F8_E4M3), byte for byte the host's layout.
class DeviceKv final : public kv::KvCache::Mirror {
 public:
  std::vector<DeviceBuffer> k, v;
  size_t row_bytes = 0;
  uint64_t id = 0;  // unique per mirror made by this process: the decode graphs' key (an address may be reused)
  void download(kv::KvCache& cache, int64_t from, int64_t to) override {
    const size_t off = size_t(from) * row_bytes, n = size_t(to - from) * row_bytes;
    for (size_t l = 0; l < k.size(); ++l) {
      MAGNETAR_CHECK(k[l].download(static_cast<uint8_t*>(cache.k(int64_t(l))) + off, n, off).ok());
      MAGNETAR_CHECK(v[l].download(static_cast<uint8_t*>(cache.v(int64_t(l))) + off, n, off).ok());
    }
  }
};

// A session's page-locked logits row (Workspace::logits_row): the decode step's device-to-host copy lands there, so
// no host copy of the 608 KB of a 151,936-token vocabulary sits between one step and the next (~54 us per token on
// the H200's host). Empty where the allocation fails: the session's row is then ordinary memory, which the driver
// copies into through its own staging.
class CudaWorkspace : public Workspace {
 public:
  explicit CudaWorkspace(int64_t n_vocab) {
    if (!logits_row_enabled()) return;
    Result<cuda::PinnedBuffer> row = cuda::PinnedBuffer::allocate(size_t(n_vocab) * sizeof(float));
    if (row.ok()) row_ = std::move(row).value();
  }
  std::span<float> logits_row() override { return {row_.as<float>(), row_.size() / sizeof(float)}; }

 private:
  cuda::PinnedBuffer row_;
};

class Qwen3Cuda final : public Model {
 public:
  Qwen3Cuda(Qwen3Bound bound, const gguf::Model& file, const CudaLoad& o)
      : hp_(std::move(bound.hp)), w_(std::move(bound.w)), layout_(std::move(bound.layout)), file_(file),
        n_batch_(o.n_batch), sweep_tokens_(o.expert_pool_bytes > 0 ? o.sweep_tokens : 0), kv_type_(o.kv_type),
        pool_bytes_(o.expert_pool_bytes), policy_name_(o.policy), cpu_lane_(o.cpu_experts && o.expert_pool_bytes > 0) {}
  Status init();

  const HParams& hparams() const override { return hp_; }
  std::unique_ptr<Workspace> make_workspace(int64_t n_batch, int64_t, int) const override {
    MAGNETAR_CHECK(n_batch <= n_batch_);
    return std::make_unique<CudaWorkspace>(hp_.n_vocab);
  }
  Status forward(cpu::ThreadPool& pool, Workspace& ws, const ForwardArgs& args) const override;
  const experts::ExpertLayout* expert_layout() const override { return layout_.get(); }
  int64_t sweep_tokens() const override { return sweep_tokens_; }
  bool sweep_state_in_model() const override { return true; }  // sweep_x_, sweep_p_
  GpuTierStats gpu_tier_stats() const override { return tier_stats_; }
  std::vector<uint8_t> gpu_cached() const override {
    std::vector<uint8_t> out(slot_of_.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = slot_of_[i] >= 0;
    return out;
  }
  void reset_gpu_tier_stats() override {
    const uint64_t slots = tier_stats_.slots;
    tier_stats_ = {};
    tier_stats_.slots = slots;
  }
  Status attach_host_experts(experts::ExpertSource* source) override {
    host_registration_ = {};
    if (source == nullptr || pool_bytes_ == 0 || source->host_memory().empty()) return Status();
    const std::span<uint8_t> m = source->host_memory();
    MAGNETAR_ASSIGN_OR_RETURN(host_registration_, cuda::HostRegistration::create(m.data(), m.size()));
    return Status();
  }

 private:
  Result<DevTensor> upload(const Tensor& t);
  Status upload_qkv(const Layer& L, DevLayer& d);
  Result<DeviceBuffer> device_buffer(size_t bytes);
  // y [n, W.rows] = W x [n, W.cols]; quantized weights read x quantized in the matrix's activation format
  // (xq: already done by the caller, else quantized here into q_in_).
  Status linear(const DevTensor& W, const float* x, float* y, int64_t n, const void* xq = nullptr) const;
  const void* quantize(quant::Type weight_type, const float* x, int64_t cols, int64_t n, void* out) const;
  // xn_ quantized for weight_type's products, in q_exp_: by the norm that wrote xn_ (xn_act_), else here.
  const void* quantize_xn(quant::Type weight_type, int64_t n) const;
  // xn_ = norm(x += proj_) with `weight` (x: the residual stream, x_ or x2_), or with `combine` norm(x += the MoE
  // combine of down_'s rows, which the MoE layer before left uncombined: combine_in_norm); when the products reading
  // xn_ quantize it (for `next`, the type of their weights; F32: none or not shared), the norm writes q_exp_ too.
  Status add_norm(float* x, const float* weight, quant::Type next, int64_t n, bool combine = false) const;
  // Decode's norm before an MoE layer inside its router's product (norm_router()): x_out = x + proj_, xn_ (and
  // q_exp_ for the experts) = norm(x_out), router_ = the router's logits. Whether it applies: norm_in_router.
  bool norm_in_router(const DevLayer& L, int64_t n) const;
  Status add_norm_router(const DevLayer& L, float* x, float* x_out) const;
  // Whether an MoE layer leaves its expert rows for the next add_norm to combine (Fusion::kCombine); not in a sweep,
  // whose chunks keep only x and proj_ between layers (the same bits: add_rms_norm adds moe_combine's sum).
  bool combine_in_norm() const { return fused(Fusion::kCombine) && hp_.n_expert_used <= 64 && !sweeping_; }
  // Every expert resident and a decode-sized batch: route_topk builds the expert launches' items on the device (one
  // token: the products route themselves, route_in_products()) and no layer's ids come to the host during the pass;
  // forward() reads all layers' back at the end (copy_routes_back) when it counts routing. A copy inside the pass
  // would stall the launches behind it (~10 us per layer).
  bool routes_on_device(int64_t n) const { return n <= kVec && pool_bytes_ == 0; }
  void copy_routes_back(const ForwardArgs& args, int64_t n) const {
    if (args.routing == nullptr || !routes_on_device(n)) return;
    stream_.copy(h_ids_.as<int32_t>(), ids_.as<int32_t>(), size_t(hp_.n_layer * n * hp_.n_expert_used) * 4);
  }
  // Whether n_tok > 1 tokens of one sequence, rows t0.. of the pass (a step with drafts), attend through the
  // several-sequences decode kernel, each token at its own position (attention_block); such a step alone in a pass
  // replays a decode graph (forward, draft_graphs_enabled).
  bool drafts_attend_as_decode(int64_t n_tok, int64_t t0) const;
  Status attention_block(const DevLayer& L, int64_t il, std::span<const SeqSpan> seqs,
                         std::span<DeviceKv* const> mirrors, int64_t n) const;
  // routed: router_ holds the layer's logits already (add_norm_router).
  Status moe_ffn(cpu::ThreadPool& pool, const DevLayer& L, int64_t il, int64_t n, const ForwardArgs& args,
                 bool routed) const;
  Status dense_ffn(const DevLayer& L, int64_t n) const;
  // gate = swiglu(gate, up) over [rows, cols]; returns gate quantized for down_type's product (into q_out; fused
  // with the swiglu when it can be), or null when down_type is not quantized.
  Result<const void*> swiglu_for(quant::Type down_type, float* gate, const float* up, int64_t rows, int64_t cols,
                                 void* q_out) const;
  Result<DeviceKv*> mirror_of(kv::KvCache& cache) const;
  // Queues the forward pass from the host input buffers (h_x_, h_positions_) up to the final norm; returns the
  // head's input rows (xn_, or each sequence's last row gathered) in *head_in.
  Status enqueue_layers(cpu::ThreadPool& pool, const ForwardArgs& args, int64_t n, const float** head_in) const;
  // Layer il over args' n tokens: the residual stream x (x_ or x2_: swapped with x_other by a norm inside the
  // router) and proj_ (the layer before's output, or with `combine` its MoE rows in down_) in, the same out.
  Status layer(cpu::ThreadPool& pool, const ForwardArgs& args, size_t il, int64_t n, float*& x, float*& x_other,
               bool& combine) const;
  // The tokens' positions (and a decode token's rotation table) into h_positions_, then queued up to positions_.
  void stage_positions(std::span<const SeqSpan> seqs) const;
  void upload_positions(std::span<const SeqSpan> seqs, int64_t n) const;
  // A prefill sweep (sweep_tokens): args' one sequence layer by layer over n_batch_-token chunks, each chunk's x and
  // proj_ kept in sweep_x_ / sweep_p_ between layers; in steps (ForwardArgs::sweep) when args pause it.
  Status sweep(cpu::ThreadPool& pool, const ForwardArgs& args) const;
  // The n tokens' embedding rows, dequantized on the host into the pinned h_x_ that the upload reads (the copy of
  // the call before must have read it); returns the seconds taken.
  double embed_on_host(const int32_t* tokens, int64_t n) const;
  // The logits' device-to-host copies: rows n0 .. n0 + rows - 1 of the head's output (at d_rows) straight into the
  // sequences' own rows (ForwardArgs::seq_logits: the sessions' page-locked rows, CudaWorkspace), or into h_logits_
  // and, after the wait, from there into ForwardArgs::logits (logits_out).
  void logits_down(const ForwardArgs& args, const float* d_rows, int64_t n0, int64_t rows) const;
  void logits_out(const ForwardArgs& args, int64_t n0, int64_t rows) const;
  // The LM head over `rows` normed rows at x (kVec a launch), waited for, into args' output rows out0 ...
  Status head(const ForwardArgs& args, const float* x, int64_t rows, int64_t out0) const;
  // A profiled forward call's time since t_call: the host's embedding rows, the device's span (device_start_ to
  // device_end_, both complete) and the rest.
  void add_profile(Profile& profile, std::chrono::steady_clock::time_point t_call, double embed_seconds) const;
  // Adds layer il's routing of n tokens (its ids on the host, h_ids_) to `counts`.
  void count_routes(RoutingCounts& counts, int64_t il, int64_t n) const;
  // The decode graph of args' batch shape, captured on first use (graphs_, least recently used evicted).
  Result<const cuda::Graph*> decode_graph(cpu::ThreadPool& pool, const ForwardArgs& args, int64_t n) const;
  // Tiered mode: the device pointers of `active`'s experts in the pool (pool_ptrs_), loading the misses from
  // `source`; with the CPU lane, the cold misses with at most kCpuLaneMaxRows rows (rows[e]) go to lane_ (null
  // pool pointers, host pointers in lane_ptrs_) instead. Leaves the layer acquired from `source` in held_.
  // `guess`: the next MoE layer's predicted experts (--prefetch), handed to source.prefetch between acquire and
  // wait. The copies are queued on copy_stream_ (those already in host memory before waiting for the others' reads;
  // the last batch ends with copy_end_[copy_batches_ - 1]), not waited for: held_ keeps the layer pinned until
  // settle_copies().
  Status pool_acquire(int64_t il, std::span<const int32_t> active, std::span<const int32_t> rows,
                      experts::ExpertSource& source, int64_t guess_layer, std::span<const int32_t> guess) const;
  // Waits for the last acquired layer's copies (at once when stream_, which waited for them, was synchronized), adds
  // their time to the tier's statistics and releases the layer in its source.
  void settle_copies() const;
  // The CPU lane: lane_'s rows (grouped order, expert_begin_/expert_rows_) computed on the CPU from h_xn_, uploaded
  // into down_.
  void run_cpu_lane(cpu::ThreadPool& pool, const DevLayer& L, int64_t n) const;
  // Items of up to item_rows rows grouped by expert (host), from ids already on the host; ptr(e) gives expert
  // e's weights. The experts in `late` (the pool's misses, still being copied) come after all others, their rows
  // and items last: the first *early.items items cover rows [0, *early.rows).
  struct Early {
    int64_t items = 0, rows = 0;
  };
  template <typename PtrOf>
  int64_t group_rows_on_host(const int32_t* h_ids, int64_t n, int32_t item_rows, PtrOf ptr_of, int64_t* max_n,
                             std::span<const int32_t> late, Early* early) const;

  HParams hp_;
  qwen3::Weights w_;
  std::unique_ptr<experts::ExpertLayout> layout_;
  const gguf::Model& file_;
  int64_t n_batch_;
  int64_t sweep_tokens_;  // the longest prefill sweep (0: none); its residual stream: sweep_x_, sweep_p_
  mutable DeviceBuffer sweep_x_, sweep_p_;
  mutable bool sweeping_ = false;
  mutable std::tuple<const kv::KvCache*, int64_t, int64_t> sweep_of_;  // the sweep in them: its cache, pos0, n_tok
  quant::Type kv_type_;                                                // the sessions' KV caches: F16, Q8_0 or F8_E4M3
  // Q8_0 and FP8 KV: K and V of the rows a prefill attends, as F16 (kv_to_f16), for the attention kernels that read
  // F16; rows for the longest session's context (mirror_of).
  mutable DeviceBuffer kv_f16_k_, kv_f16_v_;
  mutable int64_t kv_f16_rows_ = 0;

  std::vector<DeviceBuffer> owned_;  // every weight buffer
  std::vector<DevLayer> layers_;
  DevTensor output_norm_, head_;

  // Scratch, sized at load (forward calls never overlap: Engine's contract).
  mutable cuda::Stream stream_;
  mutable cuda::MatvecWorkspace mv_ws_;
  mutable cuda::AttentionWorkspace attn_ws_;
  // x2_: one row, the residual stream's other buffer (add_norm_router reads one and writes the other).
  mutable DeviceBuffer x_, x2_, xn_, proj_, qkv_, attn_, router_, ids_, weights_, gu_, down_, q_in_, q_exp_;
  // positions_ (h_positions_): the tokens' positions [n_batch_ int32], then from rope_at_ bytes the decode tokens'
  // rotation tables [n_batch_][head_dim] (cuda::rope_table: the attention launch's prepare reads them).
  mutable DeviceBuffer positions_, items_, x_rows_, slot_rows_, logits_;
  mutable cuda::PinnedBuffer h_x_, h_positions_, h_ids_, h_items_, h_logits_;
  size_t rope_at_ = 0;
  int64_t act_row_max_ = 0;  // bytes of the largest quantized activation row
  mutable quant::Type xn_act_ = quant::Type::F32;  // q_exp_ holds xn_ in this format (F32: nothing)

  // ---- the GPU expert tier (pool_bytes_ > 0): experts stay in host memory (the engine's RAM store, or the
  // mapped file) and some are cached in fixed device slots (policy_ decides), the current layer's pinned.
  uint64_t pool_bytes_ = 0;
  std::string policy_name_;
  std::unique_ptr<experts::MappedExperts> mapped_;  // the source when forward() gets none
  mutable DeviceBuffer pool_;
  cuda::HostRegistration host_registration_;  // the RAM store's slots, page-locked (attach_host_experts)
  size_t part_cap_[3] = {0, 0, 0};                 // bytes reserved per part in a slot
  size_t slot_bytes_ = 0;
  struct Slot {
    int32_t layer = -1, expert = -1;
    uint64_t last_use = 0;
  };
  mutable std::vector<Slot> slots_;
  mutable std::vector<int32_t> slot_of_;          // [n_layer * n_expert] -> slot, -1 when not in the pool
  mutable uint64_t tick_ = 0;                     // + 1 per MoE layer call
  std::unique_ptr<experts::CachePolicy> policy_;  // keys layer * n_expert + expert; a miss evicts the lowest score
  mutable std::vector<double> slot_score_;        // pool_acquire: each slot's score in this call
  mutable std::vector<const void*> pool_ptrs_;    // [n_expert * 3] of the layer being computed
  mutable std::vector<int32_t> active_, misses_, rows_of_, hits_;
  mutable std::vector<experts::ExpertPtrs> host_ptrs_;
  mutable std::vector<uint8_t> ready_;
  // The layer acquired last stays pinned in its source until the stream has synchronized after its copies (the
  // next MoE layer's routing readback, or the end of forward(): settle_copies); the copies are timed by events.
  mutable std::optional<experts::Pinned> held_;
  // The pool's copies run on their own stream, so that the layer's hits compute meanwhile (moe_ffn); stream_ waits
  // for the last copy_end_ before the misses' launches.
  mutable cuda::Stream copy_stream_;
  // The copies of the last acquired layer, in up to two batches (pool_acquire: the experts already in host memory,
  // then the ones read from disk), each between a start and an end event; the last end is what stream_ waits for.
  mutable cuda::Event copy_start_[2], copy_end_[2];
  // forward() with a profile: the span of its device work (Op::kDevice).
  mutable cuda::Event device_start_, device_end_;
  mutable int copy_batches_ = 0;
  // --prefetch (ForwardArgs::prefetch): the next MoE layer's router on this layer's input, its top-k ids on the host.
  mutable DeviceBuffer next_ids_, next_weights_;
  mutable cuda::PinnedBuffer h_next_ids_;
  mutable std::vector<int32_t> guess_;
  // group_rows_on_host's counting sort: expert e's rows are [expert_begin_[e], + expert_rows_[e]).
  mutable std::vector<int32_t> expert_begin_, expert_rows_, expert_fill_;
  mutable std::vector<uint8_t> late_;
  mutable std::vector<DeviceKv*> mirrors_;                    // forward(): each sequence's device KV
  mutable GpuTierStats tier_stats_;

  // ---- decode graphs (graphs_enabled()): the forward pass of a decode step, captured per batch shape -----------
  // The key: the routing copy on or off, then each sequence's mirror id in batch order (one token each, or the
  // tokens of one step with drafts), then each sequence's token count and the attention kernel of each token at its
  // length (cuda::attention_decode_variant).
  struct DecodeGraph {
    std::vector<uint64_t> key;
    cuda::Graph graph;
    uint64_t last_use = 0;
  };
  // A server's few live batch shapes and a lookup decoder's draft counts (--lookup up to kVec - 1 graphs); the least
  // recent goes.
  static constexpr size_t kMaxDecodeGraphs = 16;
  mutable std::vector<DecodeGraph> graphs_;
  mutable std::vector<uint64_t> graph_key_;
  mutable uint64_t graph_tick_ = 0;
  mutable uint64_t next_mirror_id_ = 1;
  // A capture failed: decode launches kernel by kernel for the next graph_pause_ steps (kGraphPause after each
  // failure).
  static constexpr int kGraphPause = 1024;
  mutable int graph_pause_ = 0;
  mutable bool graph_failure_said_ = false;

  // ---- the CPU expert lane (cpu_lane_: tiered mode with CudaLoad::cpu_experts) ----------------------------------
  // Experts with few rows only (decode's, or a prefill chunk's rarely routed ones): an expert with more rows is worth
  // the copy (the GPU then computes all of them at once).
  static constexpr int32_t kCpuLaneMaxRows = 4;
  bool cpu_lane_ = false;
  mutable std::vector<int32_t> lane_;                   // experts of the current layer computed on the CPU
  mutable std::vector<std::pair<double, int32_t>> cold_;  // pool_acquire: the lane's candidates, (score, expert)
  mutable std::vector<experts::ExpertPtrs> lane_ptrs_;  // their host weights
  mutable cuda::PinnedBuffer h_xn_, h_down_;            // [n_batch, E] the layer's normed input; [R, E] lane rows
  // h_xn_ is copied down only for a layer whose lane is not empty, after pool_acquire; run_cpu_lane waits for it.
  mutable cuda::Event h_xn_ready_;
  mutable std::vector<uint8_t> lane_xt_, lane_xg_, lane_h_;  // prepared input per token, per row; down input
  mutable std::vector<float> lane_gu_;                  // [2, R, F] gate then up
  mutable std::vector<cpu::MatmulJob> lane_jobs_;
  // How many of a layer's cold misses the lane takes (pool_acquire): run_cpu_lane's wall times against the copies'
  // (timed by their events in settle_copies); MAGNETAR_CUDA_LANE_BALANCE=0 gives it all of them.
  mutable experts::LaneBalance lane_balance_;
};

}  // namespace magnetar::models::qwen3_cuda
