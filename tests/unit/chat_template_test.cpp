// chat/template.h: which template a model's prompts use (file > GGUF > built-in ChatML for Qwen > refused), and
// what a Jinja template receives (messages, tools only when offered, add_generation_prompt, enable_thinking,
// bos/eos text). Expected strings are written out by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "chat/chatml.h"
#include "chat/template.h"

namespace magnetar::chat {
namespace {

Conversation hello() {
  Conversation c;
  c.messages.push_back({{"role", "user"}, {"content", "Hi"}});
  return c;
}

// Prints what the template sees, in a fixed order.
constexpr const char* kProbe =
    "{{ bos_token }}|{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}|"
    "{{ tools is none }}{{ documents is none }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ eos_token }}";

TEST(ChatTemplate, GgufTemplateGetsTheHuggingFaceVariables) {
  std::string warning;
  auto t = ChatTemplate::choose({.gguf_template = kProbe, .architecture = "qwen3moe", .bos_token = "<s>",
                                 .eos_token = "</s>"},
                                &warning);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(warning.empty());
  EXPECT_EQ(t.value().origin(), "the GGUF's chat_template");
  Conversation c = hello();
  EXPECT_EQ(t.value().render(c, true).value(), "<s>|user=Hi;|TrueTrue|True|False|</s>");
  c.tools.push_back({{"type", "function"}, {"function", {{"name", "f"}, {"parameters", nlohmann::ordered_json::object()}}}});
  c.enable_thinking = true;
  EXPECT_EQ(t.value().render(c, false).value(), "<s>|user=Hi;|FalseTrue|False|True|</s>");
}

// A tokenizer that adds BOS itself (Llama 3's) would give a template that writes bos_token two BOS tokens: the
// rendered prompt loses its leading BOS text then, and keeps it otherwise.
TEST(ChatTemplate, ALeadingBosIsLeftToATokenizerThatAddsOne) {
  auto adds = ChatTemplate::choose({.gguf_template = kProbe,
                                    .architecture = "qwen3moe",
                                    .bos_token = "<s>",
                                    .eos_token = "</s>",
                                    .tokenizer_adds_bos = true},
                                   nullptr);
  ASSERT_TRUE(adds.ok()) << adds.status().message();
  EXPECT_EQ(adds.value().render(hello(), true).value(), "|user=Hi;|TrueTrue|True|False|</s>");
  auto mid = ChatTemplate::choose(
      {.gguf_template = "x{{ bos_token }}", .architecture = "qwen3moe", .bos_token = "<s>", .tokenizer_adds_bos = true},
      nullptr);
  ASSERT_TRUE(mid.ok()) << mid.status().message();
  EXPECT_EQ(mid.value().render(hello(), true).value(), "x<s>");  // only a leading one
}

TEST(ChatTemplate, FileOverridesTheGgufAndErrorsNameTheOrigin) {
  const std::string path = ::testing::TempDir() + "tmpl_" + std::to_string(getpid()) + ".jinja";
  std::ofstream(path) << "{{ raise_exception('no system role here') }}";
  auto t = ChatTemplate::choose({.file_path = path, .gguf_template = kProbe, .architecture = "qwen3moe"}, nullptr);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t.value().origin(), path);
  const Result<std::string> r = t.value().render(hello(), true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("no system role here"), std::string::npos) << r.status().message();
  std::remove(path.c_str());

  auto missing = ChatTemplate::choose({.file_path = "/nonexistent/t.jinja", .architecture = "qwen3moe"}, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--chat-template-file /nonexistent/t.jinja"), std::string::npos);
  auto broken = ChatTemplate::choose({.gguf_template = "{% if %}", .architecture = "qwen3moe"}, nullptr);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("the GGUF's chat_template: chat template 1:"), std::string::npos)
      << broken.status().message();
}

TEST(ChatTemplate, NoTemplateFallsBackToChatMLForQwenOnly) {
  std::string warning;
  auto t = ChatTemplate::choose({.architecture = "qwen3moe"}, &warning);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(warning.find("built-in ChatML"), std::string::npos);
  EXPECT_EQ(t.value().render(hello(), true).value(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  auto other = ChatTemplate::choose({.architecture = "llama"}, &warning);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("--chat-template-file"), std::string::npos);
}

TEST(ChatTemplate, BuiltinChatmlOverridesTheGguf) {
  auto t = ChatTemplate::choose({.builtin = "chatml", .gguf_template = kProbe, .architecture = "llama"}, nullptr);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t.value().render(hello(), true).value(), render_chatml(hello(), true));
  auto unknown = ChatTemplate::choose({.builtin = "vicuna", .architecture = "qwen3moe"}, nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--chat-template vicuna: unknown"), std::string::npos);
}

}  // namespace
}  // namespace magnetar::chat
