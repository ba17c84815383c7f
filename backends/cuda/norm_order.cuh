// The order in which rms_norm.cu's cluster kernel adds a decode row's squares, restated for kernels that make the same
// norm from the lane8 layout (lane l of a 4-lane group holding 8 consecutive columns: norm_matvec.cu's router product),
// so that their scale is the cluster kernel's float, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::norm_order {

// A 32-column group's double sum of squares over warp_sum's tree, the group's element 8 (lane % 4) + e in v[e]:
// warp_sum's offsets 16 and 8 are the lanes 2 and 1 apart here, 4, 2 and 1 the elements. Every lane of the group
// returns it; every lane of the warp calls it.
__device__ __forceinline__ double group_sum8(const float (&v)[8]) {
  double sq[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) sq[e] = double(v[e]) * double(v[e]);
#pragma unroll
  for (int e = 0; e < 8; ++e) sq[e] += __shfl_xor_sync(0xffffffffu, sq[e], 2);
#pragma unroll
  for (int e = 0; e < 8; ++e) sq[e] += __shfl_xor_sync(0xffffffffu, sq[e], 1);
#pragma unroll
  for (int e = 0; e < 4; ++e) sq[e] += sq[e + 4];
  sq[0] += sq[2];
  sq[1] += sq[3];
  return sq[0] + sq[1];
}

// The row's scale 1 / sqrt(mean of squares + eps) from its groups' sums (group_s: n / 32 of them, in column order):
// the groups of each of the cluster kernel's detail::kNormClusterCtas slices in column order, then the slices in
// order. Every lane of one warp calls it; lane 0 returns the scale.
__device__ __forceinline__ float row_scale(const double* group_s, int n, float eps, int lane) {
  constexpr int kSlices = detail::kNormClusterCtas;
  const int groups = n / kSlices / ops::kWarpSize;
  double part = 0;
  if (lane < kSlices) {
    for (int k = 0; k < groups; ++k) part += group_s[lane * groups + k];
  }
  double total = 0;
#pragma unroll
  for (int r = 0; r < kSlices; ++r) total += __shfl_sync(0xffffffffu, part, r);
  return float(1.0 / sqrt(total / double(n) + double(eps)));
}

}  // namespace magnetar::cuda::norm_order
