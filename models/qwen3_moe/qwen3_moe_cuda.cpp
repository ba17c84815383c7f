// Qwen3 / Qwen3-MoE on a CUDA device: load, the building blocks and the forward pass (qwen3_moe_cuda.h describes the
// whole; the GPU expert tier's pool and CPU lane, and prefill sweeps, are in qwen3_moe_tier_cuda.cpp).
#include "models/qwen3_moe/qwen3_moe_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "backends/cpu/kernels.h"
#include "experts/store.h"

namespace magnetar::models {
namespace qwen3_cuda {
namespace {

// Prefill's grouped expert products (mmq) take up to one CTA tile of activation rows per item, so an expert
// with many rows spreads over several CTAs instead of one CTA looping over them.
constexpr int32_t kMmqItemRows = 64;

// Whether a product of n rows of weight type t takes the int8 tensor-core kernel (mmq_enabled).
bool use_mmq(quant::Type t, int64_t n) { return n > kVec && mmq_enabled() && cuda::has_matmul_q(t); }

// Attention runs on f16 tensor cores where a kernel has the shape: a sequence with at least kMmaAttentionTokens new
// tokens on attention_prefill_mma (each K/V row read once per tile of tokens), fewer (decode) on
// attention_decode_mma (split-K, one CTA per token and split); the other shapes on attention() (FP32 cores).
// Diagnostic switches, the baselines of run.sh: MAGNETAR_CUDA_ATTN_MMA=0 keeps prefill (--attn-prefill) and
// MAGNETAR_CUDA_DECODE_MMA=0 decode (--model-bench) on attention().
constexpr int64_t kMmaAttentionTokens = 64;
// Whether attend() runs attention_decode_mma for these arguments (the one kernel that reads a Q8_0 or FP8 cache
// itself).
bool decode_mma_for(const cuda::AttentionArgs& args, int64_t group) {
  static const bool decode_mma = switch_on("MAGNETAR_CUDA_DECODE_MMA");
  return args.n_tok < kMmaAttentionTokens && decode_mma && cuda::has_attention_decode_mma(args.head_dim, group);
}
Status attend(const cuda::AttentionArgs& args, int64_t group, cuda::AttentionWorkspace& ws, cuda::Stream& stream) {
  static const bool prefill_mma = switch_on("MAGNETAR_CUDA_ATTN_MMA");
  if (decode_mma_for(args, group)) return cuda::attention_decode_mma(args, ws, stream);
  if (args.n_tok >= kMmaAttentionTokens && prefill_mma && cuda::has_attention_prefill_mma(args.head_dim)) {
    return cuda::attention_prefill_mma(args, stream);
  }
  return cuda::attention(args, ws, stream);
}


size_t align256(size_t n) { return (n + 255) / 256 * 256; }
bool is_quantized(quant::Type t) { return quant::traits(t).is_quantized; }

// Whether the q, k and v products share one quantized input: their weights pair with the same activation format.
bool qkv_share_input(const DevLayer& L) {
  return is_quantized(L.wq.type) && is_quantized(L.wk.type) && is_quantized(L.wv.type) &&
         quant::traits(L.wq.type).vec_dot_type == quant::traits(L.wk.type).vec_dot_type &&
         quant::traits(L.wq.type).vec_dot_type == quant::traits(L.wv.type).vec_dot_type;
}

}  // namespace

Result<DeviceBuffer> Qwen3Cuda::device_buffer(size_t bytes) {
  return DeviceBuffer::allocate(std::max<size_t>(bytes, 256));
}

Result<DevTensor> Qwen3Cuda::upload(const Tensor& t) {
  DevTensor d{.type = t.type, .rows = t.ne[1] * t.ne[2] * t.ne[3], .cols = t.ne[0]};
  const size_t bytes = size_t(d.rows) * t.row_bytes;
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer buf, device_buffer(bytes));
  MAGNETAR_RETURN_IF_ERROR(buf.upload(t.data, bytes));
  d.p = buf.data();
  owned_.push_back(std::move(buf));
  return d;
}

// q, k and v read the same input: when their weights share type and width they go to the device as one matrix
// [q rows; k rows; v rows] and a decode token's three products are one launch (DevLayer::wqkv; wq/wk/wv point into
// it for the separate launches of prefill). Otherwise each is uploaded alone.
Status Qwen3Cuda::upload_qkv(const Layer& L, DevLayer& d) {
  const Tensor* parts[] = {&L.wq, &L.wk, &L.wv};
  DevTensor* outs[] = {&d.wq, &d.wk, &d.wv};
  bool same = true;
  for (const Tensor* t : parts) {
    same = same && t->type == L.wq.type && t->ne[0] == L.wq.ne[0] && t->row_bytes == L.wq.row_bytes &&
           t->ne[2] == 1 && t->ne[3] == 1 && (size_t(t->ne[1]) * t->row_bytes) % 256 == 0;
  }
  if (!same) {
    for (int i = 0; i < 3; ++i) {
      MAGNETAR_ASSIGN_OR_RETURN(*outs[i], upload(*parts[i]));
    }
    return Status();
  }
  int64_t rows = 0;
  for (const Tensor* t : parts) rows += t->ne[1];
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer buf, device_buffer(size_t(rows) * L.wq.row_bytes));
  size_t off = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t bytes = size_t(parts[i]->ne[1]) * parts[i]->row_bytes;
    MAGNETAR_RETURN_IF_ERROR(buf.upload(parts[i]->data, bytes, off));
    *outs[i] = DevTensor{.p = buf.as<uint8_t>() + off, .type = L.wq.type, .rows = parts[i]->ne[1], .cols = L.wq.ne[0]};
    off += bytes;
  }
  d.wqkv = DevTensor{.p = buf.data(), .type = L.wq.type, .rows = rows, .cols = L.wq.ne[0]};
  owned_.push_back(std::move(buf));
  return Status();
}

Status Qwen3Cuda::init() {
  MAGNETAR_RETURN_IF_ERROR(cuda::check_device_code());
  const int64_t E = hp_.n_embd, D = hp_.head_dim, X = hp_.n_expert, K = std::max<int64_t>(1, hp_.n_expert_used);
  const int64_t q_dim = hp_.n_head * D, kv_dim = hp_.n_head_kv * D;
  const int64_t group = hp_.n_head / hp_.n_head_kv;
  if (group > cuda::kMaxAttentionGroup || D > cuda::kMaxAttentionHeadDim || D % 8 != 0) {
    return Status::error(format("CUDA attention takes head_dim a multiple of 8 up to %lld and up to %lld query heads "
                                "per KV head; this model has head_dim %lld, %lld per KV head",
                                (long long)cuda::kMaxAttentionHeadDim, (long long)cuda::kMaxAttentionGroup,
                                (long long)D, (long long)group));
  }
  if (X > 1024) return Status::error(format("CUDA router takes up to 1024 experts, the model has %lld", (long long)X));
  if (K > 32) {
    return Status::error(
        format("CUDA router takes up to 32 experts per token, the model routes to %lld", (long long)K));
  }
  if (kv_type_ != quant::Type::F16 && kv_type_ != quant::Type::Q8_0 && kv_type_ != quant::Type::F8_E4M3) {
    return Status::error("the CUDA backend keeps KV in F16, Q8_0 or FP8 (--kv-type f32 runs on the CPU)");
  }
  // Q8_0 and FP8 KV: stored by qkv_prepare, read by the decode and (through F16) the prefill tensor-core kernels.
  if (kv_type_ != quant::Type::F16 &&
      !(D % 64 == 0 && D <= cuda::kMaxQkNormRopeHeadDim && cuda::has_attention_decode_mma(D, group) &&
        cuda::has_attention_prefill_mma(D))) {
    return Status::error(
        format("--kv-type %s on the GPU takes head_dim 64 or 128 (up to 16 query heads per KV "
               "head) or 256 (up to 8, on GPUs with over 144 KB of shared memory a CTA); this model "
               "has head_dim %lld, %lld per KV head",
               kv_type_ == quant::Type::Q8_0 ? "q8_0" : "fp8", (long long)D, (long long)group));
  }
  MAGNETAR_ASSIGN_OR_RETURN(stream_, cuda::Stream::create());
  MAGNETAR_ASSIGN_OR_RETURN(device_start_, cuda::Event::create());
  MAGNETAR_ASSIGN_OR_RETURN(device_end_, cuda::Event::create());

  // ---- weights -----------------------------------------------------------------------------------------------
  std::unique_ptr<experts::MappedExperts> mapped;
  if (layout_) mapped = std::make_unique<experts::MappedExperts>(file_, *layout_);
  MAGNETAR_ASSIGN_OR_RETURN(output_norm_, upload(w_.output_norm));
  MAGNETAR_ASSIGN_OR_RETURN(head_, upload(w_.output.present() ? w_.output : w_.token_embd));
  // The widest row a product reads: q (the output projection's input), n_embd, an expert's n_ff_exp and, only when
  // some layer is dense, n_ff (MoE files carry an n_ff no layer uses: 6,144 on Qwen3-30B-A3B, 8x its n_ff_exp).
  const bool any_dense = std::any_of(w_.layers.begin(), w_.layers.end(), [](const Layer& L) { return !L.moe(); });
  const int64_t max_cols = std::max({q_dim, E, hp_.n_ff_exp, any_dense ? hp_.n_ff : int64_t(0)});
  for (size_t il = 0; il < w_.layers.size(); ++il) {
    const Layer& L = w_.layers[il];
    DevLayer d;
    d.window = L.window;
    MAGNETAR_ASSIGN_OR_RETURN(d.attn_norm, upload(L.attn_norm));
    MAGNETAR_RETURN_IF_ERROR(upload_qkv(L, d));
    MAGNETAR_ASSIGN_OR_RETURN(d.wo, upload(L.wo));
    MAGNETAR_ASSIGN_OR_RETURN(d.q_norm, upload(L.q_norm));
    MAGNETAR_ASSIGN_OR_RETURN(d.k_norm, upload(L.k_norm));
    MAGNETAR_ASSIGN_OR_RETURN(d.ffn_norm, upload(L.ffn_norm));
    if (L.moe() && pool_bytes_ > 0) {
      d.moe = true;
      MAGNETAR_ASSIGN_OR_RETURN(d.gate_inp, upload(L.gate_inp));
      d.exp_type = L.gate_exps.type;
      d.down_type = L.down_exps.type;
      const size_t parts[3] = {size_t(L.gate_exps.ne[1]) * L.gate_exps.row_bytes,
                               size_t(L.up_exps.ne[1]) * L.up_exps.row_bytes,
                               size_t(L.down_exps.ne[1]) * L.down_exps.row_bytes};
      for (int p = 0; p < 3; ++p) part_cap_[p] = std::max(part_cap_[p], align256(parts[p]));
    } else if (L.moe()) {
      d.moe = true;
      MAGNETAR_ASSIGN_OR_RETURN(d.gate_inp, upload(L.gate_inp));
      d.exp_type = L.gate_exps.type;
      d.down_type = L.down_exps.type;
      // The layer's experts in one buffer, each part 256-byte aligned, copied from wherever the file keeps
      // them (stacked tensors or packed records: the layout says).
      const size_t part_bytes[3] = {align256(size_t(L.gate_exps.ne[1]) * L.gate_exps.row_bytes),
                                    align256(size_t(L.up_exps.ne[1]) * L.up_exps.row_bytes),
                                    align256(size_t(L.down_exps.ne[1]) * L.down_exps.row_bytes)};
      const size_t per_expert = part_bytes[0] + part_bytes[1] + part_bytes[2];
      MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer buf, device_buffer(per_expert * size_t(X)));
      std::vector<int32_t> all(static_cast<size_t>(X));
      for (int32_t e = 0; e < int32_t(X); ++e) all[size_t(e)] = e;
      std::vector<experts::ExpertPtrs> ptrs(static_cast<size_t>(X));
      std::vector<uint8_t> ready(static_cast<size_t>(X));
      mapped->acquire(int64_t(il), all, ptrs, ready);
      d.host_table.resize(size_t(X) * 3);
      for (int64_t e = 0; e < X; ++e) {
        size_t off = size_t(e) * per_expert;
        for (int p = 0; p < 3; ++p) {
          const size_t bytes = size_t(layout_->extent(int64_t(il), e, experts::Part(p)).bytes);
          MAGNETAR_RETURN_IF_ERROR(buf.upload(ptrs[size_t(e)].part[p], bytes, off));
          d.host_table[size_t(e) * 3 + size_t(p)] = static_cast<uint8_t*>(buf.data()) + off;
          off += part_bytes[p];
        }
      }
      mapped->release();
      MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer table, device_buffer(d.host_table.size() * sizeof(void*)));
      MAGNETAR_RETURN_IF_ERROR(table.upload(d.host_table.data(), d.host_table.size() * sizeof(void*)));
      d.table = static_cast<const void* const*>(table.data());
      d.expert_base = buf.data();
      d.expert_stride = per_expert;
      d.part_offset[1] = part_bytes[0];
      d.part_offset[2] = part_bytes[0] + part_bytes[1];
      owned_.push_back(std::move(buf));
      owned_.push_back(std::move(table));
    } else {
      MAGNETAR_ASSIGN_OR_RETURN(d.ffn_gate, upload(L.ffn_gate));
      MAGNETAR_ASSIGN_OR_RETURN(d.ffn_up, upload(L.ffn_up));
      MAGNETAR_ASSIGN_OR_RETURN(d.ffn_down, upload(L.ffn_down));
    }
    layers_.push_back(std::move(d));
  }

  // ---- the expert pool (tiered mode) ------------------------------------------------------------------------
  if (pool_bytes_ > 0 && X > 0) {
    slot_bytes_ = part_cap_[0] + part_cap_[1] + part_cap_[2];
    const uint64_t n_slots = pool_bytes_ / slot_bytes_;
    if (n_slots < uint64_t(X)) {  // a layer's experts must fit at once (a prefill chunk touches most of them)
      return Status::error(format("the GPU expert pool of %.1f MiB holds %llu experts; it needs at least one layer's "
                                  "%lld (%.1f MiB)", double(pool_bytes_) / double(1 << 20),
                                  (unsigned long long)n_slots, (long long)X,
                                  double(slot_bytes_) * double(X) / double(1 << 20)));
    }
    MAGNETAR_ASSIGN_OR_RETURN(pool_, device_buffer(n_slots * slot_bytes_));
    slots_.resize(n_slots);
    slot_of_.assign(size_t(hp_.n_layer * X), -1);
    // lfu's half-life: the RAM store's default, in ticks (one per layer call).
    policy_ = experts::make_policy(policy_name_, size_t(hp_.n_layer * X),
                                   experts::StoreOptions{}.half_life_tokens * double(hp_.n_layer));
    if (!policy_) {
      return Status::error("unknown GPU expert pool policy '" + policy_name_ + "' (" + experts::kPolicyNames + ")");
    }
    pool_ptrs_.resize(size_t(X) * 3);
    tier_stats_.slots = n_slots;
    tier_stats_.slot_bytes = slot_bytes_;
    mapped_ = std::make_unique<experts::MappedExperts>(file_, *layout_);
  }

  // ---- scratch -----------------------------------------------------------------------------------------------
  const size_t B = size_t(n_batch_), R = B * size_t(K), f = sizeof(float);
  rope_at_ = (B * 4 + 15) / 16 * 16;
  const size_t positions_bytes = rope_at_ + B * size_t(D) * f;
  // Quantized activation rows: Q8_1 (36 bytes per 32) or Q8_K (292 per 256) of up to max_cols (+ a block).
  act_row_max_ = int64_t(quant::row_size(quant::Type::Q8_K, (max_cols + 255) / 256 * 256));
  act_row_max_ =
      std::max<int64_t>(act_row_max_, int64_t(quant::row_size(quant::Type::Q8_1, (max_cols + 31) / 32 * 32)));
  MAGNETAR_ASSIGN_OR_RETURN(mv_ws_, cuda::MatvecWorkspace::create(max_cols, kVec));
  MAGNETAR_ASSIGN_OR_RETURN(attn_ws_, cuda::AttentionWorkspace::create(hp_.n_head, D, std::min(n_batch_, kSeqs)));
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const Want wants[] = {
      {&x_, B * size_t(E) * f},
      {&x2_, size_t(E) * f},
      {&xn_, B * size_t(E) * f},
      {&proj_, B * size_t(E) * f},
      {&qkv_, B * size_t(q_dim + 2 * kv_dim) * f},
      {&attn_, B * size_t(q_dim) * f},
      {&router_, B * size_t(std::max<int64_t>(X, 1)) * f},
      {&ids_, size_t(hp_.n_layer) * R * 4},
      {&weights_, R * f},
      {&gu_, 2 * std::max(R * size_t(hp_.n_ff_exp), any_dense ? B * size_t(hp_.n_ff) : 0) * f},
      {&down_, R * size_t(E) * f},
      {&q_in_, std::max(B, R) * size_t(act_row_max_)},
      {&q_exp_, B * size_t(act_row_max_)},
      {&positions_, positions_bytes},
      {&items_, (R + size_t(std::max<int64_t>(X, 1))) * sizeof(GroupItem)},
      {&x_rows_, R * 4},
      {&slot_rows_, R * 4},
      {&logits_, size_t(kVec) * size_t(hp_.n_vocab) * f},
  };
  for (const Want& want : wants) {
    MAGNETAR_ASSIGN_OR_RETURN(*want.buf, device_buffer(want.bytes));
  }
  MAGNETAR_ASSIGN_OR_RETURN(h_x_, cuda::PinnedBuffer::allocate(B * size_t(E) * f));
  MAGNETAR_ASSIGN_OR_RETURN(h_positions_, cuda::PinnedBuffer::allocate(positions_bytes));
  MAGNETAR_ASSIGN_OR_RETURN(h_ids_, cuda::PinnedBuffer::allocate(size_t(hp_.n_layer) * R * 4));
  MAGNETAR_ASSIGN_OR_RETURN(h_items_, cuda::PinnedBuffer::allocate(
                                          (R + size_t(std::max<int64_t>(X, 1))) * sizeof(GroupItem) + 2 * R * 4));
  MAGNETAR_ASSIGN_OR_RETURN(h_logits_, cuda::PinnedBuffer::allocate(size_t(kVec) * size_t(hp_.n_vocab) * f));
  if (pool_bytes_ > 0) {
    MAGNETAR_ASSIGN_OR_RETURN(next_ids_, device_buffer(R * 4));
    MAGNETAR_ASSIGN_OR_RETURN(next_weights_, device_buffer(R * f));
    MAGNETAR_ASSIGN_OR_RETURN(h_next_ids_, cuda::PinnedBuffer::allocate(R * 4));
    MAGNETAR_ASSIGN_OR_RETURN(copy_stream_, cuda::Stream::create());
    for (int b = 0; b < 2; ++b) {
      MAGNETAR_ASSIGN_OR_RETURN(copy_start_[b], cuda::Event::create());
      MAGNETAR_ASSIGN_OR_RETURN(copy_end_[b], cuda::Event::create());
    }
  }
  if (sweep_tokens_ > 0) {
    MAGNETAR_ASSIGN_OR_RETURN(sweep_x_, device_buffer(size_t(CudaLoad::sweep_bytes(E, sweep_tokens_)) / 2));
    MAGNETAR_ASSIGN_OR_RETURN(sweep_p_, device_buffer(size_t(CudaLoad::sweep_bytes(E, sweep_tokens_)) / 2));
  }
  if (cpu_lane_) {
    const size_t F = size_t(hp_.n_ff_exp), row = std::max(size_t(max_cols) * f, size_t(act_row_max_));
    MAGNETAR_ASSIGN_OR_RETURN(h_xn_, cuda::PinnedBuffer::allocate(B * size_t(E) * f));
    MAGNETAR_ASSIGN_OR_RETURN(h_xn_ready_, cuda::Event::create());
    MAGNETAR_ASSIGN_OR_RETURN(h_down_, cuda::PinnedBuffer::allocate(R * size_t(E) * f));
    lane_xt_.resize(B * row);
    lane_xg_.resize(R * row);
    lane_h_.resize(R * row);
    lane_gu_.resize(2 * R * F);
  }
  stream_.synchronize();
  return Status();
}

// ---- building blocks --------------------------------------------------------------------------------------------

const void* Qwen3Cuda::quantize(quant::Type weight_type, const float* x, int64_t cols, int64_t n, void* out) const {
  if (!is_quantized(weight_type)) return nullptr;
  MAGNETAR_CHECK(cuda::quantize_activations(quant::traits(weight_type).vec_dot_type, x, out, cols, n, stream_).ok());
  return out;
}

const void* Qwen3Cuda::quantize_xn(quant::Type weight_type, int64_t n) const {
  if (!is_quantized(weight_type)) return nullptr;
  if (quant::traits(weight_type).vec_dot_type == xn_act_) return q_exp_.data();
  return quantize(weight_type, xn_.as<float>(), hp_.n_embd, n, q_exp_.data());
}

Status Qwen3Cuda::add_norm(float* x, const float* weight, quant::Type next, int64_t n, bool combine) const {
  const quant::Type act = is_quantized(next) ? quant::traits(next).vec_dot_type : quant::Type::F32;
  const bool fold = fused(Fusion::kNormQuant) ||
                    (fused(Fusion::kNormQuantCluster) && cuda::norm_in_cluster(act, n, hp_.n_embd));
  xn_act_ = fold && cuda::can_quantize_norm(act, hp_.n_embd) ? act : quant::Type::F32;
  return cuda::add_rms_norm({.x = x, .residual = combine ? down_.as<float>() : proj_.as<float>(),
                             .weight = weight, .y = xn_.as<float>(), .n_rows = n, .n_cols = hp_.n_embd,
                             .eps = hp_.rms_eps, .y_type = xn_act_,
                             .y_quantized = xn_act_ == quant::Type::F32 ? nullptr : q_exp_.data(),
                             .residual_rows = combine ? slot_rows_.as<int32_t>() : nullptr,
                             .residual_weights = combine ? weights_.as<float>() : nullptr,
                             .residual_k = combine ? hp_.n_expert_used : 0},
                            stream_);
}

bool Qwen3Cuda::norm_in_router(const DevLayer& L, int64_t n) const {
  return n == 1 && L.moe && norm_router() && cuda::add_rms_norm_matvec_fits(L.gate_inp.type, hp_.n_embd);
}

Status Qwen3Cuda::add_norm_router(const DevLayer& L, float* x, float* x_out) const {
  // The fused launch quantizes to Q8_K only; the experts of other activation formats quantize xn_ themselves.
  const bool q8k = is_quantized(L.exp_type) && quant::traits(L.exp_type).vec_dot_type == quant::Type::Q8_K;
  xn_act_ = q8k ? quant::Type::Q8_K : quant::Type::F32;
  return cuda::add_rms_norm_matvec(
      {.norm = {.x = x, .residual = proj_.as<float>(), .weight = L.ffn_norm.f32(),
                .y = xn_.as<float>(), .n_rows = 1, .n_cols = hp_.n_embd, .eps = hp_.rms_eps, .y_type = xn_act_,
                .y_quantized = xn_act_ == quant::Type::F32 ? nullptr : q_exp_.data(), .x_out = x_out},
       .type = L.gate_inp.type, .weights = L.gate_inp.p, .rows = L.gate_inp.rows, .out = router_.as<float>()},
      stream_);
}

Status Qwen3Cuda::linear(const DevTensor& W, const float* x, float* y, int64_t n, const void* xq) const {
  const bool quantized = is_quantized(W.type);
  if (quantized && xq == nullptr) xq = quantize(W.type, x, W.cols, n, q_in_.data());
  if (use_mmq(W.type, n)) {
    return cuda::matmul_q({.type = W.type, .weights = W.p, .rows = W.rows, .cols = W.cols, .x = xq, .y = y, .n = n},
                          stream_);
  }
  if (n > kVec && mmq_enabled() && cuda::has_matmul_float(W.type)) {
    return cuda::matmul_float({.type = W.type, .weights = W.p, .rows = W.rows, .cols = W.cols, .x = x, .y = y, .n = n},
                              stream_);
  }
  const size_t act_row = quantized ? quant::row_size(quant::traits(W.type).vec_dot_type, W.cols) : 0;
  for (int64_t c = 0; c < n; c += kVec) {
    const int64_t nv = std::min(kVec, n - c);
    MAGNETAR_RETURN_IF_ERROR(
        cuda::matvec({.type = W.type,
                      .weights = W.p,
                      .rows = W.rows,
                      .cols = W.cols,
                      .x = x + c * W.cols,
                      .y = y + c * W.rows,
                      .n_vectors = nv,
                      .x_quantized = quantized ? static_cast<const uint8_t*>(xq) + size_t(c) * act_row : nullptr,
                      .rows_per_warp = mmvq_rows_per_warp(),
                      .stationary = mmvq_stationary(W.type),
                      .staged = mmvq_staged()},
                     mv_ws_, stream_));
  }
  return Status();
}

Result<DeviceKv*> Qwen3Cuda::mirror_of(kv::KvCache& cache) const {
  if (auto* m = dynamic_cast<DeviceKv*>(cache.mirror())) return m;
  if (cache.type() != kv_type_) {
    return Status::error(format("a %s KV cache given to a model loaded for %s KV (CudaLoad::kv_type)",
                                std::string(quant::type_name(cache.type())).c_str(),
                                std::string(quant::type_name(kv_type_)).c_str()));
  }
  auto m = std::make_unique<DeviceKv>();
  m->row_bytes = quant::row_size(cache.type(), cache.row_elements());
  const size_t bytes = size_t(cache.n_ctx()) * m->row_bytes;
  for (int64_t l = 0; l < hp_.n_layer; ++l) {
    Result<DeviceBuffer> k = DeviceBuffer::allocate(bytes), v = DeviceBuffer::allocate(bytes);
    if (!k.ok() || !v.ok()) {
      return Status::error(format("out of GPU memory for a session's KV cache (%.2f GiB for %lld positions)",
                                  double(bytes) * 2 * double(hp_.n_layer) / double(1ull << 30),
                                  (long long)cache.n_ctx()));
    }
    m->k.push_back(std::move(k).value());
    m->v.push_back(std::move(v).value());
  }
  if (kv_type_ != quant::Type::F16 && cache.n_ctx() > kv_f16_rows_) {
    // After the session's KV: a KV that does not fit leaves the scratch as it was; a scratch that does not fit
    // frees the KV (m) and the sessions keep the scratch they have.
    const size_t f16_bytes = size_t(cache.n_ctx()) * size_t(cache.row_elements()) * 2;
    Result<DeviceBuffer> k = DeviceBuffer::allocate(f16_bytes), v = DeviceBuffer::allocate(f16_bytes);
    if (!k.ok() || !v.ok()) {
      return Status::error(
          format("out of GPU memory for the %s KV cache's F16 prefill scratch (%.2f GiB for %lld "
                 "positions)",
                 std::string(quant::type_name(kv_type_)).c_str(), double(f16_bytes) * 2 / double(1ull << 30),
                 (long long)cache.n_ctx()));
    }
    graphs_.clear();  // a graph that dequantizes (MAGNETAR_CUDA_DECODE_MMA=0) captured the old scratch's address
    kv_f16_k_ = std::move(k).value();
    kv_f16_v_ = std::move(v).value();
    kv_f16_rows_ = cache.n_ctx();
  }
  m->id = next_mirror_id_++;
  DeviceKv* raw = m.get();
  cache.set_mirror(std::move(m));
  return raw;
}

bool Qwen3Cuda::drafts_attend_as_decode(int64_t n_tok, int64_t t0) const {
  const int64_t D = hp_.head_dim;
  return n_tok > 1 && t0 + n_tok <= attn_ws_.max_seqs() && D % 64 == 0 && D <= cuda::kMaxQkNormRopeHeadDim &&
         fused(Fusion::kAttnSeqs) && decode_mma_for({.n_tok = n_tok, .head_dim = D}, hp_.n_head / hp_.n_head_kv);
}

Status Qwen3Cuda::attention_block(const DevLayer& L, int64_t il, std::span<const SeqSpan> seqs,
                                  std::span<DeviceKv* const> mirrors, int64_t n) const {
  const int64_t D = hp_.head_dim, q_dim = hp_.n_head * D, kv_dim = hp_.n_head_kv * D;
  const float* xn = xn_.as<float>();
  // qkv_: [n, q_dim] q, then [n, kv_dim] k, then v; for one token that is the merged matrix's output row.
  float* q = qkv_.as<float>();
  float* k = q + n * q_dim;
  float* v = k + n * kv_dim;
  const void* xq = qkv_share_input(L) ? quantize_xn(L.wq.type, n) : nullptr;
  // Prefill: one int8 tensor-core launch over the merged matrix when its row tiles split at q | k | v (the k and v
  // projections alone are 4 row tiles each: 32 CTAs at 512 tokens, a quarter of the H200's SMs).
  const bool split = L.wqkv.p != nullptr && xq != nullptr && use_mmq(L.wqkv.type, n) &&
                     q_dim % cuda::kMatmulQRowTile == 0 && kv_dim % cuda::kMatmulQRowTile == 0;
  if (n == 1 && L.wqkv.p != nullptr) {
    MAGNETAR_RETURN_IF_ERROR(linear(L.wqkv, xn, q, 1, xq));
  } else if (n <= kVec && L.wqkv.p != nullptr && xq != nullptr && qkv_one_launch()) {
    // A few tokens (the batched decode of several sessions): the merged matrix in one launch, its rows into q, k, v.
    MAGNETAR_RETURN_IF_ERROR(cuda::matvec({.type = L.wqkv.type,
                                           .weights = L.wqkv.p,
                                           .rows = L.wqkv.rows,
                                           .cols = L.wqkv.cols,
                                           .y = q,
                                           .n_vectors = n,
                                           .x_quantized = xq,
                                           .rows_per_warp = mmvq_rows_per_warp(),
                                           .stationary = mmvq_stationary(L.wqkv.type),
                                           .staged = mmvq_staged(),
                                           .split = {q_dim, q_dim + kv_dim},
                                           .y_split = {k, v}},
                                          mv_ws_, stream_));
  } else if (split) {
    MAGNETAR_RETURN_IF_ERROR(cuda::matmul_q({.type = L.wqkv.type, .weights = L.wqkv.p, .rows = L.wqkv.rows,
                                             .cols = L.wqkv.cols, .x = xq, .y = q, .n = n,
                                             .split = {q_dim, q_dim + kv_dim}, .y_split = {k, v}},
                                            stream_));
  } else {
    MAGNETAR_RETURN_IF_ERROR(linear(L.wq, xn, q, n, xq));
    MAGNETAR_RETURN_IF_ERROR(linear(L.wk, xn, k, n, xq));
    MAGNETAR_RETURN_IF_ERROR(linear(L.wv, xn, v, n, xq));
  }
  const int32_t* pos = positions_.as<int32_t>();
  // Head sizes qk_norm_rope takes: q/k norm + RoPE and the K/V stores in one launch per sequence (qkv_prepare);
  // others: norm, RoPE, then the stores, op by op.
  const bool one_launch = D % 64 == 0 && D <= cuda::kMaxQkNormRopeHeadDim;
  if (!one_launch) {
    MAGNETAR_RETURN_IF_ERROR(cuda::rms_norm({.x = q, .weight = L.q_norm.f32(), .y = q, .n_rows = n * hp_.n_head,
                                             .n_cols = D, .eps = hp_.rms_eps}, stream_));
    MAGNETAR_RETURN_IF_ERROR(cuda::rms_norm({.x = k, .weight = L.k_norm.f32(), .y = k, .n_rows = n * hp_.n_head_kv,
                                             .n_cols = D, .eps = hp_.rms_eps}, stream_));
    MAGNETAR_RETURN_IF_ERROR(cuda::rope_neox({.x = q, .positions = pos, .n_tok = n, .n_head = hp_.n_head,
                                              .head_dim = D, .theta = hp_.rope_theta}, stream_));
    MAGNETAR_RETURN_IF_ERROR(cuda::rope_neox({.x = k, .positions = pos, .n_tok = n, .n_head = hp_.n_head_kv,
                                              .head_dim = D, .theta = hp_.rope_theta}, stream_));
  }
  // Every sequence's attention on the decode kernel, which can quantize its output for a Q8_K product (kAttnQuant):
  // the output projection reads those bytes.
  const int64_t group = hp_.n_head / hp_.n_head_kv;
  bool quantized_out = fused(Fusion::kAttnQuant) && is_quantized(L.wo.type) &&
                       quant::traits(L.wo.type).vec_dot_type == quant::Type::Q8_K &&
                       cuda::attention_decode_quantizes(D, group);
  const size_t q_row = quantized_out ? quant::row_size(quant::Type::Q8_K, q_dim) : 0;
  for (const SeqSpan& seq : seqs) {
    quantized_out = quantized_out && decode_mma_for({.n_tok = seq.n_tok, .head_dim = D}, group);
  }
  const bool prepare_one =
      one_launch && fused(Fusion::kAttnPrepare) && decode_mma_for({.n_tok = 1, .head_dim = D}, group);
  // A batched decode's tokens (one per sequence, each attention with its prepare) in one launch (kAttnSeqs) per
  // kernel they take at their lengths (cuda::attention_decode_variant: at most two): the same bits as a launch each,
  // one or two launches on the layer's chain. (The workspace holds at most kSeqs: AttentionWorkspace::create.)
  bool together = prepare_one && fused(Fusion::kAttnSeqs) && seqs.size() > 1 &&
                  int64_t(seqs.size()) <= attn_ws_.max_seqs();
  std::array<int, kSeqs> variant_of{};  // each sequence's kernel at its length; 0 once its launch is queued
  for (size_t s = 0; together && s < seqs.size(); ++s) {
    together = seqs[s].n_tok == 1;
    variant_of[s] = cuda::attention_decode_variant(D, kv_type_, seqs[s].pos0 + 1);
  }
  if (together) {
    for (size_t first = 0; first < seqs.size(); ++first) {
      const int variant = variant_of[first];
      if (variant == 0) continue;
      // The sequences of first's kernel, in batch order: their caches and token rows.
      std::array<const void*, kSeqs> seq_k{}, seq_v{};
      std::array<int32_t, kSeqs> seq_tok{};
      int64_t count = 0, max_rows = 0;
      for (size_t s = first; s < seqs.size(); ++s) {
        if (variant_of[s] != variant) continue;
        variant_of[s] = 0;
        seq_k[size_t(count)] = mirrors[s]->k[size_t(il)].data();
        seq_v[size_t(count)] = mirrors[s]->v[size_t(il)].data();
        seq_tok[size_t(count++)] = int32_t(s);
        max_rows = std::max(max_rows, seqs[s].kv->n_ctx());
      }
      const cuda::AttentionArgs args{
          .q = q, .out = attn_.as<float>(), .n_tok = count, .pos0 = seqs[first].pos0, .n_head = hp_.n_head,
          .n_head_kv = hp_.n_head_kv, .head_dim = D, .window = L.window, .scale = float(1.0 / std::sqrt(double(D))),
          .pos0_device = pos, .max_rows = max_rows, .kv_type = kv_type_,
          .out_q8k = quantized_out ? q_in_.data() : nullptr,
          .prepare = {.q_weight = L.q_norm.f32(), .k = k, .k_weight = L.k_norm.f32(), .v = v,
                      .rope = reinterpret_cast<const float*>(positions_.as<uint8_t>() + rope_at_),
                      .eps = hp_.rms_eps},
          .seq_k = seq_k.data(), .seq_v = seq_v.data(), .seq_tok = seq_tok.data()};
      MAGNETAR_RETURN_IF_ERROR(attend(args, group, attn_ws_, stream_));
    }
    return linear(L.wo, attn_.as<float>(), proj_.as<float>(), n, quantized_out ? q_in_.data() : nullptr);
  }
  int64_t t0 = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SeqSpan& seq = seqs[s];
    void* kc = mirrors[s]->k[size_t(il)].data();
    void* vc = mirrors[s]->v[size_t(il)].data();
    // A decode token's position is read on the device (positions_), so a decode graph replays these launches; so is
    // the first row of a step with drafts (as_decode).
    const int32_t* pos0_device = seq.n_tok == 1 ? pos + t0 : nullptr;
    const bool as_decode = drafts_attend_as_decode(seq.n_tok, t0);
    const int32_t* row0_device = as_decode ? pos + t0 : pos0_device;
    // A decode token's qkv_prepare inside its attention launch (AttentionArgs::prepare, kAttnPrepare).
    const bool prepare_in = prepare_one && seq.n_tok == 1;
    if (one_launch && !prepare_in) {
      MAGNETAR_RETURN_IF_ERROR(cuda::qkv_prepare({.q = q + t0 * q_dim,
                                                  .q_weight = L.q_norm.f32(),
                                                  .k = k + t0 * kv_dim,
                                                  .k_weight = L.k_norm.f32(),
                                                  .v = v + t0 * kv_dim,
                                                  .k_cache = kc,
                                                  .v_cache = vc,
                                                  .positions = pos + t0,
                                                  .n_tok = seq.n_tok,
                                                  .n_head = hp_.n_head,
                                                  .n_head_kv = hp_.n_head_kv,
                                                  .head_dim = D,
                                                  .eps = hp_.rms_eps,
                                                  .theta = hp_.rope_theta,
                                                  .row0 = seq.pos0,
                                                  .row0_device = row0_device,
                                                  .kv_type = kv_type_},
                                                 stream_));
    } else if (!one_launch) {  // F16 (init: Q8_0 and FP8 KV take the fused head sizes)
      MAGNETAR_RETURN_IF_ERROR(cuda::store_kv({.x = k + t0 * kv_dim, .cache = static_cast<uint16_t*>(kc),
                                               .n_tok = seq.n_tok, .n = kv_dim, .row0 = seq.pos0,
                                               .row0_device = pos0_device}, stream_));
      MAGNETAR_RETURN_IF_ERROR(cuda::store_kv({.x = v + t0 * kv_dim, .cache = static_cast<uint16_t*>(vc),
                                               .n_tok = seq.n_tok, .n = kv_dim, .row0 = seq.pos0,
                                               .row0_device = pos0_device}, stream_));
    }
    cuda::AttentionArgs args{
        .q = q + t0 * q_dim, .k_cache = kc, .v_cache = vc, .out = attn_.as<float>() + t0 * q_dim,
        .n_tok = seq.n_tok, .pos0 = seq.pos0, .n_head = hp_.n_head, .n_head_kv = hp_.n_head_kv, .head_dim = D,
        .window = L.window, .scale = float(1.0 / std::sqrt(double(D))), .pos0_device = pos0_device,
        .max_rows = seq.kv->n_ctx(), .kv_type = kv_type_,
        .out_q8k = quantized_out ? static_cast<uint8_t*>(q_in_.data()) + size_t(t0) * q_row : nullptr};
    if (prepare_in) {
      args.prepare = {.q_weight = L.q_norm.f32(), .k = k + t0 * kv_dim, .k_weight = L.k_norm.f32(),
                      .v = v + t0 * kv_dim,
                      .rope = reinterpret_cast<const float*>(positions_.as<uint8_t>() + rope_at_) + t0 * D,
                      .eps = hp_.rms_eps};
    }
    // A few tokens of one sequence (speculative decoding's drafts, Session::step(id, drafts)), K/V stored above: each
    // token a grid z of the several-sequences decode kernel over this sequence's caches at its own position, so that
    // its rows split over the GPU as a decode token's do (one launch of n_tok tokens gives each token one CTA per KV
    // head: 4.7x a plain step at 16K with one draft). Tokens of different kernels (attention_decode_variant at their
    // lengths) go in a launch each.
    if (as_decode) {
      for (int64_t first = 0; first < seq.n_tok;) {
        const int variant = cuda::attention_decode_variant(D, kv_type_, seq.pos0 + first + 1);
        std::array<const void*, kSeqs> seq_k{}, seq_v{};
        std::array<int32_t, kSeqs> seq_tok{};
        int64_t count = 0;
        while (first + count < seq.n_tok &&
               cuda::attention_decode_variant(D, kv_type_, seq.pos0 + first + count + 1) == variant) {
          seq_k[size_t(count)] = kc;
          seq_v[size_t(count)] = vc;
          seq_tok[size_t(count)] = int32_t(t0 + first + count);
          ++count;
        }
        cuda::AttentionArgs few = args;
        few.q = q;
        few.out = attn_.as<float>();
        few.n_tok = count;
        few.pos0 = seq.pos0 + first;
        few.pos0_device = pos;
        few.out_q8k = quantized_out ? q_in_.data() : nullptr;
        few.seq_k = seq_k.data();
        few.seq_v = seq_v.data();
        few.seq_tok = seq_tok.data();
        few.fresh_row = pos + t0;  // qkv_prepare, the launch before, stored the rows of all n_tok tokens
        MAGNETAR_RETURN_IF_ERROR(attend(few, group, attn_ws_, stream_));
        first += count;
      }
      t0 += seq.n_tok;
      continue;
    }
    if (kv_type_ != quant::Type::F16 && !decode_mma_for(args, group)) {
      // Prefill: the F16 kernels read the attended rows dequantized (the values decode computes with).
      for (auto [cache, out] : {std::pair{kc, &kv_f16_k_}, std::pair{vc, &kv_f16_v_}}) {
        MAGNETAR_RETURN_IF_ERROR(cuda::kv_to_f16({.cache = cache,
                                                  .type = kv_type_,
                                                  .out = out->as<uint16_t>(),
                                                  .n = kv_dim,
                                                  .rows = pos0_device ? seq.kv->n_ctx() : seq.pos0 + seq.n_tok,
                                                  .last_row_device = pos0_device},
                                                 stream_));
      }
      args.k_cache = kv_f16_k_.data();
      args.v_cache = kv_f16_v_.data();
      args.kv_type = quant::Type::F16;
    }
    MAGNETAR_RETURN_IF_ERROR(attend(args, group, attn_ws_, stream_));
    t0 += seq.n_tok;
  }
  return linear(L.wo, attn_.as<float>(), proj_.as<float>(), n, quantized_out ? q_in_.data() : nullptr);
}

Result<const void*> Qwen3Cuda::swiglu_for(quant::Type down_type, float* gate, const float* up, int64_t rows,
                                           int64_t cols, void* q_out) const {
  if (!is_quantized(down_type)) {
    MAGNETAR_RETURN_IF_ERROR(cuda::swiglu(gate, up, rows * cols, stream_));
    return static_cast<const void*>(nullptr);
  }
  const quant::Type act = quant::traits(down_type).vec_dot_type;
  if (fused(Fusion::kSwigluQuant) && cols % quant::traits(act).block_size == 0) {
    MAGNETAR_RETURN_IF_ERROR(cuda::swiglu_quantize(
        {.gate = gate, .up = up, .n_rows = rows, .n_cols = cols, .out_type = act, .out = q_out}, stream_));
    return static_cast<const void*>(q_out);
  }
  MAGNETAR_RETURN_IF_ERROR(cuda::swiglu(gate, up, rows * cols, stream_));
  return quantize(down_type, gate, cols, rows, q_out);
}

Status Qwen3Cuda::dense_ffn(const DevLayer& L, int64_t n) const {
  const int64_t F = hp_.n_ff;
  float* gate = gu_.as<float>();
  float* up = gate + n * F;
  const bool shared = L.ffn_gate.type == L.ffn_up.type;
  const void* xq = shared ? quantize_xn(L.ffn_gate.type, n) : nullptr;
  MAGNETAR_RETURN_IF_ERROR(linear(L.ffn_gate, xn_.as<float>(), gate, n, xq));
  MAGNETAR_RETURN_IF_ERROR(linear(L.ffn_up, xn_.as<float>(), up, n, xq));
  MAGNETAR_ASSIGN_OR_RETURN(const void* h, swiglu_for(L.ffn_down.type, gate, up, n, F, q_in_.data()));
  return linear(L.ffn_down, gate, proj_.as<float>(), n, h);
}

template <typename PtrOf>
int64_t Qwen3Cuda::group_rows_on_host(const int32_t* h_ids, int64_t n, int32_t item_rows, PtrOf ptr_of,
                                      int64_t* max_n, std::span<const int32_t> late, Early* early) const {
  const int64_t X = hp_.n_expert, K = hp_.n_expert_used, R = n * K;
  auto* h_items = h_items_.as<GroupItem>();
  auto* h_x_rows = reinterpret_cast<int32_t*>(h_items + R + X);
  int32_t* h_slot_rows = h_x_rows + R;
  std::vector<int32_t>& begin = expert_begin_;
  std::vector<int32_t>& count = expert_rows_;
  std::vector<uint8_t>& is_late = late_;
  count.assign(size_t(X), 0);
  for (int64_t r = 0; r < R; ++r) count[size_t(h_ids[r])]++;
  is_late.assign(size_t(X), 0);
  for (const int32_t e : late) is_late[size_t(e)] = 1;
  // Rows in expert order, the early experts' first (pass 0), then the late ones'.
  begin.assign(size_t(X), 0);
  int32_t at = 0, early_rows = 0;
  for (const uint8_t pass : {0, 1}) {
    for (int64_t e = 0; e < X; ++e) {
      if (is_late[size_t(e)] != pass) continue;
      begin[size_t(e)] = at;
      at += count[size_t(e)];
    }
    if (pass == 0) early_rows = at;
  }
  std::vector<int32_t>& fill = expert_fill_;
  fill.assign(begin.begin(), begin.end());
  for (int64_t r = 0; r < R; ++r) {  // r = t * K + j
    const int32_t row = fill[size_t(h_ids[r])]++;
    h_x_rows[row] = int32_t(r / K);
    h_slot_rows[r] = row;
  }
  int64_t n_items = 0;
  *max_n = 1;
  for (const uint8_t pass : {0, 1}) {
    if (pass == 1) *early = {.items = n_items, .rows = early_rows};
    for (int64_t e = 0; e < X; ++e) {
      if (is_late[size_t(e)] != pass) continue;
      const int32_t end = begin[size_t(e)] + count[size_t(e)];
      for (int32_t r0 = begin[size_t(e)]; r0 < end; r0 += item_rows) {
        GroupItem& it = h_items[n_items++];
        for (int p = 0; p < 3; ++p) it.w[p] = ptr_of(e, p);
        it.row0 = r0;
        it.n = std::min<int32_t>(item_rows, end - r0);
        *max_n = std::max<int64_t>(*max_n, it.n);
      }
    }
  }
  stream_.copy(items_.data(), h_items, size_t(n_items) * sizeof(GroupItem));
  stream_.copy(x_rows_.data(), h_x_rows, size_t(R) * 4);
  stream_.copy(slot_rows_.data(), h_slot_rows, size_t(R) * 4);
  return n_items;
}

Status Qwen3Cuda::moe_ffn(cpu::ThreadPool& pool, const DevLayer& L, int64_t il, int64_t n, const ForwardArgs& args,
                          bool routed) const {
  const int64_t E = hp_.n_embd, X = hp_.n_expert, K = hp_.n_expert_used, F = hp_.n_ff_exp;
  const int64_t R = n * K;
  float* router = router_.as<float>();
  int32_t* ids = ids_.as<int32_t>() + il * R;  // each layer's own (forward() reads them all back at once)
  auto* weights = weights_.as<float>();
  auto* items = items_.as<GroupItem>();
  auto* x_rows = x_rows_.as<int32_t>();
  auto* slot_rows = slot_rows_.as<int32_t>();
  // Decode with every expert resident: one item per (token, slot), built on the device by route_topk's launch (or, for
  // one token, by the expert products themselves: self_routed below).
  const bool resolve = routes_on_device(n);
  if (!routed) MAGNETAR_RETURN_IF_ERROR(linear(L.gate_inp, xn_.as<float>(), router, n));
  // Prefill with an mmq-able expert type groups up to kMmqItemRows rows per item for grouped_matmul_q.
  const bool mmq = use_mmq(L.exp_type, n) && cuda::has_matmul_q(L.down_type);
  // Decode's swiglu folded into the two products (Fusion::kSwigluMmvq) where every item has one row (max_n 1).
  const bool swiglu_in_products = !mmq && fused(Fusion::kSwigluMmvq) && mmvq_stationary(L.exp_type) &&
                                  mmvq_stationary(L.down_type) && cuda::has_matvec_swiglu(L.exp_type) &&
                                  cuda::matvec_stationary_fits(L.exp_type, E) &&
                                  cuda::matvec_stationary_fits(L.down_type, F);
  // One token, every expert resident: the products route themselves (route_in_products()), route_topk is not run.
  const bool self_routed = resolve && n == 1 && swiglu_in_products && route_in_products() &&
                           L.expert_base != nullptr && X <= cuda::kMaxRoutedExperts && K <= cuda::kMaxRoutedK;
  if (!self_routed) {
    MAGNETAR_RETURN_IF_ERROR(cuda::route_topk({.logits = router, .ids = ids, .weights = weights, .n_tok = n,
                                               .n_expert = X, .k = K, .normalize = hp_.norm_topk_prob,
                                               .table = resolve ? L.table : nullptr, .items = items,
                                               .x_rows = x_rows, .slot_rows = slot_rows}, stream_));
  }
  const cuda::RouteInProducts route{.logits = self_routed ? router : nullptr, .n_expert = int(X), .k = int(K),
                                    .base = L.expert_base, .stride = L.expert_stride,
                                    .offset = {L.part_offset[0], L.part_offset[1], L.part_offset[2]}};

  int64_t n_items = R, max_n = 1;
  Early early{.items = R, .rows = R};  // items and rows that need no copy still in flight (all but the pool's misses)
  // Bytes of one row of the down projection's quantized input (q_in_), or 0 (float input).
  const size_t h_row = is_quantized(L.down_type) ? quant::row_size(quant::traits(L.down_type).vec_dot_type, F) : 0;
  const int32_t item_rows = mmq ? kMmqItemRows : int32_t(kVec);
  lane_.clear();
  if (!resolve) {
    // Prefill, or the tiered mode: the ids come to the host, rows are grouped by expert (token order within an
    // expert, up to item_rows rows per item) and the items point at the resident copy or the pool slot.
    int32_t* h_ids = h_ids_.as<int32_t>() + il * R;
    stream_.copy(h_ids, ids, size_t(R) * 4);
    // --prefetch: the next MoE layer's router on this layer's input (Qwen3Model::predict_next's guess), its top-k
    // read back with this layer's ids; the source reads the guessed experts it lacks while this layer waits and
    // computes. router_ is free again: route_topk has consumed it.
    int64_t next = -1;
    if (args.prefetch && pool_bytes_ > 0 && args.experts != nullptr) {
      for (int64_t l = il + 1; l < hp_.n_layer && next < 0; ++l) {
        if (layers_[size_t(l)].moe) next = l;
      }
    }
    if (next >= 0) {
      MAGNETAR_RETURN_IF_ERROR(linear(layers_[size_t(next)].gate_inp, xn_.as<float>(), router, n));
      MAGNETAR_RETURN_IF_ERROR(cuda::route_topk({.logits = router, .ids = next_ids_.as<int32_t>(),
                                                 .weights = next_weights_.as<float>(), .n_tok = n, .n_expert = X,
                                                 .k = K, .normalize = hp_.norm_topk_prob}, stream_));
      stream_.copy(h_next_ids_.as<int32_t>(), next_ids_.as<int32_t>(), size_t(R) * 4);
    }
    stream_.synchronize();
    settle_copies();  // the previous MoE layer's copies have landed
    if (next >= 0) {
      const int32_t* guessed = h_next_ids_.as<int32_t>();
      guess_.assign(guessed, guessed + R);
      std::sort(guess_.begin(), guess_.end());
      guess_.erase(std::unique(guess_.begin(), guess_.end()), guess_.end());
      // Only what the pool lacks (a pooled expert needs no host read unless this layer's misses evict it).
      std::erase_if(guess_, [&](int32_t e) { return slot_of_[size_t(next * X + e)] >= 0; });
    }
    if (pool_bytes_ > 0) {
      active_.clear();
      rows_of_.assign(size_t(X), 0);
      for (int64_t r = 0; r < R; ++r) rows_of_[size_t(h_ids[r])]++;
      for (int32_t e = 0; e < int32_t(X); ++e) {
        if (rows_of_[size_t(e)] > 0) active_.push_back(e);
      }
      MAGNETAR_RETURN_IF_ERROR(pool_acquire(il, active_, rows_of_, args.experts ? *args.experts : *mapped_, next,
                                            guess_));
      // The CPU lane's input, only for a layer that has one (ahead of the experts' launches on the stream).
      if (!lane_.empty()) {
        stream_.copy(h_xn_.as<float>(), xn_.as<float>(), size_t(n * E) * sizeof(float));
        h_xn_ready_.record(stream_);
      }
      // The misses last, in a stage of their own, when their rows' quantized input (q_in_ at the first late row)
      // stays 4-byte aligned for the quantizers (a Q8_0 row of an odd number of blocks is 2 mod 4 bytes).
      const bool split = tier_overlap() && h_row % 4 == 0;
      n_items = group_rows_on_host(
          h_ids, n, item_rows, [&](int64_t e, int p) { return pool_ptrs_[size_t(e) * 3 + size_t(p)]; }, &max_n,
          split ? std::span<const int32_t>(misses_) : std::span<const int32_t>(), &early);
    } else {
      n_items = group_rows_on_host(
          h_ids, n, item_rows, [&](int64_t e, int p) { return L.host_table[size_t(e) * 3 + size_t(p)]; }, &max_n,
          {}, &early);
    }
  }
  // Items [item0, item0 + count) over rows [row0, row0 + rows): gate and up in one launch over [2, R, F] (the input is
  // each token's normed hidden state), swiglu, down. Each item's rows are computed the same way whichever launch
  // takes them.
  float* gate = gu_.as<float>();
  float* up = gate + R * F;
  float* down = down_.as<float>();
  const bool q_in = is_quantized(L.exp_type);
  const void* x = q_in ? quantize_xn(L.exp_type, n) : static_cast<const void*>(xn_.as<float>());
  // Decode's swiglu folded into the two products: gate/up writes silu(gate) * up as float rows into gate, which the
  // down projection quantizes itself.
  auto experts_on = [&](int64_t item0, int64_t count, int64_t row0, int64_t rows) -> Status {
    if (count == 0) return Status();
    const GroupItem* its = self_routed ? nullptr : items + item0;
    if (swiglu_in_products && max_n == 1) {
      // Items of resident experts (the batched decode of several sessions) stream through the bulk kernels' rings.
      const bool ring = !self_routed && resolve && L.expert_base != nullptr && experts_bulk_items();
      cuda::RouteInProducts gate_route = route;  // gate/up writes the combine's ids and weights
      if (self_routed) {
        gate_route.ids = ids;
        gate_route.weights = weights;
        gate_route.slot_rows = slot_rows;
        gate_route.normalize = hp_.norm_topk_prob;
      }
      MAGNETAR_RETURN_IF_ERROR(cuda::grouped_matvec({.type = L.exp_type, .items = its, .n_items = count, .part = 0,
                                                     .n_parts = 2, .rows = F, .cols = E, .x = x, .x_rows = x_rows,
                                                     .single_x = n == 1, .y = gate, .max_n = 1, .stationary = true,
                                                     .swiglu = true, .route = gate_route,
                                                     .bulk = self_routed ? experts_bulk() : ring},
                                                    stream_));
      return cuda::grouped_matvec({.type = L.down_type,
                                   .items = its,
                                   .n_items = count,
                                   .part = 2,
                                   .n_parts = 1,
                                   .rows = E,
                                   .cols = F,
                                   .x = gate,
                                   .x_rows = nullptr,
                                   .y = down,
                                   .max_n = 1,
                                   .stationary = true,
                                   .items_settled = settled_items(),
                                   .x_float = true,
                                   .route = route,
                                   .bulk = ring},
                                  stream_);
    }
    if (mmq) {
      MAGNETAR_RETURN_IF_ERROR(cuda::grouped_matmul_q({.type = L.exp_type, .items = its, .n_items = count,
                                                       .part = 0, .n_parts = 2, .rows = F, .cols = E, .x = x,
                                                       .x_rows = x_rows, .y = gate, .y_part_stride = R * F}, stream_));
    } else {
      MAGNETAR_RETURN_IF_ERROR(cuda::grouped_matvec({.type = L.exp_type,
                                                     .items = its,
                                                     .n_items = count,
                                                     .part = 0,
                                                     .n_parts = 2,
                                                     .rows = F,
                                                     .cols = E,
                                                     .x = x,
                                                     .x_rows = x_rows,
                                                     .single_x = n == 1,
                                                     .y = gate,
                                                     .y_part_stride = R * F,
                                                     .max_n = max_n,
                                                     .rows_per_warp = mmvq_rows_per_warp(),
                                                     .stationary = mmvq_stationary(L.exp_type)},
                                                    stream_));
    }
    MAGNETAR_ASSIGN_OR_RETURN(const void* h_q, swiglu_for(L.down_type, gate + row0 * F, up + row0 * F, rows, F,
                                                          static_cast<uint8_t*>(q_in_.data()) + size_t(row0) * h_row));
    const void* h = h_q != nullptr ? q_in_.data() : static_cast<const void*>(gate);  // rows of all items
    if (mmq) {
      return cuda::grouped_matmul_q({.type = L.down_type, .items = its, .n_items = count, .part = 2, .n_parts = 1,
                                     .rows = E, .cols = F, .x = h, .x_rows = nullptr, .y = down}, stream_);
    }
    return cuda::grouped_matvec({.type = L.down_type,
                                 .items = its,
                                 .n_items = count,
                                 .part = 2,
                                 .n_parts = 1,
                                 .rows = E,
                                 .cols = F,
                                 .x = h,
                                 .x_rows = nullptr,
                                 .y = down,
                                 .max_n = max_n,
                                 .rows_per_warp = mmvq_rows_per_warp(),
                                 .stationary = mmvq_stationary(L.down_type),
                                 .items_settled = settled_items()},
                                stream_);
  };
  // The pool's hits (and the CPU lane's null items) while the misses are copied on copy_stream_, then the misses.
  // Misses not split into a stage of their own (their rows' quantized input would not stay 4-byte aligned) are in
  // the first launches, which then wait for the copies too.
  if (early.items == n_items && copy_batches_ > 0) stream_.wait(copy_end_[copy_batches_ - 1]);
  MAGNETAR_RETURN_IF_ERROR(experts_on(0, early.items, 0, early.rows));
  if (early.items < n_items) {
    stream_.wait(copy_end_[copy_batches_ - 1]);
    MAGNETAR_RETURN_IF_ERROR(experts_on(early.items, n_items - early.items, early.rows, R - early.rows));
  }
  // The CPU lane's rows, computed while the GPU runs the launches above, then uploaded into their rows of down.
  if (!lane_.empty()) run_cpu_lane(pool, L, n);
  if (combine_in_norm()) return Status();  // the next add_norm combines (add_rms_norm's residual_rows)
  return cuda::moe_combine({.rows = down, .slot_rows = slot_rows, .weights = weights,
                            .out = proj_.as<float>(), .n_tok = n, .k = K, .n = E}, stream_);
}

// ---- forward ------------------------------------------------------------------------------------------------------

Status Qwen3Cuda::forward(cpu::ThreadPool& pool, Workspace&, const ForwardArgs& args) const {
  const auto t_call = std::chrono::steady_clock::now();
  const int64_t n = args.n_tok;
  const bool sweep_call = n > n_batch_;
  MAGNETAR_CHECK(n >= 1 && (n <= n_batch_ || (n <= sweep_tokens_ && args.seqs.size() == 1)) && !args.seqs.empty());
  if (args.routing) MAGNETAR_CHECK(int64_t(args.routing->counts.size()) == hp_.n_layer * hp_.n_expert);
  // However this call ends, the last acquired layer is released once its copies have landed.
  struct SettleOnExit {
    const Qwen3Cuda& model;
    ~SettleOnExit() {
      if (!model.held_) return;
      model.stream_.synchronize();
      model.settle_copies();
    }
  } settle_on_exit{*this};

  // Each sequence's KV mirror, current up to its pos0.
  std::vector<DeviceKv*>& mirrors = mirrors_;
  mirrors.clear();
  int64_t t = 0;
  for (const SeqSpan& seq : args.seqs) {
    MAGNETAR_CHECK(seq.kv && seq.n_tok >= 1 && seq.pos0 >= 0 && seq.pos0 + seq.n_tok <= seq.kv->n_ctx());
    MAGNETAR_ASSIGN_OR_RETURN(DeviceKv * m, mirror_of(*seq.kv));
    if (seq.kv->device_rows() < seq.pos0) {
      const int64_t from = seq.kv->device_rows();
      const size_t off = size_t(from) * m->row_bytes, bytes = size_t(seq.pos0 - from) * m->row_bytes;
      for (int64_t l = 0; l < hp_.n_layer; ++l) {
        MAGNETAR_RETURN_IF_ERROR(m->k[size_t(l)].upload(static_cast<const uint8_t*>(seq.kv->k(l)) + off, bytes, off));
        MAGNETAR_RETURN_IF_ERROR(m->v[size_t(l)].upload(static_cast<const uint8_t*>(seq.kv->v(l)) + off, bytes, off));
      }
      seq.kv->copied_to_device(seq.pos0);
    }
    mirrors.push_back(m);
    t += seq.n_tok;
  }
  MAGNETAR_CHECK(t == n);
  if (sweep_call) return sweep(pool, args);
  stage_positions(args.seqs);
  const double embed_seconds = embed_on_host(args.tokens, n);

  const int64_t n_out = args.all_logits ? n : int64_t(args.seqs.size());
  MAGNETAR_CHECK(args.seq_logits.empty() || (!args.all_logits && args.seq_logits.size() == args.seqs.size()));
  bool graphed = graphs_enabled() && routes_on_device(n);
  const bool drafts =
      args.seqs.size() == 1 && args.all_logits && draft_graphs_enabled() && drafts_attend_as_decode(n, 0);
  for (const SeqSpan& seq : args.seqs) graphed = graphed && (seq.n_tok == 1 || drafts);
  if (graphed && graph_pause_ > 0) {  // a capture failed lately: kernel by kernel for a while, then try again
    --graph_pause_;
    graphed = false;
  }
  if (graphed) {
    // One token per sequence, or one step with drafts (all_logits): the n head rows (<= kVec) come back after the
    // graph (logits_down). A capture the driver refuses turns graphs off for this model: the launches below then run
    // one by one (an op's own error comes back from them as it would have from the capture).
    const Result<const cuda::Graph*> graph = decode_graph(pool, args, n);
    if (graph.ok()) {
      if (args.profile) device_start_.record(stream_);
      graph.value()->launch(stream_);
      logits_down(args, logits_.as<float>(), 0, n);
      if (args.profile) device_end_.record(stream_);
      stream_.synchronize();
      logits_out(args, 0, n);
    } else {
      // Decode keeps working, ~10-25% slower (docs/benchmarks/2026-11-30-cuda-decode-graph.md), and captures again
      // after kGraphPause steps (a capture that ran out of memory may fit once sessions have ended); said once.
      if (!graph_failure_said_) {
        std::fprintf(stderr,
                     "magnetar: CUDA graph capture of the decode step failed (%s); decoding kernel by kernel, "
                     "capturing again every %d steps\n",
                     graph.status().message().c_str(), kGraphPause);
      }
      graph_failure_said_ = true;
      graph_pause_ = kGraphPause;
      graphed = false;
    }
  }
  if (!graphed) {
    if (args.profile) device_start_.record(stream_);
    const float* head_in = nullptr;
    MAGNETAR_RETURN_IF_ERROR(enqueue_layers(pool, args, n, &head_in));
    copy_routes_back(args, n);
    MAGNETAR_RETURN_IF_ERROR(head(args, head_in, n_out, 0));
    if (args.profile) {
      device_end_.record(stream_);
      stream_.synchronize();
    }
  }
  for (const SeqSpan& seq : args.seqs) seq.kv->wrote_device(seq.pos0, seq.pos0 + seq.n_tok);
  for (int64_t il = 0; args.routing && il < hp_.n_layer; ++il) count_routes(*args.routing, il, n);
  if (args.profile) add_profile(*args.profile, t_call, embed_seconds);
  return Status();
}

double Qwen3Cuda::embed_on_host(const int32_t* tokens, int64_t n) const {
  const auto t0 = std::chrono::steady_clock::now();
  const quant::ToFloatFn dequantize = cpu::kernels(w_.token_embd.type).dequantize;
  float* hx = h_x_.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    MAGNETAR_CHECK(tokens[i] >= 0 && tokens[i] < hp_.n_vocab);
    dequantize(w_.token_embd.row(tokens[i]), hx + i * hp_.n_embd, hp_.n_embd);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Qwen3Cuda::logits_down(const ForwardArgs& args, const float* d_rows, int64_t n0, int64_t rows) const {
  const int64_t V = hp_.n_vocab;
  for (int64_t i = 0; !args.seq_logits.empty() && i < rows; ++i) {
    stream_.copy(args.seq_logits[size_t(n0 + i)], d_rows + i * V, size_t(V) * sizeof(float));
  }
  if (args.seq_logits.empty()) stream_.copy(h_logits_.as<float>(), d_rows, size_t(rows * V) * sizeof(float));
}

void Qwen3Cuda::logits_out(const ForwardArgs& args, int64_t n0, int64_t rows) const {
  const int64_t V = hp_.n_vocab;
  if (args.seq_logits.empty()) {
    std::memcpy(args.logits + n0 * V, h_logits_.as<float>(), size_t(rows * V) * sizeof(float));
  }
}

Status Qwen3Cuda::head(const ForwardArgs& args, const float* x, int64_t rows, int64_t out0) const {
  float* d_logits = logits_.as<float>();
  for (int64_t c = 0; c < rows; c += kVec) {
    const int64_t nv = std::min(kVec, rows - c);
    MAGNETAR_RETURN_IF_ERROR(linear(head_, x + c * hp_.n_embd, d_logits, nv));
    logits_down(args, d_logits, out0 + c, nv);
    stream_.synchronize();
    logits_out(args, out0 + c, nv);
  }
  return Status();
}

void Qwen3Cuda::add_profile(Profile& profile, std::chrono::steady_clock::time_point t_call,
                            double embed_seconds) const {
  const double device = cuda::Event::seconds_between(device_start_, device_end_);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_call).count();
  profile.seconds[int(Op::kEmbed)] += embed_seconds;
  profile.seconds[int(Op::kDevice)] += device;
  profile.seconds[int(Op::kHost)] += std::max(0.0, wall - embed_seconds - device);
}

Status Qwen3Cuda::enqueue_layers(cpu::ThreadPool& pool, const ForwardArgs& args, int64_t n,
                                 const float** head_in) const {
  const int64_t E = hp_.n_embd;
  float* x = x_.as<float>();  // the residual stream: x_, or x2_ after a norm inside the router (add_norm_router)
  float* x_other = x2_.as<float>();
  float* xn = xn_.as<float>();
  stream_.copy(x, h_x_.as<float>(), size_t(n * E) * sizeof(float));
  upload_positions(args.seqs, n);
  bool combine = false;  // the layer before was an MoE layer whose rows the next add_norm combines
  for (size_t il = 0; il < layers_.size(); ++il) {
    MAGNETAR_RETURN_IF_ERROR(layer(pool, args, il, n, x, x_other, combine));
  }
  MAGNETAR_RETURN_IF_ERROR(add_norm(x, output_norm_.f32(), quant::Type::F32, n, combine));
  // The head's input rows: every token, or each sequence's last (gathered when they are not already adjacent).
  *head_in = xn;
  if (!args.all_logits) {
    bool adjacent = true;
    for (const SeqSpan& seq : args.seqs) adjacent = adjacent && seq.n_tok == 1;
    if (!adjacent) {
      float* gathered = qkv_.as<float>();  // free again after the last layer
      int64_t end = 0, i = 0;
      for (const SeqSpan& seq : args.seqs) {
        end += seq.n_tok;
        stream_.copy(gathered + i++ * E, xn + (end - 1) * E, size_t(E) * sizeof(float));
      }
      *head_in = gathered;
    }
  }
  return Status();
}

Status Qwen3Cuda::layer(cpu::ThreadPool& pool, const ForwardArgs& args, size_t il, int64_t n, float*& x,
                        float*& x_other, bool& combine) const {
  const DevLayer& L = layers_[il];
  if (il == 0) {
    xn_act_ = quant::Type::F32;
    MAGNETAR_RETURN_IF_ERROR(cuda::rms_norm({.x = x, .weight = L.attn_norm.f32(), .y = xn_.as<float>(), .n_rows = n,
                                             .n_cols = hp_.n_embd, .eps = hp_.rms_eps}, stream_));
  } else {
    MAGNETAR_RETURN_IF_ERROR(
        add_norm(x, L.attn_norm.f32(), qkv_share_input(L) ? L.wq.type : quant::Type::F32, n, combine));
  }
  MAGNETAR_RETURN_IF_ERROR(attention_block(L, int64_t(il), args.seqs, mirrors_, n));
  const quant::Type ffn_in = L.moe ? L.exp_type
                             : L.ffn_gate.type == L.ffn_up.type ? L.ffn_gate.type
                                                                : quant::Type::F32;
  const bool routed = norm_in_router(L, n);
  if (routed) {
    MAGNETAR_RETURN_IF_ERROR(add_norm_router(L, x, x_other));
    std::swap(x, x_other);
  } else {
    MAGNETAR_RETURN_IF_ERROR(add_norm(x, L.ffn_norm.f32(), ffn_in, n));
  }
  MAGNETAR_RETURN_IF_ERROR(L.moe ? moe_ffn(pool, L, int64_t(il), n, args, routed) : dense_ffn(L, n));
  combine = L.moe && combine_in_norm();
  return Status();
}

void Qwen3Cuda::stage_positions(std::span<const SeqSpan> seqs) const {
  int32_t* h_pos = h_positions_.as<int32_t>();
  int64_t t = 0;
  for (const SeqSpan& seq : seqs) {
    for (int64_t i = 0; i < seq.n_tok; ++i) h_pos[t + i] = int32_t(seq.pos0 + i);
    if (seq.n_tok == 1) {
      float* table = reinterpret_cast<float*>(h_positions_.as<uint8_t>() + rope_at_) + t * hp_.head_dim;
      cuda::rope_table(int32_t(seq.pos0), hp_.head_dim, hp_.rope_theta, table);
    }
    t += seq.n_tok;
  }
}

void Qwen3Cuda::upload_positions(std::span<const SeqSpan> seqs, int64_t n) const {
  // The positions, and the rotation tables up to the last decode token's when there is one.
  int64_t tables = 0, t = 0;
  for (const SeqSpan& seq : seqs) {
    t += seq.n_tok;
    if (seq.n_tok == 1) tables = t;
  }
  stream_.copy(positions_.data(), h_positions_.as<uint8_t>(),
               tables > 0 ? rope_at_ + size_t(tables * hp_.head_dim) * sizeof(float) : size_t(n) * 4);
}

void Qwen3Cuda::count_routes(RoutingCounts& counts, int64_t il, int64_t n) const {
  if (!layers_[size_t(il)].moe) return;
  const int64_t K = hp_.n_expert_used;
  const int32_t* h_ids = h_ids_.as<int32_t>() + il * n * K;
  for (int64_t r = 0; r < n * K; ++r) counts.counts[size_t(il * hp_.n_expert + h_ids[r])]++;
}

Result<const cuda::Graph*> Qwen3Cuda::decode_graph(cpu::ThreadPool& pool, const ForwardArgs& args, int64_t n) const {
  std::vector<uint64_t>& key = graph_key_;
  key.assign(1, args.routing != nullptr ? 1 : 0);
  for (const DeviceKv* m : mirrors_) key.push_back(m->id);
  for (const SeqSpan& seq : args.seqs) {  // the attention kernel each token's launch takes at its length
    key.push_back(uint64_t(seq.n_tok));
    for (int64_t i = 1; i <= seq.n_tok; ++i) {
      key.push_back(uint64_t(cuda::attention_decode_variant(hp_.head_dim, kv_type_, seq.pos0 + i)));
    }
  }
  ++graph_tick_;
  for (DecodeGraph& g : graphs_) {
    if (g.key == key) {
      g.last_use = graph_tick_;
      return &g.graph;
    }
  }
  // Capture: the launches are recorded, not run. A failing op still ends the capture before returning.
  cuda::Graph::begin_capture(stream_);
  const float* head_in = nullptr;
  Status st = enqueue_layers(pool, args, n, &head_in);
  if (st.ok()) st = linear(head_, head_in, logits_.as<float>(), n);
  if (st.ok()) copy_routes_back(args, n);
  Result<cuda::Graph> graph = cuda::Graph::end_capture(stream_);
  MAGNETAR_RETURN_IF_ERROR(st);
  MAGNETAR_RETURN_IF_ERROR(graph.status());
  if (refuse_captures()) return Status::error("decode graph capture refused (MAGNETAR_CUDA_GRAPH=refuse)");
  if (graphs_.size() == kMaxDecodeGraphs) {
    graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(),
                                   [](const DecodeGraph& a, const DecodeGraph& b) { return a.last_use < b.last_use; }));
  }
  graphs_.push_back({.key = key, .graph = std::move(graph).value(), .last_use = graph_tick_});
  return &graphs_.back().graph;
}

}  // namespace qwen3_cuda

Result<std::unique_ptr<Model>> load_qwen3_cuda(const gguf::Model& file, const CudaLoad& options) {
  MAGNETAR_ASSIGN_OR_RETURN(Qwen3Bound bound, bind_qwen3(file));
  CudaLoad o = options;
  if (!bound.layout) o.expert_pool_bytes = 0;  // dense: nothing to tier
  auto model = std::make_unique<qwen3_cuda::Qwen3Cuda>(std::move(bound), file, o);
  MAGNETAR_RETURN_IF_ERROR(model->init());
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace magnetar::models
