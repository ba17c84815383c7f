// Asynchronous global -> shared copies (cp.async, sm_80+) for the kernels that stage their K-steps in shared memory
// while they compute the previous ones (mmq.cu, matmul_float.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace magnetar::cuda::detail {

// 16 bytes to shared dst from global src, of which the first src_bytes (0..16) are read and the rest zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// One row chunk [src, src + len) into dst (16-byte aligned) at offset src % 16, as 16-byte units dealt over the
// CTA (unit u: bytes 16 u .. 16 u + 15 of dst; a chunk of len bytes needs (src % 16 + len + 15) / 16 units): the
// units' sources start on the 16-byte line of src (in bounds when the buffer starts 16-byte aligned: the callers'
// contract); bytes past src + len are zero-filled, never read.
__device__ __forceinline__ void stage_unit(uint8_t* dst, const uint8_t* src, int len, int unit) {
  const uint8_t* line = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(src) & ~uintptr_t(15));
  const uint8_t* from = line + 16 * unit;
  const int bytes = max(0, min(16, int(src + len - from)));
  cp_async16(dst + 16 * unit, bytes > 0 ? from : line, bytes);
}

}  // namespace magnetar::cuda::detail
