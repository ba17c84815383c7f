// Qwen3 (dense) and Qwen3-MoE: one implementation, registered as `qwen3` and `qwen3moe`.
#pragma once

#include <memory>

#include "base/status.h"
#include "gguf/reader.h"
#include "models/model.h"

namespace magnetar::models {

Result<std::unique_ptr<Model>> load_qwen3(const gguf::Model& file);
// qwen3_moe_cuda.cpp (CUDA builds only).
Result<std::unique_ptr<Model>> load_qwen3_cuda(const gguf::Model& file, const CudaLoad& options);

}  // namespace magnetar::models
