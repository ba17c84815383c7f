#include "base/json_shape.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "base/status.h"

namespace magnetar {

JsonShape json_shape(std::string_view text) {
  JsonShape shape;
  // The open containers up to the refused depth (deeper ones only counted: the text is refused for its nesting):
  // whether each is an object, and its members so far.
  std::vector<std::pair<bool, int64_t>> open;
  int depth = 0;
  auto close = [&](const std::pair<bool, int64_t>& c) {
    if (!c.first) return;
    shape.widest = std::max(shape.widest, c.second);
    shape.member_work += uint64_t(c.second) * uint64_t(c.second);
  };
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      shape.nesting = std::max(shape.nesting, ++depth);
      if (depth <= kMaxJsonNesting + 1) open.emplace_back(c == '{', 0);
    } else if ((c == ']' || c == '}') && depth > 0) {
      if (depth-- <= kMaxJsonNesting + 1) {
        close(open.back());
        open.pop_back();
      }
    } else if (c == ':' && depth > 0 && depth <= kMaxJsonNesting + 1) {
      ++open.back().second;
    }
  }
  for (const auto& c : open) close(c);  // not JSON, but its objects' members were counted all the same
  return shape;
}

std::string json_refusal(std::string_view text) {
  const JsonShape shape = json_shape(text);
  if (shape.nesting > kMaxJsonNesting) {
    return format("nests arrays and objects deeper than %d levels", kMaxJsonNesting);
  }
  if (shape.member_work > kMaxJsonMemberWork) {
    return format(
        "has too many object members to parse in reasonable time (%lld in its largest object; at most "
        "10,000 in one, fewer across many)",
        (long long)shape.widest);
  }
  return std::string();
}

}  // namespace magnetar
