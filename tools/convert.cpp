// `magnetar convert HF_DIR -o OUT.gguf`: a Hugging Face model folder to a GGUF llama.cpp would write for it.
// A thin main over convert/convert.h: flags, a progress bar, and Status -> exit code (2 for bad input,
// 1 for a failure while writing).
#include "convert/convert.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace magnetar::tools {

int convert_main(int argc, char** argv) {
  std::string hf_dir, out_path, out_type_name = "f16";
  bool vocab_only = false;
  int64_t threads = int64_t(std::max(1u, std::thread::hardware_concurrency()));
  std::string supported;
  for (const convert::Architecture& a : convert::architectures()) {
    supported += (supported.empty() ? "" : ", ") + std::string(a.hf_name);
  }
  cli::Args args("magnetar convert HF_DIR -o OUT.gguf [options]",
                 "Converts a Hugging Face model folder (config.json, model.safetensors or a sharded set with\n"
                 "model.safetensors.index.json, F32/F16/BF16 tensors; tokenizer.json and tokenizer_config.json\n"
                 "when present) into the GGUF llama.cpp's convert_hf_to_gguf.py writes for it.\n"
                 "Supported architectures: " +
                     supported + ".");
  args.positional("HF_DIR", &hf_dir, "the model folder");
  args.option("-o", &out_path, "OUT.gguf", "output file (written atomically)");
  args.option("--outtype", &out_type_name, "f32|f16|bf16|q8_0",
              "type of the weight matrices (norms and routers stay F32)");
  args.flag("--vocab-only", &vocab_only, "write only the metadata and the tokenizer, no tensors");
  args.option("-t", &threads, "N", "threads");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "convert")) return *code;
  const std::optional<convert::OutType> out_type = convert::out_type_from_name(out_type_name);
  std::string error;
  if (!out_type)
    error = format("--outtype '%s' is not one of f32, f16, bf16, q8_0", out_type_name.c_str());
  else if (out_path.empty())
    error = "-o OUT.gguf is required";
  else if (threads < 1)
    error = "-t must be >= 1";
  // The output must not replace one of the inputs (the rename at the end would, silently).
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(hf_dir, ec)) {
    if (error.empty() && std::filesystem::equivalent(e.path(), out_path, ec)) {
      error = format("-o %s is %s of the model folder", out_path.c_str(), e.path().filename().c_str());
    }
  }
  if (!error.empty()) {
    std::fprintf(stderr, "magnetar convert: %s\n", error.c_str());
    return kExitBadInput;
  }

  convert::Options options{.hf_dir = hf_dir,
                           .out_path = out_path,
                           .out_type = *out_type,
                           .vocab_only = vocab_only,
                           .n_threads = int(std::min<int64_t>(threads, 1024)),
                           .progress = nullptr};
  Result<std::unique_ptr<convert::Conversion>> conv = convert::prepare(options);
  if (!conv.ok()) {
    std::fprintf(stderr, "magnetar convert: %s\n", conv.status().message().c_str());
    return kExitBadInput;
  }
  if (!conv.value()->has_tokenizer) {
    std::fprintf(stderr,
                 "magnetar convert: %s has no tokenizer.json; the GGUF gets no tokenizer (runs from token ids)\n",
                 hf_dir.c_str());
  }
  Progress progress("convert " + out_path, conv.value()->data_bytes);
  options.progress = [&progress](uint64_t done, uint64_t) { progress.update(done); };
  if (Status s = convert::write(*conv.value(), options); !s.ok()) {
    std::fprintf(stderr, "magnetar convert: %s\n", s.message().c_str());
    return kExitFailure;
  }
  const convert::Conversion& c = *conv.value();
  progress.finish(format("%.2f GiB written", double(c.data_bytes) / double(1ull << 30)));
  std::fprintf(stderr, "magnetar convert: wrote %s (%s, %zu tensors, %s%s)\n", out_path.c_str(), c.plan.arch.c_str(),
               c.plan.tensors.size(),
               vocab_only ? "vocab only" : std::string(convert::out_type_name(*out_type)).c_str(),
               c.has_tokenizer ? ", with tokenizer" : "");
  return kExitOk;
}

}  // namespace magnetar::tools
