// Stores float rows into an F16 KV cache (cpu::store_kv with kv_type F16). __float2half_rn rounds to nearest
// even like quant::float_to_fp16, so the cache bits are identical to the CPU's for every finite input
// (overflow gives inf on both; NaN payloads may differ).
//
// Cost: 6 bytes per element (read 4, write 2), no arithmetic; memory-bound. A decode token's K or V row is
// n_head_kv * head_dim elements (512 for Qwen3-30B-A3B: 3 KB), so it is launch-latency bound.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxCtas = 8192;

__global__ void __launch_bounds__(kThreads)
    store_kv_kernel(const float* __restrict__ x, uint16_t* __restrict__ out, int64_t count, int64_t n,
                    const int32_t* __restrict__ row0) {
  ops::pdl_wait();
  ops::pdl_trigger();
  if (row0 != nullptr) out += int64_t(*row0) * n;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < count; i += stride) {
    out[i] = __half_as_ushort(__float2half_rn(x[i]));
  }
}

}  // namespace

Status store_kv(const StoreKvArgs& a, Stream& stream) {
  if (a.n_tok < 1 || a.n < 1 || a.row0 < 0) {
    return Status::error(format("store_kv: n_tok=%lld, n=%lld must be positive, row0=%lld non-negative",
                                (long long)a.n_tok, (long long)a.n, (long long)a.row0));
  }
  if (a.x == nullptr || a.cache == nullptr) return Status::error("store_kv: null device pointer");
  if (!ops::aligned(a.x, 4) || !ops::aligned(a.cache, 2)) {
    return Status::error("store_kv: x must be 4-byte and cache 2-byte aligned");
  }
  const int64_t count = a.n_tok * a.n;
  const int64_t ctas = (count + kThreads - 1) / kThreads;
  CUDA_CHECK(ops::launch(store_kv_kernel, unsigned(ctas < kMaxCtas ? ctas : kMaxCtas), kThreads, 0, stream.raw(), a.x,
                         a.row0_device != nullptr ? a.cache : a.cache + a.row0 * a.n, count, a.n, a.row0_device));
  return Status();
}

}  // namespace magnetar::cuda
