// Top-k selection of the MoE router, shared by the kernel (route_topk.cu, one warp per token) and the host
// test (tests/cuda/cuda_ops_host_test.cu). Expert e belongs to lane e % 32 (bit e / 32 of the lane's `taken`
// mask); each round every lane offers its best untaken expert and the warp keeps the best offer. "Best" is
// the CPU route()'s order: the larger logit, and on equal logits the lower expert id (torch.topk on CPU). That
// is a strict total order on (logit, id) for non-NaN logits, so the winner does not depend on the order in
// which the offers are compared: the warp's butterfly and the host's loop pick the same expert.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#ifndef MAGNETAR_HD
#define MAGNETAR_HD __host__ __device__ __forceinline__
#endif

namespace magnetar::cuda::route {

constexpr int kLanes = 32;
constexpr int kMaxExperts = 32 * kLanes;  // one bit per expert in each lane's 32-bit mask
constexpr int kMaxK = kLanes;             // lane j keeps the j-th weight

// Whether (va, ia) is selected before (vb, ib).
MAGNETAR_HD bool ranks_before(float va, int ia, float vb, int ib) { return va > vb || (va == vb && ia < ib); }

// The best untaken expert among lane's (e = lane, lane + 32, ...), or id INT_MAX (ranks after every expert)
// when the lane has none left.
MAGNETAR_HD void lane_best(const float* logits, int n_expert, int lane, uint32_t taken, float* value, int* id) {
  float bv = -INFINITY;
  int bi = INT_MAX;
  for (int e = lane, bit = 0; e < n_expert; e += kLanes, ++bit) {
    if ((taken >> bit) & 1u) continue;
    if (ranks_before(logits[e], e, bv, bi)) {
      bv = logits[e];
      bi = e;
    }
  }
  *value = bv;
  *id = bi;
}

}  // namespace magnetar::cuda::route
