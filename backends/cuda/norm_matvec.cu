// add_rms_norm of one row folded into the float matrix-vector product that reads the normed row (decode's MoE router:
// 128 F32 rows of 2,048 on the 30B-A3B geometry).
//
// Why: a decode token's norm is a launch of its own (rms_norm.cu's cluster kernel, 8 CTAs) whose time is latency, not
// bytes, and the router after it waits for it to end. Here each of the product's CTAs (one output row, 128 threads,
// as matvec_float.cu takes rows of 1,024 or more columns) makes the norm itself: its threads load their columns of x
// and residual (16 KB per CTA from L2 at 2,048 columns; 2 MB over the router's 128 CTAs), the CTA adds the row's
// squares and scales the columns it multiplies. The router's weights and the norm's weights are loaded before waiting
// for the kernel before (no kernel writes them), so after the wait the chain is: x and residual from L2, the sum of
// squares (warp shuffles, one barrier), the dot product in registers. Everything stays in registers but the groups'
// sums (2 KB of shared memory at most): versions that staged the row in 8 KB of dynamic shared memory were slower than
// the two launches they replaced (tg128 452-464 t/s against 471-478, H200;
// docs/benchmarks/2026-12-01-cuda-decode-norm-in-router.md).
//
// Same numbers as the two launches it replaces: the sum of squares is added in rms_norm_cluster_kernel's order (each
// 32-column group over warp_sum's tree, the groups of each of its 8 slices of n/8 columns in column order, then the
// slices in order: norm_order.cuh), y = (v * scale) * w rounded as there, and the product in
// matvec_float_kernel's order for 4 warps per row (each thread's fmaf chain over its 8-column chunks 1,024 apart, the
// warp's sum, the warps in order). So out, x_out, y and the Q8_K y are bit for bit add_rms_norm's then matvec's where
// add_rms_norm runs on clusters (norm_in_cluster; CudaOps.AddRmsNormMatvecEqualsNormThenMatvec).
// x_out, y: written by CTA 0 from its registers; the Q8_K y (q8::block_q8_k_lane8: a warp's chunk is one 256-element
// block, 8 consecutive elements per lane): block b by the warp that holds it in CTA b mod the grid.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/float_weights.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/norm_order.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"

namespace magnetar::cuda {
namespace {

using ops::kWarpSize;
using quant::Type;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kChunk = detail::kFloatChunk;        // columns per thread and step (matvec_float's vectorized step)
constexpr int kStep = kThreads * kChunk;           // columns per step of the CTA
static_assert(kStep == kNormMatvecStep);

// 8 floats to 16-byte aligned global memory.
__device__ __forceinline__ void store8(float* dst, const float (&v)[kChunk]) {
  float4* o = reinterpret_cast<float4*>(dst);
  o[0] = make_float4(v[0], v[1], v[2], v[3]);
  o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

struct Params {
  const float* x;
  const float* residual;
  const float* norm_w;
  float* x_out;
  float* y;
  uint8_t* yq;  // Q8_K rows, or null
  const uint8_t* weights;
  size_t row_bytes;
  float* out;
  int n_cols;
  float eps;
};

// Grid: one CTA per output row. kChunks: the steps of 1,024 columns each thread takes (n_cols <= kChunks * 1024).
template <Type T, int kChunks>
__global__ void __launch_bounds__(kThreads) norm_matvec_kernel(const Params p) {
  __shared__ double group_s[kMaxNormMatvecCols / kWarpSize];  // the row's 32-column groups' sums of squares
  __shared__ float scale_s;
  __shared__ float partial[kWarps];
  const int tid = int(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int n = p.n_cols;
  const uint8_t* w_row = p.weights + size_t(blockIdx.x) * p.row_bytes;
  float wm[kChunks][kChunk], wn[kChunks][kChunk], v[kChunks][kChunk];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {  // the weights are no kernel's output: loaded before the wait
    const int c = kChunk * tid + kStep * i;
    if (c < n) {
      detail::FloatWeights<T>::chunk(w_row, c, wm[i]);
      detail::FloatWeights<Type::F32>::chunk(p.norm_w, c, wn[i]);
    }
  }
  ops::pdl_wait();
  ops::pdl_trigger();
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = kChunk * tid + kStep * i;
    if (c < n) {
      float x[kChunk], r[kChunk];
      detail::FloatWeights<Type::F32>::chunk(p.x, c, x);
      detail::FloatWeights<Type::F32>::chunk(p.residual, c, r);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v[i][e] = __fadd_rn(x[e], r[e]);
      if (blockIdx.x == 0) store8(p.x_out + c, v[i]);
      const double group = norm_order::group_sum8(v[i]);  // the chunk's 32-column group (4 lanes of 8)
      if (lane % 4 == 0) group_s[c / kWarpSize] = group;
    }
  }
  __syncthreads();
  if (warp == 0) {  // rms_norm_cluster_kernel's total: its slices' groups in column order, then the slices
    const float scale = norm_order::row_scale(group_s, n, p.eps, lane);
    if (lane == 0) scale_s = scale;
  }
  __syncthreads();
  const float scale = scale_s;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = kChunk * tid + kStep * i;
    if (c < n) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        v[i][e] = __fmul_rn(__fmul_rn(v[i][e], scale), wn[i][e]);  // y
        acc = fmaf(wm[i][e], v[i][e], acc);
      }
      if (blockIdx.x == 0) store8(p.y + c, v[i]);
    }
  }
  acc = ops::warp_sum(acc);
  if (lane == 0) partial[warp] = acc;
  // The quantized y: block b (256 columns: chunk b / 4, warp b % 4, 8 per lane) by that warp of CTA b mod grid.
  if (p.yq != nullptr) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int b = kWarps * i + warp;
      if (kStep * i < n && b % int(gridDim.x) == int(blockIdx.x)) {
        q8::block_q8_k_lane8(v[i], reinterpret_cast<quant::BlockQ8_K*>(p.yq) + b, lane);
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    float s = 0.0f;
    for (int k = 0; k < kWarps; ++k) s += partial[k];
    p.out[blockIdx.x] = s;
  }
}

template <Type T>
void launch(const Params& p, int rows, cudaStream_t stream) {
  const int chunks = (p.n_cols + kStep - 1) / kStep;
  auto* kernel = chunks <= 1   ? norm_matvec_kernel<T, 1>
                 : chunks <= 2 ? norm_matvec_kernel<T, 2>
                 : chunks <= 4 ? norm_matvec_kernel<T, 4>
                               : norm_matvec_kernel<T, 8>;
  static_assert(8 * kStep == kMaxNormMatvecCols);
  CUDA_CHECK(ops::launch(kernel, unsigned(rows), kThreads, 0, stream, p));
}

}  // namespace

bool add_rms_norm_matvec_fits(quant::Type type, int64_t n_cols) {
  return (type == Type::F32 || type == Type::F16 || type == Type::BF16) && n_cols >= kNormMatvecStep &&
         n_cols % kNormMatvecStep == 0 && n_cols <= kMaxNormMatvecCols;
}

Status add_rms_norm_matvec(const NormMatvecArgs& a, Stream& stream) {
  const AddRmsNormArgs& nm = a.norm;
  if (!add_rms_norm_matvec_fits(a.type, nm.n_cols)) {
    return Status::error(format("add_rms_norm_matvec: weights of type id %d, %lld columns (F32, F16 or BF16, a "
                                "multiple of %lld up to %lld)", int(a.type), (long long)nm.n_cols,
                                (long long)kNormMatvecStep, (long long)kMaxNormMatvecCols));
  }
  if (nm.n_rows != 1 || nm.residual_rows != nullptr || nm.residual_weights != nullptr) {
    return Status::error(format("add_rms_norm_matvec: n_rows=%lld: one row, without the MoE combine",
                                (long long)nm.n_rows));
  }
  if (a.rows < 1 || a.rows > INT_MAX) {
    return Status::error(format("add_rms_norm_matvec: rows=%lld: must be in 1..%d", (long long)a.rows, INT_MAX));
  }
  if (nm.x == nullptr || nm.residual == nullptr || nm.weight == nullptr || nm.y == nullptr || nm.x_out == nullptr ||
      a.weights == nullptr || a.out == nullptr) {
    return Status::error("add_rms_norm_matvec: null device pointer (x_out is required)");
  }
  for (const void* ptr : {static_cast<const void*>(nm.x), static_cast<const void*>(nm.residual),
                          static_cast<const void*>(nm.weight), static_cast<const void*>(nm.y),
                          static_cast<const void*>(nm.x_out), a.weights}) {
    if (!ops::aligned(ptr, 16)) {
      return Status::error("add_rms_norm_matvec: x, residual, weight, y, x_out and weights must be 16-byte aligned");
    }
  }
  for (const float* out : {nm.x_out, nm.y, a.out}) {
    if (out == nm.x || out == nm.residual) {
      return Status::error("add_rms_norm_matvec: x_out, y and out must not alias x or residual");
    }
  }
  if (nm.x_out == nm.y || nm.x_out == a.out || nm.y == a.out) {
    return Status::error("add_rms_norm_matvec: x_out, y and out must be three buffers");
  }
  if (nm.y_quantized != nullptr && nm.y_type != Type::Q8_K) {
    return Status::error(format("add_rms_norm_matvec: y_type (id %d) cannot be quantized here (Q8_K only)",
                                int(nm.y_type)));
  }
  if (nm.y_quantized != nullptr && !ops::aligned(nm.y_quantized, 4)) {
    return Status::error("add_rms_norm_matvec: y_quantized must be 4-byte aligned");
  }
  const Params p{.x = nm.x, .residual = nm.residual, .norm_w = nm.weight, .x_out = nm.x_out, .y = nm.y,
                 .yq = static_cast<uint8_t*>(nm.y_quantized),
                 .weights = static_cast<const uint8_t*>(a.weights),
                 .row_bytes = size_t(nm.n_cols) * (a.type == Type::F32 ? 4u : 2u),
                 .out = a.out, .n_cols = int(nm.n_cols), .eps = nm.eps};
  switch (a.type) {
    case Type::F16: launch<Type::F16>(p, int(a.rows), stream.raw()); break;
    case Type::BF16: launch<Type::BF16>(p, int(a.rows), stream.raw()); break;
    default: launch<Type::F32>(p, int(a.rows), stream.raw()); break;
  }
  return Status();
}

}  // namespace magnetar::cuda
