// Internal to chat/: the values a template computes with, and their conversions (from JSON, to text, to
// JSON), with Python's semantics (str, repr, json.dumps) as transformers' jinja2 environment has them. Strings, lists
// and dicts are shared immutable buffers, so that copying a value is O(1) whatever a template does in a loop; a
// namespace is the one mutable container (`{% set ns.x = ... %}`), shared by reference as in the reference
// implementation. Dicts keep insertion order.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace magnetar::chat::jinja {

struct Value;
struct Callable;
struct Stmt;

using Array = std::vector<Value>;

struct Object {
  std::vector<std::pair<std::string, Value>> entries;  // insertion order
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);  // replaces in place or appends
};

enum class Kind : uint8_t { kUndefined, kNull, kBool, kInt, kFloat, kString, kArray, kObject, kNamespace, kFunction };

// Nesting limit of lists and dicts (the input's and what a template builds): printing and destroying
// values recurse.
constexpr uint32_t kMaxValueDepth = 512;

struct Value {
  Kind kind = Kind::kUndefined;
  bool tuple = false;   // kArray from a tuple literal (behaves as a list)
  bool kwargs = false;  // kObject holding keyword arguments passed on to a function
  bool big = false;     // kInt above INT64_MAX (a JSON integer up to 2^64-1): `i` holds its uint64 bits
  bool b = false;
  int64_t i = 0;
  double f = 0;
  uint32_t depth = 0;  // lists/dicts: nesting depth (1 + deepest element)
  std::shared_ptr<const std::string> s;
  std::shared_ptr<const Array> a;
  std::shared_ptr<Object> o;  // kObject (never mutated once built) or kNamespace (mutable)
  std::shared_ptr<const Callable> fn;

  static Value undefined() { return Value(); }
  static Value null() { return with_kind(Kind::kNull); }
  static Value boolean(bool v) {
    Value x = with_kind(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with_kind(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value number(double v) {
    Value x = with_kind(Kind::kFloat);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = with_kind(Kind::kString);
    x.s = std::make_shared<const std::string>(std::move(v));
    return x;
  }
  // Fails past kMaxValueDepth.
  static Result<Value> array(Array items, bool tuple = false);
  static Result<Value> object(Object entries);
  static Value ns(Object entries);
  static Value function(Callable c);

  bool is(Kind k) const { return kind == k; }
  bool is_numeric() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  double as_double() const {
    return kind == Kind::kInt ? (big ? double(uint64_t(i)) : double(i)) : kind == Kind::kFloat ? f : b ? 1.0 : 0.0;
  }
  const std::string& str() const { return *s; }
  const Array& arr() const { return *a; }
  const Object& obj() const { return *o; }

 private:
  static Value with_kind(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

// What a call can reach: globals, macros, call-block callers and methods bound to their receiver.
enum class Fn {
  kNamespace,
  kRaiseException,
  kRange,
  kStrftimeNow,
  kDict,    // globals
  kMacro,   // {% macro %}
  kCaller,  // caller() inside {% call %}
  kMethod,  // "abc".upper, d.items, ...
};

struct Scope;

struct Callable {
  Fn kind;
  const Stmt* stmt = nullptr;  // kMacro, kCaller
  Scope* scope = nullptr;      // kCaller: the scope of the {% call %} (lives as long as the render)
  Value self = {};             // kMethod: the receiver
  std::string name = {};       // kMethod: the method; kMacro: the macro's name
};

// Type names for error messages: "undefined", "none", "boolean", "integer", "float", "string", "list",
// "dict", "namespace", "callable".
const char* kind_name(const Value& v);

// Python-style truthiness, as the reference computes it: empty string/list/dict, 0, none, undefined are
// false; a namespace or a callable is true.
bool truthy(const Value& v);

Result<Value> from_json(const nlohmann::ordered_json& j, uint32_t depth = 0);
Result<Value> from_json(const nlohmann::json& j, uint32_t depth = 0);

struct JsonOptions {
  int indent = -1;  // -1: one line (None); 0 and up: one item a line, indented that much per level
  bool ensure_ascii = false;
  bool sort_keys = false;  // by code point, as Python sorts str keys
  bool custom_separators = false;
  std::string item_sep, key_sep;  // when custom_separators
};

// json.dumps: ", " and ": " (or "," and ": " when indenting), non-ASCII kept unless ensure_ascii, floats as
// Python's repr (1.0, 1e-07), NaN/Infinity as Python writes them. Undefined becomes null.
Status to_json(const Value& v, const JsonOptions& opt, std::string* out, uint32_t level = 0);

// Python's str(v), which {{ v }}, `~`, join and the string filters use: True/False/None, floats as repr,
// lists/tuples/dicts as their repr ([1, 'a', None], (1,), {'a': 1}); undefined is "".
Status py_str(const Value& v, std::string* out);
// Python's repr(v): strings quoted and escaped as Python does ('a', "it's"), undefined is "Undefined".
Status py_repr(const Value& v, std::string* out, uint32_t level = 0);
// repr() of a float: the shortest text that reads back as the same double (2.0, 1e-07, 1e+16, inf, nan).
std::string py_float(double d);

// json.dumps of one string (quotes included).
void json_quote(std::string_view s, bool ensure_ascii, std::string* out);

}  // namespace magnetar::chat::jinja
