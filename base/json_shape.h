// A JSON text's shape, scanned without parsing it: how deep it nests and how many members its objects have, for
// callers that must refuse a hostile text before a parser (nlohmann's) spends memory or quadratic time on it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace magnetar {

// What a JSON text's parse would cost beyond its size, found in one pass without parsing (the text need not be valid
// JSON; brackets and colons inside strings are not counted). Parsing is iterative, but copying or dumping a parsed
// value recurses, so a text nested deeper than kMaxJsonNesting is refused before it is parsed; and an ordered_json
// object inserts each member after a linear search of the members before it, so members squared, summed over the
// objects, is the parse's (and the conversions') work: over kMaxJsonMemberWork (one object of 10,000 members, ~0.1 s;
// 5 million of them, what a 64 MiB body holds, took hours) a text is refused too.
struct JsonShape {
  int nesting = 0;           // the deepest nesting of arrays and objects
  int64_t widest = 0;        // the most members of one object
  uint64_t member_work = 0;  // sum over objects of members squared
};
JsonShape json_shape(std::string_view text);
constexpr int kMaxJsonNesting = 256;
constexpr uint64_t kMaxJsonMemberWork = 100'000'000;
// Why `text` must not be parsed ("nests arrays and objects deeper than 256 levels", "has an object of 12,345
// members ..."), or empty when it may be.
std::string json_refusal(std::string_view text);

}  // namespace magnetar
