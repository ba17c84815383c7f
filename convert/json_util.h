// JSON reading for the converter's inputs (safetensors headers, config.json, index.json), without exceptions.
//
// nlohmann::json throws on type mismatches; every accessor here checks the type first, so hostile input
// becomes a Status naming the file and the field, never an exception or a crash. Parsing is depth-limited
// (the inputs we read are shallow) so a header of a million nested brackets is refused, not recursed into.
// Internal to magnetar_convert: callers outside convert/ use hf_model.h's typed accessors.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

// Unwraps a Result<T> into `lhs` or returns its Status from the enclosing function. Expands to several
// statements: brace it under an if.
namespace magnetar::convert {

using Json = nlohmann::json;

// Parses `text` as one JSON value. `source` names the input in the error ("config.json: invalid JSON"). Texts
// nested deeper than `max_depth` are refused before they are parsed; with `unique_keys`, so are objects that repeat
// a key (nlohmann, like Python's json, keeps the last).
Result<Json> parse_json(std::string_view text, std::string_view source, int max_depth = 32, bool unique_keys = false);
// Reads and parses a whole file; a missing file is an error naming it.
Result<Json> read_json_file(const std::string& path, std::string_view source, int max_depth = 32,
                            bool unique_keys = false);

// "[2048, 768]" for messages.
std::string shape_string(const std::vector<int64_t>& shape);

// Typed views of a JSON object's fields. Absent and null both count as "not set"; a value of the wrong
// type is an error "SOURCE: field 'KEY' ...". The view does not own the JSON: it must outlive the view.
class JsonObject {
 public:
  // `prefix` qualifies field names of nested objects in messages: "rope_parameters.factor".
  JsonObject(const Json* object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  bool has(std::string_view key) const;  // present and not null

  Result<int64_t> integer(std::string_view key) const;  // required
  Result<double> number(std::string_view key) const;    // required; integers accepted
  Result<std::optional<int64_t>> optional_integer(std::string_view key) const;
  Result<std::optional<double>> optional_number(std::string_view key) const;
  Result<std::optional<bool>> optional_bool(std::string_view key) const;
  Result<std::optional<std::string>> optional_string(std::string_view key) const;
  Result<std::vector<int64_t>> integer_array(std::string_view key) const;  // absent/null: empty
  Result<std::vector<std::string>> string_array(std::string_view key) const;
  // A nested object ("rope_parameters"), or nullopt when absent/null.
  Result<std::optional<JsonObject>> optional_object(std::string_view key) const;

 private:
  const Json* field(std::string_view key) const;  // nullptr when absent or null
  Status type_error(std::string_view key, const char* expected) const;
  Status missing(std::string_view key) const;

  const Json* object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace magnetar::convert
