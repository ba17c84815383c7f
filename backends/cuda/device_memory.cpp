// DeviceBuffer and Stream: RAII owners of cudaMalloc'd memory and CUDA streams (cuda_backend.h).
// Allocation failures and a missing device are expected failures (a Status); every other CUDA call goes
// through CUDA_CHECK.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/launch.h"

namespace magnetar::cuda {

// ---- DeviceBuffer -------------------------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer buf;
  if (bytes == 0) return Result<DeviceBuffer>(std::move(buf));
  if (device_count() == 0) return Status::error("DeviceBuffer: no CUDA device");
  const cudaError_t err = cudaMalloc(&buf.data_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not report it
    buf.data_ = nullptr;
    return Status::error(format("DeviceBuffer: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(err)));
  }
  buf.bytes_ = bytes;
  return Result<DeviceBuffer>(std::move(buf));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) CUDA_CHECK(cudaFree(data_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) CUDA_CHECK(cudaFree(data_));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Status DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return Status::error(format("DeviceBuffer::upload: %zu bytes at offset %zu exceed the buffer's %zu", bytes,
                                offset, bytes_));
  }
  if (bytes != 0) {
    CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy returns once the bytes are staged, before the DMA has landed, and only the
    // legacy default stream is ordered after it: a kernel on one of our non-blocking streams could read the old
    // contents (seen: CudaOps tests failing on their last rows). Wait for the copy itself.
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  return Status();
}

Status DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return Status::error(format("DeviceBuffer::download: %zu bytes at offset %zu exceed the buffer's %zu", bytes,
                                offset, bytes_));
  }
  if (bytes != 0) {
    CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
  }
  return Status();
}

// ---- Stream -------------------------------------------------------------------------------------------------------

Result<Stream> Stream::create() {
  if (device_count() == 0) return Status::error("Stream: no CUDA device");
  Stream s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  return Result<Stream>(std::move(s));
}

Stream::~Stream() {
  if (stream_ != nullptr) CUDA_CHECK(cudaStreamDestroy(stream_));
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) CUDA_CHECK(cudaStreamDestroy(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void Stream::copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void Stream::wait(const Event& event) { CUDA_CHECK(cudaStreamWaitEvent(stream_, event.event_, 0)); }

// ---- Event --------------------------------------------------------------------------------------------------------

Result<Event> Event::create() {
  if (device_count() == 0) return Status::error("Event: no CUDA device");
  Event e;
  CUDA_CHECK(cudaEventCreate(&e.event_));
  return Result<Event>(std::move(e));
}

Event::~Event() {
  if (event_ != nullptr) CUDA_CHECK(cudaEventDestroy(event_));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) CUDA_CHECK(cudaEventDestroy(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(Stream& stream) { CUDA_CHECK(cudaEventRecord(event_, stream.raw())); }

void Event::synchronize() { CUDA_CHECK(cudaEventSynchronize(event_)); }

double Event::seconds_between(const Event& start, const Event& end) {
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return double(ms) * 1e-3;
}

// ---- Graph --------------------------------------------------------------------------------------------------------

Graph::~Graph() {
  if (exec_ != nullptr) CUDA_CHECK(cudaGraphExecDestroy(exec_));
}

Graph::Graph(Graph&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) CUDA_CHECK(cudaGraphExecDestroy(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void Graph::begin_capture(Stream& stream) {
  // Thread-local: other threads' CUDA calls (the RAM tier, the disk KV writer) neither join nor break it.
  CUDA_CHECK(cudaStreamBeginCapture(stream.raw(), cudaStreamCaptureModeThreadLocal));
}

Result<Graph> Graph::end_capture(Stream& stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream.raw(), &graph);
  if (err != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    if (graph != nullptr) CUDA_CHECK(cudaGraphDestroy(graph));
    return Status::error(format("CUDA graph capture failed: %s", cudaGetErrorString(err)));
  }
  Graph g;
  const cudaError_t inst = cudaGraphInstantiate(&g.exec_, graph, 0);
  CUDA_CHECK(cudaGraphDestroy(graph));
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    g.exec_ = nullptr;
    return Status::error(format("CUDA graph instantiation failed: %s", cudaGetErrorString(inst)));
  }
  return Result<Graph>(std::move(g));
}

void Graph::launch(Stream& stream) const { CUDA_CHECK(cudaGraphLaunch(exec_, stream.raw())); }

// ---- PinnedBuffer ---------------------------------------------------------------------------------------------------

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer buf;
  if (bytes == 0) return Result<PinnedBuffer>(std::move(buf));
  if (device_count() == 0) return Status::error("PinnedBuffer: no CUDA device");
  const cudaError_t err = cudaMallocHost(&buf.data_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    buf.data_ = nullptr;
    return Status::error(format("PinnedBuffer: cudaMallocHost of %zu bytes failed: %s", bytes, cudaGetErrorString(err)));
  }
  buf.bytes_ = bytes;
  return Result<PinnedBuffer>(std::move(buf));
}

Result<HostRegistration> HostRegistration::create(void* data, size_t bytes) {
  HostRegistration r;
  if (data == nullptr || bytes == 0) return Result<HostRegistration>(std::move(r));
  const cudaError_t err = cudaHostRegister(data, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::error(format("cudaHostRegister of %.2f GiB of host memory failed: %s",
                                double(bytes) / double(1ull << 30), cudaGetErrorString(err)));
  }
  r.data_ = data;
  return Result<HostRegistration>(std::move(r));
}

HostRegistration::~HostRegistration() {
  if (data_ != nullptr) CUDA_CHECK(cudaHostUnregister(data_));
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) CUDA_CHECK(cudaHostUnregister(data_));
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) CUDA_CHECK(cudaFreeHost(data_));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) CUDA_CHECK(cudaFreeHost(data_));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// ---- device features: programmatic dependent launch, thread-block clusters ------------------------------------------

namespace {
// Whether the current device's `attr` is at least `min`, unless the environment switch `name` is "0" (a baseline).
bool device_feature(const char* name, cudaDeviceAttr attr, int min) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::string_view(v) == "0") return false;
  int dev = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
  return value >= min;
}
}  // namespace

bool detail::pdl_enabled() {
  static const bool enabled = device_feature("MAGNETAR_CUDA_PDL", cudaDevAttrComputeCapabilityMajor, 9);
  return enabled;
}

bool detail::norm_clusters() {
  static const bool enabled = device_feature("MAGNETAR_CUDA_NORM_CLUSTER", cudaDevAttrClusterLaunch, 1);
  return enabled;
}

// MAGNETAR_CUDA_SKIP (diagnostic; the results are wrong): a comma list of kernel name parts, e.g.
// "quantize_q8_kernel,swiglu_kernel"; launches of kernels whose (mangled) name contains one are dropped. The decode
// time with and without a kernel is its share of the step, boundaries with the kernels around it included (run.sh
// --decode-bench's MAGNETAR_CUDA_SKIP arms). Kernels that make device pointers (route_topk_kernel's items) must not be
// dropped.
bool detail::launch_skipped(const void* kernel) {
  static const char* const list = std::getenv("MAGNETAR_CUDA_SKIP");
  if (list == nullptr || *list == '\0') return false;
  static std::mutex mutex;
  static std::unordered_map<const void*, bool> skipped;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, inserted] = skipped.try_emplace(kernel, false);
  if (inserted) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kernel) == cudaSuccess && name != nullptr) {
      const std::string_view n = name;
      std::string_view parts = list;
      while (!parts.empty() && !it->second) {
        const size_t comma = parts.find(',');
        const std::string_view part = parts.substr(0, comma);
        it->second = !part.empty() && n.find(part) != std::string_view::npos;
        parts = comma == std::string_view::npos ? std::string_view() : parts.substr(comma + 1);
      }
    }
  }
  return it->second;
}

// ---- device_info ------------------------------------------------------------------------------------------------------

Result<DeviceInfo> device_info() {
  if (device_count() == 0) return Status::error("no CUDA device");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  DeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  int clock_khz = 0, bus_bits = 0;  // double data rate: two transfers per clock
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess) {
    info.peak_bytes_per_s = 2.0 * 1e3 * double(clock_khz) * double(bus_bits) / 8.0;
  }
  (void)cudaGetLastError();  // an attribute the driver does not report is not an error of the next call
  CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

}  // namespace magnetar::cuda
