#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>

#include "base/check.h"
#include "tokenizer/unicode.h"

namespace magnetar::tokenizer {

// ---- byte-level alphabet ----------------------------------------------------------------------------------
// Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes, in increasing
// order, take the code points from U+0100 on.

namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_char{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? b : next++;
      to_byte.emplace(to_char[b], uint8_t(b));
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet kAlphabet;
  return kAlphabet;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) { return alphabet().to_char[b]; }

std::string byte_level_decode(std::string_view token) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const Utf8Step step = decode_utf8(token, i);
    const auto it = step.kind == Utf8Kind::kChar ? a.to_byte.find(step.cp) : a.to_byte.end();
    if (it != a.to_byte.end()) {
      out.push_back(char(it->second));
    } else {
      out.append(token.substr(i, size_t(step.length)));
    }
    i += size_t(step.length);
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(byte_to_char(uint8_t(c)), &out);
  return out;
}

// ---- BpeModel ---------------------------------------------------------------------------------------------

Result<BpeModel> BpeModel::create(const std::vector<std::string>& tokens, const std::vector<bool>& excluded,
                                  const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                                  std::string_view source) {
  MAGNETAR_CHECK(tokens.size() == excluded.size());
  const std::string where(source);
  BpeModel m;
  m.ignore_merges_ = ignore_merges;
  m.ids_.reserve(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!excluded[id]) m.ids_.emplace(tokens[id], int32_t(id));  // the first id of duplicate texts wins
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = m.ids_.find(std::string(1, char(b)));
    if (it == m.ids_.end()) {
      return Status::error(
          format("%s: tokenizer.ggml.tokens: no token for byte 0x%02X (not a byte-level BPE "
                 "vocabulary)",
                 where.c_str(), b));
    }
    m.byte_ids_[b] = it->second;
  }
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  m.slots_.assign(capacity, Slot{});
  m.mask_ = capacity - 1;
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = m.ids_.find(left);
    const auto r = m.ids_.find(right);
    joined.assign(left).append(right);
    const auto j = m.ids_.find(joined);
    if (l == m.ids_.end() || r == m.ids_.end() || j == m.ids_.end()) {
      return Status::error(
          format("%s: tokenizer.ggml.merges: entry %zu: '%s %s' names a token that is not in the "
                 "vocabulary",
                 where.c_str(), rank, byte_level_encode(left).c_str(), byte_level_encode(right).c_str()));
    }
    // A repeated pair takes its last rank, as in HF (its merge table is a map filled in rank order).
    m.insert_merge(pair_key(l->second, r->second), Merge{int32_t(rank), j->second});
  }
  return m;
}

namespace {
inline uint64_t mix(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ull;
  return key ^ (key >> 29);
}
}  // namespace

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.key == key) return &s.merge;
    if (s.key == kEmpty) return nullptr;
  }
}

void BpeModel::insert_merge(uint64_t key, Merge merge) {
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].key == kEmpty || slots_[i].key == key) {
      slots_[i] = Slot{key, merge};
      return;
    }
  }
}

void BpeModel::encode_word(std::string_view word, Workspace* ws, std::vector<int32_t>* out) const {
  MAGNETAR_CHECK(!word.empty());
  if (word.size() == 1) {
    out->push_back(byte_ids_[uint8_t(word[0])]);
    return;
  }
  if (ignore_merges_) {
    if (const auto it = ids_.find(std::string(word)); it != ids_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  using Symbol = Workspace::Symbol;
  using Candidate = Workspace::Candidate;
  const int32_t n = int32_t(word.size());
  ws->symbols.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) {
    ws->symbols[size_t(i)] = Symbol{byte_ids_[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1, 1};
  }
  // Min-heap on (rank, pos): std heap functions build a max-heap, so the comparator is "greater".
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto& heap = ws->heap;
  heap.clear();
  Symbol* sym = ws->symbols.data();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(sym[i].id, sym[i + 1].id)) heap.push_back({m->rank, i, m->merged});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = sym[top.pos];
    // Stale candidates: the left symbol was merged away, has no right neighbour any more, or the pair at
    // this position changed since the candidate was pushed.
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    const Merge* m = find_merge(left.id, right.id);
    if (!m || m->merged != top.merged) continue;
    left.id = top.merged;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = find_merge(sym[left.prev].id, left.id)) {
        heap.push_back({pm->rank, left.prev, pm->merged});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = find_merge(left.id, sym[left.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->merged});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace magnetar::tokenizer
