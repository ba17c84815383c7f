// A tiny synthetic qwen3moe written with gguf::Writer, shared by the model and engine tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/writer.h"
#include "quant/quant.h"

namespace magnetar::testing {

using gguf::Value;
using gguf::ValueType;

// A tiny qwen3moe: 2 layers (layer 1 dense), hidden 64, 4 heads / 2 kv heads of 16, 4 experts top-2.
// k_quant_rows: every product's input length a multiple of 256 (hidden 256, heads of 64, FFNs of 256), as
// the K-quants' super-blocks need. hidden > 0: that hidden size instead (a multiple of 256 with k_quant_rows).
// moe_layers: that many MoE layers before the dense one. context_length: the training context it states. more: the
// type of the output matrix and of attn_v and ffn_down(_exps) in the odd layers (as llama.cpp's Q4_K_M mix gives
// some layers' Q6_K; F32: `type` as the rest).
inline void write_tiny(const std::string& path, quant::Type type, uint64_t seed, bool k_quant_rows = false,
                       int64_t hidden = 0, int moe_layers = 1, int64_t context_length = 256,
                       quant::Type more = quant::Type::F32) {
  const int64_t E = hidden > 0     ? hidden
                    : k_quant_rows ? 256
                                   : 64,
                H = 4, HKV = 2, D = k_quant_rows ? 64 : 16, X = 4, FE = k_quant_rows ? 256 : 32,
                FF = k_quant_rows ? 256 : 96, V = 97;
  gguf::Writer w(path);
  auto u32 = [](int64_t v) { return Value::of_uint(ValueType::kUint32, uint64_t(v)); };
  w.set("general.architecture", Value::of_string("qwen3moe"));
  const int n_layer = moe_layers + 1;
  w.set("qwen3moe.block_count", u32(n_layer));
  w.set("qwen3moe.context_length", u32(context_length));
  w.set("qwen3moe.embedding_length", u32(E));
  w.set("qwen3moe.feed_forward_length", u32(FF));
  w.set("qwen3moe.attention.head_count", u32(H));
  w.set("qwen3moe.attention.head_count_kv", u32(HKV));
  w.set("qwen3moe.attention.key_length", u32(D));
  w.set("qwen3moe.attention.layer_norm_rms_epsilon", Value::of_float(ValueType::kFloat32, 1e-6));
  w.set("qwen3moe.rope.freq_base", Value::of_float(ValueType::kFloat32, 10000.0));
  w.set("qwen3moe.expert_count", u32(X));
  w.set("qwen3moe.expert_used_count", u32(2));
  w.set("qwen3moe.expert_feed_forward_length", u32(FE));
  struct Spec {
    std::string name;
    std::vector<int64_t> dims;
    bool norm;
  };
  std::vector<Spec> specs = {{"token_embd.weight", {E, V}, false}, {"output_norm.weight", {E}, true},
                             {"output.weight", {E, V}, false}};
  for (int l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (auto& s : std::vector<Spec>{{p + "attn_norm.weight", {E}, true}, {p + "attn_q.weight", {E, H * D}, false},
                                     {p + "attn_k.weight", {E, HKV * D}, false}, {p + "attn_v.weight", {E, HKV * D}, false},
                                     {p + "attn_output.weight", {H * D, E}, false}, {p + "attn_q_norm.weight", {D}, true},
                                     {p + "attn_k_norm.weight", {D}, true}, {p + "ffn_norm.weight", {E}, true}}) {
      specs.push_back(s);
    }
    if (l < moe_layers) {
      specs.push_back({p + "ffn_gate_inp.weight", {E, X}, false});
      specs.push_back({p + "ffn_gate_exps.weight", {E, FE, X}, false});
      specs.push_back({p + "ffn_up_exps.weight", {E, FE, X}, false});
      specs.push_back({p + "ffn_down_exps.weight", {FE, E, X}, false});
    } else {
      specs.push_back({p + "ffn_gate.weight", {E, FF}, false});
      specs.push_back({p + "ffn_up.weight", {E, FF}, false});
      specs.push_back({p + "ffn_down.weight", {FF, E}, false});
    }
  }
  std::vector<quant::Type> types;
  for (const Spec& s : specs) {
    const bool keep_f32 = s.norm || s.name.find("gate_inp") != std::string::npos;
    const bool odd = s.name.rfind("blk.", 0) == 0 && std::stoi(s.name.substr(4)) % 2 == 1;
    const bool gets_more =
        more != quant::Type::F32 &&
        (s.name == "output.weight" ||
         (odd && (s.name.find("attn_v.") != std::string::npos || s.name.find("ffn_down") != std::string::npos)));
    types.push_back(keep_f32 ? quant::Type::F32 : gets_more ? more : type);
    ASSERT_TRUE(w.add_tensor(s.name, uint32_t(types.back()), s.dims).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    // Matrices N(0, 0.25), rows of an explicit hidden size scaled by sqrt(256 / row length): a product's outputs then
    // have the magnitude they have at the K-quant rows' 256 columns (at 2,048 columns, unscaled, each product made
    // them 2.8 times larger and the logits ran to hundreds, where the GPU's and the CPU's rounding differences of
    // ~1e-4 relative made logit gaps of 0.4).
    const float spread = hidden > 0 && !specs[i].norm ? std::sqrt(256.0f / float(specs[i].dims[0])) : 1.0f;
    std::normal_distribution<float> dist(specs[i].norm ? 1.0f : 0.0f, specs[i].norm ? 0.1f : 0.25f * spread);
    for (float& v : values) v = dist(rng);
    std::vector<uint8_t> bytes(quant::row_size(types[i], specs[i].dims[0]) * size_t(n / specs[i].dims[0]));
    for (int64_t r = 0; r < n / specs[i].dims[0]; ++r) {
      quant::traits(types[i]).from_float(values.data() + r * specs[i].dims[0],
                                         bytes.data() + size_t(r) * quant::row_size(types[i], specs[i].dims[0]),
                                         specs[i].dims[0]);
    }
    ASSERT_TRUE(w.write(bytes).ok());
  }
  ASSERT_TRUE(w.finish().ok());
}

}  // namespace magnetar::testing
