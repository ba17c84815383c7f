// Helpers shared by the GGUF tests: temporary directories and building small GGUF files in memory.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/writer.h"

namespace magnetar::testing {

// A fresh directory under $TMPDIR, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "magnetar-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// Bytes of a small valid GGUF: every scalar metadata type, a string array, a nested array, and three
// tensors (F32, F16 and Q8_0) whose data bytes are i % 251.
inline std::vector<uint8_t> make_sample_gguf(const std::string& scratch_path) {
  using gguf::Value;
  using gguf::ValueType;
  gguf::Writer w(scratch_path);
  w.set("general.architecture", Value::of_string("qwen3moe"));
  w.set("general.name", Value::of_string("sample"));
  w.set("u8", Value::of_uint(ValueType::kUint8, 200));
  w.set("i8", Value::of_int(ValueType::kInt8, -100));
  w.set("u16", Value::of_uint(ValueType::kUint16, 65000));
  w.set("i16", Value::of_int(ValueType::kInt16, -32000));
  w.set("u32", Value::of_uint(ValueType::kUint32, 4000000000u));
  w.set("i32", Value::of_int(ValueType::kInt32, -2000000000));
  w.set("u64", Value::of_uint(ValueType::kUint64, 1ull << 60));
  w.set("i64", Value::of_int(ValueType::kInt64, -(1ll << 60)));
  w.set("f32", Value::of_float(ValueType::kFloat32, 0.5));
  w.set("f64", Value::of_float(ValueType::kFloat64, 1e-300));
  w.set("bool", Value::of_bool(true));
  w.set("strings", Value::of_strings({"a", "", "héllo", std::string("nul\0byte", 8)}));
  w.set("nested", Value::of_array(ValueType::kArray,
                                  {Value::of_array(ValueType::kInt32, {Value::of_int(ValueType::kInt32, 1)}),
                                   Value::of_array(ValueType::kString, {Value::of_string("x")})}));
  const int64_t d0[] = {64, 3};
  const int64_t d1[] = {32};
  const int64_t d2[] = {64, 2, 2};
  (void)w.add_tensor("a.weight", 0, d0);   // F32
  (void)w.add_tensor("b.weight", 1, d1);   // F16
  (void)w.add_tensor("c.weight", 8, d2);   // Q8_0
  (void)w.begin();
  uint64_t total = 0;
  for (const gguf::TensorInfo& t : w.tensors()) total += t.nbytes;
  std::vector<uint8_t> data(total);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i % 251);
  (void)w.write(data);
  (void)w.finish();
  return read_all(scratch_path);
}

}  // namespace magnetar::testing
