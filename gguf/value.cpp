#include <limits>

#include "base/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace magnetar::gguf {

std::string_view value_type_name(ValueType type) {
  static constexpr std::string_view kNames[kValueTypeCount] = {
      "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"};
  const uint32_t t = uint32_t(type);
  return t < kValueTypeCount ? kNames[t] : "?";
}

Value Value::of_uint(ValueType type, uint64_t v) {
  Value out;
  out.type = type;
  out.u = v;
  return out;
}
Value Value::of_int(ValueType type, int64_t v) {
  Value out;
  out.type = type;
  out.i = v;
  return out;
}
Value Value::of_float(ValueType type, double v) {
  Value out;
  out.type = type;
  out.f = v;
  return out;
}
Value Value::of_bool(bool v) { return of_uint(ValueType::kBool, v ? 1 : 0); }
Value Value::of_string(std::string v) {
  Value out;
  out.type = ValueType::kString;
  out.str = std::move(v);
  return out;
}
Value Value::of_array(ValueType element_type, std::vector<Value> items) {
  Value out;
  out.type = ValueType::kArray;
  out.array_type = element_type;
  out.array = std::move(items);
  return out;
}
Value Value::of_strings(const std::vector<std::string>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (const std::string& s : items) values.push_back(of_string(s));
  return of_array(ValueType::kString, std::move(values));
}

namespace {
bool is_unsigned(ValueType t) {
  return t == ValueType::kUint8 || t == ValueType::kUint16 || t == ValueType::kUint32 ||
         t == ValueType::kUint64 || t == ValueType::kBool;
}
bool is_signed(ValueType t) {
  return t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt32 || t == ValueType::kInt64;
}
}  // namespace

std::optional<uint64_t> Value::as_uint() const {
  if (is_unsigned(type)) return u;
  if (is_signed(type) && i >= 0) return uint64_t(i);
  return std::nullopt;
}

std::optional<int64_t> Value::as_int() const {
  if (is_signed(type)) return i;
  if (is_unsigned(type) && u <= uint64_t(std::numeric_limits<int64_t>::max())) return int64_t(u);
  return std::nullopt;
}

std::optional<double> Value::as_float() const {
  if (type == ValueType::kFloat32 || type == ValueType::kFloat64) return f;
  if (is_signed(type)) return double(i);
  if (is_unsigned(type)) return double(u);
  return std::nullopt;
}

namespace {
std::string quote(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  size_t n = 0;
  for (unsigned char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += format("\\x%02x", c);
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}
}  // namespace

std::string Value::to_string(size_t max_items) const {
  switch (type) {
    case ValueType::kBool: return u ? "true" : "false";
    case ValueType::kUint8: case ValueType::kUint16: case ValueType::kUint32: case ValueType::kUint64:
      return std::to_string(u);
    case ValueType::kInt8: case ValueType::kInt16: case ValueType::kInt32: case ValueType::kInt64:
      return std::to_string(i);
    case ValueType::kFloat32: case ValueType::kFloat64: return format("%g", f);
    case ValueType::kString: return quote(str, max_items == SIZE_MAX ? SIZE_MAX : 200);
    case ValueType::kArray: {
      std::string out = "[";
      for (size_t k = 0; k < array.size() && k < max_items; ++k) {
        if (k) out += ", ";
        out += array[k].to_string(max_items);
      }
      if (array.size() > max_items) out += format(", ... (%zu %s)", array.size(), value_type_name(array_type).data());
      return out + "]";
    }
  }
  return "?";
}

bool Value::operator==(const Value& o) const {
  if (type != o.type) return false;
  switch (type) {
    case ValueType::kString: return str == o.str;
    case ValueType::kArray: return array_type == o.array_type && array == o.array;
    case ValueType::kFloat32: case ValueType::kFloat64:
      return f == o.f || (f != f && o.f != o.f);  // NaN equals NaN for round-trip checks
    default: return u == o.u && i == o.i;
  }
}

std::string TensorInfo::shape_string() const {
  std::string out = "[";
  for (int d = 0; d < n_dims; ++d) out += (d ? ", " : "") + std::to_string(ne[d]);
  return out + "]";
}

std::optional<uint64_t> tensor_nbytes(uint32_t type_id, const std::array<int64_t, kMaxDims>& ne,
                                      std::string* error) {
  const quant::TypeSizeInfo* info = quant::find_type_size(type_id);
  if (!info) {
    *error = format("unknown ggml type id %u", type_id);
    return std::nullopt;
  }
  for (int64_t d : ne) {
    if (d < 0) {
      *error = "negative dimension";
      return std::nullopt;
    }
  }
  if (ne[0] % info->block_size != 0) {
    *error = format("row length %lld is not a multiple of the %s block size %lld", (long long)ne[0],
                    info->name.data(), (long long)info->block_size);
    return std::nullopt;
  }
  // bytes = ne0/block * type_size * ne1 * ne2 * ne3, each step checked against 2^63.
  using U128 = unsigned __int128;
  const U128 kLimit = U128(std::numeric_limits<int64_t>::max());
  U128 bytes = U128(ne[0] / info->block_size) * info->type_size;
  U128 elements = U128(ne[0]);
  for (int d = 1; d < kMaxDims; ++d) {
    bytes *= U128(ne[d]);
    elements *= U128(ne[d]);
    if (bytes > kLimit || elements > kLimit) {
      *error = "product of dimensions overflows";
      return std::nullopt;
    }
  }
  return uint64_t(bytes);
}

}  // namespace magnetar::gguf
