// Expected-failure reporting (STYLE.md rule 11, tier 1): bad files, bad requests, missing keys.
//
// A Status is ok or carries a one-line message that names the thing (file, field, byte offset, request)
// and the problem. Result<T> is a value or a Status. Neither throws; both are cheap to move.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace magnetar {

class Status {
 public:
  Status() = default;
  static Status error(std::string message) { return Status(std::move(message)); }
  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }
  // Prefixes context, e.g. status.wrap("model.gguf") -> "model.gguf: <message>".
  Status wrap(const std::string& context) const {
    return ok() ? *this : Status(context + ": " + message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)), failed_(true) {}
  std::string message_;
  bool failed_ = false;
};

// printf-style message builder for Status::error.
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}              // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}       // NOLINT(google-explicit-constructor)
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace magnetar

// Propagates a failed Status from an expression returning Status.
#define MAGNETAR_RETURN_IF_ERROR(expr)              \
  do {                                              \
    ::magnetar::Status status_tmp_ = (expr);        \
    if (!status_tmp_.ok()) return status_tmp_;      \
  } while (0)

// Evaluates an expression returning Result<T>; on failure returns its Status, else assigns the value:
//   MAGNETAR_ASSIGN_OR_RETURN(const int64_t n, config.integer("hidden_size"));
#define MAGNETAR_ASSIGN_OR_RETURN(lhs, expr) \
  MAGNETAR_ASSIGN_OR_RETURN_IMPL(MAGNETAR_CONCAT(result_, __LINE__), lhs, expr)
#define MAGNETAR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
#define MAGNETAR_CONCAT(a, b) MAGNETAR_CONCAT_IMPL(a, b)
#define MAGNETAR_CONCAT_IMPL(a, b) a##b
