// A Q8_0 KV cache's rows as F16 (cuda_backend.h kv_to_f16): what the F16 attention kernels read when the session
// keeps Q8_0 KV (prefill; decode reads Q8_0 directly in attention_decode_mma). Element i of a block becomes
// f16(d * q_i): d is an f16 and |q_i| <= 127, so the float product is exact and __float2half_rn rounds it once, as
// quant::float_to_fp16 does on the host and as attention_decode_mma's f16 multiply does in shared memory.
//
// Cost: per element 1.06 bytes read and 2 written, one multiply; memory-bound (a 64K-row cache of the 30B-A3B
// geometry, 512 elements per row, K and V: ~200 MB moved per layer, ~70 us on an H200). An FP8 E4M3 cache's rows:
// each byte's value, exact in f16 (one cvt per two).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// FP8: each thread 8 bytes into 8 halves, grid-stride over the rows' 8-byte groups.
__global__ void __launch_bounds__(kThreads)
    kv_f8_to_f16_kernel(const uint2* __restrict__ x, uint4* __restrict__ out, int64_t groups_per_row, int64_t rows,
                        const int32_t* __restrict__ last_row) {
  ops::pdl_wait();
  ops::pdl_trigger();
  const int64_t n_rows = last_row != nullptr ? min(rows, int64_t(*last_row) + 1) : rows;
  const int64_t n_groups = n_rows * groups_per_row;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n_groups; i += int64_t(gridDim.x) * kThreads) {
    const uint2 b = x[i];
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t pair = ((k < 2 ? b.x : b.y) >> (16 * (k % 2))) & 0xffffu;
      const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
      h[k] = uint32_t(r.x) | uint32_t(r.y) << 16;
    }
    out[i] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

}  // namespace

Status kv_to_f16(const KvToF16Args& a, Stream& stream) {
  if (a.n < 1 || a.n % quant::kQK32 != 0 || a.rows < 0) {
    return Status::error(format("kv_to_f16: n=%lld must be a positive multiple of 32, rows=%lld non-negative",
                                (long long)a.n, (long long)a.rows));
  }
  if (a.cache == nullptr || a.out == nullptr) return Status::error("kv_to_f16: null device pointer");
  if (a.type == quant::Type::F8_E4M3) {
    if (!ops::aligned(a.cache, 8) || !ops::aligned(a.out, 16)) {
      return Status::error("kv_to_f16: an FP8 cache must be 8-byte, out 16-byte aligned");
    }
    if (a.rows == 0) return Status();
    const int64_t groups_per_row = a.n / 8;
    const int64_t ctas = (a.rows * groups_per_row + kThreads - 1) / kThreads;
    CUDA_CHECK(ops::launch(kv_f8_to_f16_kernel, unsigned(ctas < kMaxCtas ? ctas : kMaxCtas), kThreads, 0, stream.raw(),
                           static_cast<const uint2*>(a.cache), reinterpret_cast<uint4*>(a.out), groups_per_row, a.rows,
                           a.last_row_device));
    return Status();
  }
  if (a.type != quant::Type::Q8_0) return Status::error("kv_to_f16: the cache must be Q8_0 or F8_E4M3");
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
