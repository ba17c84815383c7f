// Internal to chat/: the tokens and syntax tree of a Jinja template, shared by the lexer (jinja_lex.cpp),
// the parser (jinja_parse.cpp) and the interpreter (jinja_eval.cpp). Nodes carry `pos`, the byte offset
// of their first character in the original source, so that every error can name a line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace magnetar::chat::jinja {

// ---------------------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------------------

enum class Tok {
  kText,          // literal text between tags
  kNumber,        // 12, 1.5, -3 (a sign in unary position is folded into the literal)
  kString,        // 'abc' or "abc", escapes resolved
  kIdent,         // names and keywords alike (if, in, not, true, ...)
  kEquals,        // =
  kOpenParen,     // (
  kCloseParen,    // )
  kOpenStmt,      // {%  (and {%-)
  kCloseStmt,     // %}  (and -%})
  kOpenExpr,      // {{
  kCloseExpr,     // }}
  kOpenBracket,   // [
  kCloseBracket,  // ]
  kOpenBrace,     // {
  kCloseBrace,    // }
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // + - not followed by a number, in unary position
  kComment,         // {# ... #}
};

struct Token {
  Tok type;
  std::string value;
  uint32_t pos;  // byte offset in the original source
};

// "line:column" (1-based, column in code points) of byte offset `pos` in `source`.
std::string source_location(std::string_view source, uint32_t pos);

// Applies the reference's preprocessing (drop one trailing newline, lstrip_blocks, trim_blocks, remove
// {% generation %} tags) and splits the result into tokens; token positions point into `source`.
Result<std::vector<Token>> tokenize(std::string_view source);

// ---------------------------------------------------------------------------------------------------------
// Syntax tree
// ---------------------------------------------------------------------------------------------------------

enum class ExprKind {
  kInt,       // i
  kFloat,     // f
  kString,    // name holds the text
  kIdent,     // name
  kArray,     // items
  kTuple,     // items
  kObject,    // items: key0, value0, key1, value1, ...
  kMember,    // a[b] (computed) or a.name / a.0; b is the property, a kSlice for a[x:y:z]
  kSlice,     // a, b, c: start, stop, step (each may be null)
  kCall,      // a(items...)
  kUnary,     // op a
  kBinary,    // a op b
  kFilter,    // a | name(items...) (called: written with parentheses)
  kTest,      // a is [not] name
  kSelect,    // a if b (no else: undefined when b is false)
  kTernary,   // a if b else c
  kKwarg,     // name = a (in call arguments and macro parameters)
  kSpread,    // *a
  kKwSpread,  // **a
};

enum class Op {
  kNone,
  kAnd,
  kOr,
  kNot,
  kEq,
  kNe,
  kLt,
  kGt,
  kLe,
  kGe,
  kIn,
  kNotIn,
  kAdd,
  kSub,
  kConcat,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kNeg,
  kPos,
};

struct Expr {
  ExprKind kind;
  uint32_t pos = 0;
  Op op = Op::kNone;
  std::string name;
  int64_t i = 0;
  double f = 0;
  bool computed = false;  // kMember: written with [ ]
  bool called = false;    // kFilter: written with ( )
  bool negate = false;    // kTest: `is not`
  std::unique_ptr<Expr> a, b, c;
  std::vector<std::unique_ptr<Expr>> items;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // expr, body, alt
  kFor,          // target, expr (iterable, possibly a kSelect), body, alt (else)
  kSet,          // target, expr or body (block set)
  kMacro,        // name, params, body
  kCallBlock,    // expr (the call), params (caller's), body
  kFilterBlock,  // expr (a kFilter with a null operand), body
  kBreak,
  kContinue,
};

struct Stmt {
  StmtKind kind;
  uint32_t pos = 0;
  std::string text;  // kText; kMacro: the name
  ExprPtr expr, target;
  std::vector<std::unique_ptr<Stmt>> body, alt;
  std::vector<ExprPtr> params;                     // kIdent or kKwarg (with default)
  bool uses_varargs = false, uses_kwargs = false;  // kMacro, kCallBlock: the body reads them
};
using StmtPtr = std::unique_ptr<Stmt>;

struct Program {
  std::string source;
  std::vector<StmtPtr> body;
};

// Limits against hostile templates (the template is read from an untrusted GGUF).
constexpr int kMaxParseDepth = 200;  // nested expressions and blocks while parsing

// Counts one level of recursion for as long as it lives (the parser and the evaluator check the count against
// their limits).
class DepthGuard {
 public:
  explicit DepthGuard(int* d) : d_(d) { ++*d_; }
  ~DepthGuard() { --*d_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int* d_;
};

// An operator chain (a + b + c ..., a.b.c ..., a | f | g ...) is parsed by a loop but nests its tree one level per
// link: each link counts as a level of depth while the chain is parsed, so that freeing or walking the tree cannot
// overflow the stack either.
class ChainGuard {
 public:
  explicit ChainGuard(int* d) : d_(d) {}
  ~ChainGuard() { *d_ -= n_; }
  ChainGuard(const ChainGuard&) = delete;
  ChainGuard& operator=(const ChainGuard&) = delete;
  bool link() {  // false: too deep
    ++*d_;
    ++n_;
    return *d_ <= kMaxParseDepth;
  }

 private:
  int* d_;
  int n_ = 0;
};

Result<std::unique_ptr<Program>> parse_program(std::string_view source);

}  // namespace magnetar::chat::jinja
