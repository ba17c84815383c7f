// Importing a Hugging Face tokenizer folder into GGUF tokenizer metadata (the keys llama.cpp's converter
// writes), so that `magnetar convert` produces files llama.cpp and Magnetar read alike.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace magnetar::tokenizer {

// Reads HF_DIR/tokenizer.json (+ tokenizer_config.json for chat_template, add_bos_token and special tokens)
// and returns the tokenizer.* metadata in llama.cpp's key order and types: tokenizer.ggml.model ("gpt2"),
// tokenizer.ggml.pre ("qwen2", "llama-bpe", ...), tokenizer.ggml.tokens, tokenizer.ggml.token_type,
// tokenizer.ggml.merges, the special token ids (eos/padding/bos/...), tokenizer.ggml.add_bos_token,
// tokenizer.chat_template.
// `n_vocab` is the model's embedding rows (config.json vocab_size): the token list is padded to it with
// "[PAD{id}]" entries of type UNUSED, as llama.cpp's converter does; n_vocab <= 0 means no padding (the
// list ends at the largest id in tokenizer.json). Special token ids also come from HF_DIR/config.json when
// present (bos_token_id, ...), as in llama.cpp; generation_config.json is not read (nor is it there).
// Fails with a message naming the file and field when tokenizer.json is missing or not a byte-level BPE.
Result<std::vector<gguf::KeyValue>> gguf_metadata_from_hf(const std::string& hf_dir, int64_t n_vocab);

}  // namespace magnetar::tokenizer
