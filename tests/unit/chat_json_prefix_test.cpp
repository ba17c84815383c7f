// chat/json_prefix.h and chat/output_constraint.h: the incremental JSON validator against nlohmann::json as the
// oracle (a complete text is valid exactly when nlohmann accepts it; every prefix of a valid text is accepted;
// a mutated text is rejected no later than nlohmann's parser notices), and hand-made early rejections.
#include <gtest/gtest.h>

#include <array>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "base/json_shape.h"
#include "chat/json_prefix.h"
#include "chat/output_constraint.h"

namespace magnetar::chat {
namespace {

// ---- a generator of random valid JSON texts (every construct, random whitespace) ---------------------------------

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  std::string text(int depth = 0) { return ws() + value(depth) + ws(); }

 private:
  int pick(int n) { return int(rng_() % uint64_t(n)); }
  std::string ws() {
    static const char* kWs[] = {"", "", "", " ", "\n", "\t", "\r\n", "  "};
    return kWs[pick(8)];
  }
  std::string string_lit() {
    static const char* kPieces[] = {"a",
                                    "Z",
                                    " ",
                                    "\\\"",
                                    "\\\\",
                                    "\\/",
                                    "\\b",
                                    "\\f",
                                    "\\n",
                                    "\\r",
                                    "\\t",
                                    "\\u00e9",
                                    "\\uD83D\\uDE00",
                                    "\xc3\xa9",
                                    "\xe4\xb8\xad",
                                    "\xf0\x9f\x98\x80",
                                    "\xef\xbf\xbd",
                                    "{",
                                    "]",
                                    ":",
                                    ",",
                                    "true",
                                    "\\u0000"};
    std::string s = "\"";
    for (int n = pick(6); n > 0; --n) s += kPieces[pick(int(std::size(kPieces)))];
    return s + "\"";
  }
  std::string number() {
    std::string s = pick(3) == 0 ? "-" : "";
    if (pick(4) == 0) {
      s += "0";
    } else {
      s += char('1' + pick(9));
      for (int n = pick(4); n > 0; --n) s += char('0' + pick(10));
    }
    if (pick(3) == 0) {
      s += ".";
      for (int n = 1 + pick(3); n > 0; --n) s += char('0' + pick(10));
    }
    if (pick(3) == 0) {
      s += pick(2) ? "e" : "E";
      if (pick(2)) s += pick(2) ? "+" : "-";
      for (int n = 1 + pick(2); n > 0; --n) s += char('0' + pick(10));
    }
    return s;
  }
  std::string value(int depth) {
    const int kind = depth >= 5 ? 2 + pick(4) : pick(6);
    switch (kind) {
      case 0: {
        std::string s = "{" + ws();
        for (int n = pick(4), i = 0; i < n; ++i) {
          if (i) s += "," + ws();
          s += string_lit() + ws() + ":" + ws() + value(depth + 1) + ws();
        }
        return s + "}";
      }
      case 1: {
        std::string s = "[" + ws();
        for (int n = pick(4), i = 0; i < n; ++i) {
          if (i) s += "," + ws();
          s += value(depth + 1) + ws();
        }
        return s + "]";
      }
      case 2: return string_lit();
      case 3: return number();
      case 4: return std::string(std::array<const char*, 3>{"true", "false", "null"}[size_t(pick(3))]);
      default: return pick(2) ? string_lit() : number();
    }
  }
  std::mt19937_64 rng_;
};

// Where the validator first fails on `text` (its byte index), or text.size() when it never does.
size_t first_failure(const std::string& text, JsonPrefix v = JsonPrefix()) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (!v.feed(uint8_t(text[i]))) return i;
  }
  return text.size();
}

bool validator_accepts_whole(const std::string& text) {
  JsonPrefix v;
  return v.feed(text) && v.complete();
}

// nlohmann's verdict, and the byte count it had read when it failed (1-based; size + 1 at end of input). A number
// too large for a double is valid JSON (RFC 8259 leaves the range to implementations): nlohmann's out_of_range.
bool oracle(const std::string& text, size_t* error_byte) {
  try {
    const nlohmann::json parsed = nlohmann::json::parse(text);
    return !parsed.is_discarded();
  } catch (const nlohmann::json::parse_error& e) {
    *error_byte = e.byte;
    return false;
  } catch (const nlohmann::json::out_of_range&) {
    return true;
  }
}

TEST(JsonPrefix, EveryPrefixOfValidJsonIsAcceptedAndOnlyTheWholeIsComplete) {
  Gen gen(1);
  for (int doc = 0; doc < 400; ++doc) {
    const std::string text = gen.text();
    size_t err = 0;
    ASSERT_TRUE(oracle(text, &err)) << "generator bug: " << text;
    JsonPrefix v;
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_TRUE(v.feed(uint8_t(text[i]))) << "rejected byte " << i << " of " << text;
      // A prefix that nlohmann accepts is complete (e.g. "12" of "123"), and the other way round.
      const std::string prefix = text.substr(0, i + 1);
      size_t unused = 0;
      ASSERT_EQ(v.complete(), oracle(prefix, &unused)) << "prefix " << i << " of " << text;
      // closing() completes every prefix.
      JsonPrefix closed = v;
      const std::string closing = v.closing();
      ASSERT_TRUE(closed.feed(closing) && closed.complete()) << prefix << " + " << closing;
      ASSERT_TRUE(oracle(prefix + closing, &unused)) << prefix << " + " << closing;
    }
    EXPECT_TRUE(v.complete()) << text;
  }
}

TEST(JsonPrefix, MutationsAgreeWithNlohmannAndAreRejectedNoLaterThanItsParser) {
  Gen gen(2);
  std::mt19937_64 rng(3);
  const std::string alphabet = "{}[]\",:0123456789-+.eE \n\\/utrfnalse\x01\x7f\xc0\xc3\xa9\xed\xa0\xf4\x90\xff";
  int rejected = 0;
  for (int doc = 0; doc < 400; ++doc) {
    const std::string valid = gen.text();
    for (int m = 0; m < 20; ++m) {
      std::string text = valid;
      const size_t at = text.empty() ? 0 : rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          if (!text.empty()) text[at] = c;
          break;
        case 1: text.insert(text.begin() + ptrdiff_t(at), c); break;
        default:
          if (!text.empty()) text.erase(at, 1);
          break;
      }
      size_t error_byte = 0;
      const bool ok = oracle(text, &error_byte);
      ASSERT_EQ(validator_accepts_whole(text), ok)
          << nlohmann::json(text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
      if (ok) continue;
      ++rejected;
      // nlohmann reports the count of bytes it read; our failure index must be within them.
      const size_t fail = first_failure(text);
      if (error_byte <= text.size()) {
        EXPECT_LT(fail, error_byte) << "rejected later than nlohmann: "
                                    << nlohmann::json(text).dump(-1, ' ', true,
                                                                 nlohmann::json::error_handler_t::replace);
      }
    }
  }
  EXPECT_GT(rejected, 1000);  // the mutations mostly break the text
}

TEST(JsonPrefix, RejectsAtTheFirstImpossibleByte) {
  struct Case {
    std::string text;
    size_t fail;  // the index of the first byte no valid JSON text can have there
  };
  const Case cases[] = {
      {"{\"a\":1,}", 7},
      {"[1,2 x", 5},
      {"tru e", 3},
      {"nul", 3},        // an unfinished literal never fails (fail == size)
      {"\"a\x01\"", 2},  // raw control character in a string
      {"01", 1},         // leading zero
      {"-", 1},          // never fails
      {"-a", 1},
      {"1.e5", 2},
      {"{\"a\" 1}", 5},
      {"{1:2}", 1},
      {"[1]]", 3},
      {"{} x", 3},
      {"\"\\x\"", 2},
      {"\"\\ud800x\"", 7},          // a high surrogate escape must be followed by a low one
      {"\"\\udc00\"", 4},           // a lone low surrogate: known at its second hex digit
      {"\"\\ud800\\u0041\"", 9},    // ...whose first hex digit is D
      {"\"\xc0\x80\"", 1},          // overlong lead byte
      {"\"\xed\xa0\x80\"", 2},      // UTF-8-encoded surrogate
      {"\"\xf4\x90\x80\x80\"", 2},  // past U+10FFFF
      {"\"\xe4\xb8\"", 3},          // truncated sequence ends at the quote
      {"[1,]", 3},
      {"[,1]", 1},
      {"\"a\"\"b\"", 3},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(first_failure(c.text), c.fail)
        << nlohmann::json(c.text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  }
  EXPECT_EQ(first_failure("-"), 1u);
}

TEST(JsonPrefix, NestingLimitAndTopLevelObject) {
  JsonPrefix::Options deep{.max_depth = 3};
  EXPECT_EQ(first_failure("[[[1]]]", JsonPrefix(deep)), 7u);
  EXPECT_EQ(first_failure("[[[[1]]]]", JsonPrefix(deep)), 3u);
  EXPECT_EQ(first_failure("{\"a\":{\"b\":[{}]}}", JsonPrefix(deep)), 11u);
  JsonPrefix::Options object{.top = JsonPrefix::Top::kObject};
  EXPECT_EQ(first_failure("  {\"a\": [1]}  ", JsonPrefix(object)), 14u);
  EXPECT_EQ(first_failure("[1]", JsonPrefix(object)), 0u);
  EXPECT_EQ(first_failure(" 1", JsonPrefix(object)), 1u);
  JsonPrefix v(object);
  ASSERT_TRUE(v.feed("{\"a\": 1}"));
  EXPECT_TRUE(v.complete());
  EXPECT_TRUE(v.closed());
  EXPECT_FALSE(v.feed(" x"));
  // A top-level number is complete but not closed: more digits may follow.
  JsonPrefix n;
  ASSERT_TRUE(n.feed("12"));
  EXPECT_TRUE(n.complete());
  EXPECT_FALSE(n.closed());
  EXPECT_TRUE(n.feed(" "));
  EXPECT_TRUE(n.closed());
}

TEST(OutputConstraint, ChoicesThenAJsonObject) {
  const ConstraintSpec spec{.choices = {"get_weather\", \"arguments\":", "get_time\", \"arguments\":"},
                            .json_object = true};
  OutputConstraint c(spec);
  EXPECT_TRUE(c.accepts("get_"));
  EXPECT_FALSE(c.accepts("get_x"));
  EXPECT_FALSE(c.accepts("{"));
  ASSERT_TRUE(c.feed("get_time\", \"argu"));
  EXPECT_FALSE(c.done());
  // A token may cross from the choice into the JSON.
  ASSERT_TRUE(c.feed("ments\": {\"tz\""));
  EXPECT_FALSE(c.accepts("}"));
  ASSERT_TRUE(c.feed(": \"UTC\""));
  EXPECT_FALSE(c.done());
  EXPECT_FALSE(c.accepts("}\n"));  // nothing may follow the object
  ASSERT_TRUE(c.feed("}"));
  EXPECT_TRUE(c.done());
  EXPECT_FALSE(c.feed(" "));
}

TEST(OutputConstraint, ClosingEndsItFromAnyPoint) {
  const ConstraintSpec spec{.choices = {"a\", \"arguments\":", "b\", \"arguments\":"}, .json_object = true};
  const std::string text = "b\", \"arguments\": {\"k\": [1, {\"s\": \"x\\u00e9\xc3\xa9\"}, tru";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    OutputConstraint c(spec);
    ASSERT_TRUE(c.feed(text.substr(0, cut))) << cut;
    const std::string closing = c.closing();
    ASSERT_TRUE(c.feed(closing)) << cut << ": " << closing;
    EXPECT_TRUE(c.done()) << cut << ": " << closing;
  }
}

// A sampler that draws any token the filter allows, with a budget of tokens, always ends with the constraint done
// and the output a JSON object (nlohmann's parse). The vocabulary has every single byte (as byte-level BPE does) and
// tokens that open several things at once: taken while the budget allowed closing only the output so far, they used
// to leave a cut answer such as {"a":1,"": (the server's soak found 5 in 1,028 JSON answers).
TEST(OutputConstraint, AnyAllowedTokenSequenceEndsDoneWithinItsBudget) {
  std::vector<std::string> vocab;
  for (int b = 0x20; b < 0x7f; ++b) vocab.emplace_back(1, char(b));
  vocab.insert(vocab.end(), {"\n",  "\t",          "\xc3\xa9", "{\"",  "\":",  "\",",     ",\"", "\": [", "[[",
                             "[[[", "{\"a\":[{\"", "\"key\"",  "true", "null", "false",   "12",  "-0.5e", "\\u00",
                             "\\",  "}]",          "\"}",      "]}",   " {",   "\": {\"", ", ",  "\"\":"});
  for (const bool with_choice : {false, true}) {
    ConstraintSpec spec{.choices = {}, .json_object = true};
    if (with_choice) spec.choices = {"get_weather\", \"arguments\":", "read_file\", \"arguments\":"};
    std::mt19937 rng(7);
    for (int trial = 0; trial < 3000; ++trial) {
      OutputConstraint c(spec);
      const int64_t budget = int64_t(OutputConstraint(spec).closing().size()) + int64_t(rng() % 120);
      std::string out;
      for (int64_t left = budget; left > 0 && !c.done(); --left) {
        std::vector<size_t> allowed;
        for (size_t t = 0; t < vocab.size(); ++t) {
          // Multi-byte tokens drawn 4 times as often: they are the ones that run past a budget.
          if (c.allows(vocab[t], left)) allowed.insert(allowed.end(), vocab[t].size() > 1 ? 4 : 1, t);
        }
        ASSERT_FALSE(allowed.empty()) << out;
        const std::string& token = vocab[allowed[rng() % allowed.size()]];
        ASSERT_TRUE(c.feed(token)) << out << token;
        out += token;
        ASSERT_LE(c.closing().size(), c.closing_bound()) << out;
      }
      ASSERT_TRUE(c.done()) << "budget " << budget << ": " << out;
      const std::string object = with_choice ? out.substr(out.find(':') + 1) : out;
      // Numbers too: a forced call's arguments go through nlohmann in the tool-call parser, which refuses 1e999.
      EXPECT_TRUE(nlohmann::json::parse(object, nullptr, false).is_object()) << out;
    }
  }
}

TEST(JsonShape, CountsBracketsOutsideStrings) {
  auto nesting = [](std::string_view text) { return json_shape(text).nesting; };
  EXPECT_EQ(nesting(""), 0);
  EXPECT_EQ(nesting("3"), 0);
  EXPECT_EQ(nesting("[]"), 1);
  EXPECT_EQ(nesting("{\"a\": [1, {\"b\": []}], \"c\": {}}"), 4);
  EXPECT_EQ(nesting("[\"[[[{{\"]"), 1);         // brackets in a string
  EXPECT_EQ(nesting("[\"\\\"[[\", [[]]]"), 3);  // an escaped quote does not end the string
  EXPECT_EQ(nesting("[\"\\\\\", [[]]]"), 3);    // an escaped backslash does not escape the quote
  EXPECT_EQ(nesting("]]]][["), 2);              // not JSON: closers never go below zero
  EXPECT_EQ(nesting(std::string(100000, '[')), 100000);
}

// Members are the colons directly inside an object; work is their count squared, summed over the objects.
TEST(JsonShape, CountsObjectMembers) {
  JsonShape s = json_shape("{\"a\": 1, \"b\": {\"c\": [{\"d\": 2, \"e\": 3}], \"f:g\": \"h:i\"}, \"j\": [4, 5]}");
  EXPECT_EQ(s.widest, 3);                  // the outer object: a, b, j
  EXPECT_EQ(s.member_work, 9u + 4u + 4u);  // {a b j}, {c f:g}, {d e}: colons in strings not counted
  EXPECT_EQ(json_shape("[1, 2, 3]").member_work, 0u);
  EXPECT_EQ(json_shape("{\"a\": 1, \"b\": ").member_work, 4u);  // an object left open counts too
}

// The refusals, at their limits: depth 256 and one object of 10,000 members pass, one more level or member does not;
// many smaller objects add up (the parse of each inserts every member after a search of the ones before it).
TEST(JsonShape, RefusesTextsTooDeepOrWithTooManyMembers) {
  EXPECT_EQ(json_refusal(std::string(256, '[') + std::string(256, ']')), "");
  EXPECT_EQ(json_refusal(std::string(257, '[') + std::string(257, ']')),
            "nests arrays and objects deeper than 256 levels");
  auto object = [](int members) {
    std::string text = "{";
    for (int i = 0; i < members; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
    return text + "}";
  };
  EXPECT_EQ(json_refusal(object(10000)), "");
  EXPECT_EQ(json_refusal(object(10001)),
            "has too many object members to parse in reasonable time (10001 in its largest object; at most 10,000 "
            "in one, fewer across many)");
  std::string many = "[";
  for (int i = 0; i < 101; ++i) many += (i ? "," : "") + object(1000);  // 101 x 1000^2 > 10^8
  EXPECT_NE(json_refusal(many + "]"), "");
  EXPECT_EQ(json_refusal(std::string(300, '[') + object(20000)), "nests arrays and objects deeper than 256 levels");
}

// Options::finite_numbers: 20 integer digits and 2 exponent digits at most, the byte past them rejected; without it
// any length is JSON.
TEST(JsonPrefix, FiniteNumbersBoundTheIntegerAndExponentDigits) {
  const JsonPrefix::Options finite{.top = JsonPrefix::Top::kAnyValue, .max_depth = 32, .finite_numbers = true};
  auto first_failure_of = [&](const std::string& text) { return first_failure(text, JsonPrefix(finite)); };
  const std::string fine = "[18446744073709551615, -12345678901234567890, 0.5e-99, 1E+99, 7e29]";
  EXPECT_EQ(first_failure_of(fine), fine.size());               // never
  EXPECT_EQ(first_failure_of("[123456789012345678901]"), 21u);  // the 21st digit
  EXPECT_EQ(first_failure_of("[-123456789012345678901]"), 22u);
  EXPECT_EQ(first_failure_of("[7e298]"), 5u);
  EXPECT_EQ(first_failure_of("[1.5E-100]"), 8u);
  const std::string small = "[0.00000000000000000000000001]";  // fraction digits are not bounded
  EXPECT_EQ(first_failure_of(small), small.size());
  const std::string long_ones = "[7e29848, 123456789012345678901234567890]";
  EXPECT_EQ(first_failure(long_ones), long_ones.size());
  // What a bounded number can be is finite: nlohmann parses the largest.
  EXPECT_TRUE(nlohmann::json::parse("[99999999999999999999.9e99, -99999999999999999999e+99]").is_array());
}

TEST(OutputConstraint, WhitespaceRunsOutsideStringsAreBounded) {
  const ConstraintSpec spec{.choices = {}, .json_object = true, .max_whitespace_run = 2};
  OutputConstraint c(spec);
  EXPECT_TRUE(c.accepts(" \n{"));
  EXPECT_FALSE(c.accepts("   {"));
  ASSERT_TRUE(c.feed("{\"a\":  \"x     y\""));  // spaces inside strings are content
  EXPECT_FALSE(c.accepts("   }"));
  EXPECT_TRUE(c.accepts(" }"));
  const ConstraintSpec unlimited{.choices = {}, .json_object = true, .max_whitespace_run = 0};
  EXPECT_TRUE(OutputConstraint(unlimited).accepts("\n\n\n\n\n{"));
}

}  // namespace
}  // namespace magnetar::chat
