#include "tests/tokenizer/corpus.h"

#include <functional>
#include <string_view>

namespace magnetar::testing {
namespace {

// ---- helpers ----------------------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return size_t(next() % n); }
  uint32_t in(uint32_t lo, uint32_t hi) { return lo + uint32_t(next() % (hi - lo + 1)); }  // [lo, hi]
  bool percent(int p) { return int(next() % 100) < p; }
  template <typename T, size_t N>
  const T& pick(const T (&items)[N]) {
    return items[below(N)];
  }

 private:
  uint64_t state_;
};

void put(std::string* s, uint32_t cp) {
  if (cp < 0x80) {
    s->push_back(char(cp));
  } else if (cp < 0x800) {
    s->push_back(char(0xC0 | (cp >> 6)));
    s->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s->push_back(char(0xE0 | (cp >> 12)));
    s->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s->push_back(char(0xF0 | (cp >> 18)));
    s->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    s->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s->push_back(char(0x80 | (cp & 0x3F)));
  }
}

// At most `n` bytes of `s`, cut at a character boundary.
std::string utf8_prefix(const std::string& s, size_t n) {
  if (n >= s.size()) return s;
  while (n > 0 && (uint8_t(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// ---- vocabularies -----------------------------------------------------------------------------------------

constexpr std::string_view kWords[] = {"the",       "of",     "and",       "to",           "in",
                                       "is",        "you",    "that",      "it",           "he",
                                       "was",       "for",    "on",        "are",          "as",
                                       "with",      "his",    "they",      "at",           "be",
                                       "this",      "have",   "from",      "or",           "one",
                                       "had",       "by",     "word",      "but",          "not",
                                       "what",      "all",    "were",      "when",         "your",
                                       "can",       "said",   "there",     "use",          "an",
                                       "each",      "which",  "she",       "do",           "how",
                                       "their",     "if",     "will",      "up",           "other",
                                       "about",     "out",    "many",      "then",         "them",
                                       "these",     "so",     "some",      "her",          "would",
                                       "make",      "like",   "him",       "into",         "time",
                                       "has",       "look",   "two",       "more",         "write",
                                       "go",        "see",    "number",    "tokenizer",    "Mixture-of-Experts",
                                       "inference", "GPU",    "NVMe",      "quantization", "Hello",
                                       "World",     "OpenAI", "naïve",     "café",         "résumé",
                                       "Zürich",    "São",    "Paulo",     "Ångström",     "façade",
                                       "jalapeño",  "über",   "coöperate", "straße",       "Œuvre",
                                       "ĳssel",     "Ærø",    "Łódź",      "Dvořák",       "İstanbul",
                                       "ſtraße",    "ﬁnance", "ﬂow"};
constexpr std::string_view kContractions[] = {
    "don't",  "I'm",   "you're",  "we've", "they'll",     "she'd", "it's",    "can't", "won't", "I'M",
    "YOU'RE", "We'Ve", "THEY'LL", "He'D",  "IT'S",        "it'S",  "'s",      "'S",    "'t",    "'re",
    "'Re",    "'rE",   "'ve",     "'VE",   "'m",          "'M",    "'ll",     "'Ll",   "'lL",   "'d",
    "'D",     "''s",   "'''",     "'sss",  "rock'n'roll", "'twas", "o'clock", "y'all", "ma'am", "it’s",
    "don’t",  "'ſ",    "'ſt",     "l'été", "l'Ève",       "'1",    "' s",     "'\n",   "'日本"};
constexpr std::string_view kPunct[] = {", ", ". ", "! ",  "? ",  "; ",  ": ", " - ", " -- ", "...", "\"", " (", ") ",
                                       " [", "] ", " / ", " & ", " — ", "…",  " «",  "» ",   " “",  "” ", "!!", "?!"};
constexpr std::string_view kChinese[] = {
    "我想在apple工作", "你好，世界！",         "机器学习",     "混合专家模型", "今天天气很好。",
    "中华人民共和国",  "人工智能正在改变世界", "这是一个测试", "北京",         "上海市"};
constexpr std::string_view kJapanese[] = {
    "こんにちは世界", "東京都", "カタカナとひらがな", "日本語のテキスト", "ありがとうございます。", "ｶﾀｶﾅ", "〜",
    "「引用」"};
constexpr std::string_view kKorean[] = {"안녕하세요", "세계", "한국어 텍스트", "대한민국", "감사합니다!"};
constexpr std::string_view kFullwidthPunct[] = {"，", "。", "！", "？", "、", "：", "；", "「", "」",
                                                "『", "』", "（", "）", "【", "】", "～", "　"};
constexpr std::string_view kZwjSequences[] = {"👨‍👩‍👧‍👦",
                                              "🏳️‍🌈",
                                              "👩‍💻",
                                              "🧑‍🤝‍🧑",
                                              "👨🏽‍🚀",
                                              "🏴‍☠️",
                                              "❤️‍🔥",
                                              "👁️‍🗨️",
                                              "🐻‍❄️",
                                              "👩‍❤️‍💋‍👨",
                                              "🤦🏼‍♂️",
                                              "🧔‍♀️",
                                              "1️⃣",
                                              "#️⃣",
                                              "🇺🇸",
                                              "🇯🇵",
                                              "🇩🇪",
                                              "✌🏿",
                                              "☺️",
                                              "⚠️"};
constexpr std::string_view kSpecials[] = {"<|endoftext|>",
                                          "<|im_start|>",
                                          "<|im_end|>",
                                          "<|object_ref_start|>",
                                          "<|box_end|>",
                                          "<|vision_pad|>",
                                          "<tool_call>",
                                          "</tool_call>",
                                          "<|fim_prefix|>",
                                          "<|fim_middle|>",
                                          "<|fim_suffix|>",
                                          "<|fim_pad|>",
                                          "<|repo_name|>",
                                          "<|file_sep|>",
                                          "<tool_response>",
                                          "</tool_response>",
                                          "<think>",
                                          "</think>",
                                          "<|begin_of_text|>",
                                          "<|end_of_text|>",
                                          "<|start_header_id|>",
                                          "<|end_header_id|>",
                                          "<|eot_id|>",
                                          "<|reserved_special_token_5|>",
                                          "<|im_start|",
                                          "<|im_end",
                                          "<think",
                                          "</think",
                                          "<<|im_end|>>",
                                          "<|IM_END|>",
                                          "< |im_end|>",
                                          "<|im_end|><|im_end|>",
                                          "<|endoftext|><|endoftext|>",
                                          "<|",
                                          "|>",
                                          "<||>",
                                          "<thinking>"};
// Long snippets are split over lines: adjacent literals here are intended.
// NOLINTBEGIN(bugprone-suspicious-missing-comma)
constexpr std::string_view kCode[] = {
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in "
    "range(10)])\n",
    "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= "
    "2;\n  return v.size() > 2 ? 0 : 1;\n}\n",
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "const add = (a, b) => a + b;\nexport default async function handler(req, res) {\n  res.status(200).json({ ok: "
    "true });\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 3; i++ {\n\t\tfmt.Println(i)\n\t}\n}\n",
    "SELECT id, name, COUNT(*) AS n\nFROM users u\nJOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= "
    "'2024-01-01'\nGROUP BY 1, 2\nHAVING n > 5;\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <body>\n    <div class=\"a b\">&nbsp;&lt;tag&gt;</div>\n  "
    "</body>\n</html>\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> out.log\ndone\n",
    "{\n  \"name\": \"magnetar\",\n  \"version\": \"0.1.0\",\n  \"deps\": [\"pcre2\", \"gtest\"],\n  \"nested\": "
    "{\"a\": null, \"b\": 1.5e-3}\n}\n",
    "all: build\n\nbuild:\n\t$(CXX) -O2 -std=c++20 -o app main.cpp\n\nclean:\n\trm -f app *.o\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n",
    "server:\n  port: 8080\n  hosts:\n    - \"127.0.0.1\"\n    - localhost\n  tls: false  # comment\n",
    "    x = {'a': 1, \"b\": [2, 3]}\r\n\treturn x['a'] ** 2 // 3 != 0 and not x or y >= z <<= 1\r\n",
    "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"Hi\" + "
    "args.length);\n    }\n}\n"};
// NOLINTEND(bugprone-suspicious-missing-comma)
constexpr uint32_t kSpaces[] = {' ',    ' ',    ' ',    '\t', '\n',   '\n',   '\r',   0x0B,   0x0C,  0xA0,
                                0x3000, 0x2028, 0x2029, 0x85, 0x2003, 0x202F, 0x205F, 0x1680, 0x2009};

// ---- categories -------------------------------------------------------------------------------------------

std::string english(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(30);
  for (size_t i = 0; i < n; ++i) {
    std::string w(r.percent(15) ? r.pick(kContractions) : r.pick(kWords));
    if (r.percent(15) && !w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 32);
    if (r.percent(4)) {
      for (char& c : w) c = (c >= 'a' && c <= 'z') ? char(c - 32) : c;
    }
    s += w;
    s += r.percent(20) ? std::string(r.pick(kPunct)) : " ";
  }
  if (r.percent(30)) s = utf8_prefix(s, s.size() - 1);  // drop the last character
  return r.percent(10) ? std::string(" ").append(s) : s;
}

std::string cjk(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(12);
  for (size_t i = 0; i < n; ++i) {
    switch (r.below(7)) {
      case 0: s += r.pick(kChinese); break;
      case 1: s += r.pick(kJapanese); break;
      case 2: s += r.pick(kKorean); break;
      case 3:
        for (size_t k = r.below(8) + 1; k > 0; --k) put(&s, r.in(0x4E00, 0x9FA5));
        break;
      case 4:
        for (size_t k = r.below(8) + 1; k > 0; --k)
          put(&s, r.percent(50) ? r.in(0x3041, 0x3093) : r.in(0x30A1, 0x30F6));
        break;
      case 5:
        for (size_t k = r.below(6) + 1; k > 0; --k) put(&s, r.in(0xAC00, 0xD7A3));
        break;
      default:
        if (r.percent(70)) {
          s += r.pick(kFullwidthPunct);
        } else {
          s.append(" ").append(r.pick(kWords)).append(" ");
        }
        break;
    }
  }
  return s;
}

// Arabic and Hebrew words with their combining marks in random order (NFC must reorder them by class).
std::string rtl(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(10);
  for (size_t i = 0; i < n; ++i) {
    const bool hebrew = r.percent(30);
    for (size_t k = 2 + r.below(6); k > 0; --k) {
      if (hebrew) {
        put(&s, r.in(0x05D0, 0x05EA));
        if (r.percent(40)) put(&s, r.in(0x05B0, 0x05BC));
      } else {
        put(&s, r.percent(75) ? r.in(0x0621, 0x063A) : r.in(0x0641, 0x064A));
        for (size_t m = r.percent(35) ? 1 + r.below(3) : 0; m > 0; --m) put(&s, r.in(0x064B, 0x0652));
      }
    }
    if (r.percent(15)) put(&s, r.percent(50) ? 0x200F : 0x200E);
    if (r.percent(15)) {
      for (size_t k = 1 + r.below(4); k > 0; --k) put(&s, r.in(0x0660, 0x0669));
    }
    s += r.percent(15) ? "، " : r.percent(10) ? "؟" : " ";
  }
  return s;
}

std::string indic(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(8);
  for (size_t i = 0; i < n; ++i) {
    if (r.percent(65)) {  // Devanagari, with nukta (class 7) and the composition-excluded QA..YYA letters
      for (size_t k = 1 + r.below(5); k > 0; --k) {
        put(&s, r.percent(10) ? r.in(0x0958, 0x095F) : r.in(0x0915, 0x0939));
        if (r.percent(15)) put(&s, 0x093C);
        if (r.percent(40)) put(&s, r.in(0x093E, 0x094C));
        if (r.percent(10)) put(&s, 0x094D);
      }
    } else {  // Thai, whose vowel and tone marks carry classes 103 and 107
      for (size_t k = 1 + r.below(6); k > 0; --k) {
        put(&s, r.in(0x0E01, 0x0E2E));
        if (r.percent(30)) put(&s, r.pick({0x0E31u, 0x0E34u, 0x0E38u, 0x0E39u, 0x0E47u, 0x0E48u, 0x0E49u}));
        if (r.percent(15)) put(&s, r.in(0x0E48, 0x0E4B));
      }
    }
    s += r.percent(20) ? "। " : " ";
  }
  return s;
}

std::string emoji(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(10);
  for (size_t i = 0; i < n; ++i) {
    switch (r.below(6)) {
      case 0: s += r.pick(kZwjSequences); break;
      case 1:
        put(&s, r.in(0x1F600, 0x1F64F));
        if (r.percent(40)) put(&s, r.in(0x1F3FB, 0x1F3FF));
        break;
      case 2: put(&s, r.in(0x1F300, 0x1F5FF)); break;
      case 3:
        put(&s, r.in(0x2600, 0x26FF));
        if (r.percent(50)) put(&s, 0xFE0F);
        break;
      case 4:  // a random ZWJ chain
        for (size_t k = 2 + r.below(3); k > 0; --k) {
          put(&s, r.in(0x1F600, 0x1F64F));
          if (k > 1) put(&s, 0x200D);
        }
        break;
      default:
        put(&s, r.in(0x1F1E6, 0x1F1FF));
        put(&s, r.in(0x1F1E6, 0x1F1FF));
        break;
    }
    if (r.percent(40)) s += r.percent(50) ? " " : std::string(r.pick(kWords));
  }
  return s;
}

std::string code(Rng& r) {
  std::string s(r.pick(kCode));
  if (r.percent(30)) {  // re-indent: tabs, or another width of spaces
    std::string out;
    const std::string indent = r.percent(50) ? "\t" : std::string(1 + r.below(8), ' ');
    bool line_start = true;
    for (size_t i = 0; i < s.size(); ++i) {
      if (line_start && s.compare(i, 2, "  ") == 0) {
        out += indent;
        ++i;
        continue;
      }
      line_start = s[i] == '\n' || (line_start && (s[i] == ' ' || s[i] == '\t'));
      out += s[i];
    }
    s = out;
  }
  if (r.percent(25)) s.append("\n").append(r.pick(kCode));
  if (r.percent(20)) s = std::string(r.below(3), '\n').append("```\n").append(s).append("```");
  return s;
}

std::string whitespace(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(8);
  for (size_t i = 0; i < n; ++i) {
    const size_t run = r.percent(10) ? 1 + r.below(300) : 1 + r.below(12);
    const bool mixed = r.percent(50);
    const uint32_t one = r.pick(kSpaces);
    for (size_t k = 0; k < run; ++k) {
      if (mixed && r.percent(20)) {
        s += "\r\n";
      } else {
        put(&s, mixed ? r.pick(kSpaces) : one);
      }
    }
    if (r.percent(80)) s += r.percent(70) ? std::string(r.pick(kWords)) : std::string(r.pick(kPunct));
  }
  return s;
}

std::string numbers(Rng& r) {
  std::string s;
  const size_t n = 1 + r.below(8);
  for (size_t i = 0; i < n; ++i) {
    switch (r.below(9)) {
      case 0:
        for (size_t k = 1 + r.below(20); k > 0; --k) s += char('0' + r.below(10));
        break;
      case 1: s.append(std::to_string(r.below(1000000))).append(".").append(std::to_string(r.below(10000))); break;
      case 2:
        s.append("-")
            .append(std::to_string(r.below(100000)))
            .append(",")
            .append(std::to_string(100 + r.below(900)))
            .append(",000");
        break;
      case 3:
        s.append(std::to_string(r.below(10))).append(".").append(std::to_string(r.below(100)));
        s.append("e-").append(std::to_string(r.below(300)));
        break;
      case 4:
        s.append("20").append(std::to_string(10 + r.below(20))).append("-0").append(std::to_string(1 + r.below(9)));
        s.append("-1").append(std::to_string(r.below(10)));
        break;
      case 5: s += r.percent(50) ? "$1,234.56" : r.percent(50) ? "€99,90" : "¥1000"; break;
      case 6: {
        const uint32_t zero = r.pick({0x0660u, 0x0966u, 0xFF10u, 0x09E6u, 0x0E50u});  // digit zeros of five scripts
        for (size_t k = 1 + r.below(6); k > 0; --k) put(&s, zero + uint32_t(r.below(10)));
        break;
      }
      case 7: put(&s, r.pick({0xB2u, 0xB3u, 0xB9u, 0xBDu, 0xBCu, 0x2153u, 0x216Bu, 0x2460u, 0x2070u})); break;
      default:
        s.append("abc").append(std::to_string(r.below(100000))).append("def0x");
        s.append(std::to_string(r.below(0xFFFF)));
        break;
    }
    s += r.percent(50) ? " " : r.percent(50) ? "" : std::string(r.pick(kPunct));
  }
  return s;
}

std::string contractions(Rng& r) {
  std::string s;
  for (size_t i = 1 + r.below(10); i > 0; --i) {
    s += r.percent(60) ? r.pick(kContractions) : r.pick(kWords);
    s += r.percent(70) ? " " : r.percent(50) ? "" : "\n";
  }
  return s;
}

std::string specials(Rng& r) {
  if (r.percent(30)) {
    // Appends chained in one expression are sequenced left to right (C++17), so the draws happen in order.
    std::string s = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n";
    s.append(english(r)).append("<|im_end|>\n<|im_start|>assistant\n<think>\n").append(english(r));
    s.append("\n</think>\n\n").append(cjk(r)).append("<|im_end|>");
    return s;
  }
  std::string s;
  for (size_t i = 1 + r.below(6); i > 0; --i) {
    if (r.percent(50)) s += utf8_prefix(english(r), 1 + r.below(40));
    if (r.percent(20)) s += " ";
    s += r.pick(kSpecials);
    if (r.percent(20)) s += "\n";
  }
  return s;
}

// Valid but unusual: combining marks in any order, decomposed Hangul, singletons and exclusions, noncharacters,
// private use, BOM, joiners, controls, variation selectors.
std::string unusual(Rng& r) {
  std::string s;
  for (size_t i = 1 + r.below(6); i > 0; --i) {
    switch (r.below(7)) {
      case 0:  // base + marks, random order: Combining Diacritical Marks, and some of other blocks assigned before
               // and after Unicode 9.0 (Hugging Face's NFC knows 9.0: a later mark is a starter to it)
        put(&s, r.percent(70) ? r.in('a', 'z') : r.in(0xC0, 0xD6));
        for (size_t m = 1 + r.below(r.percent(10) ? 12 : 3); m > 0; --m) {
          put(&s, r.percent(80) ? r.in(0x0300, 0x034E)
                                : r.pick({0x1DF5u, 0x1DF6u, 0x1DF9u, 0x1DFBu, 0x08D3u, 0x08D4u, 0x08E1u, 0x1AC1u,
                                          0x1ACEu, 0x0898u, 0x1E944u, 0x1E94Au, 0x0C3Cu, 0x1E130u}));
        }
        break;
      case 1:  // conjoining jamo: L V (T)
        put(&s, r.in(0x1100, 0x1112));
        put(&s, r.in(0x1161, 0x1175));
        if (r.percent(50)) put(&s, r.in(0x11A8, 0x11C2));
        break;
      case 2:
        put(&s, r.pick({0x212Bu, 0x2126u, 0x212Au, 0x0340u, 0x0341u, 0x0343u, 0x0344u, 0x0374u, 0x037Eu, 0x0387u,
                        0x1F71u, 0x0958u, 0xFB1Du, 0xFB2Au, 0x2ADCu, 0x1D15Eu, 0xF900u, 0x2F800u}));
        break;
      case 3:
        put(&s, r.pick({0xFDD0u, 0xFDEFu, 0xFFFEu, 0xFFFFu, 0x1FFFEu, 0x10FFFFu, 0xE000u, 0xF8FFu, 0xF0000u, 0xFFFDu,
                        0xFEFFu, 0x200Bu, 0x200Cu, 0x200Du, 0x2060u,  0xADu,     0xFE0Fu, 0xFE00u, 0xE0041u, 0xD7FFu}));
        break;
      case 4: put(&s, r.percent(50) ? r.in(1, 0x1F) : r.in(0x7F, 0x9F)); break;
      case 5:
        s += r.pick({"Tiếng Việt", "Tie\u0302\u0301ng Vie\u0323\u0302t", "ῼ", "ᾼ", "Å", "A\u030A", "ﬃ", "ǅ", "ΐ", "ϓ",
                     "\U00011935\U00011930" /* composes to U+11938 since Unicode 13 */});
        break;
      default: s += r.pick(kWords); break;
    }
    if (r.percent(30)) s += " ";
  }
  return s;
}

// Random code points from assigned ranges of many scripts.
std::string soup(Rng& r) {
  static constexpr uint32_t kRanges[][2] = {
      {0x20, 0x7E},     {0xA0, 0xFF},     {0x100, 0x17F},   {0x391, 0x3A9},   {0x3B1, 0x3C9},   {0x400, 0x4FF},
      {0x5D0, 0x5EA},   {0x621, 0x63A},   {0x64B, 0x652},   {0x905, 0x939},   {0x300, 0x36F},   {0x4E00, 0x9FA5},
      {0x3041, 0x3093}, {0xAC00, 0xD7A3}, {0x1100, 0x1112}, {0x1161, 0x1175}, {0x11A8, 0x11C2}, {0x1F600, 0x1F64F},
      {0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x2500, 0x257F}, {0x2010, 0x2027}, {0x2030, 0x205E}, {0x9, 0xD}};
  std::string s;
  for (size_t i = 1 + r.below(60); i > 0; --i) {
    const auto& range = kRanges[r.below(std::size(kRanges))];
    put(&s, r.in(range[0], range[1]));
  }
  return s;
}

// ---- curated ----------------------------------------------------------------------------------------------

// The text llama.cpp's converter tokenizes to fingerprint a pre-tokenizer.
constexpr std::string_view kLlamaCppCheckText =
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n"
    "🚀 (normal) 😶\u200D🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 "
    "3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ```````\"\"\"\"......!!!!!!?????? "
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, "
    "'D you like some tea? We'Ve a'lL";

std::vector<std::string> curated() {
  std::vector<std::string> c = {
      "",
      " ",
      "  ",
      "\n",
      "\n\n",
      "\t",
      "\r\n",
      "a",
      "'",
      "'s",
      "''",
      "Hello world",
      " Hello world",
      "Hello world ",
      "hello   world",
      "Hello,\nworld!",
      "a\u00A0b",
      "a\u00A0\u00A0b",
      "a\u3000b",
      "a\u2028b",
      "a\u0085b",
      "a\u0085 b",
      "\u0085\u0085",
      " \u0085",
      "x\x0By",
      "x\x0Cy",
      "e\u0301",
      "\u00E9",
      "\u212B",
      "A\u030A",
      "\u1100\u1161\u11A8",
      "\uAC00\u11A8",
      "a\u0323\u0307",
      "a\u0307\u0323",
      "\u1E0B\u0323",
      "q\u0307\u0323",
      "\u0958",
      "\u0915\u093C",
      "it'\u017F",
      "IT'S",
      "it'S",
      "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
      std::string(kLlamaCppCheckText),
      "1",
      "12",
      "123",
      "1234",
      "12345",
      "1234567890123",
      "3.14159",
      "1,000,000",
      "-42",
      "0x7FFF",
      "٣٤٥",
      "１２３",
      "²³",
      "<|im_start|>",
      "<|im_end|>",
      "<|endoftext|>",
      "<think>",
      "</think>",
      "<|im_start|>user\nhi<|im_end|>",
      "x<|im_end|>y",
      " <|im_start|> ",
      "<|im_start|><|im_end|>",
      "<<|im_start|>>",
      "<|im_start|",
      "|im_start|>",
      "<|IM_START|>",
      "<think></think>",
      "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
      "<|begin_of_text|>hi<|eot_id|>",
      "😀",
      "👨‍👩‍👧‍👦",
      "🏳️‍🌈",
      "🇺🇸🇯🇵",
      "1️⃣",
      "👍🏽",
      "\u200D",
      "\u200D\u200D",
      "a\u200Db",
      "\uFEFF",
      "\uFEFFhello",
      "\uFFFD",
      "\uFFFF",
      "\U0010FFFF",
      "\uE000",
      "\U000F0000",
      "\uFDD0",
      "\u00AD",
      "\uD7FF",
      "\x7F",
      "\u0080",
      "\u009F",
      "\x01\x02\x03",
      "a\x1B[31mred\x1B[0m",
      "مرحبا بالعالم",
      "שָׁלוֹם",
      "السَّلَامُ عَلَيْكُمْ",
      "नमस्ते दुनिया",
      "สวัสดีครับ",
      "Привет, мир!",
      "Γειά σου Κόσμε",
      "こんにちは",
      "안녕하세요",
      "你好世界",
      "Tiếng Việt",
      "Zalgo: Z̴̡̢̛̙̗͎̠a̷̧̛͚̞̣l̸̢̨̛̟g̵̢̛̪̈́ö̶̡̢̝́",
      repeat(" ", 1000),
      repeat("\n", 500),
      repeat("\t", 300),
      std::string("a").append(repeat(" ", 500)).append("b"),
      repeat("\r\n", 200),
      repeat(" \n", 300),
      repeat("ab", 2000),
      repeat("😀", 300),
      repeat("中", 1000),
      repeat("'s", 500),
      repeat("9", 1000),
      repeat("é", 500),
      repeat("e\u0301", 300),
      repeat("!", 777),
      repeat("<|im_end|>", 50),
      repeat("Hello world. ", 200)};
  c.push_back(std::string("a\0b", 3));
  c.push_back(std::string("\0", 1));
  return c;
}

}  // namespace

std::vector<std::string> tokenizer_corpus(uint64_t seed, size_t count) {
  std::vector<std::string> out = curated();
  const std::function<std::string(Rng&)> categories[] = {english,    cjk,     rtl,          indic,    emoji,   code,
                                                         whitespace, numbers, contractions, specials, unusual, soup};
  Rng rng(seed);
  for (size_t i = 0; out.size() < count; ++i) {
    const size_t category = i % (std::size(categories) + 1);
    if (category < std::size(categories)) {
      out.push_back(categories[category](rng));
      continue;
    }
    std::string mixed;  // fragments of several categories back to back
    for (size_t k = 2 + rng.below(4); k > 0; --k) mixed += categories[rng.below(std::size(categories))](rng);
    out.push_back(std::move(mixed));
  }
  return out;
}

}  // namespace magnetar::testing
