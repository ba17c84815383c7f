// The MoE block's glue after the grouped expert products: the weighted sum of each token's expert outputs
// (moe_combine). (Decode's items are built by route_topk.)
//
// Combine reads k rows of n floats per token and writes one (decode, k 8, n 2048: 72 KiB, ~30 ns of HBM at
// 4.8 TB/s, so a launch's ~3 us of latency is the cost).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

// Grid (ceil(n / kCombineThreads), n_tok): one thread per output element. (A first version used one CTA per
// token looping over the columns: 15.7 us per decode token on the H200, ncu, 2026-11-30; latency of one SM.)
constexpr int kCombineThreads = 128;
__global__ void moe_combine_kernel(const float* __restrict__ rows, const int32_t* __restrict__ slot_rows,
                                   const float* __restrict__ weights, float* __restrict__ out, int k, int n) {
  ops::pdl_wait();
  ops::pdl_trigger();
  const int t = int(blockIdx.y);
  const int c = int(blockIdx.x) * kCombineThreads + int(threadIdx.x);
  if (c >= n) return;
  float s = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int r = slot_rows[t * k + j];
    s = fmaf(weights[t * k + j], rows[size_t(r) * size_t(n) + c], s);
  }
  out[size_t(t) * size_t(n) + c] = s;
}

}  // namespace

Status moe_combine(const MoeCombineArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_tok > 65535 || a.k < 1 || a.n < 1 || a.n_tok * a.k > INT_MAX || a.n > INT_MAX) {
    return Status::error(format("moe_combine: n_tok=%lld, k=%lld, n=%lld out of range", (long long)a.n_tok,
                                (long long)a.k, (long long)a.n));
  }
  if (a.rows == nullptr || a.slot_rows == nullptr || a.weights == nullptr || a.out == nullptr) {
    return Status::error("moe_combine: null device pointer");
  }
  const dim3 grid(unsigned((a.n + kCombineThreads - 1) / kCombineThreads), unsigned(a.n_tok));
  CUDA_CHECK(ops::launch(moe_combine_kernel, grid, kCombineThreads, 0, stream.raw(), a.rows, a.slot_rows, a.weights,
                         a.out, int(a.k), int(a.n)));
  return Status();
}

}  // namespace magnetar::cuda
