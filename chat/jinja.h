// A Jinja engine for the chat templates embedded in GGUF files (`tokenizer.chat_template`).
//
// The subset real templates use: text, {{ }}, {% if/elif/else %}, {% for %} (else, `if` filter, tuple
// unpacking, loop.*), {% set %} (names, tuples, namespace attributes, block set), {% macro %} / {% call %},
// {% filter %}, {% break %} / {% continue %}, {% raw %}, {% generation %}, comments, whitespace control;
// filters, tests, string/dict methods and the globals raise_exception, range, namespace, dict, strftime_now.
//
// Semantics follow Python jinja2 as Hugging Face transformers' apply_chat_template sets it up (the engine
// that rendered the prompts models were trained on): trim_blocks and lstrip_blocks on, newlines normalized,
// values print as Python's str() (True, None, 2.0, ['a', 1], {'k': 1}; undefined prints nothing), tojson is
// json.dumps with ensure_ascii off, strings index and measure in code points, `==` compares by value, a loop
// iteration's and a macro's assignments stay inside them. tests/chat/jinja_parity_test.cpp checks identical
// output against Python jinja2 on the official Qwen3, Qwen2.5, Llama 3.1, Gemma 3 and DeepSeek-V3 templates
// and on feature snippets. Filters that return generators in Python return lists here.
//
// The template comes from an untrusted file: parsing and rendering never throw or crash, nesting and
// recursion are bounded, and a render that runs away (huge loops, exponential growth) stops with an error.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace magnetar::chat {

namespace jinja {
struct Program;
}

class JinjaTemplate {
 public:
  // Errors name the line and column in `source`: "chat template 3:17: expected '%}', got '}}'".
  static Result<JinjaTemplate> parse(std::string_view source);

  // Renders with the top-level variables of `context` (messages, tools, add_generation_prompt, bos_token,
  // ...). Object keys keep their order (tojson prints them in that order). Runtime errors name the place:
  // "chat template 12:8: unknown filter 'foo'"; raise_exception('msg') gives
  // "chat template 12:8: raise_exception: msg". Const and thread-safe: HTTP threads render concurrently.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  // The same with a plain json context, whose objects iterate in sorted key order.
  Result<std::string> render(const nlohmann::json& context) const;

  const std::string& source() const;

 private:
  explicit JinjaTemplate(std::shared_ptr<const jinja::Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace magnetar::chat
