// `magnetar convert` on tiny Qwen3 / Qwen3-MoE folders written by the tests: the GGUF read back has
// llama.cpp's names, ggml shapes (the PyTorch shape reversed), llama.cpp's type choices, the source values
// (experts stacked with expert e in slice e) and metadata equal to config.json's fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "convert/convert.h"
#include "gguf/reader.h"
#include "quant/quant.h"
#include "tests/unit/convert_test_util.h"

namespace magnetar {
namespace convert_model_test {

using testing::test_value;
using testing::TinyQwen3;

struct Folder {
  testing::TempDir tmp;
  std::string dir = tmp.file("Tiny-Qwen3");  // the folder name becomes general.name
  std::string out = tmp.file("out.gguf");
  Folder() { std::filesystem::create_directory(dir); }
};

Status convert_folder(const Folder& f, convert::OutType type, bool vocab_only = false, int threads = 2) {
  return convert::convert({.hf_dir = f.dir,
                           .out_path = f.out,
                           .out_type = type,
                           .vocab_only = vocab_only,
                           .n_threads = threads,
                           .progress = nullptr});
}

std::unique_ptr<gguf::Model> open_gguf(const std::string& path) {
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<float> values_of(const gguf::TensorInfo& t) {
  const quant::TypeTraits* tr = quant::find_traits(t.type_id);
  std::vector<float> out(size_t(t.n_elements()));
  if (tr) tr->to_float(t.data, out.data(), t.n_elements());
  return out;
}

std::vector<int64_t> ne_of(const gguf::TensorInfo& t) {
  return std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims);
}

uint64_t meta_uint(const gguf::Model& m, const std::string& key) {
  const gguf::Value* v = m.find(key);
  EXPECT_NE(v, nullptr) << key;
  return v && v->as_uint() ? *v->as_uint() : ~0ull;
}

double meta_float(const gguf::Model& m, const std::string& key) {
  const gguf::Value* v = m.find(key);
  EXPECT_NE(v, nullptr) << key;
  return v && v->as_float() ? *v->as_float() : -1;
}

// Every element of GGUF tensor `name` equals test_value(hf_name, i): a plain, unstacked copy.
void expect_copy(const gguf::Model& m, const std::string& name, const std::string& hf_name) {
  const gguf::TensorInfo* t = m.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  const std::vector<float> v = values_of(*t);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], test_value(hf_name, int64_t(i))) << name << " element " << i;
}

TEST(Convert, Qwen3MoeNamesShapesTypesAndValues) {
  Folder f;
  const TinyQwen3 g;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  const Status s = convert_folder(f, convert::OutType::kF32);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->architecture(), "qwen3moe");
  // 1 + 12 per layer + 2: llama.cpp's qwen3moe tensor set.
  EXPECT_EQ(m->tensors().size(), size_t(1 + 12 * g.n_layer + 2));
  const int64_t H = g.n_embd, E = g.n_expert, I = g.n_ff_exp, q = g.n_head * g.head_dim, kv = g.n_head_kv * g.head_dim;
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"token_embd.weight", {H, g.n_vocab}},
      {"output_norm.weight", {H}},
      {"output.weight", {H, g.n_vocab}},
      {"blk.1.attn_norm.weight", {H}},
      {"blk.1.attn_q.weight", {H, q}},
      {"blk.1.attn_k.weight", {H, kv}},
      {"blk.1.attn_v.weight", {H, kv}},
      {"blk.1.attn_output.weight", {q, H}},
      {"blk.1.attn_q_norm.weight", {g.head_dim}},
      {"blk.1.attn_k_norm.weight", {g.head_dim}},
      {"blk.1.ffn_norm.weight", {H}},
      {"blk.1.ffn_gate_inp.weight", {H, E}},
      {"blk.1.ffn_gate_exps.weight", {H, I, E}},
      {"blk.1.ffn_up_exps.weight", {H, I, E}},
      {"blk.1.ffn_down_exps.weight", {I, H, E}},
  };
  for (const auto& [name, ne] : shapes) {
    const gguf::TensorInfo* t = m->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(ne_of(*t), ne) << name;
    EXPECT_EQ(t->type_id, uint32_t(quant::Type::F32)) << name;
  }
  expect_copy(*m, "token_embd.weight", "model.embed_tokens.weight");
  expect_copy(*m, "output.weight", "lm_head.weight");
  expect_copy(*m, "output_norm.weight", "model.norm.weight");
  expect_copy(*m, "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight");
  expect_copy(*m, "blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight");
  expect_copy(*m, "blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight");
  expect_copy(*m, "blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight");
  expect_copy(*m, "blk.1.ffn_gate_inp.weight", "model.layers.1.mlp.gate.weight");
  // Expert e occupies slice e of the stacked tensor.
  for (const char* w : {"gate", "up", "down"}) {
    const gguf::TensorInfo* t = m->find_tensor(std::string("blk.1.ffn_") + w + "_exps.weight");
    ASSERT_NE(t, nullptr);
    const std::vector<float> v = values_of(*t);
    const int64_t per_expert = H * I;
    for (int64_t e = 0; e < E; ++e) {
      const std::string hf = "model.layers.1.mlp.experts." + std::to_string(e) + "." + w + "_proj.weight";
      for (int64_t j = 0; j < per_expert; ++j) {
        ASSERT_EQ(v[size_t(e * per_expert + j)], test_value(hf, j)) << w << " expert " << e << " element " << j;
      }
    }
  }
}

TEST(Convert, Qwen3MoeMetadataMatchesConfig) {
  Folder f;
  const TinyQwen3 g;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  ASSERT_TRUE(convert_folder(f, convert::OutType::kF16).ok());
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->get_string("general.name"), "Tiny-Qwen3");
  EXPECT_EQ(m->get_string("general.type"), "model");
  EXPECT_EQ(meta_uint(*m, "general.file_type"), 1u);  // MOSTLY_F16
  EXPECT_EQ(meta_uint(*m, "general.quantization_version"), 2u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.block_count"), 2u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.context_length"), 40960u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.embedding_length"), 32u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.feed_forward_length"), 96u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.head_count"), 4u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.head_count_kv"), 2u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.key_length"), 16u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.value_length"), 16u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.expert_count"), 4u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.expert_feed_forward_length"), 64u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.expert_weights_norm"), 1u);
  EXPECT_EQ(m->find("qwen3moe.expert_weights_norm")->type, gguf::ValueType::kBool);
  EXPECT_EQ(meta_float(*m, "qwen3moe.rope.freq_base"), 1e6);
  EXPECT_FLOAT_EQ(float(meta_float(*m, "qwen3moe.attention.layer_norm_rms_epsilon")), 1e-6f);
  EXPECT_EQ(m->find("qwen3moe.attention.layer_norm_rms_epsilon")->type, gguf::ValueType::kFloat32);
  // use_sliding_window=false: transformers 5 nulls the window, so no key; no dense layers, no tokenizer.
  EXPECT_EQ(m->find("qwen3moe.attention.sliding_window"), nullptr);
  EXPECT_EQ(m->find("qwen3moe.mlp_only_layers"), nullptr);
  EXPECT_EQ(m->find("tokenizer.ggml.model"), nullptr);
  EXPECT_EQ(m->metadata()[0].key, "general.architecture");
}

TEST(Convert, ShardedBf16AndF16SourcesKeepTheirBits) {
  for (const char* dtype : {"BF16", "F16"}) {
    Folder f;
    TinyQwen3 g;
    g.dtype = dtype;
    testing::write_hf_folder(f.dir, g.config(), g.tensors(), /*n_shards=*/3);
    const convert::OutType out = std::string(dtype) == "BF16" ? convert::OutType::kBF16 : convert::OutType::kF16;
    const Status s = convert_folder(f, out);
    ASSERT_TRUE(s.ok()) << s.message();
    const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
    ASSERT_TRUE(m);
    const uint32_t want = uint32_t(out == convert::OutType::kBF16 ? quant::Type::BF16 : quant::Type::F16);
    EXPECT_EQ(m->find_tensor("blk.0.ffn_down_exps.weight")->type_id, want) << dtype;
    EXPECT_EQ(m->find_tensor("token_embd.weight")->type_id, want) << dtype;
    EXPECT_EQ(m->find_tensor("blk.0.ffn_gate_inp.weight")->type_id, uint32_t(quant::Type::F32)) << dtype;
    EXPECT_EQ(m->find_tensor("blk.0.attn_norm.weight")->type_id, uint32_t(quant::Type::F32)) << dtype;
    EXPECT_EQ(meta_uint(*m, "general.file_type"), out == convert::OutType::kBF16 ? 32u : 1u);
    expect_copy(*m, "blk.1.attn_v.weight", "model.layers.1.self_attn.v_proj.weight");
    expect_copy(*m, "blk.0.ffn_gate_inp.weight", "model.layers.0.mlp.gate.weight");
    const gguf::TensorInfo* down = m->find_tensor("blk.0.ffn_down_exps.weight");
    const std::vector<float> v = values_of(*down);
    const int64_t per = g.n_embd * g.n_ff_exp;
    for (int64_t j = 0; j < per; ++j) {
      ASSERT_EQ(v[size_t(3 * per + j)], test_value("model.layers.0.mlp.experts.3.down_proj.weight", j)) << j;
    }
  }
}

// F32 weights beyond f16's range, converted to f16, are infinite: the conversion says so, naming the tensor.
TEST(Convert, ValuesBeyondF16AreReported) {
  Folder f;
  TinyQwen3 g;
  std::vector<testing::StTensor> tensors = g.tensors();
  for (testing::StTensor& t : tensors) {
    if (t.name != "model.layers.1.self_attn.v_proj.weight") continue;
    const float big[2] = {1e6f, -7e4f};
    std::memcpy(t.bytes.data(), big, sizeof(big));
  }
  testing::write_hf_folder(f.dir, g.config(), tensors);
  ::testing::internal::CaptureStderr();
  const Status s = convert_folder(f, convert::OutType::kF16);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_NE(err.find("tensor 'blk.1.attn_v.weight': 2 values are infinite in f16"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;  // no other tensor
}

TEST(Convert, FusedTransformers5ExpertLayout) {
  Folder f;
  TinyQwen3 g;
  g.fused_experts = true;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  const Status s = convert_folder(f, convert::OutType::kF32);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  const int64_t H = g.n_embd, I = g.n_ff_exp, E = g.n_expert;
  const std::string fused = "model.layers.0.mlp.experts.gate_up_proj";  // [E, 2I, H]: gate rows, then up rows
  const gguf::TensorInfo* gate = m->find_tensor("blk.0.ffn_gate_exps.weight");
  const gguf::TensorInfo* up = m->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_TRUE(gate && up);
  EXPECT_EQ(ne_of(*gate), (std::vector<int64_t>{H, I, E}));
  EXPECT_EQ(ne_of(*up), (std::vector<int64_t>{H, I, E}));
  const std::vector<float> vg = values_of(*gate), vu = values_of(*up);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < I; ++r) {
      for (int64_t c = 0; c < H; ++c) {
        const size_t out = size_t((e * I + r) * H + c);
        ASSERT_EQ(vg[out], test_value(fused, (e * 2 * I + r) * H + c));
        ASSERT_EQ(vu[out], test_value(fused, (e * 2 * I + I + r) * H + c));
      }
    }
  }
  EXPECT_EQ(ne_of(*m->find_tensor("blk.0.ffn_down_exps.weight")), (std::vector<int64_t>{I, H, E}));
  expect_copy(*m, "blk.0.ffn_down_exps.weight", "model.layers.0.mlp.experts.down_proj");
}

TEST(Convert, Q8_0WeightsF32RoutersAndF16FallbackForOddRows) {
  Folder f;
  TinyQwen3 g;
  g.n_ff_exp = 48;  // down_exps rows of 48 are not a multiple of Q8_0's 32-element block
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  ASSERT_TRUE(convert_folder(f, convert::OutType::kQ8_0).ok());
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(meta_uint(*m, "general.file_type"), 7u);  // MOSTLY_Q8_0
  EXPECT_EQ(m->find_tensor("blk.0.ffn_gate_exps.weight")->type_id, uint32_t(quant::Type::Q8_0));
  EXPECT_EQ(m->find_tensor("token_embd.weight")->type_id, uint32_t(quant::Type::Q8_0));
  EXPECT_EQ(m->find_tensor("output.weight")->type_id, uint32_t(quant::Type::Q8_0));
  EXPECT_EQ(m->find_tensor("blk.0.ffn_down_exps.weight")->type_id, uint32_t(quant::Type::F16));
  EXPECT_EQ(m->find_tensor("blk.0.ffn_gate_inp.weight")->type_id, uint32_t(quant::Type::F32));
  EXPECT_EQ(m->find_tensor("blk.0.attn_q_norm.weight")->type_id, uint32_t(quant::Type::F32));
  // Q8_0 error bound: half a quantization step, step = block amax / 127 <= 1.75 / 127.
  const std::vector<float> v = values_of(*m->find_tensor("blk.1.attn_q.weight"));
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_NEAR(v[i], test_value("model.layers.1.self_attn.q_proj.weight", int64_t(i)), 0.5 * 1.75 / 127 + 1e-3) << i;
  }
  const std::vector<float> down = values_of(*m->find_tensor("blk.0.ffn_down_exps.weight"));
  const int64_t per = g.n_embd * g.n_ff_exp;
  for (int64_t j = 0; j < per; ++j) {
    ASSERT_EQ(down[size_t(2 * per + j)], test_value("model.layers.0.mlp.experts.2.down_proj.weight", j)) << j;
  }
}

TEST(Convert, Transformers5ConfigSpellings) {
  Folder f;
  TinyQwen3 g;
  g.head_dim = 8;  // = hidden_size / num_attention_heads, so the tensors fit the derived value
  nlohmann::json c = g.config();
  c.erase("num_experts");
  c["num_local_experts"] = g.n_expert;
  c.erase("head_dim");
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  c["use_sliding_window"] = true;
  c["sliding_window"] = 128;
  testing::write_hf_folder(f.dir, c, g.tensors());
  const Status s = convert_folder(f, convert::OutType::kF32);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.expert_count"), 4u);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.key_length"), 8u);
  EXPECT_EQ(meta_float(*m, "qwen3moe.rope.freq_base"), 500000.0);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.attention.sliding_window"), 128u);
  EXPECT_EQ(m->find("qwen3moe.rope.scaling.type"), nullptr);
}

TEST(Convert, YarnRopeScalingKeys) {
  Folder f;
  const TinyQwen3 g;
  nlohmann::json c = g.config();
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  testing::write_hf_folder(f.dir, c, g.tensors());
  ASSERT_TRUE(convert_folder(f, convert::OutType::kF32).ok());
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->get_string("qwen3moe.rope.scaling.type"), "yarn");
  EXPECT_EQ(meta_float(*m, "qwen3moe.rope.scaling.factor"), 4.0);
  EXPECT_EQ(meta_uint(*m, "qwen3moe.rope.scaling.original_context_length"), 32768u);
}

TEST(Convert, DenseLayersFromMlpOnlyLayersAndSparseStep) {
  for (const bool by_step : {false, true}) {
    Folder f;
    TinyQwen3 g;
    g.n_layer = 3;
    g.dense_layers = {0};  // by_step: decoder_sparse_step=2 makes layers 0 and 2 dense instead
    nlohmann::json c = g.config();
    if (by_step) {
      g.dense_layers = {0, 2};
      c["mlp_only_layers"] = nlohmann::json::array();
      c["decoder_sparse_step"] = 2;
    }
    testing::write_hf_folder(f.dir, c, g.tensors());
    const Status s = convert_folder(f, convert::OutType::kF32);
    ASSERT_TRUE(s.ok()) << s.message();
    const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
    ASSERT_TRUE(m);
    const gguf::Value* layers = m->find("qwen3moe.mlp_only_layers");
    ASSERT_NE(layers, nullptr);
    EXPECT_EQ(layers->array_type, gguf::ValueType::kInt32);
    ASSERT_EQ(layers->array.size(), g.dense_layers.size());
    for (size_t i = 0; i < g.dense_layers.size(); ++i) EXPECT_EQ(layers->array[i].as_int(), g.dense_layers[i]);
    for (int64_t l = 0; l < g.n_layer; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const bool dense = g.is_dense(l);
      EXPECT_EQ(m->find_tensor(b + "ffn_gate.weight") != nullptr, dense) << l;
      EXPECT_EQ(m->find_tensor(b + "ffn_gate_exps.weight") != nullptr, !dense) << l;
      EXPECT_EQ(m->find_tensor(b + "ffn_gate_inp.weight") != nullptr, !dense) << l;
      if (dense) {
        EXPECT_EQ(ne_of(*m->find_tensor(b + "ffn_down.weight")), (std::vector<int64_t>{g.n_ff, g.n_embd}));
        expect_copy(*m, b + "ffn_up.weight", "model.layers." + std::to_string(l) + ".mlp.up_proj.weight");
      }
    }
  }
}

TEST(Convert, TiedEmbeddingsWriteNoOutputTensor) {
  for (const bool lm_head_present : {false, true}) {
    Folder f;
    TinyQwen3 g;
    g.tied = true;
    std::vector<testing::StTensor> t = g.tensors();
    if (lm_head_present) t.push_back(testing::make_tensor("lm_head.weight", {g.n_vocab, g.n_embd}, "F32"));
    testing::write_hf_folder(f.dir, g.config(), t);
    const Status s = convert_folder(f, convert::OutType::kF32);
    ASSERT_TRUE(s.ok()) << s.message();
    const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->find_tensor("output.weight"), nullptr);
    EXPECT_NE(m->find_tensor("token_embd.weight"), nullptr);
  }
}

TEST(Convert, Qwen3DenseArchitecture) {
  Folder f;
  TinyQwen3 g;
  g.moe = false;
  testing::write_hf_folder(f.dir, g.config(), g.tensors(), /*n_shards=*/2);
  const Status s = convert_folder(f, convert::OutType::kBF16);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->architecture(), "qwen3");
  EXPECT_EQ(m->tensors().size(), size_t(1 + 11 * g.n_layer + 2));
  EXPECT_EQ(meta_uint(*m, "qwen3.feed_forward_length"), 96u);
  EXPECT_EQ(m->find("qwen3.expert_count"), nullptr);
  EXPECT_EQ(ne_of(*m->find_tensor("blk.1.ffn_gate.weight")), (std::vector<int64_t>{g.n_embd, g.n_ff}));
  EXPECT_EQ(m->find_tensor("blk.1.ffn_gate.weight")->type_id, uint32_t(quant::Type::BF16));
  expect_copy(*m, "blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight");
}

TEST(Convert, Qwen3SlidingWindowFollowsLayerTypes) {
  Folder f;
  TinyQwen3 g;
  g.moe = false;
  g.n_layer = 3;
  nlohmann::json c = g.config();
  c["use_sliding_window"] = true;
  c["sliding_window"] = 64;
  c["max_window_layers"] = 1;  // layers 1 and 2 slide
  testing::write_hf_folder(f.dir, c, g.tensors());
  ASSERT_TRUE(convert_folder(f, convert::OutType::kF32).ok());
  const std::unique_ptr<gguf::Model> m = open_gguf(f.out);
  ASSERT_TRUE(m);
  EXPECT_EQ(meta_uint(*m, "qwen3.attention.sliding_window"), 64u);
  const gguf::Value* pattern = m->find("qwen3.attention.sliding_window_pattern");
  ASSERT_NE(pattern, nullptr);
  ASSERT_EQ(pattern->array.size(), 3u);
  EXPECT_EQ(pattern->array[0].u, 0u);
  EXPECT_EQ(pattern->array[1].u, 1u);
  EXPECT_EQ(pattern->array[2].u, 1u);
}

TEST(Convert, ThreadCountDoesNotChangeTheFile) {
  TinyQwen3 g;
  g.n_vocab = 8192;  // 256 Ki elements per embedding matrix: split across threads
  Folder a, b;
  testing::write_hf_folder(a.dir, g.config(), g.tensors());
  testing::write_hf_folder(b.dir, g.config(), g.tensors());
  ASSERT_TRUE(convert_folder(a, convert::OutType::kQ8_0, false, 1).ok());
  ASSERT_TRUE(convert_folder(b, convert::OutType::kQ8_0, false, 4).ok());
  EXPECT_EQ(testing::read_all(a.out), testing::read_all(b.out));
}

}  // namespace convert_model_test
}  // namespace magnetar
