// Internal to chat/: text helpers over UTF-8 strings: whitespace, lengths and indices, number-to-string conversion,
// case mapping (the engine's Python semantics are in the callers; the parity test checks them against Python
// jinja2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/utf8.h"

namespace magnetar::chat::jinja {

// Decodes the code point at s[*i] and advances *i; an invalid or truncated sequence reads as U+FFFD and
// advances one byte (so each such byte is one U+FFFD, not each maximal subpart as in base/utf8.h). Encoding
// is base/utf8.h's append_utf8. ASCII is decoded inline: templates walk long strings a code point at a time.
uint32_t decode_utf8_multibyte(std::string_view s, size_t* i);
inline uint32_t decode_utf8(std::string_view s, size_t* i) {
  const uint8_t b = uint8_t(s[*i]);
  if (b < 0x80) {
    ++*i;
    return b;
  }
  return decode_utf8_multibyte(s, i);
}

// Bytes of the JS whitespace or line terminator at s[i] (what /\s/ and String.prototype.trim match), or 0.
size_t js_space_len(std::string_view s, size_t i);
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);
inline std::string_view js_trim(std::string_view s) { return js_trim_end(js_trim_start(s)); }

// Length in UTF-16 code units (JS `.length`).
size_t utf16_length(std::string_view s);
std::u16string to_utf16(std::string_view s);
// Lone surrogates become U+FFFD (what writing such a JS string as UTF-8 gives).
std::string from_utf16(std::u16string_view s);
// JS `<` on strings: UTF-16 code unit order. Returns <0, 0, >0.
int js_compare(std::string_view a, std::string_view b);

// Number.prototype.toString(): 1 -> "1", 1.5 -> "1.5", 1e21 -> "1e+21", 1e-7 -> "1e-7", NaN, Infinity.
std::string js_number(double d);

// String.prototype.toUpperCase / toLowerCase for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
// (other scripts pass through unchanged).
std::string js_upper(std::string_view s);
std::string js_lower(std::string_view s);

// --- Python str semantics (what the templates' jinja2 computes with) ---

// Code points (an invalid byte counts as one, as decode_utf8 reads it).
size_t cp_count(std::string_view s);
// Byte offset of code point `index` (0 <= index), or npos past the end; scans from the start.
size_t cp_offset(std::string_view s, size_t index);
// str.isspace() of one code point.
bool py_is_space(uint32_t cp);
// str.strip / lstrip / rstrip: `chars` null strips whitespace, else any of its code points.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
// str.upper / str.lower (js_upper/js_lower's tables plus the Latin digraphs: 'ǅ'.lower() == 'ǆ').
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.title(): a cased character after an uncased one is upper-cased, every other one lower-cased.
std::string py_title(std::string_view s);
// str.capitalize(): the first character upper-cased, the rest lower-cased.
std::string py_capitalize(std::string_view s);
// int(s) / float(s) of Python: surrounding whitespace, a sign, `_` between digits; false when not a number.
bool py_parse_int(std::string_view s, int64_t* out, bool* too_big);
bool py_parse_float(std::string_view s, double* out);

// parseInt(s, 10) / parseFloat(s): the longest numeric prefix after JS whitespace; false when none.
bool js_parse_int(std::string_view s, double* out);
bool js_parse_float(std::string_view s, double* out);

}  // namespace magnetar::chat::jinja
