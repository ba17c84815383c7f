// Request bodies -> the one internal conversation (chat/conversation.h). Both APIs end here, so that rendering
// (the built-in ChatML today, the model's Jinja template later), tool-call forcing and output parsing do not
// care which API a request came by.
//
// Pure functions of the body: no engine, no I/O. Every failure is a Status whose message names the field
// ("messages[2].tool_calls[0].function.arguments is not a JSON object"); the server answers it with a 400.
// Things a request asks for that are accepted but have no effect (a json_schema's schema, a thinking budget) are
// listed in `notes`, which the server prints with --verbose.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "chat/conversation.h"

namespace magnetar::server {

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;  // kNone: tools are neither rendered nor parsed; kRequired / kFunction: forced call
  std::string name;         // kFunction: the function that must be called (one of the tools)
};

struct ChatInput {
  chat::Conversation conversation;  // enable_thinking: what the request asked for (the server may turn it off)
  ToolChoice tool_choice;
  bool json_object = false;        // response_format json_object or json_schema: the answer is one JSON object
  std::vector<std::string> notes;  // accepted and ignored parts of the request, for the debug log
  std::vector<std::string> freeform_tools;  // /v1/responses: custom tools, offered as a function of one string "input"
};

// POST /v1/chat/completions: messages (system, developer, user, assistant with tool_calls and reasoning_content,
// tool with tool_call_id), tools, tool_choice, response_format, chat_template_kwargs.enable_thinking,
// reasoning_effort. Sampling fields are read elsewhere.
Result<ChatInput> openai_chat_input(const nlohmann::ordered_json& body);

// POST /v1/messages and /v1/messages/count_tokens: system, messages with text / tool_use / tool_result /
// thinking blocks, tools (name, description, input_schema), tool_choice, thinking.
Result<ChatInput> anthropic_chat_input(const nlohmann::ordered_json& body);

// POST /v1/responses (OpenAI's Responses API, Codex's): instructions, input (a string, or message, reasoning,
// function_call, function_call_output, custom_tool_call(_output) items), tools (function, custom), tool_choice,
// reasoning.effort, text.format; turned into the chat completions request it means (see conversation.cpp).
Result<ChatInput> responses_chat_input(const nlohmann::ordered_json& body);

}  // namespace magnetar::server
