// SwiGLU in place: gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (the CPU's swiglu in
// models/qwen3_moe/qwen3_moe.cpp, same operation order).
//
// Cost: 12 bytes per element (read gate and up, write gate), ~25 flops with the accurate expf (2 ulp; not
// __expf, whose error grows with |x|). Memory-bound: a decode token's 8 experts x 768 elements are 74 KB,
// launch-latency bound; a prefill batch streams at HBM speed.
#include <cuda_runtime.h>

#include <climits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxCtas = 8192;  // grid-stride beyond this: enough CTAs to fill any current GPU

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t count) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < count; i += stride) {
    const float g = gate[i];
    gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
  }
}

}  // namespace

Status swiglu(float* gate, const float* up, int64_t count, Stream& stream) {
  if (count < 1) return Status::error(format("swiglu: count=%lld must be positive", (long long)count));
  if (gate == nullptr || up == nullptr) return Status::error("swiglu: null device pointer");
  if (!ops::aligned(gate, 4) || !ops::aligned(up, 4))
    return Status::error("swiglu: gate and up must be 4-byte aligned");
  const int64_t ctas = (count + kThreads - 1) / kThreads;
  swiglu_kernel<<<unsigned(ctas < kMaxCtas ? ctas : kMaxCtas), kThreads, 0, stream.raw()>>>(gate, up, count);
  CUDA_CHECK(cudaGetLastError());
  return Status();
}

}  // namespace magnetar::cuda
