// Helpers for the converter tests: safetensors files and tiny Hugging Face model folders written from C++.
//
// Tensor values are small multiples of 1/8 (exact in F32, F16 and BF16), a function of the tensor's name and
// the element index, so a test can predict every converted value without running the converter's code.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/fp16.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::testing {

// The value of element i of tensor `name` (exact in every float format the tests use).
inline float test_value(const std::string& name, int64_t i) {
  uint32_t h = 2166136261u;  // FNV-1a of the name: different tensors get different patterns
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  return float(int64_t((uint64_t(i) * 7 + h) % 29) - 14) / 8.0f;
}

inline std::vector<uint8_t> encode(const std::vector<float>& values, const std::string& dtype) {
  std::vector<uint8_t> out;
  for (float v : values) {
    if (dtype == "F32") {
      uint8_t b[4];
      std::memcpy(b, &v, 4);
      out.insert(out.end(), b, b + 4);
    } else {
      const uint16_t h = dtype == "F16" ? quant::float_to_fp16(v) : quant::float_to_bf16(v);
      out.push_back(uint8_t(h));
      out.push_back(uint8_t(h >> 8));
    }
  }
  return out;
}

struct StTensor {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", or anything for hostile tests
  std::vector<int64_t> shape;  // PyTorch order
  std::vector<uint8_t> bytes;
};

// A tensor filled with test_value(name, i).
inline StTensor make_tensor(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = test_value(name, i);
  return {name, dtype, shape, encode(v, dtype)};
}

// Safetensors bytes with a hand-made header (hostile tests) followed by `data`.
inline std::vector<uint8_t> safetensors_raw(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(n >> (8 * i)));
  for (char c : header) out.push_back(uint8_t(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A well-formed safetensors file holding `tensors` in order, header padded to 8 bytes as the library does.
inline std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors,
                                              const nlohmann::json& metadata = nullptr) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.is_null()) header["__metadata__"] = metadata;
  std::vector<uint8_t> data;
  for (const StTensor& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  return safetensors_raw(text, data);
}

// A tiny Qwen3 / Qwen3-MoE checkpoint: geometry, config.json and tensors under their HF names.
struct TinyQwen3 {
  bool moe = true;
  int64_t n_vocab = 64, n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, head_dim = 16;
  int64_t n_expert = 4, n_expert_used = 2, n_ff_exp = 64, n_ff = 96;
  bool tied = false;
  bool fused_experts = false;         // transformers 5 layout: experts.gate_up_proj / experts.down_proj
  std::vector<int64_t> dense_layers;  // listed in mlp_only_layers
  std::string dtype = "F32";

  nlohmann::json config() const {
    nlohmann::json c = {{"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
                        {"model_type", moe ? "qwen3_moe" : "qwen3"},
                        {"vocab_size", n_vocab},
                        {"hidden_size", n_embd},
                        {"num_hidden_layers", n_layer},
                        {"num_attention_heads", n_head},
                        {"num_key_value_heads", n_head_kv},
                        {"head_dim", head_dim},
                        {"intermediate_size", n_ff},
                        {"max_position_embeddings", 40960},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 1000000.0},
                        {"rope_scaling", nullptr},
                        {"tie_word_embeddings", tied},
                        {"use_sliding_window", false},
                        {"sliding_window", 4096},
                        {"attention_bias", false},
                        {"torch_dtype", "bfloat16"}};
    if (moe) {
      c["num_experts"] = n_expert;
      c["num_experts_per_tok"] = n_expert_used;
      c["moe_intermediate_size"] = n_ff_exp;
      c["norm_topk_prob"] = true;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = dense_layers;
    }
    return c;
  }

  bool is_dense(int64_t l) const {
    if (!moe) return true;
    for (int64_t d : dense_layers) {
      if (d == l) return true;
    }
    return false;
  }

  // Every tensor of the checkpoint, in the order HF writes them (embeddings, layers, norm, head).
  std::vector<StTensor> tensors() const {
    std::vector<StTensor> t;
    auto add = [&](const std::string& name, std::vector<int64_t> shape) {
      t.push_back(make_tensor(name, shape, dtype));
    };
    add("model.embed_tokens.weight", {n_vocab, n_embd});
    for (int64_t l = 0; l < n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {n_embd});
      add(p + "self_attn.q_proj.weight", {n_head * head_dim, n_embd});
      add(p + "self_attn.k_proj.weight", {n_head_kv * head_dim, n_embd});
      add(p + "self_attn.v_proj.weight", {n_head_kv * head_dim, n_embd});
      add(p + "self_attn.o_proj.weight", {n_embd, n_head * head_dim});
      add(p + "self_attn.q_norm.weight", {head_dim});
      add(p + "self_attn.k_norm.weight", {head_dim});
      add(p + "post_attention_layernorm.weight", {n_embd});
      if (is_dense(l)) {
        add(p + "mlp.gate_proj.weight", {n_ff, n_embd});
        add(p + "mlp.up_proj.weight", {n_ff, n_embd});
        add(p + "mlp.down_proj.weight", {n_embd, n_ff});
        continue;
      }
      add(p + "mlp.gate.weight", {n_expert, n_embd});
      if (fused_experts) {
        add(p + "mlp.experts.gate_up_proj", {n_expert, 2 * n_ff_exp, n_embd});
        add(p + "mlp.experts.down_proj", {n_expert, n_embd, n_ff_exp});
        continue;
      }
      for (int64_t e = 0; e < n_expert; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(x + "gate_proj.weight", {n_ff_exp, n_embd});
        add(x + "up_proj.weight", {n_ff_exp, n_embd});
        add(x + "down_proj.weight", {n_embd, n_ff_exp});
      }
    }
    add("model.norm.weight", {n_embd});
    if (!tied) add("lm_head.weight", {n_vocab, n_embd});
    return t;
  }
};

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Writes config.json and the tensors: one model.safetensors, or `n_shards` files with an index.
inline void write_hf_folder(const std::string& dir, const nlohmann::json& config, const std::vector<StTensor>& tensors,
                            int n_shards = 1) {
  write_text(dir + "/config.json", config.dump(2));
  if (n_shards == 1) {
    write_all(dir + "/model.safetensors", safetensors_bytes(tensors, {{"format", "pt"}}));
    return;
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (int s = 0; s < n_shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    std::vector<StTensor> part;
    for (size_t i = size_t(s); i < tensors.size(); i += size_t(n_shards)) {
      part.push_back(tensors[i]);
      index["weight_map"][tensors[i].name] = name;
    }
    write_all(dir + "/" + name, safetensors_bytes(part, {{"format", "pt"}}));
  }
  write_text(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace magnetar::testing
