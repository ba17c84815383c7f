// SwiGLU in place: gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (the CPU's swiglu in
// models/qwen3_moe/qwen3_moe.cpp, same operation order).
//
// Cost: 12 bytes per element (read gate and up, write gate), ~25 flops with the accurate expf (2 ulp; not
// __expf, whose error grows with |x|). Memory-bound: a decode token's 8 experts x 768 elements are 74 KB,
// launch-latency bound; a prefill batch streams at HBM speed. swiglu_quantize also quantizes the result for the
// down projection in the same launch (quantize_q8.cuh's code): one launch instead of two on a decode token. Q8_0/Q8_1
// take a warp per 32-element block; Q8_K a CTA of 256 threads per block, one element each, as swiglu: with a warp
// per block (8 elements per lane) the chain of 8 accurate expf per lane made the fused launch 3% slower in the model
// than the two (MAGNETAR_CUDA_FUSE in models/qwen3_moe/qwen3_moe_cuda.cpp).
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxCtas = 8192;  // grid-stride beyond this: enough CTAs to fill any current GPU

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t count) {
  ops::pdl_wait();
  ops::pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < count; i += stride) {
    gate[i] = ops::silu_mul(gate[i], up[i]);
  }
}

// Grid: ceil(n_blocks / warps per CTA); warp -> activation block gb (row gb / per_row), lane -> the elements
// quantize_q8.cuh gives it (lane + 32k).
template <q8::Act kA>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n_cols, int64_t per_row,
                           int64_t n_blocks, uint8_t* __restrict__ out, size_t out_row_bytes) {
  ops::pdl_wait();
  ops::pdl_trigger();
  constexpr int kWarps = kThreads / ops::kWarpSize;
  constexpr int kElems = q8::block_elems(kA);
  constexpr int kPerLane = kElems / ops::kWarpSize;
  const int64_t gb = int64_t(blockIdx.x) * kWarps + threadIdx.x / ops::kWarpSize;
  const int lane = int(threadIdx.x) % ops::kWarpSize;
  if (gb >= n_blocks) return;  // whole warps leave together
  const int64_t row = gb / per_row, b = gb % per_row;
  const size_t base = size_t(row) * size_t(n_cols) + size_t(b) * kElems;
  float v[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const size_t i = base + size_t(lane + ops::kWarpSize * k);
    v[k] = ops::silu_mul(gate[i], up[i]);
    gate[i] = v[k];
  }
  q8::block_regs<kA>(v, out + size_t(row) * out_row_bytes, int(b), lane);
}

// Q8_K: grid of n_blocks CTAs of kThreads (= 256, the block), thread t -> element t of block blockIdx.x.
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_k_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n_cols, int64_t per_row,
                             uint8_t* __restrict__ out, size_t out_row_bytes) {
  static_assert(kThreads == quant::kQK_K);
  ops::pdl_wait();
  ops::pdl_trigger();
  const int64_t row = int64_t(blockIdx.x) / per_row, b = int64_t(blockIdx.x) % per_row;
  const size_t i = size_t(row) * size_t(n_cols) + size_t(b) * quant::kQK_K + threadIdx.x;
  const float v = ops::silu_mul(gate[i], up[i]);
  gate[i] = v;
  q8::block_q8_k_cta(v, reinterpret_cast<quant::BlockQ8_K*>(out + size_t(row) * out_row_bytes) + b);
}

}  // namespace

Status swiglu(float* gate, const float* up, int64_t count, Stream& stream) {
  if (count < 1) return Status::error(format("swiglu: count=%lld must be positive", (long long)count));
  if (gate == nullptr || up == nullptr) return Status::error("swiglu: null device pointer");
  if (!ops::aligned(gate, 4) || !ops::aligned(up, 4))
    return Status::error("swiglu: gate and up must be 4-byte aligned");
  const int64_t ctas = (count + kThreads - 1) / kThreads;
  CUDA_CHECK(ops::launch(swiglu_kernel, unsigned(ctas < kMaxCtas ? ctas : kMaxCtas), kThreads, 0, stream.raw(), gate,
                         up, count));
  return Status();
}

Status swiglu_quantize(const SwigluQuantizeArgs& a, Stream& stream) {
  const quant::Type t = a.out_type;
  const int64_t block = q8::block_elems(q8::act_of(t));
  if (!detail::is_activation_format(t) || a.n_rows < 1 || a.n_cols < 1 || a.n_cols % block != 0 || a.n_rows * a.n_cols / block > INT_MAX) {
    return Status::error(format("swiglu_quantize: out_type (id %d) must be Q8_0, Q8_1 or Q8_K and n_rows=%lld, "
                                "n_cols=%lld positive with n_cols a multiple of its block",
                                int(t), (long long)a.n_rows, (long long)a.n_cols));
  }
  if (a.gate == nullptr || a.up == nullptr || a.out == nullptr) return Status::error("swiglu_quantize: null pointer");
  if (!ops::aligned(a.gate, 4) || !ops::aligned(a.up, 4) || !ops::aligned(a.out, 4)) {
    return Status::error("swiglu_quantize: gate, up and out must be 4-byte aligned");
  }
  const int64_t per_row = a.n_cols / block, n_blocks = a.n_rows * per_row;
  const size_t row_bytes = detail::act_row_bytes(t, a.n_cols);
  constexpr int kWarps = kThreads / ops::kWarpSize;
  const unsigned grid = unsigned((n_blocks + kWarps - 1) / kWarps);
  auto* out = static_cast<uint8_t*>(a.out);
  switch (t) {
    case quant::Type::Q8_0:
      CUDA_CHECK(ops::launch(swiglu_quantize_kernel<q8::Act::kQ8_0>, grid, kThreads, 0, stream.raw(), a.gate, a.up, a.n_cols,
                             per_row, n_blocks, out, row_bytes));
      break;
    case quant::Type::Q8_1:
      CUDA_CHECK(ops::launch(swiglu_quantize_kernel<q8::Act::kQ8_1>, grid, kThreads, 0, stream.raw(), a.gate, a.up, a.n_cols,
                             per_row, n_blocks, out, row_bytes));
      break;
    default:
      CUDA_CHECK(ops::launch(swiglu_quantize_k_kernel, unsigned(n_blocks), kThreads, 0, stream.raw(), a.gate, a.up,
                             a.n_cols, per_row, out, row_bytes));
      break;
  }
  return Status();
}

}  // namespace magnetar::cuda
