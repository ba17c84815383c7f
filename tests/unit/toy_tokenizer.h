// A toy byte-level BPE tokenizer written as a Hugging Face folder (tokenizer.json + tokenizer_config.json),
// for tests that need a model with a tokenizer but not a real vocabulary.
// ids 0..255 are the byte tokens (id == byte value), then the merges of kMerges in rank order:
// he 256, ll 257, hell 258, hello 259, Ġw 260, or 261, ld 262, Ġwor 263, Ġworld 264, Ã© (é) 265;
// added: <|pad|> 266 (special), <think> 267 (not special), <|im_end|> 268 (special, the eos_token).
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/bpe.h"

namespace magnetar::testing {

using tokenizer::byte_to_char;

inline constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"},        {"hell", "o"},         {"\xC4\xA0", "w"},
    {"o", "r"}, {"l", "d"}, {"\xC4\xA0w", "or"}, {"\xC4\xA0wor", "ld"}, {"\xC3\x83", "\xC2\xA9"}};

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Writes the toy HF folder into `dir`.
inline void write_toy_hf(const std::string& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    const uint32_t cp = byte_to_char(uint8_t(b));  // the byte-level alphabet (GPT-2's bytes_to_unicode)
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    vocab[s] = b;
  }
  nlohmann::json merges = nlohmann::json::array();
  int id = 256;
  for (const auto& [l, r] : kMerges) {
    vocab[l + r] = id++;
    merges.push_back({l, r});
  }
  const nlohmann::json added = nlohmann::json::array({
      {{"id", 266}, {"content", "<|pad|>"}, {"special", true}, {"normalized", false}},
      {{"id", 267}, {"content", "<think>"}, {"special", false}, {"normalized", false}},
      {{"id", 268}, {"content", "<|im_end|>"}, {"special", true}, {"normalized", false}},
  });
  const nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}}};
  write_file(dir + "/tokenizer.json", tokenizer.dump());
  const nlohmann::json config = {{"add_bos_token", false},
                                 {"bos_token", nullptr},
                                 {"eos_token", "<|im_end|>"},
                                 {"pad_token", {{"content", "<|pad|>"}, {"special", true}}},
                                 {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}};
  write_file(dir + "/tokenizer_config.json", config.dump());
}

}  // namespace magnetar::testing
