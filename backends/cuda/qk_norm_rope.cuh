// One head row's Qwen3 q/k RMSNorm + NeoX RoPE and its store into a KV cache row, by one warp (lane holding elements
// lane + 32 k in e[k]): the arithmetic of qk_norm_rope.cu's kernels (qk_norm_rope, qkv_prepare), shared with the
// decode attention kernel that does qkv_prepare's work for its own token (attention.cu, AttentionArgs::prepare), so
// that both compute the same bits.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"
#include "quant/formats.h"

namespace magnetar::cuda {

// A KV cache's form in the kernels that store or read it (their template arguments): F16, ggml's Q8_0 blocks, or
// FP8 E4M3 bytes (quant::Type::F8_E4M3).
enum KvForm : int { kKvF16 = 0, kKvQ8 = 1, kKvF8 = 2 };

namespace qk {

// y = rms_norm(row) * weight (rms_norm.cu's formula: the squares summed in double, per lane then over the warp), then
// the rotation of rope.cu by the pairs' cos/sin (c[k], s[k]: pair lane + 32 k, k < kPerLane / 2), with the same
// unfused float products. For head_dim = 32 kPerLane a multiple of 64 the pairs (i, i + head_dim / 2) sit in one lane.
template <int kPerLane>
__device__ __forceinline__ void norm_rope(float (&e)[kPerLane], const float (&w)[kPerLane],
                                          const float (&c)[kPerLane / 2], const float (&s)[kPerLane / 2], float eps) {
  constexpr int kHeadDim = kPerLane * ops::kWarpSize;
  constexpr int kHalf = kPerLane / 2;  // element i + head_dim / 2 is slot k + kHalf of the same lane
  double sum = 0;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) sum += double(e[k]) * double(e[k]);
  sum = ops::warp_sum(sum);
  const float scale = float(1.0 / sqrt(sum / double(kHeadDim) + double(eps)));
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) e[k] = __fmul_rn(__fmul_rn(e[k], scale), w[k]);
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const float a = e[k];
    const float b = e[k + kHalf];
    e[k] = __fsub_rn(__fmul_rn(a, c[k]), __fmul_rn(b, s[k]));
    e[k + kHalf] = __fadd_rn(__fmul_rn(b, c[k]), __fmul_rn(a, s[k]));
  }
}

// A head row into a cache row at dst: F16 bits (store_kv's rounding), Q8_0 blocks (block k = the elements
// 32 k .. 32 k + 31: e[k] over the warp; quantize_q8.cuh's quantizer, the CPU's bytes) or FP8 E4M3 bytes (cvt with
// round to nearest even and saturation: quant::float_to_fp8_e4m3's). Every lane of the warp calls it.
template <int kPerLane>
__device__ __forceinline__ void store_head(const float (&e)[kPerLane], uint8_t* dst, int form, int lane) {
  if (form == kKvF8) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      dst[lane + k * ops::kWarpSize] = uint8_t(__nv_cvt_float_to_fp8(e[k], __NV_SATFINITE, __NV_E4M3));
    }
  } else if (form == kKvQ8) {
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      q8::block_q8_32<quant::BlockQ8_0, false>(e[k], reinterpret_cast<quant::BlockQ8_0*>(dst) + k, lane);
    }
  } else {
    uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) d16[lane + k * ops::kWarpSize] = __half_as_ushort(__float2half_rn(e[k]));
  }
}

}  // namespace qk
}  // namespace magnetar::cuda
