// The chat template a model's prompts are rendered with, chosen once at start:
//   0. --chat-template chatml: the built-in ChatML (for models whose own template lacks what a request needs,
//      e.g. tools: the bundled demo model's template renders no tools),
//   1. a file given with --chat-template-file (Jinja),
//   2. else the GGUF's tokenizer.chat_template (Jinja),
//   3. else the family's built-in: ChatML as Qwen3 writes it (chat/chatml.h) for the Qwen families, with a
//      warning; other families without a template are refused (name the flag).
// Jinja templates get what Hugging Face's apply_chat_template passes: messages, tools (none when there are
// none), documents (none), add_generation_prompt, enable_thinking, bos_token, eos_token.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "chat/conversation.h"
#include "chat/jinja.h"

namespace magnetar::chat {

struct TemplateSource {
  std::string builtin = {};        // --chat-template NAME: "chatml" (empty: none)
  std::string file_path = {};      // --chat-template-file (empty: none)
  std::string gguf_template = {};  // tokenizer.chat_template (empty: none)
  std::string architecture = {};   // general.architecture, for the built-in fallback
  std::string bos_token = {}, eos_token = {};
  bool tokenizer_adds_bos = false;  // the tokenizer puts BOS before the prompt itself (see render)
};

class ChatTemplate {
 public:
  // Parses the chosen template; a file that cannot be read or a template that does not parse is an error
  // naming it. `warning` (when not null) receives the fallback's warning, if one was taken.
  static Result<ChatTemplate> choose(const TemplateSource& source, std::string* warning);

  // The prompt for `conversation`; a template error (raise_exception included) is a Status the server turns
  // into a 400 naming the template. When the tokenizer adds BOS itself, a prompt the template began with the BOS
  // text (Llama 3's does) loses it, so the model sees one BOS, not two (as llama.cpp does; Hugging Face tokenizes
  // rendered templates without adding one).
  Result<std::string> render(const Conversation& conversation, bool add_generation_prompt) const;
  // "the GGUF's chat_template", "FILE", or "built-in ChatML (qwen3moe)"
  const std::string& origin() const { return origin_; }

 private:
  std::optional<JinjaTemplate> jinja_;  // empty: the built-in ChatML
  std::string origin_, bos_, eos_;
  bool strip_bos_ = false;
};

}  // namespace magnetar::chat
