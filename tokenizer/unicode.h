// NFC normalization (UAX #15) over possibly invalid UTF-8. The UTF-8 primitives themselves (decoding with
// the "maximal subpart" error rule, encoding, lossy repair) live in base/utf8.h, shared with chat/.
//
// Text reaching the tokenizer is bytes: usually UTF-8, but a prompt file or a client may hand us anything,
// so nothing here assumes validity. Invalid bytes are carried through NFC untouched (they act as starters
// that never compose) and are replaced by U+FFFD only where text must be valid (decode, streaming).
#pragma once

#include <string>
#include <string_view>

#include "base/utf8.h"

namespace magnetar::tokenizer {

// Re-exported: tokenizer code and its callers name them as tokenizer:: functions, as before the move.
using magnetar::append_utf8;
using magnetar::decode_utf8;
using magnetar::is_valid_utf8;
using magnetar::kReplacementChar;
using magnetar::to_valid_utf8;
using magnetar::Utf8Kind;
using magnetar::Utf8Step;

// True when `s` is certainly in NFC already (the quick check: no code point with a nonzero combining class
// or NFC_QC other than Yes). Cheap: ASCII and Latin-1 text is scanned byte by byte without table lookups.
bool is_nfc_quick(std::string_view s);
// Canonical decomposition, canonical ordering and canonical composition (UAX #15) of `s`. Invalid bytes are
// kept as they are and block composition across them.
std::string to_nfc(std::string_view s);

}  // namespace magnetar::tokenizer
