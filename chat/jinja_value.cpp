#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "chat/jinja_text.h"

namespace magnetar::chat::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Result<Value> Value::array(Array items, bool tuple) {
  uint32_t depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth);
  if (depth + 1 > kMaxValueDepth) return Status::error(format("lists nested deeper than %u levels", kMaxValueDepth));
  Value x = with_kind(Kind::kArray);
  x.tuple = tuple;
  x.depth = depth + 1;
  x.a = std::make_shared<const Array>(std::move(items));
  return x;
}

Result<Value> Value::object(Object entries) {
  uint32_t depth = 0;
  for (const auto& e : entries.entries) depth = std::max(depth, e.second.depth);
  if (depth + 1 > kMaxValueDepth) return Status::error(format("dicts nested deeper than %u levels", kMaxValueDepth));
  Value x = with_kind(Kind::kObject);
  x.depth = depth + 1;
  x.o = std::make_shared<Object>(std::move(entries));
  return x;
}

Value Value::ns(Object entries) {
  Value x = with_kind(Kind::kNamespace);
  x.depth = 1;
  x.o = std::make_shared<Object>(std::move(entries));
  return x;
}

Value Value::function(Callable c) {
  Value x = with_kind(Kind::kFunction);
  x.fn = std::make_shared<const Callable>(std::move(c));
  return x;
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNull: return "none";
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kArray: return v.tuple ? "tuple" : "list";
    case Kind::kObject: return "dict";
    case Kind::kNamespace: return "namespace";
    case Kind::kFunction: return "callable";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNull: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0 && !std::isnan(v.f);
    case Kind::kString: return !v.s->empty();
    case Kind::kArray: return !v.a->empty();
    case Kind::kObject: return !v.o->entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction: return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------------------
// From JSON, as Python's json.loads reads it: 2.0 stays a float, integers stay exact (up to 2^64-1 here).
// ---------------------------------------------------------------------------------------------------------

namespace {

template <typename J>
Result<Value> convert(const J& j, uint32_t depth) {
  if (depth > kMaxValueDepth) return Status::error(format("context nested deeper than %u levels", kMaxValueDepth));
  switch (j.type()) {
    case J::value_t::null: return Value::null();
    case J::value_t::boolean: return Value::boolean(j.template get<bool>());
    case J::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      Value v = Value::integer(int64_t(u));
      v.big = u > uint64_t(INT64_MAX);
      return v;
    }
    case J::value_t::number_float: return Value::number(j.template get<double>());
    case J::value_t::string: return Value::string(j.template get<std::string>());
    case J::value_t::array: {
      Array items;
      items.reserve(j.size());
      for (const auto& e : j) {
        MAGNETAR_ASSIGN_OR_RETURN(Value v, convert(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::array(std::move(items));
    }
    case J::value_t::object: {
      Object o;
      o.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        MAGNETAR_ASSIGN_OR_RETURN(Value v, convert(it.value(), depth + 1));
        o.set(it.key(), std::move(v));
      }
      return Value::object(std::move(o));
    }
    default: return Status::error("context holds a value of a type templates cannot use (binary or discarded)");
  }
}

constexpr uint32_t kMaxPrintLevel = kMaxValueDepth + 8;  // namespaces can form chains the depth field misses

// The most a printed list or dict may grow to: values share their elements, so a few steps build a list whose printed
// form has 2^40 leaves; the bytes a value takes when built (Interp::kMaxBytes) say nothing of its printed size.
// 64 MiB: a million-token conversation printed whole is ~8 MiB.
constexpr size_t kMaxPrintBytes = size_t(1) << 26;
Status too_long() {
  return Status::error(
      format("a printed value exceeds %zu MiB (a list or dict that repeats itself?)", kMaxPrintBytes >> 20));
}

Status too_deep() {
  return Status::error(format("value nested deeper than %u levels (or refers to itself)", kMaxPrintLevel));
}

std::string int_text(const Value& v) { return v.big ? std::to_string(uint64_t(v.i)) : std::to_string(v.i); }

// str.isprintable() for the code points a chat meets: controls, separators other than the space, format
// characters, surrogates and private use are not printable (repr escapes them).
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || cp >= 0xF0000 || (cp >= 0xE0000 && cp <= 0xE007F)) return false;
  return true;
}

void py_quote(std::string_view s, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos, has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  static constexpr char kHex[] = "0123456789abcdef";
  *out += quote;
  for (size_t i = 0; i < s.size();) {
    size_t plain = i;  // a run of printable ASCII that needs no escape is copied whole
    while (plain < s.size() && s[plain] >= 0x20 && s[plain] < 0x7F && s[plain] != quote && s[plain] != '\\') ++plain;
    if (plain > i) {
      out->append(s.substr(i, plain - i));
      i = plain;
      continue;
    }
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, &i);
    if (cp == uint32_t(quote) || cp == '\\') {
      *out += '\\';
      *out += char(cp);
    } else if (cp == '\n') {
      *out += "\\n";
    } else if (cp == '\r') {
      *out += "\\r";
    } else if (cp == '\t') {
      *out += "\\t";
    } else if (!py_printable(cp)) {
      const int digits = cp < 0x100 ? 2 : cp < 0x10000 ? 4 : 8;
      *out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
      for (int k = digits - 1; k >= 0; --k) *out += kHex[(cp >> (4 * k)) & 0xF];
    } else {
      out->append(s.substr(start, i - start));
    }
  }
  *out += quote;
}

}  // namespace

Result<Value> from_json(const nlohmann::ordered_json& j, uint32_t depth) { return convert(j, depth); }
Result<Value> from_json(const nlohmann::json& j, uint32_t depth) { return convert(j, depth); }

// ---------------------------------------------------------------------------------------------------------
// To text
// ---------------------------------------------------------------------------------------------------------

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {  // the shortest %.Ne that reads back as d
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D[.DDD]e[+-]XX
  std::string text = buf;
  const bool neg = text[0] == '-';
  if (neg) text.erase(0, 1);
  const size_t e = text.find('e');
  const int exp = std::atoi(text.c_str() + e + 1);
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (text[k] != '.') digits += text[k];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof(buf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + buf;
  }
  if (exp < 0) return out + "0." + std::string(size_t(-exp - 1), '0') + digits;
  const size_t point = size_t(exp) + 1;
  if (digits.size() <= point) return out + digits + std::string(point - digits.size(), '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

void json_quote(std::string_view s, bool ensure_ascii, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto escape_unit = [&](uint32_t u) {
    *out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) *out += kHex[(u >> shift) & 0xF];
  };
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = decode_utf8(s, &i);
    switch (cp) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      default: break;
    }
    if (cp < 0x20) {
      escape_unit(cp);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        escape_unit(0xD800 + ((cp - 0x10000) >> 10));
        escape_unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        escape_unit(cp);
      }
    } else {
      append_utf8(cp, out);
    }
  }
  *out += '"';
}

Status to_json(const Value& v, const JsonOptions& opt, std::string* out, uint32_t level) {
  if (level > kMaxPrintLevel) return too_deep();
  std::string item_sep = ", ", key_sep = ": ";
  if (opt.custom_separators) {
    item_sep = opt.item_sep, key_sep = opt.key_sep;
  } else if (opt.indent >= 0) {
    item_sep = ",";
  }
  const std::string indent(size_t(std::max(opt.indent, 0)), ' ');
  std::string base_pad, child_pad;
  if (opt.indent >= 0) {
    base_pad = "\n";
    for (uint32_t k = 0; k < level; ++k) base_pad += indent;
    child_pad = base_pad + indent;
  }
  switch (v.kind) {
    case Kind::kNull:
    case Kind::kUndefined: *out += "null"; return Status();
    case Kind::kBool: *out += v.b ? "true" : "false"; return Status();
    case Kind::kInt: *out += int_text(v); return Status();
    case Kind::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : py_float(v.f);
      return Status();
    case Kind::kString: json_quote(*v.s, opt.ensure_ascii, out); return Status();
    case Kind::kArray: {
      *out += '[';
      const Array& items = *v.a;
      for (size_t k = 0; k < items.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += item_sep;
        *out += child_pad;
        MAGNETAR_RETURN_IF_ERROR(to_json(items[k], opt, out, level + 1));
      }
      if (!items.empty()) *out += base_pad;
      *out += ']';
      return Status();
    }
    case Kind::kObject:
    case Kind::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.o->entries) entries.push_back(&e);
      if (opt.sort_keys) {  // UTF-8 byte order is code point order
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* x, const auto* y) { return x->first < y->first; });
      }
      *out += '{';
      for (size_t k = 0; k < entries.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += item_sep;
        *out += child_pad;
        json_quote(entries[k]->first, opt.ensure_ascii, out);
        *out += key_sep;
        MAGNETAR_RETURN_IF_ERROR(to_json(entries[k]->second, opt, out, level + 1));
      }
      if (!entries.empty()) *out += base_pad;
      *out += '}';
      return Status();
    }
    case Kind::kFunction: return Status::error("cannot convert a callable to JSON");
  }
  return Status();
}

Status py_repr(const Value& v, std::string* out, uint32_t level) {
  if (level > kMaxPrintLevel) return too_deep();
  switch (v.kind) {
    case Kind::kUndefined: *out += "Undefined"; return Status();
    case Kind::kNull: *out += "None"; return Status();
    case Kind::kBool: *out += v.b ? "True" : "False"; return Status();
    case Kind::kInt: *out += int_text(v); return Status();
    case Kind::kFloat: *out += py_float(v.f); return Status();
    case Kind::kString: py_quote(*v.s, out); return Status();
    case Kind::kArray: {
      *out += v.tuple ? '(' : '[';
      const Array& items = *v.a;
      for (size_t k = 0; k < items.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += ", ";
        MAGNETAR_RETURN_IF_ERROR(py_repr(items[k], out, level + 1));
      }
      if (v.tuple && items.size() == 1) *out += ',';
      *out += v.tuple ? ')' : ']';
      return Status();
    }
    case Kind::kObject:
    case Kind::kNamespace: {
      if (v.is(Kind::kNamespace)) *out += "<Namespace ";
      *out += '{';
      for (size_t k = 0; k < v.o->entries.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += ", ";
        py_quote(v.o->entries[k].first, out);
        *out += ": ";
        MAGNETAR_RETURN_IF_ERROR(py_repr(v.o->entries[k].second, out, level + 1));
      }
      *out += '}';
      if (v.is(Kind::kNamespace)) *out += '>';
      return Status();
    }
    case Kind::kFunction: return Status::error("cannot print a callable");
  }
  return Status();
}

Status py_str(const Value& v, std::string* out) {
  if (v.is(Kind::kUndefined)) return Status();
  if (v.is(Kind::kString)) {
    *out += *v.s;
    return Status();
  }
  return py_repr(v, out);
}

}  // namespace magnetar::chat::jinja
