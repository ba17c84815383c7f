// An incremental JSON validator: fed bytes one at a time, it says whether the bytes so far are a prefix of some
// valid JSON text (strict RFC 8259) and whether they already are a complete one. Sampling constraints use it as
// a token filter (chat/output_constraint.h): a candidate token is allowed when the output stays a valid prefix.
//
// Strictness, beyond the RFC grammar (what nlohmann::json and I-JSON, RFC 7493, also require):
//   - strings must be well-formed UTF-8 (no overlong forms, no UTF-16 surrogates, nothing past U+10FFFF), and a
//     byte is rejected as soon as no valid sequence can start or continue with it;
//   - \u escapes must pair surrogates: a high one must be followed by a \u low one, a low one alone is invalid;
//   - nesting deeper than `max_depth` arrays/objects is rejected at the opening bracket;
//   - with Options::finite_numbers, numbers too long to be finite as a double.
// Errors are detected at the first byte that no valid JSON text can have at that place ("rejected early").
//
// The state is a few integers (the nesting stack is a 64-bit word), so a JsonPrefix is trivially copyable: a
// token filter copies it, feeds the candidate's bytes and throws the copy away.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace magnetar::chat {

class JsonPrefix {
 public:
  static constexpr int kMaxDepthLimit = 64;         // the nesting stack is one bit per level in a uint64_t
  enum class Top : uint8_t { kAnyValue, kObject };  // what the whole text must be

  struct Options {
    Top top = Top::kAnyValue;
    int max_depth = 32;  // 1 .. kMaxDepthLimit; an object or array at depth max_depth + 1 is rejected
    // Numbers of at most kMaxIntegerDigits integer digits and kMaxExponentDigits exponent digits (below 1e120:
    // finite as a double, which nlohmann::json requires; RFC 8259 leaves the range open, 1e999 is refused).
    bool finite_numbers = false;
  };
  static constexpr int kMaxIntegerDigits = 20;  // UINT64_MAX has 20
  static constexpr int kMaxExponentDigits = 2;
  JsonPrefix() : JsonPrefix(Options{}) {}
  explicit JsonPrefix(const Options& options);

  // Feeds one byte; false (and the validator stays failed) when the text can no longer become valid JSON.
  bool feed(uint8_t c);
  // Feeds bytes until one fails; false when one did.
  bool feed(std::string_view bytes);
  bool failed() const { return state_ == State::kFailed; }
  // The bytes so far are a complete JSON text (trailing whitespace allowed). A top-level number is complete
  // while more digits could still follow.
  bool complete() const;
  // Complete, and no byte but whitespace can follow: a top-level object, array, string or literal has closed.
  bool closed() const { return state_ == State::kAfterValue && depth_ == 0 && !failed(); }
  // Inside a string (key or value): whitespace there is content, not layout.
  bool in_string() const;
  // A short byte string that completes the text (makes it closed(), or complete() for a top-level number):
  // the open literal, number, escape or string finished, a pending key given `:0`, open containers closed.
  // Empty when failed or already complete. Used to end a constrained output within its token budget.
  std::string closing() const;
  int depth() const { return depth_; }

 private:
  enum class State : uint8_t {
    kValue,         // a value must start here (top level, after ':', after ',' in an array)
    kValueOrClose,  // after '[': a value or ']'
    kKeyOrClose,    // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kAfterValue,    // after a value: ',' or the closing bracket (top level: only whitespace)
    kString,        // inside a string
    kEscape,        // after '\' in a string
    kUnicode,       // inside \uXXXX (hex_left_ digits to go)
    kLowBackslash,  // after a high surrogate escape: '\' must follow
    kLowU,          // then 'u'
    kUtf8,          // inside a multi-byte UTF-8 sequence (utf8_left_ bytes to go)
    kLiteral,       // inside true/false/null
    kMinus,         // after '-': a digit
    kZero,          // integer part "0": '.', 'e' or the end
    kInt,           // integer digits
    kDot,           // after '.': a digit
    kFrac,          // fraction digits
    kExp,           // after 'e': sign or digit
    kExpSign,       // after the exponent's sign: a digit
    kExpDigits,     // exponent digits
    kFailed,
  };
  bool fail() {
    state_ = State::kFailed;
    return false;
  }
  bool start_value(uint8_t c);
  bool after_value(uint8_t c);
  bool open(bool object);
  void end_value() { state_ = State::kAfterValue; }

  Options options_;
  State state_ = State::kValue;
  uint64_t stack_ = 0;      // bit d-1 set: the container at depth d is an object
  int depth_ = 0;           // open containers
  bool key_ = false;        // the string being read is an object key
  uint8_t hex_left_ = 0;    // kUnicode: hex digits still to read
  uint16_t code_ = 0;       // kUnicode: the code unit so far
  bool want_low_ = false;   // kUnicode: this escape must be a low surrogate
  uint8_t utf8_left_ = 0;   // kUtf8: continuation bytes still to read
  uint8_t utf8_lo_ = 0x80;  // kUtf8: range of the next continuation byte (narrowed after E0, ED, F0, F4)
  uint8_t utf8_hi_ = 0xBF;
  uint8_t literal_ = 0;      // kLiteral: which of true/false/null
  uint8_t literal_pos_ = 0;  // kLiteral: bytes matched
  uint8_t digits_ = 0;       // kInt / kExpDigits: digits of the integer part / exponent so far
};

}  // namespace magnetar::chat
