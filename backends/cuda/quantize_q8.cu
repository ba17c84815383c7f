// Activation quantization for the matrix-vector kernels: float32 rows -> Q8_0, Q8_1 or Q8_K blocks,
// byte-identical with the reference quantizers in quant/ref (legacy.cpp: quantize_q8_0 / quantize_q8_1;
// k_quants.cpp: quantize_q8_k), so that matvec's integer dots see exactly the activations the reference
// dot products are given in the tests.
//
// Why the bytes match: every value goes through the same IEEE float32 operations as the reference, each
// correctly rounded on both sides (nvcc's default -prec-div=true makes '/' and '1.0f / d' exact-rounded;
// no expression here has a multiply feeding an add, so FMA contraction cannot change a result):
//   Q8_0 / Q8_1  d = amax / 127, id = 1 / d (0 when d is 0), q = roundf(x * id) (half away from zero, as
//                std::round), d stored with round-to-nearest-even fp16 (as float_to_fp16, overflow to inf);
//                Q8_1 adds s = fp16(float(sum q) * d) with the float d before its fp16 rounding.
//   Q8_K         the first element of largest magnitude (ties: the lowest index, keeping its sign) gives
//                iscale = -127 / max; q = min(rint(iscale * x), 127) (nearest_int is round-half-even);
//                d = 1 / iscale; bsums = per-16 sums of q; an all-zero block is all zero bytes.
// One warp per block (Q8_0/Q8_1: one element per lane; Q8_K: eight per lane, element lane + 32k, so loads
// and the qs stores stay coalesced); the per-block code is quantize_q8.cuh's, shared with the fused ops. NaN
// inputs are outside the contract (as for the reference).
#include <cuda_runtime.h>

#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"
#include "quant/formats.h"

namespace magnetar::cuda::detail {
namespace {

using quant::Type;

constexpr int kWarpSize = q8::kWarpSize;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;

// Grid: ceil(n_vectors * blocks_per_row / kWarps) CTAs; warp -> one block (32 or 256 elements, quantize_q8.cuh).
template <q8::Act kA>
__global__ void __launch_bounds__(kThreads)
    quantize_q8_kernel(const float* __restrict__ x, uint8_t* __restrict__ out, size_t out_row_bytes, int64_t cols,
                       int64_t blocks_per_row, int64_t n_blocks) {
  ops::pdl_wait();
  ops::pdl_trigger();
  const int64_t gb = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  if (gb >= n_blocks) return;  // whole warps leave together: the shuffles stay full-warp
  const int64_t v = gb / blocks_per_row;
  q8::block<kA>(x + v * cols, out + size_t(v) * out_row_bytes, int(gb % blocks_per_row), lane);
}

unsigned grid_for(int64_t n_blocks) { return unsigned((n_blocks + kWarps - 1) / kWarps); }

}  // namespace

bool launch_quantize_q8(quant::Type act_type, const float* x, void* out, size_t out_row_bytes, int64_t cols,
                        int64_t n_vectors, CUstream_st* stream) {
  auto* dst = static_cast<uint8_t*>(out);
  auto run = [&](auto kernel, int64_t block) {
    const int64_t per_row = cols / block;
    const int64_t n = per_row * n_vectors;
    CUDA_CHECK(ops::launch(kernel, grid_for(n), kThreads, 0, stream, x, dst, out_row_bytes, cols, per_row, n));
  };
  switch (act_type) {
    case Type::Q8_0: run(quantize_q8_kernel<q8::Act::kQ8_0>, quant::kQK32); break;
    case Type::Q8_1: run(quantize_q8_kernel<q8::Act::kQ8_1>, quant::kQK32); break;
    case Type::Q8_K: run(quantize_q8_kernel<q8::Act::kQ8_K>, quant::kQK_K); break;
    default: return false;
  }
  CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace magnetar::cuda::detail
