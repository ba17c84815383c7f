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
// each, 8 rows per 256-thread CTA; longer rows take a whole CTA of 1024 threads. A decode token's norm is one
// CTA on one SM, so its time is the length of each warp's instruction chain: with 256 threads a 2048-wide row
// took 7.1 us (ncu, H200, 2026-11-30: ~750 instructions per warp at ~9 cycles each, issue slots 0.15% busy);
// 1024 threads cut each warp's share of the row and of its loads and stores by 4.
//
// add_rms_norm can also quantize y for the matrix products that read it (AddRmsNormArgs::y_quantized): y is
// staged in shared memory as it is written, and the row's warps then quantize it block by block with
// quantize_q8.cuh's code (the bytes of quantize_activations of y). On one CTA that is slower than a quantization
// launch of its own over several SMs; decode rows therefore take a cluster of CTAs (rms_norm_cluster_kernel below),
// where the fold pays (MAGNETAR_CUDA_FUSE in models/qwen3_moe/qwen3_moe_cuda.cpp). A row of its own CTA loads its
// weights before the reduction so their latency overlaps the loads of x and residual.
//
// add_rms_norm can also take the MoE combine of the layer before (AddRmsNormArgs::residual_rows): each element adds
// the weighted sum of its token's k expert rows, moe_combine's fmaf chain, instead of a row that moe_combine wrote in
// a launch of its own (decode: k = 8 rows of 2,048 floats read from L2 per token, one launch fewer per layer). The
// rows' indices and weights come from route_topk, two or more launches back, and are read before pdl_wait
// (ops_common.cuh's rule): one round trip to L2 off the chain after the wait.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;      // CTA of the warp-per-row kernel
constexpr int kRowCta = 1024;      // CTA of the CTA-per-row kernel
constexpr int64_t kWarpRowMax = 1024;  // longest row that one warp takes
constexpr int kMaxCombineK = 64;       // AddRmsNormArgs::residual_k's bound
using q8::Act;

// What add_rms_norm adds: residual rows, or (rows set) each row's MoE combine of k expert rows of residual, as
// moe_combine sums them (AddRmsNormArgs::residual_rows).
struct Residual {
  const float* p = nullptr;
  const int32_t* rows = nullptr;
  const float* w = nullptr;
  int k = 0;
};

// A row's k (expert row, weight) pairs of the MoE combine, staged in shared memory by a CTA that takes the row (one
// pair per thread; the caller synchronizes): each element's k expert-row loads then leave together, where
// residual_at loads an index before each of them (k dependent round trips to L2 per element).
struct StagedPairs {
  int32_t rows[kMaxCombineK];
  float w[kMaxCombineK];
};
__device__ __forceinline__ void stage_pairs(const Residual& r, int row, int t, StagedPairs& s) {
  if (t < r.k) {
    s.rows[t] = r.rows[row * r.k + t];
    s.w[t] = r.w[row * r.k + t];
  }
}
// Element i's combine from the staged pairs: residual_at's fmaf chain in slot order (bit-identical).
template <int kUnroll>
__device__ __forceinline__ float staged_combine(const Residual& r, const StagedPairs& s, int i, int n_cols) {
  float acc = 0.0f;
#pragma unroll(kUnroll)
  for (int j = 0; j < r.k; ++j) acc = fmaf(s.w[j], r.p[size_t(s.rows[j]) * size_t(n_cols) + i], acc);
  return acc;
}

__device__ __forceinline__ float residual_at(const Residual& r, int row, size_t off, int i, int n_cols) {
  if (r.rows == nullptr) return r.p[off + i];
  float s = 0.0f;
  for (int j = 0; j < r.k; ++j) {
    s = fmaf(r.w[row * r.k + j], r.p[size_t(r.rows[row * r.k + j]) * size_t(n_cols) + i], s);
  }
  return s;
}

// kAdd: x_out = x + residual first (x_out == x in place; y separate). Otherwise y may equal x.
// kA != kNone: y also quantized into yq (rows of yq_row_bytes), staged in dynamic shared memory (kRowsPerCta rows).
// kKeep: elements per thread held in registers (the row's first kKeep * kRowThreads), chosen at launch for the
// CTA-per-row kernel so that a 2048-wide row does not issue the (predicated-off) instructions of 8 slots for 2.
template <int kRowThreads, int kKeep, bool kAdd, Act kA>
__global__ void __launch_bounds__(kRowThreads == ops::kWarpSize ? kThreads : kRowThreads,
                                  kRowThreads == ops::kWarpSize ? 2 : 1)
    rms_norm_kernel(const float* x, float* x_out, const Residual residual, const float* __restrict__ w,
                    float* y, int n_rows, int n_cols, float eps, uint8_t* __restrict__ yq, size_t yq_row_bytes) {
  constexpr int kRowsPerCta = kRowThreads == ops::kWarpSize ? kThreads / ops::kWarpSize : 1;
  extern __shared__ float stage[];  // kA != kNone: [kRowsPerCta][n_cols]
  const int t = int(threadIdx.x) % kRowThreads;
  const int row = int(blockIdx.x) * kRowsPerCta + int(threadIdx.x) / kRowThreads;
  const size_t off = size_t(row) * size_t(n_cols);
  float* ys = stage + size_t(int(threadIdx.x) / kRowThreads) * size_t(n_cols);

  // The row's first kKeep * kRowThreads elements are loaded into registers in one unrolled pass (every load in
  // flight at once) and reused for the output; longer rows loop over the rest.
  // A row of its own CTA (decode's hidden rows) loads its weights up front too; warp rows (q/k norms over many
  // rows) keep their registers (2 CTAs per SM).
  constexpr bool kLoadW = kRowThreads > ops::kWarpSize;
  float kept[kKeep], wk[kLoadW ? kKeep : 1];
  if constexpr (kLoadW) {  // the weights are no kernel's output: loaded before waiting for the kernel before
#pragma unroll
    for (int j = 0; j < kKeep; ++j) wk[j] = t + j * kRowThreads < n_cols ? w[t + j * kRowThreads] : 0.0f;
  }
  // A row of its own CTA with a combine stages the row's pairs (StagedPairs) before the wait, as the weights.
  __shared__ StagedPairs pairs;
  const bool staged = kLoadW && kAdd && residual.rows != nullptr;  // uniform over the CTA
  constexpr int kCombineUnroll = kKeep <= 4 ? 8 : 1;  // 8 kept elements leave no registers (spills)
  if (staged) stage_pairs(residual, row, t, pairs);
  ops::pdl_wait();
  ops::pdl_trigger();
  if (staged) __syncthreads();
  auto added = [&](int i) {
    return staged ? staged_combine<kCombineUnroll>(residual, pairs, i, n_cols)
                  : residual_at(residual, row, off, i, n_cols);
  };
  double sum = 0;
  if (row < n_rows) {
#pragma unroll
    for (int j = 0; j < kKeep; ++j) {
      const int i = t + j * kRowThreads;
      kept[j] = i < n_cols ? x[off + i] : 0.0f;
      if (kAdd && i < n_cols) kept[j] = __fadd_rn(kept[j], added(i));
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
        v = __fadd_rn(v, added(i));
        x_out[off + i] = v;
      }
      sum += double(v) * double(v);
    }
  }
  sum = ops::warp_sum(sum);
  float scale;
  if constexpr (kRowThreads > ops::kWarpSize) {
    // One row per CTA: warp 0 adds the warps' sums (a warp tree, fixed order) and makes the scale, once for the
    // CTA (the double division and square root are ~100 instructions: every thread making it cost 1024 of them).
    constexpr int kWarps = kRowThreads / ops::kWarpSize;
    static_assert(kWarps <= ops::kWarpSize);
    __shared__ double partial[kWarps];
    __shared__ float scale_s;
    const int warp = t / ops::kWarpSize, lane = t % ops::kWarpSize;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
      const double total = ops::warp_sum(lane < kWarps ? partial[lane] : 0.0);
      if (lane == 0) scale_s = float(1.0 / sqrt(total / double(n_cols) + double(eps)));
    }
    __syncthreads();
    scale = scale_s;
  } else {
    if (row >= n_rows) return;
    scale = float(1.0 / sqrt(sum / double(n_cols) + double(eps)));
  }
#pragma unroll
  for (int j = 0; j < kKeep; ++j) {
    const int i = t + j * kRowThreads;
    if (i < n_cols) {
      const float v = __fmul_rn(__fmul_rn(kept[j], scale), kLoadW ? wk[kLoadW ? j : 0] : w[i]);
      y[off + i] = v;
      if (kA != Act::kNone) ys[i] = v;
    }
  }
  // The thread reads back only what it wrote itself (kAdd), so no barrier is needed.
  const float* src = kAdd ? x_out : x;
  for (int i = t + kKeep * kRowThreads; i < n_cols; i += kRowThreads) {
    const float v = __fmul_rn(__fmul_rn(src[off + i], scale), w[i]);
    y[off + i] = v;
    if (kA != Act::kNone) ys[i] = v;
  }
  if constexpr (kA != Act::kNone) {
    // The row's warps quantize its blocks from the staged y (one warp per row: it takes them all).
    constexpr int kRowWarps = kRowThreads / ops::kWarpSize;
    if (kRowWarps > 1) {
      __syncthreads();  // one row per CTA: no thread left early
    } else {
      __syncwarp();
    }
    const int n_blocks = n_cols / q8::block_elems(kA);
    uint8_t* dst = yq + size_t(row) * yq_row_bytes;
    for (int b = t / ops::kWarpSize; b < n_blocks; b += kRowWarps) q8::block<kA>(ys, dst, b, t % ops::kWarpSize);
  }
}

// ---- decode rows over a cluster of CTAs -----------------------------------------------------------------------------
//
// A decode token's norm is one row, and on one CTA its time is that SM's instruction chain: 2.7 us per norm, 96 norms
// per token on the 30B-A3B geometry, and a quantization folded into it took 2.4 us more, where a launch of its own over
// 8 CTAs took 1.5 (H200, kernel trace, 2026-12-01). Here a row takes a thread-block cluster of kClusterCtas CTAs of
// kClusterThreads threads (sm_90): CTA c takes columns [c m, (c + 1) m), m = n_cols / kClusterCtas, up to kPer per
// thread; each CTA's double sum of squares (each 32-column group over a warp tree, the groups in column order) goes to
// its shared memory, and after the cluster barrier every warp reads the kClusterCtas sums from distributed shared
// memory and adds them in rank order, so every CTA makes the same scale. Each CTA then writes y and, when asked,
// quantizes its own columns: Q8_K a block per 256 threads (q8::block_q8_k_group, m a multiple of 256), Q8_0 / Q8_1 a
// block per warp. A second barrier, waited for last, keeps every CTA's sum alive until the others have read it.
constexpr int kClusterCtas = detail::kNormClusterCtas;
constexpr int kClusterThreads = 256;
constexpr int kClusterMaxPer = 4;         // columns per thread: rows of up to 8,192
constexpr int64_t kClusterMaxRows = 8;    // decode: a cluster per row

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
using ops::cluster_arrive;
using ops::cluster_load;
using ops::cluster_wait;
#endif

// Grid (kClusterCtas, n_rows), clusters of kClusterCtas along x. kAdd / kA as rms_norm_kernel.
template <int kPer, bool kAdd, Act kA>
__global__ void __launch_bounds__(kClusterThreads)
    rms_norm_cluster_kernel(const float* x, float* x_out, const Residual residual, const float* __restrict__ w,
                            float* y, int n_cols, float eps, uint8_t* __restrict__ yq, size_t yq_row_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kWarps = kClusterThreads / ops::kWarpSize;
  const int t = int(threadIdx.x), warp = t / ops::kWarpSize, lane = t % ops::kWarpSize;
  const int row = int(blockIdx.y);
  const int m = n_cols / kClusterCtas;
  const int c0 = int(blockIdx.x) * m;  // the cluster spans x: rank blockIdx.x
  const size_t off = size_t(row) * size_t(n_cols);
  float wk[kPer], v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) wk[j] = t + j * kClusterThreads < m ? w[c0 + t + j * kClusterThreads] : 0.0f;
  __shared__ StagedPairs pairs;
  const bool combine = kAdd && residual.rows != nullptr;  // the pairs staged before the wait, as rms_norm_kernel's
  if (combine) stage_pairs(residual, row, t, pairs);
  ops::pdl_wait();
  ops::pdl_trigger();
  if (combine) __syncthreads();
  double sq[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = c0 + t + j * kClusterThreads;
    v[j] = 0.0f;
    if (t + j * kClusterThreads < m) {
      v[j] = x[off + i];
      if (kAdd) {
        const float s = combine ? staged_combine<8>(residual, pairs, i, n_cols) : residual.p[off + i];
        v[j] = __fadd_rn(v[j], s);
        x_out[off + i] = v[j];
      }
    }
    sq[j] = double(v[j]) * double(v[j]);
  }
  // Each 32-column group (a warp's j) over warp_sum's tree, the groups in column order (j, then warp), then the CTAs in
  // rank order: norm_matvec.cu restates this order.
  const double group = ops::warp_sums(sq, lane);
  __shared__ double group_sums[kPer][kWarps];
  __shared__ double cta_sum;
  if (lane % (ops::kWarpSize / kPer) == 0) group_sums[ops::warp_sums_index<kPer>(lane)][warp] = group;
  __syncthreads();
  if (t == 0) {
    double s = 0;
    for (int j = 0; j < kPer; ++j) {
      for (int k = 0; k < kWarps; ++k) s += group_sums[j][k];
    }
    cta_sum = s;
  }
  cluster_arrive();
  cluster_wait();  // every CTA's sum is written
  const double part = lane < kClusterCtas ? cluster_load(&cta_sum, lane) : 0.0;
  double total = 0;
#pragma unroll
  for (int r = 0; r < kClusterCtas; ++r) total += __shfl_sync(0xffffffffu, part, r);
  cluster_arrive();  // done reading the others' sums; waited for before leaving
  const float scale = float(1.0 / sqrt(total / double(n_cols) + double(eps)));
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (t + j * kClusterThreads < m) {
      v[j] = __fmul_rn(__fmul_rn(v[j], scale), wk[j]);
      y[off + c0 + t + j * kClusterThreads] = v[j];
    }
  }
  if constexpr (kA == Act::kQ8_K) {  // element t + 256 j of the slice is element t of its block j
    __shared__ q8::GroupMax scratch[kPer];
    auto* blocks = reinterpret_cast<quant::BlockQ8_K*>(yq + size_t(row) * yq_row_bytes) + c0 / quant::kQK_K;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (j * kClusterThreads < m) q8::block_q8_k_group(v[j], blocks + j, t, scratch[j]);
    }
  } else if constexpr (kA != Act::kNone) {  // a warp's 32 consecutive elements are one block (m a multiple of 32)
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = t + j * kClusterThreads;
      if (i < m) {
        const float xs[1] = {v[j]};
        q8::block_regs<kA>(xs, yq + size_t(row) * yq_row_bytes, (c0 + i) / quant::kQK32, lane);
      }
    }
  }
  cluster_wait();
#endif
}

// Whether this binary's rms_norm_cluster_kernel has a body: compiled for sm_90 or newer (a build for older GPUs only,
// run on a newer one through its PTX, has the empty kernel).
bool cluster_kernel_built() {
  static const bool built = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, rms_norm_cluster_kernel<1, true, Act::kNone>) == cudaSuccess &&
           attr.ptxVersion >= 90;
  }();
  return built;
}

// Whether a launch of n_rows x n_cols (quantized to kA) takes rms_norm_cluster_kernel.
bool cluster_rows(int64_t n_rows, int64_t n_cols, Act a) {
  const int64_t unit = kClusterCtas * (a == Act::kQ8_K ? quant::kQK_K : ops::kWarpSize);
  return n_rows <= kClusterMaxRows && n_cols % unit == 0 && n_cols <= kClusterCtas * kClusterThreads * kClusterMaxPer &&
         detail::norm_clusters() && cluster_kernel_built();
}

// Staged y per CTA of a quantizing launch: 8 rows of <= 1024 or one longer row.
size_t stage_bytes(int64_t n_cols) {
  return size_t(n_cols <= kWarpRowMax ? kThreads / ops::kWarpSize : 1) * size_t(n_cols) * sizeof(float);
}

template <bool kAdd, Act kA>
void launch(const float* x, float* x_out, const Residual& residual, const float* w, float* y, int64_t n_rows,
            int64_t n_cols, float eps, uint8_t* yq, size_t yq_row_bytes, cudaStream_t stream) {
  if (cluster_rows(n_rows, n_cols, kA)) {
    const int64_t per = (n_cols / kClusterCtas + kClusterThreads - 1) / kClusterThreads;
    auto* kernel = per <= 1   ? rms_norm_cluster_kernel<1, kAdd, kA>
                   : per <= 2 ? rms_norm_cluster_kernel<2, kAdd, kA>
                              : rms_norm_cluster_kernel<kClusterMaxPer, kAdd, kA>;
    CUDA_CHECK(ops::launch_in_clusters(kernel, dim3(kClusterCtas, 1, 1), dim3(kClusterCtas, unsigned(n_rows)),
                                       kClusterThreads, 0, stream, x, x_out, residual, w, y, int(n_cols), eps, yq,
                                       yq_row_bytes));
    return;
  }
  const size_t smem = kA == Act::kNone ? 0 : stage_bytes(n_cols);
  if (n_cols <= kWarpRowMax) {
    constexpr int kRows = kThreads / ops::kWarpSize;
    const unsigned grid = unsigned((n_rows + kRows - 1) / kRows);
    CUDA_CHECK(ops::launch(rms_norm_kernel<ops::kWarpSize, kWarpRowMax / ops::kWarpSize, kAdd, kA>, grid, kThreads,
                           smem, stream, x, x_out, residual, w, y, int(n_rows), int(n_cols), eps, yq, yq_row_bytes));
    return;
  }
  auto* kernel = n_cols <= 2 * kRowCta   ? rms_norm_kernel<kRowCta, 2, kAdd, kA>
                 : n_cols <= 4 * kRowCta ? rms_norm_kernel<kRowCta, 4, kAdd, kA>
                                         : rms_norm_kernel<kRowCta, 8, kAdd, kA>;  // longer rows loop over the rest
  CUDA_CHECK(ops::launch(kernel, unsigned(n_rows), kRowCta, smem, stream, x, x_out, residual, w, y, int(n_rows),
                         int(n_cols), eps, yq, yq_row_bytes));
}

Status check_shape(const char* op, int64_t n_rows, int64_t n_cols) {
  if (n_rows < 1 || n_cols < 1 || n_rows > INT_MAX || n_cols > INT_MAX) {
    return Status::error(format("%s: n_rows=%lld, n_cols=%lld: each must be in 1..%d", op, (long long)n_rows,
                                (long long)n_cols, INT_MAX));
  }
  return Status();
}

}  // namespace

bool can_quantize_norm(quant::Type y_type, int64_t n_cols) {
  return detail::is_activation_format(y_type) && n_cols >= 1 && n_cols % q8::block_elems(q8::act_of(y_type)) == 0 &&
         n_cols <= kMaxNormQuantizeCols;
}

bool norm_in_cluster(quant::Type y_type, int64_t n_rows, int64_t n_cols) {
  return (y_type == quant::Type::F32 || can_quantize_norm(y_type, n_cols)) &&
         cluster_rows(n_rows, n_cols, q8::act_of(y_type));
}

Status rms_norm(const RmsNormArgs& a, Stream& stream) {
  MAGNETAR_RETURN_IF_ERROR(check_shape("rms_norm", a.n_rows, a.n_cols));
  if (a.x == nullptr || a.weight == nullptr || a.y == nullptr) return Status::error("rms_norm: null device pointer");
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.weight, 4) || !ops::aligned(a.y, 4)) {
    return Status::error("rms_norm: x, weight and y must be 4-byte aligned");
  }
  launch<false, Act::kNone>(a.x, nullptr, Residual{}, a.weight, a.y, a.n_rows, a.n_cols, a.eps, nullptr, 0, stream.raw());
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
  if (a.x_out != nullptr && (!ops::aligned(a.x_out, 4) || a.x_out == a.x || a.x_out == a.residual || a.x_out == a.y)) {
    return Status::error("add_rms_norm: x_out must be 4-byte aligned and not alias x, residual or y");
  }
  if ((a.residual_rows == nullptr) != (a.residual_weights == nullptr) ||
      (a.residual_rows != nullptr &&
       (a.residual_k < 1 || a.residual_k > kMaxCombineK || a.n_rows * a.residual_k > INT_MAX))) {
    return Status::error(format("add_rms_norm: residual_rows and residual_weights go together, with residual_k=%lld "
                                "in 1..%d", (long long)a.residual_k, kMaxCombineK));
  }
  const Residual res{a.residual, a.residual_rows, a.residual_weights, int(a.residual_k)};
  auto* yq = static_cast<uint8_t*>(a.y_quantized);
  float* x_out = a.x_out != nullptr ? a.x_out : a.x;
  if (yq == nullptr) {
    launch<true, Act::kNone>(a.x, x_out, res, a.weight, a.y, a.n_rows, a.n_cols, a.eps, nullptr, 0, stream.raw());
    return Status();
  }
  if (!can_quantize_norm(a.y_type, a.n_cols)) {
    return Status::error(format("add_rms_norm: y_type (id %d) with n_cols=%lld cannot be quantized here (Q8_0, Q8_1 "
                                "or Q8_K, n_cols a multiple of the block and at most %lld)",
                                int(a.y_type), (long long)a.n_cols, (long long)kMaxNormQuantizeCols));
  }
  if (!ops::aligned(yq, 4)) return Status::error("add_rms_norm: y_quantized must be 4-byte aligned");
  const size_t row_bytes = detail::act_row_bytes(a.y_type, a.n_cols);
  switch (a.y_type) {
    case quant::Type::Q8_0:
      launch<true, Act::kQ8_0>(a.x, x_out, res, a.weight, a.y, a.n_rows, a.n_cols, a.eps, yq, row_bytes,
                               stream.raw());
      break;
    case quant::Type::Q8_1:
      launch<true, Act::kQ8_1>(a.x, x_out, res, a.weight, a.y, a.n_rows, a.n_cols, a.eps, yq, row_bytes,
                               stream.raw());
      break;
    default:
      launch<true, Act::kQ8_K>(a.x, x_out, res, a.weight, a.y, a.n_rows, a.n_cols, a.eps, yq, row_bytes,
                               stream.raw());
      break;
  }
  return Status();
}

}  // namespace magnetar::cuda
