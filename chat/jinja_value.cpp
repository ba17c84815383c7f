#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
// From JSON. JSON numbers become integers when integral, as JavaScript (which has one number type) sees
// them: 1.0 in a request is the integer 1.
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
      return u <= uint64_t(INT64_MAX) ? Value::integer(int64_t(u)) : Value::number(double(u));
    }
    case J::value_t::number_float: {
      const double d = j.template get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(d));
      return Value::number(d);
    }
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

// String.prototype.localeCompare as ICU orders plain keys: case-insensitive first, lowercase first on ties.
bool locale_less(const std::string& a, const std::string& b) {
  const int c = js_compare(js_lower(a), js_lower(b));
  if (c != 0) return c < 0;
  return js_compare(a, b) > 0;  // 'a' (0x61) before 'A' (0x41)
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

// RuntimeValue.toString() of the reference: what an element prints as inside js_string's join.
Status to_string_form(const Value& v, std::string* out, uint32_t level) {
  switch (v.kind) {
    case Kind::kUndefined: *out += "undefined"; return Status();
    case Kind::kNull: *out += "null"; return Status();
    case Kind::kBool: *out += v.b ? "true" : "false"; return Status();
    case Kind::kInt: *out += std::to_string(v.i); return Status();
    case Kind::kFloat: {
      if (v.f == 0 && std::signbit(v.f)) {
        *out += "-0.0";
      } else if (std::isfinite(v.f) && v.f == std::floor(v.f) && std::fabs(v.f) < 1e21) {
        char buf[400];
        std::snprintf(buf, sizeof(buf), "%.1f", v.f);  // toFixed(1) of an integral value
        *out += buf;
      } else {
        *out += js_number(v.f);
      }
      return Status();
    }
    case Kind::kString: *out += *v.s; return Status();
    case Kind::kArray:
    case Kind::kObject:
    case Kind::kNamespace: return to_json(v, JsonOptions(), out, false, level);
    case Kind::kFunction: return Status::error("cannot print a callable");
  }
  return Status();
}

}  // namespace

Result<Value> from_json(const nlohmann::ordered_json& j, uint32_t depth) { return convert(j, depth); }
Result<Value> from_json(const nlohmann::json& j, uint32_t depth) { return convert(j, depth); }

// ---------------------------------------------------------------------------------------------------------
// To text
// ---------------------------------------------------------------------------------------------------------

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

Status to_json(const Value& v, const JsonOptions& opt, std::string* out, bool undefined_as_null, uint32_t level) {
  if (level > kMaxPrintLevel) return too_deep();
  std::string item_sep = ", ", key_sep = ": ";
  if (opt.custom_separators) {
    item_sep = opt.item_sep, key_sep = opt.key_sep;
  } else if (opt.indent > 0) {
    item_sep = ",";
  }
  const std::string indent(size_t(std::max(opt.indent, 0)), ' ');
  std::string base_pad, child_pad;
  if (opt.indent > 0) {
    base_pad = "\n";
    for (uint32_t k = 0; k < level; ++k) base_pad += indent;
    child_pad = base_pad + indent;
  }
  switch (v.kind) {
    case Kind::kNull: *out += "null"; return Status();
    case Kind::kUndefined: *out += undefined_as_null ? "null" : "undefined"; return Status();
    case Kind::kBool: *out += v.b ? "true" : "false"; return Status();
    case Kind::kInt: *out += std::to_string(v.i); return Status();
    case Kind::kFloat: *out += std::isfinite(v.f) ? js_number(v.f) : "null"; return Status();
    case Kind::kString: json_quote(*v.s, opt.ensure_ascii, out); return Status();
    case Kind::kArray: {
      *out += '[';
      const Array& items = *v.a;
      for (size_t k = 0; k < items.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += item_sep;
        *out += child_pad;
        MAGNETAR_RETURN_IF_ERROR(to_json(items[k], opt, out, undefined_as_null, level + 1));
      }
      if (!items.empty()) *out += base_pad;
      *out += ']';
      return Status();
    }
    case Kind::kObject:
    case Kind::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.o->entries) entries.push_back(&e);
      if (opt.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto* x, const auto* y) { return locale_less(x->first, y->first); });
      }
      *out += '{';
      for (size_t k = 0; k < entries.size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += item_sep;
        *out += child_pad;
        json_quote(entries[k]->first, opt.ensure_ascii, out);
        *out += key_sep;
        MAGNETAR_RETURN_IF_ERROR(to_json(entries[k]->second, opt, out, undefined_as_null, level + 1));
      }
      if (!entries.empty()) *out += base_pad;
      *out += '}';
      return Status();
    }
    case Kind::kFunction: return Status::error("cannot convert a callable to JSON");
  }
  return Status();
}

Status print_value(const Value& v, std::string* out) {
  if (v.is(Kind::kNull) || v.is(Kind::kUndefined)) return Status();
  return to_string_form(v, out, 0);
}

Status js_string(const Value& v, std::string* out, bool nullish_empty, uint32_t level) {
  if (level > kMaxPrintLevel) return too_deep();
  switch (v.kind) {
    case Kind::kUndefined: *out += nullish_empty ? "" : "undefined"; return Status();
    case Kind::kNull: *out += nullish_empty ? "" : "null"; return Status();
    case Kind::kBool: *out += v.b ? "true" : "false"; return Status();
    case Kind::kInt: *out += std::to_string(v.i); return Status();
    case Kind::kFloat: *out += js_number(v.f); return Status();
    case Kind::kString: *out += *v.s; return Status();
    case Kind::kArray: {
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (out->size() > kMaxPrintBytes) return too_long();
        if (k > 0) *out += ',';
        MAGNETAR_RETURN_IF_ERROR(to_string_form((*v.a)[k], out, level + 1));
      }
      return Status();
    }
    case Kind::kObject:
    case Kind::kNamespace: *out += "[object Map]"; return Status();
    case Kind::kFunction: return Status::error("cannot convert a callable to a string");
  }
  return Status();
}

}  // namespace magnetar::chat::jinja
