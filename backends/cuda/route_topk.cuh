// Top-k selection of the MoE router, shared by the kernel (route_topk.cu) and the host test
// (tests/cuda/cuda_ops_host_test.cu). "Before" is the CPU route()'s order: the larger logit, and on equal logits
// the lower expert id (torch.topk on CPU), with every NaN above +inf, the order of logit_key. That is a strict total
// order on (logit, id), so every expert has a distinct rank (the number of experts before it) and the top k are the
// experts of rank < k, expert of rank j in slot j: the kernel's threads rank their experts independently, no sequential
// rounds. (Compared as floats, a NaN logit ranked before nothing and nothing before it: slots went unwritten and their
// ids were garbage, indices out of bounds on the device and the host.)
#pragma once

#include <cstdint>

#include "backends/cuda/cuda_backend.h"

#ifdef __CUDACC__
#include "backends/cuda/ops_common.cuh"
#endif

#ifndef MAGNETAR_HD
#define MAGNETAR_HD __host__ __device__ __forceinline__
#endif

namespace magnetar::cuda::route {

constexpr int kThreads = 512;      // one CTA per token
constexpr int kSumThreads = 128;   // the softmax sum's reduction (its order fixes the weights' bits)
constexpr int kRankParts = kThreads / kSumThreads;  // an expert's rank is counted in this many parts, in parallel
constexpr int kMaxExperts = 1024;  // the logits of a token stay in shared memory
constexpr int kMaxK = 32;          // lane j of warp 0 keeps slot j

// The unsigned key that orders as the float does (larger key: larger logit), -0 as +0, every NaN above +inf whatever
// its sign bit (torch.topk's order; the device's arithmetic makes every NaN positive, x86's inf - inf is negative, so
// the sign is never read): the CPU's route() orders by the same key (models/qwen3_moe/qwen3_moe.cpp).
MAGNETAR_HD uint32_t logit_key(float v) {
  uint32_t u;
#ifdef __CUDA_ARCH__
  u = __float_as_uint(v);
#else
  __builtin_memcpy(&u, &v, sizeof(u));
#endif
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  if (u == 0x80000000u) u = 0;                              // -0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Whether (va, ia) is selected before (vb, ib).
MAGNETAR_HD bool ranks_before(float va, int ia, float vb, int ib) {
  const uint32_t ka = logit_key(va), kb = logit_key(vb);
  return ka > kb || (ka == kb && ia < ib);
}

// Part q < kRankParts of expert e's rank: how many experts of the q-th part of the ids, [q n / P, (q + 1) n / P), are
// selected before e (the kernel counts the parts in parallel).
MAGNETAR_HD int rank_part(const float* logits, int n_expert, int e, int q) {
  const float v = logits[e];
  int count = 0;
#ifdef __CUDA_ARCH__
#pragma unroll 8
#endif
  for (int o = q * n_expert / kRankParts; o < (q + 1) * n_expert / kRankParts; ++o) {
    count += ranks_before(logits[o], o, v, e) ? 1 : 0;
  }
  return count;
}

// How many experts are selected before expert e: its parts added.
MAGNETAR_HD int rank_of(const float* logits, int n_expert, int e) {
  int rank = 0;
  for (int q = 0; q < kRankParts; ++q) rank += rank_part(logits, n_expert, e, q);
  return rank;
}

#ifdef __CUDACC__
// ---- one warp's routing, for the expert products that route themselves (GroupedMatvecArgs::route) ----------------
// A warp's logits: lane l holds experts l + 32 i (i < kPer), -0 made +0 (as logit_key does).
template <int kPer>
struct WarpLogits {
  float v[kPer];
};
template <int kPer>
__device__ __forceinline__ WarpLogits<kPer> warp_logits(const float* logits, int n_expert, int lane) {
  WarpLogits<kPer> w;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    w.v[i] = e < n_expert ? logits[e] + 0.0f : -INFINITY;
  }
  return w;
}

// The experts of ranks 0 .. n - 1 in ranks_before's order (the larger logit, on equal logits the lower id), by rounds
// of a warp-wide maximum: each round the largest key left, then the lowest id holding it; the chosen key becomes 0
// (the lowest: only a negative NaN has it too). Returns the id of rank n - 1 in every lane; lane j < n also gets the
// id of rank j in *lane_id. Ids past n_expert never win (n <= n_expert).
template <int kPer>
__device__ __forceinline__ int warp_top(const WarpLogits<kPer>& w, int n_expert, int n, int lane, int* lane_id) {
  uint32_t key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) key[i] = lane + 32 * i < n_expert ? logit_key(w.v[i]) : 0u;
  int id = 0;
  for (int r = 0; r < n; ++r) {
    uint32_t best = key[0];
#pragma unroll
    for (int i = 1; i < kPer; ++i) best = max(best, key[i]);
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    uint32_t mine = 0xffffffffu;
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i) {
      if (key[i] == top && lane + 32 * i < n_expert) mine = uint32_t(lane + 32 * i);
    }
    id = int(__reduce_min_sync(0xffffffffu, mine));
#pragma unroll
    for (int i = 0; i < kPer; ++i) key[i] = lane + 32 * i == id ? 0u : key[i];
    if (lane == r) *lane_id = id;
  }
  return id;
}

// Lane j < k: the weight of slot j, whose expert is lane_id (warp_top's), as route_topk computes it: the float
// maximum of the logits; exp(double(l - max)) summed in route_topk's order (its thread t < kSumThreads adds experts
// t, t + kSumThreads, ..., each warp of those threads is added over warp_sum's tree, the warps' sums in order);
// float(exp / sum), then renormalized by the double sum of the k float weights in slot order.
template <int kPer>
__device__ __forceinline__ float warp_weight(const WarpLogits<kPer>& w, int n_expert, int k, bool normalize, int lane,
                                             int lane_id) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (lane + 32 * i < n_expert) mx = fmaxf(mx, w.v[i]);
  }
  mx = ops::warp_max(mx);
  constexpr int kSumWarps = kSumThreads / 32;
  double sum = 0;
#pragma unroll
  for (int sw = 0; sw < kSumWarps; ++sw) {  // route_topk's warp sw: experts 32 sw + lane + kSumThreads m
    double part = 0;
#pragma unroll
    for (int i = sw; i < kPer; i += kSumWarps) {
      if (lane + 32 * i < n_expert) part += exp(double(__fsub_rn(w.v[i], mx)));
    }
    sum += ops::warp_sum(part);
  }
  // The chosen expert's logit from its lane (lane_id % 32 holds it at index lane_id / 32).
  float l = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float v = __shfl_sync(0xffffffffu, w.v[i], lane_id & 31);
    if (i == lane_id >> 5) l = v;
  }
  const float weight = lane < k ? float(exp(double(__fsub_rn(l, mx))) / sum) : 0.0f;
  double top_sum = 0;
  for (int j = 0; j < k; ++j) top_sum += double(__shfl_sync(0xffffffffu, weight, j));
  return normalize ? float(double(weight) / top_sum) : weight;
}

// The routing warp of a launch that writes the combine's items (RouteInProducts::ids set): lane j < k writes slot j's
// expert (lane_id, warp_top's), its weight (warp_weight) and slot row j, what route_topk writes.
template <int kPer>
__device__ __forceinline__ void write_routes(const RouteInProducts& r, int lane, int lane_id) {
  const auto logits = warp_logits<kPer>(r.logits, r.n_expert, lane);
  const float wt = warp_weight(logits, r.n_expert, r.k, r.normalize, lane, lane_id);
  if (lane < r.k) {
    r.ids[lane] = lane_id;
    r.weights[lane] = wt;
    r.slot_rows[lane] = lane;
  }
}
#endif

}  // namespace magnetar::cuda::route
