// A Q8_0 KV cache's rows as F16 (cuda_backend.h kv_to_f16): what the F16 attention kernels read when the session
// keeps Q8_0 KV (prefill; decode reads Q8_0 directly in attention_decode_mma). Element i of a block becomes
// f16(d * q_i): d is an f16 and |q_i| <= 127, so the float product is exact and __float2half_rn rounds it once, as
// quant::float_to_fp16 does on the host and as attention_decode_mma's f16 multiply does in shared memory.
//
// Cost: per element 1.06 bytes read and 2 written, one multiply; memory-bound (a 64K-row cache of the 30B-A3B
// geometry, 512 elements per row, K and V: ~200 MB moved per layer, ~70 us on an H200).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / ops::kWarpSize;
constexpr int64_t kMaxCtas = 8192;

// One warp per block (lane = element), grid-stride over the blocks of the rows.
__global__ void __launch_bounds__(kThreads)
    kv_to_f16_kernel(const quant::BlockQ8_0* __restrict__ x, uint16_t* __restrict__ out, int64_t blocks_per_row,
                     int64_t rows, const int32_t* __restrict__ last_row) {
  ops::pdl_wait();
  ops::pdl_trigger();
  const int64_t n_rows = last_row != nullptr ? min(rows, int64_t(*last_row) + 1) : rows;
  const int64_t n_blocks = n_rows * blocks_per_row;
  const int lane = int(threadIdx.x) % ops::kWarpSize;
  const int64_t stride = int64_t(gridDim.x) * kWarps;
  for (int64_t b = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x) / ops::kWarpSize; b < n_blocks; b += stride) {
    const float d = __half2float(__ushort_as_half(x[b].d));
    out[b * quant::kQK32 + lane] = __half_as_ushort(__float2half_rn(d * float(x[b].qs[lane])));
  }
}

}  // namespace

Status kv_to_f16(const KvToF16Args& a, Stream& stream) {
  if (a.n < 1 || a.n % quant::kQK32 != 0 || a.rows < 0) {
    return Status::error(format("kv_to_f16: n=%lld must be a positive multiple of 32, rows=%lld non-negative",
                                (long long)a.n, (long long)a.rows));
  }
  if (a.cache == nullptr || a.out == nullptr) return Status::error("kv_to_f16: null device pointer");
  if (!ops::aligned(a.cache, 2) || !ops::aligned(a.out, 4)) {
    return Status::error("kv_to_f16: cache must be 2-byte, out 4-byte aligned");
  }
  if (a.rows == 0) return Status();
  const int64_t blocks_per_row = a.n / quant::kQK32;
  const int64_t ctas = (a.rows * blocks_per_row + kWarps - 1) / kWarps;
  CUDA_CHECK(ops::launch(kv_to_f16_kernel, unsigned(ctas < kMaxCtas ? ctas : kMaxCtas), kThreads, 0, stream.raw(),
                         static_cast<const quant::BlockQ8_0*>(a.cache), a.out, blocks_per_row, a.rows,
                         a.last_row_device));
  return Status();
}

}  // namespace magnetar::cuda
