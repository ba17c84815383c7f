// GGUF: the file format of llama.cpp, read and written byte-compatibly.
//
// A file is: magic "GGUF", u32 version (2 or 3; little-endian), u64 tensor count, u64 metadata count, the
// metadata key/value pairs, the tensor infos (name, dims in ggml order = innermost first, ggml type id,
// offset into the data section), padding to `general.alignment` (default 32), then the tensor data.
// This header holds the in-memory model of that content; reader.h opens files, writer.h writes them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace magnetar::gguf {

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;  // GGML_MAX_DIMS

// Metadata value types; the numbers are part of the file format.
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
inline constexpr uint32_t kValueTypeCount = 13;
std::string_view value_type_name(ValueType type);  // "u32", "str", "arr", ...

// One metadata value. Integers are held widened (u for unsigned types and bool, i for signed), floats as
// double; `type` remembers the on-disk type so a round trip writes the same bytes.
struct Value {
  ValueType type = ValueType::kUint8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  ValueType array_type = ValueType::kUint8;  // element type when type == kArray
  std::vector<Value> array;

  static Value of_uint(ValueType type, uint64_t v);
  static Value of_int(ValueType type, int64_t v);
  static Value of_float(ValueType type, double v);
  static Value of_bool(bool v);
  static Value of_string(std::string v);
  static Value of_array(ValueType element_type, std::vector<Value> items);
  static Value of_strings(const std::vector<std::string>& items);

  // Typed reads that accept any integer type whose value fits; nullopt otherwise.
  std::optional<uint64_t> as_uint() const;
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;  // float types and integers
  bool is_string() const { return type == ValueType::kString; }

  // Human-readable rendering; arrays longer than max_items show their first items and the length.
  std::string to_string(size_t max_items = 8) const;
  bool operator==(const Value& other) const;
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  uint32_t type_id = 0;                    // ggml type id (quant::Type for implemented types)
  int n_dims = 0;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is the innermost (row) dimension
  uint64_t offset = 0;                     // relative to the start of its file's data section
  uint64_t nbytes = 0;
  uint32_t shard = 0;                      // which file of a split set holds the data
  const uint8_t* data = nullptr;           // mmapped bytes (reader) or nullptr (not loaded)

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;       // "[2048, 768, 128]"
};

// Byte size of a tensor of the given ggml type and dims, or nullopt with `error` set when the type is
// unknown, ne[0] is not a multiple of the block size, or the size overflows.
std::optional<uint64_t> tensor_nbytes(uint32_t type_id, const std::array<int64_t, kMaxDims>& ne,
                                      std::string* error);

}  // namespace magnetar::gguf
