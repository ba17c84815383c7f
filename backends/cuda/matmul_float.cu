// Matrix-matrix product for float weights (F32, F16, BF16) against float32 activations: y[r] = W x[r] for many
// activation rows r, each output a float32 fused multiply-add chain over k in order (the same rounding bound as
// matvec_float.cu's per-thread chains). For prefill: the router (F32, [n_expert, n_embd]) and any float weight a
// model keeps; before this kernel those went through matvec 8 activation rows per launch, re-reading the matrix
// n / 8 times (the 30B-A3B router at 512 tokens: 64 launches of 7.2 us per layer, 20% of the prefill's GPU time).
//
// Tiling: the 30B-A3B router is only 128 weight rows, so big output tiles leave most SMs idle (64 x 64 tiles at 512
// tokens: 16 CTAs, 222 us per layer, measured). A CTA computes 16 activation rows x 32 weight rows (128 CTAs for the
// router at 512 tokens) and splits K over its 8 warps: per K-step of 128 both tiles are staged in shared memory as
// float (weights converted on the way: F16 via __half2float, BF16 by a shift; both exact), warp w runs k = 16 w ..
// 16 w + 15 of every step as a 4 x 4 outer product per lane (16 FMA per 8 shared loads), and at the end the 8
// partial sums of each output are added in warp order (deterministic). Each output: 8 FMA chains of cols / 8 in
// order plus 7 additions, within the bound of one chain (matvec_float.cu's).
// Counts: 0.27 GFLOP for the router at 512 tokens, ~2 us of the H200's FP32 peak; staging reads the weights once per
// 16 activation rows (L2-resident: 1 MB). Measured 34.5 us per layer (docs/benchmarks/2026-12-01-cuda-prefill-mmq.md;
// matvec: 460 us): latency-bound, one CTA per SM waiting on each of its 16 K-steps' staging loads. Tails (rows, cols,
// n not multiples of the tiles) are zero-filled and not written.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/float_weights.cuh"

namespace magnetar::cuda {
namespace {

using quant::Type;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileX = 16;   // activation rows per CTA
constexpr int kTileW = 32;   // weight rows per CTA
constexpr int kStepK = 128;  // elements per staged K-step: 16 per warp
constexpr int kWarpK = kStepK / kWarps;

template <Type T>
__global__ void __launch_bounds__(kThreads)
    matmul_float_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int cols,
                        const float* __restrict__ x, float* __restrict__ y, int n) {
  // [k][row], rows padded to an odd count of floats: the transposing stores are conflict-free.
  __shared__ float xs[kStepK][kTileX + 1];
  __shared__ float ws[kStepK][kTileW + 1];
  __shared__ float partial[kWarps][kTileX * kTileW];
  const int tid = int(threadIdx.x);
  const int warp = tid / 32;
  const int lx = (tid % 32) / 8;  // activation rows lx + 4 i
  const int lw = tid % 8;         // weight rows lw + 8 j
  const int w0 = int(blockIdx.x) * kTileW;
  const int x0 = int(blockIdx.y) * kTileX;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < cols; k0 += kStepK) {
    // Stage: element u of a tile is row u / kStepK, k u % kStepK (a warp reads 128 consecutive bytes of a row).
#pragma unroll
    for (int i = 0; i < kTileX * kStepK / kThreads; ++i) {
      const int u = tid + i * kThreads;
      const int r = u / kStepK, k = k0 + u % kStepK;
      xs[u % kStepK][r] = k < cols && x0 + r < n ? x[size_t(x0 + r) * size_t(cols) + size_t(k)] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kTileW * kStepK / kThreads; ++i) {
      const int u = tid + i * kThreads;
      const int r = u / kStepK, k = k0 + u % kStepK;
      ws[u % kStepK][r] = k < cols && w0 + r < rows ? detail::FloatWeights<T>::at(weights + size_t(w0 + r) * row_bytes, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kWarpK; ++kk) {
      const int k = warp * kWarpK + kk;
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[k][lx + 4 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[k][lw + 8 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(b[j], a[i], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][(lx + 4 * i) * kTileW + lw + 8 * j] = acc[i][j];
  __syncthreads();
  for (int o = tid; o < kTileX * kTileW; o += kThreads) {
    const int r = x0 + o / kTileW, c = w0 + o % kTileW;
    float sum = partial[0][o];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += partial[w][o];
    if (r < n && c < rows) y[size_t(r) * size_t(rows) + size_t(c)] = sum;
  }
}

template <Type T>
void launch(const MatmulArgs& a, size_t row_bytes, cudaStream_t stream) {
  const dim3 grid(unsigned((a.rows + kTileW - 1) / kTileW), unsigned((a.n + kTileX - 1) / kTileX));
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
  if (args.rows < 1 || args.rows > INT_MAX - kTileW || args.cols < 1 || args.cols > INT_MAX - kStepK) {
    return Status::error(format("matmul_float: %lld x %lld is outside 1..%d x 1..%d", (long long)args.rows,
                                (long long)args.cols, INT_MAX - kTileW, INT_MAX - kStepK));
  }
  if (args.n < 1 || args.n > int64_t(kTileX) * 65535) {
    return Status::error(format("matmul_float: n=%lld is outside 1..%lld", (long long)args.n,
                                (long long)(int64_t(kTileX) * 65535)));
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
