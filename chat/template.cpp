#include "chat/template.h"

#include <fstream>
#include <sstream>

#include "chat/chatml.h"

namespace magnetar::chat {

Result<ChatTemplate> ChatTemplate::choose(const TemplateSource& source, std::string* warning) {
  ChatTemplate t;
  t.bos_ = source.bos_token;
  t.eos_ = source.eos_token;
  t.strip_bos_ = source.tokenizer_adds_bos;
  std::string text;
  if (!source.builtin.empty()) {
    if (source.builtin != "chatml") {
      return Status::error("--chat-template " + source.builtin + ": unknown built-in template (known: chatml)");
    }
    if (!source.file_path.empty()) return Status::error("--chat-template and --chat-template-file exclude each other");
    t.origin_ = "built-in ChatML (--chat-template chatml)";
    return t;
  }
  if (!source.file_path.empty()) {
    std::ifstream in(source.file_path, std::ios::binary);
    if (!in) return Status::error("--chat-template-file " + source.file_path + ": cannot read the file");
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
    if (text.empty()) return Status::error("--chat-template-file " + source.file_path + ": the file is empty");
    t.origin_ = source.file_path;
  } else if (!source.gguf_template.empty()) {
    text = source.gguf_template;
    t.origin_ = "the GGUF's chat_template";
  } else {
    const std::string& arch = source.architecture;
    if (arch.rfind("qwen", 0) != 0) {
      return Status::error("the model has no chat_template and '" + arch +
                           "' has no built-in one: give one with --chat-template-file");
    }
    t.origin_ = "built-in ChatML (" + arch + ")";
    if (warning) *warning = "the model has no chat_template: prompts use the built-in ChatML of the Qwen family";
    return t;
  }
  Result<JinjaTemplate> parsed = JinjaTemplate::parse(text);
  if (!parsed.ok()) return Status::error(t.origin_ + ": " + parsed.status().message());
  t.jinja_.emplace(std::move(parsed).value());
  return t;
}

Result<std::string> ChatTemplate::render(const Conversation& conversation, bool add_generation_prompt) const {
  if (!jinja_) return render_chatml(conversation, add_generation_prompt);
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  // As transformers' apply_chat_template: tools and documents are None when there are none.
  context["messages"] = conversation.messages;
  context["tools"] = conversation.tools.empty() ? nlohmann::ordered_json() : conversation.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  context["enable_thinking"] = conversation.enable_thinking;
  context["bos_token"] = bos_;
  context["eos_token"] = eos_;
  Result<std::string> text = jinja_->render(context);
  if (!text.ok()) return Status::error(origin_ + ": " + text.status().message());
  if (strip_bos_ && !bos_.empty() && text->starts_with(bos_)) text->erase(0, bos_.size());
  return text;
}

}  // namespace magnetar::chat
