// UTF-8 decoding with the "maximal subpart" error rule, encoding, validation and lossy repair.
//
// Text reaching the engine is bytes: usually UTF-8, but a prompt file or a client may hand us anything, so
// nothing here assumes validity. Shared by tokenizer/ (which adds NFC normalization on top) and chat/ (the
// Jinja engine's JavaScript string semantics), which may not depend on each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace magnetar {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

enum class Utf8Kind {
  kChar,        // a complete, valid sequence of `length` bytes encoding `cp`
  kIncomplete,  // the input ends inside a valid prefix of `length` bytes; more bytes may complete it
  kInvalid,     // a maximal invalid subpart of `length` (>= 1) bytes: it can never become valid
};

struct Utf8Step {
  Utf8Kind kind;
  uint32_t cp;  // valid for kChar only
  int length;
};

// Decodes the sequence starting at s[pos] (pos < s.size()). The lengths follow Unicode's "maximal subpart"
// practice (the one WHATWG and Rust's from_utf8_lossy use), so one U+FFFD replaces each kInvalid step.
// kChar is returned exactly for well-formed sequences (no overlongs, surrogates or code points > U+10FFFF).
Utf8Step decode_utf8(std::string_view s, size_t pos);

// Appends the UTF-8 encoding of `cp` (<= U+10FFFF; a surrogate is encoded as its three bytes, unchecked).
void append_utf8(uint32_t cp, std::string* out);
bool is_valid_utf8(std::string_view s);
// `s` with each maximal invalid subpart (including a truncated sequence at the end) replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

}  // namespace magnetar
