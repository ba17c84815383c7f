// The one internal conversation every chat route is normalized into, in the shape Hugging Face chat templates
// receive (`apply_chat_template(messages, tools=..., enable_thinking=...)`), so that a renderer (the built-in
// ChatML below, a Jinja template later) sees what the model's own template was written for.
//
// Contract (what the server's request conversion guarantees and renderers may rely on):
//   messages: an array of objects, in order, each with
//     role:              "system" | "user" | "assistant" | "tool"
//     content:           a string (never null or a part list: text parts are joined, a missing content is "")
//     reasoning_content: assistant only, optional: a string, the reasoning of that turn
//     tool_calls:        assistant only, optional, non-empty: [{type: "function", id: STRING,
//                        function: {name: STRING, arguments: OBJECT}}] (arguments parsed, never a JSON string)
//     tool_call_id:      tool only: the id of the call this result answers ("" when the client sent none)
//     name:              tool only, optional: the function's name, when known
//   tools: an array (empty: no tools offered) of OpenAI function tools, keys in this order:
//     {type: "function", function: {name: STRING, description: STRING (optional), parameters: OBJECT}}
// Objects keep the key order the client sent (ordered_json): templates print tools and arguments with tojson,
// and the order is part of the prompt the model was trained on.
#pragma once

#include <nlohmann/json.hpp>

namespace magnetar::chat {

struct Conversation {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  bool enable_thinking = false;  // the template's enable_thinking
};

}  // namespace magnetar::chat
