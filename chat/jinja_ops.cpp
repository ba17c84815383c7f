// Operators and tests, with the reference's semantics: `==` is JavaScript's loose equality on the values,
// arithmetic keeps integers integral (`/` always gives a float), `~` and string `+` convert the way JS
// does, `in` works on strings, lists (strict equality) and dict keys, and none/undefined operands are
// errors except in `==`, `!=` and `x in undefined`.
#include <cmath>
#include <limits>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace magnetar::chat::jinja {

#define TRY(lhs, expr) MAGNETAR_ASSIGN_OR_RETURN(lhs, expr)

namespace {

bool nullish(const Value& v) { return v.is(Kind::kNull) || v.is(Kind::kUndefined); }
bool is_container(const Value& v) {
  return v.is(Kind::kArray) || v.is(Kind::kObject) || v.is(Kind::kNamespace) || v.is(Kind::kFunction);
}

// ToNumber(string) of JavaScript: surrounding whitespace ignored, "" is 0, anything not a whole decimal
// literal is NaN.
double js_to_number(std::string_view s) {
  s = js_trim(s);
  if (s.empty()) return 0;
  std::string_view body = s;
  bool neg = false;
  if (body[0] == '+' || body[0] == '-') neg = body[0] == '-', body.remove_prefix(1);
  if (body == "Infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  size_t i = 0, digits = 0;
  while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return NAN;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < body.size() && body[i] >= '0' && body[i] <= '9') ++i, ++exp_digits;
    if (exp_digits == 0) return NAN;
  }
  if (i != body.size()) return NAN;
  double v = 0;
  js_parse_float(s, &v);
  return v;
}

const void* identity(const Value& v) {
  if (v.is(Kind::kArray)) return v.a.get();
  if (v.is(Kind::kObject) || v.is(Kind::kNamespace)) return v.o.get();
  return v.fn.get();
}

bool number_equal(const Value& a, const Value& b) {
  if (a.is(Kind::kInt) && b.is(Kind::kInt)) return a.i == b.i;
  return a.as_double() == b.as_double();
}

}  // namespace

bool loose_equal(const Value& a, const Value& b, int level) {
  if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
  if (level > 4) return false;
  if (is_container(a) && is_container(b)) return a.kind == b.kind && identity(a) == identity(b);
  if (a.is(Kind::kBool)) return loose_equal(Value::integer(a.b ? 1 : 0), b, level + 1);
  if (b.is(Kind::kBool)) return loose_equal(a, Value::integer(b.b ? 1 : 0), level + 1);
  if (a.is_numeric() && b.is_numeric()) return number_equal(a, b);
  if (a.is(Kind::kString) && b.is(Kind::kString)) return a.str() == b.str();
  if (a.is_numeric() && b.is(Kind::kString)) return a.as_double() == js_to_number(b.str());
  if (a.is(Kind::kString) && b.is_numeric()) return js_to_number(a.str()) == b.as_double();
  // A list or dict against a primitive compares its string form (ToPrimitive).
  const Value& c = is_container(a) ? a : b;
  const Value& p = is_container(a) ? b : a;
  if (c.is(Kind::kFunction)) return false;
  std::string text;
  if (!js_string(c, &text).ok()) return false;
  return loose_equal(Value::string(std::move(text)), p, level + 1);
}

bool strict_equal(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) return number_equal(a, b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNull: return true;
    case Kind::kBool: return a.b == b.b;
    case Kind::kString: return a.str() == b.str();
    default: return identity(a) == identity(b);
  }
}

Result<Value> Interp::eval_binary(const Expr& e, Scope* s) {
  TRY(const Value left, eval(*e.a, s));
  if (e.op == Op::kAnd) return truthy(left) ? eval(*e.b, s) : left;
  if (e.op == Op::kOr) return truthy(left) ? left : eval(*e.b, s);
  TRY(const Value right, eval(*e.b, s));
  if (e.op == Op::kEq) return Value::boolean(loose_equal(left, right));
  if (e.op == Op::kNe) return Value::boolean(!loose_equal(left, right));
  const bool in_op = e.op == Op::kIn || e.op == Op::kNotIn;
  if (left.is(Kind::kUndefined) || right.is(Kind::kUndefined)) {
    if (right.is(Kind::kUndefined) && in_op) return Value::boolean(e.op == Op::kNotIn);
    return Status::error("an operand is undefined");
  }
  if (left.is(Kind::kNull) || right.is(Kind::kNull)) return Status::error("an operand is none");

  if (e.op == Op::kConcat) {
    std::string text;
    MAGNETAR_RETURN_IF_ERROR(js_string(left, &text));
    MAGNETAR_RETURN_IF_ERROR(js_string(right, &text));
    return make_string(std::move(text));
  }
  const bool num_like_l = left.is_numeric() || left.is(Kind::kBool),
             num_like_r = right.is_numeric() || right.is(Kind::kBool);
  if (e.op == Op::kPow && num_like_l && num_like_r) {
    const double a = left.as_double(), b = right.as_double();
    if (a == 0 && b < 0) return Status::error("0.0 cannot be raised to a negative power");
    const double r = std::pow(a, b);
    if (!std::isfinite(r)) return Status::error("exponentiation result is not a finite real number");
    if (left.is(Kind::kFloat) || right.is(Kind::kFloat) || b < 0 || std::fabs(r) >= 9.2e18) return Value::number(r);
    return Value::integer(int64_t(r));
  }
  if (left.is_numeric() && right.is_numeric()) {
    const bool ints = left.is(Kind::kInt) && right.is(Kind::kInt);
    const double a = left.as_double(), b = right.as_double();
    switch (e.op) {
      case Op::kAdd:
      case Op::kSub:
      case Op::kMul: {
        if (ints) {
          int64_t r = 0;
          const bool overflow = e.op == Op::kAdd   ? __builtin_add_overflow(left.i, right.i, &r)
                                : e.op == Op::kSub ? __builtin_sub_overflow(left.i, right.i, &r)
                                                   : __builtin_mul_overflow(left.i, right.i, &r);
          if (!overflow) return Value::integer(r);
        }
        return Value::number(e.op == Op::kAdd ? a + b : e.op == Op::kSub ? a - b : a * b);
      }
      case Op::kDiv: return Value::number(a / b);
      case Op::kFloorDiv:
        if (ints) {
          if (right.i == 0) return Status::error("integer division by zero");
          return Value::integer(int64_t(std::floor(a / b)));
        }
        return Value::number(std::floor(a / b));
      case Op::kMod:
        if (ints) {
          if (right.i == 0) return Status::error("integer modulo by zero");
          if (right.i == -1) return Value::integer(0);
          return Value::integer(left.i % right.i);  // sign of the dividend, as JavaScript's %
        }
        return Value::number(std::fmod(a, b));
      case Op::kLt: return Value::boolean(a < b);
      case Op::kGt: return Value::boolean(a > b);
      case Op::kLe: return Value::boolean(a <= b);
      case Op::kGe: return Value::boolean(a >= b);
      default: break;
    }
  } else if (left.is(Kind::kArray) && right.is(Kind::kArray)) {
    if (e.op == Op::kAdd) {
      Array items = left.arr();
      items.insert(items.end(), right.arr().begin(), right.arr().end());
      return make_array(std::move(items));
    }
  } else if (right.is(Kind::kArray) && in_op) {
    bool found = false;
    for (const Value& x : right.arr()) found = found || strict_equal(x, left);
    return Value::boolean(found == (e.op == Op::kIn));
  }
  if (e.op == Op::kAdd && (left.is(Kind::kString) || right.is(Kind::kString))) {
    std::string text;
    MAGNETAR_RETURN_IF_ERROR(js_string(left, &text));
    MAGNETAR_RETURN_IF_ERROR(js_string(right, &text));
    return make_string(std::move(text));
  }
  if (left.is(Kind::kString) && right.is(Kind::kString)) {
    if (in_op) return Value::boolean((right.str().find(left.str()) != std::string::npos) == (e.op == Op::kIn));
    // Not in the reference (it refuses); Python compares strings by code point.
    const int c = js_compare(left.str(), right.str());
    switch (e.op) {
      case Op::kLt: return Value::boolean(c < 0);
      case Op::kGt: return Value::boolean(c > 0);
      case Op::kLe: return Value::boolean(c <= 0);
      case Op::kGe: return Value::boolean(c >= 0);
      default: break;
    }
  }
  if (left.is(Kind::kString) && right.is(Kind::kObject) && in_op) {
    return Value::boolean((right.obj().find(left.str()) != nullptr) == (e.op == Op::kIn));
  }
  static constexpr const char* kNames[] = {"",       "and", "or", "not", "==", "!=", "<",  ">", "<=", ">=", "in",
                                           "not in", "+",   "-",  "~",   "*",  "/",  "//", "%", "**", "-",  "+"};
  return Status::error(std::string("operator '") + kNames[int(e.op)] + "' is not defined between a " + kind_name(left) +
                       " and a " + kind_name(right));
}

// ---------------------------------------------------------------------------------------------------------
// Tests (`x is name`), also used by selectattr/rejectattr and select/reject
// ---------------------------------------------------------------------------------------------------------

Result<bool> test_value(const std::string& name, const Value& v, const Value* arg) {
  const Kind k = v.kind;
  if (name == "defined") return k != Kind::kUndefined;
  if (name == "undefined") return k == Kind::kUndefined;
  if (name == "none") return k == Kind::kNull;
  if (name == "boolean") return k == Kind::kBool;
  if (name == "true") return k == Kind::kBool && v.b;
  if (name == "false") return k == Kind::kBool && !v.b;
  if (name == "string") return k == Kind::kString;
  if (name == "number") return k == Kind::kInt || k == Kind::kFloat;
  if (name == "integer") return k == Kind::kInt;
  if (name == "float") return k == Kind::kFloat;  // not in the reference
  if (name == "callable") return k == Kind::kFunction;
  // The reference's `iterable` is true for lists and strings only (not tuples, not dicts).
  if (name == "iterable") return (k == Kind::kArray && !v.tuple) || k == Kind::kString;
  if (name == "mapping") return k == Kind::kObject;
  if (name == "sequence") return k == Kind::kArray || k == Kind::kObject || k == Kind::kString;
  if (name == "odd" || name == "even") {
    if (k != Kind::kInt) return Status::error("test '" + name + "' needs an integer, got a " + kind_name(v));
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (k != Kind::kString) return Status::error("test '" + name + "' needs a string, got a " + kind_name(v));
    return v.str() == (name == "lower" ? js_lower(v.str()) : js_upper(v.str()));
  }
  if (name == "equalto" || name == "eq" || name == "sameas") return arg ? strict_equal(v, *arg) : false;
  if (name == "ne") return arg ? !strict_equal(v, *arg) : true;
  return Status::error("unknown test '" + name + "'");
}

}  // namespace magnetar::chat::jinja
