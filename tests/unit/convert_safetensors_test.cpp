// The safetensors reader: well-formed files read back exactly; hostile headers (truncated, out-of-range
// offsets, unknown dtypes, shape/byte mismatches, overlaps, holes) are refused with a message naming the
// file, the tensor and the field, never read out of bounds.
#include <gtest/gtest.h>

#include <random>

#include "convert/hf_model.h"
#include "convert/safetensors.h"
#include "tests/unit/convert_test_util.h"

namespace magnetar {
namespace {

using convert::Dtype;
using convert::SafetensorsFile;
using testing::safetensors_bytes;
using testing::safetensors_raw;

// Parses `bytes` and returns the error message ("" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  Result<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::parse(bytes, "x.safetensors");
  return f.ok() ? "" : f.status().message();
}

TEST(Safetensors, ReadsTensorsShapesDataAndMetadata) {
  const testing::StTensor a = testing::make_tensor("a.weight", {3, 2}, "F32");
  const testing::StTensor b = testing::make_tensor("b.weight", {5}, "BF16");
  const testing::StTensor c = testing::make_tensor("c.weight", {2, 2, 2}, "F16");
  const std::vector<uint8_t> bytes = safetensors_bytes({a, b, c}, {{"format", "pt"}});
  Result<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::parse(bytes, "m.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const SafetensorsFile& file = *f.value();
  ASSERT_EQ(file.tensors().size(), 3u);
  ASSERT_EQ(file.metadata().size(), 1u);
  EXPECT_EQ(file.metadata()[0].first, "format");
  EXPECT_EQ(file.metadata()[0].second, "pt");
  const convert::SafeTensor* ta = file.find("a.weight");
  const convert::SafeTensor* tb = file.find("b.weight");
  const convert::SafeTensor* tc = file.find("c.weight");
  ASSERT_TRUE(ta && tb && tc);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(ta->dtype, Dtype::kF32);
  EXPECT_EQ(tb->dtype, Dtype::kBF16);
  EXPECT_EQ(tc->dtype, Dtype::kF16);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(tc->shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(ta->n_elements(), 6);
  EXPECT_EQ(ta->nbytes, 24u);
  EXPECT_EQ(tb->nbytes, 10u);
  EXPECT_EQ(ta->file, "m.safetensors");
  // Data pointers land on the bytes the writer put there.
  EXPECT_EQ(std::vector<uint8_t>(ta->data, ta->data + ta->nbytes), a.bytes);
  EXPECT_EQ(std::vector<uint8_t>(tb->data, tb->data + tb->nbytes), b.bytes);
  EXPECT_EQ(std::vector<uint8_t>(tc->data, tc->data + tc->nbytes), c.bytes);
  EXPECT_EQ(ta->data, bytes.data() + bytes.size() - 24 - 10 - 16);
}

TEST(Safetensors, OpensFilesAndNamesThemInErrors) {
  testing::TempDir dir;
  testing::write_all(dir.file("ok.safetensors"), safetensors_bytes({testing::make_tensor("w", {4}, "F32")}));
  Result<std::unique_ptr<SafetensorsFile>> ok = SafetensorsFile::open(dir.file("ok.safetensors"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok.value()->name(), "ok.safetensors");
  EXPECT_EQ(ok.value()->find("w")->n_elements(), 4);

  testing::write_all(dir.file("short.safetensors"), {1, 2, 3});
  Result<std::unique_ptr<SafetensorsFile>> bad = SafetensorsFile::open(dir.file("short.safetensors"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("short.safetensors"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("header length"), std::string::npos) << bad.status().message();

  Result<std::unique_ptr<SafetensorsFile>> none = SafetensorsFile::open(dir.file("absent.safetensors"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("absent.safetensors"), std::string::npos);
}

TEST(Safetensors, TruncatedFilesAreRefused) {
  std::vector<uint8_t> bytes = safetensors_bytes({testing::make_tensor("w", {8}, "F32")});
  EXPECT_NE(parse_error({0, 0, 0}).find("only 3 bytes"), std::string::npos);
  // Header cut short: the length field promises more than follows.
  const std::vector<uint8_t> cut_header(bytes.begin(), bytes.begin() + 20);
  const std::string e1 = parse_error(cut_header);
  EXPECT_NE(e1.find("x.safetensors"), std::string::npos) << e1;
  EXPECT_NE(e1.find("truncated"), std::string::npos) << e1;
  // Data cut short: the tensor's offsets run past the end.
  const std::vector<uint8_t> cut_data(bytes.begin(), bytes.end() - 4);
  const std::string e2 = parse_error(cut_data);
  EXPECT_NE(e2.find("tensor 'w'"), std::string::npos) << e2;
  EXPECT_NE(e2.find("data_offsets"), std::string::npos) << e2;
  // A header length of 2^63 must not overflow into a small number.
  std::vector<uint8_t> huge = bytes;
  huge[7] = 0x80;
  EXPECT_NE(parse_error(huge).find("exceeds"), std::string::npos);
}

TEST(Safetensors, BadOffsetsDtypesAndShapesNameTheTensorAndField) {
  const std::vector<uint8_t> data(16, 0);
  struct Case {
    const char* header;
    const char* expect;  // substrings of the message
    const char* expect2;
  };
  const Case cases[] = {
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,32]}})", "tensor 'w'", "data_offsets [0, 32] outside"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[8,4]}})", "tensor 'w'", "outside"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,-16]}})", "tensor 'w'", "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", "tensor 'w'", "data_offsets"},
      {R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", "tensor 'w'", "dtype 'Q4' is unknown"},
      {R"({"w":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})", "tensor 'w'", "dtype"},
      {R"({"w":{"shape":[4],"data_offsets":[0,16]}})", "tensor 'w'", "dtype is missing"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", "tensor 'w'",
       "needs 12 bytes but data_offsets span 16"},
      {R"({"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,16]}})", "tensor 'w'", "needs 8 bytes"},
      {R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", "tensor 'w'", "shape"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,16]}})", "tensor 'w'", "shape"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", "tensor 'w'", "shape is missing"},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", "tensor 'w'", "overflows"},
      {R"({"w":{"dtype":"F64","shape":[1099511627776,1048576],"data_offsets":[0,16]}})", "tensor 'w'", "elements"},
      {R"({"w":[1,2]})", "tensor 'w'", "not an object"},
      {R"({"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "__metadata__", "k"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       "tensor 'b'", "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", "tensor 'a'", "hole"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "8 bytes after the last tensor", "x.safetensors"},
      {R"([1,2,3])", "header", "not a JSON object"},
      {R"({"w":)", "header", "invalid JSON"},
      {R"({"w":{"dtype":"F32","shape":[[[[[[4]]]]]],"data_offsets":[0,16]}})", "header", "nested deeper"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       "header", "key 'w' appears twice in one object"},
  };
  for (const Case& c : cases) {
    const std::string e = parse_error(safetensors_raw(c.header, data));
    EXPECT_NE(e.find("x.safetensors"), std::string::npos) << c.header << " -> " << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.header << " -> " << e;
    EXPECT_NE(e.find(c.expect2), std::string::npos) << c.header << " -> " << e;
  }
}

TEST(Safetensors, ZeroSizedTensorsAndEmptyFilesAreValid) {
  const std::string e1 = parse_error(safetensors_raw("{}", {}));
  EXPECT_EQ(e1, "");
  const std::string e2 = parse_error(safetensors_raw(
      R"({"z":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
      {1, 2}));
  EXPECT_EQ(e2, "");
}

// Random byte flips in the header of a valid file: every outcome is a parse or a clean error, and a parse
// never yields a tensor outside the buffer (ASan builds catch any stray read).
TEST(Safetensors, MutatedHeadersNeverEscapeTheBuffer) {
  const std::vector<uint8_t> valid = safetensors_bytes(
      {testing::make_tensor("a", {3, 4}, "F32"), testing::make_tensor("b", {6}, "BF16")}, {{"k", "v"}});
  std::mt19937 rng(7);
  int parsed = 0, refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<uint8_t> m = valid;
    const int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % std::min<size_t>(m.size(), 8 + 160);
      m[at] = uint8_t(rng());
    }
    Result<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::parse(m, "m.safetensors");
    if (!f.ok()) {
      ++refused;
      EXPECT_FALSE(f.status().message().empty());
      continue;
    }
    ++parsed;
    for (const convert::SafeTensor& t : f.value()->tensors()) {
      ASSERT_GE(t.data, m.data());
      ASSERT_LE(t.data + t.nbytes, m.data() + m.size());
      ASSERT_EQ(uint64_t(t.n_elements()) * convert::dtype_size(t.dtype), t.nbytes);
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(parsed, 0);  // flips inside string values keep the file valid
}

TEST(Safetensors, DtypeTableMatchesTheSpecification) {
  // Names and sizes from the safetensors specification (README "dtype" list).
  const std::pair<const char*, size_t> spec[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                 {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                 {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [name, size] : spec) {
    const std::optional<Dtype> d = convert::dtype_from_name(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(convert::dtype_size(*d), size) << name;
    EXPECT_EQ(convert::dtype_name(*d), name);
  }
  EXPECT_FALSE(convert::dtype_from_name("f32").has_value());  // names are case-sensitive in the format
}

}  // namespace
}  // namespace magnetar
