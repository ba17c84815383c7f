#include "chat/json_prefix.h"

#include <algorithm>

namespace magnetar::chat {
namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
constexpr std::string_view kLiterals[] = {"true", "false", "null"};

}  // namespace

JsonPrefix::JsonPrefix(const Options& options) : options_(options) {
  options_.max_depth = std::clamp(options_.max_depth, 1, kMaxDepthLimit);
}

bool JsonPrefix::complete() const {
  if (failed() || depth_ != 0) return false;
  switch (state_) {
    case State::kAfterValue:
    case State::kZero:
    case State::kInt:
    case State::kFrac:
    case State::kExpDigits: return true;
    default: return false;
  }
}

std::string JsonPrefix::closing() const {
  if (failed() || complete()) return {};
  std::string out;
  // Finish the token in progress; `value` says whether a value must still follow (after a key or in a value slot).
  bool value = false;
  switch (state_) {
    case State::kValue: value = true; break;
    case State::kValueOrClose:
    case State::kKeyOrClose:
    case State::kAfterValue: break;
    case State::kKey:
      out += "\"\":";
      value = true;
      break;
    case State::kColon:
      out += ":";
      value = true;
      break;
    case State::kEscape: out += "n"; break;
    case State::kUnicode:
      if (want_low_ && hex_left_ >= 3) {
        out += hex_left_ == 4 ? "DC00" : "C00";
      } else {
        out.append(hex_left_, '0');
        const uint32_t code = uint32_t(code_) << (4 * hex_left_);
        if (!want_low_ && code >= 0xD800 && code <= 0xDBFF) out += "\\uDC00";  // a high surrogate needs its low half
      }
      break;
    case State::kLowBackslash: out += "\\uDC00"; break;
    case State::kLowU: out += "uDC00"; break;
    case State::kUtf8:
      out += char(utf8_lo_);
      out.append(size_t(utf8_left_ - 1), char(0x80));
      break;
    case State::kLiteral: out += kLiterals[literal_].substr(literal_pos_); break;
    case State::kMinus:
    case State::kDot:
    case State::kExp:
    case State::kExpSign: out += "0"; break;
    default: break;  // complete numbers
  }
  if (in_string()) out += key_ ? "\":0" : "\"";
  if (value) out += depth_ == 0 && options_.top == Top::kObject ? "{}" : "0";
  for (int d = depth_; d > 0; --d) out += ((stack_ >> (d - 1)) & 1) ? '}' : ']';
  return out;
}

bool JsonPrefix::in_string() const {
  switch (state_) {
    case State::kString:
    case State::kEscape:
    case State::kUnicode:
    case State::kLowBackslash:
    case State::kLowU:
    case State::kUtf8: return true;
    default: return false;
  }
}

bool JsonPrefix::open(bool object) {
  if (depth_ >= options_.max_depth) return fail();
  if (object) {
    stack_ |= uint64_t(1) << depth_;
  } else {
    stack_ &= ~(uint64_t(1) << depth_);
  }
  ++depth_;
  state_ = object ? State::kKeyOrClose : State::kValueOrClose;
  return true;
}

// The first byte of a value (whitespace already skipped by the caller's state).
bool JsonPrefix::start_value(uint8_t c) {
  if (depth_ == 0 && options_.top == Top::kObject && c != '{') return fail();
  switch (c) {
    case '{': return open(true);
    case '[': return open(false);
    case '"':
      key_ = false;
      state_ = State::kString;
      return true;
    case '-': state_ = State::kMinus; return true;
    case '0': state_ = State::kZero; return true;
    case 't': literal_ = 0; break;
    case 'f': literal_ = 1; break;
    case 'n': literal_ = 2; break;
    default:
      if (c >= '1' && c <= '9') {
        state_ = State::kInt;
        digits_ = 1;
        return true;
      }
      return fail();
  }
  literal_pos_ = 1;
  state_ = State::kLiteral;
  return true;
}

// A byte after a complete value: whitespace, ',' or the container's closing bracket.
bool JsonPrefix::after_value(uint8_t c) {
  state_ = State::kAfterValue;
  if (is_ws(c)) return true;
  if (depth_ == 0) return fail();
  const bool object = (stack_ >> (depth_ - 1)) & 1;
  if (c == ',') {
    state_ = object ? State::kKey : State::kValue;
    return true;
  }
  if (c == (object ? '}' : ']')) {
    --depth_;
    return true;
  }
  return fail();
}

bool JsonPrefix::feed(uint8_t c) {
  switch (state_) {
    case State::kFailed: return false;
    case State::kValue: return is_ws(c) || start_value(c);
    case State::kValueOrClose:
      if (is_ws(c)) return true;
      if (c == ']') {
        --depth_;
        end_value();
        return true;
      }
      return start_value(c);
    case State::kKeyOrClose:
    case State::kKey:
      if (is_ws(c)) return true;
      if (c == '}' && state_ == State::kKeyOrClose) {
        --depth_;
        end_value();
        return true;
      }
      if (c != '"') return fail();
      key_ = true;
      state_ = State::kString;
      return true;
    case State::kColon:
      if (is_ws(c)) return true;
      if (c != ':') return fail();
      state_ = State::kValue;
      return true;
    case State::kAfterValue: return after_value(c);

    case State::kString:
      if (c == '"') {
        if (key_) {
          state_ = State::kColon;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        state_ = State::kEscape;
        return true;
      }
      if (c < 0x20) return fail();
      if (c < 0x80) return true;
      // UTF-8 lead bytes (RFC 3629 table): the first continuation byte's range excludes overlong forms,
      // surrogates (ED A0..BF) and code points past U+10FFFF.
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) utf8_lo_ = 0xA0;
        if (c == 0xED) utf8_hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) utf8_lo_ = 0x90;
        if (c == 0xF4) utf8_hi_ = 0x8F;
      } else {
        return fail();
      }
      state_ = State::kUtf8;
      return true;
    case State::kUtf8:
      if (c < utf8_lo_ || c > utf8_hi_) return fail();
      utf8_lo_ = 0x80;
      utf8_hi_ = 0xBF;
      if (--utf8_left_ == 0) state_ = State::kString;
      return true;
    case State::kEscape:
      switch (c) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't': state_ = State::kString; return true;
        case 'u':
          state_ = State::kUnicode;
          hex_left_ = 4;
          code_ = 0;
          want_low_ = false;
          return true;
        default: return fail();
      }
    case State::kUnicode: {
      const int h = hex_value(c);
      if (h < 0) return fail();
      code_ = uint16_t(code_ << 4 | h);
      --hex_left_;
      if (want_low_ && hex_left_ == 3 && h != 0xD) return fail();  // a low surrogate starts with D
      // Decide on surrogates as early as the first two hex digits allow: D8..DB high, DC..DF low.
      if (hex_left_ == 2) {
        const bool low = code_ >= 0xDC && code_ <= 0xDF;
        if (want_low_ ? !low : low) return fail();
      }
      if (hex_left_ > 0) return true;
      if (!want_low_ && code_ >= 0xD800 && code_ <= 0xDBFF) {
        state_ = State::kLowBackslash;
      } else {
        state_ = State::kString;
      }
      return true;
    }
    case State::kLowBackslash:
      if (c != '\\') return fail();
      state_ = State::kLowU;
      return true;
    case State::kLowU:
      if (c != 'u') return fail();
      state_ = State::kUnicode;
      hex_left_ = 4;
      code_ = 0;
      want_low_ = true;
      return true;

    case State::kLiteral: {
      const std::string_view word = kLiterals[literal_];
      if (c != uint8_t(word[literal_pos_])) return fail();
      if (size_t(++literal_pos_) == word.size()) end_value();
      return true;
    }
    case State::kMinus:
      if (c == '0') {
        state_ = State::kZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        state_ = State::kInt;
        digits_ = 1;
        return true;
      }
      return fail();
    case State::kZero:
    case State::kInt:
      if (state_ == State::kInt && is_digit(c)) {
        return !options_.finite_numbers || ++digits_ <= kMaxIntegerDigits ? true : fail();
      }
      if (c == '.') {
        state_ = State::kDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kExp;
        return true;
      }
      return after_value(c);
    case State::kDot:
      if (!is_digit(c)) return fail();
      state_ = State::kFrac;
      return true;
    case State::kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        state_ = State::kExp;
        return true;
      }
      return after_value(c);
    case State::kExp:
      if (c == '+' || c == '-') {
        state_ = State::kExpSign;
        return true;
      }
      [[fallthrough]];
    case State::kExpSign:
      if (!is_digit(c)) return fail();
      state_ = State::kExpDigits;
      digits_ = 1;
      return true;
    case State::kExpDigits:
      if (is_digit(c)) return !options_.finite_numbers || ++digits_ <= kMaxExponentDigits ? true : fail();
      return after_value(c);
  }
  return fail();
}

bool JsonPrefix::feed(std::string_view bytes) {
  for (const char ch : bytes) {
    if (!feed(uint8_t(ch))) return false;
  }
  return !failed();
}

}  // namespace magnetar::chat
