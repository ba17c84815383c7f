// Qwen3's per-head q/k RMSNorm fused with NeoX RoPE, in place: for each head row of x [n_tok, n_head,
// head_dim], y = rms_norm(row) * weight (rms_norm.cu's formula), then the rotation of rope.cu at the token's
// position. Bit-identical with rms_norm (n_rows = n_tok * n_head, n_cols = head_dim) followed by rope_neox:
// same per-warp summation order of the squares, same scale, same cos/sin (rope.cuh) and the same unfused float
// products. It removes one read and one write of q and k and one launch per tensor.
//
// One warp per head row; lane l holds elements l, l + 32, ... (head_dim / 32 of them), so for head_dim a
// multiple of 64 the rotation pairs (i, i + head_dim / 2) sit in the same lane and need no exchange.
// Cost: 8 bytes per element (read and write x), ~10 flops, plus head_dim / 2 double pow/sin/cos per row
// (recomputed per head: 2 * 64 per row at head_dim 128, negligible next to a decode step's launch latency;
// prefill at thousands of tokens pays ~10 us per layer for it on an H200's FP64 units).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/rope.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerCta = kThreads / ops::kWarpSize;

// Grid: ceil(n_tok * n_head / kRowsPerCta) CTAs; row r is head r % n_head of token r / n_head.
// kPerLane = head_dim / 32 (2, 4, 6 or 8), a template argument so that e[] stays in registers.
template <int kPerLane>
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_kernel(float* __restrict__ x, const float* __restrict__ w, const int32_t* __restrict__ positions,
                        int n_rows, int n_head, int head_dim, float eps, float theta) {
  const int lane = int(threadIdx.x) % ops::kWarpSize;
  const int row = int(blockIdx.x) * kRowsPerCta + int(threadIdx.x) / ops::kWarpSize;
  if (row >= n_rows) return;  // whole warps: no barrier below
  float* v = x + size_t(row) * size_t(head_dim);
  float e[kPerLane];
  double sum = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    e[k] = v[lane + k * ops::kWarpSize];
    sum += double(e[k]) * double(e[k]);
  }
  sum = ops::warp_sum(sum);
  const float scale = float(1.0 / sqrt(sum / double(head_dim) + double(eps)));
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) e[k] = __fmul_rn(__fmul_rn(e[k], scale), w[lane + k * ops::kWarpSize]);
  const int32_t pos = positions[row / n_head];
  constexpr int kHalf = kPerLane / 2;  // element i + head_dim / 2 is slot k + kHalf of the same lane
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    float c, s;
    rope::cos_sin(pos, lane + k * ops::kWarpSize, head_dim, theta, &c, &s);
    const float a = e[k];
    const float b = e[k + kHalf];
    v[lane + k * ops::kWarpSize] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    v[lane + (k + kHalf) * ops::kWarpSize] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
}

template <int kPerLane>
void launch(float* x, const float* w, const int32_t* positions, int64_t rows, int64_t n_head, float eps, float theta,
            cudaStream_t stream) {
  const unsigned grid = unsigned((rows + kRowsPerCta - 1) / kRowsPerCta);
  qk_norm_rope_kernel<kPerLane>
      <<<grid, kThreads, 0, stream>>>(x, w, positions, int(rows), int(n_head), kPerLane * ops::kWarpSize, eps, theta);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

Status qk_norm_rope(const QkNormRopeArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_head < 1 || a.n_tok > INT_MAX / a.n_head) {
    return Status::error(
        format("qk_norm_rope: n_tok=%lld, n_head=%lld out of range", (long long)a.n_tok, (long long)a.n_head));
  }
  if (a.head_dim < 64 || a.head_dim % 64 != 0 || a.head_dim > kMaxQkNormRopeHeadDim) {
    return Status::error(format("qk_norm_rope: head_dim=%lld must be a multiple of 64 in 64..%lld",
                                (long long)a.head_dim, (long long)kMaxQkNormRopeHeadDim));
  }
  if (a.x == nullptr || a.weight == nullptr || a.positions == nullptr) {
    return Status::error("qk_norm_rope: null device pointer");
  }
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.weight, 4) || !ops::aligned(a.positions, 4)) {
    return Status::error("qk_norm_rope: x, weight and positions must be 4-byte aligned");
  }
  const int64_t rows = a.n_tok * a.n_head;
  switch (a.head_dim) {
    case 64: launch<2>(a.x, a.weight, a.positions, rows, a.n_head, a.eps, a.theta, stream.raw()); break;
    case 128: launch<4>(a.x, a.weight, a.positions, rows, a.n_head, a.eps, a.theta, stream.raw()); break;
    case 192: launch<6>(a.x, a.weight, a.positions, rows, a.n_head, a.eps, a.theta, stream.raw()); break;
    default: launch<8>(a.x, a.weight, a.positions, rows, a.n_head, a.eps, a.theta, stream.raw()); break;
  }
  return Status();
}

}  // namespace magnetar::cuda
