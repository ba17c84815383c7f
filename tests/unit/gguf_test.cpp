// GGUF reader/writer: round trips, split sets, and one test per kind of hostile header.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::gguf {
namespace {

using testing::TempDir;

// Parses bytes as a file named "t.gguf"; returns the error message ("" when it parsed).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  Result<Header> h = parse_header(bytes, bytes.size(), "t.gguf");
  return h.ok() ? "" : h.status().message();
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

// Byte offset of the first occurrence of `needle` (a key or tensor name) in the file.
size_t find_bytes(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end()) << needle;
  return size_t(it - bytes.begin());
}

TEST(GgufWriter, RoundTripKeepsMetadataAndBytes) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  const std::vector<uint8_t> bytes = testing::make_sample_gguf(path);
  Result<std::unique_ptr<Model>> model = Model::open(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  const Model& m = *model.value();
  EXPECT_EQ(m.version(), 3u);
  EXPECT_EQ(m.architecture(), "qwen3moe");
  EXPECT_EQ(m.metadata().size(), 15u);
  EXPECT_EQ(m.find("u8")->u, 200u);
  EXPECT_EQ(m.find("i8")->i, -100);
  EXPECT_EQ(m.find("u16")->u, 65000u);
  EXPECT_EQ(m.find("i16")->i, -32000);
  EXPECT_EQ(m.find("u32")->u, 4000000000u);
  EXPECT_EQ(m.find("i32")->i, -2000000000);
  EXPECT_EQ(m.find("u64")->u, 1ull << 60);
  EXPECT_EQ(m.find("i64")->i, -(1ll << 60));
  EXPECT_EQ(m.find("f32")->f, 0.5);
  EXPECT_EQ(m.find("f64")->f, 1e-300);
  EXPECT_EQ(m.find("bool")->u, 1u);
  ASSERT_EQ(m.find("strings")->array.size(), 4u);
  EXPECT_EQ(m.find("strings")->array[2].str, "héllo");
  EXPECT_EQ(m.find("strings")->array[3].str, std::string("nul\0byte", 8));
  const Value* nested = m.find("nested");
  ASSERT_EQ(nested->array_type, ValueType::kArray);
  EXPECT_EQ(nested->array[0].array[0].i, 1);
  EXPECT_EQ(nested->array[1].array[0].str, "x");

  ASSERT_EQ(m.tensors().size(), 3u);
  const TensorInfo* c = m.find_tensor("c.weight");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->n_dims, 3);
  EXPECT_EQ(c->ne[0], 64);
  EXPECT_EQ(c->ne[2], 2);
  EXPECT_EQ(c->nbytes, 64u / 32 * 34 * 2 * 2);
  // Data: tensors are laid out in order, each aligned to 32; byte i of the concatenation is i % 251.
  uint64_t k = 0;
  for (const TensorInfo& t : m.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u);
    for (uint64_t b = 0; b < t.nbytes; ++b, ++k) ASSERT_EQ(t.data[b], uint8_t(k % 251)) << t.name << " " << b;
  }
  EXPECT_EQ(m.file_bytes(), bytes.size());

  // Writing what we read gives the same file, byte for byte.
  Writer w(dir.file("copy.gguf"));
  for (const KeyValue& kv : m.metadata()) w.set(kv.key, kv.value);
  for (const TensorInfo& t : m.tensors()) {
    ASSERT_TRUE(w.add_tensor(t.name, t.type_id, std::span<const int64_t>(t.ne.data(), size_t(t.n_dims))).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  for (const TensorInfo& t : m.tensors()) ASSERT_TRUE(w.write({t.data, t.nbytes}).ok());
  ASSERT_TRUE(w.finish().ok());
  EXPECT_EQ(testing::read_all(dir.file("copy.gguf")), bytes);
}

TEST(GgufWriter, CustomAlignmentIsRecordedAndHonoured) {
  TempDir dir;
  Writer w(dir.file("a.gguf"));
  // Set as a key (a copied header does so) it is the layout's too: it was recorded while the data kept 32.
  w.set("general.alignment", Value::of_uint(ValueType::kUint32, 4096));
  const int64_t dims[] = {10};
  ASSERT_TRUE(w.add_tensor("x", 0, dims).ok());
  ASSERT_TRUE(w.add_tensor("y", 0, dims).ok());
  ASSERT_TRUE(w.begin().ok());
  std::vector<uint8_t> data(80, 7);
  ASSERT_TRUE(w.write(data).ok());
  ASSERT_TRUE(w.finish().ok());
  Result<std::unique_ptr<Model>> m = Model::open(dir.file("a.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->shards()[0]->header().alignment, 4096u);
  EXPECT_EQ((*m)->shards()[0]->header().data_offset % 4096, 0u);
  EXPECT_EQ((*m)->find_tensor("y")->offset, 4096u);
}

TEST(GgufWriter, IncompleteWriteNeverReplacesTheDestination) {
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  testing::write_all(path, {1, 2, 3});
  {
    Writer w(path);
    const int64_t dims[] = {100};
    ASSERT_TRUE(w.add_tensor("x", 0, dims).ok());
    ASSERT_TRUE(w.begin().ok());
    std::vector<uint8_t> half(200, 0);
    ASSERT_TRUE(w.write(half).ok());
    const Status s = w.finish();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("'x': only 200 of 400 bytes written"), std::string::npos) << s.message();
  }
  EXPECT_EQ(testing::read_all(path), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// Two jobs writing one output: the second fails at begin() while the first writes (before, it truncated the first
// one's temporary and both wrote into it); the first finishes a whole file; a temporary left by a killed job (no
// lock) is taken over.
TEST(GgufWriter, ASecondWriterOfTheSameOutputIsRefused) {
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  const int64_t dims[] = {100};
  const std::vector<uint8_t> data(400, 7);
  Writer first(path);
  ASSERT_TRUE(first.add_tensor("x", 0, dims).ok());
  ASSERT_TRUE(first.begin().ok());
  ASSERT_TRUE(first.write(std::span(data).first(200)).ok());
  {
    Writer second(path);
    ASSERT_TRUE(second.add_tensor("x", 0, dims).ok());
    const Status s = second.begin();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("another job is writing it"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));  // the refused writer left the first one's file alone
  ASSERT_TRUE(first.write(std::span(data).subspan(200)).ok());
  ASSERT_TRUE(first.finish().ok());
  Result<std::unique_ptr<Model>> m = Model::open(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(std::vector<uint8_t>(m.value()->tensors()[0].data, m.value()->tensors()[0].data + 400), data);
  testing::write_all(path + ".tmp", {9, 9, 9});  // what a killed job leaves
  Writer third(path);
  ASSERT_TRUE(third.add_tensor("y", 0, dims).ok());
  ASSERT_TRUE(third.begin().ok());
  ASSERT_TRUE(third.write(data).ok());
  ASSERT_TRUE(third.finish().ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// begin() refuses an output that the final rename could not take (a directory) or that the disk cannot hold
// (4 TiB of F32 here), before any work and without leaving a temporary.
TEST(GgufWriter, ADirectoryOrAFullDiskIsRefusedAtBegin) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("out"));
  const int64_t small[] = {100};
  Writer to_dir(dir.file("out"));
  ASSERT_TRUE(to_dir.add_tensor("x", 0, small).ok());
  Status s = to_dir.begin();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), dir.file("out") + ": is a directory (the output must be a file name)");
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.tmp")));

  const int64_t huge[] = {int64_t(1) << 40};
  Writer too_big(dir.file("big.gguf"));
  ASSERT_TRUE(too_big.add_tensor("x", 0, huge).ok());
  s = too_big.begin();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("big.gguf: needs 4096.00 GiB or more, "), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir.file("big.gguf.tmp")));
}

TEST(GgufWriter, RejectsBadTensorDeclarations) {
  TempDir dir;
  Writer w(dir.file("x.gguf"));
  const int64_t odd[] = {33};
  EXPECT_NE(w.add_tensor("q", 8, odd).message().find("not a multiple of the Q8_0 block size 32"), std::string::npos);
  const int64_t ok[] = {32};
  EXPECT_NE(w.add_tensor("u", 77, ok).message().find("unknown ggml type id 77"), std::string::npos);
  ASSERT_TRUE(w.add_tensor("d", 0, ok).ok());
  EXPECT_NE(w.add_tensor("d", 0, ok).message().find("duplicate"), std::string::npos);
}

// ---- hostile input -----------------------------------------------------------------------------------------

class GgufHostile : public ::testing::Test {
 protected:
  void SetUp() override { good_ = testing::make_sample_gguf(dir_.file("s.gguf")); }
  TempDir dir_;
  std::vector<uint8_t> good_;
};

TEST_F(GgufHostile, SampleParses) { EXPECT_EQ(parse_error(good_), ""); }

TEST_F(GgufHostile, EveryTruncationIsAnErrorNamingTheByte) {
  // Every prefix that cuts the header or any tensor's data must fail cleanly; only the trailing padding
  // after the last tensor may be missing.
  Result<Header> full = parse_header(good_, good_.size(), "t.gguf");
  ASSERT_TRUE(full.ok());
  uint64_t end = 0;
  for (const TensorInfo& t : full->tensors) end = std::max(end, full->data_offset + t.offset + t.nbytes);
  ASSERT_LT(end, good_.size());  // the sample does end with padding
  for (size_t n = 0; n < good_.size(); ++n) {
    std::vector<uint8_t> cut(good_.begin(), good_.begin() + ptrdiff_t(n));
    const std::string err = parse_error(cut);
    if (n >= end) {
      ASSERT_EQ(err, "") << "prefix of " << n << " bytes holds every tensor";
      continue;
    }
    ASSERT_NE(err, "") << "prefix of " << n << " bytes parsed";
    ASSERT_EQ(err.rfind("t.gguf: ", 0), 0u) << err;
    ASSERT_NE(err.find("byte"), std::string::npos) << err;
  }
}

TEST_F(GgufHostile, BadMagic) {
  good_[0] = 'X';
  EXPECT_NE(parse_error(good_).find("magic at byte 0: not a GGUF file"), std::string::npos);
}

TEST_F(GgufHostile, BigEndianIsNamed) {
  poke<uint32_t>(good_, 4, 0x03000000u);
  EXPECT_NE(parse_error(good_).find("big-endian"), std::string::npos) << parse_error(good_);
}

TEST_F(GgufHostile, UnsupportedVersions) {
  poke<uint32_t>(good_, 4, 1);
  EXPECT_NE(parse_error(good_).find("GGUF v1 is not supported"), std::string::npos);
  poke<uint32_t>(good_, 4, 4);
  EXPECT_NE(parse_error(good_).find("unsupported GGUF version 4"), std::string::npos);
}

TEST_F(GgufHostile, HugeCounts) {
  std::vector<uint8_t> b = good_;
  poke<uint64_t>(b, 8, 1ull << 62);
  EXPECT_NE(parse_error(b).find("tensor count at byte 8"), std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, 16, ~0ull);
  EXPECT_NE(parse_error(b).find("metadata count at byte 16"), std::string::npos) << parse_error(b);
}

TEST_F(GgufHostile, StringLengthBeyondFile) {
  // the first key's length field is at byte 24
  poke<uint64_t>(good_, 24, 1ull << 40);
  const std::string err = parse_error(good_);
  EXPECT_NE(err.find("metadata key #0 at byte 24: string length 1099511627776 exceeds"), std::string::npos) << err;
}

TEST_F(GgufHostile, ArrayCountBeyondFile) {
  const size_t at = find_bytes(good_, "strings") + 7 + 4 + 4;  // key, value type, element type
  poke<uint64_t>(good_, at, 1ull << 50);
  const std::string err = parse_error(good_);
  EXPECT_NE(err.find("metadata 'strings'"), std::string::npos) << err;
  EXPECT_NE(err.find("cannot fit"), std::string::npos) << err;
}

TEST_F(GgufHostile, UnknownValueTypes) {
  std::vector<uint8_t> b = good_;
  poke<uint32_t>(b, find_bytes(b, "u16") + 3, 13);
  EXPECT_NE(parse_error(b).find("metadata 'u16' at byte"), std::string::npos) << parse_error(b);
  EXPECT_NE(parse_error(b).find("unknown value type 13"), std::string::npos);
  b = good_;
  poke<uint32_t>(b, find_bytes(b, "strings") + 7 + 4, 99);
  EXPECT_NE(parse_error(b).find("unknown array element type 99"), std::string::npos) << parse_error(b);
}

TEST_F(GgufHostile, BadBool) {
  good_[find_bytes(good_, "bool") + 4 + 4] = 2;
  EXPECT_NE(parse_error(good_).find("metadata 'bool' at byte"), std::string::npos) << parse_error(good_);
}

TEST_F(GgufHostile, DuplicateKey) {
  const size_t at = find_bytes(good_, "i16");
  good_[at] = 'u';  // "u16" now appears twice
  EXPECT_NE(parse_error(good_).find("metadata 'u16' at byte"), std::string::npos) << parse_error(good_);
  EXPECT_NE(parse_error(good_).find("duplicate key"), std::string::npos);
}

TEST_F(GgufHostile, DuplicateTensorName) {
  good_[find_bytes(good_, "b.weight")] = 'a';
  EXPECT_NE(parse_error(good_).find("tensor 'a.weight'"), std::string::npos) << parse_error(good_);
  EXPECT_NE(parse_error(good_).find("duplicate tensor name"), std::string::npos);
}

TEST_F(GgufHostile, TensorFields) {
  const size_t name_at = find_bytes(good_, "c.weight");
  const size_t dims_at = name_at + 8;          // u32 n_dims
  const size_t ne_at = dims_at + 4;            // 3 x u64
  const size_t type_at = ne_at + 3 * 8;
  const size_t offset_at = type_at + 4;
  std::vector<uint8_t> b = good_;
  poke<uint32_t>(b, dims_at, 5);
  EXPECT_NE(parse_error(b).find("tensor 'c.weight' at byte " + std::to_string(dims_at) + ": n_dims 5"),
            std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, ne_at + 8, 1ull << 62);
  poke<uint64_t>(b, ne_at + 16, 1ull << 62);
  EXPECT_NE(parse_error(b).find("product of dimensions overflows"), std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, ne_at + 8, ~0ull);
  EXPECT_NE(parse_error(b).find("negative"), std::string::npos) << parse_error(b);
  b = good_;
  poke<uint32_t>(b, type_at, 4);  // a retired ggml id
  EXPECT_NE(parse_error(b).find("at byte " + std::to_string(type_at) + ": unknown ggml type id 4"),
            std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, ne_at, 48);  // not a multiple of Q8_0's 32
  EXPECT_NE(parse_error(b).find("not a multiple"), std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, offset_at, 33);
  EXPECT_NE(parse_error(b).find("at byte " + std::to_string(offset_at) + ": data offset 33 is not a multiple"),
            std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, offset_at, 1ull << 40);
  EXPECT_NE(parse_error(b).find("past the end of the file"), std::string::npos) << parse_error(b);
  b = good_;
  poke<uint64_t>(b, offset_at, 0);  // on top of a.weight (the smaller of the two at offset 0 is named as overlapped)
  const std::string overlap = parse_error(b);
  EXPECT_TRUE(overlap.find("tensor 'a.weight' data at byte") != std::string::npos ||
              overlap.find("tensor 'c.weight' data at byte") != std::string::npos)
      << overlap;
  EXPECT_TRUE(overlap.find("overlaps tensor 'c.weight'") != std::string::npos ||
              overlap.find("overlaps tensor 'a.weight'") != std::string::npos)
      << overlap;
}

TEST_F(GgufHostile, AlignmentMustBePowerOfTwo) {
  TempDir dir;
  Writer w(dir.file("a.gguf"));
  w.set("general.alignment", Value::of_uint(ValueType::kUint32, 48));
  ASSERT_TRUE(w.begin().ok());
  ASSERT_TRUE(w.finish().ok());
  const std::vector<uint8_t> b = testing::read_all(dir.file("a.gguf"));
  EXPECT_NE(parse_error(b).find("'general.alignment': must be a u32 power of two"), std::string::npos)
      << parse_error(b);
}

TEST_F(GgufHostile, DeeplyNestedArraysAreRefused) {
  // Build [[[[...]]]] 20 levels deep by hand.
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  auto u64 = [&](uint64_t v) { for (int k = 0; k < 8; ++k) b.push_back(uint8_t(v >> (8 * k))); };
  auto u32 = [&](uint32_t v) { for (int k = 0; k < 4; ++k) b.push_back(uint8_t(v >> (8 * k))); };
  u64(0);
  u64(1);
  u64(1);
  b.push_back('k');
  u32(9);
  for (int level = 0; level < 20; ++level) {
    u32(9);
    u64(1);
  }
  for (int k = 0; k < 64; ++k) b.push_back(0);
  EXPECT_NE(parse_error(b).find("nested deeper than"), std::string::npos) << parse_error(b);
}

// Counts that fit the file but would decode to many times its size (~100 bytes per key, tensor or array element)
// are refused by name before anything is allocated for them: a 20 GiB file of a 24-byte header and 1.6e9 keys, or a
// 150 MB array of u8, took the process down (bad_alloc, or the host's memory).
TEST_F(GgufHostile, CountsBeyondWhatAModelNeedsAreRefused) {
  auto header = [](uint64_t n_tensors, uint64_t n_kv, size_t size) {
    std::vector<uint8_t> b(size, 0);
    const uint8_t head[8] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    std::memcpy(b.data(), head, 8);
    std::memcpy(b.data() + 8, &n_tensors, 8);
    std::memcpy(b.data() + 16, &n_kv, 8);
    return b;
  };
  std::string err = parse_error(header(0, 70000, 1 << 20));
  EXPECT_NE(err.find("metadata count at byte 16: 70000 entries, more than the 65536 read"), std::string::npos) << err;
  err = parse_error(header((1 << 20) + 1, 0, 26 << 20));
  EXPECT_NE(err.find("tensor count at byte 8: 1048577 tensors, more than the 1048576 read"), std::string::npos) << err;
  // One key: a u8 array of 2^23 + 1 elements (each one byte in the file).
  std::vector<uint8_t> b = header(0, 1, (9 << 20));
  size_t at = 24;
  auto put = [&](const void* v, size_t n) {
    std::memcpy(b.data() + at, v, n);
    at += n;
  };
  const uint64_t key_len = 1, count = (1 << 23) + 1;
  const uint32_t arr = 9, u8 = 0;
  put(&key_len, 8);
  put("k", 1);
  put(&arr, 4);
  put(&u8, 4);
  put(&count, 8);
  err = parse_error(b);
  EXPECT_NE(err.find("metadata 'k' at byte 41: the metadata's arrays hold more than 8388608 elements"),
            std::string::npos)
      << err;
}

// llama.cpp gives a tensor of no elements the offset of the tensor after it; the overlap check must not count it
// (a sort that put the larger tensor first at that offset reported an overlap, depending on the tensor count).
TEST(GgufOpen, EmptyTensorsSharingAnOffsetAreNotOverlaps) {
  TempDir dir;
  Writer w(dir.file("z.gguf"));
  const int64_t row[] = {8}, none[] = {0};
  for (int i = 0; i < 200; ++i) {
    const bool empty = i >= 150 && i <= 152;
    ASSERT_TRUE(w.add_tensor("t" + std::to_string(i), 0, empty ? none : row).ok());
  }
  ASSERT_TRUE(w.begin().ok());
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(w.write(std::vector<uint8_t>(i >= 150 && i <= 152 ? 0 : 32, 1)).ok());
  ASSERT_TRUE(w.finish().ok());
  Result<std::unique_ptr<Model>> m = Model::open(dir.file("z.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const TensorInfo* z = m.value()->find_tensor("t151");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->nbytes, 0u);
  EXPECT_EQ(z->offset, m.value()->find_tensor("t153")->offset);
}

// A shard of metadata only whose alignment is larger than the file (no padding written): its data section is empty,
// not past the end (the fingerprint hashed up to the section's start and read beyond the mapping).
TEST(GgufOpen, AMetadataOnlyFileEndsItsDataSectionAtItsEnd) {
  TempDir dir;
  Writer w(dir.file("m.gguf"));
  w.set("general.architecture", Value::of_string("qwen3moe"));
  ASSERT_TRUE(w.begin().ok());
  ASSERT_TRUE(w.finish().ok());
  std::vector<uint8_t> b = testing::read_all(dir.file("m.gguf"));
  Result<Header> plain = parse_header(b, b.size(), "m.gguf");
  ASSERT_TRUE(plain.ok());
  // The same header with general.alignment = 2^24 appended as a second key, and no padding.
  const uint64_t n_kv = 2, key_len = 17;
  const uint32_t u32 = 4, align = 1 << 24;
  b.resize(size_t(plain->data_offset));
  while (b.size() > 24 && b.back() == 0) b.pop_back();  // the writer's padding after the one string value
  std::memcpy(b.data() + 16, &n_kv, 8);
  auto put = [&](const void* v, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(v), static_cast<const uint8_t*>(v) + n);
  };
  put(&key_len, 8);
  put("general.alignment", 17);
  put(&u32, 4);
  put(&align, 4);
  testing::write_all(dir.file("m2.gguf"), b);
  Result<std::unique_ptr<Model>> m = Model::open(dir.file("m2.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m.value()->shards()[0]->header().data_offset, b.size());
  EXPECT_NE(m.value()->fingerprint(), 0u);
}

TEST(GgufOpen, MissingAndEmptyFiles) {
  TempDir dir;
  Result<std::unique_ptr<Model>> m = Model::open(dir.file("nope.gguf"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("nope.gguf: cannot open"), std::string::npos);
  testing::write_all(dir.file("empty.gguf"), {});
  m = Model::open(dir.file("empty.gguf"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("file is empty"), std::string::npos);
}

// The fingerprint covers the metadata and the first and last 4 KiB of every tensor's data (a 32 KiB tensor here),
// and is the same for a copy of the file.
TEST(GgufOpen, FingerprintSamplesMetadataAndEveryTensorsEnds) {
  TempDir dir;
  auto write = [&](const std::string& name, const std::string& model_name, size_t flip_at) {
    Writer w(dir.file(name));
    w.set("general.architecture", Value::of_string("qwen3moe"));
    w.set("general.name", Value::of_string(model_name));
    const int64_t big[] = {8192}, small[] = {16};
    EXPECT_TRUE(w.add_tensor("big", 0, big).ok());
    EXPECT_TRUE(w.add_tensor("small", 0, small).ok());
    EXPECT_TRUE(w.begin().ok());
    std::vector<uint8_t> data(8192 * 4);
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 13 % 251);
    if (flip_at < data.size()) data[flip_at] ^= 1;
    EXPECT_TRUE(w.write(data).ok());
    EXPECT_TRUE(w.write(std::vector<uint8_t>(64, 7)).ok());
    EXPECT_TRUE(w.finish().ok());
    Result<std::unique_ptr<Model>> m = Model::open(dir.file(name));
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? m.value()->fingerprint() : 0;
  };
  const uint64_t base = write("a.gguf", "a", SIZE_MAX);
  EXPECT_EQ(write("copy.gguf", "a", SIZE_MAX), base);
  EXPECT_NE(write("name.gguf", "b", SIZE_MAX), base);      // metadata
  EXPECT_NE(write("first.gguf", "a", 100), base);          // in the first 4 KiB
  EXPECT_NE(write("last.gguf", "a", 8192 * 4 - 1), base);  // in the last 4 KiB
  EXPECT_EQ(write("middle.gguf", "a", 16384), base);       // not sampled
}

// ---- split sets --------------------------------------------------------------------------------------------

void write_shard(const std::string& path, int no, int count, int total_tensors, const std::string& tensor) {
  Writer w(path);
  w.set("general.architecture", Value::of_string("qwen3moe"));
  w.set("split.no", Value::of_uint(ValueType::kUint16, uint64_t(no)));
  w.set("split.count", Value::of_uint(ValueType::kUint16, uint64_t(count)));
  w.set("split.tensors.count", Value::of_int(ValueType::kInt32, total_tensors));
  const int64_t dims[] = {8};
  ASSERT_TRUE(w.add_tensor(tensor, 0, dims).ok());
  ASSERT_TRUE(w.begin().ok());
  std::vector<uint8_t> data(32, uint8_t(no + 1));
  ASSERT_TRUE(w.write(data).ok());
  ASSERT_TRUE(w.finish().ok());
}

TEST(GgufSplit, OpensAllShardsFromTheFirst) {
  TempDir dir;
  const std::string prefix = dir.file("m");
  for (int k = 0; k < 3; ++k) write_shard(split_path(prefix, k + 1, 3), k, 3, 3, "t" + std::to_string(k));
  Result<std::unique_ptr<Model>> m = Model::open(split_path(prefix, 1, 3));
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ((*m)->tensors().size(), 3u);
  EXPECT_EQ((*m)->find_tensor("t2")->shard, 2u);
  EXPECT_EQ((*m)->find_tensor("t2")->data[0], 3);
  EXPECT_EQ((*m)->find_tensor("t0")->data[0], 1);

  Result<std::unique_ptr<Model>> second = Model::open(split_path(prefix, 2, 3));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("open the first shard"), std::string::npos);

  std::filesystem::remove(split_path(prefix, 3, 3));
  Result<std::unique_ptr<Model>> missing = Model::open(split_path(prefix, 1, 3));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("m-00003-of-00003.gguf: cannot open"), std::string::npos)
      << missing.status().message();
}

TEST(GgufSplit, InconsistentShardsAreRejected) {
  TempDir dir;
  const std::string prefix = dir.file("m");
  write_shard(split_path(prefix, 1, 2), 0, 2, 3, "a");  // claims 3 tensors in all
  write_shard(split_path(prefix, 2, 2), 1, 2, 3, "b");
  Result<std::unique_ptr<Model>> m = Model::open(split_path(prefix, 1, 2));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("split.tensors.count': says 3 tensors, the shards hold 2"), std::string::npos)
      << m.status().message();
  write_shard(split_path(prefix, 1, 2), 0, 2, 2, "a");
  write_shard(split_path(prefix, 2, 2), 1, 2, 2, "a");  // same name in both shards
  m = Model::open(split_path(prefix, 1, 2));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor 'a': also present"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace magnetar::gguf
