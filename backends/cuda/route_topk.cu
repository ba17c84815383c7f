// MoE router: softmax over the expert logits, top-k, optional renormalization (Qwen3Model::route() in
// models/qwen3_moe/qwen3_moe.cpp, operation for operation: the max in float, the float difference l - max
// exponentiated in double, the sum in double, weight = float(exp / sum), renormalized as float(w / sum of the
// k float weights in double)).
//
// With a table (decode), lane j also writes the grouped-matvec item of the token's slot j (RouteArgs::table), so
// decode needs no separate launch to turn ids into items.
//
// One CTA of 512 threads per token: the logits go to shared memory; max and double sum over the CTA; each expert's
// rank against all (route_topk.cuh: the rank is the slot) is counted in 4 parts by 4 threads, so the selection is
// n_expert / 128 * n_expert / 4 independent compares per thread instead of k dependent rounds of a warp arg-max. The
// rounds took 10.3 us per decode token on the H200 (ncu 2026-11-30: one warp, ~1,900 instructions in a dependent
// chain, the weight's double exp and the item's table loads inside each round; 6.8 us with those moved after the
// rounds); one thread per expert (128 threads) took 7.04 us (ncu 2026-12-01, ~1,200 instructions per warp at IPC
// 0.56: the 128-compare loop), the 4 parts 5.92 us, tg128 340.2 / 340.8 t/s against 337.9 in the same device call
// (docs/benchmarks/2026-12-01-cuda-moe-decode-fused.md).
// Cost per token: 4 * n_expert bytes read, 8 * k written, n_expert double exps, n_expert^2 compares (128 experts:
// 32 per thread; 1,024: 2,048). Ids are exact (only comparisons); weights differ from the CPU's only where CUDA's
// double exp (<= 1 ulp) or the double sum's order moves a value across a float rounding boundary (one float ulp).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/route_topk.cuh"

namespace magnetar::cuda {
namespace {

using route::kSumThreads;
using route::kThreads;
constexpr int kWarps = kThreads / ops::kWarpSize;
constexpr int kSumWarps = kSumThreads / ops::kWarpSize;
using route::kRankParts;

// Grid: n_tok CTAs of kThreads. The logits go to shared memory, their max over all warps. Expert e's rank (the number
// of experts selected before it, route_topk.cuh) is counted in kRankParts parts (route::rank_part), part q against
// the experts of the q-th quarter of the ids, by kRankParts threads at once (32 compares each for 128 experts where
// one thread made 128: the chain of one thread was most of the kernel's time). Threads 0 .. kSumThreads - 1 also make
// the softmax terms and their double sum in the order of the CPU-matching reduction (thread i: experts i,
// i + kSumThreads, ...; then the warp tree; then the warps in order), add up the ranks' parts, and the expert of rank
// j < k is slot j. Then lanes j < k of warp 0 make slot j's weight, id and item at once.
__global__ void __launch_bounds__(kThreads)
    route_topk_kernel(const float* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ weights,
                      int n_expert, int k, bool normalize, const void* const* __restrict__ table,
                      GroupItem* __restrict__ items, int32_t* __restrict__ x_rows, int32_t* __restrict__ slot_rows) {
  __shared__ float l_s[route::kMaxExperts];
  __shared__ double exp_s[route::kMaxExperts];
  __shared__ uint16_t part_s[kRankParts][route::kMaxExperts];
  __shared__ const void* table_s[3 * route::kMaxExperts];
  __shared__ float max_s[kWarps];
  __shared__ double sum_s[kSumWarps];
  __shared__ int slot_s[route::kMaxK];
  const int t = int(blockIdx.x);
  const int tid = int(threadIdx.x);
  // The expert table is no kernel's output (RouteArgs::table): staged before waiting for the kernel before, so the
  // items at the end read shared memory instead of waiting on global loads that depend on the selection.
  if (table != nullptr) {
    for (int i = tid; i < 3 * n_expert; i += kThreads) table_s[i] = table[i];
  }
  ops::pdl_wait();
  ops::pdl_trigger();
  const int warp = tid / ops::kWarpSize, lane = tid % ops::kWarpSize;
  const float* row = logits + size_t(t) * size_t(n_expert);
  float mx = -INFINITY;
  for (int e = tid; e < n_expert; e += kThreads) {
    l_s[e] = row[e];
    mx = fmaxf(mx, l_s[e]);
  }
  mx = ops::warp_max(mx);
  if (lane == 0) max_s[warp] = mx;
  __syncthreads();
  mx = max_s[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, max_s[w]);

  // The ranks' parts: pair p is expert p % n_expert against the part p / n_expert of the ids.
  for (int p = tid; p < kRankParts * n_expert; p += kThreads) {
    part_s[p / n_expert][p % n_expert] = uint16_t(route::rank_part(l_s, n_expert, p % n_expert, p / n_expert));
  }
  // The softmax denominator in double (exp of the float difference, as the CPU).
  double part = 0;
  if (tid < kSumThreads) {
    for (int e = tid; e < n_expert; e += kSumThreads) {
      exp_s[e] = exp(double(__fsub_rn(l_s[e], mx)));
      part += exp_s[e];
    }
    part = ops::warp_sum(part);
    if (lane == 0) sum_s[warp] = part;
  }
  __syncthreads();
  if (tid < kSumThreads) {
    for (int e = tid; e < n_expert; e += kSumThreads) {
      int rank = 0;
      for (int q = 0; q < kRankParts; ++q) rank += part_s[q][e];
      if (rank < k) slot_s[rank] = e;
    }
  }
  __syncthreads();
  if (warp != 0) return;
  double sum = 0;
  for (int w = 0; w < kSumWarps; ++w) sum += sum_s[w];

  const int id = lane < k ? slot_s[lane] : 0;
  const float w = lane < k ? float(exp_s[id] / sum) : 0.0f;
  // The sum of the k weights in slot order (as the CPU adds them), then each renormalized.
  double top_sum = 0;
  for (int j = 0; j < k; ++j) top_sum += double(__shfl_sync(0xffffffffu, w, j));
  if (lane < k) {
    const int r = t * k + lane;
    ids[r] = id;
    weights[r] = normalize ? float(double(w) / top_sum) : w;
    if (table != nullptr) {  // row r's item for the grouped expert launches
      GroupItem item;
      item.w[0] = table_s[3 * id];
      item.w[1] = table_s[3 * id + 1];
      item.w[2] = table_s[3 * id + 2];
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
  CUDA_CHECK(ops::launch(route_topk_kernel, unsigned(a.n_tok), kThreads, 0, stream.raw(), a.logits, a.ids, a.weights,
                         int(a.n_expert), int(a.k), a.normalize, a.table, a.items, a.x_rows, a.slot_rows));
  return Status();
}

}  // namespace magnetar::cuda
