#include "chat/output_constraint.h"

#include <algorithm>

namespace magnetar::chat {

OutputConstraint::OutputConstraint(const ConstraintSpec& spec)
    : spec_(&spec),
      choice_done_(spec.choices.empty()),
      json_({.top = JsonPrefix::Top::kObject, .max_depth = spec.max_depth, .finite_numbers = true}) {
  for (const std::string& choice : spec.choices) closing_bound_ = std::max(closing_bound_, choice.size());
  if (spec.json_object) closing_bound_ += 16 + size_t(std::max(0, spec.max_depth));
}

bool OutputConstraint::done() const {
  if (failed_ || !choice_done_) return false;
  return !spec_->json_object || json_.closed();
}

std::string OutputConstraint::closing() const {
  if (failed_ || done()) return {};
  std::string out;
  JsonPrefix json = json_;
  if (!choice_done_) {
    for (const std::string& choice : spec_->choices) {
      if (choice.starts_with(chosen_)) {
        out = choice.substr(chosen_.size());
        break;
      }
    }
  }
  if (spec_->json_object) out += json.closing();
  return out;
}

bool OutputConstraint::feed_byte(char c) {
  if (!choice_done_) {
    chosen_ += c;
    bool prefix = false;
    for (const std::string& choice : spec_->choices) {
      if (choice.compare(0, chosen_.size(), chosen_) != 0) continue;
      prefix = true;
      if (choice.size() == chosen_.size()) choice_done_ = true;  // choices are prefix-free: this is the one
    }
    return prefix;
  }
  if (!spec_->json_object || json_.closed()) return false;
  const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
  if (ws && !json_.in_string()) {
    if (spec_->max_whitespace_run > 0 && ++whitespace_run_ > spec_->max_whitespace_run) return false;
  } else {
    whitespace_run_ = 0;
  }
  return json_.feed(uint8_t(c));
}

bool OutputConstraint::feed(std::string_view bytes) {
  if (failed_) return false;
  for (const char c : bytes) {
    if (!feed_byte(c)) {
      failed_ = true;
      return false;
    }
  }
  return true;
}

bool OutputConstraint::accepts(std::string_view bytes) const {
  OutputConstraint trial = *this;
  return trial.feed(bytes);
}

bool OutputConstraint::allows(std::string_view bytes, int64_t tokens_left) const {
  if (bytes.empty()) return false;                                   // a token that writes nothing never ends it
  if (tokens_left > int64_t(closing_bound_)) return accepts(bytes);  // whatever closes it fits
  if (const std::string rest = closing(); int64_t(rest.size()) >= tokens_left) {
    return std::string_view(rest).starts_with(bytes);
  }
  OutputConstraint trial = *this;
  return trial.feed(bytes) && int64_t(trial.closing().size()) < tokens_left;
}

}  // namespace magnetar::chat
