// Causal GQA attention over an F16 KV cache (cpu::attention with kv_type F16): decode with split-K, prefill
// with the same per-(token, KV head) kernel run over the whole context. Two kernels: attention() on FP32 cores
// (below; every head size, the numerics of the CPU op; split plan attn::plan_splits and a combine launch) and
// attention_decode_mma() on f16 tensor cores (further down; what the model's decode runs; its own plan, K/V staged
// through cp.async rings, the combine done by the last CTA of each KV head; for a decode token it can also do
// qkv_prepare's work, AttentionArgs::prepare, one launch fewer on each layer's chain).
//
// Cost per query token and KV head over n context rows: K and V reads of 2 * n * head_dim * 2 bytes (shared by
// the group of query heads), 4 * group * n * head_dim flops. Decode of Qwen3-30B-A3B (32 heads, 4 KV heads,
// head_dim 128) at 32K context reads 64 MB per layer for 1 Gflop: ~16 flop/byte, memory-bound on an H200
// (ridge ~200 flop/byte); the floor is ~13 us per layer at 4.8 TB/s. Split-K makes that floor reachable at any
// depth: the context's 128-row chunks are spread over ~2 waves of CTAs (attention.cuh's plan), where one CTA
// per KV head would use 4 of 132 SMs. The partials are (head_dim + 2) floats per (query head, split), at most
// kMaxAttentionSplits splits, so the combine pass reads <= 512 * 130 * 4 bytes per head (at 64K context 8.5 MB
// per layer for 32 heads, against 134 MB of K/V).
//
// The FP32 kernel is in attention_fp32.cu (its layout and history there). The tensor-core kernel takes a 64K call
// from 160 to 92 us and a 2K one from 33 to 12 us (docs/benchmarks/2026-11-30-cuda-decode-attention-mma.md).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <utility>
#include <vector>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/attention_combine.cuh"
#include "backends/cuda/attention_kv_forms.cuh"
#include "backends/cuda/attention_params.cuh"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/qk_norm_rope.cuh"
#include "backends/cuda/quantize_q8.cuh"

namespace magnetar::cuda {
namespace {

using attn::exp2_approx;
using attn::kChunk;
using attn::kCombineBatches;
using attn::kCombineChunks;
using attn::kCombineSpread;
using attn::kTicketWords;
using attn::mma_f16;
using attn::pack_half2;
constexpr int kThreads = attn::kChunk;
constexpr int kWarps = kThreads / ops::kWarpSize;

// The current device's `attr`.
int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

using attn::Params;

// ---- decode on tensor cores (attention_decode_mma) ------------------------------------------------------------
//
// Grid (n_splits, n_head_kv, n_tok) with its own plan (attn::plan_decode: one wave of CTAs, splits of whole 64-row
// steps). Each of the CTA's 4 warps owns a ring of kStages stages in shared memory, a stage being 16 cached rows of
// K and of V ([row][dim] f16, rows padded by 16 bytes so that the 8 row addresses of an ldmatrix hit distinct
// banks), filled by cp.async: the warp's step s takes rows j_begin + 16 (warp + 4 s) .. + 15 while the copies of its
// next kStages - 1 steps are in flight. The first version read each step straight into registers (no staging), one
// step in flight per warp: at 64K context the kernel pulled K/V at 2.3 TB/s (ncu: 18.75% occupancy at 146
// registers, long-scoreboard stalls half the cycles) and its 1,056 CTAs of 4 steps per warp paid their prologue
// and epilogue every 256 rows, then a second launch combined 264 splits per head. This one: 42.6 us per 64K call
// instead of 90.8 (3.15 TB/s), 10.2 instead of 11.6 at 2K (docs/benchmarks/2026-12-01-cuda-decode-attention-rings.md).
// Per step:
//   S = Q K^T    mma m16n8k16, A = Q (heads as rows: group <= 8 leaves rows 8..15 zero; scaled by scale * log2(e),
//                rounded to f16 once, in registers for the whole split), B = K by ldmatrix (8 keys x 32 dims per x4).
//   softmax      C layout: lane (g, t) has head g (and g + 8), keys 2t, 2t + 1 of each n8 tile: max over the quad.
//   O^T += V^T P^T  mma with A = V^T by ldmatrix.trans (16 dims x 16 keys per x4) and B = P^T: the score
//                accumulators of keys 2t, 2t + 1 and 2t + 8, 2t + 9 of head g are exactly B's registers.
// The warps then merge (weights 2^(m_w - M)). With several splits each CTA writes its partial record (outputs, max
// in log2 units, sum) and takes a ticket of its KV head; the last CTA to arrive combines the records in split order
// (deterministic: the order does not depend on which CTA is last) and resets the ticket: no second launch.
// Q8_0 KV (kQ8): the ring holds the cached blocks (each head row's 16-byte-aligned window, 53% of F16's bytes), and
// each step dequantizes its K rows into an f16 tile before the scores and its V rows while the scores' mma chain runs
// (each element f16(d * q), 4 codes per xor, 2 byte permutes, 2 half2 subtracts and 2 half2 multiplies); the mma
// part is the F16 kernel's (one CTA per SM as F16's, launch_decode_mma). Measured (H200, 2026-12-01,
// attention_bench): 44.5 us per 64K call against F16's 42.9, 22.1 against 18.5 at 16K, 10.0 against 10.2 at 2K. It
// moves half the bytes but executes 1.7x the instructions (ncu of the first version, which dequantized K and V before
// the scores: 13.0 M against 7.7 M per 64K call; issue slots 42% busy, stalls on fixed-latency dependencies and
// short scoreboards): dequantization, not memory, sets its time (docs/benchmarks/2026-12-01-cuda-kv-q8_0.md; with
// the lean steps of kLean and 8 warps, 36.1 us per 64K call on 2026-12-03; 12 warps from kDecodeWideRows since).
// FP8 KV (kF8, quant::Type::F8_E4M3): the ring holds the cached bytes (half of F16's), and the mma fragments are
// made from them in registers, no f16 tile: ldmatrix over the bytes gives each lane four e4m3 of one key for the
// scores (the query's fragments take its dims in the same order) and, transposed, byte pairs of two keys for P.V (a
// byte permute pairs them per dim; the output's dims come out interleaved, and the merge writes them in place); two
// e4m3 become two f16 in one cvt, exactly. H100, attention_bench: 30.3-31.0 us per 64K call against F16's 52.2 and
// Q8_0's 38.4, 11.8 against 16.9 / 15.5 at 16K; 6.6 against 6.3 / 7.7 at 2K
// (docs/benchmarks/2026-12-05-cuda-kv-fp8.md).
constexpr int kStep = 16;  // rows per warp step
static_assert(kWarps * kStep == attn::kDecodeStep);
// Q8_0 KV at head_dim 128 attending this many cached rows or more (0: every length): 12 warps per CTA with two ring
// stages each (attention_decode_variant; still one CTA per SM, 219 KB of rings; groups of more than 8 query heads: 8
// warps of four stages, 226 KB), so that three warps per scheduler hide each other's dequantization latency: its steps
// are a chain of dependent instructions, slow enough for one step in flight to cover HBM. H200, decode t/s of the
// 30B-A3B geometry against the earlier 4 warps (8 from 24K rows): 474-477 / 453 at 8K, 381-384 / 360-361 at 32K, 307 /
// 295 at 64K (docs/benchmarks/2026-12-03-cuda-decode-attention-q8-warps.md); tg128 with Q8_0 KV 562.8 / 564.4 against
// 538.8 / 539.6, even at 3K-4K (docs/benchmarks/2026-12-03-cuda-decode-attention-q8-short.md).
constexpr int64_t kDecodeWideRows = 0;
// F16 KV at head_dim 128 attending at most this many cached rows: 8 warps per CTA with two ring stages each (139 KB)
// and splits of whole 128-row steps (attn::plan_decode_rows' step), so that every warp still takes one 16-row step
// (33 splits per KV head of 128 rows cover 4,224) while a context of ~600 rows makes 5 splits instead of 9: the last
// CTA combines one batch of records instead of two, and the q/k norms of prepare take one row per warp instead of
// two. H200, tg128 of the 30B-A3B geometry (MAGNETAR_CUDA_ATTN_SHORT_ROWS=0 is the 4-warp kernel throughout): 603.4 /
// 604.2 t/s against 582.5 / 582.7, and 603.6 / 602.3 against 588.1 / 586.8; 4 and 8 sessions at once 1,187 and 1,439
// t/s against 1,113 and 1,369; even with it by 3K rows (docs/benchmarks/2026-12-03-cuda-decode-attention-short.md).
constexpr int64_t kDecodeShortRows = 4096;

// Dims d .. d + 7 of query head h_first + h of token tok, made by thread `item` of a loop over a KV head's G * D / 8
// items in thread order; with out_q8k, each warp's 32 items are a Q8_K block of the token's row (G * D a multiple of
// 256, checked at launch: the whole warp is in the loop) and the warp quantizes it as quantize_activations would.
__device__ __forceinline__ void write_output(const Params& p, int tok, int h_first, int h, int d, const float (&v)[8],
                                             int item) {
  const size_t at = (size_t(tok) * size_t(p.n_head) + size_t(h_first + h)) * size_t(p.head_dim) + size_t(d);
  float4* out = reinterpret_cast<float4*>(p.out + at);
  out[0] = make_float4(v[0], v[1], v[2], v[3]);
  out[1] = make_float4(v[4], v[5], v[6], v[7]);
  if (p.out_q8k != nullptr) {
    auto* row = reinterpret_cast<quant::BlockQ8_K*>(p.out_q8k + size_t(tok) * p.q8k_row_bytes);
    const size_t in_row = size_t(h_first + h) * size_t(p.head_dim) + size_t(d);
    q8::block_q8_k_lane8(v, row + in_row / quant::kQK_K, item % ops::kWarpSize);
  }
}

// Shared memory of one decode kernel: the warps' rings, reused after the loop for the warps' weighted outputs
// [kWarps][heads][D + 4] (the pitch makes the merge's stores conflict-free). F16 KV: a ring stage is the f16 tile the
// mma reads. Q8_0 KV (kQ8): a stage holds the cached bytes as they are (a head row is D / 32 blocks of 34 bytes: an
// f16 scale, 32 int8), and each warp has one f16 tile besides, which every step dequantizes its stage into.
template <int D, int kHT, int kStages, int kKv, int kW>
struct DecodeSmem {
  static constexpr bool kQ8 = kKv == kKvQ8;
  static constexpr int kPitch = D + 8;                    // halves per f16 tile row
  static constexpr int kStageHalves = 2 * kStep * kPitch;  // K rows, then V rows
  // Q8_0: a head row's bytes and the 16-byte pieces of the aligned window around it (attn::q8_*).
  static constexpr int kHeadBytes = attn::q8_head_bytes(D);
  static constexpr int kWinPieces = attn::q8_window_pieces(D);
  static constexpr int kRawPitch = 16 * kWinPieces;  // bytes per staged Q8_0 row
  // FP8: a head row's D bytes, 16 bytes of pitch besides (ldmatrix's 8 rows of a matrix in distinct banks).
  static constexpr int kF8Pitch = D + 16;
  static constexpr int kStageBytes = kQ8            ? 2 * kStep * kRawPitch
                                     : kKv == kKvF8 ? 2 * kStep * kF8Pitch
                                                    : 2 * kStageHalves;
  static constexpr int kWarpBytes = kStages * kStageBytes + (kQ8 ? 2 * kStageHalves : 0);  // the ring (+ f16 tile)
  static constexpr int kOPitch = D + 4;                    // floats per merged output row
  static constexpr size_t kRing = size_t(kW) * kWarpBytes;
  static constexpr size_t kMerge = size_t(kW) * 8 * kHT * kOPitch * 4;
  // AttentionArgs::prepare: the group's normed and rotated query heads [8 kHT][D + 8] (f32), past the ring and merge
  // (the ring's first stages are in flight while they are made).
  static constexpr int kQPitch = D + 8;
  static constexpr size_t kQAt = kRing > kMerge ? kRing : kMerge;
  static constexpr size_t kBytes = kQAt + size_t(8 * kHT) * kQPitch * 4;
};

// The position, rows per split and split count a decode kernel runs with (the plan made on the device in a graph).
struct DecodeRun {
  int64_t pos0;
  int rows_per_split;
  int n_splits;
};
__device__ __forceinline__ DecodeRun decode_run(const Params& p, int seq, int step) {
  if (p.pos0_device == nullptr) return {p.pos0, p.rows_per_split, p.n_splits};
  const int64_t pos0 = p.pos0_device[seq];
  const attn::DecodePlan plan =
      attn::plan_decode_rows(int(attn::attended_rows(p.window, pos0 + 1)), p.decode_want, step);
  return {pos0, plan.rows_per_split, plan.n_splits};
}

// kHT: n8 tiles of query heads (group <= 8: 1, <= 16: 2); kKv: the cache's form (KvForm: F16, Q8_0 or FP8); kSeqs:
// token z is sequence z's (Params::seq_k; a kernel of its own so that the one-sequence kernel keeps its instructions: a
// prologue on the step's chain).
template <int D, int kHT, int kStages, int kKv, int kW, bool kSeqs>
__global__ void __launch_bounds__(ops::kWarpSize* kW) attention_decode_mma_kernel(const Params p) {
  using S = DecodeSmem<D, kHT, kStages, kKv, kW>;
  constexpr bool kQ8 = kKv == kKvQ8, kF8 = kKv == kKvF8;
  constexpr int kWarps = kW;  // this kernel's warps (4, the file's kWarps, or 8 or 12: attention_decode_variant)
  constexpr int kThreads = kW * ops::kWarpSize;
  constexpr int kCtaStep = kW * kStep;  // rows of one step of all warps (attn::kDecodeStep at 4 warps)
  constexpr int kMT = D / 16;                         // m16 tiles of O^T (dims); also k16 steps of the scores
  constexpr int kHeads = 8 * kHT;
  constexpr int kPieces = D / 8;                      // 16-byte pieces per row
  constexpr int kCopies = kStep * kPieces / ops::kWarpSize;  // F16: cp.async per lane per matrix and step
  static_assert(D % 32 == 0 && (kHT == 1 || kHT == 2) && kStages >= 2);
  extern __shared__ __align__(16) uint16_t ring_s[];  // S::kBytes
  __shared__ float m_s[kWarps][kHeads], l_s[kWarps][kHeads];
  __shared__ float big_m_s[kHeads], big_l_s[kHeads];

  const bool tokens_in_x = kSeqs && p.tokens_in_x > 0;
  const int split = tokens_in_x ? int(blockIdx.x) / p.tokens_in_x : int(blockIdx.x);
  const int hk = int(blockIdx.y);
  const int tok = tokens_in_x ? int(blockIdx.x) % p.tokens_in_x : int(blockIdx.z);  // a pair with pair_tokens
  const int tid = int(threadIdx.x);
  const int warp = tid / ops::kWarpSize;
  const int lane = tid % ops::kWarpSize;
  const int g = lane / 4;  // mma groupID
  const int t = lane % 4;  // mma threadID_in_group
  const int G = p.group;
  // Several sequences (kSeqs): grid z is sequence z's token, row p.seq_tok[z] of the tokens' arrays, at its own
  // position, over its own caches. The pointers are picked with constant parameter offsets (an indexed parameter array
  // would be copied to local memory). ztok: the token's row where only several sequences can have one other than 0
  // (records, tickets, prepare's rows, outputs).
  // Pairs (Params::pair_tokens): tokens z_lo and z_lo + 1 of the launch, positions P and P + 1 with P even, so that
  // their plans are the same (plan_decode_rows) and one pass over the rows serves both: the second token's query heads
  // are head tile 1 (the group's rows 8..15 of the scores' m16 tile, empty otherwise), the first's scores of row P + 1
  // masked. ztok_hi: the second token's row (-1: the CTA has one token, as without pairs).
  int ztok = 0, ztok_hi = -1;
  const uint16_t* kc = p.k;
  const uint16_t* vc = p.v;
  if constexpr (kSeqs) {
    int z_lo = tok, z_hi = -1;
    if (kHT == 2 && p.pair_tokens > 0) {
      z_lo = 2 * tok - int(p.pos0_device[p.seq_tok[0]] & 1);
      z_hi = z_lo + 1 < p.pair_tokens ? z_lo + 1 : -1;
      if (z_lo < 0) z_lo = z_hi, z_hi = -1;           // the first token, at an odd position: alone
      if (z_lo < 0 || z_lo >= p.pair_tokens) return;  // no token (the grid has room for every parity)
    }
#pragma unroll
    for (int z = 0; z < int(kMaxDecodeSeqs); ++z) {
      if (z == z_lo) {
        kc = p.seq_k[z];
        vc = p.seq_v[z];
        ztok = p.seq_tok[z];
      }
      if (z == z_hi) ztok_hi = p.seq_tok[z];
    }
  }
  const bool paired = ztok_hi >= 0;
  const int qtok = kSeqs ? ztok : tok;  // the token's row of q and out
  const DecodeRun run = decode_run(p, paired ? ztok_hi : ztok, kCtaStep);
  if (split >= run.n_splits) return;  // a graph's grid sized for a longer context: the whole CTA leaves
  const int64_t pos = run.pos0 + (kSeqs ? 0 : tok);
  const int64_t lo = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
  const int64_t j_begin = lo + int64_t(split) * run.rows_per_split;
  const int64_t j_end = min(pos + 1, j_begin + run.rows_per_split);
  const int64_t first = j_begin + kStep * warp;  // this warp's first row; its step s starts kCtaStep s rows later
  const int n_steps = first < j_end ? int((j_end - first + kCtaStep - 1) / kCtaStep) : 0;

  // K/V of step s into ring stage s % kStages (copy_stage), of the rows in [from, to).
  const uint32_t ring = attn::shared_address(ring_s) + uint32_t(warp * S::kWarpBytes);
  const uint32_t tile = ring + uint32_t(kStages * S::kStageBytes);  // kQ8: the f16 tile the mma reads
  const size_t row_bytes = kQ8   ? size_t(attn::q8_head_bytes(int(p.kv_row)))
                           : kF8 ? size_t(p.kv_row)
                                 : size_t(p.kv_row) * 2;
  const size_t head_off = size_t(hk) * size_t(kQ8 ? S::kHeadBytes : kF8 ? D : 2 * D);
  constexpr bool kLean = kQ8 && D <= 128;  // see lean_copies below
  const bool q8_aligned = kLean && row_bytes % 16 == 0;
  const uint16_t* k_head = kc + size_t(hk) * size_t(D);  // F16
  const uint16_t* v_head = vc + size_t(hk) * size_t(D);
  // F16: lane copies 16-byte pieces lane, lane + 32, ... (two rows per instruction: coalesced); rows past j_end are
  // zero-filled when zero_tail, others are left alone.
  auto issue = [&](int s, int64_t from, int64_t to, bool zero_tail) {
    if (s >= n_steps) return;
    const int64_t base = first + int64_t(s) * kCtaStep;
    const uint32_t stage = ring + uint32_t((s % kStages) * S::kStageBytes);
    if constexpr (kQ8) {
      attn::copy_stage_q8<kStep, S::kWinPieces, S::kRawPitch, S::kHeadBytes>(stage, reinterpret_cast<const uint8_t*>(kc),
                                                                reinterpret_cast<const uint8_t*>(vc), row_bytes,
                                                                head_off, base, j_end, from, to, zero_tail, lane);
    } else if constexpr (kF8) {  // 16-byte pieces of the head rows (D / 16 per row), as F16's
      constexpr int kRowPieces = D / 16;
      const uint8_t* k8 = reinterpret_cast<const uint8_t*>(kc) + head_off;
      const uint8_t* v8 = reinterpret_cast<const uint8_t*>(vc) + head_off;
#pragma unroll
      for (int i = 0; i < kStep * kRowPieces / ops::kWarpSize; ++i) {
        const int piece = lane + ops::kWarpSize * i;
        const int row = piece / kRowPieces, col = piece % kRowPieces;
        const int64_t key = base + row;
        const bool valid = key < j_end;
        if (valid ? key >= from && key < to : zero_tail) {
          const size_t src = size_t(valid ? key : base) * row_bytes + size_t(col * 16);
          const uint32_t dst = stage + uint32_t(row * S::kF8Pitch + col * 16);
          attn::cp_async16(dst, k8 + src, valid);
          attn::cp_async16(dst + uint32_t(kStep * S::kF8Pitch), v8 + src, valid);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int piece = lane + ops::kWarpSize * i;
        const int row = piece / kPieces, col = piece % kPieces;
        const int64_t key = base + row;
        const bool valid = key < j_end;
        if (valid ? key >= from && key < to : zero_tail) {
          const size_t src = size_t(valid ? key : base) * size_t(p.kv_row) + size_t(col * 8);
          const uint32_t dst = stage + uint32_t((row * S::kPitch + col * 8) * 2);
          attn::cp_async16(dst, k_head + src, valid);
          attn::cp_async16(dst + uint32_t(kStep * S::kPitch * 2), v_head + src, valid);
        }
      }
    }
  };
  // Q8_0: matrix `mat` (0: K, 1: V) of stage s % kStages dequantized into the f16 tile ([row][dim], the F16 stage's
  // layout). Iteration j takes one 34-byte block per lane: row lane % 16 (its head row `skew` bytes into the staged
  // window), blocks b and b + 2 in the two half-warps for nb >= 4 (the same word parity: whether the codes straddle
  // words is known at compile time). Staged rows a multiple of 4 words apart put the half-warp's 16 rows in 8 banks
  // (2-way conflicts on the reads); the 8 lanes of each 16-byte store write 8 rows (tile pitch 4 mod 32 words):
  // conflict-free.
  // mat 0: the K rows, 1: the V rows (dequantized apart: the V rows' work fills the latency of the scores' mma chain).
  auto dequantize = [&](int s, int mat) {
    constexpr int kNb = D / 32;
    constexpr int kBlockStep = kNb >= 4 ? 2 : 1;
    const uint8_t* stage = reinterpret_cast<const uint8_t*>(ring_s) + warp * S::kWarpBytes + (s % kStages) *
                                                                                               S::kStageBytes;
    uint16_t* out = reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(ring_s) + warp * S::kWarpBytes +
                                                kStages * S::kStageBytes);
    const int row = lane % kStep;
    const int skew = q8_aligned ? int(head_off % 16)
                                : int((size_t(first + int64_t(s) * kCtaStep + row) * row_bytes + head_off) % 16);
#pragma unroll
    for (int j = 0; j < kNb / 2; ++j) {
      const int b = j / kBlockStep * 2 * kBlockStep + j % kBlockStep + kBlockStep * (lane / kStep);
      const int at = 34 * b;  // the block's first byte in the head row: 4-aligned (even b) or 2 past (odd b)
      const uint32_t* w =
          reinterpret_cast<const uint32_t*>(stage + (mat * kStep + row) * S::kRawPitch + skew + (at & ~3));
      uint32_t x[9];
#pragma unroll
      for (int k = 0; k < 9; ++k) x[k] = w[k];
      const bool odd = kBlockStep == 2 ? j % 2 == 1 : b % 2 == 1;
      const uint16_t d = uint16_t(odd ? x[0] >> 16 : x[0]);
      const __half2 d2 = __halves2half2(__ushort_as_half(d), __ushort_as_half(d));
      const uint32_t sel = odd ? 0x7654u : 0x5432u;  // the codes' word k straddles x[k], x[k + 1] (even b)
      uint4* dst = reinterpret_cast<uint4*>(out + (mat * kStep + row) * S::kPitch + 32 * b);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint2 a = attn::q8x4_to_f16(__byte_perm(x[2 * c], x[2 * c + 1], sel), d2);
        const uint2 e = attn::q8x4_to_f16(__byte_perm(x[2 * c + 1], x[2 * c + 2], sel), d2);
        dst[c] = make_uint4(a.x, a.y, e.x, e.y);
      }
    }
  };
  // Before pdl_wait, the rows older than the call's first token (written two or more launches back: at most the
  // launch just before this one is still running, see ops::pdl_wait) of the first kStages - 1 steps, one commit
  // group per step (an empty one past the last step keeps the group count uniform); the call's own rows after it,
  // as one more group, never into a piece a pending copy also writes (cp.async copies are unordered).
  const int64_t fresh_at = p.fresh_row != nullptr ? int64_t(*p.fresh_row) : run.pos0;  // copied before the step
  const int64_t fresh = fresh_at >= 0 && fresh_at < run.pos0 ? fresh_at : run.pos0;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    issue(s, j_begin, fresh, true);
    attn::cp_async_commit();
  }
  // AttentionArgs::prepare, before the wait (nothing a kernel writes: the table was copied before the step's first
  // launch): the norm weights and the rotation's cos/sin of pairs lane + 32 k.
  constexpr int kPer = D / 32;  // a head row's elements per lane
  const bool prep = p.prep_k != nullptr;
  float wq[kPer] = {}, wk[kPer] = {}, cs[kPer / 2] = {}, sn[kPer / 2] = {};
  if (prep) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      wq[k] = p.prep_q_weight[lane + k * ops::kWarpSize];
      wk[k] = p.prep_k_weight[lane + k * ops::kWarpSize];
    }
    const float* rope = p.prep_rope + size_t(ztok) * size_t(D);
#pragma unroll
    for (int k = 0; k < kPer / 2; ++k) {
      cs[k] = rope[lane + k * ops::kWarpSize];
      sn[k] = rope[D / 2 + lane + k * ops::kWarpSize];
    }
  }
  ops::pdl_wait();
  ops::pdl_trigger();
  // qkv_prepare's rows of this CTA, a warp per row: the group's query heads normed and rotated into q_s and, where the
  // split holds row pos0 (n_tok is 1), the token's K head normed and rotated and its V head stored there (rows 0 and
  // 1, first), with qkv_prepare's arithmetic (qk_norm_rope.cuh). When that row's step is one of the ring's first
  // kStages - 1 (copied before the loop), K and V also go straight into the ring; a later step copies them back.
  float* q_s = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(ring_s) + S::kQAt);  // [8 kHT][S::kQPitch]
  bool row_in_ring = false;
  if (prep) {
    const int extra = fresh < j_end ? 2 : 0;
    const int rel = int(fresh - j_begin);  // the row in the split (extra only): warp step, warp, row in the step
    row_in_ring = extra > 0 && rel / kCtaStep < kStages - 1;
    uint8_t* ring_row = nullptr;  // the K row's first byte in the ring
    if (row_in_ring) {
      ring_row = reinterpret_cast<uint8_t*>(ring_s) + rel / kStep % kWarps * S::kWarpBytes +
                 rel / kCtaStep % kStages * S::kStageBytes;
      ring_row += kQ8   ? rel % kStep * S::kRawPitch + int((size_t(fresh) * row_bytes + head_off) % 16)
                  : kF8 ? rel % kStep * S::kF8Pitch
                        : rel % kStep * S::kPitch * 2;
    }
    for (int r = warp; r < G + extra; r += kWarps) {
      const int kind = r < extra ? r : 2;  // 0: K, 1: V, 2: query head r - extra
      const size_t kv_at = size_t(ztok) * size_t(p.kv_row) + size_t(hk) * size_t(D);
      const float* src = kind == 0   ? p.prep_k + kv_at
                         : kind == 1 ? p.prep_v + kv_at
                                     : p.q + (size_t(ztok) * size_t(p.n_head) + size_t(hk * G + r - extra)) * size_t(D);
      float e[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) e[k] = src[lane + k * ops::kWarpSize];
      if (kind != 1) {
        float w[kPer];  // selected element by element: registers, not local memory
#pragma unroll
        for (int k = 0; k < kPer; ++k) w[k] = kind == 0 ? wk[k] : wq[k];
        qk::norm_rope<kPer>(e, w, cs, sn, p.prep_eps);
      }
      if (kind == 2) {
#pragma unroll
        for (int k = 0; k < kPer; ++k) q_s[(r - extra) * S::kQPitch + lane + k * ops::kWarpSize] = e[k];
      } else {
        uint8_t* cache = reinterpret_cast<uint8_t*>(const_cast<uint16_t*>(kind == 0 ? kc : vc));
        // V rows after the stage's K rows
        const int v_at = kQ8 ? kStep * S::kRawPitch : kF8 ? kStep * S::kF8Pitch : kStep * S::kPitch * 2;
        qk::store_head<kPer>(e, cache + size_t(fresh) * row_bytes + head_off, kKv, lane);
        if (row_in_ring) qk::store_head<kPer>(e, ring_row + (kind == 1 ? v_at : 0), kKv, lane);
      }
    }
    __syncthreads();  // q_s and the ring's row complete; the cache row's stores visible to the CTA's copies of it
  }
  if (fresh < j_end && !row_in_ring) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue(s, fresh, j_end, false);
    attn::cp_async_commit();
  }

  // Q fragments for k16 step kk: registers 0, 2 hold dims 16 kk + 2t, +1 and 16 kk + 8 + 2t, +1 of head g, registers
  // 1, 3 the same of head g + 8; zero for heads past the group. FP8: dims 16 kk + 4t, +1 and 16 kk + 4t + 2, +3 (the
  // order the K fragments below come in: a dot product's terms in another order).
  const float q_scale = p.scale * 1.4426950408889634f;
  uint32_t qa[kMT][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = g + 8 * r;
    const bool valid = paired ? g < G : h < G && (r == 0 || kHT == 2);
    const int hq = valid ? (paired ? g : h) : 0;
    const int row = paired && r == 1 ? ztok_hi : qtok;
    const float* qh =
        prep ? q_s + hq * S::kQPitch : p.q + (size_t(row) * size_t(p.n_head) + size_t(hk * G + hq)) * size_t(D);
#pragma unroll
    for (int kk = 0; kk < kMT; ++kk) {
      float2 a = make_float2(0.0f, 0.0f), b = a;
      if (valid) {
        a = *reinterpret_cast<const float2*>(qh + 16 * kk + (kF8 ? 4 * t : 2 * t));
        b = *reinterpret_cast<const float2*>(qh + 16 * kk + (kF8 ? 4 * t + 2 : 8 + 2 * t));
      }
      qa[kk][r] = pack_half2(a.x * q_scale, a.y * q_scale);
      qa[kk][r + 2] = pack_half2(b.x * q_scale, b.y * q_scale);
    }
  }

  float m_run[kHT], l_run[kHT];
  float o[kHT][kMT][4];
#pragma unroll
  for (int ht = 0; ht < kHT; ++ht) {
    m_run[ht] = -INFINITY;
    l_run[ht] = 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[ht][mt][e] = 0.0f;
    }
  }

  // kLean (Q8_0 up to head_dim 128, whose steps are a chain of dependent instructions): the copies of a step whose
  // rows are all cached and attended (every step but a split's last) from per-lane pieces made once, the key mask
  // only on the last step, the rescale skipped when every factor is 1. Q8_0 rows a multiple of 16 bytes apart (kv_row
  // a multiple of 256 elements makes them so) put every head row at the same skew in its window, so each of the
  // lane's pieces (row, column, bytes) is the same for every step, and a step's copies are address adds where
  // copy_stage_q8 spends ~40 instructions of 64-bit arithmetic per pair. The pieces are made only where the loop
  // copies at all (a warp of fewer steps than the ring's has every copy in flight before it; made for nothing, they
  // cost 5% of the launch at 512-2K rows). H200, attention_bench, 2026-12-03: 36.1 us per 64K call instead of 39.5
  // (8 warps); decode at 64K 297-300 t/s instead of 279-281 (docs/benchmarks/2026-12-03-cuda-decode-attention-q8-
  // lean.md). Not F16 (at 64K the same time with all of it: its steps wait on their bytes) nor head_dim 256 (its
  // accumulators and Q fragments take the registers: it spilled).
  const bool lean_copies = q8_aligned && n_steps >= kStages;
  constexpr int kQ8Iters = (kStep * S::kWinPieces + ops::kWarpSize - 1) / ops::kWarpSize;
  uint32_t q8_src[kQ8Iters] = {}, q8_dst[kQ8Iters] = {};
  int q8_bytes[kQ8Iters] = {};
  if (lean_copies) {
#pragma unroll
    for (int i = 0; i < kQ8Iters; ++i) {
      const int piece = lane + ops::kWarpSize * i, row = piece / S::kWinPieces, col = piece % S::kWinPieces;
      q8_src[i] = uint32_t(size_t(row) * row_bytes + (head_off & ~size_t(15)) + size_t(16 * col));
      q8_dst[i] = uint32_t(row * S::kRawPitch + col * 16);
      q8_bytes[i] = piece < kStep * S::kWinPieces ? attn::q8_piece_bytes(int64_t(head_off), S::kHeadBytes, col) : -1;
    }
  }
  auto issue_full = [&](int s) {
    const size_t at = size_t(first + int64_t(s) * kCtaStep) * row_bytes;
    const uint8_t* k_rows = reinterpret_cast<const uint8_t*>(kc) + at;
    const uint8_t* v_rows = reinterpret_cast<const uint8_t*>(vc) + at;
    const uint32_t stage = ring + uint32_t((s % kStages) * S::kStageBytes);
#pragma unroll
    for (int i = 0; i < kQ8Iters; ++i) {
      if ((kStep * S::kWinPieces) % ops::kWarpSize == 0 || q8_bytes[i] >= 0) {
        attn::cp_async16_part(stage + q8_dst[i], k_rows + q8_src[i], q8_bytes[i]);
        attn::cp_async16_part(stage + q8_dst[i] + uint32_t(kStep * S::kRawPitch), v_rows + q8_src[i], q8_bytes[i]);
      }
    }
  };

  // ldmatrix row addresses: K, matrix i = lane / 8 of an x4 is dims + 8 i of keys lane % 8 (+ 8 for n8 tile 1);
  // V (trans), matrix i is dims + 8 (i % 2) of keys lane % 8 + 8 (i / 2).
  const uint32_t k_lane = uint32_t(((lane % 8) * S::kPitch + 8 * (lane / 8)) * 2);
  const uint32_t v_lane =
      uint32_t(kStep * S::kPitch * 2) + uint32_t(((lane % 8 + 8 * (lane / 16)) * S::kPitch + 8 * (lane / 8 % 2)) * 2);
  // FP8: K, matrix i = lane / 8 is bytes 16 i .. + 15 (dims) of keys lane % 8; V (trans), matrix i is keys lane % 8 +
  // 8 (i % 2), bytes 16 (i / 2) .. + 15.
  const uint32_t f8_k_lane = uint32_t((lane % 8) * S::kF8Pitch + 16 * (lane / 8));
  const uint32_t f8_v_lane =
      uint32_t(kStep * S::kF8Pitch) + uint32_t((lane % 8 + 8 * (lane / 8 % 2)) * S::kF8Pitch + 16 * (lane / 16));
  for (int s = 0; s < n_steps; ++s) {
    // Into the stage computed last iteration (__syncwarp below).
    const int next = s + kStages - 1;
    if (lean_copies && next < n_steps && first + int64_t(next) * kCtaStep + kStep <= j_end) {
      issue_full(next);
    } else {
      issue(next, j_begin, j_end, true);
    }
    attn::cp_async_commit();
    const int64_t j = first + int64_t(s) * kCtaStep;
    const bool tail = !kLean || j + kStep > j_end;  // the split's last step has rows past its end
    if (j + kStep > fresh) {
      attn::cp_async_wait<0>();  // the step has rows of the call's own tokens: their group came after the prologue
    } else {
      attn::cp_async_wait<kStages - 1>();
    }
    __syncwarp();  // every lane's copies of step s have landed
    uint32_t stage = ring + uint32_t((s % kStages) * S::kStageBytes);
    if constexpr (kQ8) {
      dequantize(s, 0);
      __syncwarp();  // the tile's K rows are complete
      stage = tile;
    }

    // Scores (log2 units): sc[nt][e] = head g (e < 2) or g + 8 (e >= 2), key j + 8 nt + 2t + e % 2.
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
      if constexpr (kF8) {
        // ldmatrix over the bytes: matrix i of an x4 is dims 64 c + 16 i .. + 15 of keys lane % 8 (a "b16" two
        // bytes), so lane (g, t) holds key g's dims 16 i + 4t .. + 3 as four e4m3: two cvt make the k16 step's
        // B fragment in the Q fragments' order.
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          uint32_t b[4];
          attn::ldmatrix_x4(b, stage + f8_k_lane + uint32_t(8 * nt * S::kF8Pitch + 64 * c));
#pragma unroll
          for (int i = 0; i < 4; ++i) mma_f16(sc[nt], qa[4 * c + i], attn::f8x2_to_f16x2(b[i]), attn::f8x2_to_f16x2(b[i] >> 16));
        }
      } else {
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          uint32_t b[4];
          attn::ldmatrix_x4(b, stage + k_lane + uint32_t((8 * nt * S::kPitch + 32 * c) * 2));
          mma_f16(sc[nt], qa[2 * c], b[0], b[1]);
          mma_f16(sc[nt], qa[2 * c + 1], b[2], b[3]);
        }
      }
      if (tail) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (j + 8 * nt + 2 * t + e >= j_end) {
            sc[nt][e] = sc[nt][e + 2] = -INFINITY;
          } else if (paired && j + 8 * nt + 2 * t + e == pos) {
            sc[nt][e] = -INFINITY;  // the pair's second row: not the first token's to attend
          }
        }
      }
    }
    if constexpr (kQ8) dequantize(s, 1);  // the V rows, while the scores' mma chain runs

    // Online softmax per head; sc becomes p = 2^(s - m). The outputs' columns are heads 2t, 2t + 1 (of the head
    // tile), whose factors live in lanes 4 (2t) and 4 (2t + 1).
    uint32_t pb[kHT][2];
#pragma unroll
    for (int ht = 0; ht < kHT; ++ht) {
      float mx = fmaxf(fmaxf(sc[0][2 * ht], sc[0][2 * ht + 1]), fmaxf(sc[1][2 * ht], sc[1][2 * ht + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[ht], mx);
      const float ref = m_new == -INFINITY ? 0.0f : m_new;  // every key so far masked: p = alpha = 0, not NaN
      const float alpha = exp2_approx(m_run[ht] - ref);
      m_run[ht] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sc[nt][2 * ht + e] = exp2_approx(sc[nt][2 * ht + e] - ref);
          sum += sc[nt][2 * ht + e];
        }
      }
      l_run[ht] = l_run[ht] * alpha + sum;
      // Past the first steps of a long split the maxima rarely move: every factor is exactly 1 (ex2.approx of 0),
      // and the outputs keep their bits without the 8 D / 16 products.
      if (!kLean || !__all_sync(0xffffffffu, alpha == 1.0f)) {
        const float a0 = __shfl_sync(0xffffffffu, alpha, 8 * t);
        const float a1 = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          o[ht][mt][0] *= a0;
          o[ht][mt][1] *= a1;
          o[ht][mt][2] *= a0;
          o[ht][mt][3] *= a1;
        }
      }
      pb[ht][0] = pack_half2(sc[0][2 * ht], sc[0][2 * ht + 1]);
      pb[ht][1] = pack_half2(sc[1][2 * ht], sc[1][2 * ht + 1]);
    }

    // O^T += V^T P^T, m16 tile mt = dims 16 mt + g (c0, c1) and + 8 (c2, c3), columns heads 2t, 2t + 1.
    if constexpr (kQ8) __syncwarp();  // the tile's V rows are complete
    if constexpr (kF8) {
      // ldmatrix.trans over the bytes: lane (g, t) gets, of a matrix of 8 keys x 16 bytes, the byte pairs (dims
      // 2g, 2g + 1) of keys 2t and 2t + 1; one byte permute pairs the keys per dim. m16 tile mt's row g is then dim
      // 16 mt + 2g and row g + 8 dim 16 mt + 2g + 1 (the merge below writes them there).
#pragma unroll
      for (int mp = 0; mp < kMT / 2; ++mp) {
        uint32_t r[4];
        attn::ldmatrix_x4_trans(r, stage + f8_v_lane + uint32_t(32 * mp));
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const uint32_t lo = __byte_perm(r[2 * j], 0, 0x3120), hi = __byte_perm(r[2 * j + 1], 0, 0x3120);
          const uint32_t a[4] = {attn::f8x2_to_f16x2(lo), attn::f8x2_to_f16x2(lo >> 16), attn::f8x2_to_f16x2(hi),
                                 attn::f8x2_to_f16x2(hi >> 16)};
#pragma unroll
          for (int ht = 0; ht < kHT; ++ht) mma_f16(o[ht][2 * mp + j], a, pb[ht][0], pb[ht][1]);
        }
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        uint32_t a[4];
        attn::ldmatrix_x4_trans(a, stage + v_lane + uint32_t(16 * mt * 2));
#pragma unroll
        for (int ht = 0; ht < kHT; ++ht) mma_f16(o[ht][mt], a, pb[ht][0], pb[ht][1]);
      }
    }
    __syncwarp();  // every lane is done with this stage (and the f16 tile) before the next issue refills it
  }
  attn::cp_async_wait<0>();  // only empty groups are left; nothing may land after the rings are reused

  // Merge the warps: each head's max M over the warps, warp w's weight 2^(m_w - M); every warp stores its weighted
  // outputs, then they are summed warp by warp (fixed order: deterministic).
#pragma unroll
  for (int ht = 0; ht < kHT; ++ht) {
    float l = l_run[ht];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) {
      m_s[warp][8 * ht + g] = m_run[ht];
      l_s[warp][8 * ht + g] = l;
    }
  }
  __syncthreads();  // also: every warp is done with its ring
  // Warp w's weight for head h: 2^(m_w - M), M the largest over the warps (0 where every key was masked).
  auto weight = [&](int w, int h) {
    float m = m_s[0][h];
    for (int x = 1; x < kWarps; ++x) m = fmaxf(m, m_s[x][h]);
    return exp2_approx(m_s[w][h] - (m == -INFINITY ? 0.0f : m));
  };
  float* o_w = reinterpret_cast<float*>(ring_s);  // [kWarps][kHeads][S::kOPitch]
#pragma unroll
  for (int ht = 0; ht < kHT; ++ht) {
    const int h0 = 8 * ht + 2 * t;
    const float w0 = weight(warp, h0), w1 = weight(warp, h0 + 1);
    float* row0 = o_w + (warp * kHeads + h0) * S::kOPitch;
    float* row1 = row0 + S::kOPitch;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const int d = 16 * mt + (kF8 ? 2 * g : g), d2 = kF8 ? d + 1 : d + 8;  // FP8: the V fragments' dims
      row0[d] = o[ht][mt][0] * w0;
      row1[d] = o[ht][mt][1] * w1;
      row0[d2] = o[ht][mt][2] * w0;
      row1[d2] = o[ht][mt][3] * w1;
    }
  }
  if (tid < kHeads) {
    float m = m_s[0][tid], l = 0.0f;
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, m_s[w][tid]);
    for (int w = 0; w < kWarps; ++w) l += weight(w, tid) * l_s[w][tid];
    big_m_s[tid] = m;
    big_l_s[tid] = l;
  }
  __syncthreads();

  // The output (one split) or the split's partial record [D outputs, max (log2 units), sum, 2 unused]: thread i takes
  // 8 consecutive dims of one head (as the combine below, whose layout out_q8k's quantizer takes).
  const int h_first = hk * G;
  const int stride = D + 4;
  // The records of this token's heads: [n_head][splits] per token (several sequences: the grid's splits each).
  const int rec_splits = kSeqs ? p.split_stride : run.n_splits;
  const size_t records = (size_t(ztok) * size_t(p.n_head) + size_t(h_first)) * size_t(rec_splits);
  // A pair's heads: the first token's G, then the second's (its records and outputs in its own row).
  const int n_heads = paired ? 2 * G : G;
  const size_t records_hi = paired ? (size_t(ztok_hi) * size_t(p.n_head) + size_t(h_first)) * size_t(rec_splits) : 0;
  auto write = [&](int h, int d, const float(&v)[8], int item) {
    if (h < G) {
      write_output(p, qtok, h_first, h, d, v, item);
    } else {
      write_output(p, ztok_hi, h_first, h - G, d, v, item);
    }
  };
  for (int i = tid; i < n_heads * (D / 8); i += kThreads) {
    const int h = i / (D / 8), d = 8 * (i % (D / 8));
    float sum[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      sum[e] = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum[e] += o_w[(w * kHeads + h) * S::kOPitch + d + e];
    }
    if (run.n_splits == 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] = sum[e] / big_l_s[h];
      write(h, d, sum, i);
    } else {
      const size_t at =
          h < G ? records + size_t(h) * size_t(rec_splits) : records_hi + size_t(h - G) * size_t(rec_splits);
      float* rec = p.partials + (at + size_t(split)) * size_t(stride);
      reinterpret_cast<float4*>(rec + d)[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
      reinterpret_cast<float4*>(rec + d)[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
      if (d == 0) {
        rec[D] = big_m_s[h];
        rec[D + 1] = big_l_s[h];
      }
    }
  }
  if (run.n_splits == 1) return;
  // The splits' records combined (attention_combine.cuh), into the outputs and out_q8k.
  attn::SplitCombine head;  // C++17 (nvcc): no designated initializers
  head.partials = p.partials;
  head.records = records;
  head.records_hi = records_hi;
  head.ticket = p.tickets + (ztok * int(gridDim.y) + hk) * kTicketWords;
  head.rec_splits = rec_splits;
  head.n_splits = run.n_splits;
  head.group = G;
  head.heads = n_heads;
  head.combine = p.combine;
  head.spin_ns = p.spin_ns;
  attn::combine_splits<kWarps, D>(head, reinterpret_cast<float*>(ring_s), write);
}

}  // namespace

// ---- AttentionWorkspace -------------------------------------------------------------------------------------

Result<AttentionWorkspace> AttentionWorkspace::create(int64_t max_heads, int64_t max_head_dim, int64_t max_seqs) {
  if (max_heads < 1 || max_heads > INT_MAX || max_head_dim < 1 || max_head_dim > kMaxAttentionHeadDim ||
      max_seqs < 1 || max_seqs > kMaxDecodeSeqs) {
    return Status::error(format("AttentionWorkspace: max_heads=%lld must be positive, max_head_dim=%lld in 1..%lld, "
                                "max_seqs=%lld in 1..%lld",
                                (long long)max_heads, (long long)max_head_dim, (long long)kMaxAttentionHeadDim,
                                (long long)max_seqs, (long long)kMaxDecodeSeqs));
  }
  const int sms = std::max(device_attribute(cudaDevAttrMultiProcessorCount), 1);
  // Records of up to head_dim + 4 floats (attention_decode_mma's; attention()'s take head_dim + 2): kMaxAttentionSplits
  // per head, and for a launch of several sequences each one's plan, at most group x SMs per KV head (one CTA per SM:
  // launch_decode_mma), i.e. max_heads x SMs per sequence.
  const int64_t records = max_heads * std::max(int64_t(kMaxAttentionSplits), max_seqs > 1 ? max_seqs * sms : 0);
  const size_t floats = size_t(records) * size_t(max_head_dim + 4);
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::allocate(floats * sizeof(float)));
  const size_t n_tickets = size_t(max_heads * max_seqs) * kTicketWords;
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer tickets, DeviceBuffer::allocate(n_tickets * sizeof(unsigned)));
  const std::vector<unsigned> zeros(n_tickets, 0u);
  MAGNETAR_RETURN_IF_ERROR(tickets.upload(zeros.data(), zeros.size() * sizeof(unsigned)));
  AttentionWorkspace ws;
  ws.scratch_ = std::move(scratch);
  ws.tickets_ = std::move(tickets);
  ws.max_heads_ = max_heads;
  ws.max_head_dim_ = max_head_dim;
  ws.max_seqs_ = max_seqs;
  ws.max_records_ = records;
  ws.sm_count_ = sms;
  return Result<AttentionWorkspace>(std::move(ws));
}

// ---- attention ------------------------------------------------------------------------------------------------

namespace attn {

Status check_args(const char* op, const AttentionArgs& a, uintptr_t v_align, bool takes_q8) {
  if ((a.seq_k != nullptr || a.seq_v != nullptr) && !takes_q8) {
    return Status::error(format("%s: seq_k and seq_v are attention_decode_mma's", op));
  }
  if (a.n_tok < 1 || a.n_tok > 65535 || a.pos0 < 0 || a.pos0 > INT_MAX - a.n_tok) {
    return Status::error(format("%s: n_tok=%lld must be in 1..65535 and pos0=%lld non-negative", op,
                                (long long)a.n_tok, (long long)a.pos0));
  }
  if (a.n_head < 1 || a.n_head_kv < 1 || a.n_head_kv > 65535 || a.n_head % a.n_head_kv != 0 ||
      a.n_head / a.n_head_kv > kMaxAttentionGroup) {
    return Status::error(format("%s: n_head=%lld, n_head_kv=%lld: n_head_kv must divide n_head with a group of at "
                                "most %lld",
                                op, (long long)a.n_head, (long long)a.n_head_kv, (long long)kMaxAttentionGroup));
  }
  if (a.window < 0) return Status::error(format("%s: window=%lld must be >= 0", op, (long long)a.window));
  if (a.kv_type != quant::Type::F16 &&
      !(takes_q8 && (a.kv_type == quant::Type::Q8_0 || a.kv_type == quant::Type::F8_E4M3))) {
    const char* type = a.kv_type == quant::Type::Q8_0      ? "Q8_0"
                       : a.kv_type == quant::Type::F8_E4M3 ? "F8_E4M3"
                                                           : "non-F16";
    return Status::error(
        format("%s: a %s KV cache has no kernel here (F16%s; kv_to_f16 turns Q8_0 and F8_E4M3 rows "
               "into F16)",
               op, type, takes_q8 ? ", Q8_0 or F8_E4M3" : ""));
  }
  if (a.q == nullptr || a.k_cache == nullptr || a.v_cache == nullptr || a.out == nullptr) {
    return Status::error(format("%s: null device pointer (q, k_cache, v_cache or out)", op));
  }
  if (!ops::aligned(a.q, 4) || !ops::aligned(a.k_cache, 16) || !ops::aligned(a.v_cache, v_align) ||
      !ops::aligned(a.out, 4)) {
    return Status::error(format("%s: k_cache must be 16-byte, v_cache %d-byte, q and out 4-byte aligned", op,
                                int(v_align)));
  }
  if (a.out == a.q) return Status::error(format("%s: out must not alias q", op));
  if (a.out_q8k != nullptr && !takes_q8) return Status::error(format("%s: out_q8k is attention_decode_mma's", op));
  if (a.prepare.k != nullptr && !takes_q8) return Status::error(format("%s: prepare is attention_decode_mma's", op));
  return Status();
}

}  // namespace attn

namespace {

// The integer in the environment variable `name` (a diagnostic switch), else `fallback`.
int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

// The kernel parameters of one call of attention() or attention_decode_mma() (`op` names it in errors), after the
// checks both share; one split (each op plans its own).
Status make_params(const char* op, const AttentionArgs& a, AttentionWorkspace& workspace, Params& p,
                   bool takes_q8 = false) {
  MAGNETAR_RETURN_IF_ERROR(attn::check_args(op, a, 16, takes_q8));  // 16-byte K and V loads
  const int64_t max_tok = a.seq_k != nullptr ? kMaxDecodeSeqs : 1;
  if (a.pos0_device != nullptr && (a.n_tok > max_tok || a.max_rows < 1 || a.max_rows > INT_MAX)) {
    return Status::error(format("%s: pos0_device takes n_tok up to %lld (got %lld) and max_rows in 1..%d (got %lld)",
                                op, (long long)max_tok, (long long)a.n_tok, INT_MAX, (long long)a.max_rows));
  }
  p.q = a.q;
  p.k = static_cast<const uint16_t*>(a.k_cache);  // Q8_0 (attention_decode_mma): bytes, read as such there
  p.v = static_cast<const uint16_t*>(a.v_cache);
  p.out = a.out;
  p.partials = workspace.partials();
  p.kv_row = a.n_head_kv * a.head_dim;
  p.pos0 = a.pos0;
  p.window = a.window;
  p.n_head = int(a.n_head);
  p.head_dim = int(a.head_dim);
  p.group = int(a.n_head / a.n_head_kv);
  p.chunks_per_split = INT_MAX;
  p.n_splits = 1;
  p.scale = a.scale;
  p.pos0_device = a.pos0_device;
  p.sm_count = workspace.sm_count();
  p.max_splits = int(kMaxAttentionSplits);
  p.rows_per_split = INT_MAX;
  p.decode_want = 1;
  p.tickets = nullptr;
  p.out_q8k = nullptr;
  p.q8k_row_bytes = 0;
  p.prep_q_weight = nullptr;
  p.prep_k = nullptr;
  p.prep_k_weight = nullptr;
  p.prep_v = nullptr;
  p.prep_rope = nullptr;
  p.prep_eps = 0.0f;
  for (int z = 0; z < int(kMaxDecodeSeqs); ++z) {
    p.seq_k[z] = p.seq_v[z] = nullptr;
    p.seq_tok[z] = z;
  }
  p.fresh_row = a.fresh_row;
  p.tokens_in_x = 0;
  p.pair_tokens = 0;
  p.split_stride = 1;
  p.combine = kCombineBatches;
  p.spin_ns = 0;
  return Status();
}

// Several splits write partial records (and take tickets) in the workspace: it must hold the call's heads (of each of
// `seqs` sequences: AttentionArgs::seq_k).
Status check_workspace(const char* op, const AttentionArgs& a, const AttentionWorkspace& workspace, int grid_splits,
                       int64_t seqs = 1) {
  if (grid_splits > 1 && (a.n_head > workspace.max_heads() || a.head_dim > workspace.max_head_dim() ||
                          seqs > workspace.max_seqs() || seqs * a.n_head * grid_splits > workspace.max_records())) {
    return Status::error(format("%s: %lld sequences of %lld heads of %lld in %d splits exceed the workspace (%lld "
                                "sequences of %lld heads of %lld, %lld records)",
                                op, (long long)seqs, (long long)a.n_head, (long long)a.head_dim, grid_splits,
                                (long long)workspace.max_seqs(), (long long)workspace.max_heads(),
                                (long long)workspace.max_head_dim(), (long long)workspace.max_records()));
  }
  return Status();
}

// attention()'s split plan (attn::plan_splits) into p; returns the grid's split count (a graph's: room for the
// largest plan of any row count up to max_rows, one split per chunk up to the target).
int plan_fp32(const AttentionArgs& a, const AttentionWorkspace& workspace, Params& p) {
  if (a.pos0_device != nullptr) {
    const int64_t rows = attn::attended_rows(a.window, a.max_rows);
    const int target = attn::split_target(a.n_head_kv, workspace.sm_count(), int(kMaxAttentionSplits));
    return int(std::min<int64_t>((rows + attn::kChunk - 1) / attn::kChunk, target));
  }
  if (a.n_tok != 1) return 1;
  const int64_t rows = attn::attended_rows(a.window, a.pos0 + 1);
  const attn::SplitPlan plan = attn::plan_splits(rows, a.n_head_kv, workspace.sm_count(), int(kMaxAttentionSplits));
  if (plan.n_splits > 1) {
    p.chunks_per_split = plan.chunks_per_split;
    p.n_splits = plan.n_splits;
  }
  return p.n_splits;
}

// Whether the current device gives a CTA of kKernel its shared memory (Smem::kBytes of it dynamic).
template <auto kKernel, typename Smem>
bool decode_kernel_fits() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kKernel) != cudaSuccess) {  // no GPU (smem_optin: nothing to fit)
    cudaGetLastError();
    return true;
  }
  return ops::smem_optin() >= Smem::kBytes + attr.sharedSizeBytes;
}

// Whether the 4-warp decode kernel of head size D, kHT query-head tiles and kStages ring stages fits the device, for
// F16 and Q8_0 caches, one sequence and several (an FP8 ring stage is smaller than an F16 one).
template <int D, int kHT, int kStages>
bool decode_shape_fits() {
  return decode_kernel_fits<attention_decode_mma_kernel<D, kHT, kStages, kKvF16, kWarps, false>,
                            DecodeSmem<D, kHT, kStages, kKvF16, kWarps>>() &&
         decode_kernel_fits<attention_decode_mma_kernel<D, kHT, kStages, kKvF16, kWarps, true>,
                            DecodeSmem<D, kHT, kStages, kKvF16, kWarps>>() &&
         decode_kernel_fits<attention_decode_mma_kernel<D, kHT, kStages, kKvQ8, kWarps, false>,
                            DecodeSmem<D, kHT, kStages, kKvQ8, kWarps>>() &&
         decode_kernel_fits<attention_decode_mma_kernel<D, kHT, kStages, kKvQ8, kWarps, true>,
                            DecodeSmem<D, kHT, kStages, kKvQ8, kWarps>>();
}

// Launches the decode kernel of one shape with its own plan (plan_decode over the CTAs the GPU holds of it at once) on
// top of make_params' parameters; a graph's grid is sized for max_rows.
template <bool kSeqs, int D, int kHT, int kStages, int kKv, int kW = kWarps>
Status launch_decode_mma(const AttentionArgs& a, AttentionWorkspace& workspace, Params p, cudaStream_t stream) {
  const auto kernel = attention_decode_mma_kernel<D, kHT, kStages, kKv, kW, kSeqs>;
  constexpr int kThreads = kW * ops::kWarpSize;
  // One CTA per SM: where the kernel's own shared memory would let two or more share an SM (Q8_0 at head_dim 128:
  // 113 KB; head_dim 64), the launch asks for more than half of the SM's. With two per SM the plan aimed at twice the
  // splits, and at short contexts, where fewer splits than that carry rows, the block scheduler put two of them on
  // one SM while other SMs had none: Q8_0 KV decoded at 449 t/s at 2K depth against F16's 527; one per SM, 522
  // (docs/benchmarks/2026-12-02-cuda-decode-attention-one-per-sm.md).
  static const size_t smem = std::max(DecodeSmem<D, kHT, kStages, kKv, kW>::kBytes,
                                      size_t(device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor)) / 2 + 1);
  // Above 48 KiB of dynamic shared memory needs the opt-in; set on every call (a host-side attribute write, no
  // stream work) so that it holds for whichever device is current.
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  static const int per_sm = [&] {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem));
    return n > 0 ? n : 1;
  }();
  const int slots = workspace.sm_count() * per_sm;
  p.decode_want = int(attn::decode_split_target(a.n_head_kv, slots, p.max_splits));
  p.tickets = workspace.tickets();
  int grid_splits = 1;
  if (a.pos0_device != nullptr) {
    grid_splits = attn::decode_split_bound(attn::attended_rows(a.window, a.max_rows), a.n_head_kv, slots,
                                           p.max_splits);
  } else if (a.n_tok == 1) {
    const int64_t rows = attn::attended_rows(a.window, a.pos0 + 1);
    const attn::DecodePlan plan = attn::plan_decode_rows(int(rows), p.decode_want, kW * kStep);
    if (plan.n_splits > 1) {
      p.rows_per_split = plan.rows_per_split;
      p.n_splits = plan.n_splits;
    }
    grid_splits = p.n_splits;
  }
  int64_t seqs = 1;  // the workspace's sequences the launch uses (records and tickets of token rows 0 .. seqs - 1)
  if (a.seq_k != nullptr) {
    for (int64_t z = 0; z < a.n_tok; ++z) seqs = std::max<int64_t>(seqs, p.seq_tok[z] + 1);
  }
  MAGNETAR_RETURN_IF_ERROR(check_workspace("attention_decode_mma", a, workspace, grid_splits, seqs));
  p.split_stride = grid_splits;
  // MAGNETAR_CUDA_ATTN_COMBINE (a diagnostic switch): 0 the last CTA in batches (other bits), 1 the chunks by the
  // last CTA alone (the same bits as the default, 2: spread where the grid fits).
  static const int64_t combine = env_int("MAGNETAR_CUDA_ATTN_COMBINE", kCombineSpread);
  // The grid's tokens, or pairs of tokens (Params::pair_tokens: one more than half, for either parity of the first).
  const int grid_tok = p.pair_tokens > 0 ? p.pair_tokens / 2 + 1 : int(a.n_tok);
  const bool one_wave = int64_t(grid_splits) * a.n_head_kv * grid_tok <= int64_t(slots);
  p.combine = combine == kCombineBatches ? kCombineBatches
              : combine == kCombineSpread && one_wave ? kCombineSpread : kCombineChunks;
  // A waiting CTA gives its chunk up after 1 ms: never when every CTA runs (the waits are microseconds), a slow step
  // rather than a hang when some cannot start. MAGNETAR_CUDA_ATTN_SPIN_NS (a test switch; 0: the waiting CTAs leave
  // their chunks to the last one at once).
  static const int64_t spin_ns = env_int("MAGNETAR_CUDA_ATTN_SPIN_NS", 1000000);
  p.spin_ns = uint64_t(std::max<int64_t>(spin_ns, 0));
  // Drafts of one sequence read the same cached rows: their CTAs side by side (Params::tokens_in_x), unless
  // MAGNETAR_CUDA_ATTN_DRAFTS_SIDE_BY_SIDE=0 (a diagnostic switch: token by token, the grid's z). The same bits either
  // way: only the order the CTAs start in differs.
  static const bool side_by_side = env_int("MAGNETAR_CUDA_ATTN_DRAFTS_SIDE_BY_SIDE", 1) != 0;
  if (kSeqs && side_by_side && a.fresh_row != nullptr && grid_tok > 1) p.tokens_in_x = grid_tok;
  const dim3 grid = p.tokens_in_x > 0 ? dim3(unsigned(grid_splits * p.tokens_in_x), unsigned(a.n_head_kv), 1u)
                                      : dim3(unsigned(grid_splits), unsigned(a.n_head_kv), unsigned(grid_tok));
  CUDA_CHECK(ops::launch(kernel, grid, kThreads, smem, stream, p));
  return Status();
}
// The kernel of the call's head size and group.
template <int kKv, bool kSeqs>
Status launch_decode_mma(const AttentionArgs& a, AttentionWorkspace& workspace, const Params& p, cudaStream_t stream) {
  const bool two = p.group > 8 || p.pair_tokens > 0;
  switch (a.head_dim) {
    case 64:
      return two ? launch_decode_mma<kSeqs, 64, 2, 4, kKv>(a, workspace, p, stream)
                 : launch_decode_mma<kSeqs, 64, 1, 4, kKv>(a, workspace, p, stream);
    case 128: {
      const int64_t rows = a.pos0 + (a.seq_k != nullptr ? 1 : a.n_tok);  // seq_k: the first sequence's (all alike)
      const int variant = attention_decode_variant(a.head_dim, a.kv_type, rows);
      if constexpr (kKv == kKvQ8) {  // 12 warps: Q8_0 only (attention_decode_variant)
        if (variant == 12 && !two) return launch_decode_mma<kSeqs, 128, 1, 2, kKv, 12>(a, workspace, p, stream);
      }
      if (variant >= 8) {
        // Q8_0: four ring stages; F16 and FP8 at short contexts (kDecodeShortRows): one step per warp, two stages
        // are enough.
        if constexpr (kKv == kKvQ8) {
          return two ? launch_decode_mma<kSeqs, 128, 2, 4, kKv, 8>(a, workspace, p, stream)
                     : launch_decode_mma<kSeqs, 128, 1, 4, kKv, 8>(a, workspace, p, stream);
        }
        return two ? launch_decode_mma<kSeqs, 128, 2, 2, kKv, 8>(a, workspace, p, stream)
                   : launch_decode_mma<kSeqs, 128, 1, 2, kKv, 8>(a, workspace, p, stream);
      }
      // Four ring stages take ~113-148 KB: GPUs of 99 KB a CTA (the RTX 30/40/50 series) take two (~76-78 KB).
      static const bool four_fit = decode_shape_fits<128, 1, 4>() && decode_shape_fits<128, 2, 4>();
      if (!four_fit) {
        return two ? launch_decode_mma<kSeqs, 128, 2, 2, kKv>(a, workspace, p, stream)
                   : launch_decode_mma<kSeqs, 128, 1, 2, kKv>(a, workspace, p, stream);
      }
      return two ? launch_decode_mma<kSeqs, 128, 2, 4, kKv>(a, workspace, p, stream)
                 : launch_decode_mma<kSeqs, 128, 1, 4, kKv>(a, workspace, p, stream);
    }
    default: return launch_decode_mma<kSeqs, 256, 1, 2, kKv>(a, workspace, p, stream);
  }
}

}  // namespace

Status attention(const AttentionArgs& a, AttentionWorkspace& workspace, Stream& stream) {
  if (a.head_dim < 8 || a.head_dim % 8 != 0 || a.head_dim > kMaxAttentionHeadDim) {
    return Status::error(format("attention: head_dim=%lld must be a multiple of 8 in 8..%lld", (long long)a.head_dim,
                                (long long)kMaxAttentionHeadDim));
  }
  Params p;  // C++17 (nvcc): no designated initializers
  MAGNETAR_RETURN_IF_ERROR(make_params("attention", a, workspace, p));
  const int grid_splits = plan_fp32(a, workspace, p);
  MAGNETAR_RETURN_IF_ERROR(check_workspace("attention", a, workspace, grid_splits));
  const dim3 grid(unsigned(grid_splits), unsigned(a.n_head_kv), unsigned(a.n_tok));
  attn::launch_fp32(p, grid, stream.raw());
  attn::launch_fp32_combine(p, grid_splits, a.n_head, stream.raw());
  return Status();
}

int attention_decode_variant(int64_t head_dim, quant::Type kv_type, int64_t rows) {
  // The 8- and 12-warp kernels' rings take up to 226 KB (Q8_0) and 139 KB (F16, two stages) of shared memory per CTA:
  // within Hopper's opt-in limit (227 KB), the F16 one within Ampere's (163 KB) too; elsewhere the 4-warp kernel stays.
  static const bool wide_fits =
      decode_kernel_fits<attention_decode_mma_kernel<128, 2, 4, kKvQ8, 8, false>, DecodeSmem<128, 2, 4, kKvQ8, 8>>();
  static const bool short_fits =
      decode_kernel_fits<attention_decode_mma_kernel<128, 2, 2, kKvF16, 8, false>, DecodeSmem<128, 2, 2, kKvF16, 8>>();
  static const int64_t short_rows = env_int("MAGNETAR_CUDA_ATTN_SHORT_ROWS", kDecodeShortRows);
  if (head_dim != 128) return kWarps;
  // Q8_0 from kDecodeWideRows (MAGNETAR_CUDA_ATTN_WIDE_ROWS=N: from N rows, the 4-warp kernel below): 12 warps where
  // they fit (groups of more than 8 query heads take the 8-warp kernel; MAGNETAR_CUDA_ATTN_Q8_WARPS=8: the 8-warp
  // kernel for all), else 8.
  static const int64_t wide_rows = env_int("MAGNETAR_CUDA_ATTN_WIDE_ROWS", kDecodeWideRows);
  static const bool twelve_fits =
      decode_kernel_fits<attention_decode_mma_kernel<128, 1, 2, kKvQ8, 12, false>, DecodeSmem<128, 1, 2, kKvQ8, 12>>();
  static const int wide_warps = twelve_fits && env_int("MAGNETAR_CUDA_ATTN_Q8_WARPS", 12) != 8 ? 12 : 8;
  if (kv_type == quant::Type::F16) return short_fits && rows <= short_rows ? 8 : kWarps;
  // FP8 as F16: at 16K rows 4 warps took 11.8 us a call against 12.6-12.8 on 8 or 12, at 64K 31.0 against 30.3-31.6
  // (H100, attention_bench, docs/benchmarks/2026-12-05-cuda-kv-fp8.md).
  if (kv_type == quant::Type::F8_E4M3) return short_fits && rows <= short_rows ? 8 : kWarps;
  return wide_fits && kv_type == quant::Type::Q8_0 && rows >= wide_rows ? wide_warps : kWarps;
}

bool has_attention_decode_mma(int64_t head_dim, int64_t group) {
  if (group < 1 || group > kMaxAttentionGroup) return false;
  // The kernels launch_decode_mma takes for the shape fit the device's shared memory (the least of them at 128).
  static const bool fit64 = decode_shape_fits<64, 1, 4>() && decode_shape_fits<64, 2, 4>();
  static const bool fit128 = decode_shape_fits<128, 1, 2>() && decode_shape_fits<128, 2, 2>();
  static const bool fit256 = decode_shape_fits<256, 1, 2>();
  return (head_dim == 64 && fit64) || (head_dim == 128 && fit128) || (head_dim == 256 && group <= 8 && fit256);
}

bool attention_decode_quantizes(int64_t head_dim, int64_t group) {
  return has_attention_decode_mma(head_dim, group) && group * head_dim % quant::kQK_K == 0;
}

Status attention_decode_mma(const AttentionArgs& a, AttentionWorkspace& workspace, Stream& stream) {
  if (a.n_head_kv > 0 && !has_attention_decode_mma(a.head_dim, a.n_head / a.n_head_kv)) {
    return Status::error(
        format("attention_decode_mma: head_dim=%lld with group %lld has no kernel (head_dim 64 or "
               "128 with a group up to 16, 256 with a group up to 8, where the GPU has its shared "
               "memory; use attention())",
               (long long)a.head_dim, (long long)(a.n_head / a.n_head_kv)));
  }
  if (!ops::aligned(a.q, 16) || !ops::aligned(a.out, 16)) {
    return Status::error("attention_decode_mma: q and out must be 16-byte aligned");
  }
  Params p;
  if (a.seq_k != nullptr || a.seq_v != nullptr) {
    if (a.seq_k == nullptr || a.seq_v == nullptr || a.pos0_device == nullptr || a.n_tok < 1 ||
        a.n_tok > kMaxDecodeSeqs) {
      return Status::error(format("attention_decode_mma: several sequences take seq_k, seq_v and pos0_device, at most "
                                  "%lld of them (n_tok=%lld)", (long long)kMaxDecodeSeqs, (long long)a.n_tok));
    }
    for (int64_t z = 0; z < a.n_tok; ++z) {
      if (a.seq_k[z] == nullptr || a.seq_v[z] == nullptr || !ops::aligned(a.seq_k[z], 16) ||
          !ops::aligned(a.seq_v[z], 16)) {
        return Status::error(format("attention_decode_mma: sequence %lld's caches must be non-null and 16-byte "
                                    "aligned", (long long)z));
      }
    }
    AttentionArgs first = a;  // the shared checks see the first sequence's caches
    first.k_cache = a.seq_k[0];
    first.v_cache = a.seq_v[0];
    MAGNETAR_RETURN_IF_ERROR(make_params("attention_decode_mma", first, workspace, p, true));
    for (int64_t z = 0; z < a.n_tok; ++z) {
      p.seq_k[z] = static_cast<const uint16_t*>(a.seq_k[z]);
      p.seq_v[z] = static_cast<const uint16_t*>(a.seq_v[z]);
      if (a.seq_tok == nullptr) continue;
      const int32_t row = a.seq_tok[z];
      bool repeated = false;
      for (int64_t y = 0; y < z; ++y) repeated = repeated || a.seq_tok[y] == row;
      if (row < 0 || row >= int32_t(kMaxDecodeSeqs) || repeated) {
        return Status::error(format("attention_decode_mma: seq_tok[%lld]=%d must be a token row in 0..%lld, each "
                                    "once", (long long)z, int(row), (long long)kMaxDecodeSeqs - 1));
      }
      p.seq_tok[z] = row;
    }
  } else {
    MAGNETAR_RETURN_IF_ERROR(make_params("attention_decode_mma", a, workspace, p, true));
  }
  if (a.out_q8k != nullptr) {
    if (!attention_decode_quantizes(a.head_dim, p.group)) {
      return Status::error(format("attention_decode_mma: out_q8k needs group * head_dim a multiple of 256 (group %d, "
                                  "head_dim %lld)", p.group, (long long)a.head_dim));
    }
    if (!ops::aligned(a.out_q8k, 4)) return Status::error("attention_decode_mma: out_q8k must be 4-byte aligned");
    p.out_q8k = static_cast<uint8_t*>(a.out_q8k);
    p.q8k_row_bytes = detail::act_row_bytes(quant::Type::Q8_K, a.n_head * a.head_dim);
  }
  if (a.prepare.k != nullptr) {
    const AttentionArgs::Prepare& pr = a.prepare;
    if (a.n_tok != 1 && a.seq_k == nullptr) {
      return Status::error(format("attention_decode_mma: prepare takes n_tok=1 (got %lld) or several sequences",
                                  (long long)a.n_tok));
    }
    if (pr.q_weight == nullptr || pr.k_weight == nullptr || pr.v == nullptr || pr.rope == nullptr) {
      return Status::error("attention_decode_mma: prepare needs q_weight, k, k_weight, v and rope");
    }
    if (!ops::aligned(pr.q_weight, 4) || !ops::aligned(pr.k, 4) || !ops::aligned(pr.k_weight, 4) ||
        !ops::aligned(pr.v, 4) || !ops::aligned(pr.rope, 4)) {
      return Status::error("attention_decode_mma: prepare's vectors must be 4-byte aligned");
    }
    p.prep_q_weight = pr.q_weight;
    p.prep_k = pr.k;
    p.prep_k_weight = pr.k_weight;
    p.prep_v = pr.v;
    p.prep_rope = pr.rope;
    p.prep_eps = pr.eps;
  }
  const bool q8 = a.kv_type == quant::Type::Q8_0, f8 = a.kv_type == quant::Type::F8_E4M3;
  // Drafts of one sequence in position pairs (Params::pair_tokens) where the second head tile is free (groups of 8)
  // and the kernel is the one a token alone takes with both tiles (F16 and FP8; Q8_0 runs 12 warps with one tile),
  // neither with prepare (the tokens' rows are stored before the call) nor a window (the pair's first rows differ).
  // MAGNETAR_CUDA_ATTN_DRAFT_PAIRS=0 (a diagnostic switch): a CTA per token. The same bits either way.
  static const bool pairs = env_int("MAGNETAR_CUDA_ATTN_DRAFT_PAIRS", 1) != 0;
  if (pairs && a.seq_k != nullptr && a.fresh_row != nullptr && a.n_tok > 1 && p.group == 8 && !q8 &&
      a.prepare.k == nullptr && a.window == 0 && (a.head_dim == 64 || a.head_dim == 128)) {
    p.pair_tokens = int(a.n_tok);
  }
  if (a.seq_k != nullptr) {
    return q8   ? launch_decode_mma<kKvQ8, true>(a, workspace, p, stream.raw())
           : f8 ? launch_decode_mma<kKvF8, true>(a, workspace, p, stream.raw())
                : launch_decode_mma<kKvF16, true>(a, workspace, p, stream.raw());
  }
  return q8   ? launch_decode_mma<kKvQ8, false>(a, workspace, p, stream.raw())
         : f8 ? launch_decode_mma<kKvF8, false>(a, workspace, p, stream.raw())
              : launch_decode_mma<kKvF16, false>(a, workspace, p, stream.raw());
}

}  // namespace magnetar::cuda
