// UTF-8 decoding with the "maximal subpart" error rule, lossy repair, and NFC normalization.
//
// Text reaching the tokenizer is bytes: usually UTF-8, but a prompt file or a client may hand us anything,
// so nothing here assumes validity. Invalid bytes are carried through NFC untouched (they act as starters
// that never compose) and are replaced by U+FFFD only where text must be valid (decode, streaming).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace magnetar::tokenizer {

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
Utf8Step decode_utf8(std::string_view s, size_t pos);

void append_utf8(uint32_t cp, std::string* out);
bool is_valid_utf8(std::string_view s);
// `s` with each maximal invalid subpart (including a truncated sequence at the end) replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

// True when `s` is certainly in NFC already (the quick check: no code point with a nonzero combining class
// or NFC_QC other than Yes). Cheap: ASCII and Latin-1 text is scanned byte by byte without table lookups.
bool is_nfc_quick(std::string_view s);
// Canonical decomposition, canonical ordering and canonical composition (UAX #15) of `s`. Invalid bytes are
// kept as they are and block composition across them.
std::string to_nfc(std::string_view s);

}  // namespace magnetar::tokenizer
