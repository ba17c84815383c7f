// `magnetar SUBCOMMAND ...`: git-style dispatch to one thin main per subcommand.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "base/temp_files.h"
#include "tools/commands.h"

namespace {

struct Command {
  std::string_view name;
  int (*main)(int argc, char** argv);
  std::string_view summary;
};

constexpr Command kCommands[] = {
    {"run", magnetar::tools::run_main, "generate text from a prompt (or dump logits)"},
    {"chat", magnetar::tools::chat_main, "interactive multi-turn chat"},
    {"serve", magnetar::tools::serve_main, "OpenAI-compatible HTTP server (chat completions, streaming)"},
    {"perplexity", magnetar::tools::perplexity_main, "perplexity of a text file (windowed or continuous)"},
    {"bench", magnetar::tools::bench_main, "prefill and decode speed at growing context depths"},
    {"inspect", magnetar::tools::inspect_main, "show a GGUF model's architecture, metadata and tensors"},
    {"convert", magnetar::tools::convert_main, "convert a Hugging Face model folder (safetensors) to GGUF"},
    {"quantize", magnetar::tools::quantize_main,
     "quantize an F32/F16/BF16 GGUF to Q8_0, Q4_K, ... (llama.cpp's types)"},
    {"pack", magnetar::tools::pack_main, "rewrite a MoE GGUF expert-major (one aligned record per expert) or verify one"},
    {"synth", magnetar::tools::synth_main, "write a synthetic qwen3moe model of real geometry (for tests, benchmarks)"},
    {"tokenize", magnetar::tools::tokenize_main, "print the token ids of a text (JSON), from a GGUF or an HF tokenizer folder"},
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "magnetar: runs giant Mixture-of-Experts language models on machines smaller than the model.\n\n"
               "usage: magnetar COMMAND [options]     (magnetar COMMAND --help for a command's options)\n\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name.data(), c.summary.data());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    print_usage(stderr);
    return magnetar::tools::kExitBadInput;
  }
  const std::string_view cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    print_usage(stdout);
    return magnetar::tools::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("magnetar %s\n", MAGNETAR_VERSION);
    return magnetar::tools::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (c.name != cmd) continue;
    if (cmd != "serve") magnetar::temp_files::remove_on_signal();  // serve stops on these signals itself
    return c.main(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "magnetar: unknown command '%s' (see magnetar --help)\n", argv[1]);
  return magnetar::tools::kExitBadInput;
}
