// Coarse CPU ops for the forward pass. All buffers are float32 and row-major unless stated; shapes are
// written beside each argument as [rows, cols]. Every op runs as one parallel region on the pool and
// allocates nothing: scratch comes from the caller (sized once per session, STYLE.md rule 8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backends/cpu/threadpool.h"
#include "quant/quant.h"

namespace magnetar::cpu {

// Activations prepared for one weight type: quantized to the type's vec_dot_type (quantized weights), or
// kept as float (F32/F16/BF16 weights, which are widened to float row by row so that results keep float32
// accuracy instead of rounding activations to 16 bits).
struct PreparedInput {
  const void* data = nullptr;  // [n_tok] rows of row_bytes
  size_t row_bytes = 0;
  int64_t n_tok = 0;
  bool is_float = false;
};

// Bytes of scratch prepare_input needs for n_tok rows of n_in elements against weights of `type`.
size_t prepare_input_bytes(quant::Type type, int64_t n_in, int64_t n_tok);
// x: [n_tok, n_in] (row stride ldx floats) -> scratch. n_in must be a multiple of the type's block size.
PreparedInput prepare_input(ThreadPool& pool, quant::Type type, const float* x, int64_t ldx, int64_t n_in,
                            int64_t n_tok, void* scratch);

// One y = x W^T product: W holds n_out rows of n_in elements of `type`.
struct MatmulJob {
  const void* w = nullptr;
  quant::Type type = quant::Type::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  PreparedInput x;       // prepared for `type`
  float* y = nullptr;    // [x.n_tok, n_out], row stride ldy
  int64_t ldy = 0;
};

// Runs all jobs in one parallel region, splitting their output rows across threads (so many small expert
// products cost one synchronization). Jobs must not overlap in y.
void matmul(ThreadPool& pool, std::span<const MatmulJob> jobs);
inline void matmul(ThreadPool& pool, const MatmulJob& job) { matmul(pool, std::span<const MatmulJob>(&job, 1)); }

// gate[i] = silu(gate[i]) * up[i] for count elements (SwiGLU, in place into gate).
void swiglu(ThreadPool& pool, float* gate, const float* up, int64_t count);

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n_rows rows of n (in place allowed).
void rms_norm(ThreadPool& pool, const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps);

// NeoX-style rotary embedding (pairs (i, i + d/2)) on x: [n_tok, n_head, head_dim] at positions pos[t].
void rope_neox(ThreadPool& pool, float* x, int64_t n_tok, int64_t n_head, int64_t head_dim, const int32_t* pos,
               float theta);

// Causal attention over a KV cache for n_tok new tokens at positions pos0 .. pos0+n_tok-1, flash-attention style
// (blocks of cached rows with an online softmax; ops.cpp says how). F16, Q8_0 and F8_E4M3 rows are widened to float
// first and then taken as F32 rows (the same scores and sums). A row's result does not depend on the thread count nor
// on the other tokens of the call: a token prefilled gets the bits it gets decoded alone.
struct AttentionArgs {
  const float* q = nullptr;        // [n_tok, n_head, head_dim]
  const void* k_cache = nullptr;   // [n_ctx, n_head_kv, head_dim] of kv_type, rows 0..pos0+n_tok-1 filled
  const void* v_cache = nullptr;   // same layout as k_cache
  quant::Type kv_type = quant::Type::F16;  // F16, F32, F8_E4M3 or Q8_0 (head_dim a multiple of 32: whole blocks)
  float* out = nullptr;            // [n_tok, n_head, head_dim]
  int64_t n_tok = 0, pos0 = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t window = 0;              // > 0: attend only to the last `window` positions (sliding window)
  float scale = 1.0f;
  float* scratch = nullptr;        // attention_scratch_floats(n_ctx, n_head, n_head_kv, head_dim, pool.size())
};
// Scratch floats for caches of up to n_ctx rows of this head layout (head_dim <= 1024, <= 64 query heads per KV head).
size_t attention_scratch_floats(int64_t n_ctx, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int n_threads);
void attention(ThreadPool& pool, const AttentionArgs& a);

// Stores n_tok rows of [n] floats into a KV cache of kv_type at row `row0` (row stride: row_size(kv_type, n)
// bytes; Q8_0 rounds each block of 32 to its f16 scale and int8 values, n a multiple of 32; F8_E4M3 rounds each
// element as quant::float_to_fp8_e4m3).
void store_kv(const float* x, int64_t n_tok, int64_t n, quant::Type kv_type, void* cache, int64_t row0);

}  // namespace magnetar::cpu
