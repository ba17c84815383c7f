// `magnetar pack IN.gguf -o OUT.gguf [--verify-after]` and `magnetar pack --verify PACKED.gguf IN.gguf`:
// rewrites a standard MoE GGUF into the expert-major layout (experts/layout.h) and checks a packed file against
// its source. A thin main over experts/pack.h: flags, a progress bar, a summary, Status -> exit code (2 for
// bad input, 1 for a failure while writing or a verification mismatch).
#include "experts/pack.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace magnetar::tools {
namespace {

std::string mib(uint64_t bytes) { return format("%.2f MiB", double(bytes) / double(1ull << 20)); }

// "1806336 bytes (layers 0-46), 2048000 bytes (layer 47)": consecutive layers with the same stride grouped.
std::string strides_text(const std::vector<experts::PackedLayer>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1].record_stride == layers[i].record_stride &&
           layers[j + 1].layer == layers[j].layer + 1) {
      ++j;
    }
    if (!out.empty()) out += ", ";
    out += format("%llu bytes (%s)", (unsigned long long)layers[i].record_stride,
                  i == j ? format("layer %lld", (long long)layers[i].layer).c_str()
                         : format("layers %lld-%lld", (long long)layers[i].layer, (long long)layers[j].layer).c_str());
    i = j + 1;
  }
  return out;
}

Result<std::unique_ptr<gguf::Model>> open_model(const std::string& path) { return gguf::Model::open(path); }

// Compares every byte and prints the result; returns the exit code.
int run_verify(const gguf::Model& packed, const gguf::Model& source) {
  std::optional<Progress> progress;  // created once verify knows the total
  uint64_t compared = 0;
  const experts::VerifyOptions options{.progress = [&](uint64_t done, uint64_t total) {
    if (!progress) progress.emplace("verify " + packed.shards()[0]->path(), total);
    progress->update(done);
    compared = done;
  }};
  const Status s = experts::verify(packed, source, options);
  if (progress) progress->finish(s.ok() ? mib(compared) + " compared" : "mismatch");
  if (!s.ok()) {
    std::fprintf(stderr, "magnetar pack: verify failed: %s\n", s.message().c_str());
    return kExitFailure;
  }
  std::printf("verified  %s against %s: every byte equal (%s compared in %.1f s)\n", packed.shards()[0]->path().c_str(),
              source.shards()[0]->path().c_str(), mib(compared).c_str(), progress ? progress->seconds() : 0.0);
  return kExitOk;
}

}  // namespace

int pack_main(int argc, char** argv) {
  std::string in_path, out_path, verify_path;
  bool verify_after = false;
  cli::Args args(
      "magnetar pack IN.gguf -o OUT.gguf [--verify-after]   |   magnetar pack --verify PACKED.gguf IN.gguf",
      "Rewrites a llama.cpp MoE GGUF into Magnetar's expert-major layout: each routed expert's gate, up and down\n"
      "matrices back to back in one 4 KiB-aligned record, so the expert store reads an expert from NVMe with one\n"
      "direct read. Bytes are copied, never requantized; metadata and all other tensors are unchanged. The\n"
      "output is written atomically. --verify compares a packed file with its source byte for byte.");
  args.positional("IN.gguf", &in_path, "the standard model (first shard of a split set)");
  args.option("-o", &out_path, "OUT.gguf", "the packed file to write");
  args.flag("--verify-after", &verify_after, "after writing, re-read both files and compare every byte");
  args.option("--verify", &verify_path, "PACKED.gguf", "instead of packing: check PACKED.gguf against IN.gguf");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "pack")) return *code;
  std::string error;
  if (!verify_path.empty() && (!out_path.empty() || verify_after))
    error = "--verify takes no -o or --verify-after";
  else if (verify_path.empty() && out_path.empty())
    error = "-o OUT.gguf is required";
  if (!error.empty()) {
    std::fprintf(stderr, "magnetar pack: %s\n", error.c_str());
    return kExitBadInput;
  }

  Result<std::unique_ptr<gguf::Model>> src = open_model(in_path);
  if (!src.ok()) {
    std::fprintf(stderr, "magnetar pack: %s\n", src.status().message().c_str());
    return kExitBadInput;
  }

  if (!verify_path.empty()) {
    Result<std::unique_ptr<gguf::Model>> packed = open_model(verify_path);
    if (!packed.ok()) {
      std::fprintf(stderr, "magnetar pack: %s\n", packed.status().message().c_str());
      return kExitBadInput;
    }
    // Inputs that cannot be compared at all are bad input (2); differences found while comparing are 1.
    Result<experts::ExpertLayout> lp = experts::ExpertLayout::from_model(*packed.value());
    Result<experts::ExpertLayout> ls = experts::ExpertLayout::from_model(*src.value());
    if (!lp.ok() || !ls.ok() || !lp->packed() || ls->packed()) {
      const std::string why = !lp.ok()        ? lp.status().message()
                              : !ls.ok()      ? ls.status().message()
                              : !lp->packed() ? verify_path + ": not a packed file (see magnetar pack --help)"
                                              : in_path + ": is packed too: give the standard file it came from";
      std::fprintf(stderr, "magnetar pack: %s\n", why.c_str());
      return kExitBadInput;
    }
    return run_verify(*packed.value(), *src.value());
  }

  Result<experts::PackPlan> plan = experts::plan_pack(*src.value());
  if (!plan.ok()) {
    std::fprintf(stderr, "magnetar pack: %s\n", plan.status().message().c_str());
    return kExitBadInput;
  }
  if (src.value()->has_file(out_path)) {
    std::fprintf(stderr, "magnetar pack: %s: is the input: -o names the new file\n", out_path.c_str());
    return kExitBadInput;
  }
  Progress progress("pack " + out_path, plan->tensor_bytes_in);
  const experts::PackOptions options{.progress = [&progress](uint64_t done, uint64_t) { progress.update(done); }};
  if (Status s = experts::pack(*src.value(), out_path, options); !s.ok()) {
    std::fprintf(stderr, "magnetar pack: %s\n", s.message().c_str());
    return kExitFailure;
  }
  const double seconds = progress.seconds();
  progress.finish(mib(plan->tensor_bytes_in) + " copied");

  Result<std::unique_ptr<gguf::Model>> out = open_model(out_path);
  if (!out.ok()) {
    std::fprintf(stderr, "magnetar pack: reading back: %s\n", out.status().message().c_str());
    return kExitFailure;
  }
  const uint64_t in_bytes = src.value()->file_bytes(), out_bytes = out.value()->file_bytes();
  std::printf("packed %s -> %s (%s)\n", in_path.c_str(), out_path.c_str(), src.value()->architecture().c_str());
  std::printf("layers    %zu MoE layers x %lld experts packed\n", plan->layers.size(),
              (long long)plan->layout.n_expert());
  std::printf("stride    %s\n", strides_text(plan->layers).c_str());
  std::printf("size      %llu -> %llu bytes (%s -> %s), record padding %.2f%% of %s of experts\n",
              (unsigned long long)in_bytes, (unsigned long long)out_bytes, mib(in_bytes).c_str(),
              mib(out_bytes).c_str(), 100.0 * double(plan->padding_bytes) / double(plan->expert_bytes),
              mib(plan->expert_bytes).c_str());
  std::printf("time      %.2f s, %.0f MB/s\n", seconds, double(plan->tensor_bytes_in) / 1e6 / std::max(seconds, 1e-9));
  if (verify_after) return run_verify(*out.value(), *src.value());
  return kExitOk;
}

}  // namespace magnetar::tools
