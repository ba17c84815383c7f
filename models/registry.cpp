// The architecture registry: one row per supported `general.architecture`.
#include "models/model.h"
#include "models/qwen3_moe/qwen3_moe.h"

namespace magnetar::models {
namespace {

constexpr Architecture kArchitectures[] = {
    {"qwen3", load_qwen3},
    {"qwen3moe", load_qwen3},
};

}  // namespace

const char* op_name(Op op) {
  static constexpr const char* kNames[int(Op::kCount)] = {
      "embed", "norms", "q/k/v proj", "q/k norm+rope", "attention", "attn out proj", "router",
      "experts gate+up", "experts down", "experts other", "experts wait", "dense ffn", "lm head"};
  return kNames[int(op)];
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
