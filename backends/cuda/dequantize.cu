// Q8_0 dequantization on the GPU: one thread per element, 32 threads (one warp) per block of the format.
// Bit-exact with the CPU reference: y = fp16(d) * q in float32, a single correctly rounded multiply.
#include <cuda_fp16.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "quant/formats.h"

namespace magnetar::cuda {
namespace {

__global__ void dequantize_q8_0_kernel(const quant::BlockQ8_0* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const quant::BlockQ8_0& b = x[i / quant::kQK32];
  __half_raw raw;
  raw.x = b.d;
  y[i] = __half2float(__half(raw)) * float(b.qs[i % quant::kQK32]);
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

Status check_device_code() {
  if (device_count() == 0) return Status::error("no CUDA device");
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, dequantize_q8_0_kernel);
  if (e == cudaSuccess) return Status();
  (void)cudaGetLastError();
  int dev = 0, major = 0, minor = 0;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  (void)cudaGetLastError();
  return Status::error(
      format("this build has no GPU code for the device's compute capability %d.%d (%s): rebuild "
             "with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
             major, minor, cudaGetErrorString(e), major, minor));
}

Status dequantize_q8_0(const void* src, float* dst, int64_t n) {
  if (n % quant::kQK32 != 0) return Status::error(format("dequantize_q8_0: n=%lld is not a multiple of 32", (long long)n));
  if (device_count() == 0) return Status::error("dequantize_q8_0: no CUDA device");
  const size_t in_bytes = size_t(n / quant::kQK32) * sizeof(quant::BlockQ8_0);
  const size_t out_bytes = size_t(n) * sizeof(float);
  void* d_in = nullptr;
  float* d_out = nullptr;
  CUDA_CHECK(cudaMalloc(&d_in, in_bytes));
  CUDA_CHECK(cudaMalloc(&d_out, out_bytes));
  CUDA_CHECK(cudaMemcpy(d_in, src, in_bytes, cudaMemcpyHostToDevice));
  const int threads = 256;
  const unsigned grid = unsigned((n + threads - 1) / threads);
  dequantize_q8_0_kernel<<<grid, threads>>>(static_cast<const quant::BlockQ8_0*>(d_in), d_out, n);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpy(dst, d_out, out_bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(d_in));
  CUDA_CHECK(cudaFree(d_out));
  return Status();
}

}  // namespace magnetar::cuda
