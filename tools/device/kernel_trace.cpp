// A CUPTI injection library that records every kernel's start and end on the GPU (nsys is not usable on the device
// image: tools/device/run.sh --kernel-trace). The CUDA driver loads it when CUDA_INJECTION64_PATH names it and calls
// InitializeInjection; kernels are traced as concurrent-kernel activity records (no serialization: programmatic
// dependent launches still overlap), including the kernel nodes of CUDA graphs. Each record is appended as it is
// delivered to KERNEL_TRACE_OUT (default kernel_trace.csv): start_ns,end_ns,stream,graph_node,name (the mangled name,
// quoted). Memory copies are rows too, named "memcpy HtoD 8192" (direction, bytes); the host's calls that start and
// wait for GPU work (graph launches, synchronizations, on the host's side of the same clock) are rows named
// "api:cudaGraphLaunch..." on stream 0. Analysis: tools/device/kernel_gaps.py.
//
// Build (on the device, against its own CUPTI): g++ -std=c++17 -O2 -shared -fPIC -I$CUDA/include
//   -I$CUDA/extras/CUPTI/include tools/device/kernel_trace.cpp -L$CUDA/lib64 -L$CUDA/extras/CUPTI/lib64 -lcupti
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;
std::mutex g_mutex;
FILE* g_out = nullptr;
uint64_t g_dropped = 0;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (g_out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      const char* dir = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                        : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                                                                         : "other";
      std::fprintf(g_out, "%llu,%llu,%u,%llu,\"memcpy %s %llu\"\n", (unsigned long long)m->start,
                   (unsigned long long)m->end, m->streamId, (unsigned long long)m->graphNodeId, dir,
                   (unsigned long long)m->bytes);
      continue;
    }
    if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || name == nullptr) {
        continue;
      }
      if (std::strstr(name, "GraphLaunch") == nullptr && std::strstr(name, "Synchronize") == nullptr) continue;
      std::fprintf(g_out, "%llu,%llu,0,0,\"api:%s\"\n", (unsigned long long)a->start, (unsigned long long)a->end, name);
      continue;
    }
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(g_out, "%llu,%llu,%u,%llu,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end,
                 k->streamId, (unsigned long long)k->graphNodeId, k->name != nullptr ? k->name : "?");
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) g_dropped += dropped;
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out == nullptr) return;
  if (g_dropped != 0) std::fprintf(stderr, "kernel_trace: %llu records dropped\n", (unsigned long long)g_dropped);
  std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  g_out = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (g_out == nullptr) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path != nullptr ? path : "kernel_trace.csv");
    return 0;
  }
  std::fprintf(g_out, "start_ns,end_ns,stream,graph_node,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity trace\n");
    return 0;
  }
  std::atexit(finish);
  return 1;
}
