// Small helpers shared by the non-matmul ops of the forward pass (rms_norm.cu, rope.cu, swiglu.cu,
// route_topk.cu, store_kv.cu, attention.cu): warp reductions and pointer checks. Device helpers only need
// CUDA; host helpers are plain C++.
#pragma once

#include <cstdint>

namespace magnetar::cuda::ops {

constexpr int kWarpSize = 32;

// Whether p is a multiple of n bytes (host side argument checks).
inline bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

#ifdef __CUDACC__
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
#endif

}  // namespace magnetar::cuda::ops
