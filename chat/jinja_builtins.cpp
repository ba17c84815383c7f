// What templates call by name: filters (`x | name`), string and dict methods, and the globals
// (namespace, raise_exception, range, strftime_now, dict), as Python jinja2 3.1 has them in transformers'
// environment (tojson is json.dumps with ensure_ascii off). Filters that return generators in Python (map,
// select, items, reverse of a list, unique) return lists here: a template that prints one directly gets the
// list, not Python's "<generator object ...>". Work proportional to a result's size is charged to the budget
// before the result is built.
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
      int64_t idx = 0;
      bool too_big = false;
      if (!py_parse_int(part, &idx, &too_big) || too_big || idx < 0 || idx >= int64_t(v.arr().size())) {
        return Value::undefined();
      }
      v = v.arr()[size_t(idx)];
    } else {
      return Value::undefined();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Python's sorted() with jinja2's key: strings lower-cased unless case_sensitive; keys Python cannot order
// against each other (a number and a string, none and anything) are its TypeError. Stable.
Result<Array> sorted(Interp& in, const Array& items, const std::vector<Value>& keys, bool case_sensitive,
                     bool reverse) {
  uint64_t key_bytes = 0, log_n = 1;
  for (const Value& k : keys) key_bytes += k.is(Kind::kString) ? k.str().size() : 0;
  while ((uint64_t(1) << log_n) < items.size()) ++log_n;
  // Charged before anything is lowered; each comparison charges the strings it walks (py_compare).
  MAGNETAR_RETURN_IF_ERROR(in.charge_steps(items.size() * log_n));
  if (!case_sensitive) {
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(key_bytes));
    MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(key_bytes));
  }
  std::vector<Value> folded = keys;
  for (Value& k : folded) {
    if (k.is(Kind::kString) && !case_sensitive) k = Value::string(py_lower(k.str()));
  }
  for (size_t k = 1; k < folded.size(); ++k) {  // every pair must be comparable: check against the first
    TRY(const int c, py_compare(in, folded[k], folded[0], "<"));
    (void)c;
  }
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  Status failed;  // the first comparison past the budget; the sort then finishes without comparing
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!failed.ok()) return false;
    Result<int> c = py_compare(in, folded[x], folded[y], "<");
    if (!c.ok()) failed = c.status();
    const int v = c.ok() ? *c : 0;
    return reverse ? v > 0 : v < 0;
  });
  MAGNETAR_RETURN_IF_ERROR(failed);
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

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Result<Value> to_json_filter(Interp& in, const Value& operand, const Args* args) {
  JsonOptions opt;
  if (args) {
    if (const Value* v = args->get(0, "ensure_ascii")) opt.ensure_ascii = truthy(*v);
    if (const Value* v = args->get(1, "indent")) {
      if (v->is(Kind::kInt)) {
        opt.indent = int(std::clamp<int64_t>(v->i, 0, 64));  // json.dumps: a negative indent is 0
      } else if (!v->is(Kind::kNull)) {
        return Status::error("tojson: indent must be an integer or none");
      }
    }
    if (const Value* sep = args->get(2, "separators")) {
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
    if (const Value* v = args->get(3, "sort_keys")) opt.sort_keys = truthy(*v);
  }
  std::string out;
  MAGNETAR_RETURN_IF_ERROR(to_json(operand, opt, &out));
  return in.make_string(std::move(out));
}

// Python's str.join over str() of each item, its size charged before it is built.
Result<Value> join_filter(Interp& in, const Value& operand, const std::string& sep) {
  Array items;
  if (operand.is(Kind::kString)) {
    MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(operand.str().size() * (1 + sep.size())));
    for (std::string& c : code_points(operand.str())) items.push_back(Value::string(std::move(c)));
  } else if (operand.is(Kind::kArray)) {
    items = operand.arr();
  } else if (operand.is(Kind::kObject)) {
    for (const auto& e : operand.obj().entries) items.push_back(Value::string(e.first));
  } else if (!operand.is(Kind::kUndefined)) {
    return Status::error(std::string("join needs a list or a string, got a ") + kind_name(operand));
  }
  uint64_t size = items.empty() ? 0 : uint64_t(sep.size()) * (items.size() - 1);
  for (const Value& x : items) size += x.is(Kind::kString) ? x.str().size() : 0;
  MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(size));
  std::string out;
  out.reserve(size);
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    if (items[k].is(Kind::kString)) {
      out += items[k].str();
    } else {
      const size_t before = out.size();
      MAGNETAR_RETURN_IF_ERROR(py_str(items[k], &out));
      MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(out.size() - before));
    }
  }
  return Value::string(std::move(out));
}

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
  const uint64_t lines = uint64_t(std::count(s.begin(), s.end(), '\n')) + 1;
  MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(s.size() + lines * pad.size()));
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
  return Value::string(std::move(out));
}

// Python's str.replace(old, new, count), its size charged before it is built.
Result<Value> replace_all(Interp& in, const std::string& s, const std::string& from, const std::string& to,
                          int64_t count) {
  int64_t left = count < 0 ? INT64_MAX : count;
  uint64_t hits = 0;
  if (from.empty()) {  // inserts at every code point boundary, ends included
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(s.size()));
    hits = std::min<uint64_t>(uint64_t(left), cp_count(s) + 1);
  } else {
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(s.size()));
    for (size_t at = s.find(from); at != std::string::npos && hits < uint64_t(left);
         at = s.find(from, at + from.size())) {
      ++hits;
    }
  }
  MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(s.size() + hits * to.size()));
  std::string out;
  if (from.empty()) {
    size_t i = 0;
    while (true) {
      if (left > 0) out += to, --left;
      if (i >= s.size()) break;
      const size_t start = i;
      decode_utf8(s, &i);
      out.append(s, start, i - start);
    }
    return Value::string(std::move(out));
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
  return Value::string(std::move(out));
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
  if (name == "upper") return in.make_string(py_upper(s));
  if (name == "lower") return in.make_string(py_lower(s));
  if (name == "title") return in.make_string(py_title(s));
  if (name == "capitalize") return in.make_string(py_capitalize(s));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.get(0, "chars");
    if (chars && !chars->is(Kind::kString) && !chars->is(Kind::kNull)) {
      return Status::error(name + " arg must be None or str");
    }
    const std::string* set = chars && chars->is(Kind::kString) ? &chars->str() : nullptr;
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(s.size() + (set ? set->size() : 0)));
    return in.make_string(py_strip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    const auto test = [&](const std::string& p) {
      return p.size() <= s.size() &&
             (starts ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
    };
    if (args.pos.empty()) return Status::error(name + "() needs an argument");
    const Value& p = args.pos[0];
    if (p.is(Kind::kString)) return Value::boolean(test(p.str()));
    if (p.is(Kind::kArray) && p.tuple) {
      for (const Value& x : p.arr()) {
        if (!x.is(Kind::kString)) return Status::error(name + "() tuple elements must be strings");
        if (test(x.str())) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    return Status::error(name + " first arg must be str or a tuple of str, not " + py_type(p));
  }
  if (name == "split") {
    const Value* sep = args.get(0, "sep");
    const Value* maxv = args.get(1, "maxsplit");
    if (sep && !sep->is(Kind::kString) && !sep->is(Kind::kNull))
      return Status::error("split: sep must be a string or none");
    if (maxv && !maxv->is(Kind::kInt)) return Status::error("split: maxsplit must be an integer");
    const int64_t max = maxv ? maxv->i : -1;
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(s.size()));
    MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(s.size()));
    Array parts;
    if (!sep || sep->is(Kind::kNull)) {  // runs of whitespace; none at the ends
      size_t i = 0;
      const auto space_at = [&](size_t at, size_t* after) {
        *after = at;
        return py_is_space(decode_utf8(s, after));
      };
      size_t after = 0;
      while (i < s.size()) {
        while (i < s.size() && space_at(i, &after)) i = after;
        if (i >= s.size()) break;
        if (max >= 0 && int64_t(parts.size()) >= max) {
          parts.push_back(Value::string(s.substr(i)));  // the rest as it is, trailing whitespace kept
          break;
        }
        const size_t start = i;
        while (i < s.size() && !space_at(i, &after)) i = after;
        parts.push_back(Value::string(s.substr(start, i - start)));
      }
    } else {
      const std::string& d = sep->str();
      if (d.empty()) return Status::error("empty separator");
      size_t start = 0;
      while (max < 0 || int64_t(parts.size()) < max) {
        const size_t at = s.find(d, start);
        if (at == std::string::npos) break;
        parts.push_back(Value::string(s.substr(start, at - start)));
        start = at + d.size();
      }
      parts.push_back(Value::string(s.substr(start)));
    }
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
    return replace_all(in, s, args.pos[0].str(), args.pos[1].str(), n);
  }
  return Status::error("strings have no method '" + name + "'");
}

// (key, value) tuples, as dict.items() yields them.
Result<Value> dict_items(const Value& d) {
  Array items;
  for (const auto& [k, v] : d.obj().entries) {
    TRY(Value pair, Value::array({Value::string(k), v}, /*tuple=*/true));
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
                  (self.is(Kind::kObject) && one_of(name, kDictMethods) && name != "dictsort");
  if (!ok) return Value::undefined();
  return Value::function(Callable{.kind = Fn::kMethod, .self = self, .name = name});
}

Result<Value> call_method(Interp& in, const Value& self, const std::string& name, const Args& args) {
  if (name == "cycle" && self.is(Kind::kInt)) {  // loop.cycle(a, b, ...): `self` is loop.index0
    if (args.pos.empty()) return Status::error("no items for cycling given");
    return args.pos[size_t(self.i) % args.pos.size()];
  }
  if (self.is(Kind::kString)) return string_method(in, self.str(), name, args);
  return dict_method(in, self, name, args);
}

Result<Value> call_global(Interp& in, Fn fn, const Args& args) {
  switch (fn) {
    case Fn::kRaiseException: {
      std::string msg;
      if (!args.pos.empty()) MAGNETAR_RETURN_IF_ERROR(py_str(args.pos[0], &msg));
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

// The items a filter iterates: a list's elements, a dict's keys, a string's characters (charged before they
// are made), nothing for undefined; `ok` false for anything else.
Result<Array> iterate(Interp& in, const Value& v, bool* ok) {
  *ok = true;
  Array items;
  if (v.is(Kind::kArray)) return v.arr();
  if (v.is(Kind::kObject)) {
    for (const auto& e : v.obj().entries) items.push_back(Value::string(e.first));
  } else if (v.is(Kind::kString)) {
    MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(v.str().size() * (1 + sizeof(Value))));
    for (std::string& c : code_points(v.str())) items.push_back(Value::string(std::move(c)));
  } else if (!v.is(Kind::kUndefined)) {
    *ok = false;
  }
  return items;
}

// Python's round(x, ndigits) on a double: correctly rounded, ties to even on the exact binary value (2.675
// is 2.67499999... and rounds to 2.67), which is what printf's %.Nf computes.
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits < -308) return std::copysign(0.0, x);  // 10^-ndigits is inf past here (and -INT64_MIN undefined)
  if (ndigits < 0) {
    const double scale = std::pow(10.0, double(-ndigits));
    return std::nearbyint(x / scale) * scale;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", int(std::min<int64_t>(ndigits, 300)), x);
  return std::strtod(buf, nullptr);
}

// The string filters apply to str() of any value (jinja2's soft_str): `none | upper` is "NONE".
bool is_string_filter(const std::string& name) {
  return name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "trim" ||
         name == "indent" || name == "replace" || name == "string";
}

Result<Value> int_filter(const Value& v, const Value& fallback) {
  if (v.is(Kind::kInt)) return v;
  if (v.is(Kind::kBool)) return Value::integer(v.b);
  if (v.is(Kind::kFloat)) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
    return Value::integer(int64_t(v.f));  // int() truncates toward zero
  }
  if (v.is(Kind::kString)) {
    int64_t i = 0;
    bool too_big = false;
    if (py_parse_int(v.str(), &i, &too_big)) return too_big ? fallback : Value::integer(i);
    double d = 0;
    if (py_parse_float(v.str(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(d));
    return fallback;
  }
  return fallback;
}

Result<Value> float_filter(const Value& v, const Value& fallback) {
  if (v.is_numeric() || v.is(Kind::kBool)) return Value::number(v.as_double());
  double d = 0;
  if (v.is(Kind::kString) && py_parse_float(v.str(), &d)) return Value::number(d);
  return fallback;
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
        const Value field = attribute_path(x, attr);  // undefined when missing, as getattr gives it
        if (test) {
          TRY(r, test_value(in, test->str(), field, arg));
        } else {
          r = truthy(field);
        }
      } else if (test) {
        TRY(r, test_value(in, test->str(), x, arg));
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
  return Status::error("filter '" + name + "' cannot be applied to a list with these arguments");
}

}  // namespace

bool is_filter_name(const std::string& name) { return one_of(name, kFilters); }

Result<Value> filter_value(Interp& in, const Value& raw, const std::string& name, bool called, const Args& args,
                           const Expr& node, Scope* scope) {
  (void)called;
  if (name == "safe") return raw;
  if (name == "tojson") return to_json_filter(in, raw, &args);
  if (name == "default" || name == "d") {
    const Value def = args.get(0, "default_value") ? *args.get(0, "default_value") : Value::string("");
    const Value* boolean = args.get(1, "boolean");
    return raw.is(Kind::kUndefined) || (boolean && truthy(*boolean) && !truthy(raw)) ? def : raw;
  }
  Value operand = raw;
  if (is_string_filter(name) && !raw.is(Kind::kString)) {
    std::string text;
    MAGNETAR_RETURN_IF_ERROR(py_str(raw, &text));
    TRY(operand, in.make_string(std::move(text)));
  }
  if (operand.is(Kind::kString)) {
    const std::string& s = operand.str();
    if (name == "string") return operand;
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return string_method(in, s, name, Args());
    }
    if (name == "trim") {
      Args strip_args;
      if (const Value* chars = args.get(0, "chars")) strip_args.pos.push_back(*chars);
      return string_method(in, s, "strip", strip_args);
    }
    if (name == "indent") return indent_filter(in, s, args);
    if (name == "replace") return string_method(in, s, "replace", args);
    if (name == "reverse") {
      MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(s.size() * (1 + sizeof(std::string))));
      std::vector<std::string> cps = code_points(s);
      std::string out;
      out.reserve(s.size());
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(std::move(out));
    }
  }
  if (name == "length" || name == "count") {
    if (operand.is(Kind::kString)) {
      MAGNETAR_RETURN_IF_ERROR(in.charge_scan(operand.str().size()));
      return Value::integer(int64_t(cp_count(operand.str())));
    }
    if (operand.is(Kind::kArray)) return Value::integer(int64_t(operand.arr().size()));
    if (operand.is(Kind::kObject)) return Value::integer(int64_t(operand.obj().entries.size()));
    if (operand.is(Kind::kUndefined)) return Value::integer(0);
    return Status::error(std::string("object of type '") + py_type(operand) + "' has no len()");
  }
  if (name == "int" || name == "float") {
    const Value* def = args.get(0, "default");
    const Value fallback = def ? *def : name == "int" ? Value::integer(0) : Value::number(0);
    return name == "int" ? int_filter(operand, fallback) : float_filter(operand, fallback);
  }
  if (name == "abs") {
    if (operand.is(Kind::kInt)) return operand.big || operand.i >= 0 ? operand : py_negate(operand.i);
    if (operand.is(Kind::kBool)) return Value::integer(operand.b);
    if (operand.is(Kind::kFloat)) return Value::number(std::fabs(operand.f));
    return Status::error(std::string("bad operand type for abs(): '") + py_type(operand) + "'");
  }
  if (name == "round") {
    if (!operand.is_numeric() && !operand.is(Kind::kBool)) {
      return Status::error(std::string("type ") + py_type(operand) + " doesn't define __round__ method");
    }
    const Value* p = args.get(0, "precision");
    const Value* m = args.get(1, "method");
    const int64_t precision = p && p->is(Kind::kInt) ? p->i : 0;
    const std::string method = m && m->is(Kind::kString) ? m->str() : "common";
    if (method != "common" && method != "ceil" && method != "floor") {
      return Status::error("method must be common, ceil or floor");
    }
    if (method == "common") {
      if (!operand.is(Kind::kFloat)) return operand.is(Kind::kBool) ? Value::integer(operand.b) : operand;
      return Value::number(py_round(operand.f, precision));
    }
    const double scale = std::pow(10.0, double(precision));
    const double x = operand.as_double() * scale;
    return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "bool") return Value::boolean(truthy(operand));
  if (name == "join") {
    const Value* sep = args.get(0, "d");
    if (sep && !sep->is(Kind::kString)) return Status::error("join: the separator must be a string");
    Value source = operand;
    if (const Value* attr = args.get(1, "attribute"); attr && operand.is(Kind::kArray)) {
      if (!attr->is(Kind::kString)) return Status::error("join: attribute must be a string");
      Array picked;
      for (const Value& x : operand.arr()) picked.push_back(attribute_path(x, attr->str()));
      TRY(source, Value::array(std::move(picked)));
    }
    return join_filter(in, source, sep ? sep->str() : "");
  }
  if (name == "items") {
    if (operand.is(Kind::kUndefined)) return Value::array({});
    if (!operand.is(Kind::kObject)) return Status::error("can only get item pairs from a mapping");
    return dict_items(operand);
  }
  if (operand.is(Kind::kObject) && one_of(name, kDictMethods)) return dict_method(in, operand, name, args);
  if (name == "list" || name == "first" || name == "last" || name == "reverse" || name == "sort" || name == "unique" ||
      name == "map" || name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool ok = true;
    TRY(const Array items, iterate(in, operand, &ok));
    if (!ok) return Status::error(std::string("'") + py_type(operand) + "' object is not iterable");
    if (name == "first") return items.empty() ? Value::undefined() : items.front();
    if (name == "last") return items.empty() ? Value::undefined() : items.back();
    if (name == "list") return in.make_array(items);
    if (name == "reverse") return in.make_array(Array(items.rbegin(), items.rend()));
    if (name == "unique") {
      TRY(const bool case_sensitive, flag(args, 0, "case_sensitive", false));
      const Value* attr = args.get(1, "attribute");
      MAGNETAR_RETURN_IF_ERROR(in.charge_steps(items.size() * items.size() / 8 + items.size()));
      uint64_t key_bytes = 0;
      for (const Value& x : items) key_bytes += x.is(Kind::kString) ? x.str().size() : 0;
      MAGNETAR_RETURN_IF_ERROR(in.charge_scan(key_bytes));  // lowered; py_equal charges the compares
      if (!case_sensitive) MAGNETAR_RETURN_IF_ERROR(in.charge_bytes(key_bytes));
      Array out;
      std::vector<Value> seen;
      for (const Value& x : items) {
        Value key = attr && attr->is(Kind::kString) ? attribute_path(x, attr->str()) : x;
        if (key.is(Kind::kString) && !case_sensitive) key = Value::string(py_lower(key.str()));
        bool dup = false;
        for (size_t k = 0; k < seen.size() && !dup; ++k) {
          TRY(dup, py_equal(in, key, seen[k]));
        }
        if (!dup) seen.push_back(key), out.push_back(x);
      }
      return in.make_array(std::move(out));
    }
    TRY(const Value list, Value::array(items));
    return list_filter(in, list, name, args, node, scope);
  }
  if (!one_of(name, kFilters)) return Status::error("no filter named '" + name + "'");
  return Status::error("filter '" + name + "' cannot be applied to a " + kind_name(operand));
}

}  // namespace magnetar::chat::jinja
