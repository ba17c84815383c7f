// Byte-level BPE: GPT-2's byte <-> character mapping and the merge loop.
//
// Vocabularies store byte-level tokens as text in which every byte is a printable character ("Ġ" for a
// space). BpeModel works on raw bytes instead: token strings are mapped back once at load, so encoding never
// converts the input. The merge loop is Hugging Face's: repeatedly apply the lowest-rank merge among adjacent
// symbols (ties go to the leftmost), using a min-heap of candidate pairs and a linked list of symbols, so a
// word of n bytes costs O(n log n) rather than O(n^2) rescans.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace magnetar::tokenizer {

// GPT-2's bytes_to_unicode(): the code point that stands for byte b in a byte-level token string.
uint32_t byte_to_char(uint8_t b);
// Raw bytes of a byte-level token string. Characters outside the byte alphabet are kept as their UTF-8
// bytes, as HF's ByteLevel decoder does.
std::string byte_level_decode(std::string_view token);
// The byte-level token string of raw bytes (the inverse of byte_level_decode on byte-alphabet input).
std::string byte_level_encode(std::string_view bytes);

class BpeModel {
 public:
  // tokens[id] are the raw bytes of every token taking part in BPE; ids whose entry is `excluded[id]`
  // (control, user-defined, unused tokens) are never produced by merges. merges[r] = the raw bytes of the
  // pair of rank r. `ignore_merges`: a word that is itself a token is emitted whole (Llama 3).
  // Fails when a byte has no token or a merge names a token that does not exist; `source` prefixes messages.
  static Result<BpeModel> create(const std::vector<std::string>& tokens, const std::vector<bool>& excluded,
                                 const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                                 std::string_view source);

  // Scratch buffers reused across words of one encode call; not shared between threads.
  struct Workspace {
    struct Symbol {
      int32_t id;
      int32_t prev;  // index of the previous live symbol, -1 at the start
      int32_t next;  // index of the next live symbol, -1 at the end
      int32_t len;   // bytes covered; 0 once merged into its left neighbour
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;  // index of the left symbol
      int32_t merged;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of one pre-tokenized word (raw bytes, non-empty). Const and thread-safe.
  void encode_word(std::string_view word, Workspace* ws, std::vector<int32_t>* out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  // Open-addressing table of (left id, right id) -> Merge, sized to a load factor <= 1/2. Lookups are the
  // inner loop of encoding, where std::unordered_map's node chasing costs ~2x.
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  const Merge* find_merge(int32_t left, int32_t right) const;
  void insert_merge(uint64_t key, Merge merge);

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int32_t byte_ids_[256] = {};
  std::unordered_map<std::string, int32_t> ids_;  // raw bytes -> id, for ignore_merges and loading
  bool ignore_merges_ = false;
};

}  // namespace magnetar::tokenizer
