// Pre-tokenization: splitting text into the pieces BPE runs on, with the regexes of Hugging Face's
// `Split` pre-tokenizers (behavior "Isolated"), compiled with PCRE2 (UTF + Unicode properties, JIT).
//
// Oniguruma, which HF tokenizers uses, and PCRE2 read these patterns alike once `\s` is written as the
// explicit Unicode White_Space class (Oniguruma's `\s` includes U+0085, PCRE2 10.42's does not). The
// contraction group stays caseless with Unicode folding, as in HF: "'ſ" (long s) is a contraction there
// (llama.cpp's ASCII-only '[sS] differs). tests/tokenizer compares pre-tokens and ids with HF.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace magnetar::tokenizer {

enum class PreType {
  kQwen2,   // Qwen2/2.5/3, DeepSeek-R1-Distill-Qwen: digits split one by one
  kLlama3,  // Llama 3: digits in groups of up to three
};

class PreTokenizer {
 public:
  static Result<PreTokenizer> create(PreType type);

  // Appends to `pieces` the pieces of `text`, in order; they are views into `text` and cover it exactly
  // (bytes no alternative matches, which happens only for invalid UTF-8, become pieces of their own).
  // Thread-safe: the compiled pattern is shared read-only, match state is per call.
  void split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct Compiled;
  explicit PreTokenizer(std::shared_ptr<const Compiled> compiled) : compiled_(std::move(compiled)) {}
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace magnetar::tokenizer
