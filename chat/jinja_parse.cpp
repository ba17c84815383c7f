// The parser: tokens to the syntax tree of jinja_ast.h (the parity test checks its results against Python jinja2,
// which transformers renders templates with); operator precedence, lowest first:
//   a if b else c | a if b (select) -> or -> and -> not -> comparisons and `in` (one level, left to right)
//   -> + - ~ -> * / // % -> ** -> `is` tests -> | filters -> unary + - -> calls, members, slices -> primary
// Nesting is bounded (kMaxParseDepth) so that a hostile template cannot overflow the stack.
#include <charconv>

#include "chat/jinja_ast.h"

namespace magnetar::chat::jinja {
namespace {

#define TRY(lhs, expr) MAGNETAR_ASSIGN_OR_RETURN(lhs, expr)

ExprPtr make_expr(ExprKind kind, uint32_t pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

Op binary_op(const std::string& s) {
  static const std::pair<const char*, Op> kOps[] = {
      {"and", Op::kAnd},  {"or", Op::kOr}, {"==", Op::kEq}, {"!=", Op::kNe},        {"<", Op::kLt},  {">", Op::kGt},
      {"<=", Op::kLe},    {">=", Op::kGe}, {"in", Op::kIn}, {"not in", Op::kNotIn}, {"+", Op::kAdd}, {"-", Op::kSub},
      {"~", Op::kConcat}, {"*", Op::kMul}, {"/", Op::kDiv}, {"//", Op::kFloorDiv},  {"%", Op::kMod}, {"**", Op::kPow},
  };
  for (const auto& [name, op] : kOps) {
    if (s == name) return op;
  }
  return Op::kNone;
}

bool mentions(const Expr* e, const char* name);
bool mentions(const Stmt& s, const char* name) {
  if (mentions(s.expr.get(), name) || mentions(s.target.get(), name)) return true;
  for (const auto& p : s.params) {
    if (mentions(p.get(), name)) return true;
  }
  for (const auto& c : s.body) {
    if (mentions(*c, name)) return true;
  }
  for (const auto& c : s.alt) {
    if (mentions(*c, name)) return true;
  }
  return false;
}
bool mentions(const Expr* e, const char* name) {
  if (!e) return false;
  if (e->kind == ExprKind::kIdent && e->name == name) return true;
  if (mentions(e->a.get(), name) || mentions(e->b.get(), name) || mentions(e->c.get(), name)) return true;
  for (const auto& i : e->items) {
    if (mentions(i.get(), name)) return true;
  }
  return false;
}

class Parser {
 public:
  Parser(std::string_view source, const std::vector<Token>& tokens) : source_(source), t_(tokens) {}

  Result<std::vector<StmtPtr>> program() {
    std::vector<StmtPtr> body;
    while (cur_ < t_.size()) {
      TRY(StmtPtr s, any());
      if (s) body.push_back(std::move(s));
    }
    return body;
  }

 private:
  uint32_t pos() const { return cur_ < t_.size() ? t_[cur_].pos : uint32_t(source_.size()); }
  Status error_at(uint32_t at, const std::string& msg) const {
    return Status::error("chat template " + source_location(source_, at) + ": " + msg);
  }
  Status error(const std::string& msg) const { return error_at(pos(), msg); }
  std::string describe() const {
    if (cur_ >= t_.size()) return "end of template";
    const Token& k = t_[cur_];
    if (k.type == Tok::kText) return "text";
    if (k.type == Tok::kString) return "string '" + k.value + "'";
    return "'" + k.value + "'";
  }
  Status too_deep() const { return error("template nested deeper than " + std::to_string(kMaxParseDepth) + " levels"); }

  bool is(Tok type, size_t ahead = 0) const { return cur_ + ahead < t_.size() && t_[cur_ + ahead].type == type; }
  bool is_ident(const char* name, size_t ahead = 0) const {
    return is(Tok::kIdent, ahead) && t_[cur_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(Tok::kOpenStmt) || !is(Tok::kIdent, 1)) return false;
    for (const char* n : names) {
      if (t_[cur_ + 1].value == n) return true;
    }
    return false;
  }
  Status expect(Tok type, const char* what) {
    if (!is(type)) return error(std::string("expected ") + what + ", got " + describe());
    ++cur_;
    return Status();
  }
  Status expect_end_tag(const char* name) {
    if (!is_statement({name})) return error(std::string("expected {% ") + name + " %}, got " + describe());
    cur_ += 2;
    return expect(Tok::kCloseStmt, "'%}'");
  }

  // Statements until one of `ends` opens; `opened` names the block for the end-of-template error.
  Result<std::vector<StmtPtr>> block(std::initializer_list<const char*> ends, const char* opened, uint32_t at) {
    std::vector<StmtPtr> body;
    while (!is_statement(ends)) {
      if (cur_ >= t_.size()) {
        return error(std::string("unexpected end of template: {% ") + opened + " %} at " +
                     source_location(source_, at) + " is not closed by {% end" + opened + " %}");
      }
      TRY(StmtPtr s, any());
      if (s) body.push_back(std::move(s));
    }
    return body;
  }

  Result<StmtPtr> any() {
    DepthGuard g(&depth_);
    if (depth_ > kMaxParseDepth) return too_deep();
    const Token& k = t_[cur_];
    switch (k.type) {
      case Tok::kComment: ++cur_; return StmtPtr();
      case Tok::kText: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->pos = k.pos;
        s->text = k.value;
        ++cur_;
        return s;
      }
      case Tok::kOpenStmt: return statement();
      case Tok::kOpenExpr: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->pos = k.pos;
        ++cur_;
        TRY(s->expr, expression());
        MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseExpr, "'}}'"));
        return s;
      }
      default: return error("unexpected " + describe() + " outside {{ }} and {% %}");
    }
  }

  Result<StmtPtr> statement() {
    const uint32_t at = pos();
    ++cur_;  // {%
    if (!is(Tok::kIdent)) return error("expected a statement name after {%, got " + describe());
    const std::string name = t_[cur_].value;
    ++cur_;
    auto s = std::make_unique<Stmt>();
    s->pos = at;
    if (name == "set") {
      s->kind = StmtKind::kSet;
      TRY(s->target, sequence(false));
      if (is(Tok::kEquals)) {
        ++cur_;
        TRY(s->expr, sequence(false));
      } else {
        MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'=' or '%}'"));
        TRY(s->body, block({"endset"}, "set", at));
        cur_ += 2;
      }
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
    } else if (name == "if") {
      MAGNETAR_RETURN_IF_ERROR(if_chain(s.get(), at));
      MAGNETAR_RETURN_IF_ERROR(expect_end_tag("endif"));
    } else if (name == "for") {
      s->kind = StmtKind::kFor;
      TRY(s->target, sequence(true));
      if (s->target->kind != ExprKind::kIdent && s->target->kind != ExprKind::kTuple) {
        return error_at(s->target->pos, "expected a name or a tuple of names after 'for'");
      }
      if (!is_ident("in")) return error("expected 'in' after the loop variable, got " + describe());
      ++cur_;
      TRY(s->expr, expression());
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
      TRY(s->body, block({"endfor", "else"}, "for", at));
      if (is_statement({"else"})) {
        cur_ += 2;
        MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
        TRY(s->alt, block({"endfor"}, "for", at));
      }
      MAGNETAR_RETURN_IF_ERROR(expect_end_tag("endfor"));
    } else if (name == "macro") {
      s->kind = StmtKind::kMacro;
      if (!is(Tok::kIdent)) return error("expected the macro's name, got " + describe());
      s->text = t_[cur_++].value;
      TRY(s->params, args(true));
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
      TRY(s->body, block({"endmacro"}, "macro", at));
      MAGNETAR_RETURN_IF_ERROR(expect_end_tag("endmacro"));
      mark_special_args(s.get());
    } else if (name == "call") {
      s->kind = StmtKind::kCallBlock;
      if (is(Tok::kOpenParen)) {
        TRY(s->params, args(true));
      }
      if (!is(Tok::kIdent)) return error("expected a macro name after 'call', got " + describe());
      auto call = make_expr(ExprKind::kCall, pos());
      call->a = make_expr(ExprKind::kIdent, pos());
      call->a->name = t_[cur_++].value;
      TRY(call->items, args(false));
      s->expr = std::move(call);
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
      TRY(s->body, block({"endcall"}, "call", at));
      MAGNETAR_RETURN_IF_ERROR(expect_end_tag("endcall"));
      mark_special_args(s.get());
    } else if (name == "filter") {
      s->kind = StmtKind::kFilterBlock;
      TRY(s->expr, filter_node(nullptr));
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
      TRY(s->body, block({"endfilter"}, "filter", at));
      MAGNETAR_RETURN_IF_ERROR(expect_end_tag("endfilter"));
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      return error_at(at, "unexpected {% " + name + " %}");
    } else {
      return error_at(t_[cur_ - 1].pos, "unknown statement '" + name + "'");
    }
    return s;
  }

  static void mark_special_args(Stmt* s) {
    for (const auto& c : s->body) {
      s->uses_varargs = s->uses_varargs || mentions(*c, "varargs");
      s->uses_kwargs = s->uses_kwargs || mentions(*c, "kwargs");
    }
  }

  // `if` or `elif` (after its name): test, body, then elif (a nested kIf in alt) or else.
  Status if_chain(Stmt* s, uint32_t at) {
    DepthGuard g(&depth_);  // each elif nests one level
    if (depth_ > kMaxParseDepth) return too_deep();
    s->kind = StmtKind::kIf;
    TRY(s->expr, expression());
    MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
    TRY(s->body, block({"elif", "else", "endif"}, "if", at));
    if (is_statement({"elif"})) {
      auto e = std::make_unique<Stmt>();
      e->pos = pos();
      cur_ += 2;
      MAGNETAR_RETURN_IF_ERROR(if_chain(e.get(), at));
      s->alt.push_back(std::move(e));
    } else if (is_statement({"else"})) {
      cur_ += 2;
      MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseStmt, "'%}'"));
      TRY(s->alt, block({"endif"}, "if", at));
    }
    return Status();
  }

  // `a, b, c` becomes a tuple; a single expression stays itself.
  Result<ExprPtr> sequence(bool primary_only) {
    const uint32_t at = pos();
    TRY(ExprPtr first, primary_only ? primary() : expression());
    if (!is(Tok::kComma)) return first;
    auto tuple = make_expr(ExprKind::kTuple, at);
    tuple->items.push_back(std::move(first));
    while (is(Tok::kComma)) {
      if (!primary_only && is(Tok::kCloseParen, 1)) break;  // (a, b,): the caller takes the comma
      ++cur_;
      TRY(ExprPtr next, primary_only ? primary() : expression());
      tuple->items.push_back(std::move(next));
    }
    return tuple;
  }

  Result<ExprPtr> expression() {
    DepthGuard g(&depth_);
    if (depth_ > kMaxParseDepth) return too_deep();
    return if_expression();
  }

  Result<ExprPtr> if_expression() {
    TRY(ExprPtr a, logical_or());
    if (!is_ident("if")) return a;
    const uint32_t at = pos();
    ++cur_;
    TRY(ExprPtr test, logical_or());
    if (is_ident("else")) {
      ++cur_;
      auto t = make_expr(ExprKind::kTernary, at);
      t->a = std::move(a);
      t->b = std::move(test);
      TRY(t->c, expression());
      return t;
    }
    auto s = make_expr(ExprKind::kSelect, at);
    s->a = std::move(a);
    s->b = std::move(test);
    return s;
  }

  Result<ExprPtr> binary(ExprPtr left, Op op, uint32_t at, ExprPtr right) {
    auto e = make_expr(ExprKind::kBinary, at);
    e->op = op;
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  Result<ExprPtr> logical_or() {
    TRY(ExprPtr left, logical_and());
    ChainGuard chain(&depth_);
    while (is_ident("or")) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      ++cur_;
      TRY(ExprPtr right, logical_and());
      TRY(left, binary(std::move(left), Op::kOr, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> logical_and() {
    TRY(ExprPtr left, logical_not());
    ChainGuard chain(&depth_);
    while (is_ident("and")) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      ++cur_;
      TRY(ExprPtr right, logical_not());
      TRY(left, binary(std::move(left), Op::kAnd, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> logical_not() {
    if (!is_ident("not")) return comparison();
    DepthGuard g(&depth_);
    if (depth_ > kMaxParseDepth) return too_deep();
    auto e = make_expr(ExprKind::kUnary, pos());
    e->op = Op::kNot;
    ++cur_;
    TRY(e->a, logical_not());
    return e;
  }

  Result<ExprPtr> comparison() {
    TRY(ExprPtr left, additive());
    ChainGuard chain(&depth_);
    while (true) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      Op op;
      if (is_ident("not") && is_ident("in", 1)) {
        op = Op::kNotIn;
        cur_ += 2;
      } else if (is_ident("in")) {
        op = Op::kIn;
        ++cur_;
      } else if (is(Tok::kComparison)) {
        op = binary_op(t_[cur_++].value);
      } else {
        break;
      }
      TRY(ExprPtr right, additive());
      TRY(left, binary(std::move(left), op, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> additive() {
    TRY(ExprPtr left, multiplicative());
    ChainGuard chain(&depth_);
    while (is(Tok::kAdditive)) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      const Op op = binary_op(t_[cur_++].value);
      TRY(ExprPtr right, multiplicative());
      TRY(left, binary(std::move(left), op, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> multiplicative() {
    TRY(ExprPtr left, power());
    ChainGuard chain(&depth_);
    while (is(Tok::kMultiplicative)) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      const Op op = binary_op(t_[cur_++].value);
      TRY(ExprPtr right, power());
      TRY(left, binary(std::move(left), op, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> power() {
    TRY(ExprPtr left, test());
    ChainGuard chain(&depth_);
    while (is(Tok::kPower)) {
      if (!chain.link()) return too_deep();
      const uint32_t at = pos();
      ++cur_;
      TRY(ExprPtr right, test());
      TRY(left, binary(std::move(left), Op::kPow, at, std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> test() {
    TRY(ExprPtr operand, filter());
    ChainGuard chain(&depth_);
    while (is_ident("is")) {
      if (!chain.link()) return too_deep();
      auto e = make_expr(ExprKind::kTest, pos());
      ++cur_;
      if (is_ident("not")) {
        e->negate = true;
        ++cur_;
      }
      if (!is(Tok::kIdent)) return error("expected a test name after 'is', got " + describe());
      e->name = t_[cur_++].value;
      e->a = std::move(operand);
      // An argument: `is divisibleby(3)`, or one primary without parentheses as Python Jinja reads it
      // (`is divisibleby 3`, `is sameas false`, `is in [1, 2]`).
      if (is(Tok::kOpenParen)) {
        TRY(e->items, args(false));
      } else if (is(Tok::kNumber) || is(Tok::kString) || is(Tok::kOpenBracket) || is(Tok::kOpenBrace) ||
                 (is(Tok::kIdent) && !is_ident("else") && !is_ident("or") && !is_ident("and") && !is_ident("if") &&
                  !is_ident("is") && !is_ident("in") && !is_ident("not"))) {
        TRY(ExprPtr p, primary());
        TRY(ExprPtr arg, postfix(std::move(p)));
        e->items.push_back(std::move(arg));
      }
      operand = std::move(e);
    }
    return operand;
  }

  // `name` or `name(args)` after a pipe (or after {% filter); `operand` may be null (filter blocks).
  Result<ExprPtr> filter_node(ExprPtr operand) {
    if (!is(Tok::kIdent)) return error("expected a filter name, got " + describe());
    auto f = make_expr(ExprKind::kFilter, pos());
    f->name = t_[cur_++].value;
    f->a = std::move(operand);
    if (is(Tok::kOpenParen)) {
      f->called = true;
      TRY(f->items, args(false));
    }
    return f;
  }

  Result<ExprPtr> filter() {
    TRY(ExprPtr operand, unary());
    ChainGuard chain(&depth_);
    while (is(Tok::kPipe)) {
      if (!chain.link()) return too_deep();
      ++cur_;
      TRY(operand, filter_node(std::move(operand)));
    }
    return operand;
  }

  Result<ExprPtr> unary() {
    if ((is(Tok::kUnary) || is(Tok::kAdditive)) && (t_[cur_].value == "-" || t_[cur_].value == "+")) {
      DepthGuard g(&depth_);
      if (depth_ > kMaxParseDepth) return too_deep();
      auto e = make_expr(ExprKind::kUnary, pos());
      e->op = t_[cur_++].value == "-" ? Op::kNeg : Op::kPos;
      TRY(e->a, unary());
      return e;
    }
    TRY(ExprPtr p, primary());
    return postfix(std::move(p));
  }

  // Members, slices and calls after a primary: a.b[c](d).e ...
  Result<ExprPtr> postfix(ExprPtr object) {
    ChainGuard chain(&depth_);
    while (true) {
      if (!chain.link()) return too_deep();
      if (is(Tok::kDot)) {
        ++cur_;
        auto m = make_expr(ExprKind::kMember, object->pos);
        m->a = std::move(object);
        if (is(Tok::kIdent)) {
          m->b = make_expr(ExprKind::kString, pos());
          m->b->name = t_[cur_++].value;
        } else if (is(Tok::kNumber) && t_[cur_].value.find_first_not_of("0123456789") == std::string::npos) {
          TRY(m->b, primary());
        } else {
          return error("expected a name or an integer after '.', got " + describe());
        }
        object = std::move(m);
      } else if (is(Tok::kOpenBracket)) {
        ++cur_;
        auto m = make_expr(ExprKind::kMember, object->pos);
        m->a = std::move(object);
        m->computed = true;
        TRY(m->b, subscript());
        MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseBracket, "']'"));
        object = std::move(m);
      } else if (is(Tok::kOpenParen)) {
        auto c = make_expr(ExprKind::kCall, object->pos);
        c->a = std::move(object);
        TRY(c->items, args(false));
        object = std::move(c);
      } else {
        return object;
      }
    }
  }

  // Inside [ ]: an index or a slice start:stop:step.
  Result<ExprPtr> subscript() {
    const uint32_t at = pos();
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    while (!is(Tok::kCloseBracket)) {
      if (cur_ >= t_.size()) return error("expected ']', got end of template");
      if (is(Tok::kColon)) {
        parts.push_back(nullptr);
        ++cur_;
        is_slice = true;
      } else {
        TRY(ExprPtr e, expression());
        parts.push_back(std::move(e));
        if (is(Tok::kColon)) {
          ++cur_;
          is_slice = true;
        } else if (!is(Tok::kCloseBracket)) {
          return error("expected ':' or ']', got " + describe());
        }
      }
    }
    if (parts.empty()) return error("empty subscript []");
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) return error_at(at, "a slice takes at most 3 parts");
    auto s = make_expr(ExprKind::kSlice, at);
    s->a = std::move(parts[0]);
    if (parts.size() > 1) s->b = std::move(parts[1]);
    if (parts.size() > 2) s->c = std::move(parts[2]);
    return s;
  }

  // ( ... ): call arguments (positional, name=value, *spread, **spread) or macro parameters (names with
  // optional defaults).
  Result<std::vector<ExprPtr>> args(bool parameters) {
    MAGNETAR_RETURN_IF_ERROR(expect(Tok::kOpenParen, "'('"));
    std::vector<ExprPtr> out;
    bool saw_keyword = false;
    while (!is(Tok::kCloseParen)) {
      if (cur_ >= t_.size()) return error("expected ')', got end of template");
      const uint32_t at = pos();
      const bool kw_spread = is(Tok::kPower), spread = is(Tok::kMultiplicative) && t_[cur_].value == "*";
      if (kw_spread || spread) {
        if (parameters) return error("argument unpacking is not allowed in parameter declarations");
        ++cur_;
        auto e = make_expr(kw_spread ? ExprKind::kKwSpread : ExprKind::kSpread, at);
        TRY(e->a, expression());
        out.push_back(std::move(e));
      } else {
        TRY(ExprPtr arg, expression());
        if (is(Tok::kEquals)) {
          ++cur_;
          if (arg->kind != ExprKind::kIdent) return error_at(at, "expected a name before '='");
          auto kw = make_expr(ExprKind::kKwarg, at);
          kw->name = arg->name;
          TRY(kw->a, expression());
          arg = std::move(kw);
          saw_keyword = true;
        } else if (saw_keyword) {
          return error_at(at, parameters ? "a parameter without default follows one with a default"
                                         : "a positional argument follows a keyword argument");
        }
        if (parameters && arg->kind != ExprKind::kIdent && arg->kind != ExprKind::kKwarg) {
          return error_at(at, "expected a parameter name");
        }
        out.push_back(std::move(arg));
      }
      if (is(Tok::kComma)) {
        ++cur_;
      } else if (!is(Tok::kCloseParen)) {
        return error("expected ',' or ')', got " + describe());
      }
    }
    ++cur_;
    return out;
  }

  Result<ExprPtr> primary() {
    if (cur_ >= t_.size()) return error("expected an expression, got end of template");
    DepthGuard g(&depth_);
    if (depth_ > kMaxParseDepth) return too_deep();
    const Token& k = t_[cur_++];
    switch (k.type) {
      case Tok::kNumber: {
        if (k.value.find_first_of(".eE") != std::string::npos) {
          auto e = make_expr(ExprKind::kFloat, k.pos);
          const char* begin = k.value.data() + (k.value[0] == '+' ? 1 : 0);
          const auto r = std::from_chars(begin, k.value.data() + k.value.size(), e->f);
          if (r.ec != std::errc()) return error_at(k.pos, "number " + k.value + " out of range");
          return e;
        }
        auto e = make_expr(ExprKind::kInt, k.pos);
        const char* begin = k.value.data() + (k.value[0] == '+' ? 1 : 0);
        const auto r = std::from_chars(begin, k.value.data() + k.value.size(), e->i);
        if (r.ec != std::errc()) return error_at(k.pos, "integer literal " + k.value + " out of range");
        return e;
      }
      case Tok::kString: {
        auto e = make_expr(ExprKind::kString, k.pos);
        e->name = k.value;
        while (is(Tok::kString)) e->name += t_[cur_++].value;  // 'a' "b" is "ab"
        return e;
      }
      case Tok::kIdent: {
        auto e = make_expr(ExprKind::kIdent, k.pos);
        e->name = k.value;
        return e;
      }
      case Tok::kOpenParen: {
        if (is(Tok::kCloseParen)) {  // ()
          ++cur_;
          return make_expr(ExprKind::kTuple, k.pos);
        }
        TRY(ExprPtr e, sequence(false));
        if (is(Tok::kComma)) {  // (a,) and (a, b,): a trailing comma makes or ends a tuple
          ++cur_;
          if (e->kind != ExprKind::kTuple) {
            auto tuple = make_expr(ExprKind::kTuple, k.pos);
            tuple->items.push_back(std::move(e));
            e = std::move(tuple);
          }
        }
        MAGNETAR_RETURN_IF_ERROR(expect(Tok::kCloseParen, "')'"));
        return e;
      }
      case Tok::kOpenBracket: {
        auto e = make_expr(ExprKind::kArray, k.pos);
        while (!is(Tok::kCloseBracket)) {
          if (cur_ >= t_.size()) return error("expected ']', got end of template");
          TRY(ExprPtr item, expression());
          e->items.push_back(std::move(item));
          if (is(Tok::kComma)) ++cur_;
        }
        ++cur_;
        return e;
      }
      case Tok::kOpenBrace: {
        auto e = make_expr(ExprKind::kObject, k.pos);
        while (!is(Tok::kCloseBrace)) {
          if (cur_ >= t_.size()) return error("expected '}', got end of template");
          TRY(ExprPtr key, expression());
          MAGNETAR_RETURN_IF_ERROR(expect(Tok::kColon, "':' in a dict literal"));
          TRY(ExprPtr value, expression());
          e->items.push_back(std::move(key));
          e->items.push_back(std::move(value));
          if (is(Tok::kComma)) ++cur_;
        }
        ++cur_;
        return e;
      }
      default: --cur_; return error("expected an expression, got " + describe());
    }
  }

  std::string_view source_;
  const std::vector<Token>& t_;
  size_t cur_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::unique_ptr<Program>> parse_program(std::string_view raw) {
  // Python jinja2 reads "\r\n" and "\r" as "\n" before anything else (string literals included), so a
  // template saved with Windows line ends renders as the same template with "\n".
  auto program = std::make_unique<Program>();
  program->source.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] != '\r') {
      program->source += raw[k];
    } else {
      program->source += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    }
  }
  const std::string_view source = program->source;
  TRY(const std::vector<Token> tokens, tokenize(source));
  Parser p(source, tokens);
  TRY(program->body, p.program());
  return program;
}

}  // namespace magnetar::chat::jinja
