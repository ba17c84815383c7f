// The tokenizer of a model, built from its GGUF metadata (the tokenizer.* keys llama.cpp's converter writes).
//
// Supported: byte-level BPE (tokenizer.ggml.model "gpt2") with the pre-tokenizers of Qwen2/Qwen3
// (tokenizer.ggml.pre "qwen2") and Llama 3 ("llama-bpe", "llama3", "llama-v3"). Encoding follows Hugging Face
// tokenizers, the library these models were trained with, and is tested against it (tests/tokenizer):
//   1. added tokens (CONTROL, USER_DEFINED) are cut out of the text first, leftmost-longest;
//   2. each piece of text between them is NFC-normalized (Qwen2's tokenizer.json declares an NFC normalizer;
//      llama.cpp skips this step, so the two differ on text that is not already NFC);
//   3. the pre-tokenizer regex splits it, and byte-level BPE encodes each piece.
// A Tokenizer is immutable after from_gguf and cheap to copy (shared state); every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace magnetar::tokenizer {

// tokenizer.ggml.token_type values (llama.cpp's, part of the file format).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

inline constexpr int32_t kNoToken = -1;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.model/pre/tokens/token_type/merges, the special token ids (*_token_id),
  // add_bos_token/add_eos_token and tokenizer.chat_template. Unknown model or pre, missing or mistyped keys,
  // out-of-range ids and merges naming unknown tokens fail with "SOURCE: KEY: problem".
  static Result<Tokenizer> from_gguf(const std::vector<gguf::KeyValue>& metadata, std::string_view source);

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte-wise, never rejected). Prepends BOS when
  // add_bos() and appends EOS when add_eos(). With parse_special, CONTROL tokens written in the text
  // ("<|im_start|>") map to their ids; without it they are encoded as plain text. USER_DEFINED tokens
  // ("<think>") always map to their ids, as in llama.cpp and HF.
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // The text of `ids`: their token_text concatenated, with each invalid UTF-8 subpart replaced by U+FFFD
  // (what HF's decode returns). Ids outside the vocabulary are skipped. Special tokens are included.
  std::string decode(std::span<const int32_t> ids) const;

  // Raw bytes of one token: byte-level decoded for NORMAL tokens (possibly a fragment of a UTF-8 sequence),
  // the stored text for the others. Empty for ids outside the vocabulary.
  std::string_view token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;  // kUnused for ids outside the vocabulary

  int32_t n_vocab() const;
  size_t max_token_bytes() const;  // the longest token's text, in bytes (>= 1)
  int32_t bos_id() const;  // kNoToken when the model has none
  int32_t eos_id() const;
  int32_t eot_id() const;  // tokenizer.ggml.eot_token_id, else found by text ("<|im_end|>", "<|eot_id|>", ...)
  int32_t pad_id() const;
  bool add_bos() const;
  bool add_eos() const;
  // End-of-generation tokens: eos, eot, eom, the FIM pad/repo/separator tokens and every token whose text is
  // a known end marker (<|im_end|>, <|endoftext|>, <|eot_id|>, ...), the set llama.cpp stops on. Sorted.
  const std::vector<int32_t>& eog_ids() const;
  bool is_eog(int32_t id) const;
  const std::string& chat_template() const;  // empty when the model has none
  const std::string& pre() const;            // tokenizer.ggml.pre as given

 private:
  struct State;
  explicit Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Streaming detokenization: push() returns the text that became complete, holding back a trailing
// incomplete UTF-8 sequence until the next token completes it; bytes that can never become valid are
// emitted as U+FFFD. Every returned string is valid UTF-8, and the concatenation of all push() results and
// flush() equals Tokenizer::decode of the same ids. Not thread-safe (one per generation stream); the
// Tokenizer must outlive it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  std::string push(int32_t id);
  // Emits what is held back (as U+FFFD: the stream ended inside a sequence) and resets.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // at most 3 bytes of an incomplete sequence between calls
};

}  // namespace magnetar::tokenizer
