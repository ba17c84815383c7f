// MoE router: softmax over the expert logits, top-k, optional renormalization (Qwen3Model::route() in
// models/qwen3_moe/qwen3_moe.cpp, operation for operation: the max in float, the float difference l - max
// exponentiated in double, the sum in double, weight = float(exp / sum), renormalized as float(w / sum of the
// k float weights in double)).
//
// With a table (decode), lane j also writes the grouped-matvec item of the token's slot j (RouteArgs::table), so
// decode needs no separate launch to turn ids into items.
//
// One warp per token: the logits go to shared memory, lane-strided max and double sum, then k rounds of a
// warp arg-max (route_topk.cuh). Cost per token: 4 * n_expert bytes read, 8 * k written, n_expert double
// exps (~20 instructions each) and k * (n_expert / 32 + 10) compare steps: a decode token (128 experts, k 8)
// is a few us of latency, bound by the launch and the serial rounds, not by memory. Ids are exact (only
// comparisons); weights differ from the CPU's only where CUDA's double exp (<= 1 ulp) or the double sum's
// order moves a value across a float rounding boundary (one float ulp).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/route_topk.cuh"

namespace magnetar::cuda {
namespace {

using route::kLanes;

__global__ void __launch_bounds__(kLanes)
    route_topk_kernel(const float* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ weights,
                      int n_expert, int k, bool normalize, const void* const* __restrict__ table,
                      GroupItem* __restrict__ items, int32_t* __restrict__ x_rows, int32_t* __restrict__ slot_rows) {
  __shared__ float l_s[route::kMaxExperts];
  const int t = int(blockIdx.x);
  const int lane = int(threadIdx.x);
  const float* row = logits + size_t(t) * size_t(n_expert);
  float mx = -INFINITY;
  for (int e = lane; e < n_expert; e += kLanes) {
    l_s[e] = row[e];
    mx = fmaxf(mx, l_s[e]);
  }
  mx = ops::warp_max(mx);
  double sum = 0;
  for (int e = lane; e < n_expert; e += kLanes) sum += exp(double(__fsub_rn(l_s[e], mx)));
  sum = ops::warp_sum(sum);

  // k rounds of a warp arg-max; lane j keeps winner j. Only comparisons in the rounds: the weights and the items
  // are made afterwards by lanes 0 .. k - 1 at once (made inside the rounds, each round waited for lane j's
  // double exp and its table loads: 10.3 us per decode token on the H200, ncu 2026-11-30).
  uint32_t taken = 0;  // bit i: expert lane + 32 i is chosen
  float my_v = 0.0f;
  int my_id = 0;
  for (int j = 0; j < k; ++j) {
    float v;
    int id;
    route::lane_best(l_s, n_expert, lane, taken, &v, &id);
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
      const int oid = __shfl_xor_sync(0xffffffffu, id, offset);
      if (route::ranks_before(ov, oid, v, id)) {
        v = ov;
        id = oid;
      }
    }
    // Every lane now holds the same winner.
    if (id % kLanes == lane) taken |= 1u << (id / kLanes);
    if (lane == j) {
      my_v = v;
      my_id = id;
    }
  }
  const float w = lane < k ? float(exp(double(__fsub_rn(my_v, mx))) / sum) : 0.0f;
  // The sum of the k weights in slot order (as the CPU adds them), then each renormalized.
  double top_sum = 0;
  for (int j = 0; j < k; ++j) top_sum += double(__shfl_sync(0xffffffffu, w, j));
  if (lane < k) {
    const int r = t * k + lane;
    ids[r] = my_id;
    weights[r] = normalize ? float(double(w) / top_sum) : w;
    if (table != nullptr) {  // row r's item for the grouped expert launches
      GroupItem item;
      item.w[0] = table[3 * my_id];
      item.w[1] = table[3 * my_id + 1];
      item.w[2] = table[3 * my_id + 2];
      item.row0 = r;
      item.n = 1;
      items[r] = item;
      x_rows[r] = t;
      slot_rows[r] = r;
    }
  }
}

}  // namespace

Status route_topk(const RouteArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_tok > INT_MAX / route::kMaxK)
    return Status::error(format("route_topk: n_tok=%lld out of range", (long long)a.n_tok));
  if (a.n_expert < 1 || a.n_expert > route::kMaxExperts) {
    return Status::error(
        format("route_topk: n_expert=%lld is outside 1..%d", (long long)a.n_expert, route::kMaxExperts));
  }
  if (a.k < 1 || a.k > a.n_expert || a.k > route::kMaxK) {
    return Status::error(format("route_topk: k=%lld is outside 1..min(n_expert=%lld, %d)", (long long)a.k,
                                (long long)a.n_expert, route::kMaxK));
  }
  if (a.logits == nullptr || a.ids == nullptr || a.weights == nullptr)
    return Status::error("route_topk: null device pointer");
  if (!ops::aligned(a.logits, 4) || !ops::aligned(a.ids, 4) || !ops::aligned(a.weights, 4)) {
    return Status::error("route_topk: logits, ids and weights must be 4-byte aligned");
  }
  if (a.table != nullptr && (a.items == nullptr || a.x_rows == nullptr || a.slot_rows == nullptr)) {
    return Status::error("route_topk: a table needs items, x_rows and slot_rows");
  }
  route_topk_kernel<<<unsigned(a.n_tok), kLanes, 0, stream.raw()>>>(a.logits, a.ids, a.weights, int(a.n_expert),
                                                                    int(a.k), a.normalize, a.table, a.items,
                                                                    a.x_rows, a.slot_rows);
  CUDA_CHECK(cudaGetLastError());
  return Status();
}

}  // namespace magnetar::cuda
