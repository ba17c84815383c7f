// Qwen3's per-head q/k RMSNorm fused with NeoX RoPE: for each head row of x [n_tok, n_head, head_dim],
// y = rms_norm(row) * weight (rms_norm.cu's formula), then the rotation of rope.cu at the token's position.
// Bit-identical with rms_norm (n_rows = n_tok * n_head, n_cols = head_dim) followed by rope_neox: same per-warp
// summation order of the squares, same scale, same cos/sin (rope.cuh) and the same unfused float products.
// qk_norm_rope does q (or k) in place; qkv_prepare does a layer's q in place and k and v straight into the KV cache
// (F16: store_kv's rounding; Q8_0: quantize_q8.cuh's block quantizer, the bytes of the CPU's Q8_0 rounding), one
// launch where the unfused path takes four (q and k norm + RoPE, K and V stores) and one read and write of k fewer.
// A decode token's qkv_prepare usually runs inside its attention launch instead (AttentionArgs::prepare, the same
// arithmetic: qk_norm_rope.cuh).
//
// One warp per head row; lane l holds elements l, l + 32, ... (head_dim / 32 of them), so for head_dim a
// multiple of 64 the rotation pairs (i, i + head_dim / 2) sit in the same lane and need no exchange.
// Cost: 8 bytes per element (read and write x), ~10 flops, plus head_dim / 2 double pow/sin/cos per row
// (per head row for few tokens: 2 * 64 per row at head_dim 128, negligible next to a decode step's launch latency;
// once per token for many, qk_norm_rope_token_kernel).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/qk_norm_rope.cuh"
#include "backends/cuda/rope.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerCta = kThreads / ops::kWarpSize;

// What one launch does, per token: n_q query head rows normed and rotated in place; with n_k > 0 also n_k key head
// rows normed and rotated, written into k_cache at the token's cache row, and n_k value head rows written into
// v_cache (qkv_prepare), in the caches' form (KvForm: F16, Q8_0 blocks or FP8 bytes).
struct Rows {
  float* q;
  const float* q_weight;
  const float* k;
  const float* k_weight;
  const float* v;
  uint8_t* k_cache;
  uint8_t* v_cache;
  int form;  // KvForm
  const int32_t* positions;
  const int32_t* row0_device;  // the first token's cache row, read at run time; else row0
  int64_t row0;
  int n_rows;  // n_tok * (n_q + 2 * n_k)
  int n_q;
  int n_k;
  float eps;
  float theta;
};

// Head row h (slot: the q heads, then the k heads, then the v heads) of token t, by one warp (lane holding elements
// lane + 32 k in e[k]): wk the row's norm weights, c/s its rotation's cos/sin of pairs lane + 32 k (k < kHalf).
template <int kPerLane>
__device__ __forceinline__ void head_row(const Rows& r, int t, int h, int64_t cache_row, const float (&wk)[kPerLane],
                                         const float (&c)[kPerLane / 2], const float (&s)[kPerLane / 2], int lane) {
  constexpr int kHeadDim = kPerLane * ops::kWarpSize;
  // A cache head row: F16 (2 bytes per element), Q8_0 (34 bytes per 32 elements) or FP8 (1 byte per element).
  constexpr int kF16Bytes = 2 * kHeadDim, kQ8Bytes = kHeadDim / 32 * int(sizeof(quant::BlockQ8_0));
  const int head_bytes = r.form == kKvQ8 ? kQ8Bytes : r.form == kKvF8 ? kHeadDim : kF16Bytes;
  const float* src;
  float* out = nullptr;      // f32 destination (q, in place)
  uint8_t* cache = nullptr;  // a cache head row (k)
  if (h < r.n_q) {
    out = r.q + (size_t(t) * size_t(r.n_q) + size_t(h)) * kHeadDim;
    src = out;
  } else {
    const bool value = h >= r.n_q + r.n_k;
    const int hk = value ? h - r.n_q - r.n_k : h - r.n_q;
    const size_t in_off = (size_t(t) * size_t(r.n_k) + size_t(hk)) * kHeadDim;
    const size_t cache_off = (size_t(cache_row) * size_t(r.n_k) + size_t(hk)) * size_t(head_bytes);
    if (value) {  // a value head: conversion only
      float e[kPerLane];
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) e[k] = r.v[in_off + lane + k * ops::kWarpSize];
      qk::store_head<kPerLane>(e, r.v_cache + cache_off, r.form, lane);
      return;
    }
    src = r.k + in_off;
    cache = r.k_cache + cache_off;
  }
  float e[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) e[k] = src[lane + k * ops::kWarpSize];
  qk::norm_rope<kPerLane>(e, wk, c, s, r.eps);
  if (out != nullptr) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) out[lane + k * ops::kWarpSize] = e[k];
  } else {
    qk::store_head<kPerLane>(e, cache, r.form, lane);
  }
}

__device__ __forceinline__ int64_t cache_row_of(const Rows& r, int t) {
  return (r.row0_device != nullptr ? int64_t(*r.row0_device) : r.row0) + t;
}

// Few tokens (decode): ceil(n_rows / kRowsPerCta) CTAs, one warp per head row; row r is slot r % (n_q + 2 n_k) of
// token r / (n_q + 2 n_k). Each warp makes its row's cos/sin (double pow/sin/cos, the longest chain here) before
// waiting for the kernel before, so a decode step's rows start at once. kPerLane = head_dim / 32 (2, 4, 6 or 8), a
// template argument so that e[] stays in registers.
template <int kPerLane>
__global__ void __launch_bounds__(kThreads) qk_norm_rope_kernel(const Rows r) {
  constexpr int kHeadDim = kPerLane * ops::kWarpSize;
  constexpr int kHalf = kPerLane / 2;
  const int lane = int(threadIdx.x) % ops::kWarpSize;
  const int row = int(blockIdx.x) * kRowsPerCta + int(threadIdx.x) / ops::kWarpSize;
  if (row >= r.n_rows) return;  // whole warps: no barrier below
  const int per_tok = r.n_q + 2 * r.n_k;
  const int t = row / per_tok;
  const int h = row % per_tok;
  // Before waiting for the kernel before (ops_common.cuh): what no kernel writes -- the norm weights and the
  // rotation's cos/sin (the positions and cache row are copied from the host before the step's first kernel).
  const float* w = h < r.n_q ? r.q_weight : r.k_weight;
  float wk[kPerLane], c[kHalf], s[kHalf];
  const int32_t pos = r.positions[t];
  const int64_t cache_row = cache_row_of(r, t);
  if (h < r.n_q + r.n_k) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) wk[k] = w[lane + k * ops::kWarpSize];
#pragma unroll
    for (int k = 0; k < kHalf; ++k) rope::cos_sin(pos, lane + k * ops::kWarpSize, kHeadDim, r.theta, &c[k], &s[k]);
  }
  ops::pdl_wait();
  ops::pdl_trigger();
  head_row<kPerLane>(r, t, h, cache_row, wk, c, s, lane);
}

// Many tokens (prefill): one CTA of kTokenThreads per token. The token's cos/sin are made once, a pair per thread,
// into shared memory (per head row they cost ~10 us per layer at 512 tokens on an H200's FP64 units: 36 rows of a
// 30B-A3B token made them 36 times), then each warp takes every kTokenWarps-th head row. The same values and
// operations as the warp-per-row kernel: bit-identical.
constexpr int kTokenThreads = 256;
constexpr int kTokenWarps = kTokenThreads / ops::kWarpSize;
template <int kPerLane>
__global__ void __launch_bounds__(kTokenThreads) qk_norm_rope_token_kernel(const Rows r) {
  constexpr int kHeadDim = kPerLane * ops::kWarpSize;
  constexpr int kHalf = kPerLane / 2;
  static_assert(kHeadDim / 2 <= kTokenThreads);
  __shared__ float cs[2][kHeadDim / 2];
  const int t = int(blockIdx.x);
  const int lane = int(threadIdx.x) % ops::kWarpSize, warp = int(threadIdx.x) / ops::kWarpSize;
  if (threadIdx.x < kHeadDim / 2) {
    rope::cos_sin(r.positions[t], int(threadIdx.x), kHeadDim, r.theta, &cs[0][threadIdx.x], &cs[1][threadIdx.x]);
  }
  float wq[kPerLane], wk[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    wq[k] = r.q_weight[lane + k * ops::kWarpSize];
    wk[k] = r.k_weight != nullptr ? r.k_weight[lane + k * ops::kWarpSize] : 0.0f;
  }
  const int64_t cache_row = cache_row_of(r, t);
  __syncthreads();
  float c[kHalf], s[kHalf];
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    c[k] = cs[0][lane + k * ops::kWarpSize];
    s[k] = cs[1][lane + k * ops::kWarpSize];
  }
  ops::pdl_wait();
  ops::pdl_trigger();
  const int per_tok = r.n_q + 2 * r.n_k;
  for (int h = warp; h < per_tok; h += kTokenWarps) {
    float w[kPerLane];  // selected element by element: a selected array would live in local memory
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) w[k] = h < r.n_q ? wq[k] : wk[k];
    head_row<kPerLane>(r, t, h, cache_row, w, c, s, lane);
  }
}

// Tokens from which a launch takes the CTA-per-token kernel: below, the few CTAs of one token each would leave the
// GPU idle (a decode token: 40 head rows on 10 SMs instead of 1).
constexpr int kTokenCtaMin = 16;

template <int kPerLane>
void launch_dim(const Rows& r, cudaStream_t stream) {
  const int n_tok = r.n_rows / (r.n_q + 2 * r.n_k);
  if (n_tok >= kTokenCtaMin) {
    CUDA_CHECK(ops::launch(qk_norm_rope_token_kernel<kPerLane>, unsigned(n_tok), kTokenThreads, 0, stream, r));
  } else {
    const unsigned grid = unsigned((r.n_rows + kRowsPerCta - 1) / kRowsPerCta);
    CUDA_CHECK(ops::launch(qk_norm_rope_kernel<kPerLane>, grid, kThreads, 0, stream, r));
  }
}

void launch(const Rows& r, int64_t head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: launch_dim<2>(r, stream); break;
    case 128: launch_dim<4>(r, stream); break;
    case 192: launch_dim<6>(r, stream); break;
    default: launch_dim<8>(r, stream); break;
  }
}

Status check_head_dim(const char* op, int64_t head_dim) {
  if (head_dim < 64 || head_dim % 64 != 0 || head_dim > kMaxQkNormRopeHeadDim) {
    return Status::error(format("%s: head_dim=%lld must be a multiple of 64 in 64..%lld", op, (long long)head_dim,
                                (long long)kMaxQkNormRopeHeadDim));
  }
  return Status();
}

}  // namespace

Status qk_norm_rope(const QkNormRopeArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_head < 1 || a.n_tok > INT_MAX / a.n_head) {
    return Status::error(
        format("qk_norm_rope: n_tok=%lld, n_head=%lld out of range", (long long)a.n_tok, (long long)a.n_head));
  }
  MAGNETAR_RETURN_IF_ERROR(check_head_dim("qk_norm_rope", a.head_dim));
  if (a.x == nullptr || a.weight == nullptr || a.positions == nullptr) {
    return Status::error("qk_norm_rope: null device pointer");
  }
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.weight, 4) || !ops::aligned(a.positions, 4)) {
    return Status::error("qk_norm_rope: x, weight and positions must be 4-byte aligned");
  }
  Rows r{};
  r.q = a.x;
  r.q_weight = a.weight;
  r.positions = a.positions;
  r.n_rows = int(a.n_tok * a.n_head);
  r.n_q = int(a.n_head);
  r.eps = a.eps;
  r.theta = a.theta;
  launch(r, a.head_dim, stream.raw());
  return Status();
}

Status qkv_prepare(const QkvPrepareArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_head < 1 || a.n_head_kv < 1 || a.n_head > INT_MAX / 4 || a.n_head_kv > INT_MAX / 4 ||
      a.n_tok > INT_MAX / (a.n_head + 2 * a.n_head_kv) || (a.row0_device == nullptr && a.row0 < 0)) {
    return Status::error(format("qkv_prepare: n_tok=%lld, n_head=%lld, n_head_kv=%lld, row0=%lld out of range",
                                (long long)a.n_tok, (long long)a.n_head, (long long)a.n_head_kv, (long long)a.row0));
  }
  MAGNETAR_RETURN_IF_ERROR(check_head_dim("qkv_prepare", a.head_dim));
  if (a.q == nullptr || a.q_weight == nullptr || a.k == nullptr || a.k_weight == nullptr || a.v == nullptr ||
      a.k_cache == nullptr || a.v_cache == nullptr || a.positions == nullptr) {
    return Status::error("qkv_prepare: null device pointer");
  }
  if (a.kv_type != quant::Type::F16 && a.kv_type != quant::Type::Q8_0 && a.kv_type != quant::Type::F8_E4M3) {
    return Status::error("qkv_prepare: kv_type must be F16, Q8_0 or F8_E4M3");
  }
  if (!ops::aligned(a.q, 4) || !ops::aligned(a.q_weight, 4) || !ops::aligned(a.k, 4) || !ops::aligned(a.k_weight, 4) ||
      !ops::aligned(a.v, 4) || !ops::aligned(a.k_cache, 2) || !ops::aligned(a.v_cache, 2) ||
      !ops::aligned(a.positions, 4) || !ops::aligned(a.row0_device, 4)) {
    return Status::error("qkv_prepare: float and int pointers must be 4-byte, the caches 2-byte aligned");
  }
  Rows r{};
  r.q = a.q;
  r.q_weight = a.q_weight;
  r.k = a.k;
  r.k_weight = a.k_weight;
  r.v = a.v;
  r.k_cache = static_cast<uint8_t*>(a.k_cache);
  r.v_cache = static_cast<uint8_t*>(a.v_cache);
  r.form = a.kv_type == quant::Type::Q8_0 ? kKvQ8 : a.kv_type == quant::Type::F8_E4M3 ? kKvF8 : kKvF16;
  r.positions = a.positions;
  r.row0_device = a.row0_device;
  r.row0 = a.row0;
  r.n_rows = int(a.n_tok * (a.n_head + 2 * a.n_head_kv));
  r.n_q = int(a.n_head);
  r.n_k = int(a.n_head_kv);
  r.eps = a.eps;
  r.theta = a.theta;
  launch(r, a.head_dim, stream.raw());
  return Status();
}

void rope_table(int32_t pos, int64_t head_dim, float theta, float* out) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) rope::cos_sin(pos, int(i), int(head_dim), theta, &out[i], &out[half + i]);
}

}  // namespace magnetar::cuda
