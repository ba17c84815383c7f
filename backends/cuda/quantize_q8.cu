// Activation quantization for the matrix-vector kernels: float32 rows -> Q8_0, Q8_1 or Q8_K blocks,
// byte-identical with the reference quantizers in quant/ref (legacy.cpp: quantize_q8_0 / quantize_q8_1;
// k_quants.cpp: quantize_q8_k), so that matvec's integer dots see exactly the activations the reference
// dot products are given in the tests.
//
// Why the bytes match: every value goes through the same IEEE float32 operations as the reference, each
// correctly rounded on both sides (nvcc's default -prec-div=true makes '/' and '1.0f / d' exact-rounded;
// no expression here has a multiply feeding an add, so FMA contraction cannot change a result):
//   Q8_0 / Q8_1  d = amax / 127, id = 1 / d (0 when d is 0), q = roundf(x * id) (half away from zero, as
//                std::round), d stored with round-to-nearest-even fp16 (as float_to_fp16, overflow to inf);
//                Q8_1 adds s = fp16(float(sum q) * d) with the float d before its fp16 rounding.
//   Q8_K         the first element of largest magnitude (ties: the lowest index, keeping its sign) gives
//                iscale = -127 / max; q = min(rint(iscale * x), 127) (nearest_int is round-half-even);
//                d = 1 / iscale; bsums = per-16 sums of q; an all-zero block is all zero bytes.
// One warp per block (Q8_0/Q8_1: one element per lane; Q8_K: eight per lane, element lane + 32k, so loads
// and the qs stores stay coalesced). NaN inputs are outside the contract (as for the reference).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "quant/formats.h"

namespace magnetar::cuda::detail {
namespace {

using quant::Type;

constexpr int kWarpSize = 32;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;

__device__ __forceinline__ uint16_t float_to_half_bits(float f) {
  const __half h = __float2half_rn(f);
  return __half_raw(h).x;
}

// Grid: ceil(n_vectors * blocks_per_row / kWarps) CTAs; warp -> one 32-element block.
template <typename Block, bool kWithSum>
__global__ void __launch_bounds__(kThreads)
    quantize_q8_32_kernel(const float* __restrict__ x, uint8_t* __restrict__ out, size_t out_row_bytes,
                          int64_t cols, int64_t blocks_per_row, int64_t n_blocks) {
  const int64_t gb = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  if (gb >= n_blocks) return;  // whole warps leave together: the shuffles below stay full-warp
  const int64_t v = gb / blocks_per_row;
  const int64_t b = gb % blocks_per_row;
  const float xi = x[v * cols + b * quant::kQK32 + lane];

  float amax = fabsf(xi);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = int(roundf(xi * id));

  Block* blk = reinterpret_cast<Block*>(out + size_t(v) * out_row_bytes) + b;
  blk->qs[lane] = int8_t(q);
  if constexpr (kWithSum) {
    int sum = q;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) blk->s = float_to_half_bits(float(sum) * d);
  }
  if (lane == 0) blk->d = float_to_half_bits(d);
}

// Grid: ceil(n_vectors * blocks_per_row / kWarps) CTAs; warp -> one 256-element super-block.
__global__ void __launch_bounds__(kThreads)
    quantize_q8_k_kernel(const float* __restrict__ x, uint8_t* __restrict__ out, size_t out_row_bytes,
                         int64_t cols, int64_t blocks_per_row, int64_t n_blocks) {
  constexpr int kPerLane = quant::kQK_K / kWarpSize;  // 8
  const int64_t gb = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  if (gb >= n_blocks) return;
  const int64_t v = gb / blocks_per_row;
  const int64_t b = gb % blocks_per_row;
  const float* src = x + v * cols + b * quant::kQK_K;

  float xs[kPerLane];
  // This lane's first element of largest magnitude (elements lane + 32k come in increasing order).
  float amax = 0.0f;
  float max = 0.0f;
  int idx = quant::kQK_K;  // none yet
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    xs[k] = src[lane + kWarpSize * k];
    const float ax = fabsf(xs[k]);
    if (ax > amax) {
      amax = ax;
      max = xs[k];
      idx = lane + kWarpSize * k;
    }
  }
  // Across lanes: the larger magnitude wins, the lower index on equal magnitudes (the reference's scan
  // keeps the first strict maximum).
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float o_amax = __shfl_xor_sync(0xffffffffu, amax, offset);
    const float o_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const int o_idx = __shfl_xor_sync(0xffffffffu, idx, offset);
    if (o_amax > amax || (o_amax == amax && o_idx < idx)) {
      amax = o_amax;
      max = o_max;
      idx = o_idx;
    }
  }

  quant::BlockQ8_K* blk = reinterpret_cast<quant::BlockQ8_K*>(out + size_t(v) * out_row_bytes) + b;
  if (amax == 0.0f) {  // uniform over the warp after the reduction
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) blk->qs[lane + kWarpSize * k] = 0;
    if (lane < quant::kQK_K / 16) blk->bsums[lane] = 0;
    if (lane == 0) blk->d = 0.0f;
    return;
  }
  const float iscale = -127.0f / max;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int q = min(__float2int_rn(iscale * xs[k]), 127);
    blk->qs[lane + kWarpSize * k] = int8_t(q);
    // Element lane + 32k is in 16-group 2k + lane / 16: sum over the half-warp.
    int s = q;
#pragma unroll
    for (int offset = 8; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane % 16 == 0) blk->bsums[2 * k + lane / 16] = int16_t(s);
  }
  if (lane == 0) blk->d = 1.0f / iscale;
}

unsigned grid_for(int64_t n_blocks) { return unsigned((n_blocks + kWarps - 1) / kWarps); }

}  // namespace

bool launch_quantize_q8(quant::Type act_type, const float* x, void* out, size_t out_row_bytes, int64_t cols,
                        int64_t n_vectors, CUstream_st* stream) {
  auto* dst = static_cast<uint8_t*>(out);
  switch (act_type) {
    case Type::Q8_0: {
      const int64_t per_row = cols / quant::kQK32;
      const int64_t n = per_row * n_vectors;
      quantize_q8_32_kernel<quant::BlockQ8_0, false>
          <<<grid_for(n), kThreads, 0, stream>>>(x, dst, out_row_bytes, cols, per_row, n);
      break;
    }
    case Type::Q8_1: {
      const int64_t per_row = cols / quant::kQK32;
      const int64_t n = per_row * n_vectors;
      quantize_q8_32_kernel<quant::BlockQ8_1, true>
          <<<grid_for(n), kThreads, 0, stream>>>(x, dst, out_row_bytes, cols, per_row, n);
      break;
    }
    case Type::Q8_K: {
      const int64_t per_row = cols / quant::kQK_K;
      const int64_t n = per_row * n_vectors;
      quantize_q8_k_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dst, out_row_bytes, cols, per_row, n);
      break;
    }
    default: return false;
  }
  CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace magnetar::cuda::detail
