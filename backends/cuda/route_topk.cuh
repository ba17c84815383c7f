// Top-k selection of the MoE router, shared by the kernel (route_topk.cu) and the host test
// (tests/cuda/cuda_ops_host_test.cu). "Before" is the CPU route()'s order: the larger logit, and on equal logits
// the lower expert id (torch.topk on CPU). That is a strict total order on (logit, id) for non-NaN logits, so every
// expert has a distinct rank (the number of experts before it) and the top k are the experts of rank < k, expert
// of rank j in slot j: the kernel's threads rank their experts independently, no sequential rounds.
#pragma once

#include <cstdint>

#ifndef MAGNETAR_HD
#define MAGNETAR_HD __host__ __device__ __forceinline__
#endif

namespace magnetar::cuda::route {

constexpr int kThreads = 512;      // one CTA per token
constexpr int kSumThreads = 128;   // the softmax sum's reduction (its order fixes the weights' bits)
constexpr int kRankParts = kThreads / kSumThreads;  // an expert's rank is counted in this many parts, in parallel
constexpr int kMaxExperts = 1024;  // the logits of a token stay in shared memory
constexpr int kMaxK = 32;          // lane j of warp 0 keeps slot j

// Whether (va, ia) is selected before (vb, ib).
MAGNETAR_HD bool ranks_before(float va, int ia, float vb, int ib) { return va > vb || (va == vb && ia < ib); }

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

}  // namespace magnetar::cuda::route
