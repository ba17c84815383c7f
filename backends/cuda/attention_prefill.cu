// Prefill attention on f16 tensor cores, tiled as flash-attention 2: attention_prefill_mma (cuda_backend.h). Same
// contract as attention() (causal, GQA, sliding window, F16 KV cache), but the query rows of many tokens share every
// K/V tile: attention() runs one CTA per (token, KV head) and re-reads the whole context per token.
//
// Supported: head_dim 64, 128, 256 (templated) and any group n_head / n_head_kv in 1..kMaxAttentionGroup; every
// other shape is a Status (attention() stays the fallback). k_cache and v_cache must be 16-byte aligned (cp.async
// copies 16-byte pieces of rows; attention() asks this of k_cache only).
//
// Work split. One CTA of 4 warps per (tile of query tokens, KV head). Its query rows are its tokens x the `group`
// query heads of the KV head (row r: token r / group, head r % group), so every row of the CTA reads the same K/V
// rows and a K/V tile is loaded once per CTA. Rows per CTA kRows = 128 (32 per warp, two m16 tiles) for head_dim
// <= 128: 128 / group tokens (group 8: 16 tokens; group 1: 128; a group that does not divide 128 leaves
// 128 % group rows idle, e.g. 11 of 128 at group 13). Why 32 rows per warp and not 16: each K/V fragment loaded
// from shared memory (ldmatrix) then feeds two mma instead of one. With 16 rows per warp (Q in registers) the
// ldmatrix traffic is 8 multiply-adds per shared byte at head_dim 128, which caps the tensor cores at half their
// peak (128 B/clk/SM of shared bandwidth against 2048 f16 MAC/clk/SM); with 32 rows (Q fragments re-read from
// shared memory per K/V tile: no registers left for them) it is 12.8 MAC/byte with 64-key tiles, 10.7 with the
// 32-key tiles used at head_dim 128, i.e. 4/5 or 2/3 of the peak. More rows per CTA would also cut the K/V traffic
// further but leave fewer CTAs for short prefills (200 tokens of group 8 are 13 CTAs per KV head already).
// head_dim 256 keeps 16 rows per warp (kRows 64): two m16 tiles would need 256 accumulator registers per thread.
// Short prefills take 16 rows per warp at every head size (warp_rows): when the grid of 128-row CTAs has fewer than two
// per SM (the 30B-A3B at 512 tokens: 128 CTAs on 132 SMs, each SM one CTA of 4 warps, each K/V tile's chain of mma,
// softmax and barriers latency-bound), CTAs of 64 rows make twice as many, several per SM (124 registers).
//
// Per K/V tile of kKv rows (64 at head_dim 64, 32 at 128 and 256; see "Registers"), each warp, for its rows:
//   S = Q K^T      mma.sync m16n8k16 f16 x f16 -> f32; Q fragments (A) by ldmatrix from the Q tile in shared
//                  memory (Q was scaled by scale * log2(e) and rounded to f16 once, when loaded), K fragments (B,
//                  "col": 16 dims of one key per register pair) by ldmatrix (no transpose) from the K tile [key][dim];
//   mask           only in tiles that reach past the CTA's first token (causal diagonal) or start before the window
//                  of its last token: key j visible to row r iff lo(pos_r) <= j <= pos_r, else s = -inf;
//   softmax        online, per query row: tile max over the quad of lanes that holds the row (shfl), m_new, alpha =
//                  2^(m_old - m_new), p = 2^(s - m_new) (ex2.approx: scores are in log2 units), the thread's partial
//                  row sums l = l * alpha + sum p (the quad's partials are added at the end), O *= alpha;
//   O += P V       P goes from the S accumulators to f16 A fragments in registers (the C layout of two adjacent n8
//                  tiles is the A layout of one k16 step: no shared memory round trip), V fragments (B: 2 keys x
//                  1 dim per register) by ldmatrix.trans from the V tile [key][dim].
// K and V tiles are double-buffered: cp.async (16 bytes, zero-fill) copies tile i + 1 while tile i is computed.
// K/V rows past the CTA's last token are zero-filled, never read (the cache may end there; an F16 NaN times a
// zero weight would still be NaN); for the same reason a masked tile whose V holds an infinity or NaN (an F16
// overflow) takes those values out of the P V product and adds them only to the rows that see them (add_nonfinite_v).
// Query rows past n_tok (tail tile) are computed on zero queries and not written.
// A row whose keys in a tile are all masked (a later token's window starts after the tile) keeps m = -inf: the
// exponent reference is then 0, so p = alpha = 0 instead of NaN. Tiles are walked from lo(first token) to the
// last token: nothing below the window of the CTA's first token or above the diagonal of its last is loaded.
// Query tiles run latest (longest) first: blockIdx.x counts down the tokens, so the long CTAs do not form the tail.
//
// Shared memory (dynamic, 16 bytes of padding per row so that the 8 rows of an ldmatrix hit 8 distinct 4-bank
// groups): Q kRows x (head_dim + 8) halves + 2 buffers x (K, V) x kKv x (head_dim + 8) halves = 54 KiB at
// head_dim 64, 68 KiB at 128, 99 KiB at 256 (16-row warps at head_dim 64 / 128: 45 / 51 KiB).
// Registers (ptxas, sm_90, CUDA 13.0): 198 / 240 / 242 per thread at head_dim 64 / 128 / 256, no spills, so two
// CTAs (8 warps) per SM; 128 / 124 with 16-row warps at head_dim 64 / 128 (four CTAs per SM). The accumulators
// dominate: O is 2 x 16 rows x head_dim / 32 lanes = 128 registers at head_dim 128, S 2 x 16 x kKv / 32. kKv = 64 at
// head_dim 128 needed 255 registers and spilled 68 bytes; 48 spilled 8; 32 spills nothing but halves the keys per
// barrier and per softmax rescale (and re-reads the Q fragments per 32 keys) -- the first thing to measure against 64
// on the GPU. A launch bound of 3 CTAs per SM at head_dim 64 (168 registers) spilled 68 bytes.
//
// Counts per K/V tile of one CTA, head_dim 128, group 8 (128 rows = 16 tokens, 32 keys): K/V reads 2 * 32 * 128
// * 2 B = 16 KiB (from L2 mostly: the CTAs in flight for one KV head walk the same rows at about the same pace),
// 2 * 128 * 32 * 128 = 1.05 M MAC = 2.1 Mflop: 128 flop per byte of K/V. 512 mma.sync, 4096 ex2 (MUFU: 16/clk/SM
// -> 256 clk against 512 clk of tensor work at the f16 dense peak of 4096 flop/clk/SM), 96 KiB of ldmatrix reads
// (Q 32 KiB, K 32 KiB, V 32 KiB: 21 flop per shared byte, so shared memory at 128 B/clk caps the kernel at ~2/3 of
// the dense peak). HBM: K/V of one layer at 64K context is 4 heads x 32 MiB, read about once per wave of CTAs,
// ~30-60 us per layer; the tensor work of a 2,048-token chunk there is 4 * 2048 * 32 * 65536 * 128 = 2.2 Tflop per
// layer. So the expected bound is on-chip: mma.sync issue and shared-memory fragment loads, with the softmax (ex2,
// rescales, shuffles) competing for issue slots. FA2-class mma.sync kernels reach ~35-45% of the dense f16 peak
// (989 Tflop/s) on Hopper, i.e. ~5-6 ms per layer for that chunk (~0.25-0.3 s per chunk of 48 layers, against
// ~10.7 s at today's 192 t/s). These are estimates from counts, NOT measurements: the kernel has not run on a GPU
// yet (tests/cuda/cuda_attention_test.cpp, AttentionPrefillMma*, is its correctness check). Known limits: few query
// tiles (short n_tok over a long context) leave SMs idle (no split-K here; attention() splits decode); no
// wgmma/TMA (Hopper-only) path; scores of tiles fully above a warp's own diagonal are still computed (masked).
//
// Numerics (the test derives its tolerance from this list): Q * (scale * log2 e) is rounded to f32 then f16
// (relative 2^-11 + 2^-24, or 2^-25 absolute below f16's normal range); the Q.K products are exact in the tensor
// core, summed in f32 (the tensor core truncates its inner sums: <= 1 ulp of the largest term per addition); the
// exponentials are ex2.approx.ftz (<= 2 ulp from the rounded result, PTX ISA 9.7.3.21; exactly 1 at 0, +0 at
// -inf); P is rounded to f16 for P.V (2^-11 relative, 2^-25 absolute) while l sums the f32 p; O and l are
// rescaled in f32 and divided once (IEEE division) at the end. A query element beyond 65504 / (scale log2 e) in
// magnitude (~5e5 at head_dim 128) would overflow f16 and make its row NaN; attention() has no such limit.
//
// Fragment layouts followed (PTX ISA, "9.7.14.5.8. Matrix Fragments for mma.m16n8k16 with floating point type";
// g = lane / 4, t = lane % 4): A (16x16, row) reg0 = (row g, cols 2t, 2t+1), reg1 = (row g+8, cols 2t, 2t+1),
// reg2 = (row g, cols 2t+8, 2t+9), reg3 = (row g+8, cols 2t+8, 2t+9); B (16x8, col) reg0 = (k 2t, 2t+1; col g),
// reg1 = (k 2t+8, 2t+9; col g); C/D (16x8 f32) c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same cols);
// the lower column (or k) index sits in the lower 16 bits of a register. ldmatrix ("9.7.14.5.15. Warp-level matrix
// load instruction: ldmatrix"): .x4 takes the 8 row addresses of matrix i from lanes 8i..8i+7 and gives lane l
// the pair (row l/4, cols 2(l%4), +1) of each matrix in its register i; .trans gives the transposed pair (rows
// 2(l%4), +1 of column l/4), which is B's layout when the stored rows are keys.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::exp2_approx;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::mma_f16;
using attn::pack_half2;
using attn::shared_address;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / ops::kWarpSize;

// The tile shape of one head size and MT m16 tiles (16 query rows each) per warp (see the header for the choices).
template <int D, int MT>
struct Tile {
  static constexpr int kMTiles = MT;
  static constexpr int kRows = kWarps * 16 * kMTiles;  // query rows per CTA
  static constexpr int kKv = D <= 64 ? 64 : 32;        // K/V rows per tile (registers: see the header)
  static constexpr int kStride = D + 8;                // halves per shared row: 16 bytes of padding
  static constexpr int kKvHalves = kKv * kStride;      // one K (or V) tile
  static constexpr int kSmemBytes = (kRows * kStride + 4 * kKvHalves) * 2;
  static_assert(D % 16 == 0 && kKv % 16 == 0 && (MT == 1 || (MT == 2 && D <= 128)));
  static_assert(kKv * (D / 8) % kThreads == 0, "a tile is a whole number of 16-byte copies per thread");
};

struct PrefillParams {
  const float* q;     // [n_tok, n_head, head_dim]
  const uint16_t* k;  // [n_ctx, n_head_kv, head_dim] F16 bits
  const uint16_t* v;
  float* out;      // [n_tok, n_head, head_dim]
  int64_t kv_row;  // elements per cached position: n_head_kv * head_dim
  int pos0;
  int window;  // > 0: sliding window; 0 also when the window covers every position of the call
  int n_tok;
  int n_head;
  int group;
  int tokens_per_cta;  // kRows / group
  float q_scale;       // scale * log2(e): the scores leave the mma in log2 units
};

// o += p v for the tile's non-finite V values (F16 exponent all ones) at the keys each of this thread's rows sees
// (first_key_pos: the CTA's first token's position relative to the tile's first key). s holds the rows' weights p in
// the C layout (key 8 nt + 2 t' + e of lane 4 g + t'), o the C layout over dims (dim 8 dt + 2 t + e). The slow path of
// a rare case: one key at a time, its weight fetched from the lane of the quad that holds it.
template <int D, int MT, int KV>
__device__ __forceinline__ void add_nonfinite_v(const float (&s)[MT][KV / 8][4], float (&o)[MT][D / 8][4],
                                                const uint16_t* v_s, int warp, int lane, int first_key_pos, int window,
                                                int group) {
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < KV / 8; ++nt) {  // compile-time: s is indexed by registers only
#pragma unroll 1
    for (int k8 = 0; k8 < 8; ++k8) {
      const int key = 8 * nt + k8, src = (lane & ~3) | (k8 / 2), e = k8 % 2;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float w = __shfl_sync(0xffffffffu, e == 0 ? s[mt][nt][2 * h] : s[mt][nt][2 * h + 1], src);
          const int pos = first_key_pos + (warp * 16 * MT + 16 * mt + g + 8 * h) / group;
          if (key > pos || (window > 0 && key < pos - window + 1)) continue;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint16_t x = v_s[key * (D + 8) + 8 * dt + 2 * t + c];
              if ((x & 0x7c00u) == 0x7c00u) o[mt][dt][2 * h + c] += w * __half2float(__ushort_as_half(x));
            }
          }
        }
      }
    }
  }
}

// Grid: (query tiles, n_head_kv); kThreads threads; Tile<D, MT>::kSmemBytes of dynamic shared memory.
template <int D, int MT>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(const PrefillParams p) {
  using T = Tile<D, MT>;
  constexpr int kMT = T::kMTiles;
  constexpr int kKv = T::kKv;
  constexpr int kStride = T::kStride;
  constexpr int kN8 = kKv / 8;  // n8 tiles of scores per m16 tile
  constexpr int kD8 = D / 8;    // n8 tiles of outputs per m16 tile; also 16-byte pieces per row
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* q_s = smem;                        // [kRows][kStride] f16 bits, Q * q_scale
  uint16_t* kv_s = smem + T::kRows * kStride;  // [2 buffers][K, V][kKv][kStride] f16 bits

  const int tid = int(threadIdx.x);
  const int warp = tid / ops::kWarpSize;
  const int lane = tid % ops::kWarpSize;
  const int g = lane / 4;  // mma groupID
  const int t = lane % 4;  // mma threadID_in_group
  const int hk = int(blockIdx.y);
  const int G = p.group;
  const int t0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * p.tokens_per_cta;  // latest tokens first
  const int cta_tok = min(p.tokens_per_cta, p.n_tok - t0);
  const int rows_used = p.tokens_per_cta * G;
  const int first_pos = p.pos0 + t0;
  const int last_pos = first_pos + cta_tok - 1;
  const int kv_begin = p.window > 0 ? max(0, first_pos - p.window + 1) : 0;
  const int last_lo = p.window > 0 ? max(0, last_pos - p.window + 1) : 0;
  const int n_tiles = (last_pos - kv_begin) / kKv + 1;

  // Copies K/V rows kv_begin + tile * kKv .. + kKv - 1 of this KV head into buffer `buf`; rows past last_pos are
  // zero-filled. Thread tid copies the 16-byte piece tid % kD8 of rows tid / kD8 + i * kRowStep: consecutive
  // threads take consecutive pieces of a row (coalesced).
  constexpr int kRowStep = kThreads / kD8;
  static_assert(kThreads % kD8 == 0);
  const uint16_t* k_head = p.k + size_t(hk) * D;
  const uint16_t* v_head = p.v + size_t(hk) * D;
  const int copy_row = tid / kD8;
  const int copy_col = (tid % kD8) * 8;
  const uint32_t kv_base = shared_address(kv_s);
  const uint32_t copy_dst = kv_base + uint32_t((copy_row * kStride + copy_col) * 2);
  auto load_tile = [&](int tile, int buf) {
    const int j = kv_begin + tile * kKv + copy_row;
    const size_t step = size_t(kRowStep) * size_t(p.kv_row);
    size_t src = size_t(j) * size_t(p.kv_row) + size_t(copy_col);
    const uint32_t dst = copy_dst + uint32_t(buf * 2 * T::kKvHalves * 2);
#pragma unroll
    for (int i = 0; i < kKv / kRowStep; ++i, src += step) {
      const bool valid = j + i * kRowStep <= last_pos;
      const uint32_t d = dst + uint32_t(i * kRowStep * kStride * 2);
      cp_async16(d, valid ? k_head + src : k_head, valid);
      cp_async16(d + uint32_t(T::kKvHalves * 2), valid ? v_head + src : v_head, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  // Q rows of the CTA, scaled and rounded to f16 (zeros for rows past n_tok or past rows_used).
  for (int i = tid; i < T::kRows * (D / 2); i += kThreads) {
    const int r = i / (D / 2);
    const int c = 2 * (i % (D / 2));
    const int tok = r / G;
    float x0 = 0.0f, x1 = 0.0f;
    if (r < rows_used && t0 + tok < p.n_tok) {
      const float* src = p.q + (size_t(t0 + tok) * size_t(p.n_head) + size_t(hk * G + r - tok * G)) * D + c;
      x0 = src[0] * p.q_scale;
      x1 = src[1] * p.q_scale;
    }
    *reinterpret_cast<uint32_t*>(&q_s[r * kStride + c]) = pack_half2(x0, x1);
  }

  // This thread's query rows: warp * 16 kMT + 16 mt + g + 8 h, for m16 tile mt and half h.
  float m[kMT][2], l[kMT][2];
  float o[kMT][kD8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mt][h] = -INFINITY;
      l[mt][h] = 0.0f;
    }
#pragma unroll
    for (int dt = 0; dt < kD8; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    }
  }

  // Per-lane ldmatrix addresses (in halves, relative to a tile; see the header for the lane -> row mapping).
  //   Q (A, no transpose): row lane % 16 of the m16 tile, dims +8 for lanes 16..31.
  //   K (B, no transpose): key (lane / 16) * 8 + lane % 8 of the 16-key pair of n8 tiles, dims +8 for odd lane / 8.
  //   V (B, transposed):   key ((lane / 8) % 2) * 8 + lane % 8 of the k16 step, dims +8 for lanes 16..31.
  const uint32_t q_lane =
      shared_address(q_s) + uint32_t(((warp * 16 * kMT + lane % 16) * kStride + (lane / 16) * 8) * 2);
  const uint32_t k_lane = uint32_t((((lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8) * 2);
  const uint32_t v_lane = uint32_t(((((lane / 8) % 2) * 8 + lane % 8) * kStride + (lane / 16) * 8) * 2);

  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_tiles) {
      load_tile(it + 1, buf ^ 1);  // the buffer tile it - 1 used: freed by the barrier that ended it
      cp_async_commit();
      cp_async_wait<1>();  // tile it has landed (this thread's copies)
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies (and, at it == 0, the Q stores) are visible
    const uint32_t k_tile = kv_base + uint32_t(buf * 2 * T::kKvHalves * 2);
    const uint32_t v_tile = k_tile + uint32_t(T::kKvHalves * 2);
    const int j0 = kv_begin + it * kKv;

    // S = Q K^T (log2 units).
    float s[kMT][kN8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kN8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
      }
    }
#pragma unroll 1
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a[mt], q_lane + uint32_t((16 * mt * kStride + 16 * kk) * 2));
#pragma unroll
      for (int np = 0; np < kKv / 16; ++np) {
        uint32_t b[4];  // b[0], b[1]: keys 16 np .. + 7; b[2], b[3]: keys 16 np + 8 .. + 15
        ldmatrix_x4(b, k_tile + k_lane + uint32_t((16 * np * kStride + 16 * kk) * 2));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_f16(s[mt][2 * np], a[mt], b[0], b[1]);
          mma_f16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }

    // Causal and window mask (uniform branch over the CTA): s[mt][nt][e] is key j0 + 8 nt + 2t + e % 2 of half e / 2.
    const bool masked_tile = j0 + kKv - 1 > first_pos || j0 < last_lo;
    if (masked_tile) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Row warp * 16 kMT + 16 mt + g + 8 h (its token's position and window start), as the keys 0 .. n - 1
          // of this tile: visible iff lo <= key <= pos.
          const int pos = first_pos + (warp * 16 * kMT + 16 * mt + g + 8 * h) / G - j0;
          const int lo = p.window > 0 ? pos - p.window + 1 : INT_MIN;
#pragma unroll
          for (int nt = 0; nt < kN8; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = 8 * nt + 2 * t + e;
              if (key > pos || key < lo) s[mt][nt][2 * h + e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax per row; s becomes p = 2^(s - m).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the quad of lanes 4g .. 4g + 3 holds the row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][h], mx);
        const float ref = m_new == -INFINITY ? 0.0f : m_new;  // all keys so far masked: p = alpha = 0, not NaN
        const float alpha = exp2_approx(m[mt][h] - ref);
        m[mt][h] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kN8; ++nt) {
          const float p0 = exp2_approx(s[mt][nt][2 * h] - ref);
          const float p1 = exp2_approx(s[mt][nt][2 * h + 1] - ref);
          s[mt][nt][2 * h] = p0;
          s[mt][nt][2 * h + 1] = p1;
          sum += p0 + p1;
        }
        l[mt][h] = l[mt][h] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < kD8; ++dt) {
          o[mt][dt][2 * h] *= alpha;
          o[mt][dt][2 * h + 1] *= alpha;
        }
      }
    }

    // A masked key's exact-zero weight times an infinite or NaN V value (an F16 overflow in the cache) would make NaN
    // in the rows that never attend to it (the same token decoded alone stays finite). So in a masked tile whose V
    // holds such values (rare: checked by each thread over the pieces it copied), their products are added here for
    // the rows that see them (visible keys only, whatever their weight, as the CPU does), and they are zeroed in the
    // tile before the tensor cores multiply P by it.
    if (masked_tile) {
      uint16_t* v_s = kv_s + buf * 2 * T::kKvHalves + T::kKvHalves;
      bool nonfinite = false;
#pragma unroll
      for (int i = 0; i < kKv / kRowStep; ++i) {
        const uint4 w = *reinterpret_cast<const uint4*>(v_s + (copy_row + i * kRowStep) * kStride + copy_col);
        for (const uint32_t x : {w.x, w.y, w.z, w.w}) {
          nonfinite |= (x & 0x7c00u) == 0x7c00u || (x & 0x7c000000u) == 0x7c000000u;
        }
      }
      if (__syncthreads_or(nonfinite)) {
        add_nonfinite_v<D, kMT, kKv>(s, o, v_s, warp, lane, first_pos - j0, p.window, G);
        __syncthreads();  // every thread has read the tile's V values
#pragma unroll
        for (int i = 0; i < kKv / kRowStep; ++i) {
          uint16_t* x = v_s + (copy_row + i * kRowStep) * kStride + copy_col;
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            if ((x[c] & 0x7c00u) == 0x7c00u) x[c] = 0;
          }
        }
        __syncthreads();
      }
    }

    // O += P V. The score tiles 2 kk and 2 kk + 1 are the A fragment of keys 16 kk .. 16 kk + 15: all of P is
    // packed first (half the registers of S), then each 16-dim slice of V is walked along the keys.
    uint32_t pa[kMT][kKv / 16][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int kk = 0; kk < kKv / 16; ++kk) {
        pa[mt][kk][0] = pack_half2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][kk][1] = pack_half2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][kk][2] = pack_half2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][kk][3] = pack_half2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
#pragma unroll
      for (int kk = 0; kk < kKv / 16; ++kk) {
        uint32_t b[4];  // b[0], b[1]: dims 16 dp .. + 7; b[2], b[3]: dims 16 dp + 8 .. + 15
        ldmatrix_x4_trans(b, v_tile + v_lane + uint32_t((16 * kk * kStride + 16 * dp) * 2));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_f16(o[mt][2 * dp], pa[mt][kk], b[0], b[1]);
          mma_f16(o[mt][2 * dp + 1], pa[mt][kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with buffer buf before the next iteration's copies overwrite it
  }

  // out = O / l for the rows that are tokens of this call.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = warp * 16 * kMT + 16 * mt + g + 8 * h;
      const int tok = r / G;
      if (r >= rows_used || t0 + tok >= p.n_tok) continue;
      float* dst = p.out + (size_t(t0 + tok) * size_t(p.n_head) + size_t(hk * G + r - tok * G)) * D + size_t(2 * t);
#pragma unroll
      for (int dt = 0; dt < kD8; ++dt) {
        dst[8 * dt] = o[mt][dt][2 * h] / sum;
        dst[8 * dt + 1] = o[mt][dt][2 * h + 1] / sum;
      }
    }
  }
}

template <int D, int MT>
void launch(const PrefillParams& p, dim3 grid, cudaStream_t stream) {
  // Above 48 KiB of dynamic shared memory needs the opt-in; set on every call (a host-side attribute write, no
  // stream work) so that it holds for whichever device is current.
  CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<D, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Tile<D, MT>::kSmemBytes));
  attention_prefill_kernel<D, MT><<<grid, kThreads, Tile<D, MT>::kSmemBytes, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

// Streaming multiprocessors of the current device (cached: one GPU per process here).
int64_t sm_count() {
  static const int64_t sms = [] {
    const Result<DeviceInfo> info = device_info();
    return info.ok() ? std::max<int64_t>(1, info.value().sm_count) : int64_t(1);
  }();
  return sms;
}

// Query rows per warp: AttentionArgs::prefill_warp_rows, else MAGNETAR_CUDA_PREFILL_WARP_ROWS (16 or 32, a diagnostic
// switch), else 32 (head_dim <= 128) when the grid of 32-row warps has at least two CTAs per SM, 16 when it has fewer
// (pp512 of the 30B-A3B: 128 CTAs of 16 tokens for 132 SMs, one CTA of 4 warps per SM, latency-bound; 16-row warps
// make 256 of 8 tokens) or at head_dim 256.
int warp_rows(const AttentionArgs& a, int64_t group) {
  static const int forced = [] {
    const char* v = std::getenv("MAGNETAR_CUDA_PREFILL_WARP_ROWS");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  if (a.head_dim > 128) return 16;
  if (a.prefill_warp_rows != 0) return int(a.prefill_warp_rows);
  if (forced == 16 || forced == 32) return forced;
  const int64_t tokens_per_cta = Tile<128, 2>::kRows / group;
  const int64_t ctas = (a.n_tok + tokens_per_cta - 1) / tokens_per_cta * a.n_head_kv;
  return ctas >= 2 * sm_count() ? 32 : 16;
}

}  // namespace

bool has_attention_prefill_mma(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

Status attention_prefill_mma(const AttentionArgs& a, Stream& stream) {
  MAGNETAR_RETURN_IF_ERROR(attn::check_args("attention_prefill_mma", a, 16));  // cp.async: 16-byte V pieces
  if (!has_attention_prefill_mma(a.head_dim)) {
    return Status::error(format("attention_prefill_mma: head_dim=%lld has no kernel (64, 128, 256; use attention())",
                                (long long)a.head_dim));
  }
  if (a.prefill_warp_rows != 0 && a.prefill_warp_rows != 16 && (a.prefill_warp_rows != 32 || a.head_dim > 128)) {
    return Status::error(format("attention_prefill_mma: prefill_warp_rows=%d is not 0 (auto), 16 or 32 (head_dim <= "
                                "128)", a.prefill_warp_rows));
  }

  const int64_t group = a.n_head / a.n_head_kv;
  const int mt = warp_rows(a, group) / 16;
  const int tokens_per_cta = kWarps * 16 * mt / int(group);
  PrefillParams p;  // C++17 (nvcc): no designated initializers
  p.q = a.q;
  p.k = static_cast<const uint16_t*>(a.k_cache);  // F16 (check_args)
  p.v = static_cast<const uint16_t*>(a.v_cache);
  p.out = a.out;
  p.kv_row = a.n_head_kv * a.head_dim;
  p.pos0 = int(a.pos0);
  // A window at least as long as the last position + 1 masks nothing: fold it into "no window" (fits an int).
  p.window = a.window > 0 && a.window < a.pos0 + a.n_tok ? int(a.window) : 0;
  p.n_tok = int(a.n_tok);
  p.n_head = int(a.n_head);
  p.group = int(group);
  p.tokens_per_cta = tokens_per_cta;
  p.q_scale = float(double(a.scale) * 1.4426950408889634);  // log2(e)
  const dim3 grid(unsigned((a.n_tok + tokens_per_cta - 1) / tokens_per_cta), unsigned(a.n_head_kv));
  if (a.head_dim == 64) {
    (mt == 2 ? launch<64, 2> : launch<64, 1>)(p, grid, stream.raw());
  } else if (a.head_dim == 128) {
    (mt == 2 ? launch<128, 2> : launch<128, 1>)(p, grid, stream.raw());
  } else {
    launch<256, 1>(p, grid, stream.raw());
  }
  return Status();
}

}  // namespace magnetar::cuda
