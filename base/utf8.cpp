#include "base/utf8.h"

namespace magnetar {

Utf8Step decode_utf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {Utf8Kind::kChar, b0, 1};
  int need = 0;       // continuation bytes
  uint8_t lo = 0x80;  // allowed range of the first continuation byte (excludes overlongs and surrogates)
  uint8_t hi = 0xBF;
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Kind::kInvalid, 0, 1};
  }
  for (int k = 1; k <= need; ++k) {
    if (pos + k >= s.size()) return {Utf8Kind::kIncomplete, 0, k};
    const uint8_t b = byte(pos + k);
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Kind::kInvalid, 0, k};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Kind::kChar, cp, need + 1};
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Step step = decode_utf8(s, i);
    if (step.kind != Utf8Kind::kChar) return false;
    i += size_t(step.length);
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Step step = decode_utf8(s, i);
    if (step.kind == Utf8Kind::kChar) {
      out.append(s.substr(i, size_t(step.length)));
    } else {
      append_utf8(kReplacementChar, &out);
    }
    i += size_t(step.length);
  }
  return out;
}

}  // namespace magnetar
