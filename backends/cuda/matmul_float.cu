// Matrix-matrix product for float weights (F32, F16, BF16) against float32 activations: y[r] = W x[r] for many
// activation rows r, each output a float32 fused multiply-add chain over k in order (the same rounding bound as
// matvec_float.cu's per-thread chains). For prefill: the router (F32, [n_expert, n_embd]) and any float weight a
// model keeps; before this kernel those went through matvec 8 activation rows per launch, re-reading the matrix
// n / 8 times (the 30B-A3B router at 512 tokens: 64 launches of 7.2 us per layer, 20% of the prefill's GPU time).
//
// Tiling: the 30B-A3B router is only 128 weight rows, so big output tiles leave most SMs idle (64 x 64 tiles at 512
// tokens: 16 CTAs, 222 us per layer, measured). A CTA computes 16 activation rows x 32 weight rows (128 CTAs for the
// router at 512 tokens) and splits K over its 8 warps: per K-step of 128 warp w runs k = 16 w .. 16 w + 15 as a
// 4 x 4 outer product per lane (16 FMA per 8 shared loads, 64 per 8 when the rows are 16-byte aligned and a load
// takes 4 elements; weights converted on the way: F16 via __half2float, BF16 by a shift, both exact), and at the end
// the 8 partial sums of each output are added in warp order (deterministic). Each output: 8 FMA chains of cols / 8 in
// order plus 7 additions, within the bound of one chain (matvec_float.cu's).
// Staging: the K-steps' raw rows are copied by cp.async kStages - 1 steps ahead of the one computed (a ring of
// kStages buffers in dynamic shared memory), each row's chunk at its global address's offset modulo 16 (rows of any
// length; buffers 16-byte aligned, checked), rows padded to 4 words mod 32 so that the lanes' reads of 4 activation
// rows and 8 weight rows hit distinct banks.
// Counts: 0.27 GFLOP for the router at 512 tokens, ~2 us of the H200's FP32 peak; staging reads the weights once per
// 16 activation rows (L2-resident: 1 MB). Measured (docs/benchmarks/2026-12-01-cuda-prefill-small-kernels.md): 27 us
// per layer at 512 tokens, 41-42 us when staged by plain loads one K-step at a time; half issue-bound on the staging's
// arithmetic. Tails (rows, cols, n not multiples of the tiles) are zero-filled and not written.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cp_async.cuh"
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
constexpr int kStages = 4;   // K-steps in the ring: 3 in flight while one is computed

template <Type T>
constexpr int kElemBytes = T == Type::F32 ? 4 : 2;

// One K-step of the tile's rows as copied: row r's chunk starts at byte (its global address % 16) of its buffer row.
// A buffer row is the step's bytes + 16, a multiple of 16 bytes and 4 words mod 32 (528 or 272 bytes).
template <Type T>
struct Stage {
  static constexpr int kXBytes = kStepK * 4 + 16;
  static constexpr int kWBytes = kStepK * kElemBytes<T> + 16;
  static constexpr int kXUnits = kXBytes / 16;
  static constexpr int kWUnits = kWBytes / 16;
  uint8_t x[kTileX][kXBytes];
  uint8_t w[kTileW][kWBytes];
};
template <Type T>
union Smem {
  Stage<T> stage[kStages];
  float partial[kWarps][kTileX * kTileW];  // after the K loop: the warps' partial sums
};

// Issues the copies of K-step `step` (none past the last: an empty group keeps the count) and commits them.
template <Type T>
__device__ __forceinline__ void stage_step(Stage<T>& st, const uint8_t* __restrict__ weights, size_t row_bytes,
                                           int rows, int cols, const float* __restrict__ x, int n, int w0, int x0,
                                           int step) {
  using S = Stage<T>;
  const int k0 = step * kStepK;
  if (k0 < cols) {
    const int k_len = min(kStepK, cols - k0);
#pragma unroll 1
    for (int u = int(threadIdx.x); u < kTileX * S::kXUnits; u += kThreads) {
      const int r = u / S::kXUnits;
      const bool in = x0 + r < n;
      const float* src = x + size_t(in ? x0 + r : 0) * size_t(cols) + k0;
      detail::stage_unit(st.x[r], reinterpret_cast<const uint8_t*>(src), in ? 4 * k_len : 0, u % S::kXUnits);
    }
#pragma unroll 1
    for (int u = int(threadIdx.x); u < kTileW * S::kWUnits; u += kThreads) {
      const int r = u / S::kWUnits;
      const bool in = w0 + r < rows;
      const uint8_t* src = weights + size_t(in ? w0 + r : 0) * row_bytes + size_t(k0) * kElemBytes<T>;
      detail::stage_unit(st.w[r], src, in ? kElemBytes<T> * k_len : 0, u % S::kWUnits);
    }
  }
  detail::cp_async_commit();
}

// Four consecutive elements k .. k + 3 (k a multiple of 4) of a staged row that starts 16-byte aligned: one 16-byte
// (F32) or 8-byte (F16, BF16) shared load.
template <Type T>
__device__ __forceinline__ void load4(const uint8_t* row, int k, float (&v)[4]) {
  if constexpr (T == Type::F32) {
    const float4 f = *reinterpret_cast<const float4*>(row + 4 * k);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 h = *reinterpret_cast<const uint2*>(row + 2 * k);
    const uint16_t e[4] = {uint16_t(h.x), uint16_t(h.x >> 16), uint16_t(h.y), uint16_t(h.y >> 16)};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = detail::FloatWeights<T>::at(e, i);
  }
}

// kVec: every row starts 16-byte aligned (row bytes multiples of 16), so the compute loads 4 elements per shared load
// (4x fewer loads: the scalar form is bound by them); otherwise one element per load at the rows' offsets.
template <Type T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    matmul_float_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int cols,
                        const float* __restrict__ x, float* __restrict__ y, int n) {
  extern __shared__ __align__(16) uint8_t smem_bytes[];
  Smem<T>& sm = *reinterpret_cast<Smem<T>*>(smem_bytes);
  const int tid = int(threadIdx.x);
  const int warp = tid / 32;
  const int lx = (tid % 32) / 8;  // activation rows lx + 4 i
  const int lw = tid % 8;         // weight rows lw + 8 j
  const int w0 = int(blockIdx.x) * kTileW;
  const int x0 = int(blockIdx.y) * kTileX;
  // Where each of the thread's rows starts in a buffer row: its address % 16, the same for every K-step (a step's
  // bytes are a multiple of 16); rows past the end were staged from row 0 (as zeros).
  int xo[4], wo[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = x0 + lx + 4 * i;
    xo[i] = int(reinterpret_cast<uintptr_t>(x + size_t(r < n ? r : 0) * size_t(cols)) % 16);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = w0 + lw + 8 * j;
    wo[j] = int(reinterpret_cast<uintptr_t>(weights + size_t(r < rows ? r : 0) * row_bytes) % 16);
  }
  const int steps = (cols + kStepK - 1) / kStepK;
#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) stage_step<T>(sm.stage[s], weights, row_bytes, rows, cols, x, n, w0, x0, s);

  float acc[4][4] = {};
#pragma unroll 1
  for (int step = 0; step < steps; ++step) {
    detail::cp_async_wait_group<kStages - 2>();  // this thread's copies of `step` done
    __syncthreads();  // everyone's copies visible; everyone done with step - 1, whose buffer is refilled next
    stage_step<T>(sm.stage[(step + kStages - 1) % kStages], weights, row_bytes, rows, cols, x, n, w0, x0,
                  step + kStages - 1);
    const Stage<T>& st = sm.stage[step % kStages];
    if constexpr (kVec) {
#pragma unroll
      for (int kk = 0; kk < kWarpK; kk += 4) {
        const int k = warp * kWarpK + kk;
        float a[4][4], b[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) load4<Type::F32>(st.x[lx + 4 * i], k, a[i]);
#pragma unroll
        for (int j = 0; j < 4; ++j) load4<T>(st.w[lw + 8 * j], k, b[j]);
#pragma unroll
        for (int e = 0; e < 4; ++e)  // k ascending: the same chains as the scalar form
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(b[j][e], a[i][e], acc[i][j]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kWarpK; ++kk) {
        const int k = warp * kWarpK + kk;
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float*>(&st.x[lx + 4 * i][xo[i] + 4 * k]);
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = detail::FloatWeights<T>::at(&st.w[lw + 8 * j][wo[j]], k);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(b[j], a[i], acc[i][j]);
      }
    }
  }
  detail::cp_async_wait_all();  // (only empty groups are left)
  __syncthreads();              // every warp done with the stages: partial reuses their memory
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sm.partial[warp][(lx + 4 * i) * kTileW + lw + 8 * j] = acc[i][j];
  __syncthreads();
  for (int o = tid; o < kTileX * kTileW; o += kThreads) {
    const int r = x0 + o / kTileW, c = w0 + o % kTileW;
    float sum = sm.partial[0][o];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += sm.partial[w][o];
    if (r < n && c < rows) y[size_t(r) * size_t(rows) + size_t(c)] = sum;
  }
}

template <Type T, bool kVec>
void launch_form(const MatmulArgs& a, size_t row_bytes, cudaStream_t stream) {
  // Over the 48 KiB of static shared memory (F32: 99 KiB): opted in once per kernel (thread-safe static
  // initialization).
  static const bool opted_in = [] {
    CUDA_CHECK(cudaFuncSetAttribute(matmul_float_kernel<T, kVec>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(sizeof(Smem<T>))));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(unsigned((a.rows + kTileW - 1) / kTileW), unsigned((a.n + kTileX - 1) / kTileX));
  matmul_float_kernel<T, kVec><<<grid, kThreads, sizeof(Smem<T>), stream>>>(
      static_cast<const uint8_t*>(a.weights), row_bytes, int(a.rows), int(a.cols), static_cast<const float*>(a.x),
      a.y, int(a.n));
  CUDA_CHECK(cudaGetLastError());
}

template <Type T>
void launch(const MatmulArgs& a, size_t row_bytes, cudaStream_t stream) {
  if (row_bytes % 16 == 0 && a.cols % 4 == 0) {  // (the buffers start 16-byte aligned: checked)
    launch_form<T, true>(a, row_bytes, stream);
  } else {
    launch_form<T, false>(a, row_bytes, stream);
  }
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
  // The staged copies read whole 16-byte lines from the buffers' starts.
  if (reinterpret_cast<uintptr_t>(args.weights) % 16 != 0 || reinterpret_cast<uintptr_t>(args.x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(args.y) % 4 != 0) {
    return Status::error("matmul_float: weights and x must be 16-byte aligned, y 4-byte aligned");
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
