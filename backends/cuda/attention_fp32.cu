// attention() on FP32 cores (the numerics of cpu::attention with kv_type F16; every head size up to
// kMaxAttentionHeadDim): decode with split-K (attn::plan_splits, a combine launch), prefill with the same
// per-(token, KV head) kernel run over the whole context. attention.cu holds the host side (arguments, plan) and the
// tensor-core decode kernel; its header comment has the cost model both share.
//
// CTA of 128 threads, one (split or token, KV head), its `group` query heads together:
//   scores:  thread j takes cached row j of the chunk, reads the K row with 16-byte loads (the 128 rows of a
//            chunk, 32 KB at head_dim 128, stay in L1 while the warp's loads walk them) and dots it with the
//            group's queries, held in shared memory (broadcast reads);
//   softmax: one warp per query head: chunk max, online rescale (attention.cuh), exp(s - m) written back;
//   p * V:   thread tid takes 8 output elements of every query head of the group (one 16-byte V load per row)
//            for a subset of each chunk's rows (D / 8 threads per row, 128 / (D / 8) subsets); the subsets'
//            sums are kept across chunks and folded once at the end, in subset order (deterministic).
// The K and V loops are unrolled so several 16-byte loads are in flight per thread. Against the first version (one
// 2-byte V load per row and thread) this took decode on the 30B-A3B geometry from 135 to 178 t/s at a short
// context, but not the depth: at 64K, K/V still come at ~0.9 TB/s, and ncu still shows ~18 us for a one-chunk
// decode call (H200, 2026-11-30, docs/benchmarks/2026-11-30-cuda-decode-graph.md). At 64K ncu showed 25% occupancy
// (123 registers), issue slots 40% busy and DRAM 19.5%: the scores and p * V of 8 query heads on FP32 cores, ~2,900
// instructions per warp per chunk (docs/benchmarks/2026-11-30-cuda-decode-attention-mma.md: the tensor-core kernel
// that decode runs instead).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/attention_params.cuh"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::attn {
namespace {

constexpr int kThreads = kChunk;
constexpr int kWarps = kThreads / ops::kWarpSize;
constexpr int kMaxHeadDim = int(kMaxAttentionHeadDim);
constexpr int kFold = 4;  // query heads whose p * V sums are folded at a time (red_s: 16 KB)

// The position of the first query token, the chunks per split and the split count this launch runs with.
struct RunPlan {
  int64_t pos0;
  int chunks_per_split;
  int n_splits;
};
__device__ __forceinline__ RunPlan run_plan(const Params& p) {
  if (p.pos0_device == nullptr) return {p.pos0, p.chunks_per_split, p.n_splits};
  const int64_t pos0 = *p.pos0_device;
  const int64_t rows = attn::attended_rows(p.window, pos0 + 1);
  const attn::SplitPlan plan = attn::plan_splits(rows, p.kv_row / p.head_dim, p.sm_count, p.max_splits);
  return {pos0, plan.n_splits > 1 ? plan.chunks_per_split : INT_MAX, plan.n_splits};
}

// Grid: (n_splits, n_head_kv, n_tok); n_splits > 1 only with n_tok == 1.
template <int kMaxGroup>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Params p) {
  ops::pdl_wait();
  ops::pdl_trigger();
  __shared__ __align__(16) float q_s[kMaxGroup * kMaxHeadDim];  // [group, head_dim]
  __shared__ float p_s[kMaxGroup][kChunk];                      // scores, then exp(s - m)
  __shared__ __align__(16) float red_s[kFold][kThreads * 8];    // the row subsets' sums of p * V, kFold heads
  __shared__ attn::SoftmaxState state_s[kMaxGroup];
  __shared__ float alpha_s[kMaxGroup];

  const int split = int(blockIdx.x);
  const int hk = int(blockIdx.y);
  const int t = int(blockIdx.z);
  const int tid = int(threadIdx.x);
  const int D = p.head_dim;
  const int G = p.group;
  const RunPlan plan = run_plan(p);
  if (split >= plan.n_splits) return;  // a graph's grid sized for a longer context: the whole CTA leaves
  const int64_t pos = plan.pos0 + t;
  const int64_t lo = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
  const int n_chunks = int((pos - lo + kChunk) / kChunk);  // ceil((pos - lo + 1) / kChunk)
  const int c_begin = split * plan.chunks_per_split;
  const int c_end = min(n_chunks, c_begin + plan.chunks_per_split);

  const float* q = p.q + (size_t(t) * size_t(p.n_head) + size_t(hk) * size_t(G)) * size_t(D);
  for (int i = tid; i < G * D; i += kThreads) q_s[i] = q[i];
  if (tid < G) state_s[tid] = attn::SoftmaxState();
  __syncthreads();

  // p * V: thread tid takes elements 8e .. 8e + 7 of the output (one 16-byte V load per row), e = tid % n_vec, for
  // the rows part, part + n_parts, ... of each chunk (n_vec = D / 8 threads per row, n_parts row subsets); the
  // subsets' sums are folded once, after the last chunk.
  const int n_vec = D / 8;
  const int n_parts = kThreads / n_vec;
  const int part = tid / n_vec;
  const int e8 = (tid % n_vec) * 8;
  const bool pv_thread = part < n_parts;
  float acc[8][kMaxGroup];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[k][g] = 0.0f;
  }

  const size_t head_off = size_t(hk) * size_t(D);
  for (int c = c_begin; c < c_end; ++c) {
    const int64_t j0 = lo + int64_t(c) * kChunk;
    const int len = int(pos + 1 - j0 < kChunk ? pos + 1 - j0 : kChunk);

    // Scores of row j0 + tid (the loop unrolled so that a row's 16-byte loads are in flight together).
    if (tid < len) {
      const uint16_t* krow = p.k + size_t(j0 + tid) * size_t(p.kv_row) + head_off;
      float s[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; d += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(krow + d);
        const float2 k01 = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
        const float2 k23 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
        const float2 k45 = __half22float2(*reinterpret_cast<const __half2*>(&raw.z));
        const float2 k67 = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < G) {
            const float4 qa = *reinterpret_cast<const float4*>(&q_s[g * D + d]);
            const float4 qb = *reinterpret_cast<const float4*>(&q_s[g * D + d + 4]);
            s[g] += qa.x * k01.x + qa.y * k01.y + qa.z * k23.x + qa.w * k23.y + qb.x * k45.x + qb.y * k45.y +
                    qb.z * k67.x + qb.w * k67.y;
          }
        }
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < G) p_s[g][tid] = s[g] * p.scale;
      }
    }
    __syncthreads();

    // Online softmax, one warp per query head.
    const int warp = tid / ops::kWarpSize;
    const int lane = tid % ops::kWarpSize;
    for (int g = warp; g < G; g += kWarps) {
      float mx = -INFINITY;
      for (int i = lane; i < len; i += ops::kWarpSize) mx = fmaxf(mx, p_s[g][i]);
      mx = ops::warp_max(mx);
      attn::SoftmaxState st = state_s[g];
      const float alpha = attn::rescale(st, mx);
      float sum = 0.0f;
      for (int i = lane; i < len; i += ops::kWarpSize) {
        const float e = expf(p_s[g][i] - st.m);
        p_s[g][i] = e;
        sum += e;
      }
      sum = ops::warp_sum(sum);
      __syncwarp();  // every lane has read state_s[g] before lane 0 replaces it
      if (lane == 0) {
        st.l += sum;
        state_s[g] = st;
        alpha_s[g] = alpha;
      }
    }
    __syncthreads();

    // Accumulate p * V.
    if (pv_thread) {
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < G) {
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[k][g] *= alpha_s[g];
        }
      }
      const uint16_t* vcol = p.v + size_t(j0) * size_t(p.kv_row) + head_off + size_t(e8);
#pragma unroll 4
      for (int i = part; i < len; i += n_parts) {
        const uint4 raw = *reinterpret_cast<const uint4*>(vcol + size_t(i) * size_t(p.kv_row));
        const float2 v01 = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
        const float2 v23 = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
        const float2 v45 = __half22float2(*reinterpret_cast<const __half2*>(&raw.z));
        const float2 v67 = __half22float2(*reinterpret_cast<const __half2*>(&raw.w));
        const float v[8] = {v01.x, v01.y, v23.x, v23.y, v45.x, v45.y, v67.x, v67.y};
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < G) {
            const float pg = p_s[g][i];
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k][g] += pg * v[k];
          }
        }
      }
    }
    __syncthreads();  // p_s and alpha_s are rewritten by the next chunk
  }

  // Fold the row subsets, kFold query heads at a time, in subset order (deterministic), and write the output (one
  // split) or the split's partial record.
  const int h0 = hk * G;
#pragma unroll
  for (int g0 = 0; g0 < kMaxGroup; g0 += kFold) {
    if (g0 >= G) break;
    if (pv_thread) {
#pragma unroll
      for (int gg = 0; gg < kFold; ++gg) {
#pragma unroll
        for (int k = 0; k < 8; ++k) red_s[gg][tid * 8 + k] = acc[k][g0 + gg];
      }
    }
    __syncthreads();
    for (int o = tid; o < kFold * D; o += kThreads) {
      const int gg = o / D, d = o % D, g = g0 + gg;
      if (g >= G) break;
      float sum = 0.0f;
      for (int k = 0; k < n_parts; ++k) sum += red_s[gg][(k * n_vec + d / 8) * 8 + d % 8];
      if (plan.n_splits == 1) {
        p.out[(size_t(t) * size_t(p.n_head) + size_t(h0 + g)) * size_t(D) + size_t(d)] = sum / state_s[g].l;
      } else {
        float* rec = p.partials + (size_t(h0 + g) * size_t(plan.n_splits) + size_t(split)) * size_t(D + 2);
        rec[d] = sum;
        if (d == 0) {
          rec[D] = state_s[g].m;
          rec[D + 1] = state_s[g].l;
        }
      }
    }
    __syncthreads();  // red_s is rewritten by the next heads
  }
}

// Merges the n_splits partials of each query head of a decode token: grid n_head, kThreads threads. A run plan of
// one split (a graph's launch at a short context) has nothing to merge: attention_kernel wrote the output.
// Every loop over the splits is spread over the CTA (the maxima and weights one split per thread, the numerators
// split by warp, element by lane) and each sum is folded in a fixed order. A first version walked all splits in
// every thread, one dependent L2 load after the other: ~150 us per layer at 64K context (256 splits), most of
// the decode time at depth.
__global__ void __launch_bounds__(kThreads) attention_combine_kernel(const Params p) {
  ops::pdl_wait();
  ops::pdl_trigger();
  constexpr int kPerLane = kMaxHeadDim / ops::kWarpSize;
  __shared__ float w_s[kMaxAttentionSplits];
  __shared__ float o_s[kWarps][kMaxHeadDim];
  __shared__ float red_s[kWarps];
  const int n_splits = run_plan(p).n_splits;
  if (n_splits == 1) return;
  const int D = p.head_dim;
  const int stride = D + 2;
  const int h = int(blockIdx.x);
  const int tid = int(threadIdx.x);
  const int warp = tid / ops::kWarpSize;
  const int lane = tid % ops::kWarpSize;
  const float* base = p.partials + size_t(h) * size_t(n_splits) * size_t(stride);

  // The largest split maximum.
  float m = -INFINITY;
  for (int s = tid; s < n_splits; s += kThreads) m = fmaxf(m, base[s * stride + D]);
  m = ops::warp_max(m);
  if (lane == 0) red_s[warp] = m;
  __syncthreads();
  m = red_s[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red_s[w]);
  __syncthreads();  // red_s is reused for the denominator

  // Each split's weight exp(m_s - m) and the denominator sum_s w_s l_s.
  float l = 0.0f;
  for (int s = tid; s < n_splits; s += kThreads) {
    const float w = expf(base[s * stride + D] - m);
    w_s[s] = w;
    l += w * base[s * stride + D + 1];
  }
  l = ops::warp_sum(l);
  if (lane == 0) red_s[warp] = l;
  __syncthreads();
  l = red_s[0];
  for (int w = 1; w < kWarps; ++w) l += red_s[w];

  // Numerators: warp w takes splits w, w + kWarps, ...; lane takes elements lane, lane + 32, ...
  float o[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) o[k] = 0.0f;
#pragma unroll 4
  for (int s = warp; s < n_splits; s += kWarps) {
    const float w = w_s[s];
    const float* rec = base + size_t(s) * size_t(stride);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + k * ops::kWarpSize;
      if (d < D) o[k] += w * rec[d];
    }
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int d = lane + k * ops::kWarpSize;
    if (d < D) o_s[warp][d] = o[k];
  }
  __syncthreads();
  for (int d = tid; d < D; d += kThreads) {
    float sum = o_s[0][d];
    for (int w = 1; w < kWarps; ++w) sum += o_s[w][d];
    p.out[size_t(h) * size_t(D) + size_t(d)] = sum / l;
  }
}

template <int kMaxGroup>
void launch_group(const Params& p, dim3 grid, cudaStream_t stream) {
  CUDA_CHECK(ops::launch(attention_kernel<kMaxGroup>, grid, kThreads, 0, stream, p));
}

}  // namespace

void launch_fp32(const Params& p, dim3 grid, cudaStream_t stream) {
  if (p.group <= 4) {
    launch_group<4>(p, grid, stream);
  } else if (p.group <= 8) {
    launch_group<8>(p, grid, stream);
  } else {
    launch_group<16>(p, grid, stream);
  }
}

void launch_fp32_combine(const Params& p, int grid_splits, int64_t n_head, cudaStream_t stream) {
  if (grid_splits == 1) return;
  CUDA_CHECK(ops::launch(attention_combine_kernel, unsigned(n_head), kThreads, 0, stream, p));
}

}  // namespace magnetar::cuda::attn
