// Qwen3 / Qwen3-MoE weights bound to typed structs (STYLE.md rule 3), shared by the CPU forward pass
// (qwen3_moe.cpp) and the CUDA one (qwen3_moe_cuda.cpp): one binding, two devices.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "experts/layout.h"
#include "gguf/reader.h"
#include "models/common/binder.h"
#include "models/model.h"

namespace magnetar::models {
namespace qwen3 {

struct Layer {
  int64_t window = 0;                     // sliding-window length of this layer (0: full attention)
  Tensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm;
  // MoE layers
  Tensor gate_inp;                        // [n_embd, n_expert] F32
  // [n_embd, n_ff_exp, n_expert], [n_ff_exp, n_embd, n_expert]: type and shape; the bytes come from the
  // ExpertSource (data is null for packed files, whose experts are records, not stacked tensors)
  Tensor gate_exps, up_exps, down_exps;
  // dense layers
  Tensor ffn_gate, ffn_up, ffn_down;      // [n_embd, n_ff], [n_ff, n_embd]
  bool moe() const { return gate_inp.present(); }
};

struct Weights {
  Tensor token_embd, output_norm, output;  // output absent when tied: token_embd is the LM head
  std::vector<Layer> layers;
};

}  // namespace qwen3

struct Qwen3Bound {
  HParams hp;
  qwen3::Weights w;
  std::unique_ptr<experts::ExpertLayout> layout;  // MoE models only
};

// Reads the hyper-parameters and binds every tensor; every mismatch is an error naming the tensor or key.
Result<Qwen3Bound> bind_qwen3(const gguf::Model& file);

}  // namespace magnetar::models
