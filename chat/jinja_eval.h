// Internal to chat/: the interpreter of one render. jinja_eval.cpp runs statements and expressions;
// jinja_builtins.cpp holds what templates call by name (filters, tests, methods, globals). One Interp per
// render: it owns every scope and the work budget, so that the parsed Program stays const and shared
// between threads.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace magnetar::chat::jinja {

// Variables of one scope (root, for loop, macro call). Scopes live in the Interp until the render ends,
// so a caller() closure may point at one safely.
struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  void set(const std::string& name, Value v);
};

// Limits against hostile templates; a real chat render stays far below them (see the unit test
// RealTemplateStaysFarBelowTheLimits).
constexpr int kMaxEvalDepth = 1000;         // nested evaluation (recursive macros hit this)
constexpr uint64_t kMaxSteps = 2'000'000;   // expression nodes, statements, loop iterations, sort steps
constexpr uint64_t kMaxBytes = 1ull << 29;  // bytes of strings and list slots created, output included
constexpr uint64_t kScanBytesPerStep = 256;  // see Interp::charge_scan
constexpr uint64_t kScanBytesPerItem = 16;   // a list item or dict entry a comparison visits, as scanned bytes

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> pos;
  Object kw;
  const Value* get(size_t i, const char* name) const {
    if (i < pos.size()) return &pos[i];
    return name ? kw.find(name) : nullptr;
  }
};

class Interp {
 public:
  explicit Interp(const Program& program) : program_(program) {}
  ~Interp();
  Result<std::string> run(const Value& context);

  // --- used by the builtins ---
  Result<Value> call(const Value& fn, Args args, Scope* caller_scope, uint32_t pos);
  Result<Value> apply_filter(const Value& operand, const Expr& filter, Scope* scope);
  Result<Value> member(const Value& object, const Value& property);
  Result<Value> new_namespace(Object entries);
  Status charge_steps(uint64_t n);
  Status charge_bytes(uint64_t n);
  // Work proportional to a string's length done in one step (indexing by code point, length, compare,
  // search): one step per kScanBytesPerStep bytes, so a loop over a huge string stops at the step limit
  // instead of running for hours.
  // What is under a step is carried to the next call, so that many short scans (the items of a comparison) add up.
  Status charge_scan(uint64_t bytes) {
    scan_bytes_ += bytes;
    const uint64_t steps = scan_bytes_ / kScanBytesPerStep;
    scan_bytes_ %= kScanBytesPerStep;
    return charge_steps(steps);
  }
  // seq * times for a string or a list, charged before it is built.
  Result<Value> repeat(const Value& seq, int64_t times);
  // Python's `fmt % args`.
  Result<Value> percent_format(const std::string& fmt, const Value& args);
  Result<Value> make_string(std::string s) {
    MAGNETAR_RETURN_IF_ERROR(charge_bytes(s.size()));
    return Value::string(std::move(s));
  }
  Result<Value> make_array(Array items) {
    MAGNETAR_RETURN_IF_ERROR(charge_bytes(items.size() * sizeof(Value)));
    return Value::array(std::move(items));
  }
  Status located(uint32_t pos, const Status& s) const;
  Status error(uint32_t pos, const std::string& msg) const;

 private:
  Result<Value> eval(const Expr& e, Scope* s);
  Result<Value> eval_inner(const Expr& e, Scope* s);
  Result<Value> eval_binary(const Expr& e, Scope* s);
  Result<Value> eval_member(const Expr& e, Scope* s);
  Result<Args> eval_args(const std::vector<ExprPtr>& items, Scope* s);
  Status exec_block(const std::vector<StmtPtr>& body, Scope* s, std::string* out, Flow* flow);
  Status exec(const Stmt& st, Scope* s, std::string* out, Flow* flow);
  Status exec_for(const Stmt& st, Scope* s, std::string* out);
  Status exec_set(const Stmt& st, Scope* s);
  Status bind(const Expr& target, const Value& v, Scope* s);
  Result<Value> call_macro(const Callable& c, Args args, Scope* parent);
  Scope* new_scope(Scope* parent);
  // A closure (macro, caller) now points at the current scopes: they stay until the render ends (see
  // ScopeMark), so those not yet charged are charged to the byte budget. Without it a macro defined in a long
  // loop kept every iteration's scope, loop object included, uncharged (gigabytes).
  Status keep_scopes();
  // Frees the scopes created since construction when it ends, unless a caller() closure (which may hold a
  // pointer to one of them) was made meanwhile: keeps long loops and deep macro recursion from piling up
  // scopes until the render ends.
  class ScopeMark {
   public:
    explicit ScopeMark(Interp* in) : in_(in), size_(in->scopes_.size()), callers_(in->callers_) {}
    ~ScopeMark() {
      if (in_->callers_ != callers_) return;
      in_->scopes_.resize(size_);
      in_->charged_scopes_ = std::min(in_->charged_scopes_, size_);
    }

   private:
    Interp* in_;
    size_t size_;
    uint64_t callers_;
  };
  Status append(std::string* out, std::string_view text);

  const Program& program_;
  std::deque<Scope> scopes_;
  std::vector<std::shared_ptr<Object>> namespaces_;  // cleared at the end: breaks reference cycles
  uint64_t steps_ = 0, bytes_ = 0, callers_ = 0;
  uint64_t scan_bytes_ = 0;    // charge_scan's remainder under one step
  size_t charged_scopes_ = 0;  // scopes_[0, charged_scopes_) are charged by keep_scopes
  int depth_ = 0, loop_depth_ = 0;
};

// jinja_builtins.cpp
Result<Value> call_global(Interp& in, Fn fn, const Args& args);
Result<Value> call_method(Interp& in, const Value& self, const std::string& name, const Args& args);
// A method bound to `self` when `self` has one named `name` (string and dict methods), else undefined.
Value method_of(const Value& self, const std::string& name);
Result<Value> filter_value(Interp& in, const Value& operand, const std::string& name, bool called, const Args& args,
                           const Expr& node, Scope* scope);
Result<bool> test_value(Interp& in, const std::string& name, const Value& v, const Value* arg);
bool is_test_name(const std::string& name);
bool is_filter_name(const std::string& name);
// Python's `==`: numbers by value (True == 1 == 1.0), strings, lists (a tuple never equals a list) and dicts
// by content; undefined equals only undefined.
// Every string and item walked is charged (charge_scan) before the walk: nested long strings made one `==`,
// `in`, sort or unique compare gigabytes for one step.
Result<bool> py_equal(Interp& in, const Value& a, const Value& b, uint32_t level = 0);
// Python's ordering (numbers, strings by code point, lists element by element); other pairs are the error
// Python raises for `op`.
Result<int> py_compare(Interp& in, const Value& a, const Value& b, const char* op, uint32_t level = 0);
// `item in container`.
Result<bool> py_contains(Interp& in, const Value& container, const Value& item);
const char* py_type(const Value& v);
// Python's -x: INT64_MIN's negation is 2^63, a `big` integer (negating it in int64 is undefined).
Value py_negate(int64_t x);

}  // namespace magnetar::chat::jinja
