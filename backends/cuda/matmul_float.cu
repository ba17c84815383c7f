// Matrix-matrix product for float weights (F32, F16, BF16) against float32 activations: y[r] = W x[r] for many
// activation rows r, each output a float32 fused multiply-add chain over k in order (the same rounding bound as
// matvec_float.cu's per-thread chains). For prefill: the router (F32, [n_expert, n_embd]) and any float weight a
// model keeps; before this kernel those went through matvec 8 activation rows per launch, re-reading the matrix
// n / 8 times (the 30B-A3B router at 512 tokens: 64 launches of 7.2 us per layer, 20% of the prefill's GPU time).
//
// Tiling: a CTA of 256 threads computes 64 activation rows x 64 weight rows; per K-step of 16 both tiles are
// staged in shared memory as float (weights converted on the way: F16 via __half2float, BF16 by a shift; both
// exact), each thread then runs 16 steps of a 4 x 4 outer product. Thread (tx, ty) = (tid % 16, tid / 16) owns
// weight rows w0 + tx + 16 j and activation rows x0 + ty + 16 i, so a warp's stores cover 16 consecutive
// outputs of two rows, and its shared reads are conflict-free (weights) or broadcast (activations).
// Counts per K-step: 256 FMA and 128 shared loads per thread (4 B each): bound by shared-memory bandwidth at
// about half the FP32 peak, ~30 TFLOPS on an H200 as a ceiling; the 30B-A3B router at 512 tokens is 0.27
// GFLOP, ~10-20 us. Tails (rows, cols, n not multiples of the tiles) are zero-filled and not written.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"

namespace magnetar::cuda {
namespace {

using quant::Type;

constexpr int kThreads = 256;
constexpr int kTile = 64;   // activation rows and weight rows per CTA
constexpr int kStepK = 16;  // elements per K-step
constexpr int kPad = 4;     // shared row padding (floats)

template <Type T>
__device__ __forceinline__ float weight_at(const uint8_t* row, int k) {
  if constexpr (T == Type::F32) {
    return reinterpret_cast<const float*>(row)[k];
  } else if constexpr (T == Type::F16) {
    return __half2float(reinterpret_cast<const __half*>(row)[k]);
  } else {
    return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(row)[k]) << 16);
  }
}

template <Type T>
__global__ void __launch_bounds__(kThreads)
    matmul_float_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int cols,
                        const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float xs[kStepK][kTile + kPad];
  __shared__ float ws[kStepK][kTile + kPad];
  const int tid = int(threadIdx.x);
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int w0 = int(blockIdx.x) * kTile;
  const int x0 = int(blockIdx.y) * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < cols; k0 += kStepK) {
    // Stage: element u of the 64 x 16 tile is row u / 16, k u % 16 (a half-warp reads 64 consecutive bytes).
#pragma unroll
    for (int i = 0; i < kTile * kStepK / kThreads; ++i) {
      const int u = tid + i * kThreads;
      const int r = u / kStepK;
      const int k = k0 + u % kStepK;
      const bool in_k = k < cols;
      xs[u % kStepK][r] = in_k && x0 + r < n ? x[size_t(x0 + r) * size_t(cols) + size_t(k)] : 0.0f;
      ws[u % kStepK][r] = in_k && w0 + r < rows ? weight_at<T>(weights + size_t(w0 + r) * row_bytes, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kStepK; ++k) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[k][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(b[j], a[i], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = x0 + ty + 16 * i;
    if (r >= n) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = w0 + tx + 16 * j;
      if (c < rows) y[size_t(r) * size_t(rows) + size_t(c)] = acc[i][j];
    }
  }
}

template <Type T>
void launch(const MatmulArgs& a, size_t row_bytes, cudaStream_t stream) {
  const dim3 grid(unsigned((a.rows + kTile - 1) / kTile), unsigned((a.n + kTile - 1) / kTile));
  matmul_float_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(a.weights), row_bytes,
                                                         int(a.rows), int(a.cols), static_cast<const float*>(a.x),
                                                         a.y, int(a.n));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool has_matmul_float(quant::Type type) { return type == Type::F32 || type == Type::F16 || type == Type::BF16; }

Status matmul_float(const MatmulArgs& args, Stream& stream) {
  if (!has_matmul_float(args.type)) {
    return Status::error(format("matmul_float: weight type id %u is not F32, F16 or BF16", unsigned(args.type)));
  }
  if (args.rows < 1 || args.rows > INT_MAX - kTile || args.cols < 1 || args.cols > INT_MAX - kStepK) {
    return Status::error(format("matmul_float: %lld x %lld is outside 1..%d x 1..%d", (long long)args.rows,
                                (long long)args.cols, INT_MAX - kTile, INT_MAX - kStepK));
  }
  if (args.n < 1 || args.n > int64_t(kTile) * 65535) {
    return Status::error(format("matmul_float: n=%lld is outside 1..%lld", (long long)args.n,
                                (long long)(int64_t(kTile) * 65535)));
  }
  if (args.weights == nullptr || args.x == nullptr || args.y == nullptr) {
    return Status::error("matmul_float: null device pointer (weights, x or y)");
  }
  const size_t elem = args.type == Type::F32 ? 4 : 2;
  if (reinterpret_cast<uintptr_t>(args.weights) % elem != 0 || reinterpret_cast<uintptr_t>(args.x) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(args.y) % 4 != 0) {
    return Status::error("matmul_float: weights, x and y must be aligned to their element size");
  }
  const size_t row_bytes = size_t(args.cols) * elem;
  switch (args.type) {
    case Type::F32: launch<Type::F32>(args, row_bytes, stream.raw()); break;
    case Type::F16: launch<Type::F16>(args, row_bytes, stream.raw()); break;
    default: launch<Type::BF16>(args, row_bytes, stream.raw()); break;
  }
  return Status();
}

}  // namespace magnetar::cuda
