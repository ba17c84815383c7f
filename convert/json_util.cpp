#include "convert/json_util.h"

#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "base/json_shape.h"

namespace magnetar::convert {

Result<Json> parse_json(std::string_view text, std::string_view source, int max_depth, bool unique_keys) {
  const int src_len = int(source.size());
  // Scanned first: the parser's own stacks grow a few bytes per level (a 100 MB header of '[' took gigabytes).
  if (json_shape(text).nesting > max_depth) {
    return Status::error(format("%.*s: JSON nested deeper than %d levels", src_len, source.data(), max_depth));
  }
  // nlohmann keeps the last of repeated keys; `unique_keys` refuses them instead: the keys of each open object.
  std::vector<std::optional<std::set<std::string>>> open;
  std::string repeated;
  const Json::parser_callback_t check = [&](int, Json::parse_event_t event, Json& parsed) {
    if (!unique_keys || !repeated.empty()) return repeated.empty();
    switch (event) {
      case Json::parse_event_t::object_start: open.emplace_back(std::set<std::string>()); break;
      case Json::parse_event_t::array_start: open.emplace_back(); break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open.empty() && open.back() && !open.back()->insert(parsed.get<std::string>()).second) {
          repeated = parsed.get<std::string>();
        }
        break;
      case Json::parse_event_t::value: break;
    }
    return repeated.empty();
  };
  Json j = Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/false);
  if (!repeated.empty()) {
    return Status::error(
        format("%.*s: key '%s' appears twice in one object", src_len, source.data(), repeated.c_str()));
  }
  if (j.is_discarded()) return Status::error(format("%.*s: invalid JSON", src_len, source.data()));
  return j;
}

Result<Json> read_json_file(const std::string& path, std::string_view source, int max_depth, bool unique_keys) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(format("%s: cannot open", path.c_str()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::error(format("%s: read failed", path.c_str()));
  return parse_json(text.str(), source, max_depth, unique_keys);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- JsonObject -----------------------------------------------------------------------------------------

const Json* JsonObject::field(std::string_view key) const {
  if (!object_->is_object()) return nullptr;
  const auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonObject::has(std::string_view key) const { return field(key) != nullptr; }

Status JsonObject::type_error(std::string_view key, const char* expected) const {
  return Status::error(
      format("%s: field '%s%.*s' is not %s", source_.c_str(), prefix_.c_str(), int(key.size()), key.data(), expected));
}

Status JsonObject::missing(std::string_view key) const {
  return Status::error(
      format("%s: field '%s%.*s' is missing", source_.c_str(), prefix_.c_str(), int(key.size()), key.data()));
}

Result<std::optional<int64_t>> JsonObject::optional_integer(std::string_view key) const {
  const Json* v = field(key);
  if (!v) return std::optional<int64_t>();
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return type_error(key, "an integer in range");
    return std::optional<int64_t>(int64_t(u));
  }
  if (v->is_number_integer()) return std::optional<int64_t>(v->get<int64_t>());
  // 4096.0 is an integer written by a float-minded tool; accept it when exact.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d >= -9.2e18 && d <= 9.2e18 && d == double(int64_t(d))) return std::optional<int64_t>(int64_t(d));
  }
  return type_error(key, "an integer");
}

Result<int64_t> JsonObject::integer(std::string_view key) const {
  Result<std::optional<int64_t>> v = optional_integer(key);
  if (!v.ok()) return v.status();
  if (!v.value()) return missing(key);
  return *v.value();
}

Result<std::optional<double>> JsonObject::optional_number(std::string_view key) const {
  const Json* v = field(key);
  if (!v) return std::optional<double>();
  if (!v->is_number()) return type_error(key, "a number");
  return std::optional<double>(v->get<double>());
}

Result<double> JsonObject::number(std::string_view key) const {
  Result<std::optional<double>> v = optional_number(key);
  if (!v.ok()) return v.status();
  if (!v.value()) return missing(key);
  return *v.value();
}

Result<std::optional<bool>> JsonObject::optional_bool(std::string_view key) const {
  const Json* v = field(key);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return type_error(key, "a boolean");
  return std::optional<bool>(v->get<bool>());
}

Result<std::optional<std::string>> JsonObject::optional_string(std::string_view key) const {
  const Json* v = field(key);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) return type_error(key, "a string");
  return std::optional<std::string>(v->get<std::string>());
}

Result<std::vector<int64_t>> JsonObject::integer_array(std::string_view key) const {
  const Json* v = field(key);
  std::vector<int64_t> out;
  if (!v) return out;
  if (!v->is_array()) return type_error(key, "an array of integers");
  for (const Json& item : *v) {
    if (item.is_number_unsigned() && item.get<uint64_t>() <= uint64_t(INT64_MAX)) {
      out.push_back(int64_t(item.get<uint64_t>()));
    } else if (item.is_number_integer() && !item.is_number_unsigned()) {
      out.push_back(item.get<int64_t>());
    } else {
      return type_error(key, "an array of integers");
    }
  }
  return out;
}

Result<std::vector<std::string>> JsonObject::string_array(std::string_view key) const {
  const Json* v = field(key);
  std::vector<std::string> out;
  if (!v) return out;
  if (!v->is_array()) return type_error(key, "an array of strings");
  for (const Json& item : *v) {
    if (!item.is_string()) return type_error(key, "an array of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

Result<std::optional<JsonObject>> JsonObject::optional_object(std::string_view key) const {
  const Json* v = field(key);
  if (!v) return std::optional<JsonObject>();
  if (!v->is_object()) return type_error(key, "an object");
  return std::optional<JsonObject>(JsonObject(v, source_, prefix_ + std::string(key) + "."));
}

}  // namespace magnetar::convert
