// What templates call by name: filters (`x | name`), string and dict methods, and the globals
// (namespace, raise_exception, range, strftime_now, dict). Behaviour follows @huggingface/jinja's
// runtime.ts filter by filter, including its differences from Python Jinja that templates can observe
// (strip() ignores its argument, title() only upper-cases word starts, `int` floors, `iterable` is false for
// dicts). Filters the reference lacks (select, reject, round, count, list of a string, map by filter name,
// d) behave as in Python Jinja.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace magnetar::chat::jinja {

#define TRY(lhs, expr) MAGNETAR_ASSIGN_OR_RETURN(lhs, expr)

namespace {

// ---------------------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------------------

bool is_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

// /\b\w/g -> upper case: the first ASCII word character of each word; the rest is left alone.
std::string title_case(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    if (is_word(out[i]) && (i == 0 || !is_word(out[i - 1])) && out[i] >= 'a' && out[i] <= 'z')
      out[i] = char(out[i] - 32);
  }
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const uint32_t cp = decode_utf8(s, &i);
  if (cp >= 0x10000) return s;  // charAt(0) is half a surrogate pair; upper-casing leaves it
  return js_upper(s.substr(0, i)) + s.substr(i);
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    decode_utf8(s, &i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

// The reference's nested attribute path "a.b.0" (dict keys, list indices).
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is(Kind::kObject) || v.is(Kind::kNamespace)) {
      const Value* x = v.obj().find(part);
      if (!x) return Value::undefined();
      v = *x;
    } else if (v.is(Kind::kArray)) {
      double idx = 0;
      if (!js_parse_int(part, &idx) || idx < 0 || idx >= double(v.arr().size())) return Value::undefined();
      v = v.arr()[size_t(idx)];
    } else {
      return Value::undefined();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// compareRuntimeValues: numbers (and booleans) with numbers, strings with strings (case-folded unless
// case_sensitive), none with none, undefined with undefined; anything else is an error. Sorting checks
// comparability first (a correct sort of mixed classes must compare across them, which the reference
// refuses), so the comparator itself cannot fail.
int sort_class(const Value& v) {
  if (v.is(Kind::kNull)) return 0;
  if (v.is(Kind::kUndefined)) return 1;
  if (v.is_numeric() || v.is(Kind::kBool)) return 2;
  if (v.is(Kind::kString)) return 3;
  return 4;
}

Status check_comparable(const std::vector<Value>& keys) {
  if (keys.size() < 2) return Status();
  const int c = sort_class(keys[0]);
  for (const Value& k : keys) {
    if (sort_class(k) != c) {
      return Status::error(std::string("cannot compare a ") + kind_name(keys[0]) + " with a " + kind_name(k));
    }
  }
  if (c == 4) return Status::error(std::string("cannot compare values of type ") + kind_name(keys[0]));
  return Status();
}

int compare_keys(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is(Kind::kString)) {
    return case_sensitive ? js_compare(a.str(), b.str()) : js_compare(js_lower(a.str()), js_lower(b.str()));
  }
  if (a.is_numeric() || a.is(Kind::kBool)) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return 0;
}

// Stable sort of `items` by `keys` (same length), as Array.prototype.sort.
Result<Array> sorted(Interp& in, const Array& items, const std::vector<Value>& keys, bool case_sensitive,
                     bool reverse) {
  MAGNETAR_RETURN_IF_ERROR(check_comparable(keys));
  MAGNETAR_RETURN_IF_ERROR(in.charge_steps(items.size() * 20));
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const int c = compare_keys(keys[x], keys[y], case_sensitive);
    return reverse ? c > 0 : c < 0;
  });
  Array out;
  out.reserve(items.size());
  for (size_t k : order) out.push_back(items[k]);
  return out;
}

Result<bool> flag(const Args& args, size_t i, const char* name, bool def) {
  const Value* v = args.get(i, name);
  if (!v) return def;
  if (!v->is(Kind::kBool)) return Status::error(std::string(name) + " must be a boolean");
  return v->b;
}

Result<Value> to_json_filter(Interp& in, const Value& operand, const Args* args) {
  JsonOptions opt;
  if (args) {
    if (const Value* v = args->get(0, "indent")) {
      if (v->is(Kind::kInt)) {
        opt.indent = int(std::clamp<int64_t>(v->i, 0, 64));
      } else if (!v->is(Kind::kNull)) {
        return Status::error("tojson: indent must be an integer or none");
      }
    }
    TRY(opt.ensure_ascii, flag(*args, size_t(-1), "ensure_ascii", false));
    TRY(opt.sort_keys, flag(*args, size_t(-1), "sort_keys", false));
    if (const Value* sep = args->kw.find("separators")) {
      if (sep->is(Kind::kArray)) {
        if (sep->arr().size() != 2 || !sep->arr()[0].is(Kind::kString) || !sep->arr()[1].is(Kind::kString)) {
          return Status::error("tojson: separators must be a pair of strings");
        }
        opt.custom_separators = true;
        opt.item_sep = sep->arr()[0].str();
        opt.key_sep = sep->arr()[1].str();
      } else if (!sep->is(Kind::kNull)) {
        return Status::error("tojson: separators must be a pair of strings");
      }
    }
  }
  std::string out;
  MAGNETAR_RETURN_IF_ERROR(to_json(operand, opt, &out));
  return in.make_string(std::move(out));
}

Result<Value> join_filter(Interp& in, const Value& operand, const std::string& sep) {
  std::string out;
  if (operand.is(Kind::kString)) {
    const std::vector<std::string> cps = code_points(operand.str());
    for (size_t k = 0; k < cps.size(); ++k) out += (k ? sep : "") + cps[k];
  } else if (operand.is(Kind::kArray)) {
    for (size_t k = 0; k < operand.arr().size(); ++k) {
      if (k) out += sep;
      MAGNETAR_RETURN_IF_ERROR(js_string(operand.arr()[k], &out, /*nullish_empty=*/true));
    }
  } else {
    return Status::error(std::string("join needs a list or a string, got a ") + kind_name(operand));
  }
  return in.make_string(std::move(out));
}

Value int_of(double d) { return std::fabs(d) < 9.2e18 ? Value::integer(int64_t(d)) : Value::number(d); }

Result<Value> indent_filter(Interp& in, const std::string& s, const Args& args) {
  std::string pad(4, ' ');
  if (const Value* w = args.get(0, "width")) {
    if (w->is(Kind::kInt)) {
      pad.assign(size_t(std::clamp<int64_t>(w->i, 0, 1024)), ' ');
    } else if (w->is(Kind::kString)) {
      pad = w->str();
    } else {
      return Status::error("indent: width must be a number");
    }
  }
  const Value* f = args.get(1, "first");
  const Value* b = args.get(2, "blank");
  const bool first = f && truthy(*f), blank = b && truthy(*b);
  std::string out;
  size_t start = 0, line = 0;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string_view x =
        std::string_view(s).substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (line > 0) out += '\n';
    if (!((!first && line == 0) || (!blank && x.empty()))) out += pad;
    out += x;
    if (nl == std::string::npos) break;
    start = nl + 1, ++line;
  }
  return in.make_string(std::move(out));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  std::string out;
  int64_t left = count < 0 ? INT64_MAX : count;
  if (from.empty()) {  // inserts at every code point boundary, ends included
    size_t i = 0;
    while (true) {
      if (left > 0) out += to, --left;
      if (i >= s.size()) break;
      const size_t start = i;
      decode_utf8(s, &i);
      out.append(s, start, i - start);
    }
    return out;
  }
  size_t i = 0;
  while (left > 0) {
    const size_t at = s.find(from, i);
    if (at == std::string::npos) break;
    out.append(s, i, at - i);
    out += to;
    i = at + from.size();
    --left;
  }
  out.append(s, i, std::string::npos);
  return out;
}

const char* const kStringMethods[] = {"upper",  "lower",      "strip",    "title", "capitalize", "rstrip",
                                      "lstrip", "startswith", "endswith", "split", "replace"};
const char* const kDictMethods[] = {"get", "items", "keys", "values", "dictsort"};

template <size_t N>
bool one_of(const std::string& name, const char* const (&list)[N]) {
  for (const char* x : list) {
    if (name == x) return true;
  }
  return false;
}

Result<Value> string_method(Interp& in, const std::string& s, const std::string& name, const Args& args) {
  // strip/lstrip/rstrip ignore an argument in the reference: they always trim whitespace.
  if (name == "upper") return in.make_string(js_upper(s));
  if (name == "lower") return in.make_string(js_lower(s));
  if (name == "strip") return in.make_string(std::string(js_trim(s)));
  if (name == "lstrip") return in.make_string(std::string(js_trim_start(s)));
  if (name == "rstrip") return in.make_string(std::string(js_trim_end(s)));
  if (name == "title") return in.make_string(title_case(s));
  if (name == "capitalize") return in.make_string(capitalize(s));
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    const auto test = [&](const std::string& p) {
      return p.size() <= s.size() &&
             (starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
    };
    if (args.pos.empty()) return Status::error(name + "() needs an argument");
    const Value& p = args.pos[0];
    if (p.is(Kind::kString)) return Value::boolean(test(p.str()));
    if (p.is(Kind::kArray)) {
      for (const Value& x : p.arr()) {
        if (!x.is(Kind::kString)) return Status::error(name + "() tuple elements must be strings");
        if (test(x.str())) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    return Status::error(name + "() argument must be a string or a tuple of strings");
  }
  if (name == "split") {
    const Value* sep = args.get(0, "sep");
    const Value* maxv = args.get(1, "maxsplit");
    if (sep && !sep->is(Kind::kString) && !sep->is(Kind::kNull))
      return Status::error("split: sep must be a string or none");
    if (maxv && !maxv->is(Kind::kInt)) return Status::error("split: maxsplit must be an integer");
    const int64_t max = maxv ? maxv->i : -1;
    Array parts;
    if (!sep || sep->is(Kind::kNull)) {
      const std::string_view text = js_trim_start(s);
      size_t i = 0;
      while (i < text.size()) {
        while (size_t n = js_space_len(text, i)) i += n;
        if (i >= text.size()) break;
        if (max != -1 && int64_t(parts.size()) >= max) {
          parts.push_back(Value::string(std::string(text.substr(i))));
          break;
        }
        const size_t start = i;
        while (i < text.size() && !js_space_len(text, i)) decode_utf8(text, &i);
        parts.push_back(Value::string(std::string(text.substr(start, i - start))));
      }
    } else {
      const std::string& d = sep->str();
      if (d.empty()) return Status::error("split: empty separator");
      std::vector<std::string> pieces;
      size_t start = 0;
      while (true) {
        const size_t at = s.find(d, start);
        if (at == std::string::npos) break;
        pieces.push_back(s.substr(start, at - start));
        start = at + d.size();
      }
      pieces.push_back(s.substr(start));
      if (max != -1 && int64_t(pieces.size()) > max) {  // the rest, joined again, is the last piece
        const size_t m = size_t(std::max<int64_t>(max, 0));
        std::string rest;
        for (size_t k = m; k < pieces.size(); ++k) rest += (k > m ? d : "") + pieces[k];
        pieces.resize(m);
        pieces.push_back(std::move(rest));
      }
      for (std::string& p : pieces) parts.push_back(Value::string(std::move(p)));
    }
    MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(s.size()));
    return in.make_array(std::move(parts));
  }
  if (name == "replace") {
    if (args.pos.size() < 2) return Status::error("replace() needs two arguments");
    if (!args.pos[0].is(Kind::kString) || !args.pos[1].is(Kind::kString)) {
      return Status::error("replace() arguments must be strings");
    }
    const Value* count = args.get(2, "count");
    if (count && !count->is(Kind::kInt) && !count->is(Kind::kNull))
      return Status::error("replace(): count must be an integer");
    const int64_t n = count && count->is(Kind::kInt) ? count->i : -1;
    const size_t estimate = s.size() + (args.pos[1].str().size() + 1) * (s.size() + 1);
    if (args.pos[0].str().empty()) MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(estimate));
    return in.make_string(replace_all(s, args.pos[0].str(), args.pos[1].str(), n));
  }
  return Status::error("strings have no method '" + name + "'");
}

Result<Value> dict_items(const Value& d) {
  Array items;
  for (const auto& [k, v] : d.obj().entries) {
    TRY(Value pair, Value::array({Value::string(k), v}));
    items.push_back(std::move(pair));
  }
  return Value::array(std::move(items));
}

Result<Value> dict_method(Interp& in, const Value& d, const std::string& name, const Args& args) {
  if (name == "items") return dict_items(d);
  if (name == "keys" || name == "values") {
    Array items;
    for (const auto& [k, v] : d.obj().entries) items.push_back(name == "keys" ? Value::string(k) : v);
    return in.make_array(std::move(items));
  }
  if (name == "get") {
    if (args.pos.empty() || !args.pos[0].is(Kind::kString)) return Status::error("get(): the key must be a string");
    if (const Value* v = d.obj().find(args.pos[0].str())) return *v;
    if (const Value* def = args.get(1, "default")) return *def;
    return Value::null();
  }
  if (name == "dictsort") {
    TRY(const bool case_sensitive, flag(args, 0, "case_sensitive", false));
    const Value* by = args.get(1, "by");
    if (by && (!by->is(Kind::kString) || (by->str() != "key" && by->str() != "value"))) {
      return Status::error("dictsort: by must be 'key' or 'value'");
    }
    TRY(const bool reverse, flag(args, 2, "reverse", false));
    TRY(const Value items, dict_items(d));
    std::vector<Value> keys;
    const bool by_value = by && by->str() == "value";
    for (const auto& [k, v] : d.obj().entries) keys.push_back(by_value ? v : Value::string(k));
    TRY(Array out, sorted(in, items.arr(), keys, case_sensitive, reverse));
    return in.make_array(std::move(out));
  }
  return Status::error("dicts have no method '" + name + "'");
}

const char* const kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                               "July",    "August",   "September", "October", "November", "December"};

// strftime_now: the reference's %Y %m %d %b %B %H %M %% (local time); other directives stay as written.
std::string strftime_now(const std::string& fmt) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  const auto pad2 = [](int v) {
    std::string r = std::to_string(v);
    return v < 10 ? "0" + r : r;
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%' || i + 1 >= fmt.size()) {
      out += fmt[i];
      continue;
    }
    const char c = fmt[i + 1];
    switch (c) {
      case 'Y': out += std::to_string(tm.tm_year + 1900); break;
      case 'm': out += pad2(tm.tm_mon + 1); break;
      case 'd': out += pad2(tm.tm_mday); break;
      case 'b': out += std::string(kMonths[tm.tm_mon]).substr(0, 3); break;
      case 'B': out += kMonths[tm.tm_mon]; break;
      case 'H': out += pad2(tm.tm_hour); break;
      case 'M': out += pad2(tm.tm_min); break;
      case '%': out += '%'; break;
      default: out += fmt.substr(i, 2); break;
    }
    ++i;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Globals and methods
// ---------------------------------------------------------------------------------------------------------

Value method_of(const Value& self, const std::string& name) {
  const bool ok = (self.is(Kind::kString) && one_of(name, kStringMethods)) ||
                  (self.is(Kind::kObject) && one_of(name, kDictMethods));
  if (!ok) return Value::undefined();
  return Value::function(Callable{.kind = Fn::kMethod, .self = self, .name = name});
}

Result<Value> call_method(Interp& in, const Value& self, const std::string& name, const Args& args) {
  if (self.is(Kind::kString)) return string_method(in, self.str(), name, args);
  return dict_method(in, self, name, args);
}

Result<Value> call_global(Interp& in, Fn fn, const Args& args) {
  switch (fn) {
    case Fn::kRaiseException: {
      std::string msg;
      if (!args.pos.empty()) MAGNETAR_RETURN_IF_ERROR(js_string(args.pos[0], &msg));
      return Status::error("raise_exception: " + msg);
    }
    case Fn::kNamespace:
    case Fn::kDict: {
      if (args.pos.size() > 1)
        return Status::error(format("namespace() takes at most 1 positional argument, got %zu", args.pos.size()));
      Object entries;
      if (!args.pos.empty()) {
        const Value& src = args.pos[0];
        if (src.is(Kind::kObject)) {
          entries = src.obj();
        } else if (src.is(Kind::kArray)) {
          for (const Value& pair : src.arr()) {
            if (pair.is(Kind::kArray) && pair.arr().size() == 2 && pair.arr()[0].is(Kind::kString)) {
              entries.set(pair.arr()[0].str(), pair.arr()[1]);
            } else {
              return Status::error("namespace() expects a dict or a list of [key, value] pairs");
            }
          }
        } else {
          return Status::error(std::string("namespace() cannot take a ") + kind_name(src));
        }
      }
      for (const auto& [k, v] : args.kw.entries) entries.set(k, v);
      if (fn == Fn::kDict) return Value::object(std::move(entries));
      return in.new_namespace(std::move(entries));
    }
    case Fn::kRange: {
      for (const Value& v : args.pos) {
        if (!v.is(Kind::kInt)) return Status::error(std::string("range() needs integers, got a ") + kind_name(v));
      }
      if (args.pos.empty() || args.pos.size() > 3) return Status::error("range() takes 1 to 3 arguments");
      const int64_t start = args.pos.size() == 1 ? 0 : args.pos[0].i;
      const int64_t stop = args.pos.size() == 1 ? args.pos[0].i : args.pos[1].i;
      const int64_t step = args.pos.size() == 3 ? args.pos[2].i : 1;
      if (step == 0) return Status::error("range() step must not be zero");
      // In 128-bit integers, where neither the count nor the steps can overflow: ceil((stop - start) / step).
      const __int128 span = step > 0 ? (__int128)stop - start : (__int128)start - stop;
      const __int128 n = span > 0 ? (span - 1) / (step > 0 ? (__int128)step : -(__int128)step) + 1 : 0;
      MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(uint64_t(std::min<__int128>(n, __int128(1) << 50)) * sizeof(Value)));
      Array items;
      items.reserve(size_t(n));
      for (__int128 i = start; items.size() < size_t(n); i += step) items.push_back(Value::integer(int64_t(i)));
      return Value::array(std::move(items));
    }
    case Fn::kStrftimeNow: {
      if (args.pos.empty() || !args.pos[0].is(Kind::kString))
        return Status::error("strftime_now() needs a format string");
      return Value::string(strftime_now(args.pos[0].str()));
    }
    default: return Status::error("not callable");
  }
}

// ---------------------------------------------------------------------------------------------------------
// Filters
// ---------------------------------------------------------------------------------------------------------

namespace {

const char* const kFilters[] = {
    "safe",     "tojson",     "join",       "int",        "float",   "default", "d",      "list",  "first",
    "last",     "length",     "count",      "reverse",    "sort",    "string",  "unique", "upper", "lower",
    "title",    "capitalize", "trim",       "indent",     "replace", "abs",     "items",  "keys",  "values",
    "dictsort", "bool",       "selectattr", "rejectattr", "select",  "reject",  "map",    "round", "get"};

// The forms without arguments (`x | name`), by operand type.
Result<Value> plain_filter(Interp& in, const Value& v, const std::string& name) {
  if (name == "default" || name == "d") return v.is(Kind::kUndefined) ? Value::string("") : v;
  if (v.is(Kind::kArray)) {
    const Array& a = v.arr();
    if (name == "list") return v;
    if (name == "first") return a.empty() ? Value::undefined() : a.front();
    if (name == "last") return a.empty() ? Value::undefined() : a.back();
    if (name == "length" || name == "count") return Value::integer(int64_t(a.size()));
    if (name == "reverse") return in.make_array(Array(a.rbegin(), a.rend()));
    if (name == "sort") {
      TRY(Array out, sorted(in, a, a, false, false));
      return in.make_array(std::move(out));
    }
    if (name == "join") return join_filter(in, v, "");
    if (name == "string") {
      std::string out;
      MAGNETAR_RETURN_IF_ERROR(to_json(v, JsonOptions(), &out, false));
      return in.make_string(std::move(out));
    }
    if (name == "unique") {
      Array out;
      MAGNETAR_RETURN_IF_ERROR(in.charge_steps(a.size() * a.size() / 8 + a.size()));
      for (const Value& x : a) {
        bool seen = false;
        for (const Value& y : out) seen = seen || strict_equal(x, y);
        if (!seen) out.push_back(x);
      }
      return in.make_array(std::move(out));
    }
  } else if (v.is(Kind::kString)) {
    const std::string& s = v.str();
    if (name == "length" || name == "count") return Value::integer(int64_t(utf16_length(s)));
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return string_method(in, s, name, Args());
    }
    if (name == "trim") return in.make_string(std::string(js_trim(s)));
    if (name == "indent") return indent_filter(in, s, Args());
    if (name == "join" || name == "string") return v;
    if (name == "int") {
      double d = 0;
      return js_parse_int(s, &d) ? int_of(d) : Value::integer(0);
    }
    if (name == "float") {
      double d = 0;
      return Value::number(js_parse_float(s, &d) ? d : 0.0);
    }
    if (name == "list" || name == "reverse") {  // not in the reference
      Array items;
      for (std::string& c : code_points(s)) items.push_back(Value::string(std::move(c)));
      if (name == "reverse") {
        std::reverse(items.begin(), items.end());
        std::string out;
        for (const Value& c : items) out += c.str();
        return in.make_string(std::move(out));
      }
      return in.make_array(std::move(items));
    }
    if (name == "first" || name == "last") {  // not in the reference
      const std::vector<std::string> cps = code_points(s);
      if (cps.empty()) return Value::undefined();
      return Value::string(name == "first" ? cps.front() : cps.back());
    }
  } else if (v.is_numeric()) {
    if (name == "abs") return v.is(Kind::kInt) ? Value::integer(v.i < 0 ? -v.i : v.i) : Value::number(std::fabs(v.f));
    if (name == "int") return v.is(Kind::kInt) ? v : int_of(std::floor(v.f));
    if (name == "float") return Value::number(v.as_double());
    if (name == "string") {
      std::string out;
      MAGNETAR_RETURN_IF_ERROR(print_value(v, &out));
      return Value::string(std::move(out));
    }
    if (name == "round") return Value::number(std::nearbyint(v.as_double()));  // not in the reference
  } else if (v.is(Kind::kObject)) {
    if (name == "items") return dict_items(v);
    if (name == "length" || name == "count") return Value::integer(int64_t(v.obj().entries.size()));
    if (one_of(name, kDictMethods)) return dict_method(in, v, name, Args());
    if (name == "list") return dict_method(in, v, "keys", Args());  // not in the reference
  } else if (v.is(Kind::kBool)) {
    if (name == "bool") return v;
    if (name == "int") return Value::integer(v.b ? 1 : 0);
    if (name == "float") return Value::number(v.b ? 1.0 : 0.0);
    if (name == "string") return Value::string(v.b ? "true" : "false");
  }
  if (!one_of(name, kFilters)) return Status::error("unknown filter '" + name + "'");
  return Status::error("filter '" + name + "' cannot be applied to a " + kind_name(v));
}

Result<Value> list_filter(Interp& in, const Value& v, const std::string& name, const Args& args, const Expr& node,
                          Scope* scope) {
  const Array& a = v.arr();
  if (name == "sort") {
    TRY(const bool reverse, flag(args, 0, "reverse", false));
    TRY(const bool case_sensitive, flag(args, 1, "case_sensitive", false));
    const Value* attr = args.get(2, "attribute");
    if (attr && !attr->is(Kind::kString) && !attr->is(Kind::kInt) && !attr->is(Kind::kNull)) {
      return Status::error("sort: attribute must be a string, an integer or none");
    }
    std::vector<Value> keys;
    for (const Value& x : a) {
      if (!attr || attr->is(Kind::kNull)) {
        keys.push_back(x);
      } else {
        keys.push_back(attribute_path(x, attr->is(Kind::kInt) ? std::to_string(attr->i) : attr->str()));
      }
    }
    TRY(Array out, sorted(in, a, keys, case_sensitive, reverse));
    return in.make_array(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_true = name == "selectattr" || name == "select";
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (args.pos.empty() || !args.pos[0].is(Kind::kString))
        return Status::error(name + ": the attribute must be a string");
      attr = args.pos[k++].str();
    }
    const Value* test = k < args.pos.size() ? &args.pos[k] : nullptr;
    if (test && !test->is(Kind::kString)) return Status::error(name + ": the test must be a name");
    const Value* arg = k + 1 < args.pos.size() ? &args.pos[k + 1] : nullptr;
    Array out;
    for (const Value& x : a) {
      MAGNETAR_RETURN_IF_ERROR(in.charge_steps(1));
      bool r = false;
      if (by_attr) {
        if (!x.is(Kind::kObject) && !x.is(Kind::kNamespace))
          return Status::error(name + " can only be applied to a list of dicts");
        const Value* field = x.obj().find(attr);
        if (field) {
          if (test) {
            TRY(r, test_value(test->str(), *field, arg));
          } else {
            r = truthy(*field);
          }
        }
      } else if (test) {
        TRY(r, test_value(test->str(), x, arg));
      } else {
        r = truthy(x);
      }
      if (r == keep_true) out.push_back(x);
    }
    return in.make_array(std::move(out));
  }
  if (name == "map") {
    Array out;
    if (const Value* attr = args.kw.find("attribute")) {
      if (!attr->is(Kind::kString)) return Status::error("map: attribute must be a string");
      const Value* def = args.kw.find("default");
      for (const Value& x : a) {
        if (!x.is(Kind::kObject) && !x.is(Kind::kNamespace)) return Status::error("map: items must be dicts");
        Value y = attribute_path(x, attr->str());
        out.push_back(y.is(Kind::kUndefined) && def ? *def : y);
      }
    } else if (!args.pos.empty() && args.pos[0].is(Kind::kString)) {  // map('filter'): not in the reference
      for (const Value& x : a) {
        TRY(Value y, filter_value(in, x, args.pos[0].str(), false, Args(), node, scope));
        out.push_back(std::move(y));
      }
    } else {
      return Status::error("map needs attribute= or a filter name");
    }
    return in.make_array(std::move(out));
  }
  if (args.pos.empty() && args.kw.entries.empty()) return plain_filter(in, v, name);
  if (!one_of(name, kFilters)) return Status::error("unknown filter '" + name + "'");
  return Status::error("filter '" + name + "' cannot be applied to a list with these arguments");
}

}  // namespace

Result<Value> filter_value(Interp& in, const Value& operand, const std::string& name, bool called, const Args& args,
                           const Expr& node, Scope* scope) {
  if (name == "safe") return operand;
  if (name == "tojson") return to_json_filter(in, operand, called ? &args : nullptr);
  if (!called) return plain_filter(in, operand, name);
  if (name == "join") {
    const Value* sep = args.get(0, "separator");
    if (sep && !sep->is(Kind::kString)) return Status::error("join: the separator must be a string");
    return join_filter(in, operand, sep ? sep->str() : "");
  }
  if (name == "int" || name == "float") {
    const bool is_int = name == "int";
    const Value* def = args.get(0, "default");
    const Value fallback = def ? *def : is_int ? Value::integer(0) : Value::number(0);
    if (operand.is(Kind::kString)) {
      double d = 0;
      const bool ok = is_int ? js_parse_int(operand.str(), &d) : js_parse_float(operand.str(), &d);
      return !ok ? fallback : is_int ? int_of(d) : Value::number(d);
    }
    if (operand.is_numeric()) return operand;
    if (operand.is(Kind::kBool)) return is_int ? Value::integer(operand.b) : Value::number(operand.b ? 1 : 0);
    return Status::error("filter '" + name + "' cannot be applied to a " + kind_name(operand));
  }
  if (name == "default" || name == "d") {
    const Value def = args.pos.empty() ? Value::string("") : args.pos[0];
    TRY(const bool boolean, flag(args, 1, "boolean", false));
    return operand.is(Kind::kUndefined) || (boolean && !truthy(operand)) ? def : operand;
  }
  if (name == "round" && operand.is_numeric()) {  // not in the reference: Python Jinja's round
    const Value* p = args.get(0, "precision");
    const Value* m = args.get(1, "method");
    const int64_t precision = p && p->is(Kind::kInt) ? std::clamp<int64_t>(p->i, 0, 15) : 0;
    const std::string method = m && m->is(Kind::kString) ? m->str() : "common";
    const double scale = std::pow(10.0, double(precision)), x = operand.as_double() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value::number(r / scale);
  }
  if (operand.is(Kind::kArray)) return list_filter(in, operand, name, args, node, scope);
  if (operand.is(Kind::kString)) {
    if (name == "indent") return indent_filter(in, operand.str(), args);
    if (name == "replace") return string_method(in, operand.str(), "replace", args);
  }
  if (operand.is(Kind::kObject) && one_of(name, kDictMethods)) return dict_method(in, operand, name, args);
  if (args.pos.empty() && args.kw.entries.empty()) return plain_filter(in, operand, name);
  if (!one_of(name, kFilters)) return Status::error("unknown filter '" + name + "'");
  return Status::error("filter '" + name + "' cannot be applied to a " + kind_name(operand) + " with these arguments");
}

}  // namespace magnetar::chat::jinja
