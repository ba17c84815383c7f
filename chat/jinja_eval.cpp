// The interpreter: statements and expressions of one render, with Python jinja2's semantics as transformers
// sets it up (scoping: a loop iteration's and a macro call's assignments stay inside them, macros see the
// scope they were defined in; loop variables; undefined values). Builtins (filters, tests, methods, globals) are in
// jinja_builtins.cpp. Errors carry the line:column of the node that failed.
#include "chat/jinja_eval.h"

#include <cmath>

#include "chat/jinja.h"
#include "chat/jinja_text.h"

namespace magnetar::chat {
namespace jinja {

#define TRY(lhs, expr) MAGNETAR_ASSIGN_OR_RETURN(lhs, expr)

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, x] : vars) {
    if (k == name) {
      x = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}

namespace {

const Value* lookup(const Scope* s, const std::string& name) {
  for (; s; s = s->parent) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

constexpr const char kPrefix[] = "chat template ";

}  // namespace

Interp::~Interp() {
  // Namespaces may refer to each other (or to themselves); emptying them first frees everything
  // without recursion.
  for (auto& ns : namespaces_) ns->entries.clear();
}

Status Interp::error(uint32_t pos, const std::string& msg) const {
  return Status::error(kPrefix + source_location(program_.source, pos) + ": " + msg);
}

Status Interp::located(uint32_t pos, const Status& s) const {
  if (s.ok() || s.message().rfind(kPrefix, 0) == 0) return s;
  return error(pos, s.message());
}

Status Interp::charge_steps(uint64_t n) {
  steps_ += n;
  if (steps_ > kMaxSteps) {
    return Status::error(
        format("render stopped after %llu steps (runaway loop or recursion?)", (unsigned long long)kMaxSteps));
  }
  return Status();
}

Status Interp::charge_bytes(uint64_t n) {
  bytes_ += n;
  if (bytes_ > kMaxBytes) {
    return Status::error(format("render stopped after creating %llu MiB of text and lists (runaway growth?)",
                                (unsigned long long)(kMaxBytes >> 20)));
  }
  return Status();
}

Status Interp::append(std::string* out, std::string_view text) {
  MAGNETAR_RETURN_IF_ERROR(charge_bytes(text.size()));
  out->append(text);
  return Status();
}

Scope* Interp::new_scope(Scope* parent) {
  scopes_.emplace_back();
  scopes_.back().parent = parent;
  return &scopes_.back();
}

namespace {

// What one scope holds in memory, a little generously (allocation headers, the loop object's entries and the
// callables' blocks included): a kept scope is charged this much.
uint64_t scope_bytes(const Scope& scope) {
  constexpr uint64_t kAllocation = 32;
  constexpr uint64_t kEntry = sizeof(std::pair<std::string, Value>) + kAllocation;
  uint64_t n = sizeof(Scope) + kAllocation + scope.vars.capacity() * kEntry;
  for (const auto& [name, v] : scope.vars) {
    n += name.size();
    if (v.is(Kind::kObject) && v.o.use_count() == 1) n += kAllocation + v.obj().entries.size() * kEntry;  // loop
    if (v.is(Kind::kFunction)) n += kAllocation + sizeof(Callable);
  }
  return n;
}

}  // namespace

Status Interp::keep_scopes() {
  ++callers_;
  uint64_t n = 0;
  for (size_t k = charged_scopes_; k < scopes_.size(); ++k) n += scope_bytes(scopes_[k]);
  charged_scopes_ = scopes_.size();
  return charge_bytes(n);
}

Result<Value> Interp::new_namespace(Object entries) {
  Value v = Value::ns(std::move(entries));
  namespaces_.push_back(v.o);
  return v;
}

Result<std::string> Interp::run(const Value& context) {
  Scope* root = new_scope(nullptr);
  root->set("true", Value::boolean(true));
  root->set("false", Value::boolean(false));
  root->set("none", Value::null());
  root->set("True", Value::boolean(true));
  root->set("False", Value::boolean(false));
  root->set("None", Value::null());
  constexpr std::pair<const char*, Fn> kGlobals[] = {{"namespace", Fn::kNamespace},
                                                     {"raise_exception", Fn::kRaiseException},
                                                     {"range", Fn::kRange},
                                                     {"strftime_now", Fn::kStrftimeNow},
                                                     {"dict", Fn::kDict}};
  for (const auto& [name, fn] : kGlobals) root->set(name, Value::function(Callable{.kind = fn}));
  if (context.is(Kind::kObject)) {
    for (const auto& [k, v] : context.obj().entries) root->set(k, v);
  }
  std::string out;
  Flow flow = Flow::kNormal;
  MAGNETAR_RETURN_IF_ERROR(exec_block(program_.body, root, &out, &flow));
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Statements
// ---------------------------------------------------------------------------------------------------------

Status Interp::exec_block(const std::vector<StmtPtr>& body, Scope* s, std::string* out, Flow* flow) {
  for (const StmtPtr& st : body) {
    MAGNETAR_RETURN_IF_ERROR(exec(*st, s, out, flow));
    if (*flow != Flow::kNormal) return Status();
  }
  return Status();
}

Status Interp::exec(const Stmt& st, Scope* s, std::string* out, Flow* flow) {
  DepthGuard g(&depth_);
  if (depth_ > kMaxEvalDepth)
    return error(st.pos, format("nesting deeper than %d (runaway recursion?)", kMaxEvalDepth));
  MAGNETAR_RETURN_IF_ERROR(located(st.pos, charge_steps(1)));
  switch (st.kind) {
    case StmtKind::kText: return located(st.pos, append(out, st.text));
    case StmtKind::kOutput: {
      TRY(const Value v, eval(*st.expr, s));
      std::string text;
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, py_str(v, &text)));
      return located(st.pos, append(out, text));
    }
    case StmtKind::kIf: {
      TRY(const Value test, eval(*st.expr, s));
      return exec_block(truthy(test) ? st.body : st.alt, s, out, flow);
    }
    case StmtKind::kFor: return exec_for(st, s, out);
    case StmtKind::kSet: return exec_set(st, s);
    case StmtKind::kMacro: {
      // The macro keeps a pointer to `s`: the scopes of this render must stay.
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, keep_scopes()));
      s->set(st.text, Value::function(Callable{.kind = Fn::kMacro, .stmt = &st, .scope = s, .name = st.text}));
      return Status();
    }
    case StmtKind::kCallBlock: {
      const Expr& call_expr = *st.expr;
      TRY(Args args, eval_args(call_expr.items, s));
      TRY(const Value fn, eval(*call_expr.a, s));
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, keep_scopes()));
      // The macro receives `caller` as a keyword argument (call_macro binds it to the name).
      args.kw.set("caller", Value::function(Callable{.kind = Fn::kCaller, .stmt = &st, .scope = s}));
      TRY(const Value v, call(fn, std::move(args), s, call_expr.pos));
      std::string text;
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, py_str(v, &text)));
      return located(st.pos, append(out, text));
    }
    case StmtKind::kFilterBlock: {
      std::string body;
      Flow inner = Flow::kNormal;
      MAGNETAR_RETURN_IF_ERROR(exec_block(st.body, s, &body, &inner));
      if (inner != Flow::kNormal) {
        *flow = inner;
        return Status();
      }
      TRY(const Value v, apply_filter(Value::string(std::move(body)), *st.expr, s));
      std::string text;
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, py_str(v, &text)));
      return located(st.pos, append(out, text));
    }
    case StmtKind::kBreak:
    case StmtKind::kContinue:
      if (loop_depth_ == 0) {
        return error(st.pos,
                     st.kind == StmtKind::kBreak ? "{% break %} outside a loop" : "{% continue %} outside a loop");
      }
      *flow = st.kind == StmtKind::kBreak ? Flow::kBreak : Flow::kContinue;
      return Status();
  }
  return Status();
}

Status Interp::bind(const Expr& target, const Value& v, Scope* s) {
  if (target.kind == ExprKind::kIdent) {
    s->set(target.name, v);
    return Status();
  }
  if (target.kind != ExprKind::kTuple) return error(target.pos, "cannot assign to this expression");
  if (!v.is(Kind::kArray)) return error(target.pos, std::string("cannot unpack a ") + kind_name(v));
  if (v.arr().size() != target.items.size()) {
    return error(target.pos,
                 format("too %s values to unpack (expected %zu, got %zu)",
                        v.arr().size() < target.items.size() ? "few" : "many", target.items.size(), v.arr().size()));
  }
  for (size_t k = 0; k < target.items.size(); ++k) {
    if (target.items[k]->kind != ExprKind::kIdent) return error(target.items[k]->pos, "can only unpack into names");
    s->set(target.items[k]->name, v.arr()[k]);
  }
  return Status();
}

Status Interp::exec_set(const Stmt& st, Scope* s) {
  Value rhs;
  if (st.expr) {
    TRY(rhs, eval(*st.expr, s));
  } else {
    std::string body;
    Flow inner = Flow::kNormal;
    MAGNETAR_RETURN_IF_ERROR(exec_block(st.body, s, &body, &inner));
    rhs = Value::string(std::move(body));
  }
  const Expr& target = *st.target;
  if (target.kind == ExprKind::kMember) {
    TRY(const Value object, eval(*target.a, s));
    if (!object.is(Kind::kNamespace)) {
      return error(target.pos,
                   std::string("cannot set an attribute on a ") + kind_name(object) + " (only on a namespace)");
    }
    if (target.b->kind != ExprKind::kString) return error(target.pos, "namespace attributes are set by name");
    object.o->set(target.b->name, std::move(rhs));
    return Status();
  }
  return bind(target, rhs, s);
}

Status Interp::exec_for(const Stmt& st, Scope* s, std::string* out) {
  const ScopeMark mark(this);
  Scope* scope = new_scope(s);
  const Expr* test = nullptr;
  Value iterable;
  if (st.expr->kind == ExprKind::kSelect) {
    TRY(iterable, eval(*st.expr->a, scope));
    test = st.expr->b.get();
  } else {
    TRY(iterable, eval(*st.expr, scope));
  }
  Array items;
  if (iterable.is(Kind::kArray)) {
    items = iterable.arr();
  } else if (iterable.is(Kind::kObject)) {
    for (const auto& e : iterable.obj().entries) items.push_back(Value::string(e.first));
  } else if (iterable.is(Kind::kString)) {  // its characters, charged before they are made
    const std::string& str = iterable.str();
    MAGNETAR_RETURN_IF_ERROR(located(st.pos, charge_bytes(str.size() * (1 + sizeof(Value)))));
    for (size_t i = 0; i < str.size();) {
      const size_t start = i;
      decode_utf8(str, &i);
      items.push_back(Value::string(str.substr(start, i - start)));
    }
  } else if (!iterable.is(Kind::kUndefined)) {  // an undefined value iterates as empty
    return error(st.expr->pos, std::string("'") + py_type(iterable) + "' object is not iterable");
  }
  if (test) {
    Scope* test_scope = new_scope(scope);
    Array kept;
    for (Value& item : items) {
      MAGNETAR_RETURN_IF_ERROR(located(st.pos, charge_steps(1)));
      test_scope->vars.clear();
      MAGNETAR_RETURN_IF_ERROR(bind(*st.target, item, test_scope));
      TRY(const Value keep, eval(*test, test_scope));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  ++loop_depth_;
  const size_t n = items.size();
  Scope* iteration = nullptr;
  bool iteration_kept = false;
  for (size_t i = 0; i < n; ++i) {
    Status st_charge = charge_steps(1);
    if (!st_charge.ok()) {
      --loop_depth_;
      return located(st.pos, st_charge);
    }
    // Each iteration starts from the scope around the loop: what the previous one set is gone (Python
    // Jinja). The scope is reused unless a closure (macro, caller) may still point at it.
    const uint64_t callers_before = callers_;
    if (!iteration || iteration_kept) {
      iteration = new_scope(scope);
    } else {
      iteration->vars.clear();
    }
    Object loop;
    loop.entries = {
        {"index", Value::integer(int64_t(i + 1))},
        {"index0", Value::integer(int64_t(i))},
        {"revindex", Value::integer(int64_t(n - i))},
        {"revindex0", Value::integer(int64_t(n - i - 1))},
        {"first", Value::boolean(i == 0)},
        {"last", Value::boolean(i + 1 == n)},
        {"length", Value::integer(int64_t(n))},
        {"depth", Value::integer(int64_t(loop_depth_))},
        {"depth0", Value::integer(int64_t(loop_depth_ - 1))},
        {"previtem", i > 0 ? items[i - 1] : Value::undefined()},
        {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined()},
        {"cycle", Value::function(Callable{.kind = Fn::kMethod, .self = Value::integer(int64_t(i)), .name = "cycle"})}};
    Result<Value> loop_value = Value::object(std::move(loop));
    Status bound = loop_value.ok() ? bind(*st.target, items[i], iteration) : loop_value.status();
    if (!bound.ok()) {
      --loop_depth_;
      return located(st.pos, bound);
    }
    iteration->set("loop", std::move(*loop_value));  // held by the scope alone (keep_scopes charges it)
    Flow flow = Flow::kNormal;
    Status body = exec_block(st.body, iteration, out, &flow);
    iteration_kept = callers_ != callers_before;
    if (!body.ok()) {
      --loop_depth_;
      return body;
    }
    if (flow == Flow::kBreak) break;  // what the iteration printed before it stays (Python Jinja)
  }
  --loop_depth_;
  if (n == 0) {
    Flow flow = Flow::kNormal;
    MAGNETAR_RETURN_IF_ERROR(exec_block(st.alt, scope, out, &flow));
  }
  return Status();
}

// ---------------------------------------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------------------------------------

Result<Value> Interp::call_macro(const Callable& c, Args args, Scope* parent) {
  const Stmt& st = *c.stmt;
  const std::string display = c.kind == Fn::kCaller ? "caller" : "'" + c.name + "'";
  const ScopeMark mark(this);
  Scope* scope = new_scope(parent);
  std::vector<const Expr*> pending;
  for (size_t k = 0; k < st.params.size(); ++k) {
    const Expr& p = *st.params[k];
    const std::string& name = p.name;
    Value v;
    bool have = false;
    if (k < args.pos.size()) {
      v = args.pos[k];
      have = true;
    } else if (const Value* kv = args.kw.find(name)) {
      v = *kv;
      have = true;
      auto& e = args.kw.entries;
      for (auto it = e.begin(); it != e.end(); ++it) {
        if (it->first == name) {
          e.erase(it);
          break;
        }
      }
    }
    if (!have && p.kind == ExprKind::kKwarg) pending.push_back(&p);
    scope->set(name, v);
  }
  if (const Value* caller = args.kw.find("caller"); caller && c.kind == Fn::kMacro) {
    scope->set("caller", *caller);
    auto& e = args.kw.entries;
    e.erase(std::find_if(e.begin(), e.end(), [](const auto& kv) { return kv.first == "caller"; }));
  }
  if (st.uses_kwargs) {
    TRY(Value kw, Value::object(std::move(args.kw)));
    scope->set("kwargs", kw);
  } else if (!args.kw.entries.empty()) {
    return Status::error("macro " + display + " takes no keyword argument '" + args.kw.entries[0].first + "'");
  }
  if (st.uses_varargs) {
    Array rest;
    for (size_t k = st.params.size(); k < args.pos.size(); ++k) rest.push_back(args.pos[k]);
    TRY(Value va, Value::array(std::move(rest), /*tuple=*/true));
    scope->set("varargs", va);
  } else if (args.pos.size() > st.params.size()) {
    return Status::error(format("macro %s takes not more than %zu argument(s)", display.c_str(), st.params.size()));
  }
  for (const Expr* p : pending) {
    TRY(Value v, eval(*p->a, scope));
    scope->set(p->name, v);
  }
  std::string out;
  Flow flow = Flow::kNormal;
  const int saved_loops = loop_depth_;
  loop_depth_ = 0;  // {% break %} cannot leave a macro
  Status body = exec_block(st.body, scope, &out, &flow);
  loop_depth_ = saved_loops;
  MAGNETAR_RETURN_IF_ERROR(body);
  return Value::string(std::move(out));
}

Result<Value> Interp::call(const Value& fn, Args args, Scope* caller_scope, uint32_t pos) {
  if (!fn.is(Kind::kFunction)) return error(pos, std::string("cannot call a ") + kind_name(fn));
  DepthGuard g(&depth_);
  if (depth_ > kMaxEvalDepth) return error(pos, format("nesting deeper than %d (runaway recursion?)", kMaxEvalDepth));
  const Callable& c = *fn.fn;
  Result<Value> r = Value();
  switch (c.kind) {
    case Fn::kMacro: r = call_macro(c, std::move(args), c.scope); break;  // the scope it was defined in
    case Fn::kCaller: {
      const ScopeMark mark(this);
      r = call_macro(c, std::move(args), new_scope(c.scope));
      break;
    }
    case Fn::kMethod: r = call_method(*this, c.self, c.name, args); break;
    default: r = call_global(*this, c.kind, args); break;
  }
  if (!r.ok()) return located(pos, r.status());
  return r;
}

Result<Args> Interp::eval_args(const std::vector<ExprPtr>& items, Scope* s) {
  Args args;
  for (const ExprPtr& e : items) {
    if (e->kind == ExprKind::kSpread) {
      TRY(const Value v, eval(*e->a, s));
      if (!v.is(Kind::kArray)) return error(e->pos, std::string("cannot unpack a ") + kind_name(v) + " with *");
      for (const Value& x : v.arr()) args.pos.push_back(x);
    } else if (e->kind != ExprKind::kKwarg && e->kind != ExprKind::kKwSpread) {
      TRY(Value v, eval(*e, s));
      args.pos.push_back(std::move(v));
    }
  }
  for (const ExprPtr& e : items) {
    std::vector<std::pair<std::string, Value>> add;
    if (e->kind == ExprKind::kKwarg) {
      TRY(Value v, eval(*e->a, s));
      add.emplace_back(e->name, std::move(v));
    } else if (e->kind == ExprKind::kKwSpread) {
      TRY(const Value v, eval(*e->a, s));
      if (!v.is(Kind::kObject))
        return error(e->pos, std::string("argument after ** must be a dict, not ") + kind_name(v));
      add = v.obj().entries;
    }
    for (auto& [k, v] : add) {
      if (args.kw.find(k)) return error(e->pos, "got multiple values for keyword argument '" + k + "'");
      args.kw.entries.emplace_back(k, std::move(v));
    }
  }
  return args;
}

// ---------------------------------------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------------------------------------

Result<Value> Interp::eval(const Expr& e, Scope* s) {
  DepthGuard g(&depth_);
  if (depth_ > kMaxEvalDepth) return error(e.pos, format("nesting deeper than %d (runaway recursion?)", kMaxEvalDepth));
  Status charged = charge_steps(1);
  if (!charged.ok()) return located(e.pos, charged);
  Result<Value> r = eval_inner(e, s);
  if (!r.ok()) return located(e.pos, r.status());
  return r;
}

Result<Value> Interp::eval_inner(const Expr& e, Scope* s) {
  switch (e.kind) {
    case ExprKind::kInt: return Value::integer(e.i);
    case ExprKind::kFloat: return Value::number(e.f);
    case ExprKind::kString: return Value::string(e.name);
    case ExprKind::kIdent: {
      const Value* v = lookup(s, e.name);
      return v ? *v : Value::undefined();
    }
    case ExprKind::kArray:
    case ExprKind::kTuple: {
      Array items;
      for (const ExprPtr& x : e.items) {
        TRY(Value v, eval(*x, s));
        items.push_back(std::move(v));
      }
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(items.size() * sizeof(Value)));
      return Value::array(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kObject: {
      Object o;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        TRY(const Value key, eval(*e.items[k], s));
        if (!key.is(Kind::kString)) {
          return error(e.items[k]->pos, std::string("dict keys must be strings, got a ") + kind_name(key));
        }
        TRY(Value v, eval(*e.items[k + 1], s));
        o.set(key.str(), std::move(v));
      }
      return Value::object(std::move(o));
    }
    case ExprKind::kMember: return eval_member(e, s);
    case ExprKind::kCall: {
      TRY(Args args, eval_args(e.items, s));
      TRY(const Value fn, eval(*e.a, s));
      return call(fn, std::move(args), s, e.pos);
    }
    case ExprKind::kUnary: {
      TRY(const Value v, eval(*e.a, s));
      if (e.op == Op::kNot) return Value::boolean(!truthy(v));
      const double sign = e.op == Op::kNeg ? -1 : 1;
      if (v.is(Kind::kFloat)) return Value::number(sign * v.f);
      if (v.is(Kind::kInt) && v.big) return e.op == Op::kNeg ? Value::number(-v.as_double()) : v;
      if (v.is(Kind::kInt)) return e.op == Op::kNeg ? py_negate(v.i) : v;
      if (v.is(Kind::kBool)) return Value::integer(int64_t(sign) * (v.b ? 1 : 0));
      return Status::error(std::string("unary ") + (e.op == Op::kNeg ? "-" : "+") + " on a " + kind_name(v));
    }
    case ExprKind::kBinary: return eval_binary(e, s);
    case ExprKind::kFilter: {
      TRY(const Value operand, eval(*e.a, s));
      return apply_filter(operand, e, s);
    }
    case ExprKind::kTest: {
      TRY(const Value v, eval(*e.a, s));
      TRY(const Args args, eval_args(e.items, s));
      if (args.pos.size() + args.kw.entries.size() > 1)
        return Status::error("test '" + e.name + "' takes one argument");
      const Value* arg = !args.pos.empty()          ? &args.pos[0]
                         : !args.kw.entries.empty() ? &args.kw.entries[0].second
                                                    : nullptr;
      TRY(const bool r, test_value(*this, e.name, v, arg));
      return Value::boolean(e.negate ? !r : r);
    }
    case ExprKind::kSelect: {
      TRY(const Value test, eval(*e.b, s));
      if (!truthy(test)) return Value::undefined();
      return eval(*e.a, s);
    }
    case ExprKind::kTernary: {
      TRY(const Value test, eval(*e.b, s));
      return eval(truthy(test) ? *e.a : *e.c, s);
    }
    case ExprKind::kSlice:
    case ExprKind::kKwarg:
    case ExprKind::kSpread:
    case ExprKind::kKwSpread: return Status::error("this expression is only valid inside [ ] or a call");
  }
  return Value::undefined();
}

Result<Value> Interp::apply_filter(const Value& operand, const Expr& filter, Scope* scope) {
  Args args;
  if (filter.called) {
    TRY(args, eval_args(filter.items, scope));
  }
  Result<Value> r = filter_value(*this, operand, filter.name, filter.called, args, filter, scope);
  if (!r.ok()) return located(filter.pos, r.status());
  return r;
}

namespace {

// Python's slice(start, stop, step).indices(size), then the indices it selects.
Result<std::vector<size_t>> slice_indices(size_t size, const Value& start_v, const Value& stop_v, const Value& step_v) {
  const int64_t len = int64_t(size);
  const int64_t step = step_v.is(Kind::kInt) ? step_v.i : 1;
  if (step == 0) return Status::error("slice step cannot be zero");
  const auto adjust = [&](const Value& v, int64_t dflt) {
    if (!v.is(Kind::kInt)) return dflt;
    int64_t x = v.i;
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  const int64_t start = adjust(start_v, step < 0 ? len - 1 : 0);
  const int64_t stop = adjust(stop_v, step < 0 ? -1 : len);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    out.push_back(size_t(i));
    if (__builtin_add_overflow(i, step, &i)) break;  // past any index
  }
  return out;
}

}  // namespace

Result<Value> Interp::eval_member(const Expr& e, Scope* s) {
  TRY(const Value object, eval(*e.a, s));
  const Expr& prop = *e.b;
  if (prop.kind == ExprKind::kSlice) {
    Value parts[3];
    const Expr* exprs[3] = {prop.a.get(), prop.b.get(), prop.c.get()};
    for (int k = 0; k < 3; ++k) {
      if (!exprs[k]) continue;
      TRY(parts[k], eval(*exprs[k], s));
      if (!parts[k].is(Kind::kInt) && !parts[k].is(Kind::kUndefined)) {
        return error(exprs[k]->pos, std::string("slice bounds must be integers, got a ") + kind_name(parts[k]));
      }
    }
    if (object.is(Kind::kArray)) {
      TRY(const std::vector<size_t> idx, slice_indices(object.arr().size(), parts[0], parts[1], parts[2]));
      Array items;
      items.reserve(idx.size());
      for (size_t k : idx) items.push_back(object.arr()[k]);
      return make_array(std::move(items));
    }
    if (object.is(Kind::kString)) {
      std::vector<std::string_view> chars;  // code points
      const std::string& str = object.str();
      MAGNETAR_RETURN_IF_ERROR(charge_bytes(str.size() * (1 + sizeof(std::string_view))));
      for (size_t i = 0; i < str.size();) {
        const size_t start = i;
        decode_utf8(str, &i);
        chars.push_back(std::string_view(str).substr(start, i - start));
      }
      std::string out;
      TRY(const std::vector<size_t> idx, slice_indices(chars.size(), parts[0], parts[1], parts[2]));
      for (size_t k : idx) out += chars[k];
      return make_string(std::move(out));
    }
    if (object.is(Kind::kUndefined)) return Status::error("cannot slice an undefined value");
    return Status::error(std::string("cannot slice a ") + kind_name(object));
  }
  Value property;
  if (prop.kind == ExprKind::kString && !e.computed) {
    property = Value::string(prop.name);
  } else {
    TRY(property, eval(prop, s));
  }
  return member(object, property);
}

Result<Value> Interp::member(const Value& object, const Value& property) {
  switch (object.kind) {
    case Kind::kObject:
    case Kind::kNamespace: {
      if (!property.is(Kind::kString)) return Value::undefined();  // JSON dicts only have string keys
      if (const Value* v = object.obj().find(property.str())) return *v;
      return object.is(Kind::kObject) ? method_of(object, property.str()) : Value::undefined();
    }
    case Kind::kArray:
    case Kind::kString: {
      if (property.is(Kind::kInt) || property.is(Kind::kBool)) {
        const int64_t index = property.is(Kind::kBool) ? int64_t(property.b) : property.i;
        if (object.is(Kind::kArray)) {
          const int64_t n = int64_t(object.arr().size());
          const int64_t k = index < 0 ? n + index : index;
          return k >= 0 && k < n ? object.arr()[size_t(k)] : Value::undefined();
        }
        // Python indexes code points: found by a scan from the start, charged by the bytes it walks.
        const std::string& str = object.str();
        int64_t k = index;
        if (k < 0) {
          MAGNETAR_RETURN_IF_ERROR(charge_scan(str.size()));
          k += int64_t(cp_count(str));
          if (k < 0) return Value::undefined();
        }
        const size_t at = cp_offset(str, size_t(k));
        MAGNETAR_RETURN_IF_ERROR(charge_scan(at == std::string::npos ? str.size() : at));
        if (at == std::string::npos) return Value::undefined();
        size_t end = at;
        decode_utf8(str, &end);
        return Value::string(str.substr(at, end - at));
      }
      if (property.is(Kind::kString)) return method_of(object, property.str());
      return Status::error(std::string("cannot index a ") + kind_name(object) + " with a " + kind_name(property));
    }
    case Kind::kUndefined:
      if (property.is(Kind::kString)) {
        return Status::error("'" + property.str() + "' is read from an undefined value");
      }
      return Status::error("an undefined value cannot be indexed");
    default: return Value::undefined();  // none, numbers, booleans: Python Jinja gives undefined
  }
}

}  // namespace jinja

// ---------------------------------------------------------------------------------------------------------
// JinjaTemplate
// ---------------------------------------------------------------------------------------------------------

Result<JinjaTemplate> JinjaTemplate::parse(std::string_view source) {
  Result<std::unique_ptr<jinja::Program>> program = jinja::parse_program(source);
  if (!program.ok()) return program.status();
  return JinjaTemplate(std::shared_ptr<const jinja::Program>(std::move(program).value()));
}

const std::string& JinjaTemplate::source() const { return program_->source; }

namespace {

Result<std::string> render_value(const jinja::Program& program, Result<jinja::Value> context) {
  if (!context.ok()) return Status::error("chat template context: " + context.status().message());
  jinja::Interp interp(program);
  return interp.run(*context);
}

}  // namespace

Result<std::string> JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  return render_value(*program_, jinja::from_json(context));
}

Result<std::string> JinjaTemplate::render(const nlohmann::json& context) const {
  return render_value(*program_, jinja::from_json(context));
}

}  // namespace magnetar::chat
