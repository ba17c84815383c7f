// The lexer: the reference's preprocessing (trailing newline, lstrip_blocks, trim_blocks, {% generation %})
// as a sequence of byte deletions that remember where each kept byte came from, then tokenization with
// whitespace control ({%- -%} {{- -}} {#- -#}), as Python jinja2 does with transformers' trim_blocks and
// lstrip_blocks.
#include <cstring>

#include "chat/jinja_ast.h"
#include "chat/jinja_text.h"

namespace magnetar::chat::jinja {

std::string source_location(std::string_view source, uint32_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < source.size() && i < pos;) {
    if (source[i] == '\n') {
      ++line, col = 1, ++i;
    } else {
      decode_utf8(source, &i);
      ++col;
    }
  }
  return std::to_string(line) + ":" + std::to_string(col);
}

namespace {

// ---------------------------------------------------------------------------------------------------------
// Preprocessing: text plus, per byte, its offset in the original source
// ---------------------------------------------------------------------------------------------------------

struct Mapped {
  std::string s;
  std::vector<uint32_t> origin;
  void keep(const Mapped& from, size_t i) {
    s.push_back(from.s[i]);
    origin.push_back(from.origin[i]);
  }
};

bool is_line_terminator_end(std::string_view s, size_t i, size_t* after) {
  if (s[i] == '\n' || s[i] == '\r') return *after = i + 1, true;
  if (i + 2 < s.size() && uint8_t(s[i]) == 0xE2 && uint8_t(s[i + 1]) == 0x80 &&
      (uint8_t(s[i + 2]) == 0xA8 || uint8_t(s[i + 2]) == 0xA9)) {
    return *after = i + 3, true;
  }
  return false;
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1" (JS `^` also matches after \r, U+2028, U+2029).
Mapped lstrip_blocks(const Mapped& in) {
  Mapped out;
  const std::string_view s = in.s;
  size_t line_start = 0;
  for (size_t i = 0; i < s.size();) {
    if (i == line_start) {
      size_t j = i;
      while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
      if (j + 1 < s.size() && s[j] == '{' && std::strchr("#%-", s[j + 1]) && s[j + 1] != '\0') i = j;
    }
    size_t after = 0;
    if (is_line_terminator_end(s, i, &after)) {
      for (; i < after; ++i) out.keep(in, i);
      line_start = after;
    } else {
      out.keep(in, i++);
    }
  }
  return out;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
Mapped trim_blocks(const Mapped& in) {
  Mapped out;
  const std::string_view s = in.s;
  for (size_t i = 0; i < s.size();) {
    if (i + 2 < s.size() && (s[i] == '#' || s[i] == '%' || s[i] == '-') && s[i + 1] == '}' && s[i + 2] == '\n') {
      out.keep(in, i);
      out.keep(in, i + 1);
      i += 3;
    } else {
      out.keep(in, i++);
    }
  }
  return out;
}

size_t skip_spaces(std::string_view s, size_t i) {
  while (size_t n = js_space_len(s, i)) i += n;
  return i;
}

// transformers' {% generation %} / {% endgeneration %} markers are removed:
// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : $1) + (rstrip ? "" : $4).
Mapped strip_generation(const Mapped& in) {
  Mapped out;
  const std::string_view s = in.s;
  size_t run_start = 0;  // start of the whitespace run that ends at i (== i when none)
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '%') {
      size_t q = i + 2;
      const bool lstrip = q < s.size() && s[q] == '-';
      if (lstrip) ++q;
      q = skip_spaces(s, q);
      if (s.substr(q, 3) == "end") q += 3;
      if (s.substr(q, 10) == "generation") {
        q = skip_spaces(s, q + 10);
        const bool rstrip = q < s.size() && s[q] == '-';
        if (rstrip) ++q;
        if (s.substr(q, 2) == "%}") {
          q += 2;
          const size_t after_end = skip_spaces(s, q);
          // The whitespace run before the tag was already copied; drop it again when lstrip.
          if (lstrip) {
            const size_t n = i - run_start;
            out.s.resize(out.s.size() - n);
            out.origin.resize(out.origin.size() - n);
          }
          if (!rstrip) {
            for (size_t k = q; k < after_end; ++k) out.keep(in, k);
          }
          i = run_start = after_end;
          continue;
        }
      }
    }
    if (size_t n = js_space_len(s, i)) {
      for (size_t k = 0; k < n; ++k) out.keep(in, i + k);
      i += n;
    } else {
      out.keep(in, i++);
      run_start = i;
    }
  }
  return out;
}

Mapped preprocess(std::string_view source) {
  Mapped m;
  m.s.assign(source);
  m.origin.resize(source.size());
  for (size_t i = 0; i < source.size(); ++i) m.origin[i] = uint32_t(i);
  if (!m.s.empty() && m.s.back() == '\n') {
    m.s.pop_back();
    m.origin.pop_back();
  }
  return strip_generation(trim_blocks(lstrip_blocks(m)));
}

// ---------------------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------------------

struct Lexer {
  std::string_view source;  // original, for error positions
  Mapped src;
  size_t cur = 0;
  std::vector<Token> tokens;

  uint32_t origin(size_t i) const {
    if (i < src.origin.size()) return src.origin[i];
    return uint32_t(source.size());
  }
  Status error(size_t at, const std::string& msg) const {
    return Status::error("chat template " + source_location(source, origin(at)) + ": " + msg);
  }
  char at(size_t i) const { return i < src.s.size() ? src.s[i] : '\0'; }
  bool starts(std::string_view p) const { return std::string_view(src.s).substr(cur, p.size()) == p; }
  void push(Tok t, std::string v, size_t start) { tokens.push_back(Token{t, std::move(v), origin(start)}); }

  void strip_trailing_whitespace() {
    if (!tokens.empty() && tokens.back().type == Tok::kText) {
      tokens.back().value = std::string(js_trim_end(tokens.back().value));
      if (tokens.back().value.empty()) tokens.pop_back();
    }
  }
  void skip_leading_whitespace() { cur = skip_spaces(src.s, cur); }

  // A quoted string's body; escapes as the reference's, plus unknown escapes kept verbatim (Python's way).
  Status string_literal(char quote, std::string* out) {
    const size_t start = cur - 1;
    while (true) {
      if (cur >= src.s.size()) return error(start, "unterminated string literal");
      const char c = src.s[cur];
      if (c == quote) {
        ++cur;
        return Status();
      }
      if (c != '\\') {
        out->push_back(c);
        ++cur;
        continue;
      }
      if (cur + 1 >= src.s.size()) return error(start, "unterminated string literal");
      const char e = src.s[cur + 1];
      cur += 2;
      switch (e) {
        case 'n': *out += '\n'; break;
        case 't': *out += '\t'; break;
        case 'r': *out += '\r'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'v': *out += '\v'; break;
        case '\'': *out += '\''; break;
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case 'x':
        case 'u': {
          const size_t len = e == 'x' ? 2 : 4;
          const std::string hex = src.s.substr(cur, len);
          if (hex.size() != len || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
            return error(cur - 2, "invalid escape sequence \\" + std::string(1, e) + hex);
          }
          cur += len;
          uint32_t u = uint32_t(std::stoul(hex, nullptr, 16));
          // A \uD83D\uDE00 surrogate pair is one code point; a lone surrogate cannot be UTF-8.
          if (u >= 0xD800 && u <= 0xDBFF && src.s.substr(cur, 2) == "\\u") {
            const std::string lo = src.s.substr(cur + 2, 4);
            if (lo.size() == 4 && lo.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
              const uint32_t l = uint32_t(std::stoul(lo, nullptr, 16));
              if (l >= 0xDC00 && l <= 0xDFFF) {
                u = 0x10000 + ((u - 0xD800) << 10) + (l - 0xDC00);
                cur += 6;
              }
            }
          }
          append_utf8(u >= 0xD800 && u <= 0xDFFF ? kReplacementChar : u, out);
          break;
        }
        default: *out += '\\'; *out += e;
      }
    }
  }

  std::string digits() {
    std::string d;
    while (cur < src.s.size() && src.s[cur] >= '0' && src.s[cur] <= '9') d += src.s[cur++];
    return d;
  }

  // The exponent of a float literal after its digits (1e-7, 2.5E+3), or "" when none follows.
  std::string exponent() {
    const char e = at(cur);
    if (e != 'e' && e != 'E') return "";
    const size_t sign = at(cur + 1) == '+' || at(cur + 1) == '-' ? 1 : 0;
    const char d = at(cur + 1 + sign);
    if (d < '0' || d > '9') return "";
    std::string out(src.s, cur, 1 + sign);
    cur += 1 + sign;
    return out + digits();
  }

  // {% raw %}...{% endraw %} (not in the reference; Python Jinja has it): the body becomes one text token.
  // Returns false when the tag at `cur` is not a raw tag.
  Result<bool> raw_block() {
    size_t q = cur + 2;
    const bool lstrip = at(q) == '-';
    if (lstrip) ++q;
    q = skip_spaces(src.s, q);
    if (std::string_view(src.s).substr(q, 3) != "raw") return false;
    q = skip_spaces(src.s, q + 3);
    const bool rstrip = at(q) == '-';
    if (rstrip) ++q;
    if (std::string_view(src.s).substr(q, 2) != "%}") return false;
    const size_t open = cur;
    size_t body = q + 2;
    if (lstrip) strip_trailing_whitespace();
    if (rstrip) body = skip_spaces(src.s, body);
    for (size_t p = src.s.find("{%", body); p != std::string::npos; p = src.s.find("{%", p + 2)) {
      size_t e = p + 2;
      const bool end_lstrip = at(e) == '-';
      if (end_lstrip) ++e;
      e = skip_spaces(src.s, e);
      if (std::string_view(src.s).substr(e, 6) != "endraw") continue;
      e = skip_spaces(src.s, e + 6);
      const bool end_rstrip = at(e) == '-';
      if (end_rstrip) ++e;
      if (std::string_view(src.s).substr(e, 2) != "%}") continue;
      std::string text = src.s.substr(body, p - body);
      if (end_lstrip) text = std::string(js_trim_end(text));
      if (!text.empty()) push(Tok::kText, text, body);
      push(Tok::kComment, "", p);  // lets the text that follows lex as text
      cur = e + 2;
      if (end_rstrip) skip_leading_whitespace();
      return true;
    }
    return error(open, "{% raw %} without {% endraw %}");
  }

  Status run();
};

struct Fixed {
  const char* seq;
  Tok type;
};
// Order matters: longer sequences first where one is a prefix of another.
constexpr Fixed kFixed[] = {
    {"{%", Tok::kOpenStmt},      {"%}", Tok::kCloseStmt},
    {"{{", Tok::kOpenExpr},      {"}}", Tok::kCloseExpr},
    {"(", Tok::kOpenParen},      {")", Tok::kCloseParen},
    {"{", Tok::kOpenBrace},      {"}", Tok::kCloseBrace},
    {"[", Tok::kOpenBracket},    {"]", Tok::kCloseBracket},
    {",", Tok::kComma},          {".", Tok::kDot},
    {":", Tok::kColon},          {"|", Tok::kPipe},
    {"<=", Tok::kComparison},    {">=", Tok::kComparison},
    {"==", Tok::kComparison},    {"!=", Tok::kComparison},
    {"<", Tok::kComparison},     {">", Tok::kComparison},
    {"+", Tok::kAdditive},       {"-", Tok::kAdditive},
    {"~", Tok::kAdditive},       {"**", Tok::kPower},
    {"*", Tok::kMultiplicative}, {"//", Tok::kMultiplicative},
    {"/", Tok::kMultiplicative}, {"%", Tok::kMultiplicative},
    {"=", Tok::kEquals},
};

bool is_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

Status Lexer::run() {
  int brace_depth = 0;
  const size_t n = src.s.size();
  while (cur < n) {
    const Tok* last = tokens.empty() ? nullptr : &tokens.back().type;
    if (!last || *last == Tok::kCloseStmt || *last == Tok::kCloseExpr || *last == Tok::kComment) {
      const size_t start = cur;
      while (cur < n && !(src.s[cur] == '{' && (at(cur + 1) == '%' || at(cur + 1) == '{' || at(cur + 1) == '#'))) ++cur;
      if (cur > start) {
        push(Tok::kText, src.s.substr(start, cur - start), start);
        continue;
      }
    }
    if (starts("{#")) {
      const size_t start = cur;
      cur += 2;
      const bool strip_before = at(cur) == '-';
      if (strip_before) ++cur;
      const size_t end = src.s.find("#}", cur);
      if (end == std::string::npos) return error(start, "comment {# without #}");
      std::string comment = src.s.substr(cur, end - cur);
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_before) strip_trailing_whitespace();
      push(Tok::kComment, "", start);
      cur = end + 2;
      if (strip_after) skip_leading_whitespace();
      continue;
    }
    if (starts("{%")) {
      Result<bool> raw = raw_block();
      if (!raw.ok()) return raw.status();
      if (*raw) continue;
    }
    if (starts("{%-")) {
      strip_trailing_whitespace();
      push(Tok::kOpenStmt, "{%", cur);
      cur += 3;
      continue;
    }
    if (starts("{{-")) {
      strip_trailing_whitespace();
      push(Tok::kOpenExpr, "{{", cur);
      brace_depth = 0;
      cur += 3;
      continue;
    }
    skip_leading_whitespace();
    if (cur >= n) break;
    if (starts("-%}")) {
      push(Tok::kCloseStmt, "%}", cur);
      cur += 3;
      skip_leading_whitespace();
      continue;
    }
    if (starts("-}}")) {
      push(Tok::kCloseExpr, "}}", cur);
      cur += 3;
      skip_leading_whitespace();
      continue;
    }
    const char c = src.s[cur];
    if (c == '-' || c == '+') {
      last = tokens.empty() ? nullptr : &tokens.back().type;
      if (!last || *last == Tok::kText) return error(cur, std::string("unexpected character '") + c + "'");
      const bool binary = *last == Tok::kIdent || *last == Tok::kNumber || *last == Tok::kString ||
                          *last == Tok::kCloseParen || *last == Tok::kCloseBracket;
      if (!binary) {
        const size_t start = cur++;
        std::string num = digits();
        if (!num.empty() && at(cur) == '.' && is_digit(at(cur + 1))) {
          ++cur;
          num += "." + digits();
        }
        if (!num.empty()) num += exponent();
        push(num.empty() ? Tok::kUnary : Tok::kNumber, std::string(1, c) + num, start);
        continue;
      }
    }
    bool matched = false;
    for (const Fixed& f : kFixed) {
      if (f.type == Tok::kCloseExpr && brace_depth > 0) continue;  // `}}` closing nested object literals
      if (!starts(f.seq)) continue;
      push(f.type, f.seq, cur);
      if (f.type == Tok::kOpenExpr) brace_depth = 0;
      if (f.type == Tok::kOpenBrace) ++brace_depth;
      if (f.type == Tok::kCloseBrace) --brace_depth;
      cur += std::strlen(f.seq);
      matched = true;
      break;
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      const size_t start = cur++;
      std::string value;
      MAGNETAR_RETURN_IF_ERROR(string_literal(c, &value));
      push(Tok::kString, std::move(value), start);
      continue;
    }
    if (is_digit(c)) {
      const size_t start = cur;
      std::string num = digits();
      if ((tokens.empty() || tokens.back().type != Tok::kDot) && at(cur) == '.' && is_digit(at(cur + 1))) {
        ++cur;
        num += "." + digits();
      }
      if (tokens.empty() || tokens.back().type != Tok::kDot) num += exponent();
      push(Tok::kNumber, std::move(num), start);
      continue;
    }
    if (is_word(c)) {
      const size_t start = cur;
      while (cur < n && is_word(src.s[cur])) ++cur;
      push(Tok::kIdent, src.s.substr(start, cur - start), start);
      continue;
    }
    size_t end = cur;
    decode_utf8(src.s, &end);
    return error(cur, "unexpected character '" + src.s.substr(cur, end - cur) + "'");
  }
  return Status();
}

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  Lexer lx;
  lx.source = source;
  lx.src = preprocess(source);
  MAGNETAR_RETURN_IF_ERROR(lx.run());
  return std::move(lx.tokens);
}

}  // namespace magnetar::chat::jinja
