// Qwen3 and Qwen3-MoE (llama.cpp architectures `qwen3` and `qwen3moe`): pre-norm decoder, GQA attention with
// per-head RMSNorm on Q and K and NeoX RoPE, then per layer either a SwiGLU FFN or a softmax-routed top-k
// mixture of SwiGLU experts (weights renormalized over the chosen k when norm_topk_prob). Checked against
// transformers' Qwen3MoeForCausalLM / Qwen3ForCausalLM by tests/golden.
#include "models/qwen3_moe/qwen3_moe.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "backends/cpu/kernels.h"
#include "backends/cpu/ops.h"
#include "experts/layout.h"
#include "experts/source.h"
#include "models/common/binder.h"
#include "models/model.h"
#include "models/qwen3_moe/weights.h"

namespace magnetar::models {
namespace {

using cpu::MatmulJob;
using cpu::PreparedInput;
using qwen3::Layer;
using qwen3::Weights;

// ---- workspace ----------------------------------------------------------------------------------------------

class Qwen3Workspace : public Workspace {
 public:
  int64_t n_batch = 0;
  int64_t n_ctx = 0;                                // the longest KV cache attn_scratch serves
  std::vector<float> x, xn, q, k, v, attn, proj;   // [n_batch, *]
  std::vector<float> router;                        // [n_batch, n_expert]
  std::vector<int32_t> top_ids, positions;          // [n_batch, k], [n_batch]
  std::vector<float> top_weights;                   // [n_batch, k]
  std::vector<int32_t> order_token, expert_begin;   // MoE grouping: row -> token, expert -> first row
  std::vector<int32_t> sort_idx, expert_fill;       // [n_expert] scratch of the router
  std::vector<MatmulJob> jobs;                      // [2 * n_expert]
  std::vector<float> row_weight;                    // row -> routing weight
  std::vector<float> gate, up, down;                // [n_batch * k, n_ff] / [n_batch * k, n_embd]
  std::vector<float> head_rows;                     // [sequences, n_vocab]: ForwardArgs::seq_logits of several
  std::vector<uint8_t> qa, qb;                      // prepared (quantized) activations
  std::vector<uint8_t> qd;                          // prepared inputs of the experts' down projections
  std::vector<int32_t> active;                      // distinct experts of the layer's tokens
  std::vector<experts::ExpertPtrs> ptrs;            // [n_expert] their weights
  std::vector<uint8_t> ready, mark;                 // [n_expert]
  std::vector<size_t> early, late;                  // indices into active: cached at acquire() / read since
  size_t gathered_row_bytes = 0;                    // rows of qa as moe_ffn gathered them for run_experts
  bool gathered_is_float = false;
  std::vector<float> attn_scratch;
  std::vector<float> sweep_x;         // a prefill sweep's residual stream [tokens, n_embd] (grown by the first sweep)
  Profile* profile = nullptr;         // of the forward() call in progress
  RoutingCounts* routing = nullptr;   // idem
  int64_t layer = 0;                  // idem: the layer being computed
};

class Qwen3Model final : public Model {
 public:
  Qwen3Model(HParams hp, Weights w, const gguf::Model& file, std::unique_ptr<experts::ExpertLayout> layout)
      : hp_(std::move(hp)), w_(std::move(w)), layout_(std::move(layout)) {
    if (layout_) mapped_ = std::make_unique<experts::MappedExperts>(file, *layout_);
  }
  const HParams& hparams() const override { return hp_; }
  std::unique_ptr<Workspace> make_workspace(int64_t n_batch, int64_t n_ctx, int n_threads) const override;
  Status forward(cpu::ThreadPool& pool, Workspace& ws, const ForwardArgs& args) const override;
  const experts::ExpertLayout* expert_layout() const override { return layout_.get(); }
  // Any length: a sweep's residual stream grows in the workspace (Qwen3Workspace::sweep_x).
  int64_t sweep_tokens() const override { return layout_ ? std::numeric_limits<int64_t>::max() : 0; }

 private:
  // The n tokens' embedding rows into out [n, n_embd].
  void embed(Qwen3Workspace& ws, const int32_t* tokens, int64_t n, float* out) const;
  // Layer il over the workspace's n tokens (ws.x in and out, ws.positions set).
  Status layer(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args, size_t il, int64_t n) const;
  // The final norm and the LM head over ws.x: args' logits (every token, or each sequence's last).
  void head(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args, int64_t n) const;
  // A prefill sweep (sweep_tokens): args' one sequence layer by layer in ws.n_batch-token chunks.
  Status sweep(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args) const;
  // Each sequence's tokens attend to its own KV cache.
  void attention_block(cpu::ThreadPool& pool, Qwen3Workspace& ws, std::span<const SeqSpan> seqs, const Layer& L,
                       int64_t il, int64_t n) const;
  void dense_ffn(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n) const;
  Status moe_ffn(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n, const ForwardArgs& args) const;
  void route(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n) const;
  void predict_next(cpu::ThreadPool& pool, Qwen3Workspace& ws, int64_t n, experts::ExpertSource& source) const;
  // gate/up, SwiGLU and down of the experts ws.active[i] for i in `which`, into ws.down rows.
  void run_experts(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, std::span<const size_t> which) const;

  HParams hp_;
  Weights w_;
  std::unique_ptr<experts::ExpertLayout> layout_;   // MoE models only
  std::unique_ptr<experts::MappedExperts> mapped_;  // the experts in place, when forward() gets no source
};

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

std::unique_ptr<Workspace> Qwen3Model::make_workspace(int64_t n_batch, int64_t n_ctx, int n_threads) const {
  auto ws = std::make_unique<Qwen3Workspace>();
  const size_t B = size_t(n_batch);
  const size_t q_dim = size_t(hp_.n_head * hp_.head_dim), kv_dim = size_t(hp_.n_head_kv * hp_.head_dim);
  const size_t k_used = size_t(std::max<int64_t>(1, hp_.n_expert_used));
  // FFN activations: MoE layers' B x k rows of n_ff_exp, dense layers' B rows of n_ff (Qwen3-MoE files carry an n_ff,
  // 8x n_ff_exp on Qwen3-30B-A3B, that no layer uses unless some are dense).
  const bool any_dense = std::any_of(w_.layers.begin(), w_.layers.end(), [](const Layer& L) { return !L.moe(); });
  const size_t ffn_floats =
      std::max(hp_.n_expert > 0 ? B * k_used * size_t(hp_.n_ff_exp) : 0, any_dense ? B * size_t(hp_.n_ff) : 0);
  ws->n_batch = n_batch;
  ws->n_ctx = n_ctx;
  ws->x.resize(B * size_t(hp_.n_embd));
  ws->xn.resize(B * size_t(hp_.n_embd));
  ws->proj.resize(B * size_t(hp_.n_embd));
  ws->q.resize(B * q_dim);
  ws->attn.resize(B * q_dim);
  ws->k.resize(B * kv_dim);
  ws->v.resize(B * kv_dim);
  ws->positions.resize(B);
  ws->attn_scratch.resize(cpu::attention_scratch_floats(n_ctx, hp_.n_head, hp_.n_head_kv, hp_.head_dim, n_threads));
  const size_t rows = hp_.n_expert > 0 ? B * k_used : B;  // FFN rows: one per (token, expert slot)
  ws->gate.resize(ffn_floats);
  ws->up.resize(ffn_floats);
  ws->down.resize(rows * size_t(hp_.n_embd));
  if (hp_.n_expert > 0) {
    ws->router.resize(B * size_t(hp_.n_expert));
    ws->top_ids.resize(B * k_used);
    ws->top_weights.resize(B * k_used);
    ws->order_token.resize(rows);
    ws->row_weight.resize(rows);
    ws->expert_begin.resize(size_t(hp_.n_expert) + 1);
    ws->sort_idx.resize(size_t(hp_.n_expert));
    ws->expert_fill.resize(size_t(hp_.n_expert));
    ws->jobs.reserve(size_t(2 * hp_.n_expert));
    ws->active.reserve(size_t(hp_.n_expert));
    ws->ptrs.resize(size_t(hp_.n_expert));
    ws->ready.resize(size_t(hp_.n_expert));
    ws->mark.resize(size_t(hp_.n_expert));
    ws->early.reserve(size_t(hp_.n_expert));
    ws->late.reserve(size_t(hp_.n_expert));
  }
  // Prepared activations: the largest of every matmul input this model has.
  size_t qa = 0, qb = 0, qd = 0;
  auto need = [&](const Tensor& t, int64_t n_rows, size_t& slot) {
    if (t.present() || t.ne[0] > 1) slot = std::max(slot, cpu::prepare_input_bytes(t.type, t.ne[0], n_rows));
  };
  for (const Layer& L : w_.layers) {
    need(L.wq, n_batch, qa);
    need(L.wk, n_batch, qb);
    need(L.wv, n_batch, qb);
    need(L.wo, n_batch, qa);
    need(L.ffn_gate, n_batch, qa);
    need(L.ffn_up, n_batch, qb);
    need(L.ffn_down, n_batch, qa);
    need(L.gate_exps, n_batch, qb);           // quantized once per token ...
    if (L.moe()) {                            // ... then gathered per (token, slot), float rows when unquantized
      qa = std::max({qa, cpu::prepare_input_bytes(L.gate_exps.type, L.gate_exps.ne[0], int64_t(rows)),
                     rows * size_t(L.gate_exps.ne[0]) * sizeof(float)});
    }
    need(L.up_exps, n_batch, qb);
    if (L.moe()) need(L.down_exps, int64_t(rows), qd);
  }
  need(w_.output.present() ? w_.output : w_.token_embd, n_batch, qa);
  ws->qa.resize(qa);
  ws->qb.resize(qb);
  ws->qd.resize(qd);
  return ws;
}

// ---- forward ------------------------------------------------------------------------------------------------

void Qwen3Model::attention_block(cpu::ThreadPool& pool, Qwen3Workspace& ws, std::span<const SeqSpan> seqs,
                                 const Layer& L, int64_t il, int64_t n) const {
  const int64_t E = hp_.n_embd, D = hp_.head_dim;
  const int64_t q_dim = hp_.n_head * D, kv_dim = hp_.n_head_kv * D;
  // Q, K, V from one prepared input when the three share a type (the common case), else per type.
  std::optional<OpTimer> timer(std::in_place, ws.profile, Op::kQkv);
  const PreparedInput xq = cpu::prepare_input(pool, L.wq.type, ws.xn.data(), E, E, n, ws.qa.data());
  const PreparedInput xk = L.wk.type == L.wq.type ? xq : cpu::prepare_input(pool, L.wk.type, ws.xn.data(), E, E, n, ws.qb.data());
  MatmulJob jobs[3] = {
      {.w = L.wq.data, .type = L.wq.type, .n_in = E, .n_out = q_dim, .x = xq, .y = ws.q.data(), .ldy = q_dim},
      {.w = L.wk.data, .type = L.wk.type, .n_in = E, .n_out = kv_dim, .x = xk, .y = ws.k.data(), .ldy = kv_dim},
      {.w = L.wv.data, .type = L.wv.type, .n_in = E, .n_out = kv_dim, .x = xk, .y = ws.v.data(), .ldy = kv_dim},
  };
  if (L.wv.type == L.wk.type) {
    cpu::matmul(pool, jobs);
  } else {
    cpu::matmul(pool, std::span<const MatmulJob>(jobs, 2));
    jobs[2].x = cpu::prepare_input(pool, L.wv.type, ws.xn.data(), E, E, n, ws.qb.data());
    cpu::matmul(pool, jobs[2]);
  }
  timer.emplace(ws.profile, Op::kRope);
  cpu::rms_norm(pool, ws.q.data(), L.q_norm.f32(), ws.q.data(), n * hp_.n_head, D, hp_.rms_eps);
  cpu::rms_norm(pool, ws.k.data(), L.k_norm.f32(), ws.k.data(), n * hp_.n_head_kv, D, hp_.rms_eps);
  cpu::rope_neox(pool, ws.q.data(), n, hp_.n_head, D, ws.positions.data(), hp_.rope_theta);
  cpu::rope_neox(pool, ws.k.data(), n, hp_.n_head_kv, D, ws.positions.data(), hp_.rope_theta);
  timer.emplace(ws.profile, Op::kAttention);
  int64_t t0 = 0;  // each sequence attends to its own cache
  for (const SeqSpan& seq : seqs) {
    kv::KvCache& kv = *seq.kv;
    cpu::store_kv(ws.k.data() + t0 * kv_dim, seq.n_tok, kv_dim, kv.type(), kv.k(il), seq.pos0);
    cpu::store_kv(ws.v.data() + t0 * kv_dim, seq.n_tok, kv_dim, kv.type(), kv.v(il), seq.pos0);
    cpu::attention(pool, {.q = ws.q.data() + t0 * q_dim, .k_cache = kv.k(il), .v_cache = kv.v(il),
                          .kv_type = kv.type(), .out = ws.attn.data() + t0 * q_dim, .n_tok = seq.n_tok,
                          .pos0 = seq.pos0, .n_head = hp_.n_head, .n_head_kv = hp_.n_head_kv, .head_dim = D,
                          .window = L.window, .scale = float(1.0 / std::sqrt(double(D))),
                          .scratch = ws.attn_scratch.data()});
    t0 += seq.n_tok;
  }
  timer.emplace(ws.profile, Op::kAttnOut);
  const PreparedInput ao = cpu::prepare_input(pool, L.wo.type, ws.attn.data(), q_dim, q_dim, n, ws.qa.data());
  cpu::matmul(pool, {.w = L.wo.data, .type = L.wo.type, .n_in = q_dim, .n_out = E, .x = ao, .y = ws.proj.data(), .ldy = E});
}

void Qwen3Model::dense_ffn(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n) const {
  const int64_t E = hp_.n_embd, F = hp_.n_ff;
  OpTimer timer(ws.profile, Op::kDenseFfn);
  const PreparedInput xg = cpu::prepare_input(pool, L.ffn_gate.type, ws.xn.data(), E, E, n, ws.qa.data());
  const PreparedInput xu = L.ffn_up.type == L.ffn_gate.type ? xg : cpu::prepare_input(pool, L.ffn_up.type, ws.xn.data(), E, E, n, ws.qb.data());
  const MatmulJob jobs[2] = {
      {.w = L.ffn_gate.data, .type = L.ffn_gate.type, .n_in = E, .n_out = F, .x = xg, .y = ws.gate.data(), .ldy = F},
      {.w = L.ffn_up.data, .type = L.ffn_up.type, .n_in = E, .n_out = F, .x = xu, .y = ws.up.data(), .ldy = F},
  };
  cpu::matmul(pool, jobs);
  cpu::swiglu(pool, ws.gate.data(), ws.up.data(), n * F);
  const PreparedInput h = cpu::prepare_input(pool, L.ffn_down.type, ws.gate.data(), F, F, n, ws.qa.data());
  cpu::matmul(pool, {.w = L.ffn_down.data, .type = L.ffn_down.type, .n_in = F, .n_out = E, .x = h, .y = ws.proj.data(), .ldy = E});
}

// The unsigned key that orders as the float does (larger key: larger logit), -0 as +0, every NaN above +inf whatever
// its sign (torch.topk's order): a strict total order, the CUDA router's (backends/cuda/route_topk.cuh, logit_key).
static uint32_t routing_key(float v) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  if (u == 0x80000000u) u = 0;                              // -0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k largest logits' ids into idx[0, k) (idx holds every id after): ties go to the lower expert id, as torch.topk
// on CPU. Compared by routing_key, a total order: a float comparison with NaN is no strict weak order, which
// std::partial_sort requires.
static void top_k_ids(const float* logits, int64_t k, std::vector<int32_t>& idx) {
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = routing_key(logits[a]), kb = routing_key(logits[b]);
    return ka > kb || (ka == kb && a < b);
  });
}

void Qwen3Model::route(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n) const {
  const int64_t E = hp_.n_embd, X = hp_.n_expert, K = hp_.n_expert_used;
  // Router: softmax over all experts, top-k, optional renormalization (transformers' order of operations).
  const PreparedInput xr = cpu::prepare_input(pool, L.gate_inp.type, ws.xn.data(), E, E, n, nullptr);
  cpu::matmul(pool, {.w = L.gate_inp.data, .type = L.gate_inp.type, .n_in = E, .n_out = X, .x = xr, .y = ws.router.data(), .ldy = X});
  std::fill(ws.expert_begin.begin(), ws.expert_begin.end(), 0);
  for (int64_t t = 0; t < n; ++t) {
    float* logits = ws.router.data() + t * X;
    const float max_logit = *std::max_element(logits, logits + X);
    double sum = 0;
    for (int64_t e = 0; e < X; ++e) sum += std::exp(double(logits[e] - max_logit));
    int32_t* ids = ws.top_ids.data() + t * K;
    float* weights = ws.top_weights.data() + t * K;
    std::vector<int32_t>& idx = ws.sort_idx;
    top_k_ids(logits, K, idx);
    double top_sum = 0;
    for (int64_t j = 0; j < K; ++j) {
      ids[j] = idx[size_t(j)];
      weights[j] = float(std::exp(double(logits[ids[j]] - max_logit)) / sum);
      top_sum += weights[j];
      ws.expert_begin[size_t(ids[j]) + 1]++;
      if (ws.routing) ws.routing->counts[size_t(ws.layer * X + ids[j])]++;
    }
    if (hp_.norm_topk_prob) {
      for (int64_t j = 0; j < K; ++j) weights[j] = float(weights[j] / top_sum);
    }
  }
  // Group (token, slot) rows by expert: rows of expert e are [expert_begin[e], expert_begin[e+1]).
  for (int64_t e = 0; e < X; ++e) ws.expert_begin[size_t(e) + 1] += ws.expert_begin[size_t(e)];
  std::vector<int32_t>& fill = ws.expert_fill;
  std::copy(ws.expert_begin.begin(), ws.expert_begin.end() - 1, fill.begin());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ws.top_ids[size_t(t * K + j)];
      const int32_t r = fill[size_t(e)]++;
      ws.order_token[size_t(r)] = int32_t(t);
      ws.row_weight[size_t(r)] = ws.top_weights[size_t(t * K + j)];
    }
  }
}

// The next MoE layer's router applied to this layer's normed input: the union of each token's top-k is the
// hint (ARCHITECTURE.md step 3). ws.router is free again once route() has grouped the rows.
void Qwen3Model::predict_next(cpu::ThreadPool& pool, Qwen3Workspace& ws, int64_t n, experts::ExpertSource& source) const {
  int64_t next = ws.layer + 1;
  while (next < hp_.n_layer && !w_.layers[size_t(next)].moe()) ++next;
  if (next >= hp_.n_layer) return;
  const Layer& N = w_.layers[size_t(next)];
  const int64_t E = hp_.n_embd, X = hp_.n_expert, K = hp_.n_expert_used;
  const PreparedInput xr = cpu::prepare_input(pool, N.gate_inp.type, ws.xn.data(), E, E, n, nullptr);
  cpu::matmul(pool, {.w = N.gate_inp.data, .type = N.gate_inp.type, .n_in = E, .n_out = X, .x = xr, .y = ws.router.data(), .ldy = X});
  std::fill(ws.mark.begin(), ws.mark.end(), 0);
  std::vector<int32_t>& idx = ws.sort_idx;
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = ws.router.data() + t * X;
    top_k_ids(logits, K, idx);
    for (int64_t j = 0; j < K; ++j) ws.mark[size_t(idx[size_t(j)])] = 1;
  }
  idx.clear();
  for (int32_t e = 0; e < int32_t(X); ++e) {
    if (ws.mark[size_t(e)]) idx.push_back(e);
  }
  source.prefetch(next, idx);
  idx.resize(size_t(X));
}

void Qwen3Model::run_experts(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, std::span<const size_t> which) const {
  if (which.empty()) return;
  const int64_t E = hp_.n_embd, F = hp_.n_ff_exp;
  const size_t in_row = ws.gathered_row_bytes;
  const bool in_float = ws.gathered_is_float;
  std::vector<MatmulJob>& jobs = ws.jobs;
  jobs.clear();
  for (const size_t i : which) {
    const int32_t e = ws.active[i];
    const int64_t r0 = ws.expert_begin[size_t(e)], cnt = ws.expert_begin[size_t(e) + 1] - r0;
    const PreparedInput xe = {.data = ws.qa.data() + size_t(r0) * in_row, .row_bytes = in_row, .n_tok = cnt,
                              .is_float = in_float};
    jobs.push_back({.w = ws.ptrs[i].part[0], .type = L.gate_exps.type, .n_in = E, .n_out = F, .x = xe,
                    .y = ws.gate.data() + r0 * F, .ldy = F});
    jobs.push_back({.w = ws.ptrs[i].part[1], .type = L.up_exps.type, .n_in = E, .n_out = F, .x = xe,
                    .y = ws.up.data() + r0 * F, .ldy = F});
  }
  std::optional<OpTimer> timer(std::in_place, ws.profile, Op::kExpertsGateUp);
  cpu::matmul(pool, jobs);
  timer.emplace(ws.profile, Op::kExpertsOther);
  jobs.clear();
  const size_t down_row = cpu::prepare_input_bytes(L.down_exps.type, F, 1);
  for (const size_t i : which) {
    const int32_t e = ws.active[i];
    const int64_t r0 = ws.expert_begin[size_t(e)], cnt = ws.expert_begin[size_t(e) + 1] - r0;
    cpu::swiglu(pool, ws.gate.data() + r0 * F, ws.up.data() + r0 * F, cnt * F);
    const PreparedInput he = cpu::prepare_input(pool, L.down_exps.type, ws.gate.data() + r0 * F, F, F, cnt,
                                                ws.qd.data() + size_t(r0) * down_row);
    jobs.push_back({.w = ws.ptrs[i].part[2], .type = L.down_exps.type, .n_in = F, .n_out = E, .x = he,
                    .y = ws.down.data() + r0 * E, .ldy = E});
  }
  timer.emplace(ws.profile, Op::kExpertsDown);
  cpu::matmul(pool, jobs);
}

Status Qwen3Model::moe_ffn(cpu::ThreadPool& pool, Qwen3Workspace& ws, const Layer& L, int64_t n,
                           const ForwardArgs& args) const {
  const int64_t E = hp_.n_embd, X = hp_.n_expert, K = hp_.n_expert_used;
  std::optional<OpTimer> timer(std::in_place, ws.profile, Op::kRouter);
  route(pool, ws, L, n);
  const int64_t rows = n * K;
  timer.emplace(ws.profile, Op::kExpertsOther);
  // The experts this batch needs; their weights are requested before anything waits on them.
  ws.active.clear();
  for (int32_t e = 0; e < int32_t(X); ++e) {
    if (ws.expert_begin[size_t(e) + 1] > ws.expert_begin[size_t(e)]) ws.active.push_back(e);
  }
  const size_t n_active = ws.active.size();
  experts::ExpertSource& source = args.experts ? *args.experts : *mapped_;
  const std::span<experts::ExpertPtrs> ptrs(ws.ptrs.data(), n_active);
  source.acquire(ws.layer, ws.active, ptrs, std::span<uint8_t>(ws.ready.data(), n_active));
  experts::Pinned pinned(source);
  if (args.prefetch) predict_next(pool, ws, n, source);
  // Activations: prepared once per token, then gathered into expert order.
  const PreparedInput xt = cpu::prepare_input(pool, L.gate_exps.type, ws.xn.data(), E, E, n, ws.qb.data());
  const uint8_t* src = static_cast<const uint8_t*>(xt.data);
  uint8_t* gathered = ws.qa.data();
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(gathered + size_t(r) * xt.row_bytes, src + size_t(ws.order_token[size_t(r)]) * xt.row_bytes, xt.row_bytes);
  }
  MAGNETAR_CHECK(L.up_exps.type == L.gate_exps.type);
  ws.gathered_row_bytes = xt.row_bytes;
  ws.gathered_is_float = xt.is_float;
  // Experts already in memory first, the rest once their reads land (each expert's rows are computed the
  // same way whichever group it falls in, so the result does not depend on what was cached).
  ws.early.clear();
  ws.late.clear();
  for (size_t i = 0; i < n_active; ++i) (ws.ready[i] ? ws.early : ws.late).push_back(i);
  timer.reset();  // run_experts times its own parts
  run_experts(pool, ws, L, ws.early);
  if (!ws.late.empty()) {
    timer.emplace(ws.profile, Op::kExpertsWait);
    MAGNETAR_RETURN_IF_ERROR(source.wait(ptrs));
    timer.reset();
    run_experts(pool, ws, L, ws.late);
  }
  timer.emplace(ws.profile, Op::kExpertsOther);
  // proj[t] = sum over the token's experts, in expert order, of weight * down_row.
  std::fill(ws.proj.begin(), ws.proj.begin() + n * E, 0.0f);
  const cpu::VectorKernels& vk = cpu::vector_kernels();
  for (int64_t r = 0; r < rows; ++r) {
    vk.axpy_f32(E, ws.row_weight[size_t(r)], ws.down.data() + r * E, ws.proj.data() + ws.order_token[size_t(r)] * E);
  }
  return Status();
}

void Qwen3Model::embed(Qwen3Workspace& ws, const int32_t* tokens, int64_t n, float* out) const {
  OpTimer timer(ws.profile, Op::kEmbed);
  const quant::ToFloatFn dequantize = cpu::kernels(w_.token_embd.type).dequantize;
  for (int64_t t = 0; t < n; ++t) {
    MAGNETAR_CHECK(tokens[t] >= 0 && tokens[t] < hp_.n_vocab);
    dequantize(w_.token_embd.row(tokens[t]), out + t * hp_.n_embd, hp_.n_embd);
  }
}

Status Qwen3Model::layer(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args, size_t il,
                         int64_t n) const {
  const int64_t E = hp_.n_embd;
  const Layer& L = w_.layers[il];
  const cpu::VectorKernels& vk = cpu::vector_kernels();
  ws.layer = int64_t(il);
  std::optional<OpTimer> timer(std::in_place, ws.profile, Op::kNorm);
  cpu::rms_norm(pool, ws.x.data(), L.attn_norm.f32(), ws.xn.data(), n, E, hp_.rms_eps);
  timer.reset();
  attention_block(pool, ws, args.seqs, L, int64_t(il), n);
  timer.emplace(ws.profile, Op::kNorm);
  for (int64_t t = 0; t < n; ++t) vk.axpy_f32(E, 1.0f, ws.proj.data() + t * E, ws.x.data() + t * E);
  cpu::rms_norm(pool, ws.x.data(), L.ffn_norm.f32(), ws.xn.data(), n, E, hp_.rms_eps);
  timer.reset();
  if (L.moe()) {
    MAGNETAR_RETURN_IF_ERROR(moe_ffn(pool, ws, L, n, args));
  } else {
    dense_ffn(pool, ws, L, n);
  }
  timer.emplace(ws.profile, Op::kNorm);
  for (int64_t t = 0; t < n; ++t) vk.axpy_f32(E, 1.0f, ws.proj.data() + t * E, ws.x.data() + t * E);
  return Status();
}

void Qwen3Model::head(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args, int64_t n) const {
  const int64_t E = hp_.n_embd;
  OpTimer timer(ws.profile, Op::kLmHead);
  // Rows of the head: every token, or each sequence's last.
  int64_t n_out = n;
  if (args.all_logits) {
    cpu::rms_norm(pool, ws.x.data(), w_.output_norm.f32(), ws.xn.data(), n, E, hp_.rms_eps);
  } else {
    n_out = 0;
    int64_t end = 0;
    for (const SeqSpan& seq : args.seqs) {
      end += seq.n_tok;
      cpu::rms_norm(pool, ws.x.data() + (end - 1) * E, w_.output_norm.f32(), ws.xn.data() + n_out * E, 1, E, hp_.rms_eps);
      ++n_out;
    }
  }
  const Tensor& head = w_.output.present() ? w_.output : w_.token_embd;
  const PreparedInput xh = cpu::prepare_input(pool, head.type, ws.xn.data(), E, E, n_out, ws.qa.data());
  // Rows for seq_logits: straight into the one row of a single sequence, else through ws.head_rows.
  const bool per_seq = !args.seq_logits.empty();
  MAGNETAR_CHECK(!per_seq || (!args.all_logits && args.seq_logits.size() == args.seqs.size()));
  float* y = args.logits;
  if (per_seq && n_out == 1) {
    y = args.seq_logits[0];
  } else if (per_seq) {
    ws.head_rows.resize(size_t(n_out * hp_.n_vocab));
    y = ws.head_rows.data();
  }
  cpu::matmul(pool, {.w = head.data, .type = head.type, .n_in = E, .n_out = hp_.n_vocab, .x = xh, .y = y,
                     .ldy = hp_.n_vocab});
  if (per_seq && n_out > 1) {
    for (int64_t i = 0; i < n_out; ++i) {
      std::copy_n(y + i * hp_.n_vocab, hp_.n_vocab, args.seq_logits[size_t(i)]);
    }
  }
}

Status Qwen3Model::forward(cpu::ThreadPool& pool, Workspace& workspace, const ForwardArgs& args) const {
  Qwen3Workspace& ws = static_cast<Qwen3Workspace&>(workspace);
  const int64_t n = args.n_tok;
  MAGNETAR_CHECK(n >= 1 && !args.seqs.empty() && (n <= ws.n_batch || (args.seqs.size() == 1 && layout_)));
  int64_t seq_tokens = 0;
  for (const SeqSpan& seq : args.seqs) {
    MAGNETAR_CHECK(seq.kv && seq.n_tok >= 1 && seq.pos0 >= 0 && seq.pos0 + seq.n_tok <= seq.kv->n_ctx());
    MAGNETAR_CHECK(seq.kv->n_ctx() <= ws.n_ctx);
    seq_tokens += seq.n_tok;
  }
  MAGNETAR_CHECK(seq_tokens == n);
  ws.profile = args.profile;
  ws.routing = args.routing;
  if (ws.routing) MAGNETAR_CHECK(int64_t(ws.routing->counts.size()) == hp_.n_layer * hp_.n_expert);
  if (n > ws.n_batch) return sweep(pool, ws, args);
  seq_tokens = 0;
  for (const SeqSpan& seq : args.seqs) {
    for (int64_t t = 0; t < seq.n_tok; ++t) ws.positions[size_t(seq_tokens + t)] = int32_t(seq.pos0 + t);
    seq_tokens += seq.n_tok;
  }
  embed(ws, args.tokens, n, ws.x.data());
  for (size_t il = 0; il < w_.layers.size(); ++il) MAGNETAR_RETURN_IF_ERROR(layer(pool, ws, args, il, n));
  head(pool, ws, args, n);
  return Status();
}

Status Qwen3Model::sweep(cpu::ThreadPool& pool, Qwen3Workspace& ws, const ForwardArgs& args) const {
  const int64_t n = args.n_tok, E = hp_.n_embd, B = ws.n_batch, chunks = (n + B - 1) / B;
  const SeqSpan& seq = args.seqs[0];
  SweepCursor whole;
  SweepCursor& at = args.sweep ? *args.sweep : whole;
  at.begin(int64_t(w_.layers.size()), chunks);
  // Chunk c of args as a call of its own; a chunk's attention reads the rows the chunks before it stored at the layer.
  auto chunk_args = [&](int64_t c, SeqSpan& span) {
    span = {.kv = seq.kv, .pos0 = seq.pos0 + c, .n_tok = std::min(B, n - c)};
    for (int64_t t = 0; t < span.n_tok; ++t) ws.positions[size_t(t)] = int32_t(span.pos0 + t);
    ForwardArgs a = args;
    a.tokens = args.tokens + c;
    a.n_tok = span.n_tok;
    a.seqs = {&span, 1};
    return a;
  };
  while (at.step < at.steps) {
    if (at.at_embeddings()) {
      grow(ws.sweep_x, size_t(n * E));
      embed(ws, args.tokens, n, ws.sweep_x.data());
    } else if (!at.at_head()) {
      // Layer by layer, each over the chunks in order.
      const size_t il = size_t(at.layer(chunks));
      const int64_t c = at.chunk(chunks) * B;
      SeqSpan span;
      const ForwardArgs a = chunk_args(c, span);
      std::copy_n(ws.sweep_x.data() + c * E, span.n_tok * E, ws.x.data());
      MAGNETAR_RETURN_IF_ERROR(layer(pool, ws, a, il, span.n_tok));
      std::copy_n(ws.x.data(), span.n_tok * E, ws.sweep_x.data() + c * E);
    } else {
      // The head chunk by chunk as single calls compute it: every token's logits, or the last token's.
      for (int64_t c = args.all_logits ? 0 : (n - 1) / B * B; c < n; c += B) {
        SeqSpan span;
        ForwardArgs a = chunk_args(c, span);
        if (args.all_logits) a.logits = args.logits + c * hp_.n_vocab;
        std::copy_n(ws.sweep_x.data() + c * E, span.n_tok * E, ws.x.data());
        head(pool, ws, a, span.n_tok);
      }
    }
    if (++at.step < at.steps && args.pause && (*args.pause)()) return Status();
  }
  return Status();
}

}  // namespace

// ---- load ---------------------------------------------------------------------------------------------------

Result<Qwen3Bound> bind_qwen3(const gguf::Model& file) {
  using qwen3::Layer;
  using qwen3::Weights;
  Binder b(file);
  HParams hp;
  hp.arch = file.architecture();
  const std::string a = hp.arch + ".";
  hp.n_layer = b.integer(a + "block_count");
  hp.n_embd = b.integer(a + "embedding_length");
  hp.n_head = b.integer(a + "attention.head_count");
  hp.n_head_kv = b.integer(a + "attention.head_count_kv", Need::kOptional, hp.n_head);
  hp.head_dim = b.integer(a + "attention.key_length", Need::kOptional, hp.n_head > 0 ? hp.n_embd / hp.n_head : 0);
  hp.n_ctx_train = b.integer(a + "context_length", Need::kOptional, 4096);
  hp.rope_theta = b.real(a + "rope.freq_base", Need::kOptional, 1e6f);
  hp.rms_eps = b.real(a + "attention.layer_norm_rms_epsilon", Need::kOptional, 1e-6f);
  hp.sliding_window = b.integer(a + "attention.sliding_window", Need::kOptional, 0);
  hp.n_ff = b.integer(a + "feed_forward_length", Need::kOptional, 0);
  const bool is_moe = hp.arch == "qwen3moe";
  if (is_moe) {
    hp.n_expert = b.integer(a + "expert_count");
    hp.n_expert_used = b.integer(a + "expert_used_count");
    hp.n_ff_exp = b.integer(a + "expert_feed_forward_length");
    hp.norm_topk_prob = b.boolean(a + "expert_weights_norm", true);
  }
  if (!b.status().ok()) return b.status();
  // Sizes are bounded far above any model's so that their products (q_dim = heads x head_dim, ...) cannot overflow.
  constexpr int64_t kMaxSize = int64_t(1) << 24;
  if (hp.n_layer <= 0 || hp.n_layer > 65536 || hp.n_embd <= 0 || hp.n_embd > kMaxSize || hp.n_head <= 0 ||
      hp.n_head > 65536 || hp.n_head_kv <= 0 || hp.head_dim <= 0 || hp.n_head % hp.n_head_kv != 0 ||
      hp.n_head / hp.n_head_kv > 64 || hp.head_dim % 2 != 0 || hp.head_dim > 1024 || hp.n_ff < 0 ||
      hp.n_ff > kMaxSize || hp.n_ff_exp < 0 || hp.n_ff_exp > kMaxSize ||
      (is_moe && (hp.n_expert <= 0 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert))) {
    return Status::error(
        format("%s: inconsistent hyper-parameters (layers %lld, embd %lld, heads %lld/%lld, head_dim "
               "%lld, ffn %lld, expert ffn %lld, experts %lld/%lld)",
               file.shards()[0]->path().c_str(), (long long)hp.n_layer, (long long)hp.n_embd, (long long)hp.n_head,
               (long long)hp.n_head_kv, (long long)hp.head_dim, (long long)hp.n_ff, (long long)hp.n_ff_exp,
               (long long)hp.n_expert_used, (long long)hp.n_expert));
  }
  const gguf::TensorInfo* embd = file.find_tensor("token_embd.weight");
  if (!embd || embd->n_dims != 2) return Status::error(file.shards()[0]->path() + ": tensor 'token_embd.weight' is missing or not 2-D");
  hp.n_vocab = embd->ne[1];

  // Sliding window: every layer, or the layers `attention.sliding_window_pattern` marks (Qwen3 dense with
  // max_window_layers / layer_types).
  std::vector<bool> slides(size_t(hp.n_layer), hp.sliding_window > 0);
  if (const gguf::Value* pattern = file.find(a + "attention.sliding_window_pattern"); pattern && hp.sliding_window > 0) {
    if (pattern->type != gguf::ValueType::kArray || pattern->array_type != gguf::ValueType::kBool ||
        pattern->array.size() != size_t(hp.n_layer)) {
      return Status::error(format("%s: metadata '%sattention.sliding_window_pattern' must be an array of %lld bools",
                                  file.shards()[0]->path().c_str(), a.c_str(), (long long)hp.n_layer));
    }
    for (size_t il = 0; il < slides.size(); ++il) slides[il] = pattern->array[il].u != 0;
  }

  std::unique_ptr<experts::ExpertLayout> layout;
  if (is_moe) {
    MAGNETAR_ASSIGN_OR_RETURN(experts::ExpertLayout found, experts::ExpertLayout::from_model(file));
    layout = std::make_unique<experts::ExpertLayout>(std::move(found));
  }

  Weights w;
  const int64_t E = hp.n_embd, D = hp.head_dim, q_dim = hp.n_head * D, kv_dim = hp.n_head_kv * D;
  w.token_embd = b.tensor("token_embd.weight", {E, hp.n_vocab});
  w.output_norm = b.tensor("output_norm.weight", {E}, Need::kRequired, Kind::kF32Only);
  w.output = b.tensor("output.weight", {E, hp.n_vocab}, Need::kOptional);
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    Layer L;
    L.window = slides[size_t(il)] ? hp.sliding_window : 0;
    L.attn_norm = b.tensor(p + "attn_norm.weight", {E}, Need::kRequired, Kind::kF32Only);
    L.wq = b.tensor(p + "attn_q.weight", {E, q_dim});
    L.wk = b.tensor(p + "attn_k.weight", {E, kv_dim});
    L.wv = b.tensor(p + "attn_v.weight", {E, kv_dim});
    L.wo = b.tensor(p + "attn_output.weight", {q_dim, E});
    L.q_norm = b.tensor(p + "attn_q_norm.weight", {D}, Need::kRequired, Kind::kF32Only);
    L.k_norm = b.tensor(p + "attn_k_norm.weight", {D}, Need::kRequired, Kind::kF32Only);
    L.ffn_norm = b.tensor(p + "ffn_norm.weight", {E}, Need::kRequired, Kind::kF32Only);
    if (is_moe && b.has_tensor(p + "ffn_gate_inp.weight")) {
      L.gate_inp = b.tensor(p + "ffn_gate_inp.weight", {E, hp.n_expert}, Need::kRequired, Kind::kF32Only);
      if (layout->packed()) {
        L.gate_exps = b.expert_part(*layout, il, experts::Part::kGate, {E, hp.n_ff_exp, hp.n_expert});
        L.up_exps = b.expert_part(*layout, il, experts::Part::kUp, {E, hp.n_ff_exp, hp.n_expert});
        L.down_exps = b.expert_part(*layout, il, experts::Part::kDown, {hp.n_ff_exp, E, hp.n_expert});
      } else {
        L.gate_exps = b.tensor(p + "ffn_gate_exps.weight", {E, hp.n_ff_exp, hp.n_expert});
        L.up_exps = b.tensor(p + "ffn_up_exps.weight", {E, hp.n_ff_exp, hp.n_expert});
        L.down_exps = b.tensor(p + "ffn_down_exps.weight", {hp.n_ff_exp, E, hp.n_expert});
      }
      if (b.status().ok() && L.up_exps.type != L.gate_exps.type) {
        b.fail(format("tensor '%sffn_up_exps.weight' must have the type of ffn_gate_exps", p.c_str()));
      }
    } else {
      if (hp.n_ff <= 0) {
        b.fail(format("layer %lld has a dense FFN but metadata '%sfeed_forward_length' is missing", (long long)il, a.c_str()));
      }
      L.ffn_gate = b.tensor(p + "ffn_gate.weight", {E, hp.n_ff});
      L.ffn_up = b.tensor(p + "ffn_up.weight", {E, hp.n_ff});
      L.ffn_down = b.tensor(p + "ffn_down.weight", {hp.n_ff, E});
    }
    w.layers.push_back(L);
  }
  if (!b.status().ok()) return b.status();
  return Qwen3Bound{.hp = std::move(hp), .w = std::move(w), .layout = std::move(layout)};
}

Result<std::unique_ptr<Model>> load_qwen3(const gguf::Model& file) {
  MAGNETAR_ASSIGN_OR_RETURN(Qwen3Bound bound, bind_qwen3(file));
  return std::unique_ptr<Model>(new Qwen3Model(std::move(bound.hp), std::move(bound.w), file, std::move(bound.layout)));
}

}  // namespace magnetar::models
