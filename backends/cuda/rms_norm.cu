// RMSNorm over rows (cpu::rms_norm), and the residual add fused with it (x += residual; y = norm(x)).
//
// Cost: rms_norm reads x once for the sum of squares and once more for the output (the second read of a row
// comes from L1/L2: a 4096-float row is 16 KB), writes y: 8 bytes per element from HBM plus the weight row,
// ~3 flops per element. add_rms_norm reads x and residual, writes x and y: 16 bytes per element, where the
// separate add (12) and norm (8) take 20. Both are bound by memory bandwidth (at 4.8 TB/s a 4096-wide row is
// ~7 ns; a decode token's norm is launch-latency bound). The sum of squares is in double, as on the CPU, so
// the scale comes out the same float except when the double sums of the two orders straddle a rounding
// boundary of float (then it differs by one ulp); the double FMAs cost nothing on sm_80/sm_90 (FP64 at half
// the FP32 rate) and ~n_cols/64 float-equivalents per row on consumer parts, still below the memory time.
//
// Work split: rows of up to 1024 elements (q/k norm: head_dim; small models' hidden rows) take one warp
// each, 8 rows per 256-thread CTA; longer rows take a whole CTA of 256 threads.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarpRowMax = 1024;  // longest row that one warp takes

// kAdd: x_out = x + residual first (x_out == x in place; y separate). Otherwise y may equal x.
template <int kRowThreads, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, float* x_out, const float* __restrict__ residual, const float* __restrict__ w,
                    float* y, int n_rows, int n_cols, float eps) {
  constexpr int kRowsPerCta = kThreads / kRowThreads;
  const int t = int(threadIdx.x) % kRowThreads;
  const int row = int(blockIdx.x) * kRowsPerCta + int(threadIdx.x) / kRowThreads;
  const size_t off = size_t(row) * size_t(n_cols);

  // The row's first kKeep * kRowThreads elements are loaded into registers in one unrolled pass (every load in
  // flight at once) and reused for the output; longer rows loop over the rest. A loop of dependent loads and
  // in-place stores (x and x_out alias) took 7.2 us per decode token's 2048-wide row on the H200 (ncu,
  // 2026-11-30): load latency, not bandwidth. The sum's order per thread is unchanged.
  constexpr int kKeep = kRowThreads == ops::kWarpSize ? 1024 / ops::kWarpSize : 16;
  float kept[kKeep];
  double sum = 0;
  if (row < n_rows) {
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      const int i = t + j * kRowThreads;
      kept[j] = i < n_cols ? x[off + i] : 0.0f;
      if (kAdd && i < n_cols) kept[j] = __fadd_rn(kept[j], residual[off + i]);
    }
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      const int i = t + j * kRowThreads;
      if (i < n_cols) {
        if (kAdd) x_out[off + i] = kept[j];
        sum += double(kept[j]) * double(kept[j]);
      }
    }
    for (int i = t + kKeep * kRowThreads; i < n_cols; i += kRowThreads) {
      float v = x[off + i];
      if (kAdd) {
        v = __fadd_rn(v, residual[off + i]);
        x_out[off + i] = v;
      }
      sum += double(v) * double(v);
    }
  }
  sum = ops::warp_sum(sum);
  if (kRowThreads > ops::kWarpSize) {  // one row per CTA: combine the warps
    constexpr int kWarps = kRowThreads / ops::kWarpSize;
    __shared__ double partial[kWarps];
    const int warp = t / ops::kWarpSize;
    if (t % ops::kWarpSize == 0) partial[warp] = sum;
    __syncthreads();
    sum = 0;
    for (int k = 0; k < kWarps; ++k) sum += partial[k];
  }
  if (row >= n_rows) return;
  const float scale = float(1.0 / sqrt(sum / double(n_cols) + double(eps)));
#pragma unroll
  for (int j = 0; j < kKeep; ++j) {
    const int i = t + j * kRowThreads;
    if (i < n_cols) y[off + i] = __fmul_rn(__fmul_rn(kept[j], scale), w[i]);
  }
  // The thread reads back only what it wrote itself (kAdd), so no barrier is needed.
  const float* src = kAdd ? x_out : x;
  for (int i = t + kKeep * kRowThreads; i < n_cols; i += kRowThreads) {
    y[off + i] = __fmul_rn(__fmul_rn(src[off + i], scale), w[i]);
  }
}

template <bool kAdd>
void launch(const float* x, float* x_out, const float* residual, const float* w, float* y, int64_t n_rows,
            int64_t n_cols, float eps, cudaStream_t stream) {
  if (n_cols <= kWarpRowMax) {
    constexpr int kRows = kThreads / ops::kWarpSize;
    const unsigned grid = unsigned((n_rows + kRows - 1) / kRows);
    rms_norm_kernel<ops::kWarpSize, kAdd>
        <<<grid, kThreads, 0, stream>>>(x, x_out, residual, w, y, int(n_rows), int(n_cols), eps);
  } else {
    rms_norm_kernel<kThreads, kAdd>
        <<<unsigned(n_rows), kThreads, 0, stream>>>(x, x_out, residual, w, y, int(n_rows), int(n_cols), eps);
  }
  CUDA_CHECK(cudaGetLastError());
}

Status check_shape(const char* op, int64_t n_rows, int64_t n_cols) {
  if (n_rows < 1 || n_cols < 1 || n_rows > INT_MAX || n_cols > INT_MAX) {
    return Status::error(format("%s: n_rows=%lld, n_cols=%lld: each must be in 1..%d", op, (long long)n_rows,
                                (long long)n_cols, INT_MAX));
  }
  return Status();
}

}  // namespace

Status rms_norm(const RmsNormArgs& a, Stream& stream) {
  MAGNETAR_RETURN_IF_ERROR(check_shape("rms_norm", a.n_rows, a.n_cols));
  if (a.x == nullptr || a.weight == nullptr || a.y == nullptr) return Status::error("rms_norm: null device pointer");
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.weight, 4) || !ops::aligned(a.y, 4)) {
    return Status::error("rms_norm: x, weight and y must be 4-byte aligned");
  }
  launch<false>(a.x, nullptr, nullptr, a.weight, a.y, a.n_rows, a.n_cols, a.eps, stream.raw());
  return Status();
}

Status add_rms_norm(const AddRmsNormArgs& a, Stream& stream) {
  MAGNETAR_RETURN_IF_ERROR(check_shape("add_rms_norm", a.n_rows, a.n_cols));
  if (a.x == nullptr || a.residual == nullptr || a.weight == nullptr || a.y == nullptr) {
    return Status::error("add_rms_norm: null device pointer");
  }
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.residual, 4) || !ops::aligned(a.weight, 4) || !ops::aligned(a.y, 4)) {
    return Status::error("add_rms_norm: x, residual, weight and y must be 4-byte aligned");
  }
  if (a.y == a.x || a.y == a.residual) return Status::error("add_rms_norm: y must not alias x or residual");
  launch<true>(a.x, a.x, a.residual, a.weight, a.y, a.n_rows, a.n_cols, a.eps, stream.raw());
  return Status();
}

}  // namespace magnetar::cuda
