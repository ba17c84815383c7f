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
#endif

// The argument checks attention() and attention_prefill_mma() share (`op` names the caller in the message): counts,
// heads and group, window, pointers, alignment (v_cache to v_align bytes), aliasing. Host only.
Status check_args(const char* op, const AttentionArgs& a, uintptr_t v_align);

}  // namespace magnetar::cuda::attn
