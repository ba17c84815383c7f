// The activation quantizers of quantize_q8.cu as warp-level device functions, so that the ops whose output feeds a
// quantized matrix product (rms_norm.cu's norms, swiglu.cu) can write the quantized row in the same launch. Same
// arithmetic, same bytes: quantize_q8.cu's header says why they match the reference quantizers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/formats.h"

namespace magnetar::cuda::q8 {

constexpr int kWarpSize = 32;

__device__ __forceinline__ uint16_t float_to_half_bits(float f) {
  const __half h = __float2half_rn(f);
  return __half_raw(h).x;
}

// One 32-element block (Q8_0, or Q8_1 with kWithSum), lane i holding element i. Every lane of the warp calls it.
template <typename Block, bool kWithSum>
__device__ __forceinline__ void block_q8_32(float xi, Block* blk, int lane) {
  float amax = fabsf(xi);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = int(roundf(xi * id));
  blk->qs[lane] = int8_t(q);
  if constexpr (kWithSum) {
    int sum = q;
#pragma unroll
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) blk->s = float_to_half_bits(float(sum) * d);
  }
  if (lane == 0) blk->d = float_to_half_bits(d);
}

// The Q8_K blocks' choice of the element that sets the scale: the larger magnitude, and on equal magnitudes the lower
// index (the reference's scan keeps the first strict maximum). (amax, max, idx) becomes the other candidate if it wins.
__device__ __forceinline__ void keep_largest(float& amax, float& max, int& idx, float o_amax, float o_max, int o_idx) {
  if (o_amax > amax || (o_amax == amax && o_idx < idx)) {
    amax = o_amax;
    max = o_max;
    idx = o_idx;
  }
}

// The same over the warp: every lane ends with the warp's winner.
__device__ __forceinline__ void warp_largest(float& amax, float& max, int& idx) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float o_amax = __shfl_xor_sync(0xffffffffu, amax, offset);
    const float o_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const int o_idx = __shfl_xor_sync(0xffffffffu, idx, offset);
    keep_largest(amax, max, idx, o_amax, o_max, o_idx);
  }
}

// One 256-element Q8_K super-block, lane holding elements lane + 32k in xs[k]. Every lane of the warp calls it.
__device__ __forceinline__ void block_q8_k(const float (&xs)[quant::kQK_K / kWarpSize], quant::BlockQ8_K* blk,
                                           int lane) {
  constexpr int kPerLane = quant::kQK_K / kWarpSize;  // 8
  // This lane's first element of largest magnitude (elements lane + 32k come in increasing order).
  float amax = 0.0f;
  float max = 0.0f;
  int idx = quant::kQK_K;  // none yet
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const float ax = fabsf(xs[k]);
    if (ax > amax) {
      amax = ax;
      max = xs[k];
      idx = lane + kWarpSize * k;
    }
  }
  warp_largest(amax, max, idx);
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

// The same block with lane holding the 8 consecutive elements 8 lane .. 8 lane + 7 in xs (attention.cu's decode
// output: a thread makes 8 consecutive dims of a head). Every lane of the warp calls it.
__device__ __forceinline__ void block_q8_k_lane8(const float (&xs)[8], quant::BlockQ8_K* blk, int lane) {
  float amax = 0.0f, max = 0.0f;
  int idx = quant::kQK_K;  // none yet
#pragma unroll
  for (int e = 0; e < 8; ++e) {  // the lane's first element of largest magnitude, as block_q8_k
    if (fabsf(xs[e]) > amax) {
      amax = fabsf(xs[e]);
      max = xs[e];
      idx = 8 * lane + e;
    }
  }
  warp_largest(amax, max, idx);
  uint32_t packed[2] = {0u, 0u};
  int s = 0;
  const float iscale = amax == 0.0f ? 0.0f : -127.0f / max;  // amax is uniform over the warp
  if (amax != 0.0f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int q = min(__float2int_rn(iscale * xs[e]), 127);
      packed[e / 4] |= uint32_t(uint8_t(int8_t(q))) << (8 * (e % 4));
      s += q;
    }
  }
  // qs starts 4 bytes into the block (after d): the lane's 8 bytes are two aligned words.
  uint32_t* qs = reinterpret_cast<uint32_t*>(blk->qs + 8 * lane);
  qs[0] = packed[0];
  qs[1] = packed[1];
  s += __shfl_xor_sync(0xffffffffu, s, 1);  // a 16-group is two lanes
  if (lane % 2 == 0) blk->bsums[lane / 2] = int16_t(s);
  if (lane == 0) blk->d = amax == 0.0f ? 0.0f : 1.0f / iscale;
}

// A float row's n_blocks Q8_K blocks, a warp per block (warp w of n_warps takes blocks w, w + n_warps, ...): the bytes
// of quantize_activations. src 16-byte aligned; every lane of the calling warps calls it.
__device__ __forceinline__ void row_q8_k_warps(const float* src, quant::BlockQ8_K* dst, int n_blocks, int warp,
                                               int n_warps, int lane) {
  for (int b = warp; b < n_blocks; b += n_warps) {
    const float4 lo = reinterpret_cast<const float4*>(src + quant::kQK_K * b)[2 * lane];
    const float4 hi = reinterpret_cast<const float4*>(src + quant::kQK_K * b)[2 * lane + 1];
    const float xs[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    block_q8_k_lane8(xs, &dst[b], lane);
  }
}

// Shared scratch of block_q8_k_group: the largest magnitude of each of the group's warps.
struct GroupMax {
  float amax[quant::kQK_K / kWarpSize], max[quant::kQK_K / kWarpSize];
  int idx[quant::kQK_K / kWarpSize];
};

// The same block over a group of 256 consecutive threads (whole warps) of the CTA, thread t < 256 of the group holding
// element t in x (one element per thread: a shorter chain per thread than eight per lane). blk null: the group has no
// block this time and writes nothing. Every thread of the CTA calls it with its group's scratch: it synchronizes the
// CTA once. The maximum's tie rule and the arithmetic are block_q8_k's: the same bytes.
__device__ __forceinline__ void block_q8_k_group(float x, quant::BlockQ8_K* blk, int t, GroupMax& scratch) {
  constexpr int kWarps = quant::kQK_K / kWarpSize;
  const int lane = t % kWarpSize;
  float amax = fabsf(x), max = x;
  int idx = amax > 0.0f ? t : quant::kQK_K;  // block_q8_k's strict '>' from amax 0: zeros are never picked
  warp_largest(amax, max, idx);
  if (lane == 0) {
    scratch.amax[t / kWarpSize] = amax;
    scratch.max[t / kWarpSize] = max;
    scratch.idx[t / kWarpSize] = idx;
  }
  __syncthreads();
  if (blk == nullptr) return;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) keep_largest(amax, max, idx, scratch.amax[w], scratch.max[w], scratch.idx[w]);
  if (amax == 0.0f) {  // uniform over the group
    blk->qs[t] = 0;
    if (t < quant::kQK_K / 16) blk->bsums[t] = 0;
    if (t == 0) blk->d = 0.0f;
    return;
  }
  const float iscale = -127.0f / max;
  const int q = min(__float2int_rn(iscale * x), 127);
  blk->qs[t] = int8_t(q);
  int s = q;  // element t is in 16-group t / 16: sum over the half-warp
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (lane % 16 == 0) blk->bsums[t / 16] = int16_t(s);
  if (t == 0) blk->d = 1.0f / iscale;
}

// block_q8_k_group over a CTA of 256 threads, thread t holding element t (swiglu.cu: its per-element work is long).
__device__ __forceinline__ void block_q8_k_cta(float x, quant::BlockQ8_K* blk) {
  __shared__ GroupMax scratch;
  block_q8_k_group(x, blk, int(threadIdx.x), scratch);
}

// Activation formats a fused op can write (quant::Type values as template arguments; act_of maps them).
enum class Act { kNone, kQ8_0, kQ8_1, kQ8_K };

__host__ __device__ constexpr int block_elems(Act a) { return a == Act::kQ8_K ? quant::kQK_K : quant::kQK32; }
__host__ __device__ constexpr Act act_of(quant::Type t) {
  return t == quant::Type::Q8_0   ? Act::kQ8_0
         : t == quant::Type::Q8_1 ? Act::kQ8_1
         : t == quant::Type::Q8_K ? Act::kQ8_K
                                  : Act::kNone;
}

// Block b of a row into the row's quantized bytes at dst, the lane holding the block's elements lane + 32k in
// xs[k] (one for Q8_0/Q8_1, eight for Q8_K). Every lane of the warp calls it.
template <Act kA>
__device__ __forceinline__ void block_regs(const float (&xs)[block_elems(kA) / kWarpSize], uint8_t* dst, int b,
                                           int lane) {
  if constexpr (kA == Act::kQ8_K) {
    block_q8_k(xs, reinterpret_cast<quant::BlockQ8_K*>(dst) + b, lane);
  } else if constexpr (kA == Act::kQ8_1) {
    block_q8_32<quant::BlockQ8_1, true>(xs[0], reinterpret_cast<quant::BlockQ8_1*>(dst) + b, lane);
  } else if constexpr (kA == Act::kQ8_0) {
    block_q8_32<quant::BlockQ8_0, false>(xs[0], reinterpret_cast<quant::BlockQ8_0*>(dst) + b, lane);
  }
}

// The same with the block read from a row of `src` (shared or global memory, the row's first element at src).
template <Act kA>
__device__ __forceinline__ void block(const float* src, uint8_t* dst, int b, int lane) {
  constexpr int kElems = block_elems(kA);
  float xs[kElems / kWarpSize];
#pragma unroll
  for (int k = 0; k < kElems / kWarpSize; ++k) xs[k] = src[b * kElems + lane + kWarpSize * k];
  block_regs<kA>(xs, dst, b, lane);
}

}  // namespace magnetar::cuda::q8
