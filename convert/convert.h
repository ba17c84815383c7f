// `magnetar convert`: a Hugging Face model folder to the GGUF llama.cpp's convert_hf_to_gguf.py writes for
// it (same architecture name, metadata keys, tensor names, shapes and type choices).
//
// Two steps, so that the caller can tell bad input from a failure while writing: prepare() reads and
// validates everything (config.json, every tensor's presence, dtype and shape, the tokenizer) and writes
// nothing; write() streams tensor by tensor through gguf::Writer, converting rows on several threads, and
// never holds more than one chunk (64 MiB) of output in memory. The output appears atomically (written as
// OUT.tmp, renamed at the end).
//
// Types: 1-D tensors (norms, biases) and MoE routers (ffn_gate_inp) are F32; every other tensor takes the
// --outtype, except that q8_0 falls back to F16 for rows that are not a multiple of 32 (as llama.cpp does).
// Tokenizer metadata comes from tokenizer/hf_import.h when DIR/tokenizer.json exists; without it the GGUF
// has no tokenizer.* keys and runs from token ids.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "convert/architectures.h"
#include "convert/hf_model.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace magnetar::convert {

enum class OutType { kF32, kF16, kBF16, kQ8_0 };
// "f32", "f16", "bf16", "q8_0" (case-insensitive); nullopt otherwise.
std::optional<OutType> out_type_from_name(std::string_view name);
std::string_view out_type_name(OutType type);

struct Options {
  std::string hf_dir;
  std::string out_path;
  OutType out_type = OutType::kF16;  // llama.cpp's default --outtype
  bool vocab_only = false;           // metadata and tokenizer only, no tensors
  int n_threads = 1;
  // Called on the calling thread after each chunk with the tensor bytes written so far and the total.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// A validated conversion: everything read and checked, nothing written yet. Holds the source mappings.
struct Conversion {
  std::unique_ptr<HfModel> model;
  ModelPlan plan;
  std::vector<gguf::KeyValue> metadata;  // the file's complete metadata, in order
  std::vector<quant::Type> types;        // output type of each plan.tensors[i]
  bool has_tokenizer = false;
  uint64_t data_bytes = 0;  // tensor data the file will hold
};

// Reads and validates the input. Every failure is bad input, named by file and field or tensor.
Result<std::unique_ptr<Conversion>> prepare(const Options& options);
// Writes options.out_path. Failures are I/O failures (disk full, unwritable path).
Status write(const Conversion& conversion, const Options& options);
// prepare() then write().
Status convert(const Options& options);

}  // namespace magnetar::convert
