// Small helpers shared by the kernels of the forward pass: warp reductions, pointer checks and the launch with
// programmatic dependent launch. Device helpers only need CUDA; host helpers are plain C++.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime.h>

#include <cstdlib>
#include <utility>

#include "backends/cuda/launch.h"
#endif

namespace magnetar::cuda::ops {

constexpr int kWarpSize = 32;

// Whether p is a multiple of n bytes (host side argument checks).
inline bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

#ifdef __CUDACC__
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// warp_sum of kN values at once (kN a power of two <= 32, lane holding its share of each in v[i]): each stage halves
// the values a lane holds (lanes with the stage's offset bit set keep the upper half, the others the lower half), so
// the warp issues kN - 1 + 5 - log2(kN) shuffles instead of 5 kN. Every value is added over the same tree as
// warp_sum's (the lanes xor 16 apart, then 8, ...; each add commutes): the same sums, bit for bit. Lane l returns
// value warp_sums_index<kN>(l).
template <int kN, typename T>
__device__ __forceinline__ T warp_sums(T (&v)[kN], int lane) {
  static_assert(kN >= 1 && kN <= kWarpSize && (kN & (kN - 1)) == 0);
  int n = kN;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    if (n > 1) {
      const bool upper = (lane & offset) != 0;
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        if (i < n / 2) {
          const T keep = upper ? v[i + n / 2] : v[i];
          const T send = upper ? v[i] : v[i + n / 2];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
        }
      }
      n /= 2;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
    }
  }
  return v[0];
}
// The value index warp_sums leaves in `lane`: the bits of the first log2(kN) stages' offsets (16, 8, ...), first
// stage highest.
template <int kN>
__device__ __forceinline__ int warp_sums_index(int lane) {
  int r = 0;
#pragma unroll
  for (int offset = kWarpSize / 2, n = kN; n > 1; offset /= 2, n /= 2) r = 2 * r + ((lane & offset) != 0);
  return r;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// SwiGLU's element: g / (1 + exp(-g)) * u, in the CPU's operation order (models/qwen3_moe/qwen3_moe.cpp) with the
// accurate expf (2 ulp; not __expf, whose error grows with |x|).
__device__ __forceinline__ float silu_mul(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Programmatic dependent launch (sm_90+). A decode token is ~900 small kernels in a row, and without it each one
// starts only after the one before has finished and its grid has drained: launch and ramp-up are paid one after
// the other. A kernel launched by launch() below may instead start as soon as every CTA of the kernel before it has
// called pdl_trigger(). The rule that keeps it correct: a kernel calls pdl_wait() -- which returns once the kernels
// before it have completed and their writes are visible -- before it reads anything an earlier kernel wrote or writes
// anything an earlier kernel reads. Only work on data no kernel writes (weights: prefetch_l2) may come before.
// Every kernel here calls pdl_wait() then pdl_trigger() first thing (and every CTA waits before it exits), so at most
// the next kernel is in flight early, and when a kernel starts, the kernel two launches before it has completed: what
// that one and earlier ones wrote may be read before pdl_wait() too (mmvq's stationary kernel reads the expert items
// of the down projection so, Grouping::items_settled). Both are no-ops in a kernel launched without the attribute and
// on older GPUs.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thread-block clusters (sm_90+; the callers' kernels are built for it): the cluster barrier in two halves (arrive
// releases this thread's earlier writes, shared and global, to the cluster; wait acquires the others'), and a load from
// the shared memory of the CTA of rank `rank` at the place of `local` in this CTA's.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ uint32_t cluster_address(const void* local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(uint32_t(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}
__device__ __forceinline__ double cluster_load(const double* local, int rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}
#endif

// Asks L2 to fetch the 16-byte-aligned part of [p, p + bytes) (one instruction; a hint, nothing is waited for).
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t(15);
  if (end > begin) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin), "r"(uint32_t(end - begin)) : "memory");
  }
#endif
}

// The dynamic shared memory a CTA may opt in to on the current device (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB
// on Hopper and Blackwell data-center parts, 163 KB on A100, 99 KB on the RTX 30/40/50 series): a kernel that asks for
// more aborts at its attribute write, so each op takes a smaller variant or another kernel where its first choice does
// not fit. MAGNETAR_CUDA_SMEM_OPTIN=N (a test switch) lowers it to N bytes, so that the H200 runs the variants a
// smaller GPU gets (tests/CMakeLists.txt: the CudaSmallSmem tests).
inline size_t smem_optin() {
  static const long cap = [] {
    const char* s = std::getenv("MAGNETAR_CUDA_SMEM_OPTIN");
    return s != nullptr ? std::atol(s) : 0l;
  }();
  thread_local int cached_device = -1;  // the attribute is asked once per thread and device (launch paths call this)
  thread_local int value = 0;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return ~size_t(0);  // no GPU: nothing to fit (a launch fails on its own), the argument checks still answer
  }
  if (device != cached_device) {
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      return ~size_t(0);
    }
    cached_device = device;
  }
  return cap > 0 && cap < value ? size_t(cap) : size_t(value);
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch where detail::pdl_enabled():
// only for kernels that follow pdl_wait()'s rule. Returns the launch's error.
// With cluster.x > 0, the CTAs go in thread-block clusters of that shape (sm_90+: the caller checks).
template <typename... Params, typename... Args>
cudaError_t launch_in_clusters(void (*kernel)(Params...), dim3 cluster, dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, Args&&... args) {
  if (detail::launch_skipped(reinterpret_cast<const void*>(kernel))) return cudaSuccess;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (cluster.x > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster.x, cluster.y, cluster.z};
  }
  if (detail::pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  return launch_in_clusters(kernel, dim3(0, 0, 0), grid, block, smem, stream, std::forward<Args>(args)...);
}
#endif

}  // namespace magnetar::cuda::ops
