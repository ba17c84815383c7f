// `magnetar quantize` end to end. Every output tensor is checked against an independent path: the source read
// with the GGUF reader (raw float32 / fp16 bytes, not the tool's dequantizer) and quantized with the scalar
// reference quantizer of quant/ (the oracle, itself tested bit-exact against llama.cpp-made vectors).
// Expected types and general.file_type values come from llama.cpp's rules and enum llama_ftype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "tests/tools/invoke.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar {
namespace {

using testing::Invocation;

Invocation magnetar(const std::string& args) { return testing::run_magnetar(args); }

std::unique_ptr<gguf::Model> open_model(const std::string& path) {
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// The source tensor's values as float32, decoded here from its raw bytes (F32 or F16 sources only).
std::vector<float> source_floats(const gguf::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  if (t.type_id == uint32_t(quant::Type::F32)) {
    std::memcpy(v.data(), t.data, v.size() * 4);
  } else {
    EXPECT_EQ(t.type_id, uint32_t(quant::Type::F16)) << t.name;
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = quant::fp16_to_float(h);
    }
  }
  return v;
}

// The reference quantizer applied row by row to `values`.
std::vector<uint8_t> reference(quant::Type type, const std::vector<float>& values, int64_t row_length) {
  const size_t row_bytes = quant::row_size(type, row_length);
  const int64_t rows = int64_t(values.size()) / row_length;
  std::vector<uint8_t> out(size_t(rows) * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    quant::traits(type).from_float(values.data() + r * row_length, out.data() + size_t(r) * row_bytes, row_length);
  }
  return out;
}

bool is_kept(const gguf::TensorInfo& t) {
  return t.ne[1] == 1 || t.name.find("ffn_gate_inp.weight") != std::string::npos;
}

// Checks `out_path` against `src_path` quantized with `type_of(tensor name)` for every tensor that is not a
// norm or router (those must be byte-identical copies).
template <class TypeOf>
void expect_reference_output(const std::string& src_path, const std::string& out_path, TypeOf type_of) {
  const std::unique_ptr<gguf::Model> src = open_model(src_path), out = open_model(out_path);
  ASSERT_TRUE(src && out);
  ASSERT_EQ(src->tensors().size(), out->tensors().size());
  for (size_t i = 0; i < src->tensors().size(); ++i) {
    const gguf::TensorInfo &s = src->tensors()[i], &o = out->tensors()[i];
    ASSERT_EQ(s.name, o.name);
    EXPECT_EQ(s.ne, o.ne) << s.name;
    if (is_kept(s)) {
      EXPECT_EQ(o.type_id, uint32_t(quant::Type::F32)) << s.name;
      ASSERT_EQ(o.nbytes, s.nbytes) << s.name;
      EXPECT_EQ(std::memcmp(o.data, s.data, s.nbytes), 0) << s.name;
      continue;
    }
    const quant::Type type = type_of(s.name);
    ASSERT_EQ(o.type_id, uint32_t(type)) << s.name;
    const std::vector<uint8_t> expected = reference(type, source_floats(s), s.ne[0]);
    ASSERT_EQ(o.nbytes, expected.size()) << s.name;
    EXPECT_EQ(std::memcmp(o.data, expected.data(), expected.size()), 0) << s.name << " differs from the reference";
  }
}

uint64_t metadata_uint(const std::string& path, const std::string& key) {
  const std::unique_ptr<gguf::Model> m = open_model(path);
  const gguf::Value* v = m ? m->find(key) : nullptr;
  EXPECT_NE(v, nullptr) << key;
  return v && v->as_uint() ? *v->as_uint() : ~0ull;
}

class Quantize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const Invocation s = magnetar("synth --preset tiny --type f32 --seed 5 -o " + file("f32.gguf"));
    ASSERT_EQ(s.status, 0) << s.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string file(const std::string& name) { return dir_->file(name); }
  static testing::TempDir* dir_;
};
testing::TempDir* Quantize::dir_ = nullptr;

TEST_F(Quantize, Q8_0AndQ4_KEqualTheReferenceQuantizer) {
  for (const auto& [name, type, file_type] :
       {std::tuple{"q8_0", quant::Type::Q8_0, 7ull}, std::tuple{"q4_k", quant::Type::Q4_K, 14ull}}) {
    const std::string out = file(std::string(name) + ".gguf");
    const Invocation r = magnetar("quantize " + file("f32.gguf") + " -o " + out + " --type " + name);
    ASSERT_EQ(r.status, 0) << r.err;
    expect_reference_output(file("f32.gguf"), out, [type = type](const std::string&) { return type; });
    EXPECT_EQ(metadata_uint(out, "general.file_type"), file_type);  // LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_S
    EXPECT_EQ(metadata_uint(out, "general.quantization_version"), 2u);
    EXPECT_EQ(metadata_uint(out, "qwen3moe.expert_count"), 8u);  // other metadata unchanged
    EXPECT_NE(r.out.find("fallbacks 0"), std::string::npos) << r.out;
  }
  // Every key of the source is in the output with its value, except general.file_type.
  const std::unique_ptr<gguf::Model> src = open_model(file("f32.gguf")), out = open_model(file("q4_k.gguf"));
  for (const gguf::KeyValue& kv : src->metadata()) {
    if (kv.key == "general.file_type") continue;
    const gguf::Value* v = out->find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(*v == kv.value) << kv.key;
  }
}

TEST_F(Quantize, F16SourceQuantizesFromItsHalfValues) {
  ASSERT_EQ(magnetar("synth --preset tiny --type f16 --seed 6 -o " + file("f16.gguf")).status, 0);
  const Invocation r = magnetar("quantize " + file("f16.gguf") + " -o " + file("f16-q8.gguf") + " --type q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_reference_output(file("f16.gguf"), file("f16-q8.gguf"), [](const std::string&) { return quant::Type::Q8_0; });
}

TEST_F(Quantize, MapsOverrideFirstMatchWinsRoutersStayF32) {
  const Invocation r = magnetar("quantize " + file("f32.gguf") + " -o " + file("mapped.gguf") +
                                " --type q8_0 --map _exps=q4_k --map 'blk\\.1\\.ffn_down_exps=q5_k'"
                                " --map token_embd=q6_k --map ffn_gate=q4_0 --map nothing_here=q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  // Only the map that matches no quantized tensor is reported (ffn_gate's tensors are taken by _exps first).
  EXPECT_NE(r.err.find("warning: --map 'nothing_here=Q8_0' matches no quantized tensor"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--map 'ffn_gate"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--map 'blk"), std::string::npos) << r.err;
  expect_reference_output(file("f32.gguf"), file("mapped.gguf"), [](const std::string& name) {
    if (name.find("_exps") != std::string::npos) return quant::Type::Q4_K;  // the first map, for all layers
    if (name == "token_embd.weight") return quant::Type::Q6_K;
    return quant::Type::Q8_0;
  });
  EXPECT_EQ(metadata_uint(file("mapped.gguf"), "general.file_type"), 7u);  // the --type's
}

TEST_F(Quantize, ThreadCountDoesNotChangeTheFile) {
  ASSERT_EQ(magnetar("quantize " + file("f32.gguf") + " -o " + file("t1.gguf") + " --type q4_k -t 1").status, 0);
  ASSERT_EQ(magnetar("quantize " + file("f32.gguf") + " -o " + file("t2.gguf") + " --type q4_k -t 2").status, 0);
  ASSERT_EQ(magnetar("quantize " + file("f32.gguf") + " -o " + file("t3.gguf") + " --type q4_k -t 3").status, 0);
  const std::vector<uint8_t> one = testing::read_all(file("t1.gguf"));
  EXPECT_GT(one.size(), 1000000u);
  EXPECT_EQ(one, testing::read_all(file("t2.gguf")));
  EXPECT_EQ(one, testing::read_all(file("t3.gguf")));
}

TEST_F(Quantize, RowsThatDoNotFillBlocksFallBackAsLlamaCpp) {
  // Row lengths 96 (a multiple of 32, not of 256) and 48 (of neither) in a hand-made file.
  gguf::Writer w(file("odd.gguf"));
  w.set("general.architecture", gguf::Value::of_string("qwen3moe"));
  const int64_t a[] = {96, 4}, b[] = {48, 2}, c[] = {96}, d[] = {96, 3};
  ASSERT_TRUE(w.add_tensor("blk.0.attn_q.weight", 0, a).ok());
  ASSERT_TRUE(w.add_tensor("blk.0.ffn_down.weight", 0, b).ok());
  ASSERT_TRUE(w.add_tensor("blk.0.attn_norm.weight", 0, c).ok());
  ASSERT_TRUE(w.add_tensor("blk.0.ffn_up.weight", 0, d).ok());
  ASSERT_TRUE(w.begin().ok());
  std::vector<float> values(96 * 4 + 48 * 2 + 96 + 96 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(0.37 * double(i)) * (1 + i % 7));
  // each tensor's data is padded to 32 bytes: 96*4*4, 48*2*4, 96*4 and 96*3*4 bytes all are multiples of 32
  ASSERT_TRUE(w.write({reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4}).ok());
  ASSERT_TRUE(w.finish().ok());

  const Invocation r =
      magnetar("quantize " + file("odd.gguf") + " -o " + file("odd-q.gguf") + " --type q4_k --map ffn_up=q3_k");
  ASSERT_EQ(r.status, 0) << r.err;
  expect_reference_output(file("odd.gguf"), file("odd-q.gguf"), [](const std::string& name) {
    if (name == "blk.0.attn_q.weight") return quant::Type::Q5_0;    // Q4_K -> Q5_0
    if (name == "blk.0.ffn_up.weight") return quant::Type::IQ4_NL;  // Q3_K -> IQ4_NL
    return quant::Type::F16;                                        // Q4_K -> Q5_0 does not fit 48 either
  });
  EXPECT_NE(r.out.find("fallbacks 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fallback blk.0.attn_q.weight: rows of 96, Q4_K -> Q5_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fallback blk.0.ffn_down.weight: rows of 48, Q4_K -> F16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fallback blk.0.ffn_up.weight: rows of 96, Q3_K -> IQ4_NL"), std::string::npos) << r.out;
}

// A tensor without elements ([0, 16]) is copied as it is (before: a division by its zero row length, SIGFPE).
TEST_F(Quantize, ATensorWithoutElementsIsCopied) {
  gguf::Writer w(file("empty-rows.gguf"));
  w.set("general.architecture", gguf::Value::of_string("qwen3moe"));
  const int64_t none[] = {0, 16}, some[] = {256, 2};
  ASSERT_TRUE(w.add_tensor("blk.0.attn_k.weight", 0, none).ok());
  ASSERT_TRUE(w.add_tensor("blk.0.attn_q.weight", 0, some).ok());
  ASSERT_TRUE(w.begin().ok());
  std::vector<float> values(512, 0.5f);
  ASSERT_TRUE(w.write({reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4}).ok());
  ASSERT_TRUE(w.finish().ok());
  const Invocation r =
      magnetar("quantize " + file("empty-rows.gguf") + " -o " + file("empty-rows-q.gguf") + " --type q4_k");
  ASSERT_EQ(r.status, 0) << r.err;
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(file("empty-rows-q.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m.value()->find_tensor("blk.0.attn_k.weight")->type_id, 0u);
  EXPECT_EQ(m.value()->find_tensor("blk.0.attn_q.weight")->type_id, uint32_t(quant::Type::Q4_K));
}

// Tensors llama-quantize leaves as they are (llama.cpp's tensor_allows_quantization) stay F32 here too, 2-D as they
// are: BERT's position and token-type embeddings, a norm stored 2-D, a name not ending in "weight", Mamba's conv
// and T5's relative position bias; a plain 2-D weight beside them is quantized.
TEST_F(Quantize, TensorsLlamaQuantizeKeepStayAsTheyAre) {
  gguf::Writer w(file("kept.gguf"));
  w.set("general.architecture", gguf::Value::of_string("bert"));
  const int64_t shape[] = {256, 2};
  const char* kept[] = {"position_embd.weight", "token_types.weight",      "blk.0.attn_norm.weight",
                        "blk.0.attn_q.bias2d",  "blk.0.ssm_conv1d.weight", "blk.0.attn_rel_b.weight"};
  for (const char* name : kept) ASSERT_TRUE(w.add_tensor(name, 0, shape).ok());
  ASSERT_TRUE(w.add_tensor("blk.0.attn_q.weight", 0, shape).ok());
  ASSERT_TRUE(w.begin().ok());
  const std::vector<float> values(512, 0.25f);
  for (size_t i = 0; i < std::size(kept) + 1; ++i) {
    ASSERT_TRUE(w.write({reinterpret_cast<const uint8_t*>(values.data()), values.size() * 4}).ok());
  }
  ASSERT_TRUE(w.finish().ok());
  const Invocation r = magnetar("quantize " + file("kept.gguf") + " -o " + file("kept-q.gguf") + " --type q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::unique_ptr<gguf::Model> m = open_model(file("kept-q.gguf"));
  ASSERT_TRUE(m);
  for (const char* name : kept) EXPECT_EQ(m->find_tensor(name)->type_id, uint32_t(quant::Type::F32)) << name;
  EXPECT_EQ(m->find_tensor("blk.0.attn_q.weight")->type_id, uint32_t(quant::Type::Q8_0));
}

TEST_F(Quantize, RequantizingIsRefusedUnlessAllowed) {
  ASSERT_EQ(magnetar("quantize " + file("f32.gguf") + " -o " + file("rq-src.gguf") + " --type q4_k").status, 0);
  const Invocation r = magnetar("quantize " + file("rq-src.gguf") + " -o " + file("rq.gguf") + " --type q8_0");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.find("--map 'ffn_gate"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--map 'blk"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tensor 'token_embd.weight' is already Q4_K"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file("rq.gguf")));
  EXPECT_FALSE(std::filesystem::exists(file("rq.gguf.tmp")));

  const Invocation a =
      magnetar("quantize " + file("rq-src.gguf") + " -o " + file("rq.gguf") + " --type q8_0 --allow-requantize");
  ASSERT_EQ(a.status, 0) << a.err;
  const std::unique_ptr<gguf::Model> src = open_model(file("rq-src.gguf")), out = open_model(file("rq.gguf"));
  const gguf::TensorInfo* s = src->find_tensor("blk.0.ffn_up_exps.weight");
  const gguf::TensorInfo* o = out->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_TRUE(s && o);
  ASSERT_EQ(o->type_id, uint32_t(quant::Type::Q8_0));
  std::vector<float> values(static_cast<size_t>(s->n_elements()));
  quant::traits(quant::Type::Q4_K).to_float(s->data, values.data(), int64_t(values.size()));
  const std::vector<uint8_t> expected = reference(quant::Type::Q8_0, values, s->ne[0]);
  ASSERT_EQ(o->nbytes, expected.size());
  EXPECT_EQ(std::memcmp(o->data, expected.data(), expected.size()), 0);
}

TEST_F(Quantize, BadInputIsOneLineAndExit2AndWritesNothing) {
  struct Case {
    std::string args, needle;
  };
  const std::string in = file("f32.gguf"), out = file("bad.gguf");
  ASSERT_EQ(magnetar("pack " + in + " -o " + file("packed.gguf")).status, 0);
  const std::vector<Case> cases = {
      {"quantize " + file("packed.gguf") + " -o " + out + " --type q8_0", "a packed file (magnetar pack)"},
      {"quantize " + in + " -o " + out + " --type q9_9", "--type 'q9_9' is not one of"},
      {"quantize " + in + " -o " + out + " --type q8_k", "--type 'q8_k' is not one of"},
      {"quantize " + in + " -o " + out, "--type TYPE is required"},
      {"quantize " + in + " --type q8_0", "-o OUT.gguf is required"},
      {"quantize " + in + " -o " + out + " --type q8_0 --map '(=q4_k'", "--map '(=q4_k': bad regular expression"},
      {"quantize " + in + " -o " + out + " --type q8_0 --map exps", "--map 'exps': expected REGEX=TYPE"},
      {"quantize " + in + " -o " + out + " --type q8_0 --map exps=q7", "'q7' is not a weight type"},
      {"quantize " + file("missing.gguf") + " -o " + out + " --type q8_0", "missing.gguf: cannot open"},
      {"quantize " + in + " -o " + in + " --type q8_0", "is the input: -o names the new file"},  // it replaced it
  };
  for (const Case& c : cases) {
    const Invocation r = magnetar(c.args);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  const Invocation h = magnetar("quantize --help");
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("q4_k"), std::string::npos);
  EXPECT_NE(h.out.find("iq4_xs"), std::string::npos);
}

TEST_F(Quantize, QuantizedModelRuns) {
  ASSERT_EQ(magnetar("quantize " + file("f32.gguf") + " -o " + file("run.gguf") + " --type q4_k").status, 0);
  const Invocation r = magnetar("run -m " + file("run.gguf") + " --tokens 5,6,7,8 -n 6 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 5) << r.out;  // 6 ids
  EXPECT_NE(r.err.find("generated 6 tokens"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace magnetar
