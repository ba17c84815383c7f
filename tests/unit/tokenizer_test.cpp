// Tokenizer unit tests on a toy byte-level BPE written as an HF tokenizer folder: the import into GGUF
// metadata (llama.cpp's keys and token types), encodings worked out by hand from the toy merges, the GGUF
// file round trip, streaming detokenization, and the errors for bad metadata. Parity with HF tokenizers on
// real vocabularies is tests/tokenizer/parity_test.cpp.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "tests/unit/gguf_test_util.h"
#include "tests/unit/toy_tokenizer.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/unicode.h"

namespace magnetar::tokenizer {
namespace {

using testing::TempDir;
using testing::write_file;
using testing::kMerges;
using testing::write_toy_hf;
using Ids = std::vector<int32_t>;

const gguf::Value* find(const std::vector<gguf::KeyValue>& kv, const std::string& key) {
  for (const gguf::KeyValue& e : kv) {
    if (e.key == key) return &e.value;
  }
  return nullptr;
}

std::vector<gguf::KeyValue> toy_metadata(const TempDir& dir, int64_t n_vocab = 0) {
  write_toy_hf(dir.file(""));
  Result<std::vector<gguf::KeyValue>> kv = gguf_metadata_from_hf(dir.file(""), n_vocab);
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  return kv.ok() ? kv.value() : std::vector<gguf::KeyValue>{};
}

Tokenizer toy_tokenizer(const std::vector<gguf::KeyValue>& kv) {
  Result<Tokenizer> tok = Tokenizer::from_gguf(kv, "toy");
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return std::move(tok).value();
}

// ---- hf_import --------------------------------------------------------------------------------------------

TEST(HfImport, WritesLlamaCppKeysTypesAndPadding) {
  TempDir dir;
  const std::vector<gguf::KeyValue> kv = toy_metadata(dir, 272);
  std::vector<std::string> keys;
  keys.reserve(kv.size());
  for (const gguf::KeyValue& e : kv) keys.push_back(e.key);
  // The converter's order: model, pre, tokens, types, merges, special ids (eos from tokenizer_config, then
  // pad), add flags, template.
  const std::vector<std::string> expected_keys = {"tokenizer.ggml.model",
                                                  "tokenizer.ggml.pre",
                                                  "tokenizer.ggml.tokens",
                                                  "tokenizer.ggml.token_type",
                                                  "tokenizer.ggml.merges",
                                                  "tokenizer.ggml.eos_token_id",
                                                  "tokenizer.ggml.padding_token_id",
                                                  "tokenizer.ggml.add_bos_token",
                                                  "tokenizer.chat_template"};
  EXPECT_EQ(keys, expected_keys);
  EXPECT_EQ(find(kv, "tokenizer.ggml.model")->str, "gpt2");
  EXPECT_EQ(find(kv, "tokenizer.ggml.pre")->str, "qwen2");
  const gguf::Value& tokens = *find(kv, "tokenizer.ggml.tokens");
  const gguf::Value& types = *find(kv, "tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.array.size(), 272u);
  ASSERT_EQ(types.array.size(), 272u);
  EXPECT_EQ(types.array_type, gguf::ValueType::kInt32);
  EXPECT_EQ(tokens.array[32].str, "\xC4\xA0");  // the byte-level space, as stored by HF
  EXPECT_EQ(types.array[32].i, 1);              // NORMAL
  EXPECT_EQ(tokens.array[259].str, "hello");
  EXPECT_EQ(tokens.array[266].str, "<|pad|>");
  EXPECT_EQ(types.array[266].i, 3);  // CONTROL: special
  EXPECT_EQ(types.array[267].i, 4);  // USER_DEFINED: not special, does not look special
  EXPECT_EQ(types.array[268].i, 3);
  EXPECT_EQ(tokens.array[270].str, "[PAD270]");
  EXPECT_EQ(types.array[270].i, 5);  // UNUSED
  const gguf::Value& merges = *find(kv, "tokenizer.ggml.merges");
  ASSERT_EQ(merges.array.size(), kMerges.size());
  EXPECT_EQ(merges.array[0].str, "h e");
  EXPECT_EQ(merges.array[8].str, "\xC4\xA0wor ld");
  EXPECT_EQ(find(kv, "tokenizer.ggml.eos_token_id")->u, 268u);
  EXPECT_EQ(find(kv, "tokenizer.ggml.eos_token_id")->type, gguf::ValueType::kUint32);
  EXPECT_EQ(find(kv, "tokenizer.ggml.padding_token_id")->u, 266u);
  EXPECT_EQ(find(kv, "tokenizer.ggml.add_bos_token")->u, 0u);
  EXPECT_EQ(find(kv, "tokenizer.chat_template")->str, "{% for m in messages %}{{ m.content }}{% endfor %}");
}

TEST(HfImport, ErrorsNameTheFileAndField) {
  TempDir dir;
  Result<std::vector<gguf::KeyValue>> missing = gguf_metadata_from_hf(dir.file("nope"), 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope/tokenizer.json"), std::string::npos) << missing.status().message();

  write_toy_hf(dir.file(""));
  std::ifstream in(dir.file("tokenizer.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
  write_file(dir.file("tokenizer.json"), j.dump());
  Result<std::vector<gguf::KeyValue>> bad_regex = gguf_metadata_from_hf(dir.file(""), 0);
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("pre_tokenizer"), std::string::npos) << bad_regex.status().message();

  // Options the importer does not implement are refused by name (they were dropped: the GGUF tokenized otherwise).
  const nlohmann::json good = j;
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json e = good;
    e["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = std::string(testing::kQwen2Regex);
    edit(e);
    write_file(dir.file("tokenizer.json"), e.dump());
    Result<std::vector<gguf::KeyValue>> r = gguf_metadata_from_hf(dir.file(""), 0);
    EXPECT_FALSE(r.ok()) << needle;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    }
  };
  write_toy_hf(dir.file(""));
  ASSERT_TRUE(gguf_metadata_from_hf(dir.file(""), 0).ok());  // the toy as written imports: each edit alone fails
  refused([](nlohmann::json& e) { e["normalizer"] = nullptr; }, "tokenizer.json: normalizer: not NFC");
  refused([](nlohmann::json& e) { e["model"]["ignore_merges"] = true; }, "model.ignore_merges");
  refused([](nlohmann::json& e) { e["model"]["dropout"] = 0.1; }, "model.dropout");
  refused([](nlohmann::json& e) { e["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
          "add_prefix_space");
  refused([](nlohmann::json& e) { e["pre_tokenizer"]["pretokenizers"][1].erase("use_regex"); }, "use_regex");
  refused(
      [](nlohmann::json& e) { e["pre_tokenizer"]["pretokenizers"].push_back(e["pre_tokenizer"]["pretokenizers"][0]); },
      "not a Split by a regex then ByteLevel");
  refused([](nlohmann::json& e) { e["added_tokens"][1]["lstrip"] = true; }, "'<think>': lstrip is not supported");

  j["model"]["type"] = "Unigram";
  write_file(dir.file("tokenizer.json"), j.dump());
  Result<std::vector<gguf::KeyValue>> unigram = gguf_metadata_from_hf(dir.file(""), 0);
  ASSERT_FALSE(unigram.ok());
  EXPECT_NE(unigram.status().message().find("model.type"), std::string::npos) << unigram.status().message();

  write_file(dir.file("tokenizer.json"), "{ not json");
  Result<std::vector<gguf::KeyValue>> garbage = gguf_metadata_from_hf(dir.file(""), 0);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("not valid JSON"), std::string::npos) << garbage.status().message();
}

// ---- encoding ---------------------------------------------------------------------------------------------

// DeepSeek-R1-Distill-Qwen's GGUFs name the pre-tokenizer "deepseek-r1-qwen" (Qwen2.5's tokenizer): read as qwen2,
// as llama.cpp does (it was refused as unsupported).
TEST(Tokenizer, DeepSeekR1DistillQwenIsTheQwen2PreTokenizer) {
  TempDir dir;
  std::vector<gguf::KeyValue> kv = toy_metadata(dir);
  const Tokenizer qwen2 = toy_tokenizer(kv);
  for (gguf::KeyValue& e : kv) {
    if (e.key == "tokenizer.ggml.pre") e.value = gguf::Value::of_string("deepseek-r1-qwen");
  }
  const Tokenizer distill = toy_tokenizer(kv);
  for (const char* text : {"hello world 12345", "Tie\u0302\u0301ng 'S vie\u0323t<|im_end|>"}) {
    EXPECT_EQ(distill.encode(text, true), qwen2.encode(text, true)) << text;
  }
}

TEST(Tokenizer, EncodesHandComputedIds) {
  TempDir dir;
  const Tokenizer tok = toy_tokenizer(toy_metadata(dir));
  // "hello" merges h+e, l+l, he+ll, hell+o; " world" is one pre-token: Ġ+w, o+r, l+d, Ġw+or, Ġwor+ld.
  EXPECT_EQ(tok.encode("hello world", true), (Ids{259, 264}));
  // Both "he" pairs merge first (rank 0, leftmost first), then both "ll", ...
  EXPECT_EQ(tok.encode("hellohello", true), (Ids{259, 259}));
  EXPECT_EQ(tok.encode("hel", true), (Ids{256, 'l'}));
  EXPECT_EQ(tok.encode("\xC3\xA9"
                       "e",
                       true),
            (Ids{265, 'e'}));
  // NFC first: e + U+0301 becomes U+00E9, which the toy merges into one token.
  EXPECT_EQ(tok.encode("e\xCC\x81", true), (Ids{265}));
  // Pre-tokens: "hello", "  " (whitespace not followed by a non-space is kept apart), " world".
  EXPECT_EQ(tok.encode("hello   world", true), (Ids{259, ' ', ' ', 264}));
  EXPECT_EQ(tok.encode("", true), Ids{});
  // Invalid UTF-8 is encoded byte by byte, never rejected.
  EXPECT_EQ(tok.encode("\xFF"
                       "hello\x80",
                       true),
            (Ids{0xFF, 259, 0x80}));
}

TEST(Tokenizer, SpecialTokensInText) {
  TempDir dir;
  const Tokenizer tok = toy_tokenizer(toy_metadata(dir));
  EXPECT_EQ(tok.encode("hello<|im_end|>", true), (Ids{259, 268}));
  EXPECT_EQ(tok.encode("<|pad|><|im_end|><think>", true), (Ids{266, 268, 267}));
  // Without parse_special, CONTROL tokens are text; USER_DEFINED ones still match.
  const Ids plain = tok.encode("<|pad|><think>", false);
  ASSERT_EQ(plain.size(), 8u);
  EXPECT_EQ(plain.back(), 267);
  EXPECT_EQ(plain.front(), '<');
  // A near miss is text.
  EXPECT_EQ(tok.encode("<|pad|", true), (Ids{'<', '|', 'p', 'a', 'd', '|'}));
}

TEST(Tokenizer, SpecialIdsAndEndOfGeneration) {
  TempDir dir;
  const Tokenizer tok = toy_tokenizer(toy_metadata(dir, 272));
  EXPECT_EQ(tok.n_vocab(), 272);
  EXPECT_EQ(tok.bos_id(), kNoToken);
  EXPECT_EQ(tok.eos_id(), 268);
  EXPECT_EQ(tok.pad_id(), 266);
  EXPECT_EQ(tok.eot_id(), 268);  // found by its text, <|im_end|>
  EXPECT_FALSE(tok.add_bos());
  EXPECT_TRUE(tok.is_eog(268));
  EXPECT_FALSE(tok.is_eog(266));
  EXPECT_FALSE(tok.is_eog(259));
  EXPECT_EQ(tok.token_text(264), " world");
  EXPECT_EQ(tok.token_text(266), "<|pad|>");
  EXPECT_EQ(tok.token_text(100000), "");
  // The padding ids (269..271, "[PAD270]"...) are unused: no text, as llama.cpp (Hugging Face has no such ids).
  EXPECT_EQ(tok.token_type(270), TokenType::kUnused);
  EXPECT_EQ(tok.token_text(270), "");
  EXPECT_EQ(tok.decode(Ids{259, 270, 264}), tok.decode(Ids{259, 264}));
  EXPECT_EQ(tok.token_type(267), TokenType::kUserDefined);
  EXPECT_EQ(tok.pre(), "qwen2");
  EXPECT_FALSE(tok.chat_template().empty());
}

TEST(Tokenizer, GgufFileRoundTripGivesIdenticalEncodings) {
  TempDir dir;
  const std::vector<gguf::KeyValue> kv = toy_metadata(dir, 272);
  const std::string path = dir.file("vocab.gguf");
  gguf::Writer writer(path);
  writer.set("general.architecture", gguf::Value::of_string("qwen3moe"));
  for (const gguf::KeyValue& e : kv) writer.set(e.key, e.value);
  ASSERT_TRUE(writer.begin().ok());
  ASSERT_TRUE(writer.finish().ok());
  Result<std::unique_ptr<gguf::Model>> model = gguf::Model::open(path);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Result<Tokenizer> from_file = Tokenizer::from_gguf(model.value()->metadata(), path);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  const Tokenizer direct = toy_tokenizer(kv);
  for (const char* text :
       {"hello world", "<|im_end|>hello<think>", "e\xCC\x81\xC3\xA9 x  \n\n\t", "\xF0\x9F\x98\x80"}) {
    EXPECT_EQ(from_file->encode(text, true), direct.encode(text, true)) << text;
    EXPECT_EQ(from_file->encode(text, false), direct.encode(text, false)) << text;
  }
  EXPECT_EQ(from_file->eog_ids(), direct.eog_ids());
  EXPECT_EQ(from_file->chat_template(), direct.chat_template());
}

// ---- streaming --------------------------------------------------------------------------------------------

TEST(StreamDecoder, HoldsBackSplitCharacters) {
  TempDir dir;
  const Tokenizer tok = toy_tokenizer(toy_metadata(dir));
  StreamDecoder d(tok);
  // U+1F600 is F0 9F 98 80: one byte token each.
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(d.push(259), "hello");
  // A byte that can never start a sequence, and a sequence cut short by ASCII, become U+FFFD at once.
  EXPECT_EQ(d.push(0xA9), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_EQ(d.push('a'),
            "\xEF\xBF\xBD"
            "a");
  // The stream ends inside a sequence: flush emits U+FFFD once.
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, RandomByteStreamsStayValidAndMatchDecode) {
  TempDir dir;
  const Tokenizer tok = toy_tokenizer(toy_metadata(dir));
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  for (int trial = 0; trial < 2000; ++trial) {
    // Mostly valid text cut into byte tokens, with some random bytes and multi-byte tokens mixed in.
    std::vector<int32_t> ids;
    const std::string pieces[] = {"\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xC3\xA9", "a", " ", "\xE2\x82\xAC"};
    for (int k = int(next() % 12); k > 0; --k) {
      if (next() % 8 == 0) {
        ids.push_back(int32_t(next() % 269));
        continue;
      }
      for (char c : pieces[next() % 6]) ids.push_back(uint8_t(c));
    }
    StreamDecoder d(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = d.push(id);
      ASSERT_TRUE(is_valid_utf8(part)) << "trial " << trial;
      streamed += part;
    }
    const std::string tail = d.flush();
    ASSERT_TRUE(is_valid_utf8(tail));
    streamed += tail;
    EXPECT_EQ(streamed, tok.decode(ids)) << "trial " << trial;
  }
}

// ---- UTF-8 and NFC against the Unicode standard's own examples ---------------------------------------------

TEST(Unicode, MaximalSubpartReplacement) {
  // Unicode 15.0 chapter 3.9, table 3-11: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  EXPECT_EQ(to_valid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c\xEF\xBF\xBD\xEF\xBF\xBD"
            "d");
  // Table 3-8: surrogates and overlongs are invalid byte by byte (C0 AF, E0 80 BF, ED A0 80).
  EXPECT_EQ(to_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(is_valid_utf8("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));
}

TEST(Unicode, NfcExamplesFromUax15) {
  EXPECT_EQ(to_nfc("\xE1\xB8\x8B\xCC\xA3"), "\xE1\xB8\x8D\xCC\x87");          // ḋ + dot below -> ḍ + dot above
  EXPECT_EQ(to_nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");                // reordered, nothing composes
  EXPECT_EQ(to_nfc("\xE2\x84\xAB"), "\xC3\x85");                              // U+212B ANGSTROM SIGN -> U+00C5
  EXPECT_EQ(to_nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");              // U+0958 is a composition exclusion
  EXPECT_EQ(to_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // L V T jamo -> U+AC01
  EXPECT_EQ(to_nfc("A\xCC\x8A"), "\xC3\x85");
  // A precomposed Latin-1 letter decomposes so that a later mark can take its place (as Python's
  // unicodedata and HF tokenizers agree): I-diaeresis + tilde below -> U+1E2C + diaeresis.
  EXPECT_EQ(to_nfc("\xC3\x8F\xCC\xB0"), "\xE1\xB8\xAC\xCC\x88");
  EXPECT_TRUE(is_nfc_quick("plain ASCII and Latin-1 \xC3\xA9"));
  EXPECT_FALSE(is_nfc_quick("e\xCC\x81"));
  EXPECT_EQ(to_nfc("\xFF"
                   "e\xCC\x81"),
            "\xFF\xC3\xA9");  // invalid bytes pass through
}

// ---- bad metadata -----------------------------------------------------------------------------------------

std::string load_error(std::vector<gguf::KeyValue> kv, const std::string& key, const gguf::Value* value) {
  bool replaced = false;
  for (auto it = kv.begin(); it != kv.end(); ++it) {
    if (it->key != key) continue;
    if (value) {
      it->value = *value;
    } else {
      kv.erase(it);
    }
    replaced = true;
    break;
  }
  if (!replaced && value) kv.push_back({key, *value});
  Result<Tokenizer> tok = Tokenizer::from_gguf(kv, "m.gguf");
  return tok.ok() ? "" : tok.status().message();
}

TEST(Tokenizer, BadMetadataErrorsNameTheKey) {
  TempDir dir;
  const std::vector<gguf::KeyValue> kv = toy_metadata(dir);
  using gguf::Value;
  using gguf::ValueType;
  const auto expect_error = [&](const std::string& key, const Value* value, const std::string& needle) {
    const std::string message = load_error(kv, key, value);
    EXPECT_NE(message.find("m.gguf: " + key + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  expect_error("tokenizer.ggml.model", nullptr, "missing");
  const Value llama = Value::of_string("llama");
  expect_error("tokenizer.ggml.model", &llama, "'llama'");
  const Value pre = Value::of_string("gpt-9");
  expect_error("tokenizer.ggml.pre", &pre, "'gpt-9'");
  expect_error("tokenizer.ggml.tokens", nullptr, "missing");
  const Value short_types = Value::of_array(ValueType::kInt32, {Value::of_int(ValueType::kInt32, 1)});
  expect_error("tokenizer.ggml.token_type", &short_types, "1 entries");
  const Value bad_merge = Value::of_strings({"h e", "he zz"});
  expect_error("tokenizer.ggml.merges", &bad_merge, "entry 1");
  const Value no_space = Value::of_strings({"he"});
  expect_error("tokenizer.ggml.merges", &no_space, "entry 0");
  const Value eos = Value::of_uint(ValueType::kUint32, 99999);
  expect_error("tokenizer.ggml.eos_token_id", &eos, "99999");
  const Value add_bos = Value::of_bool(true);
  expect_error("tokenizer.ggml.add_bos_token", &add_bos, "bos_token_id");
  const Value not_string = Value::of_uint(ValueType::kUint32, 3);
  expect_error("tokenizer.ggml.pre", &not_string, "expected a string");
  // A vocabulary without all 256 byte tokens is not byte-level BPE.
  std::vector<gguf::KeyValue> few = kv;
  for (gguf::KeyValue& e : few) {
    if (e.key == "tokenizer.ggml.tokens") e.value.array[65].str = "zzz";
  }
  Result<Tokenizer> missing_byte = Tokenizer::from_gguf(few, "m.gguf");
  ASSERT_FALSE(missing_byte.ok());
  EXPECT_NE(missing_byte.status().message().find("byte 0x41"), std::string::npos) << missing_byte.status().message();
}

}  // namespace
}  // namespace magnetar::tokenizer
