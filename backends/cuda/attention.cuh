// Split-K bookkeeping of attention.cu, shared with the host test (tests/cuda/cuda_ops_host_test.cu): how a
// query's context is cut into chunks and splits, and the online-softmax rescaling that lets chunks and splits
// be processed separately and merged. Also the argument checks both attention ops share (attention.cu,
// attention_prefill.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#ifndef MAGNETAR_HD
#define MAGNETAR_HD __host__ __device__ __forceinline__
#endif

namespace magnetar::cuda::attn {

// Cached rows per chunk: one per thread of the CTA in the score phase.
constexpr int kChunk = 128;

// A query attending to `rows` cached rows is cut into ceil(rows / kChunk) chunks (the last one partial), and
// the chunks into n_splits runs of chunks_per_split consecutive chunks (the last run may be shorter, never
// empty). One CTA per (split, KV head).
struct SplitPlan {
  int n_chunks = 0;
  int chunks_per_split = 0;
  int n_splits = 0;
};

// Enough splits for about kWaves CTAs per SM (n_head_kv CTAs per split), at most max_splits and at most one per
// chunk. Short contexts get one split: no partials, no combine kernel. A CTA is latency-bound (its chunks are
// processed one after the other, 4 warps): with 2 CTAs per SM (the first plan) decode at 64K context read K/V
// at ~0.2 TB/s on the H200 (bench, 2026-11-30: 30 t/s on the 30B-A3B geometry, 117 at 2K), so the plan now
// aims at 8.
constexpr int kWaves = 8;
// The split count aimed at (before the cap of one split per chunk): no plan has more splits.
MAGNETAR_HD int split_target(int64_t n_head_kv, int sm_count, int max_splits) {
  const int64_t want = (kWaves * int64_t(sm_count) + n_head_kv - 1) / n_head_kv;
  return int(want > max_splits ? max_splits : want);
}
MAGNETAR_HD SplitPlan plan_splits(int64_t rows, int64_t n_head_kv, int sm_count, int max_splits) {
  SplitPlan p;
  p.n_chunks = int((rows + kChunk - 1) / kChunk);
  int64_t want = split_target(n_head_kv, sm_count, max_splits);
  if (want > p.n_chunks) want = p.n_chunks;
  if (want < 1) want = 1;
  p.chunks_per_split = int((p.n_chunks + want - 1) / want);
  p.n_splits = (p.n_chunks + p.chunks_per_split - 1) / p.chunks_per_split;
  return p;
}

// The cached rows a token at position pos attends to out of `rows` = pos + 1 (all of them, or the last `window`).
MAGNETAR_HD int64_t attended_rows(int64_t window, int64_t rows) { return window > 0 && window < rows ? window : rows; }

// The tensor-core decode kernel's plan (attention_decode_mma): splits of whole kDecodeStep-row steps (its 4 warps
// take 16 rows each per step; plan_decode_rows' step: 128 rows for its 8-warp variants), as many as fill `slots` CTAs
// (the GPU's SMs times the kernel's CTAs per SM: one wave, every CTA's loads pipelined over its whole run) over the
// n_head_kv heads, at most max_splits and at most one per step. Fewer, longer splits than plan_splits: a CTA's prologue
// (Q) and epilogue (warp merge, partial record) are paid once per split, and the splits' records are few enough for
// the last CTA to combine them.
constexpr int kDecodeStep = 64;
struct DecodePlan {
  int rows_per_split = 0;  // a multiple of the step (kDecodeStep by default)
  int n_splits = 0;
};
MAGNETAR_HD int64_t decode_split_target(int64_t n_head_kv, int slots, int max_splits) {
  const int64_t want = slots / n_head_kv;
  return want < 1 ? 1 : want > max_splits ? max_splits : want;
}
// The plan of `rows` (1..INT_MAX) over `want` splits aimed at (decode_split_target), in 32-bit unsigned arithmetic:
// the decode kernel makes it in every CTA before it issues its first loads, a prologue on the step's critical path (its
// CTAs start about when the launch before them ends), where 64-bit divisions are long instruction sequences.
// step: the rows of one step of all the kernel's warps (kDecodeStep at 4 warps, twice that at 8).
// The split length is made from the rows rounded up to even, so that tokens at positions P and P + 1 with P even (rows
// P + 1 and P + 2) get the same plan (the split count too: P + 1 is odd, never a multiple of the even split length):
// attention_decode_mma's pairs of draft tokens read the rows once for both, each with the bits of its own launch.
MAGNETAR_HD DecodePlan plan_decode_rows(int rows, int want, int step = kDecodeStep) {
  const unsigned r = unsigned(rows), w = unsigned(want), st = unsigned(step);
  const unsigned even = r + (r & 1u);
  unsigned per = even / w + (even % w != 0 ? 1u : 0u);
  per = (per + st - 1u) / st * st;
  if (per < st) per = st;
  DecodePlan d;
  d.rows_per_split = int(per);
  d.n_splits = int(r / per + (r % per != 0 ? 1u : 0u));
  return d;
}
MAGNETAR_HD DecodePlan plan_decode(int64_t rows, int64_t n_head_kv, int slots, int max_splits) {
  return plan_decode_rows(int(rows), int(decode_split_target(n_head_kv, slots, max_splits)));
}
// The most splits plan_decode gives for any row count up to max_rows (a graph's grid).
MAGNETAR_HD int decode_split_bound(int64_t max_rows, int64_t n_head_kv, int slots, int max_splits) {
  const int64_t want = decode_split_target(n_head_kv, slots, max_splits);
  const int64_t steps = (max_rows + kDecodeStep - 1) / kDecodeStep;
  return int(steps < want ? steps : want);
}

// Q8_0 KV in the decode kernel (attention.cu): a head row, head_dim / 32 blocks of 34 bytes (an f16 scale, 32 int8),
// is staged as the 16-byte pieces of the 16-byte-aligned window around it, so that the copies are 16 bytes wide
// whatever the row's alignment. A head row at byte offset `at` starts skew = at % 16 bytes into its window; the
// offsets of head rows are multiples of gcd(head bytes, 16), so skew <= q8_skew_max.
MAGNETAR_HD constexpr int q8_head_bytes(int head_dim) { return head_dim / 32 * 34; }
MAGNETAR_HD constexpr int q8_skew_max(int head_dim) {
  return 16 - (q8_head_bytes(head_dim) % 16 == 0 ? 16 : q8_head_bytes(head_dim) % 8 == 0 ? 8 : 4);
}
MAGNETAR_HD constexpr int q8_window_pieces(int head_dim) {
  return (q8_skew_max(head_dim) + q8_head_bytes(head_dim) + 15) / 16;
}
// The bytes piece `col` of the window around the head row at `at` reads from its start (0..16): the piece's bytes up
// to the row's end (the skew bytes before the row come along, in bounds; nothing past the row is read, so nothing past
// the cache's last row either). The copy zero-fills the rest.
MAGNETAR_HD int q8_piece_bytes(int64_t at, int head_bytes, int col) {
  const int64_t left = at + head_bytes - ((at & ~int64_t(15)) + 16 * int64_t(col));
  return int(left < 0 ? 0 : left > 16 ? 16 : left);
}

// Running softmax state of one query head: the largest score seen (m) and the sum of exp(score - m) (l).
// Accumulated outputs o = sum exp(score - m) v are kept beside it by the caller.
struct SoftmaxState {
  float m = -INFINITY;
  float l = 0.0f;
};

// Moves the state to the max of its scores and a new chunk's (chunk_max, finite) and returns the factor by
// which the caller must scale its accumulated outputs (0 for the first chunk: exp(-inf) = 0). The caller then
// adds the chunk's exp(s - st.m) terms to st.l and its outputs.
MAGNETAR_HD float rescale(SoftmaxState& st, float chunk_max) {
  const float m_new = fmaxf(st.m, chunk_max);
  const float alpha = expf(st.m - m_new);
  st.m = m_new;
  st.l *= alpha;
  return alpha;
}

#ifdef __CUDACC__
// Tensor-core helpers of the two f16 mma kernels (attention_prefill.cu, attention.cu's decode kernel).

// c += A B for one 16x8 tile, f16 inputs, f32 accumulators (mma.m16n8k16, A row-major, B column-major).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, ex2.approx.ftz: within 2 ulp of the rounded result, exactly 1 at 0 and +0 at -inf (PTX ISA 9.7.3.21).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to f16 (nearest even), `lo` in the lower 16 bits.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Shared-memory staging of K/V tiles (attention_prefill.cu, attention.cu's decode kernel).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; valid == false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// The same with the first src_bytes (0..16) of the 16 read and the rest zero-filled.
__device__ __forceinline__ void cp_async16_part(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
#endif

// The argument checks the attention ops share (`op` names the caller in the message): counts, heads and group,
// window, the KV type (F16, or Q8_0 where takes_q8), pointers, alignment (v_cache to v_align bytes), aliasing. Host
// only.
Status check_args(const char* op, const AttentionArgs& a, uintptr_t v_align, bool takes_q8 = false);

}  // namespace magnetar::cuda::attn
