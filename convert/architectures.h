// The Hugging Face architectures `magnetar convert` understands: one table row each, mapping config.json to
// llama.cpp's GGUF metadata keys and the checkpoint's tensors to llama.cpp's tensor names and shapes.
//
// Adding an architecture is one row in kArchitectures (architectures.cpp) plus one plan function; the shared
// helpers there read the common hyperparameters (attention geometry, RoPE, norms) and validate tensors.
// A plan only describes the output: which GGUF tensors, their ggml shapes, and which rows of which source
// tensors fill them. The driver (convert.h) streams the bytes, so no plan ever holds tensor data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "convert/hf_model.h"
#include "gguf/gguf.h"

namespace magnetar::convert {

// What the output type of a tensor follows: the requested --outtype, or F32 whatever was asked (llama.cpp
// keeps MoE routers in F32; 1-D tensors such as norms and biases are F32 by their shape alone).
enum class TensorKind { kWeight, kKeepF32 };

// Rows [row_begin, row_begin + n_rows) of a source tensor viewed as a matrix whose rows are its innermost
// (last PyTorch) dimension. A 1-D tensor is one row.
struct SourceRows {
  const SafeTensor* tensor = nullptr;
  int64_t row_begin = 0;
  int64_t n_rows = 0;
};

struct PlannedTensor {
  std::string name;         // GGUF name, e.g. "blk.0.ffn_gate_exps.weight"
  std::vector<int64_t> ne;  // ggml order (innermost first) = the PyTorch shape reversed
  TensorKind kind = TensorKind::kWeight;
  std::vector<SourceRows> sources;  // concatenated in order; their rows are the output's rows, in order

  int64_t row_length() const { return ne[0]; }
  int64_t n_rows() const;  // product of ne[1..]
};

struct ModelPlan {
  std::string arch;                      // GGUF general.architecture, e.g. "qwen3moe"
  int64_t n_vocab = 0;                   // config.json vocab_size (the tokenizer pads its list to it)
  std::vector<gguf::KeyValue> metadata;  // "<arch>.*" hyperparameters, in llama.cpp's order
  std::vector<PlannedTensor> tensors;    // empty when planned without weights (--vocab-only)
};

// Builds the plan of `model`. Without weights only the metadata is planned. Errors name config.json and
// the field, or the safetensors file and the tensor (missing, ill-shaped, unsupported dtype, unused).
using PlanFn = Result<ModelPlan> (*)(const HfModel& model, bool with_weights);

struct Architecture {
  std::string_view hf_name;    // config.json "architectures"[0]
  std::string_view gguf_name;  // general.architecture
  PlanFn plan;
};

std::span<const Architecture> architectures();
// nullptr when unsupported.
const Architecture* find_architecture(std::string_view hf_name);
// "Qwen3ForCausalLM, Qwen3MoeForCausalLM", for error messages.
std::string supported_architectures();

}  // namespace magnetar::convert
