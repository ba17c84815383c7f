// NeoX rotary embedding in place (cpu::rope_neox): x [n_tok, n_head, head_dim], element i of a head paired
// with element i + head_dim / 2.
//
// Cost: 8 bytes per element (read and write x), 6 flops per pair, and per CTA head_dim / 2 double-precision
// (pow, sin, cos) evaluations for the angle table, shared by the CTA's heads. Memory-bound for prefill; for a
// decode token (q: 32 heads x 128 = 16 KB) it is launch-latency bound (a few us).
//
// The rotation is written with __fmul_rn / __fadd_rn so that nvcc does not contract it into FMAs: the CPU op
// (compiled without FMA) rounds each product, and with the same cos/sin the results are then bit-identical.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/rope.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kHeadsPerCta = 8;
constexpr int kMaxHalf = 512;

// Grid: (n_tok, ceil(n_head / kHeadsPerCta)).
__global__ void __launch_bounds__(kThreads)
    rope_neox_kernel(float* __restrict__ x, const int32_t* __restrict__ positions, int n_head, int head_dim,
                     float theta) {
  ops::pdl_wait();
  ops::pdl_trigger();
  __shared__ float cs[kMaxHalf];
  __shared__ float sn[kMaxHalf];
  const int half = head_dim / 2;
  const int t = int(blockIdx.x);
  const int32_t pos = positions[t];
  for (int i = int(threadIdx.x); i < half; i += kThreads) rope::cos_sin(pos, i, head_dim, theta, &cs[i], &sn[i]);
  __syncthreads();
  const int h0 = int(blockIdx.y) * kHeadsPerCta;
  const int h1 = min(n_head, h0 + kHeadsPerCta);
  for (int k = int(threadIdx.x); k < (h1 - h0) * half; k += kThreads) {
    const int h = h0 + k / half;
    const int i = k % half;
    float* v = x + (size_t(t) * size_t(n_head) + size_t(h)) * size_t(head_dim);
    const float a = v[i];
    const float b = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]));
    v[i + half] = __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, sn[i]));
  }
}

}  // namespace

Status rope_neox(const RopeArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n_tok > INT_MAX || a.n_head < 1 || a.n_head > INT_MAX / 2) {
    return Status::error(
        format("rope_neox: n_tok=%lld, n_head=%lld out of range", (long long)a.n_tok, (long long)a.n_head));
  }
  if (a.head_dim < 2 || a.head_dim % 2 != 0 || a.head_dim > 2 * kMaxHalf) {
    return Status::error(
        format("rope_neox: head_dim=%lld must be even, in 2..%d", (long long)a.head_dim, 2 * kMaxHalf));
  }
  if (a.x == nullptr || a.positions == nullptr) return Status::error("rope_neox: null device pointer");
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.positions, 4)) {
    return Status::error("rope_neox: x and positions must be 4-byte aligned");
  }
  const dim3 grid(unsigned(a.n_tok), unsigned((a.n_head + kHeadsPerCta - 1) / kHeadsPerCta));
  CUDA_CHECK(ops::launch(rope_neox_kernel, grid, kThreads, 0, stream.raw(), a.x, a.positions, int(a.n_head),
                         int(a.head_dim), a.theta));
  return Status();
}

}  // namespace magnetar::cuda
