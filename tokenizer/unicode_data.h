// Unicode tables for NFC normalization, generated into unicode_data.cpp by gen_unicode_data.py.
// Every table is sorted by code point so lookups are binary searches.
#pragma once

#include <cstddef>
#include <cstdint>

namespace magnetar::tokenizer::unicode_data {

struct CombiningClassRange {
  uint32_t first;
  uint32_t last;
  uint8_t ccc;  // canonical combining class, never 0 here
};

// One level of a canonical decomposition (recursion happens at run time). `second` is 0 for singleton
// decompositions. `composes` marks primary composites: NFC recomposes first+second into `cp` (false for
// singletons, non-starter decompositions and the composition exclusions). Hangul syllables are not listed:
// they are decomposed and composed arithmetically.
struct Decomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
  bool composes;
};

struct CodepointRange {
  uint32_t first;
  uint32_t last;
};

extern const char kUnicodeVersion[];
extern const CombiningClassRange kCombiningClasses[];
extern const size_t kCombiningClassCount;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
// Code points that fail the NFC quick check: nonzero combining class, NFC_QC=No (never survives NFC) or
// NFC_QC=Maybe (may compose with what precedes it). Text without any of them is already NFC.
extern const CodepointRange kNfcUnsafe[];
extern const size_t kNfcUnsafeCount;

}  // namespace magnetar::tokenizer::unicode_data
