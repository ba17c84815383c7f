// The architecture registry: one row per supported `general.architecture`.
#include "models/model.h"
#include "models/qwen3_moe/qwen3_moe.h"

#ifdef MAGNETAR_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#define MAGNETAR_CUDA_LOADER(f) f
#else
#define MAGNETAR_CUDA_LOADER(f) nullptr
#endif

namespace magnetar::models {
namespace {

constexpr Architecture kArchitectures[] = {
    {"qwen3", load_qwen3, MAGNETAR_CUDA_LOADER(load_qwen3_cuda)},
    {"qwen3moe", load_qwen3, MAGNETAR_CUDA_LOADER(load_qwen3_cuda)},
};

}  // namespace

const char* op_name(Op op) {
  static constexpr const char* kNames[int(Op::kCount)] = {
      "embed", "norms", "q/k/v proj", "q/k norm+rope", "attention", "attn out proj", "router",
      "experts gate+up", "experts down", "experts other", "experts wait", "dense ffn", "lm head",
      "device (gpu)", "host + sync"};
  return kNames[int(op)];
}

GpuInfo gpu_info() {
  GpuInfo info;
#ifdef MAGNETAR_WITH_CUDA
  if (cuda::device_count() > 0) {
    if (Result<cuda::DeviceInfo> d = cuda::device_info(); d.ok()) {
      info = {.present = true, .name = d->name, .free_bytes = d->free_bytes, .total_bytes = d->total_bytes,
              .peak_bytes_per_s = d->peak_bytes_per_s};
    }
  }
#endif
  return info;
}

const Architecture* find_architecture(const std::string& arch) {
  for (const Architecture& a : kArchitectures) {
    if (arch == a.name) return &a;
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const Architecture& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace magnetar::models
