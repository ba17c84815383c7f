// Host-side entry points of the CUDA backend. Plain C++ (no CUDA headers), so CPU-only code and tests can
// include it; the implementations live in the .cu / .cpp files of this folder.
//
// Error policy (STYLE.md rule 11): what a caller can get wrong or meet at run time (no device, a shape that
// is not a whole number of blocks, a type without a kernel, out of device memory) is a Status; a failing
// CUDA call in the middle of work is not recoverable and aborts through CUDA_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "quant/formats.h"

struct CUstream_st;  // the CUDA runtime's stream object; cudaStream_t is CUstream_st*

namespace magnetar::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error).
int device_count();

// Dequantizes n elements (a multiple of 32) of Q8_0 blocks on device 0: copies `src` up, runs the kernel,
// copies the float32 result back into `dst`. The first kernel of the backend: it keeps the CUDA build
// and its test harness exercised until the real ops land.
Status dequantize_q8_0(const void* src, float* dst, int64_t n);

// ---- device memory and streams ------------------------------------------------------------------------
// Everything below works on the current device (device 0 unless the caller selected another).

// An owned device allocation (cudaMalloc, so 256-byte aligned). Move-only; freed on destruction.
// upload/download are synchronous with respect to the host (cudaMemcpy) and meant for load time and tests,
// not for the decode loop.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Out of device memory or no device is a Status, not an abort. 0 bytes gives an empty buffer.
  static Result<DeviceBuffer> allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  size_t size() const { return bytes_; }

  // Copies `bytes` from host memory into the buffer at `offset`; a range past the end is a Status.
  Status upload(const void* src, size_t bytes, size_t offset = 0);
  // Copies `bytes` at `offset` of the buffer into host memory; a range past the end is a Status.
  Status download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// An owned CUDA stream (non-blocking with respect to the legacy default stream). Move-only.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> create();
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream_st* raw() const { return stream_; }
  // Waits until all work queued on the stream has finished.
  void synchronize();

 private:
  CUstream_st* stream_ = nullptr;
};

// ---- matrix-vector products for decode ------------------------------------------------------------------

// Largest number of activation vectors one matvec launch takes (decode of a few sequences at once).
inline constexpr int64_t kMaxMatvecVectors = 8;

// Device scratch for the quantized activations of matvec, sized once for the largest shape a session will
// use, so that no matvec allocates (STYLE.md rule 8). Not thread-safe: one workspace per stream.
class MatvecWorkspace {
 public:
  MatvecWorkspace() = default;
  // Room for n_vectors (1..kMaxMatvecVectors) activation rows of up to max_cols elements in the largest
  // activation format (Q8_1 / Q8_K).
  static Result<MatvecWorkspace> create(int64_t max_cols, int64_t max_vectors);
  int64_t max_cols() const { return max_cols_; }
  int64_t max_vectors() const { return max_vectors_; }
  void* scratch() { return scratch_.data(); }
  size_t scratch_bytes() const { return scratch_.size(); }

 private:
  DeviceBuffer scratch_;
  int64_t max_cols_ = 0;
  int64_t max_vectors_ = 0;
};

// y[v] = W x[v] for v < n_vectors. All pointers are device pointers.
struct MatvecArgs {
  quant::Type type = quant::Type::F32;  // the weight type: F32, F16, BF16 or any quantized weight type
  const void* weights = nullptr;        // [rows, row_size(type, cols)] bytes, 16-byte aligned
  int64_t rows = 0;                     // >= 1, any value
  int64_t cols = 0;                     // a positive multiple of type's block size
  const float* x = nullptr;             // [n_vectors, cols] float32
  float* y = nullptr;                   // [n_vectors, rows] float32, written (not accumulated)
  int64_t n_vectors = 1;                // 1..kMaxMatvecVectors
  // Quantized types only, optional: x already quantized by quantize_activations into the type's activation
  // format, [n_vectors, row_size(vec_dot_type, cols)] bytes, 4-byte aligned. matvec then skips quantizing
  // (x is not read and may be null; the workspace is not used), so the matrices that share one x (q/k/v,
  // gate/up, the experts of a layer) pay for its quantization once.
  const void* x_quantized = nullptr;
};

// Queues y = W x on `stream`; returns once queued (the result is ready after stream.synchronize()).
// Quantized weight types first quantize x into the activation format of the type's reference dot product
// (traits(type).vec_dot_type: Q8_0, Q8_1 or Q8_K) in the workspace, then take integer dot products
// (dp4a) per block; F32/F16/BF16 multiply float32 x directly, accumulating in float32.
// A bad shape, alignment or type returns a Status naming it and queues nothing.
Status matvec(const MatvecArgs& args, MatvecWorkspace& workspace, Stream& stream);

// Quantizes n_vectors rows of `cols` float32 activations (x: [n_vectors, cols], device) into `act_type`
// blocks (Q8_0, Q8_1 or Q8_K; out: [n_vectors, row_size(act_type, cols)] bytes, device), byte-identical
// with the reference quantizer quant::traits(act_type).from_float. matvec calls this itself; it is public
// so that tests can check those bytes and reproduce matvec's inputs to the reference dot product.
Status quantize_activations(quant::Type act_type, const float* x, void* out, int64_t cols, int64_t n_vectors,
                            Stream& stream);

}  // namespace magnetar::cuda
