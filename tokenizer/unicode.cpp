#include "tokenizer/unicode.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "tokenizer/unicode_data.h"

namespace magnetar::tokenizer {

// ---- NFC --------------------------------------------------------------------------------------------------
// Invalid input bytes travel through the code point pipeline as kInvalidBase + byte: above the Unicode range,
// combining class 0, no decomposition, no composition.

namespace {

constexpr uint32_t kInvalidBase = 0x110000;
constexpr uint32_t kFirstNonTrivial = 0x300;   // below U+0300 no code point fails the quick check
constexpr uint32_t kFirstDecomposable = 0xC0;  // U+00C0, the first code point with a decomposition

// Hangul syllable arithmetic (Unicode chapter 3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(uint32_t cp) {
  if (cp < kFirstNonTrivial || cp >= kInvalidBase) return 0;
  const auto* begin = unicode_data::kCombiningClasses;
  const auto* end = begin + unicode_data::kCombiningClassCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t c, const auto& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool nfc_unsafe(uint32_t cp) {
  if (cp < kFirstNonTrivial) return false;
  const auto* begin = unicode_data::kNfcUnsafe;
  const auto* end = begin + unicode_data::kNfcUnsafeCount;
  const auto* it = std::upper_bound(begin, end, cp, [](uint32_t c, const auto& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

const unicode_data::Decomposition* find_decomposition(uint32_t cp) {
  const auto* begin = unicode_data::kDecompositions;
  const auto* end = begin + unicode_data::kDecompositionCount;
  const auto* it = std::lower_bound(begin, end, cp, [](const auto& d, uint32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  // Precomposed Latin-1 letters (from U+00C0) are NFC-stable alone but must still be decomposed: a mark that
  // follows may recompose with the base differently (I + diaeresis + tilde below -> U+1E2C + diaeresis).
  const unicode_data::Decomposition* d =
      cp >= kFirstDecomposable && cp < kInvalidBase ? find_decomposition(cp) : nullptr;
  if (!d) {
    out->push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second != 0) decompose(d->second, out);
}

// Primary composite of (first, second), or 0. The pair table is built once, on first use (thread-safe
// static initialization).
uint32_t compose(uint32_t first, uint32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  static const std::unordered_map<uint64_t, uint32_t> kPairs = [] {
    std::unordered_map<uint64_t, uint32_t> m;
    for (size_t i = 0; i < unicode_data::kDecompositionCount; ++i) {
      const unicode_data::Decomposition& d = unicode_data::kDecompositions[i];
      if (d.composes) m.emplace((uint64_t(d.first) << 32) | d.second, d.cp);
    }
    return m;
  }();
  const auto it = kPairs.find((uint64_t(first) << 32) | second);
  return it == kPairs.end() ? 0 : it->second;
}

}  // namespace

bool is_nfc_quick(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t b = uint8_t(s[i]);
    if (b < 0xC0) {  // ASCII, or a stray continuation byte (invalid: inert)
      ++i;
      continue;
    }
    if (b < 0xCC) {  // a two-byte sequence below U+0300, when its continuation byte is there
      i += i + 1 < s.size() && (uint8_t(s[i + 1]) & 0xC0) == 0x80 ? 2 : 1;
      continue;
    }
    const Utf8Step step = decode_utf8(s, i);
    if (step.kind == Utf8Kind::kChar && nfc_unsafe(step.cp)) return false;
    i += size_t(step.length);
  }
  return true;
}

namespace {

// The full algorithm on one line.
void append_nfc(std::string_view s, std::string* result) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Step step = decode_utf8(s, i);
    if (step.kind == Utf8Kind::kChar) {
      decompose(step.cp, &cps);
    } else {
      for (int k = 0; k < step.length; ++k) cps.push_back(kInvalidBase + uint8_t(s[i + size_t(k)]));
    }
    i += size_t(step.length);
  }

  // Canonical ordering: a stable sort by combining class within each run of non-starters.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + ptrdiff_t(i), cps.begin() + ptrdiff_t(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }

  // Canonical composition. After reordering, the non-starters between the last starter and the current
  // character are sorted by class, so the character is blocked exactly when the previous one is not that
  // starter and has a class >= its own.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  ptrdiff_t starter = -1;
  for (uint32_t cp : cps) {
    const uint8_t cc = combining_class(cp);
    if (starter >= 0) {
      const bool adjacent = ptrdiff_t(out.size()) - 1 == starter;
      if (adjacent || combining_class(out.back()) < cc) {
        if (const uint32_t composite = compose(out[size_t(starter)], cp)) {
          out[size_t(starter)] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = ptrdiff_t(out.size());
    out.push_back(cp);
  }

  for (uint32_t cp : out) {
    if (cp >= kInvalidBase) {
      result->push_back(char(cp - kInvalidBase));
    } else {
      append_utf8(cp, result);
    }
  }
}

}  // namespace

std::string to_nfc(std::string_view s) {
  // Line by line: '\n' has class 0 and takes part in no composition, so nothing reorders or composes across
  // it, and only the lines that fail the quick check pay for the full algorithm (one decomposed character in
  // 10 MB of source code costs one line, not 10 MB).
  std::string result;
  result.reserve(s.size() + s.size() / 8);
  while (!s.empty()) {
    const size_t eol = s.find('\n');
    const std::string_view line = s.substr(0, eol == std::string_view::npos ? s.size() : eol + 1);
    if (is_nfc_quick(line)) {
      result.append(line);
    } else {
      append_nfc(line, &result);
    }
    s.remove_prefix(line.size());
  }
  return result;
}

}  // namespace magnetar::tokenizer
