// `magnetar tokenize`: token ids of a text, from a model's GGUF tokenizer metadata (only the header is read,
// so vocab-only files work) or straight from a Hugging Face tokenizer folder. Prints JSON arrays of ids; in
// --jsonl mode one array per input line, which is how tests/tokenizer compares with HF tokenizers.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/reader.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace magnetar::tools {
namespace {

Result<tokenizer::Tokenizer> load(const std::string& model_path, const std::string& hf_dir) {
  if (!hf_dir.empty()) {
    Result<std::vector<gguf::KeyValue>> kv = tokenizer::gguf_metadata_from_hf(hf_dir, 0);
    if (!kv.ok()) return kv.status();
    return tokenizer::Tokenizer::from_gguf(*kv, hf_dir + "/tokenizer.json");
  }
  Result<std::unique_ptr<gguf::Model>> model = gguf::Model::open(model_path);
  if (!model.ok()) return model.status();
  if (!model.value()->find("tokenizer.ggml.model")) {
    return Status::error(model_path + ": tokenizer.ggml.model: missing (the file has no tokenizer)");
  }
  return tokenizer::Tokenizer::from_gguf(model.value()->metadata(), model_path);
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

int fail(const std::string& message) {
  std::fprintf(stderr, "magnetar tokenize: %s\n", message.c_str());
  return kExitBadInput;
}

}  // namespace

int tokenize_main(int argc, char** argv) {
  std::string model_path, hf_dir, text, file;
  bool jsonl = false, no_special = false;
  cli::Args args("magnetar tokenize (-m MODEL.gguf | --hf-dir DIR) (--text T | --file F | --jsonl) [--no-special]",
                 "Prints the token ids of a text as a JSON array. The tokenizer comes from the model's GGUF metadata\n"
                 "(vocab-only files work) or from a Hugging Face tokenizer folder (tokenizer.json). Special tokens\n"
                 "written in the text (<|im_start|>) map to their ids unless --no-special.");
  args.option("-m", &model_path, "MODEL.gguf", "the model (first shard of a split set)");
  args.option("--hf-dir", &hf_dir, "DIR", "instead of -m: an HF folder with tokenizer.json (+ tokenizer_config.json)");
  args.option("--text", &text, "T", "the text to tokenize");
  args.option("--file", &file, "F", "tokenize the bytes of this file");
  args.flag("--jsonl", &jsonl, "read one JSON string per line on stdin, print one JSON array per line");
  args.flag("--no-special", &no_special, "encode special-token text as plain text");
  if (std::optional<int> code = args.parse_or_exit(argc, argv, "tokenize")) return *code;
  bool has_text = false;  // --text "" is a valid (empty) input, so presence is read from argv
  for (int k = 1; k < argc; ++k) {
    const std::string_view a = argv[k];
    if (a == "--text" || a.substr(0, 7) == "--text=") has_text = true;
  }
  if (model_path.empty() == hf_dir.empty()) return fail("give exactly one of -m MODEL.gguf and --hf-dir DIR");
  if (int(has_text) + int(!file.empty()) + int(jsonl) != 1) return fail("give exactly one of --text, --file, --jsonl");

  Result<tokenizer::Tokenizer> tok = load(model_path, hf_dir);
  if (!tok.ok()) return fail(tok.status().message());
  const bool parse_special = !no_special;

  if (!file.empty()) {
    Result<std::string> read = cli::read_file(file);
    if (!read.ok()) return fail(read.status().message());
    text = std::move(read).value();
  }
  if (!jsonl) {
    std::printf("%s\n", ids_json(tok->encode(text, parse_special)).c_str());
    return kExitOk;
  }
  std::string line;
  for (size_t line_no = 1; std::getline(std::cin, line); ++line_no) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) return fail(format("stdin line %zu: not a JSON string", line_no));
    std::printf("%s\n", ids_json(tok->encode(j.get_ref<const std::string&>(), parse_special)).c_str());
  }
  return kExitOk;
}

}  // namespace magnetar::tools
