// Quantized matrix-matrix product for prefill on int8 tensor cores: y[r] = W x[r] for many activation rows r,
// W [rows, cols] in a quantized weight type, x already quantized to the type's activation format (Q8_0, Q8_1
// or Q8_K, quantize_q8.cu). The per-type unpacking lives in mmq.cuh (MmqType<T>, ActSlice); this file is the
// tiling, the mma and the host-side argument checks of matmul_q / grouped_matmul_q (cuda_backend.h).
//
// Math. Both operands are cut into slices of kSlice elements (32, or 16 for Q2_K/Q3_K/Q6_K) that share one
// scale: w = scale_w * q_w + offset_w, x = d_x * q_x, so one output is
//   sum over slices of (scale_w * d_x) * isum(q_w, q_x) + offset_w * sum_x,     sum_x = d_x * sum(q_x)
// (mmq.cuh states the exactness of the split). isum is one mma.sync per (16 x 8 tile, slice):
// m16n8k32 for slices of 32, m16n8k16 for slices of 16, s8 x s8 -> s32, started from zero for every slice.
// The 32-element types (compute_step_float) apply the scales in registers per output and slice (the int32 -> float
// conversion by an add (exact_float), the product scale_w * d_x and one FMA, one more FMA with an offset). The
// K-quants (compute_step_int; mmq.cuh's KShape: scale = d * isc, offset = -(dmin * imin)) sum isc * isum over the
// block's slices in int32, take the block's min terms sum(imin * bsum) by two more mma per tile, and scale once per
// output and block: acc += (d_w d_x) * isum - (dmin_w d_x) * minsum. No atomics, a fixed order of every float
// operation: deterministic.
//
// Tiling. A CTA of 256 threads (8 warps) computes kTileX = 64 activation rows x kTileW = 128 weight rows of
// y (MMA's M dimension = activation rows, so a thread's C fragment holds two adjacent weight rows of one
// output row: 4 lanes write 8 consecutive floats). Warps are 2 (x) x 4 (w), each 32 x 32 = 2 x 4 mma tiles; a
// warp whose activation rows end inside its 32 skips the mma and epilogue of its empty m16 tile.
// Per K-step of kStepK = 256 elements (one K-quant block per row):
//   1. every thread unpacks kTileW * kStepK / kSlice / 256 weight slices (4 or 8) and 64 * kStepK / kSlice /
//      256 activation slices (2 or 4) into shared memory, each slice as words from the widest aligned loads
//      (mmq.cuh): int8 quants [row][k] (rows padded to 272 bytes so that the fragment loads are free of bank
//      conflicts: row r starts at bank 4r) and per (row, slice) the scales (float pairs, or the K-quants' integers
//      with per-row block floats);
//   2. __syncthreads; per slice each warp loads its A (x) and B (w) fragments as 32-bit words from shared memory,
//      runs 8 mma, scales or sums the int32 results into its 32 accumulators.
// The unpacking reads the K-step's raw blocks from shared memory, copied there by cp.async during the previous step's
// mma (stage_step, Raw), for every type whose tiles and staging fit two CTAs per SM (all but Q8_0); Q8_0 reads global
// memory, with the next step's blocks prefetched into L1 during the mma (prefetch_step). The K-quants but Q6_K skip
// the activation tile where the rows allow (the direct-X form, Raw's comment): their A fragments are read from the
// staged Q8_K blocks themselves; in that form Q4_K skips its weight tile too (direct-W), and step 1 makes only the
// scales.
// Shared memory (dynamic, opted in): 64 * 272 + 128 * 272 bytes of quants (51 KiB), the scales, 64 row pointers and
// the staging: 96-111 KiB for the staged types, 65 KiB for Q8_0; two CTAs per SM (also the register limit: 128 per
// thread, __launch_bounds__(256, 2)).
// Tails: weight rows >= rows and activation rows >= the tile's count are unpacked as zeros and not written;
// K-steps past cols (legacy types whose cols are not a multiple of 256) are zero slices.
// Grid: x = weight-row tiles (fastest: the CTAs that run together share one activation tile, so x comes
// from L1/L2 and each weight tile is re-read once per 64 activation rows, from L2 when the matrix fits its
// 50 MB); y = activation-row tiles (matmul_q) or items (grouped: a CTA loops over its item's rows in chunks
// of 64, so tiles never straddle items); z = the part (gate, up, down) of a grouped launch. A split matmul_q
// (q | k | v of one matrix) picks each tile's output buffer from its first weight row.
//
// Measured (H200, 30B-A3B geometry Q4_K): docs/benchmarks/2026-12-01-cuda-prefill-mmq.md (word-wide unpacking, the
// add-based conversion, K-steps of 256, the L1 prefetch: the prompt's mmq time 75.8 -> 41.6 ms) and
// docs/benchmarks/2026-12-01-cuda-prefill-int-epilogue.md (the integer epilogue: 41.9 -> 35.8 ms, pp512 +11%; the
// staging: +2.5-3.8%). Still latency-bound (22% occupancy; wait and scoreboard stalls); next levers there.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/mmq.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

using quant::Type;
using detail::cp_async_commit;
using detail::cp_async_wait_all;
using detail::stage_unit;

constexpr int kThreads = 256;
constexpr int kTileX = 64;    // activation rows per CTA tile (mma M)
constexpr int kTileW = int(kMatmulQRowTile);  // weight rows per CTA tile (mma N)
constexpr int kStepK = 256;   // elements per K-step
constexpr int kRowBytes = kStepK + 16;  // padded shared row: bank 4r for row r, conflict-free fragments
constexpr int kWarpsX = 2;    // warp grid 2 x 4, 32 x 32 outputs per warp (1 x 8 warps of 64 x 16, which let a tile
constexpr int kWarpsW = 4;    // skip its empty m16 tiles, measured 30% slower on full tiles: twice the A loads)
constexpr int kWarpX = kTileX / kWarpsX;  // 32: two m16 tiles
constexpr int kWarpW = kTileW / kWarpsW;  // 32: four n8 tiles
constexpr int kMTiles = kWarpX / 16;
constexpr int kNTiles = kWarpW / 8;
static_assert(kWarpsX * kWarpsW * 32 == kThreads);

// One (pointer, shape) view of the work of a launch; grouped launches read their items on the device.
struct MmqParams {
  const uint8_t* weights;  // plain launches
  size_t row_bytes;        // bytes of one weight row
  int rows;
  int cols;
  const uint8_t* x;
  size_t x_row_bytes;
  float* y;
  int n;                   // plain launches: activation rows
  const GroupItem* items;  // grouped launches (null: plain)
  int part;
  const int32_t* x_rows;
  size_t y_part_stride;
  int split[2];            // plain launches: weight rows [0, split[0]) go to y, [split[0], split[1]) to y_split[0],
  float* y_split[2];       // [split[1], rows) to y_split[1], each with its own row pitch (split[0] = rows: no split)
  int prefetch;            // 1: prefetch the next K-step's blocks into L1 during this one's mma (see prefetch_step)
  int direct;              // 1: the direct forms where they apply (launch_type; MAGNETAR_CUDA_MMQ_DIRECT=0: never)
};

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}

__device__ __forceinline__ int lds32(const int8_t* p) { return *reinterpret_cast<const int*>(p); }

__device__ __forceinline__ void prefetch_l1(const uint8_t* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// The blocks of K-step k0 of `rows` rows (row r at row_ptr(r), null: none) into L1: one prefetch per 128-byte line of
// each row's chunk of `chunk` bytes at byte offset `offset`, dealt over the CTA. Issued before the mma of the step
// before it, so the unpacking of the next step finds its blocks in L1 instead of waiting for L2 / HBM with every
// warp of the CTA stalled at the same point (the unpacking is otherwise a latency-bound phase between barriers).
template <typename RowPtr>
__device__ __forceinline__ void prefetch_step(int rows, size_t offset, int chunk, RowPtr row_ptr) {
  const int lines = (chunk + 127) / 128 + 1;  // a chunk not starting on a line boundary spans one more
#pragma unroll 1
  for (int u = int(threadIdx.x); u < rows * lines; u += kThreads) {
    const uint8_t* row = row_ptr(u / lines);
    if (row != nullptr) prefetch_l1(row + offset + min((u % lines) * 128, chunk - 1));
  }
}

// float(c) for |c| < 2^22 by an integer add and a float subtract (full-rate pipes) instead of I2F, which runs at
// 16 results per clock per SM on sm_90, 1/8 of the FMA rate: the biggest single cost of the epilogue, one conversion
// per output and slice. Exact: 1.5 * 2^23 + c is representable for such c. A slice's integer dot is at most
// 32 * 127 * 127 < 2^19 in magnitude (the largest quants: Q8_0 weights; MXFP4's 12 and IQ4_NL's 127 are smaller).
__device__ __forceinline__ float exact_float(int c) { return __int_as_float(c + 0x4B400000) - 12582912.0f; }

// The kSlice / 4 words of slice s into shared memory (16-byte aligned: rows are 272 bytes, slices 16 or 32 bytes).
// The 8 lanes of one 16-byte store phase hold slices s .. s + 7 of one row: slices of 32 bytes would put lanes s and
// s + 4 in the same banks, so slices 4-7 of each 8 store their second half first (conflict-free).
template <int kSlice>
__device__ __forceinline__ void store_slice(int8_t* dst, int s, const uint32_t (&q)[kSlice / 4]) {
  uint4* out = reinterpret_cast<uint4*>(dst);
  if (kSlice == 16) {
    out[0] = make_uint4(q[0], q[1], q[2], q[3]);
  } else if ((s / 4) % 2 == 0) {
    out[0] = make_uint4(q[0], q[1], q[2], q[3]);
    out[1] = make_uint4(q[4], q[5], q[6], q[7]);
  } else {
    out[1] = make_uint4(q[4], q[5], q[6], q[7]);
    out[0] = make_uint4(q[0], q[1], q[2], q[3]);
  }
}

// Per-slice float scales (every type but the K-quants): per row and slice, rows padded to an odd count of float2 so
// that the unpacking threads of one row store consecutive entries and the fragment loads (8 or 4 rows of a slice)
// fall in distinct banks.
template <int kSlices>
struct FloatScales {
  float2 x_ds[kTileX][kSlices + 1];  // (d_x, sum_x): one 8-byte load per fragment row
  float2 w_so[kTileW][kSlices + 1];  // (scale_w, offset_w)
};

// The K-quants' integer form (mmq.cuh, KShape): per weight row the block's (d, dmin), per (row, slice) the integer
// scale, per row the integer mins as bytes (the B operand of the min-term mma); per activation row d_x and the slice
// sums as bytes hi = bsum >> 6 (slices 0 .. kSlices - 1) then lo = bsum & 63 (the A operand).
template <int kSlices>
struct IntScales {
  float2 w_dm[kTileW];
  int8_t w_sc[kTileW][kSlices + 1];  // |isc| <= 128: Q6_K's int8 scales; odd rows: the 4 rows a fragment reads differ
  alignas(16) int8_t w_min[kTileW][kSlices];
  float x_d[kTileX];
  alignas(16) int8_t x_hl[kTileX][2 * kSlices];
};

// The raw K-step of a tile staged by cp.async (stage_step): each row's chunk of blocks (one K-quant block, or 8
// blocks of 32) at its global address's offset modulo 16 within a 16-byte aligned row, so the unpackers' aligned
// loads read shared memory as they would read global memory. A row's 16-byte units: up to 15 bytes of the chunk's
// first line before it, the chunk, a partial last unit.
//
// The direct-X form (kDirect; the K-quants whose buffers fit two CTAs per SM, kDirectX: all but Q6_K; launch_type says
// for which rows): the A fragments are read straight from the staged activation blocks (Q8_K, one per row and K-step):
// no activation tile and no unpacking of its quants (a K-step of 64 Q8_K rows is as many bytes as 128 Q4_K weight rows:
// docs/benchmarks/2026-12-01-cuda-prefill-small-kernels.md); only the block's d and slice sums are unpacked. The staged
// blocks are double-buffered (step k + 1 is copied while step k's fragments are read) and their rows padded to an odd
// count of 16-byte units, so that the 8 rows of a fragment load start in distinct 4-bank groups. A row's quants start
// 4-byte aligned (Q8_K blocks are 292 bytes, their quants at byte 4), so the fragments are 32-bit shared loads.
// Q4_K weights in that form also skip their tile (the direct-W form, kDirectW): a B fragment word is 4 consecutive
// quants of one nibble of the staged block (slice s: the low or high nibbles of bytes 32 (s / 2) ..), masked out at
// the fragment load; the unpacking makes only the scales, and the staged weights are double-buffered as the
// activations (each weight word is masked by the 2 warps that share its rows, where the tile's unpacking did it once
// and stored it, then a barrier later the warps loaded it). Q4_K rows are multiples of 144 bytes and the weights
// 16-byte aligned (matmul_q checks it; grouped items' weights are GGUF tensors or pool slots): the quants are
// 4-byte aligned.
// Same integer sums and epilogue as the tiled form: the same bits. Measured (H200, pp512 +8-9% for direct-X, then
// +9-12% for direct-W): docs/benchmarks/2026-12-02-cuda-prefill-direct-x.md.
template <Type T, bool kDirect>
struct Raw {
  using Ops = mmq::MmqType<T>;
  static constexpr int kWChunk = kStepK / Ops::kBlockElems * int(sizeof(typename Ops::Block));
  static constexpr int kXChunk = kStepK / Ops::kActBlockElems * int(sizeof(typename Ops::Act));
  static constexpr int kWUnits = (15 + kWChunk + 15) / 16;
  static constexpr int kXUnits = (15 + kXChunk + 15) / 16;
  static constexpr int kXRowUnits = kDirect ? (kXUnits | 1) : kXUnits;
  static constexpr int kXBuffers = kDirect ? 2 : 1;
  static constexpr bool kDirectW = kDirect && T == Type::Q4_K;  // the direct-W form (below)
  static constexpr int kWRowUnits = kDirectW ? (kWUnits | 1) : kWUnits;
  static constexpr int kWBuffers = kDirectW ? 2 : 1;
  alignas(16) uint8_t w[kWBuffers][kTileW][16 * kWRowUnits];
  alignas(16) uint8_t x[kXBuffers][kTileX][16 * kXRowUnits];
};

struct NoXTile {};
struct XTile {
  alignas(16) int8_t x[kTileX][kRowBytes];
};
struct NoWTile {};
struct WTile {
  alignas(16) int8_t w[kTileW][kRowBytes];
};

template <Type T, bool kDirect>
struct SmemTiles : std::conditional_t<kDirect, NoXTile, XTile>,
                     std::conditional_t<Raw<T, kDirect>::kDirectW, NoWTile, WTile> {
  using Ops = mmq::MmqType<T>;
  static constexpr int kSlices = kStepK / Ops::kSlice;  // per K-step
  static_assert(kTileW * kSlices % kThreads == 0 && kTileX * kSlices % kThreads == 0);
  static_assert(!Ops::kIntScales || Ops::kBlockElems == kStepK);  // one K-quant block per row and K-step
  std::conditional_t<Ops::kIntScales, IntScales<kSlices>, FloatScales<kSlices>> sc;
  const uint8_t* x_row[kTileX];  // activation row of each tile row (null past the tile's count)
};

// Two CTAs per SM (the register bound of __launch_bounds__(256, 2)) fit in the SM's 228 KiB of shared memory when a
// CTA takes at most 113 KiB (1 KiB per CTA is the driver's). The types whose staged tiles fit stage their K-steps
// by cp.async (96-111 KiB: every K-quant and 32-element type but Q8_0, whose 8 x 34-byte blocks and Q8_0 activations
// make 121 KiB); Q8_0 reads global memory in the unpacking, with the next K-step's blocks prefetched into L1. The
// K-quants whose double-buffered activation blocks fit read their fragments there (all but Q6_K: 117 KiB).
constexpr size_t kTwoCtaSmem = 113 * 1024;
template <Type T>
constexpr bool kDirectX =
    mmq::MmqType<T>::kIntScales && sizeof(SmemTiles<T, true>) + sizeof(Raw<T, true>) <= kTwoCtaSmem;
template <Type T>
constexpr bool kStaged = sizeof(SmemTiles<T, false>) + sizeof(Raw<T, false>) <= kTwoCtaSmem;

struct NoRaw {};
// kD: the direct-X form of a launch (kDirectX<T> and activation rows that allow it, launch_type; Q4_K: direct-W too).
template <Type T, bool kD>
struct Smem : SmemTiles<T, kD> {
  static_assert(!kD || (kDirectX<T> && kStaged<T>));
  std::conditional_t<kStaged<T>, Raw<T, kD>, NoRaw> raw;
};

// The bytes of K-step k0 in a row of `row_bytes` bytes of blocks of kElems elements and kBytes bytes: offset and
// length (a last K-step of a legacy type may be shorter than kStepK).
template <int kElems, int kBytes>
__device__ __forceinline__ int2 chunk_of(int k0, size_t row_bytes) {
  const size_t off = size_t(k0 / kElems) * kBytes;
  return make_int2(int(off), min(kStepK / kElems * kBytes, int(row_bytes - off)));
}

// Issues the copies of K-step k0 of the tile's weight rows and activation rows into sm.raw (one commit group).
// Rows past the matrix or the tile's count copy nothing (zero-filled, never unpacked).
template <Type T, bool kD>
__device__ __forceinline__ void stage_step(Smem<T, kD>& sm, const uint8_t* __restrict__ weights, const MmqParams& p,
                                           int w0, int n_x, int k0, int buf) {
  using Ops = mmq::MmqType<T>;
  using R = Raw<T, kD>;
  const int2 wc = chunk_of<Ops::kBlockElems, int(sizeof(typename Ops::Block))>(k0, p.row_bytes);
  const int2 xc = chunk_of<Ops::kActBlockElems, int(sizeof(typename Ops::Act))>(k0, p.x_row_bytes);
#pragma unroll 1
  for (int u = int(threadIdx.x); u < kTileW * R::kWUnits; u += kThreads) {
    const int r = u / R::kWUnits;
    const bool in = w0 + r < p.rows;
    stage_unit(sm.raw.w[R::kDirectW ? buf : 0][r], weights + size_t(in ? w0 + r : 0) * p.row_bytes + wc.x,
               in ? wc.y : 0, u % R::kWUnits);
  }
#pragma unroll 1
  for (int u = int(threadIdx.x); u < kTileX * R::kXUnits; u += kThreads) {
    const int r = u / R::kXUnits;
    const bool in = r < n_x;
    stage_unit(sm.raw.x[buf][r], (in ? sm.x_row[r] : p.x) + xc.x, in ? xc.y : 0, u % R::kXUnits);
  }
  cp_async_commit();
}

// Warp w's place in the tile and its mma lane coordinates.
struct WarpPos {
  int g, t;   // mma groupID, thread in group
  int wx0;    // first activation row of the warp
  int ww0;    // first weight row
  int n_mt;   // m16 tiles holding activation rows: the others are all zero, skipped (warp-uniform)
  __device__ WarpPos(int n_x) {
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    g = lane / 4;
    t = lane % 4;
    wx0 = (warp / kWarpsW) * kWarpX;
    ww0 = (warp % kWarpsW) * kWarpW;
    n_mt = min(kMTiles, max(0, (n_x - wx0 + 15) / 16));
  }
};

// 1. The K-step at k0 unpacked into shared memory: every thread kTileW * kSlices / 256 weight slices (4 or 8) and
// kTileX * kSlices / 256 activation slices (2 or 4), with their scales (float or integer form).
// w_chunk(r) / x_chunk(r): the first block of K-step k0 of tile row r (global memory, or its staged copy).
template <Type T, bool kD, typename WChunk, typename XChunk>
__device__ __forceinline__ void unpack_step(Smem<T, kD>& sm, const MmqParams& p, int w0, int n_x, int k0,
                                            WChunk w_chunk, XChunk x_chunk) {
  using Ops = mmq::MmqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  constexpr int kSlice = Ops::kSlice;
  constexpr int kSlices = kStepK / kSlice;
  const int tid = int(threadIdx.x);
#pragma unroll 4  // the slice-16 types have 8 weight slices per thread: full unrolling spills
  for (int i = 0; i < kTileW * kSlices / kThreads; ++i) {
    const int u = tid + i * kThreads;
    const int r = u / kSlices;
    const int s = u % kSlices;
    const int k = k0 + s * kSlice;
    uint32_t q[kSlice / 4];
#pragma unroll
    for (int j = 0; j < kSlice / 4; ++j) q[j] = 0;
    const bool in = w0 + r < p.rows && k < p.cols;
    const Block* row = reinterpret_cast<const Block*>(w_chunk(r)) + s * kSlice / Ops::kBlockElems;
    // The direct-W form's quants stay in the staged block (load_fragments): only its scales here.
    constexpr bool kDirectW = Raw<T, kD>::kDirectW;
    if constexpr (Ops::kIntScales) {
      int isc = 0, imin = 0;
      float d = 0.0f, dmin = 0.0f;
      if (in) {
        if constexpr (kDirectW) {
          mmvq::scale_min_k4(s, row->scales, &isc, &imin);
        } else {
          Ops::unpack_int(*row, s, q, &isc, &imin);
        }
        if (s == 0) Ops::block_scales(*row, &d, &dmin);
      }
      sm.sc.w_sc[r][s] = int8_t(isc);
      if (Ops::kHasOffset) sm.sc.w_min[r][s] = int8_t(imin);
      if (s == 0) sm.sc.w_dm[r] = make_float2(d, dmin);
    } else {
      float scale = 0.0f, offset = 0.0f;
      if (in) Ops::unpack(*row, (k % Ops::kBlockElems) / kSlice, q, &scale, &offset);
      sm.sc.w_so[r][s] = make_float2(scale, offset);
    }
    if constexpr (!kDirectW) store_slice<kSlice>(&sm.w[r][s * kSlice], s, q);
  }
#pragma unroll 4
  for (int i = 0; i < kTileX * kSlices / kThreads; ++i) {
    const int u = tid + i * kThreads;
    const int r = u / kSlices;
    const int s = u % kSlices;
    const int k = k0 + s * kSlice;
    uint32_t q[kSlice / 4];
#pragma unroll
    for (int j = 0; j < kSlice / 4; ++j) q[j] = 0;
    const bool in = r < n_x && k < p.cols;
    const Act* row = reinterpret_cast<const Act*>(x_chunk(r)) + s * kSlice / Ops::kActBlockElems;
    // The direct-X form's quants stay in the staged block (load_fragments): only their sums and d here.
    if constexpr (Ops::kIntScales) {
      int bsum = 0;
      if (in) {
        if constexpr (kD) {
          bsum = mmq::ActSlice<Act, kSlice>::slice_sum(*row, s);
        } else {
          mmq::ActSlice<Act, kSlice>::view_int(*row, s, q, &bsum);
        }
      }
      if (Ops::kHasOffset) mmq::split_sum(bsum, &sm.sc.x_hl[r][s], &sm.sc.x_hl[r][kSlices + s]);
      if (s == 0) sm.sc.x_d[r] = in ? row->d : 0.0f;
    } else {
      float d = 0.0f, sum = 0.0f;
      if (in) mmq::ActSlice<Act, kSlice>::view(*row, (k % Ops::kActBlockElems) / kSlice, q, &d, &sum);
      sm.sc.x_ds[r][s] = make_float2(d, sum);
    }
    if constexpr (!kD) store_slice<kSlice>(&sm.x[r][s * kSlice], s, q);
  }
}

// Where a thread's A fragments come from in a K-step of the direct-X form: the byte offset, in the staged activation
// buffers, of the quants of activation row wx0 + g of buffer buf (x_off: the K-step's byte offset in an activation
// row, whose chunk sits at its global address's offset modulo 16 in the staged row). The thread's other rows (+ 8,
// + 16, + 24) are constant offsets from it, their chunks at the same offset modulo 16 (launch_type: rows of a
// multiple of 16 bytes, or rows in order, 8 rows being 8 * 292 k bytes apart): one register over the slice loop.
// The direct-W form (Q4_K) the same for its B fragments: weight row ww0 + g's quants in the staged weight buffer buf
// (w_line: the row's chunk's offset modulo 16; Q4_K rows are multiples of 144 bytes, so 8 rows apart share it).
struct DirectRows {
  int x;
  int w;
};

template <Type T, bool kD>
__device__ __forceinline__ DirectRows direct_rows(const Smem<T, kD>& sm, const WarpPos& wp, int buf, int x_off,
                                                  int w_line) {
  DirectRows dr{};
  if constexpr (kD) {
    const int r = wp.wx0 + wp.g;
    const int line = int((reinterpret_cast<uintptr_t>(sm.x_row[r]) + uintptr_t(x_off)) % 16);
    dr.x = buf * int(sizeof(sm.raw.x[0])) + r * int(sizeof(sm.raw.x[0][0])) + line +
           int(offsetof(quant::BlockQ8_K, qs));
  }
  if constexpr (Raw<T, kD>::kDirectW) {
    dr.w = buf * int(sizeof(sm.raw.w[0])) + (wp.ww0 + wp.g) * int(sizeof(sm.raw.w[0][0])) + w_line +
           int(offsetof(quant::BlockQ4_K, qs));
  }
  return dr;
}

// The A (activation) and B (weight) fragments of slice s of the K-step in shared memory (A of a direct-X type from
// the staged blocks, dr; B of the direct-W form too).
template <Type T, bool kD>
__device__ __forceinline__ void load_fragments(const Smem<T, kD>& sm, const WarpPos& wp, const DirectRows& dr, int s,
                                               int (&a)[kMTiles][4], int (&b)[kNTiles][2]) {
  constexpr int kSlice = mmq::MmqType<T>::kSlice;
  const int kb = s * kSlice + 4 * wp.t;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    if (mt >= wp.n_mt) break;
    if constexpr (kD) {
      constexpr int kPitch = int(sizeof(sm.raw.x[0][0]));
      const int8_t* x = reinterpret_cast<const int8_t*>(&sm.raw.x[0][0][0]) + dr.x + 16 * mt * kPitch + kb;
      a[mt][0] = lds32(x);
      a[mt][1] = lds32(x + 8 * kPitch);
      a[mt][2] = kSlice == 32 ? lds32(x + 16) : 0;
      a[mt][3] = kSlice == 32 ? lds32(x + 8 * kPitch + 16) : 0;
    } else {
      const int r = wp.wx0 + 16 * mt + wp.g;
      a[mt][0] = lds32(&sm.x[r][kb]);
      a[mt][1] = lds32(&sm.x[r + 8][kb]);
      a[mt][2] = kSlice == 32 ? lds32(&sm.x[r][kb + 16]) : 0;
      a[mt][3] = kSlice == 32 ? lds32(&sm.x[r + 8][kb + 16]) : 0;
    }
  }
  if constexpr (Raw<T, kD>::kDirectW) {
    // Q4_K slice s: the low (even s) or high nibbles of the block's quants 32 (s / 2) .. + 31, in order.
    constexpr int kPitch = int(sizeof(sm.raw.w[0][0]));
    const int8_t* w = reinterpret_cast<const int8_t*>(&sm.raw.w[0][0][0]) + dr.w + 32 * (s / 2) + 4 * wp.t;
    const int shift = 4 * (s % 2);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      b[nt][0] = int((uint32_t(lds32(w + 8 * nt * kPitch)) >> shift) & 0x0F0F0F0Fu);
      b[nt][1] = int((uint32_t(lds32(w + 8 * nt * kPitch + 16)) >> shift) & 0x0F0F0F0Fu);
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int c = wp.ww0 + 8 * nt + wp.g;
      b[nt][0] = lds32(&sm.w[c][kb]);
      b[nt][1] = kSlice == 32 ? lds32(&sm.w[c][kb + 16]) : 0;
    }
  }
}

// The warp's n_mt x 4 mma of one slice, each int32 result c handed to f(mt, nt, c): c[i] is activation row
// g + 8 (i / 2) of the m16 tile, weight row 2t + i % 2 of the n8 tile.
template <int kSlice, typename F>
__device__ __forceinline__ void slice_mma(const WarpPos& wp, const int (&a)[kMTiles][4], const int (&b)[kNTiles][2],
                                          F f) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    if (mt >= wp.n_mt) break;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      int c[4] = {0, 0, 0, 0};
      if (kSlice == 32) {
        mma_k32(c, a[mt], b[nt]);
      } else {
        mma_k16(c, a[mt], b[nt]);
      }
      f(mt, nt, c);
    }
  }
}

// 2. The K-step's products into the float accumulators, per-slice float scales: per slice n_mt x 4 mma per warp,
// each int32 result scaled in registers (per output and slice: the scale product, the conversion, one or two FMA).
template <Type T, bool kD>
__device__ __forceinline__ void compute_step_float(const Smem<T, kD>& sm, const WarpPos& wp, const DirectRows& dr,
                                                   float (&acc)[kMTiles][kNTiles][4]) {
  using Ops = mmq::MmqType<T>;
  constexpr int kSlices = kStepK / Ops::kSlice;
#pragma unroll
  for (int s = 0; s < kSlices; ++s) {
    int a[kMTiles][4];
    int b[kNTiles][2];
    load_fragments<T, kD>(sm, wp, dr, s, a, b);
    float xd[kMTiles][2], xs[kMTiles][2], ws[kNTiles][2], wo[kNTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if (mt >= wp.n_mt) break;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 ds = sm.sc.x_ds[wp.wx0 + 16 * mt + wp.g + 8 * h][s];
        xd[mt][h] = ds.x;
        xs[mt][h] = Ops::kHasOffset ? ds.y : 0.0f;
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 so = sm.sc.w_so[wp.ww0 + 8 * nt + 2 * wp.t + h][s];
        ws[nt][h] = so.x;
        wo[nt][h] = Ops::kHasOffset ? so.y : 0.0f;
      }
    }
    slice_mma<Ops::kSlice>(wp, a, b, [&](int mt, int nt, const int (&c)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float v = __fmaf_rn(ws[nt][i % 2] * xd[mt][i / 2], exact_float(c[i]), acc[mt][nt][i]);
        if (Ops::kHasOffset) v = __fmaf_rn(wo[nt][i % 2], xs[mt][i / 2], v);
        acc[mt][nt][i] = v;
      }
    });
  }
}

// 2'. The same for the K-quants in their integer form (one block per row and K-step): per slice the mma result times
// the weight row's integer scale, summed in int32; the min terms sum(imin_s * bsum_s) of the whole block by two more
// mma per tile (the weight rows' mins against the activation rows' slice sums split into hi and lo bytes:
// 64 * hi-product + lo-product); then per output and block one conversion and two FMAs: acc += (d_w d_x) * isum -
// (dmin_w d_x) * min-sum. Fewer than half the instructions of the float form (measured:
// docs/benchmarks/2026-12-01-cuda-prefill-int-epilogue.md).
template <Type T, bool kD>
__device__ __forceinline__ void compute_step_int(const Smem<T, kD>& sm, const WarpPos& wp, const DirectRows& dr,
                                                 float (&acc)[kMTiles][kNTiles][4]) {
  using Ops = mmq::MmqType<T>;
  constexpr int kSlices = kStepK / Ops::kSlice;
  // The block's min terms first (their operands die before the slices' int32 sums are live): A = the activation
  // rows' [hi_0 .., lo_0 ..] (k = 2 kSlices), B_hi = the weight rows' mins over the hi half (zeros over lo), B_lo the
  // reverse; kSlices = 8: m16n8k16, 16: m16n8k32.
  if (Ops::kHasOffset) {
    int ma[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if (mt >= wp.n_mt) break;
      const int r = wp.wx0 + 16 * mt + wp.g;
      ma[mt][0] = lds32(&sm.sc.x_hl[r][4 * wp.t]);
      ma[mt][1] = lds32(&sm.sc.x_hl[r + 8][4 * wp.t]);
      ma[mt][2] = kSlices == 16 ? lds32(&sm.sc.x_hl[r][16 + 4 * wp.t]) : 0;
      ma[mt][3] = kSlices == 16 ? lds32(&sm.sc.x_hl[r + 8][16 + 4 * wp.t]) : 0;
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int c0 = wp.ww0 + 8 * nt;
      const float dmin[2] = {sm.sc.w_dm[c0 + 2 * wp.t].y, sm.sc.w_dm[c0 + 2 * wp.t + 1].y};
      // word t % (kSlices / 4) of the mins of weight row c0 + g: the B fragment's k = 4t .. 4t + 3 of either half
      const int mb = lds32(&sm.sc.w_min[c0 + wp.g][4 * (wp.t % (kSlices / 4))]);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if (mt >= wp.n_mt) break;
        int hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
        if (kSlices == 8) {
          const int b_hi[2] = {wp.t < 2 ? mb : 0, 0}, b_lo[2] = {wp.t < 2 ? 0 : mb, 0};
          mma_k16(hi, ma[mt], b_hi);
          mma_k16(lo, ma[mt], b_lo);
        } else {
          const int b_hi[2] = {mb, 0}, b_lo[2] = {0, mb};
          mma_k32(hi, ma[mt], b_hi);
          mma_k32(lo, ma[mt], b_lo);
        }
        const int r = wp.wx0 + 16 * mt + wp.g;
        const float xd[2] = {sm.sc.x_d[r], sm.sc.x_d[r + 8]};
        // |64 hi + lo| <= 63 * 32 * 128 * 8 < 2^22: exact_float's range
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[mt][nt][i] = __fmaf_rn(-(dmin[i % 2] * xd[i / 2]), exact_float(64 * hi[i] + lo[i]), acc[mt][nt][i]);
        }
      }
    }
  }
  // Per slice the mma result times the weight row's integer scale, summed in int32; then per output and block
  // acc += (d_w d_x) * isum.
  int isum[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) isum[mt][nt][i] = 0;
#pragma unroll 2  // more spills registers (ptxas -v): 172 bytes per thread for Q4_K fully unrolled
  for (int s = 0; s < kSlices; ++s) {
    int a[kMTiles][4];
    int b[kNTiles][2];
    load_fragments<T, kD>(sm, wp, dr, s, a, b);
    int sc[kNTiles][2];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sc[nt][h] = sm.sc.w_sc[wp.ww0 + 8 * nt + 2 * wp.t + h][s];
    slice_mma<Ops::kSlice>(wp, a, b, [&](int mt, int nt, const int (&c)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) isum[mt][nt][i] += sc[nt][i % 2] * c[i];
    });
  }
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    if (mt >= wp.n_mt) break;
    const int r = wp.wx0 + 16 * mt + wp.g;
    const float xd[2] = {sm.sc.x_d[r], sm.sc.x_d[r + 8]};
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int c0 = wp.ww0 + 8 * nt + 2 * wp.t;
      const float d[2] = {sm.sc.w_dm[c0].x, sm.sc.w_dm[c0 + 1].x};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc[mt][nt][i] = __fmaf_rn(d[i % 2] * xd[i / 2], __int2float_rn(isum[mt][nt][i]), acc[mt][nt][i]);
      }
    }
  }
}

template <Type T, bool kD>
__device__ __forceinline__ void compute_step(const Smem<T, kD>& sm, const WarpPos& wp, const DirectRows& dr,
                                             float (&acc)[kMTiles][kNTiles][4]) {
  if constexpr (mmq::MmqType<T>::kIntScales) {
    compute_step_int<T, kD>(sm, wp, dr, acc);
  } else {
    compute_step_float<T, kD>(sm, wp, dr, acc);
  }
}

// One tile: weight rows w0 .. w0 + kTileW - 1 of `weights`, activation rows sm.x_row[0 .. n_x - 1], output
// row i of the tile at y_rows + i * pitch, weight row c at column c - col0. Every thread of the CTA calls it (it
// synchronizes).
template <Type T, bool kD>
__device__ void mmq_tile(Smem<T, kD>& sm, const uint8_t* __restrict__ weights, const MmqParams& p, int w0, int n_x,
                         float* __restrict__ y_rows, int pitch, int col0) {
  using Ops = mmq::MmqType<T>;
  using Block = typename Ops::Block;
  using Act = typename Ops::Act;
  const WarpPos wp(n_x);

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

  if constexpr (kStaged<T>) {
    // K-step k's raw blocks were copied during step k - 1's mma: wait for them, unpack them from shared memory,
    // start the copies of step k + 1, compute step k.
    // (kD: the activation blocks of step k are in buffer k % 2 and are read by step k's mma; direct-W: the weight
    // blocks too.)
    stage_step<T, kD>(sm, weights, p, w0, n_x, 0, 0);
    int buf = 0;
    for (int k0 = 0; k0 < p.cols; k0 += kStepK) {
      cp_async_wait_all();
      __syncthreads();  // the raw step visible to every thread; every thread done with the previous step's tiles
      const int2 wc = chunk_of<Ops::kBlockElems, int(sizeof(Block))>(k0, p.row_bytes);
      const int2 xc = chunk_of<Ops::kActBlockElems, int(sizeof(Act))>(k0, p.x_row_bytes);
      unpack_step<T, kD>(
          sm, p, w0, n_x, k0,
          [&](int r) {
            const uintptr_t src = reinterpret_cast<uintptr_t>(weights + size_t(w0 + r) * p.row_bytes) + wc.x;
            return &sm.raw.w[Raw<T, kD>::kDirectW ? buf : 0][r][src % 16];
          },
          [&](int r) { return &sm.raw.x[buf][r][(reinterpret_cast<uintptr_t>(sm.x_row[r]) + xc.x) % 16]; });
      __syncthreads();  // the tiles complete; the raw weights (and, unless kD, activations) free
      const int next = kD ? buf ^ 1 : 0;
      if (k0 + kStepK < p.cols) stage_step<T, kD>(sm, weights, p, w0, n_x, k0 + kStepK, next);
      const uintptr_t w_src = reinterpret_cast<uintptr_t>(weights + size_t(w0 + wp.ww0 + wp.g) * p.row_bytes) + wc.x;
      compute_step<T, kD>(sm, wp, direct_rows<T, kD>(sm, wp, buf, xc.x, int(w_src % 16)), acc);
      buf = next;
    }
  } else {
    for (int k0 = 0; k0 < p.cols; k0 += kStepK) {
      const int2 wc = chunk_of<Ops::kBlockElems, int(sizeof(Block))>(k0, p.row_bytes);
      const int2 xc = chunk_of<Ops::kActBlockElems, int(sizeof(Act))>(k0, p.x_row_bytes);
      unpack_step<T, kD>(
          sm, p, w0, n_x, k0, [&](int r) { return weights + size_t(w0 + r) * p.row_bytes + wc.x; },
          [&](int r) { return sm.x_row[r] + xc.x; });
      __syncthreads();

      // The next K-step's blocks into L1 while this one computes (a last K-step shorter than kStepK: only the row's
      // remaining bytes).
      if (p.prefetch != 0 && k0 + kStepK < p.cols) {
        const int2 wn = chunk_of<Ops::kBlockElems, int(sizeof(Block))>(k0 + kStepK, p.row_bytes);
        const int2 xn = chunk_of<Ops::kActBlockElems, int(sizeof(Act))>(k0 + kStepK, p.x_row_bytes);
        prefetch_step(kTileW, size_t(wn.x), wn.y, [&](int r) {
          return w0 + r < p.rows ? weights + size_t(w0 + r) * p.row_bytes : nullptr;
        });
        prefetch_step(kTileX, size_t(xn.x), xn.y, [&](int r) { return r < n_x ? sm.x_row[r] : nullptr; });
      }
      compute_step<T, kD>(sm, wp, DirectRows{}, acc);
      __syncthreads();
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = wp.wx0 + 16 * mt + wp.g + 8 * (i / 2);
        const int c = w0 + wp.ww0 + 8 * nt + 2 * wp.t + i % 2;
        if (r < n_x && c < p.rows) y_rows[size_t(r) * size_t(pitch) + size_t(c - col0)] = acc[mt][nt][i];
      }
    }
  }
}

// Grid: (ceil(rows / kTileW), plain: ceil(n / kTileX) | grouped: n_items, grouped: n_parts).
template <Type T, bool kD>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(const MmqParams p) {
  extern __shared__ __align__(16) uint8_t smem_bytes[];
  Smem<T, kD>& sm = *reinterpret_cast<Smem<T, kD>*>(smem_bytes);
  const int w0 = int(blockIdx.x) * kTileW;
  const int tid = int(threadIdx.x);
  if (p.items == nullptr) {
    const int x0 = int(blockIdx.y) * kTileX;
    const int n_x = min(kTileX, p.n - x0);
    if (tid < kTileX) sm.x_row[tid] = tid < n_x ? p.x + size_t(x0 + tid) * p.x_row_bytes : nullptr;
    __syncthreads();
    // The output segment of this tile (split launches: q, k, v of one matrix into three buffers; segments are
    // whole tiles, matmul_q checks it).
    // (Selects, not indexing: a runtime index into the parameter arrays would copy them to the stack.)
    const bool past0 = w0 >= p.split[0], past1 = w0 >= p.split[1];
    const int col0 = past1 ? p.split[1] : past0 ? p.split[0] : 0;
    const int pitch = (past1 ? p.rows : past0 ? p.split[1] : p.split[0]) - col0;
    float* y = past1 ? p.y_split[1] : past0 ? p.y_split[0] : p.y;
    mmq_tile<T, kD>(sm, p.weights, p, w0, n_x, y + size_t(x0) * size_t(pitch), pitch, col0);
    return;
  }
  const GroupItem& item = p.items[blockIdx.y];
  const uint8_t* weights = static_cast<const uint8_t*>(item.w[p.part + int(blockIdx.z)]);
  if (weights == nullptr) return;  // uniform over the CTA: "not on this device"
  float* y = p.y + size_t(blockIdx.z) * p.y_part_stride;
  for (int x0 = 0; x0 < item.n; x0 += kTileX) {
    const int n_x = min(kTileX, item.n - x0);
    if (tid < kTileX) {
      const int r = item.row0 + x0 + tid;
      sm.x_row[tid] =
          tid < n_x ? p.x + size_t(p.x_rows != nullptr ? p.x_rows[r] : r) * p.x_row_bytes : nullptr;
    }
    __syncthreads();  // also orders this chunk's x_row writes after the previous chunk's last reads
    mmq_tile<T, kD>(sm, weights, p, w0, n_x, y + size_t(item.row0 + x0) * size_t(p.rows), p.rows, 0);
    __syncthreads();
  }
}

// ---- host side: the supported types, argument checks, launches ---------------------------------------------

struct TypeInfo {
  const char* name;
  int block_elems;
  size_t block_bytes;
  size_t act_block_bytes;
  int act_block_elems;
  void (*launch)(dim3 grid, const MmqParams& p, cudaStream_t stream);
  size_t smem;  // the larger form's shared memory
};

template <Type T, bool kD>
void launch_form(dim3 grid, const MmqParams& p, cudaStream_t stream) {
  const auto kernel = mmq_kernel<T, kD>;
  // Over the 48 KiB of static shared memory: opted in once per type and form (thread-safe static initialization).
  static const bool opted_in = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem<T, kD>))));
    // The staged types need the largest shared-memory carveout for two CTAs per SM; the others keep L1 for their
    // prefetches.
    if (kStaged<T>) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      int(cudaSharedmemCarveoutMaxShared)));
    }
    return true;
  }();
  (void)opted_in;
  kernel<<<grid, kThreads, sizeof(Smem<T, kD>), stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

// The direct-X form where the type has it and the activation rows a thread reads (wx0 + g + 8 i) lie at the same
// offset modulo 16 (direct_rows): rows in order (plain launches, grouped ones without x_rows: 8 rows apart is 8 * 292 k
// bytes), or rows of a multiple of 16 bytes (K a multiple of 1,024) from a 16-byte aligned x (checked by the callers).
// Else the tiled form.
template <Type T>
void launch_type(dim3 grid, const MmqParams& p, cudaStream_t stream) {
  if constexpr (kDirectX<T>) {
    static_assert(sizeof(quant::BlockQ8_K) % 4 == 0 && offsetof(quant::BlockQ8_K, qs) % 4 == 0);
    if (p.direct != 0 && (p.x_rows == nullptr || p.x_row_bytes % 16 == 0)) {
      launch_form<T, true>(grid, p, stream);
      return;
    }
  }
  launch_form<T, false>(grid, p, stream);
}

// The shared memory of T's larger form (the direct-X one exists only where kDirectX and kStaged hold).
template <Type T>
constexpr size_t smem_bytes() {
  if constexpr (kDirectX<T> && kStaged<T>) {
    return std::max(sizeof(Smem<T, false>), sizeof(Smem<T, true>));
  } else {
    return sizeof(Smem<T, false>);
  }
}

template <Type T>
TypeInfo info_of(const char* name) {
  using Ops = mmq::MmqType<T>;
  return TypeInfo{
      name,           Ops::kBlockElems, sizeof(typename Ops::Block), sizeof(typename Ops::Act), Ops::kActBlockElems,
      launch_type<T>, smem_bytes<T>()};
}

bool find_type(Type type, TypeInfo* out) {
  switch (type) {
    case Type::Q4_0: *out = info_of<Type::Q4_0>("Q4_0"); return true;
    case Type::Q4_1: *out = info_of<Type::Q4_1>("Q4_1"); return true;
    case Type::Q5_0: *out = info_of<Type::Q5_0>("Q5_0"); return true;
    case Type::Q5_1: *out = info_of<Type::Q5_1>("Q5_1"); return true;
    case Type::Q8_0: *out = info_of<Type::Q8_0>("Q8_0"); return true;
    case Type::IQ4_NL: *out = info_of<Type::IQ4_NL>("IQ4_NL"); return true;
    case Type::MXFP4: *out = info_of<Type::MXFP4>("MXFP4"); return true;
    case Type::Q2_K: *out = info_of<Type::Q2_K>("Q2_K"); return true;
    case Type::Q3_K: *out = info_of<Type::Q3_K>("Q3_K"); return true;
    case Type::Q4_K: *out = info_of<Type::Q4_K>("Q4_K"); return true;
    case Type::Q5_K: *out = info_of<Type::Q5_K>("Q5_K"); return true;
    case Type::Q6_K: *out = info_of<Type::Q6_K>("Q6_K"); return true;
    case Type::IQ4_XS: *out = info_of<Type::IQ4_XS>("IQ4_XS"); return true;
    default: return false;
  }
}

// The name of any quant::Type (the trait table, quant/quant.h, is C++20 and not reachable from nvcc here).
const char* type_label(Type type) {
  switch (type) {
    case Type::F32: return "F32";
    case Type::F16: return "F16";
    case Type::BF16: return "BF16";
    case Type::Q8_1: return "Q8_1";
    case Type::Q8_K: return "Q8_K";
    default: {
      TypeInfo info;
      return find_type(type, &info) ? info.name : nullptr;
    }
  }
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// The checks matmul_q and grouped_matmul_q share: type, shape. Fills `info`.
Status check_type_and_shape(const char* op, Type type, int64_t rows, int64_t cols, TypeInfo* info) {
  if (!find_type(type, info)) {
    const char* label = type_label(type);
    return Status::error(format("%s: no int8 matrix-matrix kernel for %s%s (quantized weight types only)", op,
                                label ? label : "weight type id ",
                                label ? "" : std::to_string(unsigned(type)).c_str()));
  }
  if (info->smem > ops::smem_optin()) {
    return Status::error(format("%s: %s's kernel takes %zu bytes of shared memory a CTA, this GPU gives %zu", op,
                                info->name, info->smem, ops::smem_optin()));
  }
  if (rows < 1 || rows > INT_MAX) {
    return Status::error(format("%s: rows=%lld is outside 1..%d", op, (long long)rows, INT_MAX));
  }
  if (cols < 1 || cols % info->block_elems != 0 || cols > INT_MAX - kStepK) {
    return Status::error(format("%s: cols=%lld is not a positive multiple of %s's block of %d (at most %d)", op,
                                (long long)cols, info->name, info->block_elems, INT_MAX - kStepK));
  }
  // The kernel's in-row byte offsets are int (the staging's chunk_of).
  const int64_t w_bytes = cols / info->block_elems * int64_t(info->block_bytes);
  const int64_t x_bytes = cols / info->act_block_elems * int64_t(info->act_block_bytes);
  if (std::max(w_bytes, x_bytes) > INT_MAX) {
    return Status::error(format("%s: cols=%lld makes rows of %lld bytes, over the kernel's %d", op, (long long)cols,
                                (long long)std::max(w_bytes, x_bytes), INT_MAX));
  }
  return Status();
}

// MAGNETAR_CUDA_MMQ_PREFETCH=0 turns the L1 prefetch of the next K-step off (a diagnostic switch: the baseline).
bool prefetch_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MAGNETAR_CUDA_MMQ_PREFETCH");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

// MAGNETAR_CUDA_MMQ_DIRECT=0 keeps the K-quants' unpacked tiles (no direct-X or direct-W form; the baseline switch).
bool direct_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MAGNETAR_CUDA_MMQ_DIRECT");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

MmqParams params(const TypeInfo& info, int64_t rows, int64_t cols, const void* x, float* y) {
  MmqParams p{};
  p.row_bytes = size_t(cols / info.block_elems) * info.block_bytes;
  p.rows = int(rows);
  p.cols = int(cols);
  p.x = static_cast<const uint8_t*>(x);
  p.x_row_bytes = size_t(cols / info.act_block_elems) * info.act_block_bytes;
  p.y = y;
  p.split[0] = p.split[1] = int(rows);
  p.prefetch = prefetch_enabled() ? 1 : 0;
  p.direct = direct_enabled() ? 1 : 0;
  return p;
}

unsigned row_tiles(int64_t rows) { return unsigned((rows + kTileW - 1) / kTileW); }

}  // namespace

bool has_matmul_q(Type type) {
  TypeInfo info;
  return find_type(type, &info) && info.smem <= ops::smem_optin();
}

Status matmul_q(const MatmulArgs& args, Stream& stream) {
  TypeInfo info;
  MAGNETAR_RETURN_IF_ERROR(check_type_and_shape("matmul_q", args.type, args.rows, args.cols, &info));
  if (args.n < 1 || args.n > int64_t(kTileX) * 65535) {
    return Status::error(format("matmul_q: n=%lld is outside 1..%lld", (long long)args.n,
                                (long long)(int64_t(kTileX) * 65535)));
  }
  if (args.weights == nullptr || args.x == nullptr || args.y == nullptr) {
    return Status::error("matmul_q: null device pointer (weights, x or y)");
  }
  if (!aligned(args.weights, 16)) return Status::error("matmul_q: weights must be 16-byte aligned");
  if (!aligned(args.x, 16)) return Status::error("matmul_q: x must be 16-byte aligned");
  if (!aligned(args.y, 4)) return Status::error("matmul_q: y must be 4-byte aligned");
  MmqParams p = params(info, args.rows, args.cols, args.x, args.y);
  p.weights = static_cast<const uint8_t*>(args.weights);
  p.n = int(args.n);
  if (args.split[0] != 0) {
    const int64_t s0 = args.split[0], s1 = args.split[1];
    if (s0 % kTileW != 0 || s1 % kTileW != 0 || s0 >= s1 || s1 >= args.rows) {
      return Status::error(format("matmul_q: split rows %lld, %lld are not increasing multiples of %d below rows=%lld",
                                  (long long)s0, (long long)s1, kTileW, (long long)args.rows));
    }
    if (args.y_split[0] == nullptr || args.y_split[1] == nullptr || !aligned(args.y_split[0], 4) ||
        !aligned(args.y_split[1], 4)) {
      return Status::error("matmul_q: y_split outputs must be 4-byte aligned device pointers");
    }
    p.split[0] = int(s0);
    p.split[1] = int(s1);
    p.y_split[0] = args.y_split[0];
    p.y_split[1] = args.y_split[1];
  }
  info.launch(dim3(row_tiles(args.rows), unsigned((args.n + kTileX - 1) / kTileX), 1), p, stream.raw());
  return Status();
}

Status grouped_matmul_q(const GroupedMatmulArgs& args, Stream& stream) {
  TypeInfo info;
  MAGNETAR_RETURN_IF_ERROR(check_type_and_shape("grouped_matmul_q", args.type, args.rows, args.cols, &info));
  if (args.n_items < 1 || args.n_items > 65535) {
    return Status::error(format("grouped_matmul_q: n_items=%lld is outside 1..65535", (long long)args.n_items));
  }
  if (args.part < 0 || args.n_parts < 1 || args.part + args.n_parts > 3) {
    return Status::error(format("grouped_matmul_q: parts %d..%d are not within gate, up, down", args.part,
                                args.part + args.n_parts - 1));
  }
  if (args.n_parts > 1 && args.y_part_stride < args.rows) {
    return Status::error(format("grouped_matmul_q: y_part_stride=%lld is smaller than rows=%lld",
                                (long long)args.y_part_stride, (long long)args.rows));
  }
  if (args.items == nullptr || args.x == nullptr || args.y == nullptr) {
    return Status::error("grouped_matmul_q: null device pointer (items, x or y)");
  }
  if (!aligned(args.items, alignof(GroupItem)) || !aligned(args.x, 16) || !aligned(args.y, 4) ||
      !aligned(args.x_rows, 4)) {
    return Status::error("grouped_matmul_q: items, x (16 bytes), x_rows and y must be aligned");
  }
  MmqParams p = params(info, args.rows, args.cols, args.x, args.y);
  p.items = args.items;
  p.part = args.part;
  p.x_rows = args.x_rows;
  p.y_part_stride = size_t(args.y_part_stride);
  info.launch(dim3(row_tiles(args.rows), unsigned(args.n_items), unsigned(args.n_parts)), p, stream.raw());
  return Status();
}

}  // namespace magnetar::cuda
