#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <string>

#include "base/check.h"

namespace magnetar::tokenizer {
namespace {

// The Unicode White_Space property (what Oniguruma's `\s` matches): TAB..CR, NEL, and the separators
// (Zs, Zl, Zp). Used inside character classes.
#define MAGNETAR_WS R"(\t-\r\x{85}\p{Z})"

// HF's pattern: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//               \s*[\r\n]+|\s+(?!\S)|\s+
constexpr const char* kQwen2Pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d))"
                                      R"(|[^\r\n\p{L}\p{N}]?\p{L}+)"
                                      R"(|\p{N})"
                                      R"(| ?[^)" MAGNETAR_WS R"(\p{L}\p{N}]+[\r\n]*)"
                                      R"(|[)" MAGNETAR_WS R"(]*[\r\n]+)"
                                      R"(|[)" MAGNETAR_WS R"(]+(?![^)" MAGNETAR_WS R"(]))"
                                      R"(|[)" MAGNETAR_WS R"(]+)";

// Llama 3: the same with \p{N}{1,3}.
constexpr const char* kLlama3Pattern = R"((?i:'s|'t|'re|'ve|'m|'ll|'d))"
                                       R"(|[^\r\n\p{L}\p{N}]?\p{L}+)"
                                       R"(|\p{N}{1,3})"
                                       R"(| ?[^)" MAGNETAR_WS R"(\p{L}\p{N}]+[\r\n]*)"
                                       R"(|[)" MAGNETAR_WS R"(]*[\r\n]+)"
                                       R"(|[)" MAGNETAR_WS R"(]+(?![^)" MAGNETAR_WS R"(]))"
                                       R"(|[)" MAGNETAR_WS R"(]+)";

#undef MAGNETAR_WS

// The JIT's default 32 KiB stack is enough for ordinary text; a pathological run (megabytes of one
// whitespace kind) can exhaust it, and such a match is retried with the interpreter, which uses the heap.
constexpr uint32_t kNoJit = PCRE2_NO_JIT;

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  // The patterns' work is linear in the run they match, but PCRE2 counts a step per character given back: its
  // default match limit (10M) failed a run of ~10M whitespace characters in a 12 MB prompt. No limit on steps;
  // the interpreter's heap (used past the JIT's stack) bounded at 1 GiB.
  pcre2_match_context* limits = nullptr;
  ~Compiled() {
    pcre2_match_context_free(limits);
    pcre2_code_free(code);
  }
};

Result<PreTokenizer> PreTokenizer::create(PreType type) {
  const char* pattern = type == PreType::kQwen2 ? kQwen2Pattern : kLlama3Pattern;
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: arbitrary bytes are allowed in the subject; invalid sequences never match.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::error(format("pre-tokenizer regex: PCRE2 error at offset %zu: %s", size_t(offset),
                                reinterpret_cast<const char*>(message)));
  }
  auto compiled = std::make_shared<Compiled>();
  compiled->code = code;
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  compiled->limits = pcre2_match_context_create(nullptr);
  if (!compiled->limits) return Status::error("pre-tokenizer regex: out of memory");
  pcre2_set_match_limit(compiled->limits, UINT32_MAX);
  pcre2_set_depth_limit(compiled->limits, UINT32_MAX);
  pcre2_set_heap_limit(compiled->limits, 1u << 20);  // KiB
  return PreTokenizer(std::move(compiled));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  MAGNETAR_CHECK(md != nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;    // next byte to match from
  size_t piece = 0;  // start of the pending unmatched bytes
  while (pos < text.size()) {
    int rc = pcre2_match(compiled_->code, subject, text.size(), pos, 0, md, compiled_->limits);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(compiled_->code, subject, text.size(), pos, kNoJit, md, compiled_->limits);
    }
    if (rc <= 0) break;  // no match, or a resource limit (past 1 GiB of the interpreter's heap): the rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    MAGNETAR_CHECK(end > start);  // no alternative matches the empty string
    if (start > piece) pieces->push_back(text.substr(piece, start - piece));
    pieces->push_back(text.substr(start, end - start));
    pos = piece = end;
  }
  if (piece < text.size()) pieces->push_back(text.substr(piece));
  pcre2_match_data_free(md);
}

}  // namespace magnetar::tokenizer
