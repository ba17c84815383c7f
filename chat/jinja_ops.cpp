// Operators and tests with Python's semantics (what transformers' jinja2 computes): `==` compares values
// (1 == 1.0 == True, lists and dicts by content, an undefined value equals only another), `+` adds numbers
// or joins two strings or two lists (anything else is an error), `*` repeats strings and lists, `%` is
// Python's modulo or string formatting, `~` joins str() of both sides, `in` works on strings, lists and
// dict keys; none and undefined operands are errors except in `==`, `!=`, `~` and `x in undefined`.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace magnetar::chat::jinja {

#define TRY(lhs, expr) MAGNETAR_ASSIGN_OR_RETURN(lhs, expr)

namespace {

bool number_like(const Value& v) { return v.is_numeric() || v.is(Kind::kBool); }
int64_t as_int(const Value& v) { return v.is(Kind::kBool) ? int64_t(v.b) : v.i; }
bool exact_int(const Value& v) { return (v.is(Kind::kInt) && !v.big) || v.is(Kind::kBool); }

const void* identity(const Value& v) {
  if (v.is(Kind::kArray)) return v.a.get();
  if (v.is(Kind::kObject) || v.is(Kind::kNamespace)) return v.o.get();
  return v.fn.get();
}

// Python's % on floats: the result takes the divisor's sign.
double py_fmod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// The digits of |x| in `base` for an integer held exactly in a double or a uint64: x = mantissa * 2^shift,
// divided down as a little bignum (a double reaches 2^1024: at most 33 limbs of 32 bits).
std::string magnitude_digits(uint64_t mantissa, int shift, unsigned base, bool upper) {
  std::vector<uint32_t> limbs;  // little-endian
  for (int k = 0; k < shift / 32; ++k) limbs.push_back(0);
  const unsigned rest = unsigned(shift % 32);
  const unsigned __int128 top = (unsigned __int128)mantissa << rest;
  for (unsigned __int128 t = top; t != 0; t >>= 32) limbs.push_back(uint32_t(t));
  const char* digit = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string out;
  while (!limbs.empty()) {
    uint64_t rem = 0;
    for (size_t k = limbs.size(); k-- > 0;) {
      const uint64_t cur = (rem << 32) | limbs[k];
      limbs[k] = uint32_t(cur / base);
      rem = cur % base;
    }
    out += digit[rem];
    while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
  }
  if (out.empty()) out.push_back('0');
  std::reverse(out.begin(), out.end());
  return out;
}

// %d %i %x %X %o of a number as Python prints it: floats truncate toward zero and print every digit ('%d' %
// 1e20 is 100000000000000000000), negatives print a sign and the magnitude ('%x' % -255 is -ff), '#' adds 0x/0o,
// the precision is a minimum digit count, '0' pads between the sign and the digits.
Result<std::string> format_integer(const Value& v, char conv, const std::string& flags, const std::string& width,
                                   const std::string& precision) {
  bool neg = false;
  uint64_t mantissa = 0;
  int shift = 0;
  if (exact_int(v)) {
    const int64_t x = as_int(v);
    neg = x < 0;
    mantissa = neg ? 0 - uint64_t(x) : uint64_t(x);
  } else if (v.is(Kind::kInt)) {  // big: above INT64_MAX
    mantissa = uint64_t(v.i);
  } else {
    const double d = std::trunc(v.f);
    if (std::isnan(d)) return Status::error("cannot convert float NaN to integer");
    if (std::isinf(d)) return Status::error("cannot convert float infinity to integer");
    neg = d < 0;
    int exp = 0;
    const double frac = std::frexp(std::fabs(d), &exp);  // |d| = frac * 2^exp, frac in [0.5, 1)
    if (exp <= 64) {
      mantissa = uint64_t(std::fabs(d));
    } else {
      mantissa = uint64_t(std::ldexp(frac, 53));
      shift = exp - 53;
    }
  }
  const unsigned base = conv == 'x' || conv == 'X' ? 16 : conv == 'o' ? 8 : 10;
  std::string digits = magnitude_digits(mantissa, shift, base, conv == 'X');
  const auto has_flag = [&](char c) { return flags.find(c) != std::string::npos; };
  const size_t min_digits = precision.size() > 1 ? size_t(std::atoi(precision.c_str() + 1)) : 0;
  if (digits.size() < min_digits) digits.insert(0, min_digits - digits.size(), '0');
  std::string prefix = neg ? "-" : has_flag('+') ? "+" : has_flag(' ') ? " " : "";
  if (has_flag('#') && base == 16) prefix += conv == 'X' ? "0X" : "0x";
  if (has_flag('#') && base == 8) prefix += "0o";
  const size_t w = width.empty() ? 0 : size_t(std::atoi(width.c_str()));
  const size_t len = prefix.size() + digits.size();
  if (len < w) {
    if (has_flag('-')) {
      digits.append(w - len, ' ');
    } else if (has_flag('0')) {
      digits.insert(0, w - len, '0');
    } else {
      prefix.insert(0, w - len, ' ');
    }
  }
  return prefix + digits;
}

}  // namespace

// Python's type name, for error messages shaped like Python's.
const char* py_type(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNull: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kArray: return v.tuple ? "tuple" : "list";
    case Kind::kObject: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kFunction: return "function";
  }
  return "?";
}

Result<bool> py_equal(Interp& in, const Value& a, const Value& b, uint32_t level) {
  if (a.is(Kind::kUndefined) || b.is(Kind::kUndefined)) return a.kind == b.kind;
  if (level > kMaxValueDepth) return false;
  if (number_like(a) && number_like(b)) {
    if (exact_int(a) && exact_int(b)) return as_int(a) == as_int(b);
    if (a.big && b.big) return a.i == b.i;
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kNull: return true;
    case Kind::kString:
      if (a.str().size() != b.str().size()) return false;
      MAGNETAR_RETURN_IF_ERROR(in.charge_scan(a.str().size()));  // before the walk: one may be gigabytes
      return a.str() == b.str();
    case Kind::kArray: {
      if (a.tuple != b.tuple || a.arr().size() != b.arr().size()) return false;
      for (size_t k = 0; k < a.arr().size(); ++k) {
        MAGNETAR_RETURN_IF_ERROR(in.charge_scan(kScanBytesPerItem));
        TRY(const bool same, py_equal(in, a.arr()[k], b.arr()[k], level + 1));
        if (!same) return false;
      }
      return true;
    }
    case Kind::kObject: {
      if (a.obj().entries.size() != b.obj().entries.size()) return false;
      for (const auto& [k, v] : a.obj().entries) {
        MAGNETAR_RETURN_IF_ERROR(in.charge_scan(kScanBytesPerItem * b.obj().entries.size() + k.size()));  // find
        const Value* w = b.obj().find(k);
        if (!w) return false;
        TRY(const bool same, py_equal(in, v, *w, level + 1));
        if (!same) return false;
      }
      return true;
    }
    default: return identity(a) == identity(b);
  }
}

Result<int> py_compare(Interp& in, const Value& a, const Value& b, const char* op, uint32_t level) {
  if (number_like(a) && number_like(b)) {
    if (exact_int(a) && exact_int(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;  // NaN compares as equal here (Python: every comparison false)
  }
  if (a.is(Kind::kString) && b.is(Kind::kString)) {
    MAGNETAR_RETURN_IF_ERROR(in.charge_scan(std::min(a.str().size(), b.str().size())));
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is(Kind::kArray) && b.is(Kind::kArray) && a.tuple == b.tuple && level < kMaxValueDepth) {
    const size_t n = std::min(a.arr().size(), b.arr().size());
    for (size_t k = 0; k < n; ++k) {
      MAGNETAR_RETURN_IF_ERROR(in.charge_scan(kScanBytesPerItem));
      TRY(const bool same, py_equal(in, a.arr()[k], b.arr()[k]));
      if (same) continue;
      return py_compare(in, a.arr()[k], b.arr()[k], op, level + 1);
    }
    return a.arr().size() < b.arr().size() ? -1 : a.arr().size() > b.arr().size() ? 1 : 0;
  }
  return Status::error(std::string("'") + op + "' not supported between instances of '" + py_type(a) + "' and '" +
                       py_type(b) + "'");
}

Result<bool> py_contains(Interp& in, const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kUndefined: return false;  // an undefined value iterates as empty
    case Kind::kString:
      if (!item.is(Kind::kString)) {
        return Status::error(std::string("'in <string>' requires string as left operand, not ") + py_type(item));
      }
      MAGNETAR_RETURN_IF_ERROR(in.charge_scan(container.str().size()));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kArray:
      MAGNETAR_RETURN_IF_ERROR(in.charge_steps(container.arr().size()));
      for (const Value& x : container.arr()) {
        TRY(const bool same, py_equal(in, x, item));
        if (same) return true;
      }
      return false;
    case Kind::kObject:
    case Kind::kNamespace: return item.is(Kind::kString) && container.obj().find(item.str()) != nullptr;
    default: return Status::error(std::string("argument of type '") + py_type(container) + "' is not iterable");
  }
}

Value py_negate(int64_t x) {
  if (x != INT64_MIN) return Value::integer(-x);
  Value v = Value::integer(x);  // 2^63: past INT64_MAX, held as its uint64 bits (the bits of INT64_MIN)
  v.big = true;
  return v;
}

Result<Value> Interp::repeat(const Value& seq, int64_t times) {
  times = std::max<int64_t>(times, 0);
  // Refused before multiplying: size * times wraps for a long enough sequence (then it charged next to nothing).
  const uint64_t unit = seq.is(Kind::kString) ? seq.str().size() : seq.arr().size() * sizeof(Value);
  if (unit == 0) times = 0;  // nothing to repeat: no loop of `times` empty appends
  if (unit != 0 && uint64_t(times) > kMaxBytes / unit) MAGNETAR_RETURN_IF_ERROR(charge_bytes(kMaxBytes + 1));
  if (seq.is(Kind::kString)) {
    const std::string& s = seq.str();
    MAGNETAR_RETURN_IF_ERROR(charge_bytes(uint64_t(s.size()) * uint64_t(times)));
    std::string out;
    out.reserve(s.size() * size_t(times));
    for (int64_t k = 0; k < times; ++k) out += s;
    return Value::string(std::move(out));
  }
  const Array& a = seq.arr();
  MAGNETAR_RETURN_IF_ERROR(charge_bytes(uint64_t(a.size()) * sizeof(Value) * uint64_t(times)));
  Array out;
  out.reserve(a.size() * size_t(times));
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), a.begin(), a.end());
  return Value::array(std::move(out), seq.tuple);
}

Result<Value> Interp::eval_binary(const Expr& e, Scope* s) {
  TRY(const Value left, eval(*e.a, s));
  if (e.op == Op::kAnd) return truthy(left) ? eval(*e.b, s) : left;
  if (e.op == Op::kOr) return truthy(left) ? left : eval(*e.b, s);
  TRY(const Value right, eval(*e.b, s));
  if (e.op == Op::kEq || e.op == Op::kNe) {
    TRY(const bool same, py_equal(*this, left, right));
    return Value::boolean(same == (e.op == Op::kEq));
  }
  if (e.op == Op::kConcat) {
    std::string text;
    MAGNETAR_RETURN_IF_ERROR(py_str(left, &text));
    MAGNETAR_RETURN_IF_ERROR(py_str(right, &text));
    return make_string(std::move(text));
  }
  if (e.op == Op::kIn || e.op == Op::kNotIn) {
    TRY(const bool found, py_contains(*this, right, left));
    return Value::boolean(found == (e.op == Op::kIn));
  }
  if (left.is(Kind::kUndefined) || right.is(Kind::kUndefined)) return Status::error("an operand is undefined");
  static constexpr const char* kNames[] = {"",       "and", "or", "not", "==", "!=", "<",  ">", "<=", ">=", "in",
                                           "not in", "+",   "-",  "~",   "*",  "/",  "//", "%", "**", "-",  "+"};
  const char* op_name = kNames[int(e.op)];
  switch (e.op) {
    case Op::kLt:
    case Op::kGt:
    case Op::kLe:
    case Op::kGe: {
      TRY(const int c, py_compare(*this, left, right, op_name));
      return Value::boolean(e.op == Op::kLt ? c < 0 : e.op == Op::kGt ? c > 0 : e.op == Op::kLe ? c <= 0 : c >= 0);
    }
    default: break;
  }
  const auto unsupported = [&]() {
    if (e.op == Op::kAdd && left.is(Kind::kString)) {
      return Status::error(std::string("can only concatenate str (not \"") + py_type(right) + "\") to str");
    }
    return Status::error(std::string("unsupported operand type(s) for ") + op_name + ": '" + py_type(left) + "' and '" +
                         py_type(right) + "'");
  };
  if (e.op == Op::kMod && left.is(Kind::kString)) return percent_format(left.str(), right);
  if (e.op == Op::kMul) {
    if ((left.is(Kind::kString) || left.is(Kind::kArray)) && exact_int(right)) return repeat(left, as_int(right));
    if ((right.is(Kind::kString) || right.is(Kind::kArray)) && exact_int(left)) return repeat(right, as_int(left));
  }
  if (e.op == Op::kAdd) {
    if (left.is(Kind::kString) && right.is(Kind::kString)) {
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(left.str().size() + right.str().size()));
      return Value::string(left.str() + right.str());
    }
    if (left.is(Kind::kArray) && right.is(Kind::kArray) && left.tuple == right.tuple) {
      MAGNETAR_RETURN_IF_ERROR(charge_bytes((left.arr().size() + right.arr().size()) * sizeof(Value)));
      Array items = left.arr();
      items.insert(items.end(), right.arr().begin(), right.arr().end());
      return Value::array(std::move(items), left.tuple);
    }
  }
  if (!number_like(left) || !number_like(right)) return unsupported();
  const bool ints = exact_int(left) && exact_int(right);
  const double a = left.as_double(), b = right.as_double();
  switch (e.op) {
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul: {
      if (ints) {
        int64_t r = 0;
        const int64_t x = as_int(left), y = as_int(right);
        const bool overflow = e.op == Op::kAdd   ? __builtin_add_overflow(x, y, &r)
                              : e.op == Op::kSub ? __builtin_sub_overflow(x, y, &r)
                                                 : __builtin_mul_overflow(x, y, &r);
        if (!overflow) return Value::integer(r);
      }
      return Value::number(e.op == Op::kAdd ? a + b : e.op == Op::kSub ? a - b : a * b);
    }
    case Op::kDiv:
      if (b == 0) return Status::error("division by zero");
      return Value::number(a / b);
    case Op::kFloorDiv:
    case Op::kMod:
      if (b == 0) return Status::error("integer division or modulo by zero");
      if (ints) {
        const int64_t x = as_int(left), y = as_int(right);
        if (y == -1) return e.op == Op::kMod ? Value::integer(0) : py_negate(x);  // INT64_MIN / -1 traps
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y, --q;  // Python floors: the remainder takes the divisor's sign
        return Value::integer(e.op == Op::kMod ? r : q);
      }
      return Value::number(e.op == Op::kMod ? py_fmod(a, b) : std::floor(a / b));
    case Op::kPow: {
      if (a == 0 && b < 0) return Status::error("0.0 cannot be raised to a negative power");
      const double r = std::pow(a, b);
      if (!std::isfinite(r)) return Status::error("exponentiation result is not a finite real number");
      if (!ints || b < 0 || std::fabs(r) >= 9.2e18) return Value::number(r);
      return Value::integer(int64_t(r));
    }
    default: return unsupported();
  }
}

// Python's printf-style `str % args` for the forms templates use: %s %r %d %i %x %o %f %e %g %% with flags,
// width and precision (%05.2f, %-4s); `args` is a tuple of values or a single value.
Result<Value> Interp::percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> values;
  if (args.is(Kind::kArray) && args.tuple) {
    values = args.arr();
  } else {
    values.push_back(args);
  }
  // The literal text is at most fmt's length; each conversion is charged before it is appended, so that
  // many long arguments stop at the byte budget instead of building the whole output first.
  MAGNETAR_RETURN_IF_ERROR(charge_bytes(fmt.size()));
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    std::string flags, width, precision;
    while (j < fmt.size() && fmt[j] != 0 && std::strchr("-+ #0", fmt[j])) flags += fmt[j++];
    while (j < fmt.size() && std::isdigit(uint8_t(fmt[j]))) width += fmt[j++];
    if (j < fmt.size() && fmt[j] == '.') {
      precision.push_back('.');
      ++j;
      while (j < fmt.size() && std::isdigit(uint8_t(fmt[j]))) precision += fmt[j++];
    }
    if (j >= fmt.size()) return Status::error("incomplete format");
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) return Status::error("not enough arguments for format string");
    const Value& v = values[next++];
    if (width.size() > 3 || precision.size() > 3) return Status::error("format width or precision too large");
    char buf[2400];  // %f of 1e308 with a precision of 999
    const std::string spec = "%" + flags + width + precision;
    if (conv == 's' || conv == 'r') {
      std::string text;
      MAGNETAR_RETURN_IF_ERROR(conv == 's' ? py_str(v, &text) : py_repr(v, &text));
      const size_t w = width.empty() ? 0 : size_t(std::atoi(width.c_str()));
      const size_t len = w == 0 ? 0 : cp_count(text);
      const std::string pad(w > len ? w - len : 0, ' ');
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(text.size() + pad.size()));  // before it grows the output
      if (flags.find('-') == std::string::npos) out += pad;
      out += text;
      if (flags.find('-') != std::string::npos) out += pad;
    } else if (conv != 0 && std::strchr("dixXo", conv)) {
      if (!number_like(v)) {
        return Status::error(std::string("%") + conv + " format: a real number is required, not " + py_type(v));
      }
      TRY(const std::string text, format_integer(v, conv, flags, width, precision));
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(text.size()));
      out += text;
    } else if (conv != 0 && std::strchr("feEgG", conv)) {
      if (!number_like(v)) return Status::error(std::string("must be real number, not ") + py_type(v));
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.as_double());
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(std::strlen(buf)));
      out += buf;
    } else {
      return Status::error(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < values.size()) return Status::error("not all arguments converted during string formatting");
  return Value::string(std::move(out));  // charged piece by piece above
}

// ---------------------------------------------------------------------------------------------------------
// Tests (`x is name`, `x is name arg`, `x is name(arg)`), also used by select/reject and their attr forms
// ---------------------------------------------------------------------------------------------------------

Result<bool> test_value(Interp& in, const std::string& name, const Value& v, const Value* arg) {
  const Kind k = v.kind;
  const auto need_arg = [&]() { return Status::error("test '" + name + "' needs an argument"); };
  if (name == "defined") return k != Kind::kUndefined;
  if (name == "undefined") return k == Kind::kUndefined;
  if (name == "none") return k == Kind::kNull;
  if (name == "boolean") return k == Kind::kBool;
  if (name == "true") return k == Kind::kBool && v.b;
  if (name == "false") return k == Kind::kBool && !v.b;
  if (name == "string") return k == Kind::kString;
  if (name == "number") return k == Kind::kInt || k == Kind::kFloat || k == Kind::kBool;  // bool is an int
  if (name == "integer") return k == Kind::kInt;
  if (name == "float") return k == Kind::kFloat;
  if (name == "callable") return k == Kind::kFunction;
  if (name == "iterable") {
    return k == Kind::kArray || k == Kind::kString || k == Kind::kObject || k == Kind::kUndefined;
  }
  if (name == "mapping") return k == Kind::kObject;
  if (name == "sequence") return k == Kind::kArray || k == Kind::kObject || k == Kind::kString;
  if (name == "escaped") return false;
  if (name == "filter") return arg && arg->is(Kind::kString) && is_filter_name(arg->str());
  if (name == "test") return arg && arg->is(Kind::kString) && is_test_name(arg->str());
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value divisor = Value::integer(2);
    if (name == "divisibleby") {
      if (!arg) return need_arg();
      divisor = *arg;
    }
    if (!(v.is_numeric() || v.is(Kind::kBool)) || !(divisor.is_numeric() || divisor.is(Kind::kBool))) {
      return Status::error(std::string("unsupported operand type(s) for %: '") + py_type(v) + "' and '" +
                           py_type(divisor) + "'");
    }
    if (divisor.as_double() == 0) return Status::error("integer division or modulo by zero");
    double r = std::fmod(v.as_double(), divisor.as_double());
    if (v.is(Kind::kInt) && !v.big && divisor.is(Kind::kInt) && !divisor.big) {
      r = divisor.i == -1 ? 0 : double(v.i % divisor.i);  // INT64_MIN % -1 traps (SIGFPE)
    }
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    std::string s;
    MAGNETAR_RETURN_IF_ERROR(py_str(v, &s));
    const std::string lo = py_lower(s), up = py_upper(s);
    if (lo == up) return false;  // no cased character
    return s == (name == "lower" ? lo : up);
  }
  if (name == "sameas") {
    if (!arg) return need_arg();
    if (v.kind != arg->kind) return false;
    switch (k) {
      case Kind::kUndefined:
      case Kind::kNull: return true;
      case Kind::kBool: return v.b == arg->b;
      case Kind::kInt: return v.i == arg->i && v.i >= -5 && v.i <= 256;  // CPython's cached small ints
      case Kind::kArray: return v.a == arg->a;
      case Kind::kObject:
      case Kind::kNamespace: return v.o == arg->o;
      case Kind::kFunction: return v.fn == arg->fn;
      default: return false;
    }
  }
  if (name == "in") {
    if (!arg) return need_arg();
    return py_contains(in, *arg, v);
  }
  if (name == "eq" || name == "equalto" || name == "==" || name == "ne" || name == "!=") {
    if (!arg) return need_arg();
    TRY(const bool same, py_equal(in, v, *arg));
    return same == (name != "ne" && name != "!=");
  }
  struct Order {
    const char* names[3];
    const char* op;
  };
  static constexpr Order kOrders[] = {{{"lt", "lessthan", "<"}, "<"},
                                      {{"le", "<=", "le"}, "<="},
                                      {{"gt", "greaterthan", ">"}, ">"},
                                      {{"ge", ">=", "ge"}, ">="}};
  for (const Order& o : kOrders) {
    if (name != o.names[0] && name != o.names[1] && name != o.names[2]) continue;
    if (!arg) return need_arg();
    TRY(const int c, py_compare(in, v, *arg, o.op));
    const std::string op = o.op;
    return op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
  }
  return Status::error("unknown test '" + name + "'");
}

bool is_test_name(const std::string& name) {
  static constexpr const char* kTests[] = {
      "defined", "undefined", "none",     "boolean",     "true",    "false",    "string",   "number",
      "integer", "float",     "callable", "iterable",    "mapping", "sequence", "escaped",  "filter",
      "test",    "odd",       "even",     "divisibleby", "lower",   "upper",    "sameas",   "in",
      "eq",      "equalto",   "==",       "ne",          "!=",      "lt",       "lessthan", "<",
      "le",      "<=",        "gt",       "greaterthan", ">",       "ge",       ">="};
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

}  // namespace magnetar::chat::jinja
