// Byte-compatibility with llama.cpp, against ../shared/vectors (made by llama.cpp's own tools):
//  - every tensor of every quant-T.gguf dequantizes to exactly llama.cpp's float32 values (SHA-256);
//  - our reference quantizer, fed the f32 source, is within 1.05x of llama.cpp's RMS error;
//  - a gguf-split set opens as the same tensors and bytes as the unsplit file.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/sha256.h"
#include "gguf/reader.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

const std::string kVectors = std::string(MAGNETAR_SHARED_DIR) + "/vectors";

#define SKIP_WITHOUT_VECTORS()                                                                       \
  if (!std::filesystem::exists(kVectors + "/quant/expected.json")) {                                 \
    GTEST_SKIP() << "SKIP: conformance vectors not found at " << kVectors << " (../shared absent)"; \
  }

nlohmann::json load_expected() {
  std::ifstream in(kVectors + "/quant/expected.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<gguf::Model> open_or_die(const std::string& path) {
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<float> dequantize(const gguf::TensorInfo& t) {
  const quant::TypeTraits* tr = quant::find_traits(t.type_id);
  EXPECT_NE(tr, nullptr) << t.name << " type " << t.type_id;
  std::vector<float> out(size_t(t.n_elements()));
  if (tr) tr->to_float(t.data, out.data(), t.n_elements());
  return out;
}

// One parameterized case per vector file (the keys of expected.json).
class QuantConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantConformance, DequantizeIsBitExactWithLlamaCpp) {
  SKIP_WITHOUT_VECTORS();
  const std::string file = GetParam();
  const nlohmann::json expected = load_expected()[file];
  std::unique_ptr<gguf::Model> model = open_or_die(kVectors + "/quant/quant-" + file + ".gguf");
  ASSERT_TRUE(model);
  ASSERT_EQ(model->tensors().size(), expected.size());
  for (const nlohmann::json& e : expected) {
    const std::string name = e["name"];
    const gguf::TensorInfo* t = model->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const quant::TypeSizeInfo* size_info = quant::find_type_size(t->type_id);
    ASSERT_NE(size_info, nullptr);
    EXPECT_EQ(size_info->name, e["type"].get<std::string>()) << name;
    ASSERT_EQ(size_t(t->n_dims), e["shape"].size()) << name;
    for (int d = 0; d < t->n_dims; ++d) EXPECT_EQ(t->ne[d], e["shape"][d].get<int64_t>()) << name;
    EXPECT_EQ(model->shards()[0]->header().data_offset + t->offset, e["offset"].get<uint64_t>()) << name;
    EXPECT_EQ(t->nbytes, e["nbytes"].get<uint64_t>()) << name;

    const std::vector<float> values = dequantize(*t);
    for (size_t k = 0; k < 16; ++k) {
      EXPECT_EQ(values[k], e["deq_first16"][k].get<float>()) << file << " " << name << " [" << k << "]";
    }
    Sha256 sha;
    sha.update(values.data(), values.size() * sizeof(float));
    EXPECT_EQ(sha.hex_digest(), e["deq_sha256"].get<std::string>()) << file << " " << name;
  }
}

TEST_P(QuantConformance, QuantizerRmseWithinFivePercentOfLlamaCpp) {
  SKIP_WITHOUT_VECTORS();
  const std::string file = GetParam();
  const nlohmann::json expected = load_expected()[file];
  std::unique_ptr<gguf::Model> model = open_or_die(kVectors + "/quant/quant-" + file + ".gguf");
  std::unique_ptr<gguf::Model> source = open_or_die(kVectors + "/quant/source-f32.gguf");
  ASSERT_TRUE(model && source);
  int checked = 0;
  for (const nlohmann::json& e : expected) {
    const std::string name = e["name"];
    const gguf::TensorInfo* t = model->find_tensor(name);
    const gguf::TensorInfo* src = source->find_tensor(name);
    ASSERT_TRUE(t && src) << name;
    if (t->type_id == uint32_t(quant::Type::F32)) continue;
    const quant::TypeTraits* tr = quant::find_traits(t->type_id);
    ASSERT_NE(tr, nullptr);
    ASSERT_EQ(src->type_id, uint32_t(quant::Type::F32));
    const int64_t n = src->n_elements();
    std::vector<float> in(static_cast<size_t>(n));
    std::memcpy(in.data(), src->data, size_t(n) * sizeof(float));
    std::vector<uint8_t> packed(t->nbytes);
    // quantize row by row, as llama-quantize does
    const int64_t row = src->ne[0];
    const size_t row_bytes = quant::row_size(tr->type, row);
    for (int64_t r = 0; r < n / row; ++r) tr->from_float(in.data() + r * row, packed.data() + r * row_bytes, row);
    std::vector<float> out(static_cast<size_t>(n));
    tr->to_float(packed.data(), out.data(), n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(out[size_t(i)] - in[size_t(i)]) * double(out[size_t(i)] - in[size_t(i)]);
    const double rmse = std::sqrt(sum / double(n));
    const double reference = e["rmse_vs_source"].get<double>();
    EXPECT_LE(rmse, 1.05 * reference) << file << " " << name << ": ours " << rmse << ", llama.cpp " << reference;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

std::vector<std::string> vector_files() {
  if (!std::filesystem::exists(kVectors + "/quant/expected.json")) return {"(vectors absent)"};
  std::vector<std::string> names;
  const nlohmann::json expected = load_expected();
  for (auto it = expected.begin(); it != expected.end(); ++it) names.push_back(it.key());
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllFiles, QuantConformance, ::testing::ValuesIn(vector_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string s = info.param;
                           for (char& c : s) if (!std::isalnum(uint8_t(c))) c = '_';
                           return s;
                         });

TEST(SplitConformance, SplitSetEqualsTheUnsplitFile) {
  SKIP_WITHOUT_VECTORS();
  std::unique_ptr<gguf::Model> split = open_or_die(kVectors + "/models/split-q4k-00001-of-00003.gguf");
  std::unique_ptr<gguf::Model> whole = open_or_die(kVectors + "/quant/quant-Q4_K_S.gguf");
  ASSERT_TRUE(split && whole);
  EXPECT_EQ(split->shards().size(), 3u);
  ASSERT_EQ(split->tensors().size(), 15u);
  ASSERT_EQ(split->tensors().size(), whole->tensors().size());
  for (const gguf::TensorInfo& t : whole->tensors()) {
    const gguf::TensorInfo* s = split->find_tensor(t.name);
    ASSERT_NE(s, nullptr) << t.name;
    EXPECT_EQ(s->type_id, t.type_id);
    EXPECT_EQ(s->ne, t.ne);
    ASSERT_EQ(s->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(s->data, t.data, t.nbytes), 0) << t.name;
  }
  std::set<uint32_t> shards;
  for (const gguf::TensorInfo& t : split->tensors()) shards.insert(t.shard);
  EXPECT_EQ(shards.size(), 3u);
}

}  // namespace
}  // namespace magnetar
