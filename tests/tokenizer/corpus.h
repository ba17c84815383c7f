// The strings the tokenizer parity test feeds to Magnetar and to HF tokenizers: a curated list of tricky
// cases plus a seeded generator over the categories that break tokenizers (English, CJK, Arabic and Hebrew
// with marks, Indic, emoji and ZWJ sequences, code in several languages, runs of spaces/tabs/newlines,
// numbers, contractions, special tokens inside text, decomposed and otherwise unusual but valid UTF-8).
//
// Deterministic: the same seed gives the same strings on every machine (a private splitmix64 generator; no
// std:: distributions, whose output differs between standard libraries). Every string is valid UTF-8 made
// of code points assigned since Unicode 9 or earlier, so Unicode-version differences between PCRE2,
// Oniguruma and the NFC tables cannot show up as mismatches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace magnetar::testing {

// The curated cases (about 200), then generated ones up to `count` strings in total.
std::vector<std::string> tokenizer_corpus(uint64_t seed, size_t count);

}  // namespace magnetar::testing
