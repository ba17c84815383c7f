#include "chat/jinja_text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace magnetar::chat::jinja {

// A thin adapter over base/utf8.h's decoder that keeps the Jinja engine's behaviour byte for byte (it is
// tested for parity with Python jinja2): an ill-formed sequence is consumed one byte at a time, not one
// maximal subpart at a time, so a truncated "\xE2\x82" reads as two U+FFFD (utf16_length 2, not 1), and
// map_string below tells an invalid byte (1 byte) from a real U+FFFD (3 bytes) by the bytes consumed, which a
// 3-byte subpart such as a truncated "\xF1\x80\x80" would break. Both accept exactly the well-formed
// sequences.
uint32_t decode_utf8_multibyte(std::string_view s, size_t* i) {
  const Utf8Step step = magnetar::decode_utf8(s, *i);
  if (step.kind == Utf8Kind::kChar) {
    *i += size_t(step.length);
    return step.cp;
  }
  ++*i;
  return kReplacementChar;
}

namespace {

// Bytes of the run of ASCII that starts at s[i] (eight at a time).
size_t ascii_run(std::string_view s, size_t i) {
  const size_t start = i;
  for (uint64_t w; i + 8 <= s.size(); i += 8) {
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) break;
  }
  while (i < s.size() && uint8_t(s[i]) < 0x80) ++i;
  return i - start;
}

bool is_js_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

}  // namespace

size_t js_space_len(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const uint8_t b = uint8_t(s[i]);
  if (b < 0x80) return (b >= 0x09 && b <= 0x0D) || b == 0x20 ? 1 : 0;
  size_t j = i;
  const uint32_t cp = decode_utf8(s, &j);
  return is_js_space(cp) ? j - i : 0;
}

std::string_view js_trim_start(std::string_view s) {
  size_t i = 0;
  while (size_t n = js_space_len(s, i)) i += n;
  return s.substr(i);
}

std::string_view js_trim_end(std::string_view s) {
  // Walk forward remembering where the trailing run of whitespace starts (UTF-8 cannot be read backwards
  // safely when it may be invalid).
  size_t i = 0, run_start = 0;
  bool in_run = false;
  while (i < s.size()) {
    if (size_t n = js_space_len(s, i)) {
      if (!in_run) run_start = i, in_run = true;
      i += n;
    } else {
      in_run = false;
      decode_utf8(s, &i);
    }
  }
  return in_run ? s.substr(0, run_start) : s;
}

size_t utf16_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) n += decode_utf8(s, &i) >= 0x10000 ? 2 : 1;
  return n;
}

std::u16string to_utf16(std::string_view s) {
  std::u16string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = decode_utf8(s, &i);
    if (cp >= 0x10000) {
      out.push_back(char16_t(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(char16_t(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    } else {
      out.push_back(char16_t(cp));
    }
  }
  return out;
}

std::string from_utf16(std::u16string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const uint32_t u = s[i];
    if (u >= 0xD800 && u <= 0xDBFF && i + 1 < s.size() && s[i + 1] >= 0xDC00 && s[i + 1] <= 0xDFFF) {
      append_utf8(0x10000 + ((u - 0xD800) << 10) + (uint32_t(s[i + 1]) - 0xDC00), &out);
      ++i;
    } else if (u >= 0xD800 && u <= 0xDFFF) {
      append_utf8(kReplacementChar, &out);
    } else {
      append_utf8(u, &out);
    }
  }
  return out;
}

int js_compare(std::string_view a, std::string_view b) {
  const std::u16string x = to_utf16(a), y = to_utf16(b);
  return x < y ? -1 : (y < x ? 1 : 0);
}

std::string js_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";
  std::string out = d < 0 ? "-" : "";
  char buf[64];
  // Shortest round-trip digits, as ECMAScript's Number::toString requires.
  const auto r = std::to_chars(buf, buf + sizeof(buf), std::fabs(d), std::chars_format::scientific);
  const std::string_view sci(buf, size_t(r.ptr - buf));
  const size_t e_at = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_at)) {
    if (c != '.') digits += c;
  }
  const int exp10 = std::atoi(std::string(sci.substr(e_at + 1)).c_str());
  const int k = int(digits.size()), n = exp10 + 1;
  if (k <= n && n <= 21) {
    out += digits;
    out.append(size_t(n - k), '0');
  } else if (0 < n && n <= 21) {
    out.append(digits, 0, size_t(n));
    out += '.';
    out.append(digits, size_t(n));
  } else if (-6 < n && n <= 0) {
    out += "0.";
    out.append(size_t(-n), '0');
    out += digits;
  } else {
    out += digits[0];
    if (k > 1) {
      out += '.';
      out.append(digits, 1);
    }
    out += n - 1 >= 0 ? "e+" : "e-";
    out += std::to_string(std::abs(n - 1));
  }
  return out;
}

namespace {

// Simple one-to-one case pairs of the scripts chat templates meet; `upper` selects the direction.
uint32_t map_case(uint32_t cp, bool upper) {
  // The Latin digraphs come in threes (upper, title, lower): DŽ Dž dž, LJ Lj lj, NJ Nj nj, DZ Dz dz.
  if ((cp >= 0x1C4 && cp <= 0x1CC) || (cp >= 0x1F1 && cp <= 0x1F3)) {
    const uint32_t base = cp >= 0x1F1 ? 0x1F1 : 0x1C4 + (cp - 0x1C4) / 3 * 3;
    return upper ? base : base + 2;
  }
  if (cp < 0x80) {
    if (upper && cp >= 'a' && cp <= 'z') return cp - 32;
    if (!upper && cp >= 'A' && cp <= 'Z') return cp + 32;
    return cp;
  }
  if (upper) {
    if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 0x20;
    if (cp == 0xFF) return 0x178;
    if (cp == 0xB5) return 0x39C;
    if (cp == 0x131) return 'I';
    if (cp == 0x17F) return 'S';
    if ((cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) {
      return (cp & 1) ? cp - 1 : cp;
    }
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp & 1) ? cp : cp - 1;
    if (cp >= 0x3B1 && cp <= 0x3C9) return cp == 0x3C2 ? 0x3A3 : cp - 0x20;
    if (cp >= 0x430 && cp <= 0x44F) return cp - 0x20;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 0x50;
    return cp;
  }
  if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 0x20;
  if (cp == 0x178) return 0xFF;
  if ((cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) {
    return (cp & 1) ? cp : cp + 1;
  }
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) return (cp & 1) ? cp + 1 : cp;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 0x20;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 0x20;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;
  return cp;
}

std::string map_string(std::string_view s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, &i);
    if (upper && cp == 0xDF) {
      out += "SS";
    } else if (!upper && cp == 0x130) {
      out += "i\xCC\x87";
    } else if (cp == 0xFFFD && !(i - start == 3)) {
      out.append(s.substr(start, i - start));  // keep invalid bytes as they were
    } else {
      append_utf8(map_case(cp, upper), &out);
    }
  }
  return out;
}

size_t skip_js_space(std::string_view s) {
  size_t i = 0;
  while (size_t n = js_space_len(s, i)) i += n;
  return i;
}

}  // namespace

std::string js_upper(std::string_view s) { return map_string(s, true); }
std::string py_upper(std::string_view s) { return map_string(s, true); }
std::string py_lower(std::string_view s) { return map_string(s, false); }
std::string js_lower(std::string_view s) { return map_string(s, false); }

bool js_parse_int(std::string_view s, double* out) {
  size_t i = skip_js_space(s);
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  double v = 0;
  size_t digits = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) v = v * 10 + (s[i] - '0');
  if (digits == 0) return false;
  *out = neg ? -v : v;
  return true;
}

bool js_parse_float(std::string_view s, double* out) {
  size_t i = skip_js_space(s);
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (s.substr(i, 8) == "Infinity") {
    *out = neg ? -HUGE_VAL : HUGE_VAL;
    return true;
  }
  const size_t start = i;
  size_t int_digits = 0, frac_digits = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++int_digits;
  size_t end = i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i, ++frac_digits;
    if (int_digits + frac_digits > 0) end = i;
  }
  if (int_digits + frac_digits == 0) return false;
  if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
    size_t j = end + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j > exp_start) end = j;
  }
  std::string text(s.substr(start, end - start));
  if (!text.empty() && text[0] == '.') text = "0" + text;
  double v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec == std::errc::result_out_of_range) v = text.find_first_of("123456789") == std::string::npos ? 0 : HUGE_VAL;
  *out = neg ? -v : v;
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// Python str semantics
// ---------------------------------------------------------------------------------------------------------

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const size_t run = ascii_run(s, i);
    n += run;
    i += run;
    if (i == s.size()) break;
    decode_utf8(s, &i);
  }
  return n;
}

size_t cp_offset(std::string_view s, size_t index) {
  size_t i = 0;
  for (size_t n = 0; n < index; ++n) {
    if (i >= s.size()) return std::string_view::npos;
    const size_t run = ascii_run(s.substr(0, i + (index - n)), i);
    if (run > 0) {
      n += run - 1;
      i += run;
    } else {
      decode_utf8(s, &i);
    }
  }
  return i < s.size() ? i : std::string_view::npos;
}

bool py_is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  // `chars` as a table for ASCII and a sorted list for the rest: a lookup per code point, not a walk of chars
  // (a long chars made the strip O(len(s) * len(chars))).
  bool ascii[128] = {};
  std::vector<uint32_t> wide;
  if (chars) {
    for (size_t i = 0; i < chars->size();) {
      const uint32_t cp = decode_utf8(*chars, &i);
      if (cp < 128) {
        ascii[cp] = true;
      } else {
        wide.push_back(cp);
      }
    }
    std::sort(wide.begin(), wide.end());
  }
  const auto strip_it = [&](uint32_t cp) {
    if (!chars) return py_is_space(cp);
    return cp < 128 ? ascii[cp] : std::binary_search(wide.begin(), wide.end(), cp);
  };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < s.size()) {
      size_t next = begin;
      if (!strip_it(decode_utf8(s, &next))) break;
      begin = next;
    }
  }
  if (right) {
    // From the end, one code point at a time, as a forward read splits the bytes: a byte that is not a
    // continuation byte always starts a step of the forward read, so the last code point starts at the nearest
    // such byte when it decodes to exactly the end; else the last byte is an invalid byte on its own.
    while (end > begin) {
      size_t lead = end - 1;
      while (lead > begin && end - lead < 4 && (uint8_t(s[lead]) & 0xC0) == 0x80) --lead;
      size_t next = lead;
      uint32_t cp = decode_utf8(s.substr(0, end), &next);
      if (next != end) {
        lead = end - 1;
        cp = kReplacementChar;
      }
      if (!strip_it(cp)) break;
      end = lead;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

namespace {

bool is_cased(uint32_t cp) {
  return map_case(cp, true) != cp || map_case(cp, false) != cp || cp == 0xDF || (cp >= 0x1C4 && cp <= 0x1CC) ||
         (cp >= 0x1F1 && cp <= 0x1F3);
}

// Title case of one code point: the digraphs have their own title form (Dž), others take their upper case.
void append_title(uint32_t cp, std::string* out) {
  if ((cp >= 0x1C4 && cp <= 0x1CC) || (cp >= 0x1F1 && cp <= 0x1F3)) {
    append_utf8(map_case(cp, true) + 1, out);
  } else if (cp == 0xDF) {
    *out += "Ss";
  } else {
    append_utf8(map_case(cp, true), out);
  }
}

}  // namespace

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, &i);
    if (cp == 0xFFFD && i - start != 3) {
      out.append(s.substr(start, i - start));
      prev_cased = false;
      continue;
    }
    const bool cased = is_cased(cp);
    if (cased && !prev_cased) {
      if (cp == 0xDF) {
        out += "Ss";
      } else {
        append_utf8(map_case(cp, true), &out);  // str.title() takes the upper case of the digraphs too
      }
    } else {
      out += py_lower(s.substr(start, i - start));
    }
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  if (s.empty()) return std::string();
  size_t i = 0;
  const uint32_t cp = decode_utf8(s, &i);
  std::string out;
  if (cp == 0xFFFD && i != 3) {
    out.append(s.substr(0, i));
  } else {
    append_title(cp, &out);
  }
  return out + py_lower(s.substr(i));
}

namespace {

// The digits of a Python numeric literal with `_` allowed between digits; "" when malformed.
std::string without_underscores(std::string_view s) {
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_') {
      const bool between =
          k > 0 && k + 1 < s.size() && std::isdigit(uint8_t(s[k - 1])) && std::isdigit(uint8_t(s[k + 1]));
      if (!between) return std::string();
      continue;
    }
    out += s[k];
  }
  return out;
}

std::string_view ascii_space_trimmed(std::string_view s, std::string* holder) {
  *holder = py_strip(s, nullptr, true, true);
  return *holder;
}

}  // namespace

bool py_parse_int(std::string_view s, int64_t* out, bool* too_big) {
  std::string holder;
  std::string text = without_underscores(ascii_space_trimmed(s, &holder));
  *too_big = false;
  if (text.empty()) return false;
  size_t i = 0;
  if (text[0] == '+' || text[0] == '-') ++i;
  if (i >= text.size()) return false;
  for (size_t k = i; k < text.size(); ++k) {
    if (!std::isdigit(uint8_t(text[k]))) return false;
  }
  if (text[0] == '+') text.erase(0, 1);
  const auto r = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (r.ec == std::errc::result_out_of_range) *too_big = true;
  return true;
}

bool py_parse_float(std::string_view s, double* out) {
  std::string holder;
  std::string text = without_underscores(ascii_space_trimmed(s, &holder));
  if (text.empty()) return false;
  std::string lower;
  for (char c : text) lower += char(std::tolower(uint8_t(c)));
  size_t i = lower[0] == '+' || lower[0] == '-' ? 1 : 0;
  const std::string body = lower.substr(i);
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : (lower[0] == '-' ? -HUGE_VAL : HUGE_VAL);
    return true;
  }
  // digits [. digits] [e [sign] digits], at least one digit in the mantissa
  size_t k = 0, mantissa = 0;
  while (k < body.size() && std::isdigit(uint8_t(body[k]))) ++k, ++mantissa;
  if (k < body.size() && body[k] == '.') {
    ++k;
    while (k < body.size() && std::isdigit(uint8_t(body[k]))) ++k, ++mantissa;
  }
  if (mantissa == 0) return false;
  if (k < body.size() && body[k] == 'e') {
    ++k;
    if (k < body.size() && (body[k] == '+' || body[k] == '-')) ++k;
    size_t exp = 0;
    while (k < body.size() && std::isdigit(uint8_t(body[k]))) ++k, ++exp;
    if (exp == 0) return false;
  }
  if (k != body.size()) return false;
  *out = std::strtod(text.c_str(), nullptr);
  return true;
}

}  // namespace magnetar::chat::jinja
