// Quantized matrix-vector product for decode: y[v] = W x[v], W [rows, cols] in a quantized weight type,
// x[v] already quantized to the type's activation format (quantize_q8.cu), v < n_vectors <= 8.
//
// Performance design (counts first, then what the H200 measured):
//   Per row of n elements the kernel reads n * bpw / 8 weight bytes (bpw: 4.5 for Q4_0/IQ4_NL/Q4_K/IQ4_XS,
//   4.25 MXFP4, 5 Q4_1, 5.5 Q5_0/Q5_K, 6 Q5_1, 6.56 Q6_K, 8.5 Q8_0, 2.625 Q2_K, 3.44 Q3_K) and does 2n
//   flops of multiply-add as n / 4 dp4a plus the unpacking. The activation (~1.1 n bytes per vector) is
//   shared by every row and is served from L1/L2. So a 4096 x 4096 Q4_0 matrix is 9.4 MB of weights and
//   33.5 Mflop: ~3.6 flop per weight byte, far below the H200's ridge point; the floor is the HBM3e stream
//   at ~4.8 TB/s (2 us for that matrix), so the kernel is written to keep memory busy, not the ALUs:
//   - one row per warp, or 2 / 4 warps per row when a row has enough work (128-thread CTAs, 4 / 2 / 1 rows
//     per CTA); enough warps in flight per SM to cover HBM latency on a 4096-row matrix;
//   - consecutive threads take consecutive parts of a block and consecutive blocks (MmvqType<T>::kParts
//     parts per block), so a warp's loads cover one contiguous stretch of the row: every 32-byte sector
//     fetched from HBM is used whole;
//   - weight loads are as wide as the block alignment allows (16-byte for Q4_K/Q5_K, whose blocks are
//     multiples of 16 bytes; 2- or 4-byte for the 18/20/22/34-byte blocks, where wider loads would straddle
//     blocks); the integer dots are __dp4a on int8x4 words;
//   - per-thread float partial sums, then a warp-shuffle reduction, then (several warps per row) one pass
//     through shared memory; no atomics, so results are deterministic run to run.
//   Measured on the H200 (bench/cuda/mmvq_bench.cpp, 2026-11-30, median of 3, weights streamed from HBM,
//   per matvec including activation quantization; F32 uses matvec_float.cu, same work split):
//     4096x4096, 1 vector   Q4_0 8.7 us (1.08 TB/s, 22% of 4.8 TB/s)  Q4_K 7.9 us (25%)  Q6_K 10.7 us (27%)
//                           Q8_0 10.8 us (34%)  Q2_K 7.5 us (15%)  MXFP4 11.3 us (16%)  F32 17.4 us (80%)
//     pre-quantized x (MatvecArgs::x_quantized) saves only 1.2-1.8 us; 4 vectors take 2.5-3x one vector.
//   So this first version is NOT bandwidth-bound. Not profiled yet; the likely causes (estimates, not
//   counter readings) are instruction issue and latency: narrow 2-byte loads for the 18/22/34-byte blocks,
//   an estimated 60-80 instructions per 16 elements with index math and per-part scale conversions,
//   __vsub4 (emulated on sm_90), short-lived CTAs; and with n_vectors > 1 the weight unpacking is repeated
//   per vector. Next steps, each to be measured (ncu works on these machines): a whole block per thread
//   with 16-byte loads staged through shared memory, activation sums instead of __vsub4 for the offsets,
//   unpacking once for all vectors, a persistent grid. Since then decode's single-vector products take the kernels
//   below that: the rows kernel, the activation-stationary kernel (Q4_K, Q6_K) and the staged kernel (Q8_0)
//   (docs/benchmarks/2026-12-01-cuda-decode-stationary-mmvq.md).
#include <cuda_runtime.h>

#include <type_traits>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/grouping.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/mmvq.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"
#include "backends/cuda/route_topk.cuh"

namespace magnetar::cuda::detail {
namespace {

using ops::kWarpSize;
using ops::warp_sum;
using quant::Type;

constexpr int kThreads = 128;  // per CTA: 4 warps
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kRouteLogitsPerLane = kMaxRoutedExperts / kWarpSize;  // GroupedMatvecArgs::route's ranking warp
static_assert(kMaxRoutedK <= kWarpSize, "the ranking warp's lane j keeps slot j");
constexpr int kUnrollItems = 2;  // 2 and 4 (with 1, 2 warps per row) measured alike, see warps_per_row

// Grid: ceil(rows / (kWarps / warps_per_row)) CTAs of kThreads. warps_per_row is 1, 2 or 4.
// kMaxVectors is 1 (the common decode case, no per-vector loop overhead) or kMaxMatvecVectors.
// Grouped launches (MoE, launch.h's Grouping): blockIdx.y picks an item, blockIdx.z one of its n_parts
// weights; a CTA whose weight pointer is null ("not on this device") returns without writing.
template <Type T, int kMaxVectors>
__global__ void __launch_bounds__(kThreads)
    mmvq_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int blocks_per_row,
                const uint8_t* __restrict__ act, size_t act_row_bytes, float* __restrict__ y, int n_vectors,
                int warps_per_row, Grouping g) {
  using Ops = mmvq::MmvqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  matvec_prologue(g, weights, row_bytes, int(blockIdx.x) * (kWarps / warps_per_row), kWarps / warps_per_row, rows);
  int row0;
  if (!resolve_group(g, weights, row0, n_vectors, y)) return;  // uniform over the CTA
  const Act* a_v[kMaxVectors];
#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) {
    a_v[v] = reinterpret_cast<const Act*>(act + group_act_row(g, row0 + (v < n_vectors ? v : 0)) * act_row_bytes);
  }
  y += size_t(row0) * size_t(rows);
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int rows_per_cta = kWarps / warps_per_row;
  const int row = int(blockIdx.x) * rows_per_cta + warp / warps_per_row;
  const int t = (warp % warps_per_row) * kWarpSize + lane;  // this thread's index among the row's threads
  const int stride = warps_per_row * kWarpSize;

  float acc[kMaxVectors];
#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) acc[v] = 0.0f;

  if (row < rows) {
    const Block* w = reinterpret_cast<const Block*>(weights + size_t(row) * row_bytes);
    const int items = blocks_per_row * Ops::kParts;
#pragma unroll kUnrollItems
    for (int it = t; it < items; it += stride) {
      const int b = it / Ops::kParts;  // kParts is a power of two: a shift and a mask
      const int part = it % Ops::kParts;
#pragma unroll
      for (int v = 0; v < kMaxVectors; ++v) {
        if (v < n_vectors) acc[v] += Ops::dot(w[b], a_v[v][b], part);
      }
    }
  }

#pragma unroll
  for (int v = 0; v < kMaxVectors; ++v) acc[v] = warp_sum(acc[v]);

  if (warps_per_row == 1) {  // uniform over the CTA: the early exit cannot split a __syncthreads
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

// The rows kernel (MatvecLaunch::rows_per_warp; one vector, the types of launch.h's mmvq_has_rows_kernel).
// ncu of the single-row kernel on a decode token's expert down projection (H200, 2026-11-30: 8 x 2048 rows x 768
// Q4_K columns, 10.5 us, 676 GB/s) showed issue slots 56% busy and ~270 warp-instructions per row of 384 weight
// bytes. Here a warp takes kRows consecutive rows, and their kRows * items parts are dealt to the lanes in order
// (part f of the warp is row f / items, item f % items): one row per warp (kRows 1) for rows of at least 32 items
// (2,048 Q4_K columns are 64: two 16-byte parts per lane), 4 rows for shorter ones so that no lane idles (the
// expert down projection's 768 columns are 24 items: with one row per warp 8 lanes had nothing to do; 4 rows
// are 96, three per lane). A lane adds its parts into its row's sum (a select per row), then the warp tree per row.
// Measured (run.sh --decode-bench, H200, 2026-11-30, docs/benchmarks/2026-11-30-cuda-decode-pdl.md): tg128 315.0 t/s
// against 290.0 with the default kernel (MAGNETAR_CUDA_MMVQ_ROWS=0); asking 2 or 4 rows per warp for the long rows
// too was slower (306.6 and 284.6 against 315.4). Two parts per step for one row per warp (the second's loads in
// flight with the first's) changed nothing (315.4, gate/up 10.1 us in ncu either way) and was left out.
// Grid: ceil(rows / (kWarps * kRows)) x items x parts CTAs of kThreads.
template <Type T, int kRows>
__global__ void __launch_bounds__(kThreads)
    mmvq_rows_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int blocks_per_row,
                     const uint8_t* __restrict__ act, size_t act_row_bytes, float* __restrict__ y, Grouping g) {
  using Ops = mmvq::MmvqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  matvec_prologue(g, weights, row_bytes, int(blockIdx.x) * kWarps * kRows, kWarps * kRows, rows);
  int row0;
  int n_vectors = 1;
  if (!resolve_group(g, weights, row0, n_vectors, y)) return;  // uniform over the CTA
  const Act* a = reinterpret_cast<const Act*>(act + group_act_row(g, row0) * act_row_bytes);
  y += size_t(row0) * size_t(rows);
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int first = (int(blockIdx.x) * kWarps + warp) * kRows;
  if (first >= rows) return;  // whole warps: no barrier below
  const int items = blocks_per_row * Ops::kParts;
  const int n_rows = rows - first < kRows ? rows - first : kRows;
  const uint8_t* w0 = weights + size_t(first) * row_bytes;

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  // Part f = lane + 32 j of the warp: row r, item it of that row, tracked without a division per step.
  int r = 0, it = lane;
  while (kRows > 1 && it >= items) {
    it -= items;
    ++r;
  }
#pragma unroll 2
  for (; r < n_rows;) {
    const int b = it / Ops::kParts;
    const int part = it % Ops::kParts;
    const Block* w = reinterpret_cast<const Block*>(w0 + size_t(r) * row_bytes);
    const float v = Ops::dot(w[b], a[b], part);
    if constexpr (kRows == 1) {
      acc[0] += v;
    } else {
#pragma unroll
      for (int k = 0; k < kRows; ++k) acc[k] += k == r ? v : 0.0f;
    }
    it += kWarpSize;
    while (it >= items) {
      it -= items;
      ++r;
      if (kRows == 1) break;
    }
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const float sum = warp_sum(acc[k]);
    if (lane == 0 && k < n_rows) y[first + k] = sum;
  }
}

// The activation-stationary kernel (MatvecLaunch::stationary; one vector; types whose MmvqType has ActPart,
// WeightPart, load_part and dot_loaded: Q4_K, Q6_K). ncu of the rows kernel on the decode products (H200, 2026-12-01,
// run.sh --ncu-kernel): ~340 warp-instructions per 2,048-column Q4_K row of 1,152 weight bytes, issue slots 50-63%
// busy at 1.3 TB/s for the experts' gate/up; a lane's two parts each loaded 8 activation words, 2 block sums and a
// scale next to its 32 weight bytes, for every row. Here the parts of a group of kQ consecutive rows tile the warp's
// lanes exactly (kQ * items = 32 kJ, items = parts per row): lane l takes the kJ parts f = l + 32 j of the group,
// row f / items, item f % items, the same for every group. So a lane loads its kJ activation parts once, into
// registers, and for each of its kR groups issues all kJ weight loads (the block's 16-byte head and 16 quant bytes)
// before it uses any; the warp's kQ kR row sums are then reduced together: each shuffle stage halves the values a
// lane holds (ops::warp_sums: kQ kR - 1 + 5 - log2(kQ kR) shuffles instead of 5 per row).
// Grid: ceil(rows / (kWarps kQ kR)) x items x parts CTAs of kThreads.
// kGlu (a grouped gate/up launch, MatvecLaunch::swiglu): each warp takes its rows of both the gate (item weight
// g.part) and the up matrix (g.part + 1), reduces the 2 kQ kR sums together (gate sums in lanes 0-15, the same rows'
// up sums in lanes 16-31) and writes y = silu(gate) * up (ops::silu_mul, swiglu.cu's expression): the SwiGLU launch
// between gate/up and down is gone. act_float (MatvecLaunch::act_float, Q8_K activations): act holds float rows; the
// CTA quantizes its row into shared memory first (a warp per 256-element block, q8::block_q8_k_lane8: the bytes of
// quantize_activations) and reads its parts from there.
// kV > 1 (a plain launch of n_vec <= kV vectors: the decode of several sessions at once): the weights are loaded once,
// and each vector's parts in turn are loaded and dotted with them into its own sums, in the single vector's order; the
// warp reduces all kV kQ kR sums together. Each vector's outputs are the bits a launch of it alone gives.
template <Type T, int kJ, int kQ, int kR, bool kGlu, int kV>
__global__ void __launch_bounds__(kThreads)
    mmvq_stationary_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int items,
                           const uint8_t* __restrict__ act, size_t act_row_bytes, bool act_float, float* __restrict__ y,
                           Grouping g, int n_vec, YSplit split) {
  using Ops = mmvq::MmvqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  constexpr int kM = kGlu ? 2 : 1;  // weight matrices per row: gate and up, or one
  constexpr int kRowsPerWarp = kQ * kR;
  static_assert(kV == 1 || !kGlu, "several vectors: plain launches only");
  // The weights are loaded before waiting for the kernel before this one where they are known by then: always for a
  // plain launch, for a grouped one when its items are settled (ops_common.cuh's rule); otherwise after.
  const bool weights_early = (g.items == nullptr && g.route.logits == nullptr) || g.items_settled;
  if (!weights_early) {
    ops::pdl_wait();
    ops::pdl_trigger();
  }
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  int row0;
  int n_vectors = 1;
  const uint8_t* mat[kM] = {};
  // GroupedMatvecArgs::route: warp 0 ranks the logits and the CTA takes the expert of rank `slot`; slots run in
  // reverse over blockIdx.y, so that the CTAs launched last (gate/up takes two waves) need the fewest rounds. Warp 0
  // of CTA (0, 0) (the last slot: it ranks all k) writes the combine's ids and weights below.
  const int slot = g.route.k - 1 - int(blockIdx.y);
  const bool route_writer = g.route.ids != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && warp == 0;
  int route_lane_id = 0;  // route_writer: lane j's expert, of rank j
  if (g.route.logits != nullptr) {
    __shared__ int expert_s;
    if (warp == 0) {
      const auto logits = route::warp_logits<kRouteLogitsPerLane>(g.route.logits, g.route.n_expert, lane);
      const int e = route::warp_top(logits, g.route.n_expert, slot + 1, lane, &route_lane_id);
      if (lane == 0) expert_s = e;
    }
    __syncthreads();
    const uint8_t* expert = static_cast<const uint8_t*>(g.route.base) + size_t(expert_s) * g.route.stride;
#pragma unroll
    for (int m = 0; m < kM; ++m) mat[m] = expert + g.route.offset[g.part + m];
    row0 = slot;
  } else {
    if (!resolve_group(g, weights, row0, n_vectors, y)) {  // uniform over the CTA
      ops::pdl_wait();  // every CTA waits before it exits (ops_common.cuh)
      return;
    }
    mat[0] = weights;
    if constexpr (kGlu) mat[1] = static_cast<const uint8_t*>(g.items[blockIdx.y].w[g.part + 1]);
  }
  const int first = (int(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  const auto lp = mmvq::lane_parts<kJ, Ops::kParts>(lane, items);
  const int(&row_of)[kJ] = lp.row_of;  // the part's row within a group
  const int(&block)[kJ] = lp.block;    // the part's block within its row
  const int(&part)[kJ] = lp.part;
  typename Ops::WeightPart w[kM][kR][kJ];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        // Rows past the end (and a whole warp's past the last row) load the last row and write nothing.
        const int row = min(first + r * kQ + row_of[j], rows - 1);
        const Block* blocks = reinterpret_cast<const Block*>(mat[m] + size_t(row) * row_bytes);
        w[m][r][j] = Ops::load_part(blocks[block[j]], part[j]);
      }
    }
  }
  if (weights_early) {
    ops::pdl_wait();
    ops::pdl_trigger();
  }
  if (route_writer) {  // after the wait (the launch before may still read these) and after its own weight loads
    route::write_routes<kRouteLogitsPerLane>(g.route, lane, route_lane_id);
  }
  const Act* a;
  if (act_float) {  // uniform over the CTA
    static_assert(std::is_same_v<Act, quant::BlockQ8_K>, "act_float quantizes to Q8_K");
    extern __shared__ quant::BlockQ8_K staged_act[];
    const float* src = reinterpret_cast<const float*>(act + group_act_row(g, row0) * act_row_bytes);
    q8::row_q8_k_warps(src, staged_act, items / Ops::kParts, warp, kWarps, lane);
    __syncthreads();
    a = staged_act;
  } else {
    a = reinterpret_cast<const Act*>(act + group_act_row(g, row0) * act_row_bytes);
  }
  if (first >= rows) return;  // whole warps, after the barrier
  y += size_t(row0) * size_t(rows);
  constexpr int kPerVector = kM * kRowsPerWarp;
  float acc[kV * kPerVector];
#pragma unroll
  for (int i = 0; i < kV * kPerVector; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int vec = 0; vec < kV; ++vec) {
    if (kV == 1 || vec < n_vec) {  // uniform
      const Act* av = reinterpret_cast<const Act*>(reinterpret_cast<const uint8_t*>(a) + size_t(vec) * act_row_bytes);
      typename Ops::ActPart x[kJ];
#pragma unroll
      for (int j = 0; j < kJ; ++j) x[j] = Ops::act_part(av[block[j]], part[j]);
      float* acc_v = acc + vec * kPerVector;
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const float v = Ops::dot_loaded(w[m][r][j], x[j], part[j]);
            if constexpr (kQ == 1) {
              acc_v[m * kRowsPerWarp + r] += v;
            } else {
#pragma unroll
              for (int q = 0; q < kQ; ++q) acc_v[m * kRowsPerWarp + r * kQ + q] += row_of[j] == q ? v : 0.0f;
            }
          }
        }
      }
    }
  }
  constexpr int kSums = kV * kPerVector;
  const float sum = ops::warp_sums(acc, lane);
  const int index = ops::warp_sums_index<kSums>(lane);  // vector index / kPerVector, row index % kRowsPerWarp
  const int row = first + index % kRowsPerWarp;
  if constexpr (kGlu) {
    const float up = __shfl_xor_sync(0xffffffffu, sum, kWarpSize / 2);  // the first stage split gate from up
    if (lane < kWarpSize / 2 && (lane & (kWarpSize / kSums - 1)) == 0 && row < rows) y[row] = ops::silu_mul(sum, up);
  } else {
    const int vec = kV == 1 ? 0 : index / kPerVector;
    if ((lane & (kWarpSize / kSums - 1)) == 0 && row < rows && (kV == 1 || vec < n_vec)) {
      float* out = y;  // the row's part (YSplit) and its place there
      int at = row, width = rows;
      if (split.y[0] != nullptr) {
        const int p = row < split.at[0] ? 0 : row < split.at[1] ? 1 : 2;
        const int start = p == 0 ? 0 : split.at[p - 1];
        out = p == 0 ? y : split.y[p - 1];
        at = row - start;
        width = (p == 2 ? rows : split.at[p]) - start;
      }
      out[size_t(vec) * size_t(width) + at] = sum;
    }
  }
}

template <Type T, int kJ, int kQ, bool kGlu>
bool launch_stationary(const MatvecLaunch& a, int items, cudaStream_t stream) {
  constexpr int kR = mmvq::stationary_groups(kJ, kQ, kGlu);
  const int rows_per_cta = kWarps * kQ * kR;
  const bool group = grouped(a.group);
  const dim3 grid(unsigned((a.rows + rows_per_cta - 1) / rows_per_cta), unsigned(group ? a.group.n_items : 1),
                  unsigned(group && !kGlu ? a.group.n_parts : 1));
  const size_t smem = a.act_float ? size_t(items / mmvq::MmvqType<T>::kParts) * sizeof(quant::BlockQ8_K) : 0;
  const auto go = [&](auto kernel) {
    CUDA_CHECK(ops::launch(kernel, grid, kThreads, smem, stream, static_cast<const uint8_t*>(a.weights), a.row_bytes,
                           int(a.rows), items, static_cast<const uint8_t*>(a.act), a.act_row_bytes, a.act_float, a.y,
                           a.group, a.n_vectors, a.split));
    return true;
  };
  if (a.n_vectors == 1) return go(mmvq_stationary_kernel<T, kJ, kQ, kR, kGlu, 1>);
  // Several vectors (plain launches): 4 or 8 at a time where the warp's sums fit its 32 lanes (Q6_K: 8 only, 14 kernels
  // fewer for make test to compile; the same bits per vector).
  constexpr int kRowsPerWarp = kQ * kR;
  if constexpr (!kGlu && T != Type::Q6_K && 4 * kRowsPerWarp <= kWarpSize) {
    if (!group && !a.act_float && a.n_vectors <= 4) return go(mmvq_stationary_kernel<T, kJ, kQ, kR, false, 4>);
  }
  if constexpr (!kGlu && 8 * kRowsPerWarp <= kWarpSize) {
    if (!group && !a.act_float && a.n_vectors <= 8) return go(mmvq_stationary_kernel<T, kJ, kQ, kR, false, 8>);
  }
  return false;
}

// Launches the stationary kernel when the row fits it; false otherwise.
template <Type T, bool kGlu>
bool try_stationary(const MatvecLaunch& a, int blocks_per_row, cudaStream_t stream) {
  const int items = blocks_per_row * mmvq::MmvqType<T>::kParts;
  const mmvq::StationaryShape s = mmvq::stationary_shape(items);
  switch (s.kQ * 16 + s.kJ) {
    case 16 + 1: return launch_stationary<T, 1, 1, kGlu>(a, items, stream);
    case 16 + 2: return launch_stationary<T, 2, 1, kGlu>(a, items, stream);
    case 16 + 3: return launch_stationary<T, 3, 1, kGlu>(a, items, stream);
    case 16 + 4: return launch_stationary<T, 4, 1, kGlu>(a, items, stream);
    case 16 + 5: return launch_stationary<T, 5, 1, kGlu>(a, items, stream);
    case 16 + 6: return launch_stationary<T, 6, 1, kGlu>(a, items, stream);
    case 16 + 7: return launch_stationary<T, 7, 1, kGlu>(a, items, stream);
    case 16 + 8: return launch_stationary<T, 8, 1, kGlu>(a, items, stream);
    case 32 + 1: return launch_stationary<T, 1, 2, kGlu>(a, items, stream);
    case 32 + 3: return launch_stationary<T, 3, 2, kGlu>(a, items, stream);
    case 32 + 5: return launch_stationary<T, 5, 2, kGlu>(a, items, stream);
    case 32 + 7: return launch_stationary<T, 7, 2, kGlu>(a, items, stream);
    case 64 + 1: return launch_stationary<T, 1, 4, kGlu>(a, items, stream);
    case 64 + 3: return launch_stationary<T, 3, 4, kGlu>(a, items, stream);
    case 64 + 5: return launch_stationary<T, 5, 4, kGlu>(a, items, stream);
    case 64 + 7: return launch_stationary<T, 7, 4, kGlu>(a, items, stream);
    default: return false;
  }
}

// The staged kernel (MatvecLaunch::staged; one vector, a plain launch; Q8_0 rows of a multiple of 256 columns, whose
// length is a multiple of 16 bytes). Q8_0's 34-byte blocks allow only 2-byte loads from global memory: the decode
// LM head (151,936 x 2,048, 331 MB) streamed at 2.5 TB/s in the rows kernel (H200 kernel trace, 2026-12-01). Here each
// warp copies its rows into shared memory with 16-byte cp.async loads, then takes the rows kernel's one-row loop with
// the blocks read from shared memory. The grid is one wave (the CTAs the GPU holds at once, launch_staged) and each
// warp takes rows row0, row0 + stride, ... (stride = the grid's warps) through kStagedBuffers row buffers: the copies
// of its next kStagedBuffers - 1 rows are in flight while it computes one, so that the memory system never waits for
// a CTA to end and the next to start (the first version's CTA per 4 rows: 2.9 TB/s on the LM head, 115.8 us per
// token). The first rows' copies are issued before waiting for the kernel before (a plain launch's weights are no
// kernel's output). That alone took the LM head to 121.4 us (H200, 2026-12-01): the loop's 2-byte loads of the staged
// weights and of the activation (16 per 16-value item) held it. kIpl > 0 (Q8_0 rows of 512 kIpl columns): lane l
// always takes the items l + 32 j (j < kIpl) of a row, so it loads its activation items once, into registers, and
// reads each weight item as 4 or 5 aligned 32-bit words of the staged row (its quants start 2 bytes into a word in
// the blocks of even index: a byte permute joins two words) and its scale as one 2-byte load. Per row the same items,
// products and sum as the rows kernel: the same bits.
constexpr int kStagedBuffers = 3;
constexpr size_t kMaxStagedRowBytes = 12 * 1024;  // 144 KiB of shared memory per CTA
constexpr int kMaxStagedIpl = 8;                  // 4,096 columns
// kV > 1 (kIpl > 0: a plain launch of n_vec <= kV vectors, the LM head of several sessions' decode): each staged row
// is dotted with every vector's items (kV kIpl items in registers), the weight words loaded once per item; each
// vector's sum is the single vector's (same items, expression, order and warp tree): the bits of a launch of it alone.
template <Type T, int kIpl, int kV>
__global__ void __launch_bounds__(kThreads)
    mmvq_staged_kernel(const uint8_t* __restrict__ weights, size_t row_bytes, int rows, int blocks_per_row,
                       const uint8_t* __restrict__ act, size_t act_row_bytes, int n_vec, float* __restrict__ y) {
  static_assert(kV == 1 || kIpl > 0, "several vectors: the word-load loop only");
  using Ops = mmvq::MmvqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  extern __shared__ int4 staged_rows[];  // [kWarps][kStagedBuffers][units]
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int stride = int(gridDim.x) * kWarps;
  const int row0 = int(blockIdx.x) * kWarps + warp;
  const int units = int(row_bytes / 16);
  int4* mine = staged_rows + size_t(warp) * kStagedBuffers * size_t(units);
  // Copy i (row row0 + i * stride) into buffer i % kStagedBuffers; one commit group per copy, empty past the last row.
  auto issue = [&](int i) {
    const int64_t row = int64_t(row0) + int64_t(i) * stride;
    if (row < rows) {
      const int4* src = reinterpret_cast<const int4*>(weights + size_t(row) * row_bytes);
      int4* dst = mine + (i % kStagedBuffers) * units;
      for (int u = lane; u < units; u += kWarpSize) cp_async16(dst + u, src + u, 16);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStagedBuffers - 1; ++i) issue(i);
  ops::pdl_wait();
  ops::pdl_trigger();
  const Act* a = reinterpret_cast<const Act*>(act);
  const int items = blocks_per_row * Ops::kParts;
  static_assert(kIpl == 0 || T == Type::Q8_0, "the word loads are Q8_0's");
  // kIpl: the lane's activation items (item lane + 32 j) of each vector.
  [[maybe_unused]] int xq[kV][kIpl > 0 ? kIpl : 1][4];
  [[maybe_unused]] float xd[kV][kIpl > 0 ? kIpl : 1];
  if constexpr (kIpl > 0) {
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const Act* av = reinterpret_cast<const Act*>(act + size_t(kV == 1 || v < n_vec ? v : 0) * act_row_bytes);
#pragma unroll
      for (int j = 0; j < kIpl; ++j) {
        const int it = lane + kWarpSize * j;
        const Act& ab = av[it / 2];
#pragma unroll
        for (int k = 0; k < 4; ++k) xq[v][j][k] = mmvq::load_a2(mmvq::bytes(ab.qs) + 16 * (it % 2) + 4 * k);
        xd[v][j] = mmvq::fp16_to_float(ab.d);
      }
    }
  }
  int i = 0;
  for (int64_t row = row0; row < rows; ++i, row += stride) {  // whole warps: no barrier below
    issue(i + kStagedBuffers - 1);  // into the buffer computed last iteration (__syncwarp below)
    cp_async_wait_group<kStagedBuffers - 1>();
    __syncwarp();  // every lane's copies of row i have landed
    const Block* w = reinterpret_cast<const Block*>(mine + (i % kStagedBuffers) * units);
    float acc[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = 0.0f;
    if constexpr (kIpl > 0) {
      const uint8_t* rb = reinterpret_cast<const uint8_t*>(w);
      // Item it = lane + 32 j: block b = it / 2 (b's parity is the lane's: 16 j is even), quants 16 (it % 2) bytes
      // into the block's 32, i.e. at byte 34 b + 2 + 16 (it % 2) of the row: word-aligned for odd b, else 2 past.
      const bool straddles = (lane / 2) % 2 == 0;
#pragma unroll
      for (int j = 0; j < kIpl; ++j) {
        const int it = lane + kWarpSize * j;
        const int start = 34 * (it / 2) + 2 + 16 * (it % 2);
        const uint32_t* words = reinterpret_cast<const uint32_t*>(rb + (start & ~3));
        uint32_t wd[5];
#pragma unroll
        for (int k = 0; k < 4; ++k) wd[k] = words[k];
        wd[4] = straddles ? words[4] : 0u;
        uint32_t q[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) q[k] = straddles ? __byte_perm(wd[k], wd[k + 1], 0x5432) : wd[k];
        const float dw = mmvq::fp16_to_float(*reinterpret_cast<const uint16_t*>(rb + 34 * (it / 2)));
#pragma unroll
        for (int v = 0; v < kV; ++v) {
          int sumi = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) sumi = mmvq::dp4a(int(q[k]), xq[v][j][k], sumi);
          acc[v] += float(sumi) * (dw * xd[v][j]);  // MmvqType<Q8_0>::dot's expression
        }
      }
    } else {
#pragma unroll 2
      for (int it = lane; it < items; it += kWarpSize) {
        acc[0] += Ops::dot(w[it / Ops::kParts], a[it / Ops::kParts], it % Ops::kParts);
      }
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const float sum = warp_sum(acc[v]);
      if (lane == 0 && (kV == 1 || v < n_vec)) y[size_t(v) * size_t(rows) + size_t(row)] = sum;
    }
    __syncwarp();  // every lane is done with the buffer before the next issue refills it
  }
  cp_async_wait_all();  // nothing lands after the CTA has left
}

// Launches the staged kernel over one wave: the CTAs the GPU holds at once with its shared memory, at most one per
// kWarps rows. The wave (after the kernel's shared-memory opt-in, a host-side attribute write) is worked out once per
// thread, device and row size: outside a graph (tiered decode) the LM head launches every token.
template <Type T, int kIpl, int kV = 1>
void launch_staged(const MatvecLaunch& a, int blocks_per_row, cudaStream_t stream) {
  const auto kernel = mmvq_staged_kernel<T, kIpl, kV>;
  const size_t smem = size_t(kWarps) * kStagedBuffers * a.row_bytes;
  thread_local struct {
    int device = -1;
    size_t smem = 0;
    int64_t wave = 0;
  } last;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (last.device != device || last.smem != smem) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int sms = 0, per_sm = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    last = {device, smem, int64_t(std::max(sms, 1)) * std::max(per_sm, 1)};
  }
  const int64_t wave = last.wave;
  const unsigned grid = unsigned(std::min<int64_t>(wave, (a.rows + kWarps - 1) / kWarps));
  // kV vectors per launch: a second launch (reading the weights again) takes vectors kV .. n_vectors - 1.
  for (int v0 = 0; v0 < a.n_vectors; v0 += kV) {
    const uint8_t* act = static_cast<const uint8_t*>(a.act) + size_t(v0) * a.act_row_bytes;
    CUDA_CHECK(ops::launch(kernel, grid, kThreads, smem, stream, static_cast<const uint8_t*>(a.weights), a.row_bytes,
                           int(a.rows), blocks_per_row, act, a.act_row_bytes, std::min(kV, a.n_vectors - v0),
                           a.y + size_t(v0) * size_t(a.rows)));
  }
}

// Warps per row: 4 when the row has at least one item per thread of the CTA, fewer for short rows so that
// threads are not left idle. Measured on the H200 (bench/cuda/mmvq_bench.cpp, 2026-11-30, v1, Q4_0 Q4_1
// Q8_0 Q2_K Q4_K Q6_K IQ4_XS at 4096x4096 and 2048x7168): forcing 2 warps per row (unroll 4) was within
// +-5% of this; 1 warp per row (unroll 4 or 8) was as fast at 4096 rows and up to 25% slower at 2048 rows.
int warps_per_row(int64_t items_per_row) {
  if (items_per_row >= 4 * kWarpSize) return 4;
  if (items_per_row >= 2 * kWarpSize) return 2;
  return 1;
}

template <Type T, int kRows>
void launch_rows(const MatvecLaunch& a, int blocks_per_row, cudaStream_t stream) {
  const int rows_per_cta = kWarps * kRows;
  const dim3 grid(unsigned((a.rows + rows_per_cta - 1) / rows_per_cta), unsigned(a.group.items ? a.group.n_items : 1),
                  unsigned(a.group.items ? a.group.n_parts : 1));
  CUDA_CHECK(ops::launch(mmvq_rows_kernel<T, kRows>, grid, kThreads, 0, stream, static_cast<const uint8_t*>(a.weights),
                        a.row_bytes, int(a.rows), blocks_per_row, static_cast<const uint8_t*>(a.act), a.act_row_bytes,
                        a.y, a.group));
}

template <Type T>
void launch(const MatvecLaunch& a, cudaStream_t stream) {
  const int blocks_per_row = int(a.row_bytes / sizeof(typename mmvq::MmvqType<T>::Block));
  if (a.split.y[0] != nullptr) {  // a plain launch whose rows go to three outputs (YSplit)
    if constexpr (mmvq_has_stationary_kernel(T)) {
      if (a.stationary && !grouped(a.group) && try_stationary<T, false>(a, blocks_per_row, stream)) return;
    }
    for_each_split_part(a, [&](const MatvecLaunch& part) { launch<T>(part, stream); });  // otherwise
    return;
  }
  if constexpr (mmvq_has_stationary_kernel(T)) {
    // swiglu and act_float exist only there: matvec.cpp checked that the row fits (mmvq_stationary_fits).
    if constexpr (mmvq_has_stationary_glu(T)) {
      if (a.swiglu) {
        if (a.bulk && launch_mmvq_bulk(T, a, stream)) return;
        try_stationary<T, true>(a, blocks_per_row, stream);
        return;
      }
    }
    if (a.bulk && a.act_float && launch_mmvq_bulk(T, a, stream)) return;
    if (a.stationary || a.act_float) {  // several vectors: plain launches of rows that fit (launch_stationary)
      if (try_stationary<T, false>(a, blocks_per_row, stream)) return;
    }
  }
  if constexpr (mmvq_has_staged_kernel(T)) {
    const int items = blocks_per_row * mmvq::MmvqType<T>::kParts;
    const int ipl = T == Type::Q8_0 && items % kWarpSize == 0 && items <= kMaxStagedIpl * kWarpSize ? items / kWarpSize
                                                                                                   : 0;
    // Several vectors: rows of 512-2,048 columns (kIpl 1-4), 4 vectors a launch (kV kIpl <= 16 items in registers).
    if (a.n_vectors > 1 && a.staged && !grouped(a.group) && a.row_bytes % 16 == 0 && ipl > 0 && ipl <= 4) {
      switch (ipl) {
        case 1: launch_staged<T, 1, 4>(a, blocks_per_row, stream); break;
        case 2: launch_staged<T, 2, 4>(a, blocks_per_row, stream); break;
        case 3: launch_staged<T, 3, 4>(a, blocks_per_row, stream); break;
        default: launch_staged<T, 4, 4>(a, blocks_per_row, stream); break;
      }
      return;
    }
    if (a.n_vectors == 1 && a.staged && a.group.items == nullptr && a.row_bytes % 16 == 0) {
      // Rows whose kStagedBuffers copies per warp exceed the GPU's shared memory take the kernels below.
      if (a.row_bytes <= kMaxStagedRowBytes && size_t(kWarps) * kStagedBuffers * a.row_bytes <= ops::smem_optin()) {
        switch (ipl) {
          case 1: launch_staged<T, 1>(a, blocks_per_row, stream); break;
          case 2: launch_staged<T, 2>(a, blocks_per_row, stream); break;
          case 3: launch_staged<T, 3>(a, blocks_per_row, stream); break;
          case 4: launch_staged<T, 4>(a, blocks_per_row, stream); break;
          case 5: launch_staged<T, 5>(a, blocks_per_row, stream); break;
          case 6: launch_staged<T, 6>(a, blocks_per_row, stream); break;
          case 7: launch_staged<T, 7>(a, blocks_per_row, stream); break;
          case 8: launch_staged<T, 8>(a, blocks_per_row, stream); break;
          default: launch_staged<T, 0>(a, blocks_per_row, stream); break;
        }
        return;
      }
    }
  }
  if constexpr (mmvq_has_rows_kernel(T)) {
    if (a.n_vectors == 1 && a.rows_per_warp > 0) {
      // Rows shorter than a warp's lanes take 4 per warp (every lane busy), whatever was asked.
      switch (blocks_per_row * mmvq::MmvqType<T>::kParts < kWarpSize ? 4 : a.rows_per_warp) {
        case 1: launch_rows<T, 1>(a, blocks_per_row, stream); break;
        case 2: launch_rows<T, 2>(a, blocks_per_row, stream); break;
        default: launch_rows<T, 4>(a, blocks_per_row, stream); break;
      }
      return;
    }
  }
  const int wpr = warps_per_row(int64_t(blocks_per_row) * mmvq::MmvqType<T>::kParts);
  const int rows_per_cta = kWarps / wpr;
  const dim3 grid(unsigned((a.rows + rows_per_cta - 1) / rows_per_cta), unsigned(a.group.items ? a.group.n_items : 1),
                  unsigned(a.group.items ? a.group.n_parts : 1));
  const auto* w = static_cast<const uint8_t*>(a.weights);
  const auto* x = static_cast<const uint8_t*>(a.act);
  if (a.n_vectors == 1) {
    CUDA_CHECK(ops::launch(mmvq_kernel<T, 1>, grid, kThreads, 0, stream, w, a.row_bytes, int(a.rows), blocks_per_row, x,
                           a.act_row_bytes, a.y, 1, wpr, a.group));
  } else {
    CUDA_CHECK(ops::launch(mmvq_kernel<T, int(kMaxMatvecVectors)>, grid, kThreads, 0, stream, w, a.row_bytes,
                           int(a.rows), blocks_per_row, x, a.act_row_bytes, a.y, a.n_vectors, wpr, a.group));
  }
}

}  // namespace

bool mmvq_stationary_fits(quant::Type type, int64_t cols) {
  static_assert(mmvq::MmvqType<Type::Q4_K>::kParts == 8 && mmvq::MmvqType<Type::Q6_K>::kParts == 8);
  if (!mmvq_has_stationary_kernel(type) || cols % quant::kQK_K != 0 || cols > 65536) return false;
  return mmvq::stationary_shape(int(cols / quant::kQK_K) * 8).kJ > 0;
}

bool mmvq_supports(quant::Type type) {
  switch (type) {
    case Type::Q4_0:
    case Type::Q4_1:
    case Type::Q5_0:
    case Type::Q5_1:
    case Type::Q8_0:
    case Type::IQ4_NL:
    case Type::MXFP4:
    case Type::Q2_K:
    case Type::Q3_K:
    case Type::Q4_K:
    case Type::Q5_K:
    case Type::Q6_K:
    case Type::IQ4_XS: return true;
    default: return false;
  }
}

bool launch_mmvq(quant::Type type, const MatvecLaunch& args, CUstream_st* stream) {
  switch (type) {
    case Type::Q4_0: launch<Type::Q4_0>(args, stream); return true;
    case Type::Q4_1: launch<Type::Q4_1>(args, stream); return true;
    case Type::Q5_0: launch<Type::Q5_0>(args, stream); return true;
    case Type::Q5_1: launch<Type::Q5_1>(args, stream); return true;
    case Type::Q8_0: launch<Type::Q8_0>(args, stream); return true;
    case Type::IQ4_NL: launch<Type::IQ4_NL>(args, stream); return true;
    case Type::MXFP4: launch<Type::MXFP4>(args, stream); return true;
    case Type::Q2_K: launch<Type::Q2_K>(args, stream); return true;
    case Type::Q3_K: launch<Type::Q3_K>(args, stream); return true;
    case Type::Q4_K: launch<Type::Q4_K>(args, stream); return true;
    case Type::Q5_K: launch<Type::Q5_K>(args, stream); return true;
    case Type::Q6_K: launch<Type::Q6_K>(args, stream); return true;
    case Type::IQ4_XS: launch<Type::IQ4_XS>(args, stream); return true;
    default: return false;
  }
}

}  // namespace magnetar::cuda::detail
