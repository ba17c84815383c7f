// Flags shared by the subcommands that run a model (run, chat, perplexity, bench), declared once.
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "tools/cli.h"

namespace magnetar::tools {

struct ModelFlags {
  std::string model;
  int64_t ctx = 0;
  int64_t threads = 0;
  int64_t batch = 512;
  std::string kv_type = "f16";
  bool profile = false;  // set by the command (bench --profile), not a flag of its own

  void add_to(cli::Args& args);
  // Loads the engine; on failure prints "magnetar CMD: message" and returns nullptr.
  std::unique_ptr<Engine> load(const char* command) const;
};

struct SamplingFlags {
  SamplingParams params;
  int64_t seed = 0;
  int64_t top_k = 40;
  int64_t last_n = 64;

  void add_to(cli::Args& args);
  SamplingParams resolved() const;
};

}  // namespace magnetar::tools
