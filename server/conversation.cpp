#include "server/conversation.h"

#include <string_view>

#include "base/json_shape.h"

namespace magnetar::server {
namespace {

using Json = nlohmann::ordered_json;

// Tool names are embedded in the prompt and in a forced `{"name": "..."` prefix: no quotes, backslashes or
// control characters (both APIs allow only [a-zA-Z0-9_-] anyway).
Status check_tool_name(const Json& name, const std::string& field) {
  if (!name.is_string() || name.get<std::string>().empty()) return Status::error(field + " must be a non-empty string");
  for (const char c : name.get<std::string>()) {
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) {
      return Status::error(field + " must not hold quotes, backslashes or control characters");
    }
  }
  return Status();
}

// Images, documents and audio in a conversation: the models served read text only, and a client that sent one keeps
// it in every later request (Claude Code's Read tool answers with an image block for a picture file), so a refusal
// would end the session. Each becomes a line saying what was there, counted in *media for the request's notes; a
// document given as plain text is that text. Empty when `type` is not such a block (the caller decides).
std::string media_as_text(const Json& block, const std::string& type, int* media) {
  if (type == "document") {
    const Json source = block.value("source", Json());
    if (source.is_object() && source.value("type", Json()) == "text" && source.value("data", Json()).is_string()) {
      return source["data"].get<std::string>();
    }
  }
  const char* what = type == "image" || type == "image_url" || type == "input_image" ? "an image"
                     : type == "document" || type == "file" || type == "input_file"  ? "a document"
                     : type == "input_audio"                                         ? "audio"
                                                                                     : nullptr;
  if (what == nullptr) return std::string();
  ++*media;
  return format("[%s was here: this model reads text only and cannot see it]", what);
}

// The request's note when media_as_text replaced `media` blocks.
void note_media(int media, ChatInput* in) {
  if (media > 0) {
    in->notes.push_back(
        format("%d image, document or audio part(s) became a line saying so (the model reads text only)", media));
  }
}

// ---- OpenAI -----------------------------------------------------------------------------------------------------

// A message's `content`: a string, null (an assistant's), or an array of {"type": "text", "text": STRING} parts
// (joined; image, audio and file parts as media_as_text says).
Result<std::string> openai_content(const Json& content, const std::string& field, int* media) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Status::error(field + " must be a string or an array of text parts");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    auto type = part.is_object() ? part.find("type") : part.end();
    auto t = part.is_object() ? part.find("text") : part.end();
    if (type != part.end() && type->is_string()) {
      if (std::string m = media_as_text(part, *type, media); !m.empty()) {
        text += m;
        continue;
      }
    }
    if (!part.is_object() || type == part.end() || *type != "text" || t == part.end() || !t->is_string()) {
      return Status::error(format("%s[%zu] must be {\"type\": \"text\", \"text\": STRING}", field.c_str(), k));
    }
    text += t->get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name, arguments: JSON STRING}}] ->
// the conversation's calls, arguments parsed.
Result<Json> openai_tool_calls(const Json& calls, const std::string& field) {
  if (!calls.is_array()) return Status::error(field + " must be an array");
  Json out = Json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = format("%s[%zu]", field.c_str(), k);
    const Json& call = calls[k];
    if (!call.is_object()) return Status::error(at + " must be an object");
    auto function = call.find("function");
    if (function == call.end() || !function->is_object()) return Status::error(at + ".function must be an object");
    auto name = function->find("name");
    if (Status s = check_tool_name(name == function->end() ? Json() : *name, at + ".function.name"); !s.ok()) {
      return s;
    }
    Json arguments = Json::object();
    if (auto args = function->find("arguments"); args != function->end() && !args->is_null()) {
      if (args->is_string()) {
        const std::string& text = args->get_ref<const std::string&>();
        if (const std::string why = json_refusal(text); !why.empty()) {
          return Status::error(at + ".function.arguments " + why);
        }
        arguments = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      } else {
        arguments = *args;  // some clients send the object itself
      }
      if (!arguments.is_object()) return Status::error(at + ".function.arguments is not a JSON object");
    }
    std::string id;
    if (auto i = call.find("id"); i != call.end() && !i->is_null()) {
      if (!i->is_string()) return Status::error(at + ".id must be a string");
      id = i->get<std::string>();
    }
    out.push_back(
        {{"type", "function"}, {"id", id}, {"function", {{"name", *name}, {"arguments", std::move(arguments)}}}});
  }
  return out;
}

// The name of the function whose call has `id`, searched in the assistant turns before `end`.
std::string tool_name_of(const Json& messages, const std::string& id) {
  for (size_t i = messages.size(); i-- > 0;) {
    auto calls = messages[i].find("tool_calls");
    if (calls == messages[i].end()) continue;
    for (const Json& call : *calls) {
      if (call["id"] == id) return call["function"]["name"].get<std::string>();
    }
  }
  return {};
}

// A function tool, normalized to {type, function: {name, description, parameters}} (the fields present).
Result<Json> function_tool(const Json& name, const Json* description, const Json* parameters, const std::string& at,
                           const char* parameters_field) {
  if (Status s = check_tool_name(name, at + ".name"); !s.ok()) return s;
  Json function = {{"name", name}};
  if (description && !description->is_null()) {
    if (!description->is_string()) return Status::error(at + ".description must be a string");
    function["description"] = *description;
  }
  if (parameters && !parameters->is_null()) {
    if (!parameters->is_object()) return Status::error(at + "." + parameters_field + " must be an object");
    function["parameters"] = *parameters;
  }
  return Json{{"type", "function"}, {"function", std::move(function)}};
}

const Json* find_ptr(const Json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

bool has_tool(const Json& tools, const std::string& name) {
  for (const Json& t : tools) {
    if (t["function"]["name"] == name) return true;
  }
  return false;
}

Status openai_tool_choice(const Json& body, ChatInput* out) {
  auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return Status();
  ToolChoice& tc = out->tool_choice;
  if (choice->is_string()) {
    const std::string mode = choice->get<std::string>();
    if (mode == "auto") return Status();
    if (mode == "none") {
      tc.mode = ToolChoice::Mode::kNone;
      return Status();
    }
    if (mode != "required") return Status::error("tool_choice must be \"none\", \"auto\", \"required\" or an object");
    if (out->conversation.tools.empty()) return Status::error("tool_choice \"required\" needs tools");
    tc.mode = ToolChoice::Mode::kRequired;
    return Status();
  }
  const Json* function = choice->is_object() ? find_ptr(*choice, "function") : nullptr;
  const Json* name = function && function->is_object() ? find_ptr(*function, "name") : nullptr;
  if (!name || !name->is_string()) {
    return Status::error("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": NAME}}");
  }
  if (!has_tool(out->conversation.tools, name->get<std::string>())) {
    return Status::error("tool_choice.function.name \"" + name->get<std::string>() + "\" is not one of the tools");
  }
  tc.mode = ToolChoice::Mode::kFunction;
  tc.name = name->get<std::string>();
  return Status();
}

// ---- Anthropic --------------------------------------------------------------------------------------------------

// Text blocks (or a string) joined by a blank line; when `media` is given (a tool result), image and document blocks
// as media_as_text says and tool_reference blocks as a line naming the tool (else an error, as other block types are,
// naming the block).
Result<std::string> anthropic_text(const Json& content, const std::string& field, int* media = nullptr) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Status::error(field + " must be a string or an array of content blocks");
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& block = content[k];
    const std::string at = format("%s[%zu]", field.c_str(), k);
    auto type = block.is_object() ? block.find("type") : block.end();
    if (!block.is_object() || type == block.end() || !type->is_string()) {
      return Status::error(at + " must be an object with a string \"type\"");
    }
    std::string part = media && *type != "text" ? media_as_text(block, *type, media) : std::string();
    // Claude Code's tool search answers with tool_reference blocks (a deferred tool now loaded); every tool's
    // definition is in the prompt here (defer_loading is not applied), so a line naming it says all.
    if (media && *type == "tool_reference" && block.value("tool_name", Json()).is_string()) {
      part = "[tool " + block["tool_name"].get<std::string>() + " is loaded]";
    }
    if (*type != "text" && part.empty()) {
      return Status::error(at + ".type \"" + type->get<std::string>() + "\" is not supported");
    }
    if (*type == "text") {
      auto t = block.find("text");
      if (t == block.end() || !t->is_string()) return Status::error(at + ".text must be a string");
      part = t->get<std::string>();
    }
    if (!text.empty() && !part.empty()) text += "\n\n";
    text += part;
  }
  return text;
}

// One Anthropic message -> conversation messages. A user turn's tool_result blocks become `tool` messages and
// its text blocks user messages, in block order (consecutive text blocks joined by a blank line); an assistant
// turn's text, thinking and tool_use blocks become one assistant message.
Status anthropic_message(const Json& m, size_t i, Json* messages, int* media) {
  if (!m.is_object()) return Status::error(format("messages[%zu] must be an object", i));
  auto role = m.find("role");
  if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant" && *role != "system")) {
    return Status::error(format("messages[%zu].role must be \"user\", \"assistant\" or \"system\"", i));
  }
  const std::string field = format("messages[%zu].content", i);
  if (*role == "system") {
    // Claude Code (2.1.154 on) sends instructions as system messages between the others: rendered where they are
    // (moved into the leading system prompt, one that changes would change the start of every later prompt).
    Result<std::string> text = anthropic_text(m.value("content", Json()), field);
    if (!text.ok()) return text.status();
    messages->push_back({{"role", "system"}, {"content", text.value()}});
    return Status();
  }
  const Json content = m.value("content", Json());
  if (content.is_null()) return Status::error(field + " is required (a string or an array of content blocks)");
  if (content.is_string()) {
    messages->push_back({{"role", *role}, {"content", content.get<std::string>()}});
    return Status();
  }
  if (!content.is_array()) return Status::error(field + " must be a string or an array of content blocks");
  const bool assistant = *role == "assistant";
  std::string text, reasoning;
  bool has_text = false;
  Json calls = Json::array();
  auto flush_user_text = [&] {
    if (has_text) messages->push_back({{"role", "user"}, {"content", text}});
    text.clear();
    has_text = false;
  };
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& block = content[k];
    const std::string at = format("%s[%zu]", field.c_str(), k);
    auto type = block.is_object() ? block.find("type") : block.end();
    if (!block.is_object() || type == block.end() || !type->is_string()) {
      return Status::error(at + " must be an object with a string \"type\"");
    }
    std::string part = *type != "text" && !assistant ? media_as_text(block, *type, media) : std::string();
    if (*type == "text" || !part.empty()) {
      if (*type == "text") {
        auto t = block.find("text");
        if (t == block.end() || !t->is_string()) return Status::error(at + ".text must be a string");
        part = t->get<std::string>();
      }
      if (has_text && !text.empty() && !part.empty()) text += "\n\n";
      text += part;
      has_text = true;
    } else if (*type == "tool_use" && assistant) {
      auto name = block.find("name");
      if (Status s = check_tool_name(name == block.end() ? Json() : *name, at + ".name"); !s.ok()) return s;
      const Json input = block.value("input", Json::object());
      if (!input.is_object()) return Status::error(at + ".input must be an object");
      const Json id = block.value("id", Json(""));
      if (!id.is_string()) return Status::error(at + ".id must be a string");
      calls.push_back({{"type", "function"}, {"id", id}, {"function", {{"name", *name}, {"arguments", input}}}});
    } else if (*type == "tool_result" && !assistant) {
      flush_user_text();
      Result<std::string> result = anthropic_text(block.value("content", Json()), at + ".content", media);
      if (!result.ok()) return result.status();
      const Json id = block.value("tool_use_id", Json(""));
      if (!id.is_string()) return Status::error(at + ".tool_use_id must be a string");
      Json tool = {{"role", "tool"}, {"content", result.value()}, {"tool_call_id", id}};
      if (std::string name = tool_name_of(*messages, id.get<std::string>()); !name.empty()) tool["name"] = name;
      messages->push_back(std::move(tool));
    } else if (*type == "thinking" && assistant) {
      if (auto t = block.find("thinking"); t != block.end() && t->is_string()) {
        if (!reasoning.empty()) reasoning += "\n\n";
        reasoning += t->get<std::string>();
      }
    } else if (*type != "redacted_thinking") {
      return Status::error(at + ".type \"" + type->get<std::string>() + "\" is not supported in a " +
                           role->get<std::string>() + " message");
    }
  }
  if (!assistant) {
    flush_user_text();
    return Status();
  }
  Json message = {{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!calls.empty()) message["tool_calls"] = std::move(calls);
  messages->push_back(std::move(message));
  return Status();
}

}  // namespace

Result<ChatInput> openai_chat_input(const Json& body) {
  ChatInput in;
  Json& messages = in.conversation.messages;
  int media = 0;
  auto list = body.find("messages");
  if (list == body.end()) return Status::error("messages is required");
  if (!list->is_array() || list->empty()) return Status::error("messages must be a non-empty array");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& m = (*list)[i];
    const std::string at = format("messages[%zu]", i);
    if (!m.is_object()) return Status::error(at + " must be an object");
    auto role_it = m.find("role");
    std::string role = role_it != m.end() && role_it->is_string() ? role_it->get<std::string>() : "";
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return Status::error(at + ".role must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"");
    }
    // OpenAI's API: every message but an assistant's (whose turn may be only tool calls) carries content.
    const Json content_field = m.value("content", Json());
    if (content_field.is_null() && role != "assistant") {
      return Status::error(at + ".content is required (a string or an array of text parts)");
    }
    Result<std::string> content = openai_content(content_field, at + ".content", &media);
    if (!content.ok()) return content.status();
    Json message = {{"role", role}, {"content", content.value()}};
    if (role == "assistant") {
      if (auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
        if (!r->is_string()) return Status::error(at + ".reasoning_content must be a string");
        message["reasoning_content"] = *r;
      }
      if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
        Result<Json> parsed = openai_tool_calls(*calls, at + ".tool_calls");
        if (!parsed.ok()) return parsed.status();
        if (!parsed->empty()) message["tool_calls"] = std::move(parsed.value());
      }
    } else if (role == "tool") {
      std::string id;
      if (auto i_id = m.find("tool_call_id"); i_id != m.end() && !i_id->is_null()) {
        if (!i_id->is_string()) return Status::error(at + ".tool_call_id must be a string");
        id = i_id->get<std::string>();
      }
      message["tool_call_id"] = id;
      if (std::string name = tool_name_of(messages, id); !name.empty()) message["name"] = name;
    }
    messages.push_back(std::move(message));
  }
  note_media(media, &in);

  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Status::error("tools must be an array");
    for (size_t k = 0; k < tools->size(); ++k) {
      const Json& t = (*tools)[k];
      const std::string at = format("tools[%zu]", k);
      if (!t.is_object() || t.value("type", Json("function")) != "function") {
        return Status::error(at + " must be {\"type\": \"function\", \"function\": {...}}");
      }
      auto function = t.find("function");
      if (function == t.end() || !function->is_object()) return Status::error(at + ".function must be an object");
      Result<Json> tool = function_tool(function->value("name", Json()), find_ptr(*function, "description"),
                                        find_ptr(*function, "parameters"), at + ".function", "parameters");
      if (!tool.ok()) return tool.status();
      in.conversation.tools.push_back(std::move(tool.value()));
    }
  }
  if (Status s = openai_tool_choice(body, &in); !s.ok()) return s;

  if (auto format = body.find("response_format"); format != body.end() && !format->is_null()) {
    const Json type = format->is_object() ? format->value("type", Json()) : Json();
    if (type == "json_object") {
      in.json_object = true;
    } else if (type == "json_schema") {
      in.json_object = true;
      in.notes.push_back(
          "response_format json_schema: the output is constrained to a JSON object; the schema "
          "itself is not enforced");
    } else if (type != "text") {
      return Status::error("response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }

  // Thinking: the chat_template_kwargs of vLLM and llama.cpp, or reasoning_effort ("none" is off).
  if (auto kwargs = body.find("chat_template_kwargs"); kwargs != body.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) return Status::error("chat_template_kwargs must be an object");
    if (auto e = kwargs->find("enable_thinking"); e != kwargs->end() && !e->is_null()) {
      if (!e->is_boolean()) return Status::error("chat_template_kwargs.enable_thinking must be a boolean");
      in.conversation.enable_thinking = e->get<bool>();
    }
  }
  if (auto effort = body.find("reasoning_effort"); effort != body.end() && !effort->is_null()) {
    if (!effort->is_string()) return Status::error("reasoning_effort must be a string");
    in.conversation.enable_thinking = *effort != "none";
    if (*effort != "none") in.notes.push_back("reasoning_effort: any level but \"none\" turns thinking on");
  }
  return in;
}

// Claude Code (2.1.36 on) opens the system prompt with a line `x-anthropic-billing-header: cc_version=...; cch=...;`
// whose hash changes with every request: left in, no two requests share more than the first few tokens of their
// prompts, and every turn computes the whole conversation again. It is telemetry for Anthropic's API, not words for
// the model: such lines are dropped (with the blank line that joined their block to the next). True if one was.
namespace {

bool drop_billing_header(std::string* text) {
  static constexpr std::string_view kHeader = "x-anthropic-billing-header:";
  bool dropped = false;
  for (size_t at = 0; at < text->size();) {
    size_t end = text->find('\n', at);
    end = end == std::string::npos ? text->size() : end + 1;
    if (std::string_view(*text).substr(at, kHeader.size()) != kHeader) {
      at = end;
      continue;
    }
    while (end < text->size() && (*text)[end] == '\n') ++end;
    text->erase(at, end - at);
    dropped = true;
  }
  return dropped;
}

}  // namespace

Result<ChatInput> anthropic_chat_input(const Json& body) {
  ChatInput in;
  Json& messages = in.conversation.messages;
  int media = 0;
  if (auto system = body.find("system"); system != body.end()) {
    Result<std::string> text = anthropic_text(*system, "system");
    if (!text.ok()) return text.status();
    if (drop_billing_header(&text.value())) {
      in.notes.push_back("system: the x-anthropic-billing-header line is dropped (it changes with every request)");
    }
    if (!text->empty()) messages.push_back({{"role", "system"}, {"content", text.value()}});
  }
  auto list = body.find("messages");
  if (list == body.end()) return Status::error("messages is required");
  if (!list->is_array() || list->empty()) return Status::error("messages must be a non-empty array");
  for (size_t i = 0; i < list->size(); ++i) {
    if (Status s = anthropic_message((*list)[i], i, &messages, &media); !s.ok()) return s;
  }
  note_media(media, &in);

  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Status::error("tools must be an array");
    for (size_t k = 0; k < tools->size(); ++k) {
      const Json& t = (*tools)[k];
      const std::string at = format("tools[%zu]", k);
      if (!t.is_object()) return Status::error(at + " must be an object");
      // Server tools (web_search_..., bash_..., text_editor_...) have a versioned type and no input_schema: the
      // model cannot run them here, so they are left out.
      if (t.contains("type") && t["type"] != "custom" && !t.contains("input_schema")) {
        in.notes.push_back(at + ": server tool \"" + t.value("name", std::string()) + "\" is not offered");
        continue;
      }
      Result<Json> tool = function_tool(t.value("name", Json()), find_ptr(t, "description"),
                                        find_ptr(t, "input_schema"), at, "input_schema");
      if (!tool.ok()) return tool.status();
      in.conversation.tools.push_back(std::move(tool.value()));
    }
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    const Json type = choice->is_object() ? choice->value("type", Json()) : Json();
    ToolChoice& tc = in.tool_choice;
    if (type == "none") {
      tc.mode = ToolChoice::Mode::kNone;
    } else if (type == "any") {
      if (in.conversation.tools.empty()) return Status::error("tool_choice {\"type\": \"any\"} needs tools");
      tc.mode = ToolChoice::Mode::kRequired;
    } else if (type == "tool") {
      const Json name = choice->value("name", Json());
      if (!name.is_string() || !has_tool(in.conversation.tools, name.get<std::string>())) {
        return Status::error("tool_choice.name must name one of the tools");
      }
      tc.mode = ToolChoice::Mode::kFunction;
      tc.name = name.get<std::string>();
    } else if (type != "auto") {
      return Status::error("tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"");
    }
  }
  if (auto thinking = body.find("thinking"); thinking != body.end() && !thinking->is_null()) {
    const Json type = thinking->is_object() ? thinking->value("type", Json()) : Json();
    if (type == "enabled" || type == "adaptive") {
      in.conversation.enable_thinking = true;
      if (thinking->contains("budget_tokens")) {
        in.notes.push_back("thinking.budget_tokens is ignored (the reasoning ends when the model ends it)");
      }
    } else if (type != "disabled") {
      return Status::error("thinking.type must be \"enabled\" or \"disabled\"");
    }
  }
  return in;
}

// ---- OpenAI Responses -----------------------------------------------------------------------------------------

namespace {

// The text of a Responses message's content (a string or parts: input_text, output_text, refusal; images and files
// as media_as_text says) or of a function call's output (a string or such parts).
Result<std::string> responses_text(const Json& content, const std::string& field, int* media) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Status::error(field + " must be a string or an array of content parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string at = format("%s[%zu]", field.c_str(), j);
    const Json type = part.is_object() ? part.value("type", Json()) : Json();
    if (!type.is_string()) return Status::error(at + " must be an object with a string \"type\"");
    std::string piece = media_as_text(part, type.get<std::string>(), media);
    if (piece.empty()) {
      const char* key = type == "refusal" ? "refusal" : "text";
      if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") {
        return Status::error(at + ".type \"" + type.get<std::string>() + "\" is not supported");
      }
      if (!part.value(key, Json()).is_string()) return Status::error(at + "." + key + " must be a string");
      piece = part[key].get<std::string>();
    }
    text += piece;
  }
  return text;
}

// A member of an object, or null: read in place (an input array is the whole conversation, resent every turn).
const Json& member(const Json& object, const char* key) {
  static const Json kNull;
  const Json* found = object.is_object() ? find_ptr(object, key) : nullptr;
  return found ? *found : kNull;
}

// A string field of an item, or an error naming it.
Result<std::string> item_string(const Json& item, const char* key, const std::string& at) {
  const Json v = item.value(key, Json());
  if (!v.is_string()) return Status::error(at + "." + key + " must be a string");
  return v.get<std::string>();
}

// The /v1/responses body as the /v1/chat/completions body it means. `instructions` and the system or developer
// messages before the first user or assistant item make one leading system message (several would fail the templates
// that want one, first); later ones stay where they are. A run of reasoning, assistant message and function call
// items is one assistant message (reasoning_content, content, tool_calls); function call outputs are tool messages.
// Freeform (custom) tools are offered as a function of one string "input" and listed in in->freeform_tools. Tools and
// items of other types (web search, image generation, shell calls made by the service) are left out, with a note.
Result<Json> responses_as_chat(const Json& body, ChatInput* in, int* media) {
  Json messages = Json::array();
  std::string system;
  bool conversation_started = false;
  std::ptrdiff_t open = -1;  // the assistant message the current run of assistant items goes into
  auto add_system = [&](const std::string& text) {
    if (text.empty()) return;
    if (!conversation_started) {
      system += (system.empty() ? "" : "\n\n") + text;
    } else {
      messages.push_back({{"role", "system"}, {"content", text}});
      open = -1;
    }
  };
  auto assistant = [&]() -> Json& {
    conversation_started = true;
    if (open < 0) {
      messages.push_back({{"role", "assistant"}, {"content", ""}});
      open = std::ptrdiff_t(messages.size()) - 1;
    }
    return messages[size_t(open)];
  };
  auto append = [](Json& message, const char* key, const std::string& text) {
    std::string now = message.value(key, std::string());
    if (!now.empty() && !text.empty()) now += "\n\n";
    message[key] = now + text;
  };
  if (auto instructions = body.find("instructions"); instructions != body.end() && !instructions->is_null()) {
    if (!instructions->is_string()) return Status::error("instructions must be a string");
    add_system(instructions->get<std::string>());
  }
  const Json& input = member(body, "input");
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    conversation_started = true;
  } else if (!input.is_array()) {
    return Status::error("input must be a string or an array of items");
  }
  for (size_t k = 0; input.is_array() && k < input.size(); ++k) {
    const Json& item = input[k];
    const std::string at = format("input[%zu]", k);
    if (!item.is_object()) return Status::error(at + " must be an object");
    const Json type_field = item.value("type", Json(item.contains("role") ? "message" : ""));
    const std::string type = type_field.is_string() ? type_field.get<std::string>() : "";
    if (type == "message") {
      const Json role = item.value("role", Json());
      Result<std::string> text = responses_text(member(item, "content"), at + ".content", media);
      if (!text.ok()) return text.status();
      if (role == "user") {
        messages.push_back({{"role", "user"}, {"content", text.value()}});
        conversation_started = true;
        open = -1;
      } else if (role == "assistant") {
        append(assistant(), "content", text.value());
      } else if (role == "system" || role == "developer") {
        add_system(text.value());
      } else {
        return Status::error(at + ".role must be \"user\", \"assistant\", \"system\" or \"developer\"");
      }
    } else if (type == "reasoning") {
      // The reasoning itself (content) when the item has it, else its summary.
      std::string text;
      for (const char* key : {"content", "summary"}) {
        const Json parts = item.value(key, Json());
        for (size_t j = 0; parts.is_array() && j < parts.size(); ++j) {
          if (parts[j].is_object() && parts[j].value("text", Json()).is_string()) {
            text += (text.empty() ? "" : "\n\n") + parts[j]["text"].get<std::string>();
          }
        }
        if (!text.empty()) break;
      }
      if (!text.empty()) append(assistant(), "reasoning_content", text);  // an encrypted_content alone: nothing
    } else if (type == "function_call" || type == "custom_tool_call") {
      Result<std::string> name = item_string(item, "name", at);
      Result<std::string> call_id = item_string(item, "call_id", at);
      Result<std::string> arguments = item_string(item, type == "function_call" ? "arguments" : "input", at);
      for (const Status& st : {name.status(), call_id.status(), arguments.status()}) {
        if (!st.ok()) return st;
      }
      const std::string args = type == "function_call" ? arguments.value() : Json{{"input", arguments.value()}}.dump();
      Json& message = assistant();
      if (!message.contains("tool_calls")) message["tool_calls"] = Json::array();
      message["tool_calls"].push_back(
          {{"id", call_id.value()}, {"type", "function"}, {"function", {{"name", name.value()}, {"arguments", args}}}});
    } else if (type == "function_call_output" || type == "custom_tool_call_output") {
      Result<std::string> call_id = item_string(item, "call_id", at);
      if (!call_id.ok()) return call_id.status();
      Result<std::string> output = responses_text(member(item, "output"), at + ".output", media);
      if (!output.ok()) return output.status();
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id.value()}, {"content", output.value()}});
      open = -1;
    } else {
      in->notes.push_back(at + ": an item of type \"" + type + "\" is left out");
    }
  }
  if (!system.empty()) messages.insert(messages.begin(), Json{{"role", "system"}, {"content", system}});
  if (messages.empty()) return Status::error("input has no message");

  Json chat = {{"messages", std::move(messages)}};
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return Status::error("tools must be an array");
    chat["tools"] = Json::array();
    for (size_t k = 0; k < tools->size(); ++k) {
      const Json& t = (*tools)[k];
      const std::string at = format("tools[%zu]", k);
      const Json type = t.is_object() ? t.value("type", Json()) : Json();
      if (type == "function" || type == "custom") {  // named as this API names the fields
        if (Status st = check_tool_name(t.value("name", Json()), at + ".name"); !st.ok()) return st;
      }
      if (type == "function") {
        Json function = {{"name", t.value("name", Json())}};
        for (const char* key : {"description", "parameters"}) {
          if (t.contains(key) && !t[key].is_null()) function[key] = t[key];
        }
        chat["tools"].push_back({{"type", "function"}, {"function", std::move(function)}});
      } else if (type == "custom") {
        // A freeform tool takes raw text (a patch, ...): offered as a function of one string, and the model's call
        // goes back as a custom_tool_call of that string.
        const std::string name = t.value("name", Json()).is_string() ? t["name"].get<std::string>() : "";
        const std::string description =
            t.value("description", Json()).is_string() ? t["description"].get<std::string>() : "";
        chat["tools"].push_back(
            {{"type", "function"},
             {"function",
              {{"name", name},
               {"description", description},
               {"parameters",
                {{"type", "object"},
                 {"properties", {{"input", {{"type", "string"}, {"description", "the tool's raw input text"}}}}},
                 {"required", {"input"}}}}}}});
        in->freeform_tools.push_back(name);
      } else {
        in->notes.push_back(at + ": a tool of type " + (type.is_string() ? type.get<std::string>() : "?") +
                            " is not offered (only function and custom tools run here)");
      }
    }
  }
  if (auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null()) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() &&
               (choice->value("type", Json()) == "function" || choice->value("type", Json()) == "custom")) {
      const Json name = choice->value("name", Json());
      bool offered = false;
      for (const Json& t : chat.value("tools", Json::array())) offered = offered || t["function"]["name"] == name;
      if (!offered) return Status::error("tool_choice.name " + name.dump() + " is not one of the tools");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      return Status::error(
          "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": NAME}");
    }
  }
  if (auto reasoning = body.find("reasoning"); reasoning != body.end() && reasoning->is_object()) {
    if (const Json effort = reasoning->value("effort", Json()); effort.is_string()) chat["reasoning_effort"] = effort;
  }
  if (auto text = body.find("text"); text != body.end() && text->is_object()) {
    const Json type = text->value("format", Json::object()).value("type", Json());
    if (type == "json_schema" || type == "json_object") chat["response_format"] = {{"type", type}};
  }
  return chat;
}

}  // namespace

Result<ChatInput> responses_chat_input(const Json& body) {
  ChatInput from_body;
  int media = 0;
  Result<Json> chat = responses_as_chat(body, &from_body, &media);
  if (!chat.ok()) return chat.status();
  Result<ChatInput> in = openai_chat_input(chat.value());
  if (!in.ok()) return in.status();
  in->notes.insert(in->notes.begin(), from_body.notes.begin(), from_body.notes.end());
  in->freeform_tools = std::move(from_body.freeform_tools);
  note_media(media, &in.value());
  return in;
}

}  // namespace magnetar::server
