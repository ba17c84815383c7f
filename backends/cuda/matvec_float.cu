// Matrix-vector product for float weights (F32, F16, BF16) against float32 activations, accumulating in
// float32 (fused multiply-add per element, then a warp-shuffle and a shared-memory reduction).
//
// Same work split as mmvq.cu: 128-thread CTAs, 1, 2 or 4 warps per row. When cols is a multiple of 8 and
// the weights and x are 16-byte aligned, each thread reads 8 weights per step (one 16-byte load for
// F16/BF16, two for F32) and the matching 8 floats of x (two 16-byte loads); otherwise one element per step.
// Bandwidth: 2 (F16/BF16) or 4 (F32) weight bytes per 2 flops, so memory-bound like the quantized types.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/float_weights.cuh"
#include "backends/cuda/grouping.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::detail {
namespace {

using ops::kWarpSize;
using ops::warp_sum;
using quant::Type;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kChunk = kFloatChunk;  // elements per vectorized step

template <Type T, int kMaxVectors, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    matvec_float_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int cols,
                        const float* __restrict__ x, float* __restrict__ y, int n_vectors, int warps_per_row,
                        Grouping g) {
  matvec_prologue(g, weights, row_bytes, int(blockIdx.x) * (kWarps / warps_per_row), kWarps / warps_per_row, rows);
  int row0;
  if (!resolve_group(g, weights, row0, n_vectors, y)) return;  // uniform over the CTA
  const float* x_v[kMaxVectors];
#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) x_v[v] = x + group_act_row(g, row0 + (v < n_vectors ? v : 0)) * size_t(cols);
  y += size_t(row0) * size_t(rows);
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int rows_per_cta = kWarps / warps_per_row;
  const int row = int(blockIdx.x) * rows_per_cta + warp / warps_per_row;
  const int t = (warp % warps_per_row) * kWarpSize + lane;
  const int stride = warps_per_row * kWarpSize;

  float acc[kMaxVectors];
#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) acc[v] = 0.0f;

  if (row < rows) {
    const void* w = weights + size_t(row) * row_bytes;
    if constexpr (kVectorized) {
      for (int c = t * kChunk; c < cols; c += stride * kChunk) {
        float wv[kChunk];
        FloatWeights<T>::chunk(w, c, wv);
#pragma unroll
        for (int v = 0; v < kMaxVectors; ++v) {
          if (v < n_vectors) {
            const float4* xp = reinterpret_cast<const float4*>(x_v[v] + c);
            const float4 x0 = xp[0];
            const float4 x1 = xp[1];
            float s = acc[v];
            s = fmaf(wv[0], x0.x, s);
            s = fmaf(wv[1], x0.y, s);
            s = fmaf(wv[2], x0.z, s);
            s = fmaf(wv[3], x0.w, s);
            s = fmaf(wv[4], x1.x, s);
            s = fmaf(wv[5], x1.y, s);
            s = fmaf(wv[6], x1.z, s);
            s = fmaf(wv[7], x1.w, s);
            acc[v] = s;
          }
        }
      }
    } else {
      for (int c = t; c < cols; c += stride) {
        const float wc = FloatWeights<T>::at(w, c);
#pragma unroll
        for (int v = 0; v < kMaxVectors; ++v) {
          if (v < n_vectors) acc[v] = fmaf(wc, x_v[v][c], acc[v]);
        }
      }
    }
  }

#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) acc[v] = warp_sum(acc[v]);

  if (warps_per_row == 1) {  // uniform over the CTA
    if (lane == 0 && row < rows) {
#pragma unroll
      for (int v = 0; v < kMaxVectors; ++v) {
        if (v < n_vectors) y[size_t(v) * rows + row] = acc[v];
      }
    }
    return;
  }
  __shared__ float partial[kWarps][kMaxVectors];
  if (lane == 0) {
#pragma unroll
    for (int v = 0; v < kMaxVectors; ++v) partial[warp][v] = acc[v];
  }
  __syncthreads();
  if (lane == 0 && warp % warps_per_row == 0 && row < rows) {
#pragma unroll
    for (int v = 0; v < kMaxVectors; ++v) {
      if (v < n_vectors) {
        float s = 0.0f;
        for (int k = 0; k < warps_per_row; ++k) s += partial[warp + k][v];
        y[size_t(v) * rows + row] = s;
      }
    }
  }
}

template <Type T, int kMaxVectors, bool kVectorized>
void launch_with(const MatvecLaunch& a, int wpr, cudaStream_t stream) {
  const int rows_per_cta = kWarps / wpr;
  const dim3 grid(unsigned((a.rows + rows_per_cta - 1) / rows_per_cta), unsigned(a.group.items ? a.group.n_items : 1),
                  unsigned(a.group.items ? a.group.n_parts : 1));
  CUDA_CHECK(ops::launch(matvec_float_kernel<T, kMaxVectors, kVectorized>, grid, kThreads, 0, stream,
                         static_cast<const uint8_t*>(a.weights), a.row_bytes, int(a.rows), int(a.cols),
                         static_cast<const float*>(a.act), a.y, a.n_vectors, wpr, a.group));
}

template <Type T>
void launch(const MatvecLaunch& a, cudaStream_t stream) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // Grouped weights are checked by the caller (16-byte aligned like every matvec weight).
  const bool vectorized = a.cols % kChunk == 0 && (a.group.items != nullptr || aligned16(a.weights)) && aligned16(a.act);
  // One thread handles kChunk (or 1) elements per step; 4 warps per row once each thread has work.
  const int64_t steps = vectorized ? a.cols / kChunk : a.cols;
  const int wpr = steps >= 4 * kWarpSize ? 4 : (steps >= 2 * kWarpSize ? 2 : 1);
  if (a.n_vectors == 1) {
    if (vectorized) {
      launch_with<T, 1, true>(a, wpr, stream);
    } else {
      launch_with<T, 1, false>(a, wpr, stream);
    }
  } else {
    if (vectorized) {
      launch_with<T, int(kMaxMatvecVectors), true>(a, wpr, stream);
    } else {
      launch_with<T, int(kMaxMatvecVectors), false>(a, wpr, stream);
    }
  }
}

}  // namespace

bool matvec_float_supports(quant::Type type) {
  return type == Type::F32 || type == Type::F16 || type == Type::BF16;
}

bool launch_matvec_float(quant::Type type, const MatvecLaunch& args, CUstream_st* stream) {
  switch (type) {
    case Type::F32: launch<Type::F32>(args, stream); return true;
    case Type::F16: launch<Type::F16>(args, stream); return true;
    case Type::BF16: launch<Type::BF16>(args, stream); return true;
    default: return false;
  }
}

}  // namespace magnetar::cuda::detail
