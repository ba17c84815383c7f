// Flags shared by the subcommands that run a model (run, chat, perplexity, bench), declared once.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/engine.h"
#include "tools/cli.h"

namespace magnetar::tools {

struct ModelFlags {
  std::string model;
  int64_t ctx = 0;
  int64_t threads = 0;
  int64_t batch = 0;  // auto (EngineOptions::n_batch)
  int64_t sweep = -1;  // auto (EngineOptions::n_sweep)
  int64_t sessions = 1;  // EngineOptions::n_sessions (set by the command, not a flag)
  int64_t ctx_default_max = kDefaultContext;  // EngineOptions::n_ctx_default_max (set by the command before add_to)
  std::string kv_type = "f16";
  std::string device = "auto";
  float gpu_cache_gb = 0;
  bool cpu_experts = false;
  std::string gpu_cache_policy = "lfu";
  bool resident = false, stream = false, mmap = false;
  float cache_gb = 0;
  std::string cache_policy = "lfu";
  bool prefetch = false, no_census = false, no_io_uring = false, no_direct = false;
  int64_t queue_depth = 32;
  int64_t read_gap_kib = -1;
  bool show_plan = false;
  std::string kv_disk_dir;
  float kv_disk_gb = 0;
  int64_t kv_block = 2048;
  bool profile = false;  // set by the command (bench --profile), not a flag of its own

  void add_to(cli::Args& args);
  // Loads the engine; on failure prints "magnetar CMD: message" and returns nullptr.
  std::unique_ptr<Engine> load(const char* command) const;
};

// One line on the expert cache over `seconds` of work on `tokens` tokens: hit rate, bytes read per token,
// disk throughput, time waiting for reads, prefetch accuracy ("" when experts are resident).
std::string expert_summary(const ExpertStats& s, double seconds, int64_t tokens);
nlohmann::json expert_summary_json(const ExpertStats& s, double seconds, int64_t tokens);

struct SamplingFlags {
  SamplingParams params;
  int64_t seed = -1;
  int64_t top_k = 40;
  int64_t last_n = 64;
  int64_t lookup = 0;  // --lookup: drafts per decode step (0: off)

  void add_to(cli::Args& args);
  // The first out-of-range value, as "--flag ...: why" ("" when all are valid).
  std::string error() const;
  SamplingParams resolved() const;
};

}  // namespace magnetar::tools
