#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>

#include "base/check.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace magnetar::tokenizer {

struct Tokenizer::State {
  std::string pre;
  bool nfc = false;
  bool add_bos = false;
  bool add_eos = false;
  std::vector<std::string> pieces;  // [n_vocab] raw bytes of each token
  size_t max_piece = 1;             // the longest of them
  std::vector<TokenType> types;     // [n_vocab]
  BpeModel bpe;
  PreTokenizer pretokenizer;
  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, pad = kNoToken;
  std::vector<int32_t> eog;  // sorted
  std::string chat_template;
  // Added tokens (CONTROL, USER_DEFINED, UNKNOWN with text) as a trie of their bytes: the longest at a position is
  // found in one walk as deep as the text follows some token (a scan of every token sharing the first byte cost
  // bytes x tokens: 26 probes per '<' for Qwen3, 256 for Llama 3).
  struct AddedNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> child node
    int32_t any = -1;                               // the token ending here (the lowest id of one text), or -1
    int32_t plain = -1;                             // the same among tokens matched without parse_special
  };
  std::vector<AddedNode> added{1};
  bool added_first_byte[256] = {};

  State(BpeModel b, PreTokenizer p) : bpe(std::move(b)), pretokenizer(std::move(p)) {}
};

// ---- loading ----------------------------------------------------------------------------------------------

namespace {

struct PreSettings {
  PreType type;
  bool nfc;            // the HF tokenizer.json of this family declares an NFC normalizer
  bool ignore_merges;  // HF "ignore_merges": a word that is a token is not split
  bool add_bos;        // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

const PreSettings* find_pre(std::string_view pre) {
  static const PreSettings kQwen2{PreType::kQwen2, true, false, false};
  static const PreSettings kLlama3{PreType::kLlama3, false, true, true};
  // DeepSeek-R1-Distill-Qwen's converter name: Qwen2.5's tokenizer (llama.cpp reads it as qwen2 too).
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return &kQwen2;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return &kLlama3;
  return nullptr;
}

// Token texts that end a generation (llama.cpp's list); the first ones, in this order, are EOT candidates.
constexpr std::string_view kEotTexts[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>", "<end_of_turn>",
                                          "<|endoftext|>", "<|end_of_text|>", "<EOT>",   "_<EOT>"};
constexpr std::string_view kEogTexts[] = {"<|eot_id|>", "<|im_end|>",    "<|end|>",        "<|return|>",
                                          "<|call|>",   "<end_of_turn>", "<|endoftext|>",  "<|eom_id|>",
                                          "<EOT>",      "_<EOT>",        "<|end_of_text|>"};

class Metadata {
 public:
  Metadata(const std::vector<gguf::KeyValue>& kv, std::string_view source) : source_(source) {
    for (const gguf::KeyValue& e : kv) by_key_.emplace(e.key, &e.value);
  }
  const gguf::Value* find(std::string_view key) const {
    const auto it = by_key_.find(std::string(key));
    return it == by_key_.end() ? nullptr : it->second;
  }
  Status error(std::string_view key, const std::string& problem) const {
    return Status::error(format("%s: %.*s: %s", source_.c_str(), int(key.size()), key.data(), problem.c_str()));
  }
  Result<std::string> string(std::string_view key) const {
    const gguf::Value* v = find(key);
    if (!v) return error(key, "missing");
    if (!v->is_string()) return error(key, "expected a string, found " + std::string(value_type_name(v->type)));
    return v->str;
  }
  Result<const std::vector<gguf::Value>*> array(std::string_view key, gguf::ValueType element) const {
    const gguf::Value* v = find(key);
    if (!v) return error(key, "missing");
    if (v->type != gguf::ValueType::kArray) return error(key, "expected an array");
    if (!v->array.empty() && v->array_type != element) {
      return error(key, format("expected an array of %s, found %s", value_type_name(element).data(),
                               value_type_name(v->array_type).data()));
    }
    return &v->array;
  }
  // A token id key: kNoToken when absent (or -1, an "unset" some writers use), an error when out of range.
  Result<int32_t> token_id(std::string_view key, size_t n_vocab) const {
    const gguf::Value* v = find(key);
    if (!v) return kNoToken;
    const std::optional<int64_t> id = v->as_int();
    if (!id) return error(key, "expected an integer token id");
    if (*id == -1) return kNoToken;
    if (*id < 0 || uint64_t(*id) >= n_vocab) {
      return error(key, format("token id %lld is outside the vocabulary (%zu tokens)", (long long)*id, n_vocab));
    }
    return int32_t(*id);
  }
  Result<bool> flag(std::string_view key, bool fallback) const {
    const gguf::Value* v = find(key);
    if (!v) return fallback;
    const std::optional<uint64_t> b = v->as_uint();
    if (!b || *b > 1) return error(key, "expected a bool");
    return *b != 0;
  }

 private:
  std::string source_;
  std::unordered_map<std::string, const gguf::Value*> by_key_;
};

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const std::vector<gguf::KeyValue>& metadata, std::string_view source) {
  const Metadata md(metadata, source);
  Result<std::string> model = md.string("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return md.error("tokenizer.ggml.model",
                    "unsupported tokenizer model '" + *model + "' (Magnetar reads byte-level BPE, 'gpt2')");
  }
  Result<std::string> pre = md.string("tokenizer.ggml.pre");
  if (!pre.ok()) return pre.status();
  const PreSettings* settings = find_pre(*pre);
  if (!settings) {
    return md.error("tokenizer.ggml.pre",
                    "unsupported pre-tokenizer '" + *pre + "' (supported: qwen2, llama-bpe, llama3, llama-v3)");
  }

  // Tokens and their types.
  Result<const std::vector<gguf::Value>*> tokens = md.array("tokenizer.ggml.tokens", gguf::ValueType::kString);
  if (!tokens.ok()) return tokens.status();
  const size_t n_vocab = (*tokens)->size();
  if (n_vocab == 0 || n_vocab > size_t(INT32_MAX)) {
    return md.error("tokenizer.ggml.tokens", format("%zu tokens", n_vocab));
  }
  std::vector<TokenType> types(n_vocab, TokenType::kNormal);
  if (md.find("tokenizer.ggml.token_type")) {
    Result<const std::vector<gguf::Value>*> tt = md.array("tokenizer.ggml.token_type", gguf::ValueType::kInt32);
    if (!tt.ok()) return tt.status();
    if ((*tt)->size() != n_vocab) {
      return md.error("tokenizer.ggml.token_type", format("%zu entries for %zu tokens", (*tt)->size(), n_vocab));
    }
    for (size_t id = 0; id < n_vocab; ++id) {
      const int64_t t = (**tt)[id].i;
      if (t < int64_t(TokenType::kNormal) || t > int64_t(TokenType::kByte)) {
        return md.error("tokenizer.ggml.token_type", format("entry %zu: unknown token type %lld", id, (long long)t));
      }
      types[id] = TokenType(t);
    }
  }
  std::vector<std::string> pieces(n_vocab);
  std::vector<bool> excluded(n_vocab);
  for (size_t id = 0; id < n_vocab; ++id) {
    const std::string& text = (**tokens)[id].str;
    const bool normal = types[id] == TokenType::kNormal;
    // An unused id (llama.cpp pads Qwen's vocabulary to the embedding rows with "[PAD151669]"...) stands for no text,
    // as in llama.cpp; Hugging Face's vocabulary does not have it and decodes it to nothing.
    pieces[id] = normal ? byte_level_decode(text) : types[id] == TokenType::kUnused ? std::string() : text;
    excluded[id] = !normal;
  }

  // Merges, "LEFT RIGHT" in byte-level text.
  Result<const std::vector<gguf::Value>*> merge_values = md.array("tokenizer.ggml.merges", gguf::ValueType::kString);
  if (!merge_values.ok()) return merge_values.status();
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve((*merge_values)->size());
  for (size_t r = 0; r < (*merge_values)->size(); ++r) {
    const std::string& m = (**merge_values)[r].str;
    const size_t space = m.find(' ', 1);  // from 1: a token may itself start with ' '
    if (space == std::string::npos || space + 1 >= m.size()) {
      return md.error("tokenizer.ggml.merges", format("entry %zu: '%s' is not 'LEFT RIGHT'", r, m.c_str()));
    }
    merges.emplace_back(byte_level_decode(std::string_view(m).substr(0, space)),
                        byte_level_decode(std::string_view(m).substr(space + 1)));
  }
  Result<BpeModel> bpe = BpeModel::create(pieces, excluded, merges, settings->ignore_merges, source);
  if (!bpe.ok()) return bpe.status();
  Result<PreTokenizer> pretokenizer = PreTokenizer::create(settings->type);
  if (!pretokenizer.ok()) return pretokenizer.status();

  auto state = std::make_shared<State>(std::move(bpe.value()), std::move(pretokenizer.value()));
  State& s = *state;
  s.pre = *pre;
  s.nfc = settings->nfc;

  // Special ids: explicit keys first, then llama.cpp's detection by text.
  const auto id_of = [&](std::string_view key, int32_t* out) -> Status {
    Result<int32_t> id = md.token_id(key, n_vocab);
    if (!id.ok()) return id.status();
    *out = *id;
    return Status();
  };
  int32_t eom = kNoToken, fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.bos_token_id", &s.bos));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.eos_token_id", &s.eos));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.eot_token_id", &s.eot));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.eom_token_id", &eom));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.padding_token_id", &s.pad));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.fim_pad_token_id", &fim_pad));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.fim_rep_token_id", &fim_rep));
  MAGNETAR_RETURN_IF_ERROR(id_of("tokenizer.ggml.fim_sep_token_id", &fim_sep));
  std::unordered_map<std::string_view, int32_t> by_text;  // first id of each non-normal token text
  for (size_t id = 0; id < n_vocab; ++id) {
    if (types[id] != TokenType::kNormal) by_text.emplace((**tokens)[id].str, int32_t(id));
  }
  const auto lookup = [&](std::string_view text) {
    const auto it = by_text.find(text);
    return it == by_text.end() ? kNoToken : it->second;
  };
  for (std::string_view text : kEotTexts) {
    if (s.eot == kNoToken) s.eot = lookup(text);
  }
  if (eom == kNoToken) eom = lookup("<|eom_id|>");
  if (fim_pad == kNoToken) fim_pad = lookup("<|fim_pad|>");
  if (fim_rep == kNoToken) fim_rep = lookup("<|repo_name|>");
  if (fim_rep == kNoToken) fim_rep = lookup("<|fim_repo|>");
  if (fim_sep == kNoToken) fim_sep = lookup("<|file_sep|>");
  for (int32_t id : {s.eos, s.eot, eom, fim_pad, fim_rep, fim_sep}) {
    if (id != kNoToken) s.eog.push_back(id);
  }
  for (std::string_view text : kEogTexts) {
    if (const int32_t id = lookup(text); id != kNoToken) s.eog.push_back(id);
  }
  std::sort(s.eog.begin(), s.eog.end());
  s.eog.erase(std::unique(s.eog.begin(), s.eog.end()), s.eog.end());

  Result<bool> add_bos = md.flag("tokenizer.ggml.add_bos_token", settings->add_bos);
  if (!add_bos.ok()) return add_bos.status();
  Result<bool> add_eos = md.flag("tokenizer.ggml.add_eos_token", false);
  if (!add_eos.ok()) return add_eos.status();
  if (*add_bos && s.bos == kNoToken) {
    return md.error("tokenizer.ggml.add_bos_token", "true, but there is no tokenizer.ggml.bos_token_id");
  }
  if (*add_eos && s.eos == kNoToken) {
    return md.error("tokenizer.ggml.add_eos_token", "true, but there is no tokenizer.ggml.eos_token_id");
  }
  s.add_bos = *add_bos;
  s.add_eos = *add_eos;
  if (md.find("tokenizer.chat_template")) {
    Result<std::string> tmpl = md.string("tokenizer.chat_template");
    if (!tmpl.ok()) return tmpl.status();
    s.chat_template = std::move(tmpl.value());
  }

  // Added tokens into the trie, in id order (of two with one text, the lower id is kept).
  for (size_t id = 0; id < n_vocab; ++id) {
    const TokenType t = types[id];
    const bool added = t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
    if (!added || pieces[id].empty()) continue;
    size_t node = 0;
    for (const char c : pieces[id]) {
      const uint8_t b = uint8_t(c);
      auto& next = s.added[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
      if (it == next.end()) {
        next.emplace_back(b, int32_t(s.added.size()));
        node = s.added.size();
        s.added.emplace_back();
      } else {
        node = size_t(it->second);
      }
    }
    State::AddedNode& end = s.added[node];
    if (end.any < 0) end.any = int32_t(id);
    if (end.plain < 0 && t == TokenType::kUserDefined) end.plain = int32_t(id);
    s.added_first_byte[uint8_t(pieces[id][0])] = true;
  }
  for (const std::string& p : pieces) s.max_piece = std::max(s.max_piece, p.size());
  s.pieces = std::move(pieces);
  s.types = std::move(types);
  return Tokenizer(std::move(state));
}

// ---- encode / decode --------------------------------------------------------------------------------------

namespace {
constexpr size_t kCacheMinBytes = 4096;  // below this the cache's allocations cost more than they save
constexpr size_t kCacheMaxPiece = 64;    // long pieces (runs of spaces, digits of base64) rarely repeat
}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const State& s = *state_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (s.add_bos) out.push_back(s.bos);

  BpeModel::Workspace ws;
  std::vector<std::string_view> pieces;
  std::string normalized;
  // Words repeat: in long texts a per-call cache of piece -> ids skips most merge loops (one core of this
  // project's 2-core AVX2 machine, Qwen3 vocabulary: 10 MB of Python sources 3.9 -> 7.0 M tokens/s, 8 MB of
  // Debian changelogs 5.0 -> 8.3 M tokens/s). Per call, so encode stays lock-free and thread-safe.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache;  // piece -> [begin, end) in cached
  std::vector<int32_t> cached;
  const bool use_cache = text.size() >= kCacheMinBytes;
  const auto encode_text = [&](std::string_view fragment) {
    if (fragment.empty()) return;
    if (s.nfc && !is_nfc_quick(fragment)) {
      normalized = to_nfc(fragment);
      fragment = normalized;
    }
    pieces.clear();
    s.pretokenizer.split(fragment, &pieces);
    for (std::string_view piece : pieces) {
      if (!use_cache || piece.size() > kCacheMaxPiece) {
        s.bpe.encode_word(piece, &ws, &out);
        continue;
      }
      auto [it, inserted] = cache.try_emplace(std::string(piece));
      if (inserted) {
        const size_t before = out.size();
        s.bpe.encode_word(piece, &ws, &out);
        it->second = {uint32_t(cached.size()), uint32_t(cached.size() + out.size() - before)};
        cached.insert(cached.end(), out.begin() + ptrdiff_t(before), out.end());
      } else {
        out.insert(out.end(), cached.begin() + it->second.first, cached.begin() + it->second.second);
      }
    }
  };

  size_t start = 0;  // first byte not yet encoded
  for (size_t i = 0; i < text.size(); ++i) {
    if (!s.added_first_byte[uint8_t(text[i])]) continue;
    // The longest added token at i (CONTROL and UNKNOWN ones only with parse_special).
    int32_t found = -1;
    size_t found_len = 0, node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = s.added[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == uint8_t(text[j]); });
      if (it == next.end()) break;
      node = size_t(it->second);
      const int32_t id = parse_special ? s.added[node].any : s.added[node].plain;
      if (id >= 0) {
        found = id;
        found_len = j + 1 - i;
      }
    }
    if (found < 0) continue;
    encode_text(text.substr(start, i - start));
    out.push_back(found);
    start = i + found_len;
    i = start - 1;  // the loop's ++i resumes right after the token
  }
  encode_text(text.substr(start));
  if (s.add_eos) out.push_back(s.eos);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes.append(token_text(id));
  return to_valid_utf8(bytes);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || size_t(id) >= state_->pieces.size()) return {};
  return state_->pieces[size_t(id)];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || size_t(id) >= state_->types.size()) return TokenType::kUnused;
  return state_->types[size_t(id)];
}

int32_t Tokenizer::n_vocab() const { return int32_t(state_->pieces.size()); }
size_t Tokenizer::max_token_bytes() const { return state_->max_piece; }
int32_t Tokenizer::bos_id() const { return state_->bos; }
int32_t Tokenizer::eos_id() const { return state_->eos; }
int32_t Tokenizer::eot_id() const { return state_->eot; }
int32_t Tokenizer::pad_id() const { return state_->pad; }
bool Tokenizer::add_bos() const { return state_->add_bos; }
bool Tokenizer::add_eos() const { return state_->add_eos; }
const std::vector<int32_t>& Tokenizer::eog_ids() const { return state_->eog; }
bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(state_->eog.begin(), state_->eog.end(), id); }
const std::string& Tokenizer::chat_template() const { return state_->chat_template; }
const std::string& Tokenizer::pre() const { return state_->pre; }

// ---- streaming --------------------------------------------------------------------------------------------

std::string StreamDecoder::push(int32_t id) {
  pending_.append(tokenizer_->token_text(id));
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Step step = decode_utf8(pending_, i);
    if (step.kind == Utf8Kind::kIncomplete) break;  // hold back: the next token may complete it
    if (step.kind == Utf8Kind::kChar) {
      out.append(pending_, i, size_t(step.length));
    } else {
      append_utf8(kReplacementChar, &out);
    }
    i += size_t(step.length);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace magnetar::tokenizer
