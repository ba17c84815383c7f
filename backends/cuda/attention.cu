// Causal GQA attention over an F16 KV cache (cpu::attention with kv_type F16): decode with split-K, prefill
// with the same per-(token, KV head) kernel run over the whole context.
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
// decode call (H200, 2026-11-30, docs/benchmarks/2026-11-30-cuda-decode-graph.md). Not profiled at depth yet.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

using attn::kChunk;
constexpr int kThreads = attn::kChunk;
constexpr int kWarps = kThreads / ops::kWarpSize;
constexpr int kMaxHeadDim = int(kMaxAttentionHeadDim);
constexpr int kFold = 4;  // query heads whose p * V sums are folded at a time (red_s: 16 KB)

struct Params {
  const float* q;     // [n_tok, n_head, head_dim]
  const uint16_t* k;  // [n_ctx, n_head_kv, head_dim]
  const uint16_t* v;
  float* out;       // [n_tok, n_head, head_dim]
  float* partials;  // [n_head, n_splits, head_dim + 2] (n_splits > 1 only)
  int64_t kv_row;   // elements per cached position: n_head_kv * head_dim
  int64_t pos0;
  int64_t window;
  int n_head;
  int head_dim;
  int group;
  int chunks_per_split;
  int n_splits;
  float scale;
  // Decode in a CUDA graph: pos0 read here at run time, the plan made on the device (plan_splits with
  // sm_count and max_splits); the grid has room for the largest plan.
  const int32_t* pos0_device;
  int sm_count;
  int max_splits;
};

// The position of the first query token, the chunks per split and the split count this launch runs with.
struct RunPlan {
  int64_t pos0;
  int chunks_per_split;
  int n_splits;
};
__device__ __forceinline__ RunPlan run_plan(const Params& p) {
  if (p.pos0_device == nullptr) return {p.pos0, p.chunks_per_split, p.n_splits};
  const int64_t pos0 = *p.pos0_device;
  const int64_t rows = p.window > 0 && p.window < pos0 + 1 ? p.window : pos0 + 1;
  const attn::SplitPlan plan = attn::plan_splits(rows, p.kv_row / p.head_dim, p.sm_count, p.max_splits);
  return {pos0, plan.n_splits > 1 ? plan.chunks_per_split : INT_MAX, plan.n_splits};
}

// Grid: (n_splits, n_head_kv, n_tok); n_splits > 1 only with n_tok == 1.
template <int kMaxGroup>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Params p) {
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
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  attention_kernel<kMaxGroup><<<grid, kThreads, 0, stream>>>(p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---- AttentionWorkspace -------------------------------------------------------------------------------------

Result<AttentionWorkspace> AttentionWorkspace::create(int64_t max_heads, int64_t max_head_dim) {
  if (max_heads < 1 || max_heads > INT_MAX || max_head_dim < 1 || max_head_dim > kMaxAttentionHeadDim) {
    return Status::error(format("AttentionWorkspace: max_heads=%lld must be positive, max_head_dim=%lld in 1..%lld",
                                (long long)max_heads, (long long)max_head_dim, (long long)kMaxAttentionHeadDim));
  }
  const size_t floats = size_t(max_heads) * size_t(kMaxAttentionSplits) * size_t(max_head_dim + 2);
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::allocate(floats * sizeof(float)));
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  AttentionWorkspace ws;
  ws.scratch_ = std::move(scratch);
  ws.max_heads_ = max_heads;
  ws.max_head_dim_ = max_head_dim;
  ws.sm_count_ = sms > 0 ? sms : 1;
  return Result<AttentionWorkspace>(std::move(ws));
}

// ---- attention ------------------------------------------------------------------------------------------------

namespace attn {

Status check_args(const char* op, const AttentionArgs& a, uintptr_t v_align) {
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
  if (a.q == nullptr || a.k_cache == nullptr || a.v_cache == nullptr || a.out == nullptr) {
    return Status::error(format("%s: null device pointer (q, k_cache, v_cache or out)", op));
  }
  if (!ops::aligned(a.q, 4) || !ops::aligned(a.k_cache, 16) || !ops::aligned(a.v_cache, v_align) ||
      !ops::aligned(a.out, 4)) {
    return Status::error(format("%s: k_cache must be 16-byte, v_cache %d-byte, q and out 4-byte aligned", op,
                                int(v_align)));
  }
  if (a.out == a.q) return Status::error(format("%s: out must not alias q", op));
  return Status();
}

}  // namespace attn

Status attention(const AttentionArgs& a, AttentionWorkspace& workspace, Stream& stream) {
  MAGNETAR_RETURN_IF_ERROR(attn::check_args("attention", a, 16));  // 16-byte K and V loads
  if (a.head_dim < 8 || a.head_dim % 8 != 0 || a.head_dim > kMaxAttentionHeadDim) {
    return Status::error(format("attention: head_dim=%lld must be a multiple of 8 in 8..%lld", (long long)a.head_dim,
                                (long long)kMaxAttentionHeadDim));
  }

  const int64_t group = a.n_head / a.n_head_kv;
  Params p;  // C++17 (nvcc): no designated initializers
  p.q = a.q;
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.out = a.out;
  p.partials = workspace.partials();
  p.kv_row = a.n_head_kv * a.head_dim;
  p.pos0 = a.pos0;
  p.window = a.window;
  p.n_head = int(a.n_head);
  p.head_dim = int(a.head_dim);
  p.group = int(group);
  p.chunks_per_split = INT_MAX;
  p.n_splits = 1;
  p.scale = a.scale;
  p.pos0_device = a.pos0_device;
  p.sm_count = workspace.sm_count();
  p.max_splits = int(kMaxAttentionSplits);
  int grid_splits = 1;
  if (a.pos0_device != nullptr) {
    if (a.n_tok != 1 || a.max_rows < 1 || a.max_rows > INT_MAX) {
      return Status::error(format("attention: pos0_device takes n_tok=1 (got %lld) and max_rows in 1..%d (got %lld)",
                                  (long long)a.n_tok, INT_MAX, (long long)a.max_rows));
    }
    // Room for the largest plan of any row count up to max_rows: one split per chunk up to the target.
    const int64_t rows = a.window > 0 && a.window < a.max_rows ? a.window : a.max_rows;
    const int target = attn::split_target(a.n_head_kv, workspace.sm_count(), int(kMaxAttentionSplits));
    grid_splits = int(std::min<int64_t>((rows + attn::kChunk - 1) / attn::kChunk, target));
  } else if (a.n_tok == 1) {
    const int64_t rows = a.window > 0 && a.window < a.pos0 + 1 ? a.window : a.pos0 + 1;
    const attn::SplitPlan plan = attn::plan_splits(rows, a.n_head_kv, workspace.sm_count(), int(kMaxAttentionSplits));
    if (plan.n_splits > 1) {
      p.chunks_per_split = plan.chunks_per_split;
      p.n_splits = plan.n_splits;
    }
    grid_splits = p.n_splits;
  }
  if (grid_splits > 1 && (a.n_head > workspace.max_heads() || a.head_dim > workspace.max_head_dim())) {
    return Status::error(format("attention: %lld heads of %lld exceed the workspace (%lld heads of %lld)",
                                (long long)a.n_head, (long long)a.head_dim, (long long)workspace.max_heads(),
                                (long long)workspace.max_head_dim()));
  }
  const dim3 grid(unsigned(grid_splits), unsigned(a.n_head_kv), unsigned(a.n_tok));
  if (group <= 4) {
    launch<4>(p, grid, stream.raw());
  } else if (group <= 8) {
    launch<8>(p, grid, stream.raw());
  } else {
    launch<16>(p, grid, stream.raw());
  }
  if (grid_splits > 1) {
    attention_combine_kernel<<<unsigned(a.n_head), kThreads, 0, stream.raw()>>>(p);
    CUDA_CHECK(cudaGetLastError());
  }
  return Status();
}

}  // namespace magnetar::cuda
