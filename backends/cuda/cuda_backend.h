// Host-side entry points of the CUDA backend. Plain C++ (no CUDA headers), so CPU-only code and tests can
// include it; the implementations live in the .cu / .cpp files of this folder.
//
// Error policy (STYLE.md rule 11): what a caller can get wrong or meet at run time (no device, a shape that
// is not a whole number of blocks, a type without a kernel, out of device memory) is a Status; a failing
// CUDA call in the middle of work is not recoverable and aborts through CUDA_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "quant/formats.h"

struct CUstream_st;     // the CUDA runtime's stream object; cudaStream_t is CUstream_st*
struct CUgraphExec_st;  // an instantiated CUDA graph; cudaGraphExec_t is CUgraphExec_st*
struct CUevent_st;      // a CUDA event; cudaEvent_t is CUevent_st*

namespace magnetar::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error).
int device_count();
// Whether this build's kernels run on the current device (built for its architecture, or PTX the driver can
// compile for it); else an error naming the compute capability to build for. Launching without it aborts.
Status check_device_code();

// The current device: name, memory (free as cudaMemGetInfo reports it now) and SM count.
struct DeviceInfo {
  std::string name;
  size_t free_bytes = 0, total_bytes = 0;
  int sm_count = 0;
  double peak_bytes_per_s = 0;  // memory bandwidth from the peak memory clock and bus width (0: not reported)
};
Result<DeviceInfo> device_info();

// Dequantizes n elements (a multiple of 32) of Q8_0 blocks on device 0: copies `src` up, runs the kernel,
// copies the float32 result back into `dst`. The first kernel of the backend: it keeps the CUDA build
// and its test harness exercised until the real ops land.
Status dequantize_q8_0(const void* src, float* dst, int64_t n);

// ---- device memory and streams ------------------------------------------------------------------------
// Everything below works on the current device (device 0 unless the caller selected another).

// An owned device allocation (cudaMalloc, so 256-byte aligned). Move-only; freed on destruction.
// upload/download are synchronous with respect to the host and the device (the bytes have landed when they
// return, whatever stream reads them next) and meant for load time and tests, not for the decode loop.
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

// Page-locked host memory (cudaMallocHost): the staging buffers of asynchronous copies. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host memory allocated elsewhere (an mmap'd arena), page-locked and registered with the device while this
// lives, so copies from it run at full bus speed and asynchronously (cudaHostRegister). The memory must outlive
// the registration. Move-only.
class HostRegistration {
 public:
  HostRegistration() = default;
  static Result<HostRegistration> create(void* data, size_t bytes);
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  void* data_ = nullptr;
};

class Event;

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
  // Queues a copy of `bytes` between any two of host and device memory (asynchronous with respect to the
  // host only when the host side is pinned).
  void copy(void* dst, const void* src, size_t bytes);
  // The work queued on this stream after the call starts once the work `event` was recorded behind (on another
  // stream) has finished; the host does not wait.
  void wait(const Event& event);

 private:
  CUstream_st* stream_ = nullptr;
};

// A CUDA event: times a stream's work between two records, or orders another stream after it (Stream::wait).
// Move-only.
class Event {
 public:
  Event() = default;
  static Result<Event> create();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream& stream);
  // Waits on the host until the work queued before the last record() has finished.
  void synchronize();
  // Seconds from `start` to `end`, both recorded and complete (their stream synchronized since).
  static double seconds_between(const Event& start, const Event& end);

 private:
  friend class Stream;
  CUevent_st* event_ = nullptr;
};

// A recorded sequence of one stream's work (a CUDA graph), replayed with one launch: the decode step's hundreds of
// small kernels without a host launch each. Kernel arguments are frozen at capture, so what changes between
// replays must be read from device memory (positions, cache rows) or come through fixed pinned buffers (copies
// are replayed from the same addresses). Move-only.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts recording `stream`: until end_capture, work queued on it from this thread is recorded, not run.
  static void begin_capture(Stream& stream);
  // Stops recording and instantiates what was recorded; a capture CUDA refused (an operation that cannot be
  // recorded was queued) is a Status, and the stream is usable again either way.
  static Result<Graph> end_capture(Stream& stream);
  // Queues one replay on `stream`.
  void launch(Stream& stream) const;
  bool empty() const { return exec_ == nullptr; }

 private:
  CUgraphExec_st* exec_ = nullptr;
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
  // [rows, row_size(type, cols)] bytes, 16-byte aligned; not written by the kernel launched just before on the stream
  // (the stationary kernel loads them before it waits for that one: ops_common.cuh's rule).
  const void* weights = nullptr;
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
  // 0: the default kernel. 1, 2 or 4: single-vector products of a type with mmvq.cu's rows kernel
  // (has_matvec_rows_kernel) take it, with that many rows per warp, or 4 for rows shorter than a warp's lanes
  // (so that every lane has a part). The model asks for 1 (MAGNETAR_CUDA_MMVQ_ROWS); other launches ignore it.
  int rows_per_warp = 0;
  // Products of a type with mmvq.cu's activation-stationary kernel (has_matvec_stationary_kernel: Q4_K, Q6_K) take it
  // where the row fits (groups of 1, 2 or 4 rows whose parts tile a warp's lanes, at most 8 parts per lane: 1,024-8,192
  // columns in steps of 1,024, 512-3,584 in steps of 1,024, 256-1,792 in steps of 512), for several vectors where
  // they and the warp's rows fit its lanes (4 or 8 vectors times 1-8 rows <= 32); each vector's outputs are the bits
  // of a product of it alone. Other rows and types ignore it and go by rows_per_warp. The model asks for it
  // (MAGNETAR_CUDA_MMVQ_STATIONARY=0 does not).
  bool stationary = false;
  // Single-vector Q8_0 products whose rows are whole 16-byte units (cols a multiple of 256) and at most 12 KiB take
  // mmvq.cu's staged kernel (each row copied to shared memory with 16-byte loads: Q8_0's 34-byte blocks allow only
  // 2-byte ones); other rows and types ignore it. The model asks for it (MAGNETAR_CUDA_MMVQ_STAGED=0 does not).
  bool staged = false;
  // Optional (y_split[0] non-null): rows [0, split[0]) are written to y as [n_vectors, split[0]], [split[0],
  // split[1]) to y_split[0] as [n_vectors, split[1] - split[0]], the rest to y_split[1] (0 < split[0] < split[1] <
  // rows): a merged q|k|v matrix's products into three buffers. The stationary kernel takes it in one launch; other
  // kernels launch once per part. Each part's outputs are the bits of a product of its rows alone.
  int64_t split[2] = {0, 0};
  float* y_split[2] = {nullptr, nullptr};
};

// Queues y = W x on `stream`; returns once queued (the result is ready after stream.synchronize()).
// Quantized weight types first quantize x into the activation format of the type's reference dot product
// (traits(type).vec_dot_type: Q8_0, Q8_1 or Q8_K) in the workspace, then take integer dot products
// (dp4a) per block; F32/F16/BF16 multiply float32 x directly, accumulating in float32.
// A bad shape, alignment or type returns a Status naming it and queues nothing.
Status matvec(const MatvecArgs& args, MatvecWorkspace& workspace, Stream& stream);

// ---- grouped matrix-vector products: the routed experts of a layer in one launch ---------------------------------

// Up to kMaxMatvecVectors consecutive output rows that use one expert, with the device pointers of that
// expert's gate, up and down weights (ARCHITECTURE.md: kernels never consult global tables). A null pointer
// means "not on this device": those rows are left untouched for another device to fill.
struct GroupItem {
  const void* w[3] = {nullptr, nullptr, nullptr};
  int32_t row0 = 0;
  int32_t n = 0;  // 1..kMaxMatvecVectors
};

// Decode of one token with every expert of a layer resident in one buffer (GroupedMatvecArgs::route): the grouped
// launch routes itself instead of reading items that route_topk made. Each CTA ranks the token's router logits (one
// warp, route_topk's order: the larger logit, on equal logits the lower id) and takes the expert e of rank y for its
// item y (the token's slot y, output row y); e's part p lies at base + e * stride + offset[p]. With ids set, the
// launch also writes what route_topk writes for the combine: ids[j], weights[j] (route_topk's softmax, bit for bit,
// renormalized when normalize) and slot_rows[j] = j, for j < k.
struct RouteInProducts {
  const float* logits = nullptr;  // [n_expert], device; null: the launch reads items
  int n_expert = 0;               // 1..kMaxRoutedExperts
  int k = 0;                      // the items: 1..min(n_expert, kMaxRoutedK)
  const void* base = nullptr;
  size_t stride = 0;
  size_t offset[3] = {0, 0, 0};
  int32_t* ids = nullptr;  // [k], device, or null
  float* weights = nullptr;
  int32_t* slot_rows = nullptr;
  bool normalize = false;
};
constexpr int kMaxRoutedExperts = 128;  // a lane of the ranking warp keeps 4 logits in registers
constexpr int kMaxRoutedK = 32;         // lane j of the ranking warp keeps slot j

// For each item and each of its n_parts weights starting at `part` (0 gate, 1 up, 2 down): y rows
// row0 .. row0 + n - 1 = W x rows. The weights are [rows, row_size(type, cols)] each, 16-byte aligned.
struct GroupedMatvecArgs {
  quant::Type type = quant::Type::F32;
  const GroupItem* items = nullptr;  // [n_items], device
  int64_t n_items = 0;               // 1..65535
  int part = 0;
  int n_parts = 1;                   // 1, or 2: gate and up in one launch
  int64_t rows = 0;
  int64_t cols = 0;
  // Quantized types: [*, row_size(vec_dot_type, cols)] already quantized (quantize_activations);
  // float types: [*, cols] float32.
  const void* x = nullptr;
  const int32_t* x_rows = nullptr;   // device: x row of output row r; null: row r
  // Every output row reads x row 0 (one token's expert rows): x_rows is not read, so a CTA loads its activation row
  // as soon as its item, not after a load of x_rows that waits for the item.
  bool single_x = false;
  float* y = nullptr;                // output row r at y + r * rows; part z at + z * y_part_stride floats
  int64_t y_part_stride = 0;
  int64_t max_n = 1;                 // the largest item n (1 selects the single-vector kernel)
  int rows_per_warp = 0;             // as MatvecArgs::rows_per_warp (max_n == 1 only)
  bool stationary = false;           // as MatvecArgs::stationary (max_n == 1 only)
  // The items (and the weights they point to) were written by a launch at least two before this one on the stream
  // (the down projection: gate/up runs between it and route_topk). The stationary kernel then loads its weights
  // while the launch just before it still runs (programmatic dependent launch: ops_common.cuh's rule).
  bool items_settled = false;
  // Decode's SwiGLU folded into the products around it (both need the stationary kernel: max_n 1, stationary, a
  // type and row shape that matvec_stationary_fits). swiglu (n_parts 2): y row r = silu(gate . x) * (up . x) written
  // once (y_part_stride unused); the separate swiglu launch is not needed. x_float (quantized types): x is float32
  // [*, cols], 16-byte aligned, quantized by each CTA into the type's activation format (the bytes of
  // quantize_activations) instead of by a launch before.
  bool swiglu = false;
  bool x_float = false;
  // Items from the logits (RouteInProducts; items null, n_items = route.k; the stationary kernel, max_n 1). The
  // logits count as an item table for items_settled: settled when written two or more launches before.
  RouteInProducts route = {};
  // A swiglu launch of Q4_K weights, or an x_float one over items, streams them through shared memory by bulk
  // copies, one wave of CTAs of many rows (mmvq_bulk.cu) where the GPU has them (sm_90+), the stationary kernel
  // otherwise: the same bits either way. Items' weights must be 16-byte aligned (the copies' sources).
  bool bulk = false;
};
Status grouped_matvec(const GroupedMatvecArgs& args, Stream& stream);
// Whether `type` has mmvq.cu's rows kernel (rows_per_warp 1, 2, 4): Q4_K and Q8_0.
bool has_matvec_rows_kernel(quant::Type type);
// Whether `type` has mmvq.cu's activation-stationary kernel (MatvecArgs::stationary): Q4_K, Q6_K.
bool has_matvec_stationary_kernel(quant::Type type);
// Whether grouped gate/up products of `type` can fold SwiGLU in (GroupedMatvecArgs::swiglu): Q4_K.
bool has_matvec_swiglu(quant::Type type);
// Whether single-vector products of `type` with rows of `cols` take it (MatvecArgs::stationary).
bool matvec_stationary_fits(quant::Type type, int64_t cols);

// out[t] = sum over j < k, in order, of weights[t * k + j] * rows[slot_rows[t * k + j]] (each row n floats).
struct MoeCombineArgs {
  const float* rows = nullptr;       // [*, n]
  const int32_t* slot_rows = nullptr;  // [n_tok * k]
  const float* weights = nullptr;    // [n_tok * k]
  float* out = nullptr;              // [n_tok, n]
  int64_t n_tok = 0;
  int64_t k = 0;
  int64_t n = 0;
};
Status moe_combine(const MoeCombineArgs& args, Stream& stream);

// ---- quantized matrix-matrix products for prefill (mmq.cu) ------------------------------------------------------
// Int8 tensor-core (mma.sync, sm_80+) products of a quantized weight matrix with many already quantized
// activation rows: y[r] = W x[r]. Each output equals the reference vec_dot of the weight row with the
// activation row (traits(type).vec_dot_type blocks, as quantize_activations writes them) up to the float
// rounding of the scale products and of the summation, like matvec. Both calls only queue work on `stream`
// and allocate nothing; a bad type, shape, pointer or alignment returns a Status naming it and queues nothing.
// Weight types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL MXFP4 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS.

struct MatmulArgs {
  quant::Type type = quant::Type::Q4_0;  // a quantized weight type (list above)
  const void* weights = nullptr;         // [rows, row_size(type, cols)] bytes, 16-byte aligned
  int64_t rows = 0;                      // 1..INT_MAX
  int64_t cols = 0;                      // a positive multiple of type's block size
  const void* x = nullptr;               // [n, row_size(vec_dot_type, cols)] bytes, 16-byte aligned
  float* y = nullptr;                    // [n, rows] float32, written (not accumulated), 4-byte aligned
  int64_t n = 0;                         // activation rows, >= 1
  // matmul_q only, optional (split[0] = 0: off): one launch for stacked matrices (q, k, v) with separate outputs.
  // Weight rows [0, split[0]) are written to y as [n, split[0]], [split[0], split[1]) to y_split[0] as
  // [n, split[1] - split[0]], the rest to y_split[1]; splits are multiples of kMatmulQRowTile.
  int64_t split[2] = {0, 0};
  float* y_split[2] = {nullptr, nullptr};
};
Status matmul_q(const MatmulArgs& args, Stream& stream);
inline constexpr int64_t kMatmulQRowTile = 128;  // weight rows per CTA of matmul_q: the granularity of its splits

// Whether matmul_q / grouped_matmul_q take this weight type (the list above) on the current device (whose shared
// memory a CTA of the type's kernel needs; the staged types' ~111 KiB are not on GPUs of 99 KB a CTA).
bool has_matmul_q(quant::Type type);

// The routed experts of a layer in one launch: for each item (GroupItem; its n may be any positive count,
// not only up to kMaxMatvecVectors) and each of its n_parts weights starting at `part` (0 gate, 1 up,
// 2 down): y rows row0 .. row0 + n - 1 of part z (at y + z * y_part_stride floats) = W x rows, where output
// row r reads activation row x_rows[r] (r when x_rows is null). A null weight pointer leaves that item's
// rows of that part untouched. Items must not overlap in output rows (each row written once: no atomics).
struct GroupedMatmulArgs {
  quant::Type type = quant::Type::Q4_0;
  const GroupItem* items = nullptr;  // [n_items], device
  int64_t n_items = 0;               // 1..65535
  int part = 0;
  int n_parts = 1;                   // 1..3 - part
  int64_t rows = 0;                  // of each weight: [rows, row_size(type, cols)], 16-byte aligned
  int64_t cols = 0;
  const void* x = nullptr;           // [*, row_size(vec_dot_type, cols)], 16-byte aligned (quantize_activations)
  const int32_t* x_rows = nullptr;   // device: x row of output row r; null: row r
  float* y = nullptr;                // output row r at y + r * rows
  int64_t y_part_stride = 0;         // floats between the outputs of consecutive parts
};
Status grouped_matmul_q(const GroupedMatmulArgs& args, Stream& stream);

// ---- float matrix-matrix product for prefill (matmul_float.cu) -----------------------------------------------------
// y[r] = W x[r] for F32, F16 or BF16 weights (MatmulArgs: type one of those, x [n, cols] float32 activations,
// y [n, rows] written): each output a float32 fused multiply-add chain over k in order, the bound matvec's float
// path states. Reads the matrix once per 16 activation rows (matvec: once per kMaxMatvecVectors). Only queues
// work; a bad type, shape, pointer or alignment returns a Status naming it and queues nothing.
bool has_matmul_float(quant::Type type);
Status matmul_float(const MatmulArgs& args, Stream& stream);

// Quantizes n_vectors rows of `cols` float32 activations (x: [n_vectors, cols], device) into `act_type`
// blocks (Q8_0, Q8_1 or Q8_K; out: [n_vectors, row_size(act_type, cols)] bytes, device), byte-identical
// with the reference quantizer quant::traits(act_type).from_float. matvec calls this itself; it is public
// so that tests can check those bytes and reproduce matvec's inputs to the reference dot product.
Status quantize_activations(quant::Type act_type, const float* x, void* out, int64_t cols, int64_t n_vectors,
                            Stream& stream);

// ---- the non-matmul ops of the forward pass (rms_norm.cu, rope.cu, qk_norm_rope.cu, swiglu.cu, route_topk.cu,
// store_kv.cu, attention.cu, attention_prefill.cu) --------------------------------------------------------------------
// Each op is the CUDA twin of a CPU op (backends/cpu/ops.h, models/qwen3_moe/qwen3_moe.cpp) with the same
// layouts and the same formula; tests/cuda/cuda_ops_test.cpp states how close each must be. All pointers are
// device pointers (float32 buffers 4-byte aligned unless stated); every call only queues work on `stream`
// and allocates nothing (STYLE.md rule 8). A bad shape, pointer or alignment returns a Status naming it and
// queues nothing. Row and element counts are limited to what a 32-bit grid index reaches (checked).

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for n_rows rows of n_cols (cpu::rms_norm: the sum of
// squares in double, scale = float(1 / sqrt(sum / n + eps)), y = x * scale * w in float). Also the per-head
// q/k norm of Qwen3 (n_rows = n_tok * n_head, n_cols = head_dim). y may equal x (in place).
struct RmsNormArgs {
  const float* x = nullptr;       // [n_rows, n_cols]
  const float* weight = nullptr;  // [n_cols]
  float* y = nullptr;             // [n_rows, n_cols]
  int64_t n_rows = 0;             // >= 1
  int64_t n_cols = 0;             // >= 1
  float eps = 1e-6f;
};
Status rms_norm(const RmsNormArgs& args, Stream& stream);

// The residual add fused with the next norm: x += residual, then y = rms_norm(x) * weight (one read of x and
// residual, one write of x and y, instead of the add's separate pass). y must not alias x or residual.
// Optionally y is also quantized in the same launch (y_quantized set): the bytes quantize_activations(y_type, y)
// would write, for the quantized matrix products that read y (can_quantize_norm says which shapes).
struct AddRmsNormArgs {
  float* x = nullptr;               // [n_rows, n_cols], updated in place (unless x_out)
  const float* residual = nullptr;  // [n_rows, n_cols]
  const float* weight = nullptr;    // [n_cols]
  float* y = nullptr;               // [n_rows, n_cols]
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  float eps = 1e-6f;
  quant::Type y_type = quant::Type::F32;  // with y_quantized: Q8_0, Q8_1 or Q8_K
  void* y_quantized = nullptr;            // [n_rows, row_size(y_type, n_cols)] bytes, 4-byte aligned, or null
  // Optional, together: the MoE combine in the same launch. Row r then adds moe_combine's sum over j < residual_k of
  // residual_weights[r * k + j] * residual row residual_rows[r * k + j] (bit for bit moe_combine then the add).
  // residual_rows and residual_weights are read before waiting for the kernel launched just before (written by a copy
  // or by a kernel two or more launches back: ops_common.cuh's rule).
  const int32_t* residual_rows = nullptr;
  const float* residual_weights = nullptr;
  int64_t residual_k = 0;  // 1..64
  // Optional: x + residual goes here and x is only read ([n_rows, n_cols], aliasing none of x, residual and y).
  float* x_out = nullptr;
};
Status add_rms_norm(const AddRmsNormArgs& args, Stream& stream);

// add_rms_norm of one row folded into the float matrix-vector product that reads y (decode's MoE router,
// norm_matvec.cu): every CTA makes the row's norm itself, so the norm's launch and its boundary are gone. out = W y;
// x + residual is written to norm.x_out (required: x is only read, every CTA reads it), y to norm.y and, when
// norm.y_quantized is set (y_type Q8_K only), the quantized y as add_rms_norm would write them. The sum of squares is
// added in rms_norm's cluster kernel's order and the product in matvec's: bit for bit add_rms_norm then matvec where
// add_rms_norm runs on clusters (norm_in_cluster). One row (norm.n_rows 1), no MoE combine, n_cols a multiple of
// kNormMatvecStep up to kMaxNormMatvecCols (add_rms_norm_matvec_fits).
inline constexpr int64_t kNormMatvecStep = 1024;
inline constexpr int64_t kMaxNormMatvecCols = 8192;
struct NormMatvecArgs {
  AddRmsNormArgs norm;
  quant::Type type = quant::Type::F32;  // of the weights: F32, F16 or BF16
  const void* weights = nullptr;        // [rows, row_size(type, norm.n_cols)] bytes, 16-byte aligned
  int64_t rows = 0;
  float* out = nullptr;  // [rows]
};
Status add_rms_norm_matvec(const NormMatvecArgs& args, Stream& stream);
bool add_rms_norm_matvec_fits(quant::Type type, int64_t n_cols);
// The longest row add_rms_norm quantizes (y is staged in shared memory: 32 KiB, under the 48 KiB a launch gets
// without opting in, with the kernel's static shared memory).
inline constexpr int64_t kMaxNormQuantizeCols = 8192;
// Whether add_rms_norm can quantize rows of n_cols into y_type: Q8_0, Q8_1 or Q8_K, n_cols a multiple of the
// type's block, at most kMaxNormQuantizeCols.
bool can_quantize_norm(quant::Type y_type, int64_t n_cols);
// Whether rms_norm / add_rms_norm of n_rows x n_cols (y also quantized to y_type unless F32) runs on thread-block
// clusters, 8 CTAs per row (decode rows on sm_90+; MAGNETAR_CUDA_NORM_CLUSTER=0 turns it off). There the quantization
// in the norm's launch costs less than a launch of its own; on the one-CTA row kernel it costs more.
bool norm_in_cluster(quant::Type y_type, int64_t n_rows, int64_t n_cols);

// NeoX rotary embedding in place (cpu::rope_neox): x [n_tok, n_head, head_dim], pairs (i, i + head_dim/2),
// angle = double(positions[t]) * float(1 / theta^(2i / head_dim)). head_dim even, <= 1024.
struct RopeArgs {
  float* x = nullptr;
  const int32_t* positions = nullptr;  // [n_tok]
  int64_t n_tok = 0;
  int64_t n_head = 0;
  int64_t head_dim = 0;
  float theta = 1e6f;
};
Status rope_neox(const RopeArgs& args, Stream& stream);

// Qwen3's q/k norm and RoPE in one pass, in place: each head row of x [n_tok, n_head, head_dim] is
// rms_norm'ed with `weight` [head_dim], then rotated as rope_neox at positions[t]. Bit-identical with
// rms_norm (n_rows = n_tok * n_head, n_cols = head_dim) followed by rope_neox, one read and write of x fewer.
// head_dim a multiple of 64, <= kMaxQkNormRopeHeadDim. The positions (and qkv_prepare's row0_device) must be
// copied from the host, not written by a kernel queued before it: they are read before waiting for that kernel.
inline constexpr int64_t kMaxQkNormRopeHeadDim = 256;
struct QkNormRopeArgs {
  float* x = nullptr;
  const float* weight = nullptr;       // [head_dim]
  const int32_t* positions = nullptr;  // [n_tok]
  int64_t n_tok = 0;
  int64_t n_head = 0;
  int64_t head_dim = 0;
  float eps = 1e-6f;
  float theta = 1e6f;
};
Status qk_norm_rope(const QkNormRopeArgs& args, Stream& stream);

// A layer's attention inputs in one launch: q normed and rotated in place (qk_norm_rope), k normed and rotated and
// stored into k_cache, v stored into v_cache, token t at cache row row0 + t. F16 caches: store_kv's layout and
// rounding, bit-identical with qk_norm_rope(q), qk_norm_rope(k), store_kv(k), store_kv(v). Q8_0 caches (kv_type):
// each head row as head_dim / 32 Q8_0 blocks, the bytes cpu::store_kv (quant's Q8_0 rounding) writes for the same
// floats; F8_E4M3 caches: a byte per element, cpu::store_kv's (quant::float_to_fp8_e4m3). k itself is not written.
// head_dim as qk_norm_rope.
struct QkvPrepareArgs {
  float* q = nullptr;                  // [n_tok, n_head, head_dim]
  const float* q_weight = nullptr;     // [head_dim]
  const float* k = nullptr;            // [n_tok, n_head_kv, head_dim]
  const float* k_weight = nullptr;     // [head_dim]
  const float* v = nullptr;            // [n_tok, n_head_kv, head_dim]
  void* k_cache = nullptr;             // [>= row0 + n_tok, n_head_kv, head_dim] F16 bits, Q8_0 blocks or FP8
  void* v_cache = nullptr;             // same layout
  const int32_t* positions = nullptr;  // [n_tok]: RoPE positions
  int64_t n_tok = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float eps = 1e-6f;
  float theta = 1e6f;
  int64_t row0 = 0;
  // When set, row0 is read from this device int when the kernel runs (store_kv's row0_device: a decode graph).
  const int32_t* row0_device = nullptr;
  quant::Type kv_type = quant::Type::F16;  // F16, Q8_0 or F8_E4M3
};
Status qkv_prepare(const QkvPrepareArgs& args, Stream& stream);
// The NeoX rotation's cos and sin at position pos (host code, the values qkv_prepare computes on the device:
// rope.cuh's formula): out[i] = cos and out[head_dim / 2 + i] = sin of pair i < head_dim / 2 (AttentionArgs::prepare).
void rope_table(int32_t pos, int64_t head_dim, float theta, float* out);

// gate[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up, for i < count (in place into gate).
Status swiglu(float* gate, const float* up, int64_t count, Stream& stream);
// swiglu over [n_rows, n_cols] and the result quantized in the same launch: gate ends as swiglu() leaves it, out
// holds the bytes quantize_activations(out_type, gate) would write. out_type Q8_0, Q8_1 or Q8_K; n_cols a multiple
// of its block; out [n_rows, row_size(out_type, n_cols)] bytes, 4-byte aligned.
struct SwigluQuantizeArgs {
  float* gate = nullptr;
  const float* up = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  quant::Type out_type = quant::Type::Q8_K;
  void* out = nullptr;
};
Status swiglu_quantize(const SwigluQuantizeArgs& args, Stream& stream);

// Router of a softmax-routed MoE (Qwen3Model::route() in models/qwen3_moe): per token, softmax over the
// n_expert logits, the k largest (ties: the lower expert id first, as torch.topk on CPU),
// weight = float(exp(l - max) / sum) with the sum in double, then optionally renormalized over the k:
// float(w / sum of the k floats, in double).
struct RouteArgs {
  const float* logits = nullptr;  // [n_tok, n_expert]
  int32_t* ids = nullptr;         // [n_tok, k], in descending logit order
  float* weights = nullptr;       // [n_tok, k]
  int64_t n_tok = 0;
  int64_t n_expert = 0;   // 1..1024
  int64_t k = 0;          // 1..min(n_expert, 32)
  bool normalize = true;  // norm_topk_prob
  // Optional (decode): the chosen experts turned into grouped-matvec items in the same launch (no host round trip,
  // so a decode step can be captured in a graph), when table is set: row r = token r / k, slot r % k gets item
  // r = the weights table[ids[r]] (pointer triples gate, up, down), row0 r, n 1; x_rows[r] = r / k; slot_rows[r] = r.
  // [n_expert * 3]; read before waiting for the kernel queued before (programmatic dependent launch): copied from the
  // host, never written by a kernel.
  const void* const* table = nullptr;
  GroupItem* items = nullptr;          // [n_tok * k]
  int32_t* x_rows = nullptr;           // [n_tok * k]
  int32_t* slot_rows = nullptr;        // [n_tok * k]
};
Status route_topk(const RouteArgs& args, Stream& stream);

// Stores n_tok rows of n floats as F16 (round to nearest even, the bits of quant::float_to_fp16) into a KV
// cache at row row0: cache[(row0 + t) * n + i] = fp16(x[t * n + i]) (cpu::store_kv with kv_type F16).
struct StoreKvArgs {
  const float* x = nullptr;   // [n_tok, n]
  uint16_t* cache = nullptr;  // [>= row0 + n_tok, n] F16 bits
  int64_t n_tok = 0;
  int64_t n = 0;
  int64_t row0 = 0;
  // When set, row0 is read from this device int when the kernel runs (a CUDA graph replays the launch for each
  // new position) and `row0` above is ignored; the caller guarantees the rows fit the cache.
  const int32_t* row0_device = nullptr;
};
Status store_kv(const StoreKvArgs& args, Stream& stream);

// Rows [0, rows) of a Q8_0 or FP8 KV cache [.., n] into an F16 one of the same layout: element i of a Q8_0 row
// becomes f16(d * q_i) (quant::float_to_fp16 of the float product, which is exact), an FP8 element its value (exact
// in f16): the values attention_decode_mma computes with, so that the F16 attention kernels (prefill) read what
// decode reads. n a multiple of 32; out 4-byte aligned.
struct KvToF16Args {
  const void* cache = nullptr;           // [>= rows, n] Q8_0 blocks or FP8 bytes (type)
  quant::Type type = quant::Type::Q8_0;  // Q8_0 or F8_E4M3
  uint16_t* out = nullptr;      // [>= rows, n] F16 bits
  int64_t n = 0;
  int64_t rows = 0;
  // When set (a decode graph), the rows are [0, *last_row_device + 1) and `rows` only bounds them (the grid).
  const int32_t* last_row_device = nullptr;
};
Status kv_to_f16(const KvToF16Args& args, Stream& stream);

// Largest query-head group (n_head / n_head_kv) and head size attention takes; the CPU op has the same group
// limit.
inline constexpr int64_t kMaxAttentionGroup = 16;
inline constexpr int64_t kMaxAttentionHeadDim = 256;
// Most pieces one decode query's context is split into (split-K); see attention.cu.
inline constexpr int64_t kMaxAttentionSplits = 512;
inline constexpr int64_t kMaxDecodeSeqs = kMaxMatvecVectors;  // sequences of one attention_decode_mma launch

// Device scratch of attention's split-K decode: per query head and split, the partial output, max and sum.
// Sized once for the largest head count and head size (not the context: the split count is bounded), so no
// attention call allocates. Not thread-safe: one workspace per stream.
class AttentionWorkspace {
 public:
  AttentionWorkspace() = default;
  // max_seqs: the most sequences one attention_decode_mma launch takes (AttentionArgs::seq_k), up to kMaxDecodeSeqs.
  static Result<AttentionWorkspace> create(int64_t max_heads, int64_t max_head_dim, int64_t max_seqs = 1);
  int64_t max_heads() const { return max_heads_; }
  int64_t max_seqs() const { return max_seqs_; }
  // Partial records of head_dim + 4 floats the scratch holds (heads x splits x sequences of one launch).
  int64_t max_records() const { return max_records_; }
  int64_t max_head_dim() const { return max_head_dim_; }
  int sm_count() const { return sm_count_; }  // of the current device at creation: sizes the split count
  float* partials() { return scratch_.as<float>(); }
  // attention_decode_mma's count of finished splits per sequence and KV head (zero between launches).
  unsigned* tickets() { return tickets_.as<unsigned>(); }

 private:
  DeviceBuffer scratch_;
  DeviceBuffer tickets_;
  int64_t max_heads_ = 0;
  int64_t max_head_dim_ = 0;
  int64_t max_seqs_ = 1;
  int64_t max_records_ = 0;
  int sm_count_ = 1;
};

// Causal attention over an F16 KV cache for n_tok new tokens at positions pos0 .. pos0 + n_tok - 1
// (cpu::attention with kv_type F16, same layouts): query head h uses KV head h / (n_head / n_head_kv);
// token t attends to cached rows lo .. pos0 + t, lo = max(0, pos0 + t - window + 1) when window > 0, else 0;
// out = softmax(scale * q k^T) v.
//   n_tok == 1 (decode): split-K. The context is cut into chunks of 128 rows and the chunks into up to
//     kMaxAttentionSplits splits; one CTA per (split, KV head) keeps an online softmax over its chunks for
//     the group of query heads sharing the KV head (each K/V row is read once per group), writes its partial
//     max, sum and output to the workspace, and a combine kernel merges the splits.
//   n_tok > 1 (prefill): one CTA per (token, KV head) runs the same online softmax over all its chunks and
//     writes the output directly. NOT a flash-attention tiling: the K/V rows are re-read for every query
//     token (from L2 when the context fits there), so prefill attention costs O(n_tok * context) reads
//     (attention_prefill_mma below is the tiled one).
struct AttentionArgs {
  const float* q = nullptr;        // [n_tok, n_head, head_dim]
  const void* k_cache = nullptr;   // [n_ctx, n_head_kv, head_dim] (kv_type), 16-byte aligned, rows 0..pos0+n_tok-1
  const void* v_cache = nullptr;   // same layout and alignment as k_cache
  float* out = nullptr;               // [n_tok, n_head, head_dim]; must not alias q
  int64_t n_tok = 0;
  int64_t pos0 = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;  // divides n_head, group n_head / n_head_kv <= kMaxAttentionGroup
  int64_t head_dim = 0;   // a multiple of 8, <= kMaxAttentionHeadDim
  int64_t window = 0;     // > 0: attend only to the last `window` positions (sliding window)
  float scale = 1.0f;
  // Decode (n_tok == 1, attention() only): when set, pos0 is read from this device int when the kernels run (a
  // CUDA graph replays the launch for each new position) and `pos0` above is ignored. The grid is then sized for
  // max_rows cached rows (the cache's length, >= the row count at any replay) and each CTA derives the split plan
  // of the actual row count on the device (the same plan_splits); CTAs past it return at once.
  const int32_t* pos0_device = nullptr;
  int64_t max_rows = 0;
  // The caches' type: F16, or Q8_0 or F8_E4M3 for attention_decode_mma only (each head row head_dim / 32 blocks of
  // ggml's Q8_0, or head_dim e4m3 bytes; the other ops return a Status: kv_to_f16 first).
  quant::Type kv_type = quant::Type::F16;
  // attention_prefill_mma only: query rows per warp, 0 (auto: 32, or 16 when that grid leaves SMs without a second CTA
  // or at head_dim 256), 16 or 32 (head_dim <= 128).
  int prefill_warp_rows = 0;
  // attention_decode_mma only, when attention_decode_quantizes(head_dim, group): the output also as Q8_K rows
  // [n_tok, row_size(Q8_K, n_head * head_dim)] (quantize_activations' bytes, 4-byte aligned), in the same launch, for
  // the output projection's quantized product. Null: none (the other ops take only null).
  void* out_q8k = nullptr;
  // attention_decode_mma only, n_tok == 1: qkv_prepare's work for the token in the same launch (one launch fewer on
  // each decode layer's chain). q is then the raw query projection (read, not changed): each CTA norms (q_weight) and
  // rotates (RoPE by the rope table: rope_table() of pos0) its group's heads with qkv_prepare's arithmetic, and the CTA
  // whose split holds row pos0 norms and rotates k (k_weight) and stores it and v there in kv_type's format, as
  // qkv_prepare would: the call then writes that row of k_cache and v_cache. k, v: [n_head_kv, head_dim]. The weights
  // and the table are read before the launch before this one is done (ops::pdl_wait's rule): they must have been
  // written two or more launches earlier (a decode graph copies the table before its first kernel). Null k: none.
  struct Prepare {
    const float* q_weight = nullptr;  // [head_dim]
    const float* k = nullptr;
    const float* k_weight = nullptr;  // [head_dim]
    const float* v = nullptr;
    const float* rope = nullptr;  // [head_dim]: the pairs' cos, then their sin (rope_table)
    float eps = 1e-6f;
  } prepare = {};
  // attention_decode_mma only: the decode of n_tok sequences in one launch (1..kMaxDecodeSeqs, pos0_device set): token
  // t is sequence t's one new token, at position pos0_device[t], attending to its own caches seq_k[t] and seq_v[t]
  // (host arrays of n_tok device pointers, read at the call; k_cache and v_cache unused), each of at most max_rows
  // rows. q, out, out_q8k and prepare's k, v and rope hold the tokens' rows in that order. Each sequence gets the plan
  // a launch of it alone would make: the same bits as n_tok launches of one token (one launch instead of n_tok on the
  // step's chain), provided all take the same attention_decode_variant at their lengths (the caller's to check: the
  // launch takes the variant at pos0 + 1, pos0 being the first sequence's position at the call). The workspace must
  // have been created for n_tok sequences.
  const void* const* seq_k = nullptr;
  const void* const* seq_v = nullptr;
  // With seq_k: sequence t's token is row seq_tok[t] of q, out, out_q8k, prepare's k, v and rope and pos0_device (a
  // host array of n_tok distinct rows, read at the call; null: row t), so that a batch whose sequences take different
  // variants goes out as one launch per variant. The workspace must then hold max(seq_tok) + 1 sequences.
  const int32_t* seq_tok = nullptr;
  // With seq_k, attention_decode_mma: the device int holding the first row the launch just before this one wrote, when
  // the sequences are a few tokens of one sequence (speculative decoding's drafts: one cache, the rows of all its new
  // tokens stored before the call), read when the kernel runs (a graph replays the launch at other positions); the
  // kernel reads rows before it ahead of its programmatic-dependent wait. Null: each token's own position (a batched
  // decode: every sequence's new row is its token's, written by the launch itself). The tokens' positions are then
  // consecutive (pos0_device[seq_tok[t]] = that of token 0 plus t): with groups of 8 query heads (F16 and FP8 caches,
  // no window, no prepare) one CTA takes the tokens at an even position and the next together, reading the rows once
  // for both (the same bits as a launch each; MAGNETAR_CUDA_ATTN_DRAFT_PAIRS=0: a CTA per token).
  const int32_t* fresh_row = nullptr;
};
Status attention(const AttentionArgs& args, AttentionWorkspace& workspace, Stream& stream);

// Same contract as attention() (same AttentionArgs incl. pos0_device, same workspace), computed on f16 tensor cores
// (attention.cu's decode kernel): Q * scale rounded to f16, scores and softmax in f32, P rounded to f16 for P V, f32
// accumulation -- the numerics of attention_prefill_mma, whose bound tests/cuda/cuda_attention_test.cpp states for
// both.
// Its own split plan (attn::plan_decode: one wave of CTAs, splits of whole steps of 16 rows per warp); each warp
// streams its rows through a cp.async ring in shared memory, and the last CTA of each KV head combines the splits (no
// second launch).
// Launched with programmatic dependent launch, it starts copying the cached rows before pos0 while the launch before
// it still runs: those rows must have been written at least two launches earlier (or by a copy); rows pos0 and later
// (this call's own tokens) may come from the launch just before.
// Meant for decode (n_tok == 1: split-K); n_tok > 1 runs one CTA per (token, KV head) as attention() does.
// Supported (has_attention_decode_mma): head_dim 64 or 128 with a group up to 16, 256 with a group up to 8, where the
// device has the kernel's shared memory (head_dim 256 needs ~144 KB: not on GPUs of 99 KB a CTA); q and out
// 16-byte aligned. Any other shape returns a Status (callers fall back to attention(), through kv_to_f16 for a Q8_0
// cache).
// A Q8_0 cache (kv_type) is read as stored, each row dequantized in shared memory to kv_to_f16's values f16(d * q);
// not promised bit-identical with the call over kv_to_f16's F16 copy (at head_dim 128 the Q8_0 kernel runs 12 warps
// per CTA: another merge order; attention_decode_variant).
// Over a kv_to_f16 copy made by the launch just before it, an F16 call would read rows older than pos0 before that
// launch is done (the contract above): give it a copy made at least two launches earlier.
Status attention_decode_mma(const AttentionArgs& args, AttentionWorkspace& workspace, Stream& stream);
bool has_attention_decode_mma(int64_t head_dim, int64_t group);
// The warps per CTA of the kernel attention_decode_mma takes for a call over `rows` cached rows (a graph's launch:
// the rows at capture): 12 for a Q8_0 cache at head_dim 128 at every length where the GPU has the shared memory
// (Hopper; the kernel has 8 for groups of more than 8 query heads; MAGNETAR_CUDA_ATTN_WIDE_ROWS=N: only from N rows,
// 4 below; MAGNETAR_CUDA_ATTN_Q8_WARPS=8 asks 8 for all), 8 for an F16 cache at head_dim 128 up to 4,096 rows
// (MAGNETAR_CUDA_ATTN_SHORT_ROWS=N moves that bound, 0 turns it off), else 4. A decode graph's key holds it, so that a
// sequence crossing a bound is captured again.
int attention_decode_variant(int64_t head_dim, quant::Type kv_type, int64_t rows);
// Whether attention_decode_mma can also write its output as Q8_K (AttentionArgs::out_q8k): group * head_dim a multiple
// of 256, each KV head's outputs whole blocks.
bool attention_decode_quantizes(int64_t head_dim, int64_t group);

// Same contract as attention() for n_tok >= 1 (same AttentionArgs, same masking incl. window, same layouts), but
// computed with f16 tensor-core products (attention_prefill.cu, flash-attention-2 tiling: one CTA per tile of query
// tokens and KV head, so each K/V row is read once per tile of tokens instead of once per token): Q * scale is
// rounded to f16, scores and the softmax in f32, P rounded to f16 for P V, f32 accumulation. Not bit-identical
// with attention(); tests/cuda/cuda_attention_test.cpp states the bound. Supported: head_dim 64, 128 or 256, any group
// up to kMaxAttentionGroup; k_cache and v_cache 16-byte aligned (as attention() needs). Any other
// shape returns a Status (callers fall back to attention()). Allocates nothing (no workspace); a bad argument
// returns a Status naming it and queues nothing. Meant for prefill: with few query tokens it keeps few SMs busy.
Status attention_prefill_mma(const AttentionArgs& args, Stream& stream);
// Whether attention_prefill_mma has a kernel for this head size (64, 128, 256).
bool has_attention_prefill_mma(int64_t head_dim);

}  // namespace magnetar::cuda
