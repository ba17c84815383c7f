// Float weights (F32, F16, BF16) read as float32 on the device, for the float matrix products (matvec_float.cu,
// matmul_float.cu). The conversions are exact.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "quant/formats.h"

namespace magnetar::cuda::detail {

constexpr int kFloatChunk = 8;  // elements of one 16-byte (F16/BF16) or two 16-byte (F32) loads

__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  __half_raw raw;
  raw.x = uint16_t(h);
  return __half2float(__half(raw));
}

// Element i of a row, and eight elements from 16-byte aligned storage.
template <quant::Type T>
struct FloatWeights;

template <>
struct FloatWeights<quant::Type::F32> {
  static __device__ __forceinline__ float at(const void* row, int i) { return static_cast<const float*>(row)[i]; }
  static __device__ __forceinline__ void chunk(const void* row, int i, float out[kFloatChunk]) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(row) + i);
    const float4 a = p[0];
    const float4 b = p[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
};

template <>
struct FloatWeights<quant::Type::F16> {
  static __device__ __forceinline__ float at(const void* row, int i) {
    return half_bits_to_float(static_cast<const uint16_t*>(row)[i]);
  }
  static __device__ __forceinline__ void chunk(const void* row, int i, float out[kFloatChunk]) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + i);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = half_bits_to_float(words[k] & 0xffffu);
      out[2 * k + 1] = half_bits_to_float(words[k] >> 16);
    }
  }
};

// bf16 -> float is exact: the 16 bits become the high half of the float.
template <>
struct FloatWeights<quant::Type::BF16> {
  static __device__ __forceinline__ float at(const void* row, int i) {
    return __uint_as_float(uint32_t(static_cast<const uint16_t*>(row)[i]) << 16);
  }
  static __device__ __forceinline__ void chunk(const void* row, int i, float out[kFloatChunk]) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + i);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  }
};

}  // namespace magnetar::cuda::detail
