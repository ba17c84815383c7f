// `magnetar convert` on broken inputs (each error names the file and the field or tensor, and no output
// file appears), the tokenizer paths (--vocab-only, folders with and without tokenizer.json), and the
// command line (exit codes).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "convert/convert.h"
#include "gguf/reader.h"
#include "tests/unit/convert_test_util.h"

namespace magnetar {
namespace {

using testing::TinyQwen3;

struct Folder {
  testing::TempDir tmp;
  std::string dir = tmp.file("model");
  std::string out = tmp.file("out.gguf");
  Folder() { std::filesystem::create_directory(dir); }
};

// Converts and returns the error message ("" on success). A failed conversion must leave no output.
std::string convert_error(const Folder& f, bool vocab_only = false) {
  const Status s = convert::convert({.hf_dir = f.dir,
                                     .out_path = f.out,
                                     .out_type = convert::OutType::kF16,
                                     .vocab_only = vocab_only,
                                     .n_threads = 1,
                                     .progress = nullptr});
  if (!s.ok()) {
    EXPECT_FALSE(std::filesystem::exists(f.out)) << s.message();
    EXPECT_FALSE(std::filesystem::exists(f.out + ".tmp")) << s.message();
  }
  return s.ok() ? "" : s.message();
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

std::vector<testing::StTensor> without(std::vector<testing::StTensor> t, const std::string& name) {
  std::erase_if(t, [&](const testing::StTensor& x) { return x.name == name; });
  return t;
}

TEST(ConvertErrors, MissingTensorIsNamed) {
  Folder f;
  const TinyQwen3 g;
  testing::write_hf_folder(f.dir, g.config(), without(g.tensors(), "model.layers.1.mlp.experts.3.up_proj.weight"));
  const std::string e = convert_error(f);
  EXPECT_HAS(e, "tensor 'model.layers.1.mlp.experts.3.up_proj.weight' is missing");
  EXPECT_HAS(e, "blk.1.ffn_up_exps.weight");
}

TEST(ConvertErrors, IllShapedTensorNamesFileTensorAndShapes) {
  Folder f;
  const TinyQwen3 g;
  std::vector<testing::StTensor> t = without(g.tensors(), "model.layers.0.self_attn.k_proj.weight");
  t.push_back(testing::make_tensor("model.layers.0.self_attn.k_proj.weight", {16, g.n_embd}, "F32"));
  testing::write_hf_folder(f.dir, g.config(), t, /*n_shards=*/2);
  const std::string e = convert_error(f);
  EXPECT_HAS(e,
             "-of-00002.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 32], "
             "expected [32, 32]");
}

TEST(ConvertErrors, WrongShapeAndDtype) {
  {
    Folder f;
    const TinyQwen3 g;
    std::vector<testing::StTensor> t = without(g.tensors(), "model.layers.0.mlp.gate.weight");
    t.push_back(testing::make_tensor("model.layers.0.mlp.gate.weight", {g.n_expert + 1, g.n_embd}, "F32"));
    testing::write_hf_folder(f.dir, g.config(), t);
    const std::string e = convert_error(f);
    EXPECT_HAS(e, "model.safetensors: tensor 'model.layers.0.mlp.gate.weight' has shape [5, 32], expected [4, 32]");
  }
  {
    Folder f;
    const TinyQwen3 g;
    std::vector<testing::StTensor> t = without(g.tensors(), "model.norm.weight");
    t.push_back({"model.norm.weight", "I32", {g.n_embd}, std::vector<uint8_t>(size_t(g.n_embd) * 4, 0)});
    testing::write_hf_folder(f.dir, g.config(), t);
    const std::string e = convert_error(f);
    EXPECT_HAS(e, "tensor 'model.norm.weight' has dtype I32");
  }
}

TEST(ConvertErrors, UnsupportedArchitectureListsTheSupportedOnes) {
  Folder f;
  const TinyQwen3 g;
  nlohmann::json c = g.config();
  c["architectures"] = {"LlamaForCausalLM"};
  testing::write_hf_folder(f.dir, c, g.tensors());
  const std::string e = convert_error(f);
  EXPECT_HAS(e, "config.json: architecture 'LlamaForCausalLM' is not supported");
  EXPECT_HAS(e, "Qwen3ForCausalLM, Qwen3MoeForCausalLM");
  c.erase("architectures");
  testing::write_text(f.dir + "/config.json", c.dump());
  EXPECT_HAS(convert_error(f), "field 'architectures' is missing");
}

TEST(ConvertErrors, UnusedTensorIsReported) {
  Folder f;
  const TinyQwen3 g;
  std::vector<testing::StTensor> t = g.tensors();
  t.push_back(testing::make_tensor("model.layers.0.mlp.shared_expert.up_proj.weight", {8, g.n_embd}, "F32"));
  t.push_back(testing::make_tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {8}, "F32"));  // ignored
  testing::write_hf_folder(f.dir, g.config(), t);
  const std::string e = convert_error(f);
  EXPECT_HAS(e, "tensor 'model.layers.0.mlp.shared_expert.up_proj.weight' is not part of the qwen3moe mapping");
}

TEST(ConvertErrors, ConfigFieldsAreNamed) {
  const TinyQwen3 g;
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {[](nlohmann::json& c) { c.erase("hidden_size"); }, "field 'hidden_size' is missing"},
      {[](nlohmann::json& c) { c["num_hidden_layers"] = "two"; }, "field 'num_hidden_layers' is not an integer"},
      {[](nlohmann::json& c) { c["num_attention_heads"] = 0; }, "field 'num_attention_heads' is 0"},
      {[](nlohmann::json& c) { c["num_key_value_heads"] = 3; }, "not a multiple of num_key_value_heads 3"},
      {[](nlohmann::json& c) { c["num_local_experts"] = 8; }, "num_local_experts 8 and num_experts 4 disagree"},
      {[](nlohmann::json& c) { c.erase("num_experts"); }, "field 'num_experts' (or 'num_local_experts') is missing"},
      {[](nlohmann::json& c) { c["num_experts_per_tok"] = 9; }, "num_experts_per_tok 9 exceeds the 4 experts"},
      {[](nlohmann::json& c) { c["mlp_only_layers"] = {5}; }, "'mlp_only_layers' lists layer 5 of 2"},
      {[](nlohmann::json& c) { c.erase("rope_theta"); }, "field 'rope_theta' is missing"},
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
       },
       "RoPE type 'dynamic' is not supported"},
      {[](nlohmann::json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
       },
       "field 'rope_scaling.original_max_position_embeddings' is missing"},
      {[](nlohmann::json& c) {
         c["rope_parameters"] = {{"rope_theta", "big"}};
       },
       "field 'rope_parameters.rope_theta' is not a number"},
      {[](nlohmann::json& c) { c["tie_word_embeddings"] = 1; }, "field 'tie_word_embeddings' is not a boolean"},
      // Sizes that would allocate per layer before any tensor is checked (16 GB for the layers' list).
      {[](nlohmann::json& c) { c["num_hidden_layers"] = 4000000000; },
       "field 'num_hidden_layers' is 4000000000, at most 65536 supported"},
      {[](nlohmann::json& c) { c["vocab_size"] = 1e300; }, "field 'vocab_size' is not an integer"},
  };
  for (const Case& k : cases) {
    Folder f;
    nlohmann::json c = g.config();
    k.edit(c);
    testing::write_hf_folder(f.dir, c, g.tensors());
    const std::string e = convert_error(f);
    EXPECT_HAS(e, "config.json");
    EXPECT_HAS(e, k.expect);
  }
  Folder f;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  testing::write_text(f.dir + "/config.json", "{\"architectures\": [");
  EXPECT_HAS(convert_error(f), "config.json: invalid JSON");
}

TEST(ConvertErrors, BrokenShardSets) {
  const TinyQwen3 g;
  {
    Folder f;  // index maps a tensor to a shard that does not hold it
    testing::write_hf_folder(f.dir, g.config(), g.tensors(), 2);
    nlohmann::json index = nlohmann::json::parse(testing::read_all(f.dir + "/model.safetensors.index.json"));
    index["weight_map"]["model.norm.weight"] =
        index["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors"
            ? "model-00002-of-00002.safetensors"
            : "model-00001-of-00002.safetensors";
    testing::write_text(f.dir + "/model.safetensors.index.json", index.dump());
    EXPECT_HAS(convert_error(f), "tensor 'model.norm.weight' is mapped to model-0000");
  }
  {
    Folder f;  // index escapes the folder
    testing::write_hf_folder(f.dir, g.config(), g.tensors(), 2);
    nlohmann::json index = nlohmann::json::parse(testing::read_all(f.dir + "/model.safetensors.index.json"));
    index["weight_map"]["model.norm.weight"] = "../model-00001-of-00002.safetensors";
    testing::write_text(f.dir + "/model.safetensors.index.json", index.dump());
    EXPECT_HAS(convert_error(f), "weight_map 'model.norm.weight': not a file name inside the model folder");
  }
  {
    Folder f;  // a shard is missing
    testing::write_hf_folder(f.dir, g.config(), g.tensors(), 2);
    std::filesystem::remove(f.dir + "/model-00002-of-00002.safetensors");
    EXPECT_HAS(convert_error(f), "model-00002-of-00002.safetensors: cannot open");
  }
  {
    Folder f;  // a tensor in two shards
    const std::vector<testing::StTensor> t = g.tensors();
    testing::write_hf_folder(f.dir, g.config(), t, 2);
    const nlohmann::json index = nlohmann::json::parse(testing::read_all(f.dir + "/model.safetensors.index.json"));
    std::vector<testing::StTensor> second;
    std::string copied;
    for (const testing::StTensor& x : t) {
      if (index["weight_map"][x.name] == "model-00002-of-00002.safetensors") {
        second.push_back(x);
      } else if (copied.empty()) {  // one tensor of shard 1 duplicated into shard 2
        copied = x.name;
        second.push_back(x);
      }
    }
    testing::write_all(f.dir + "/model-00002-of-00002.safetensors", testing::safetensors_bytes(second));
    const std::string e = convert_error(f);
    EXPECT_HAS(e,
               "model-00002-of-00002.safetensors: tensor '" + copied + "' is also in model-00001-of-00002.safetensors");
  }
  {
    Folder f;  // no weights at all
    testing::write_text(f.dir + "/config.json", g.config().dump());
    EXPECT_HAS(convert_error(f), "no model.safetensors or model.safetensors.index.json");
  }
  {
    Folder f;  // a hostile shard header surfaces with the shard's name
    testing::write_hf_folder(f.dir, g.config(), g.tensors());
    testing::write_all(f.dir + "/model.safetensors", testing::safetensors_raw(R"({"w":{"dtype":"F32"}})", {}));
    EXPECT_HAS(convert_error(f), "model.safetensors: tensor 'w': shape is missing");
  }
}

// A minimal byte-level BPE tokenizer folder in the Qwen2/Qwen3 style (the pre-tokenizer regex is the one
// published in Qwen's tokenizer.json).
void write_tokenizer(const std::string& dir) {
  const std::string qwen2_regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const nlohmann::json tj = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_regex}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"added_tokens", {{{"id", 3}, {"content", "<|im_end|>"}, {"special", true}}}}};
  testing::write_text(dir + "/tokenizer.json", tj.dump());
  const nlohmann::json tc = {{"eos_token", "<|im_end|>"}, {"chat_template", "{{ messages }}"}};
  testing::write_text(dir + "/tokenizer_config.json", tc.dump());
}

TEST(ConvertTokenizer, VocabOnlyWritesTokenizerAndNoTensors) {
  Folder f;
  const TinyQwen3 g;
  testing::write_text(f.dir + "/config.json", g.config().dump());  // no weights needed
  write_tokenizer(f.dir);
  ASSERT_EQ(convert_error(f, /*vocab_only=*/true), "");
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(f.out);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m.value()->tensors().size(), 0u);
  EXPECT_EQ(m.value()->architecture(), "qwen3moe");
  EXPECT_EQ(m.value()->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(m.value()->get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(m.value()->get_string("tokenizer.chat_template"), "{{ messages }}");
  const gguf::Value* tokens = m.value()->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->array.size(), size_t(g.n_vocab));  // padded to config.json vocab_size
  EXPECT_EQ(tokens->array[2].str, "ab");
  EXPECT_EQ(tokens->array[3].str, "<|im_end|>");
  EXPECT_EQ(m.value()->find("tokenizer.ggml.eos_token_id")->as_uint(), 3u);
  EXPECT_EQ(m.value()->find("qwen3moe.expert_count")->as_uint(), 4u);  // hyperparameters still present
}

TEST(ConvertTokenizer, VocabOnlyWithoutTokenizerIsAnError) {
  Folder f;
  testing::write_text(f.dir + "/config.json", TinyQwen3().config().dump());
  EXPECT_HAS(convert_error(f, /*vocab_only=*/true), "tokenizer.json: not found");
}

TEST(ConvertTokenizer, FullConversionAppendsTokenizerAfterTheModelKeys) {
  Folder f;
  const TinyQwen3 g;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  write_tokenizer(f.dir);
  ASSERT_EQ(convert_error(f), "");
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(f.out);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<gguf::KeyValue>& md = m.value()->metadata();
  size_t quant_version = md.size(), first_tokenizer = md.size();
  for (size_t i = 0; i < md.size(); ++i) {
    if (md[i].key == "general.quantization_version") quant_version = i;
    if (md[i].key.starts_with("tokenizer.") && first_tokenizer == md.size()) first_tokenizer = i;
  }
  EXPECT_EQ(first_tokenizer, quant_version + 1);
  EXPECT_EQ(m.value()->tensors().size(), size_t(1 + 12 * g.n_layer + 2));
}

// ---- the command line -------------------------------------------------------------------------------------

struct CliRun {
  int status = -1;
  std::string err;
};

CliRun run_magnetar(const std::string& args) {
  testing::TempDir tmp;
  const std::string err_file = tmp.file("err.txt");
  const int st = std::system((std::string(MAGNETAR_BINARY) + " " + args + " >/dev/null 2>" + err_file).c_str());
  const std::vector<uint8_t> err = testing::read_all(err_file);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, std::string(err.begin(), err.end())};
}

TEST(ConvertCli, ExitCodesAndMessages) {
  Folder f;
  const TinyQwen3 g;
  testing::write_hf_folder(f.dir, g.config(), g.tensors());
  const CliRun ok = run_magnetar("convert " + f.dir + " -o " + f.out + " --outtype q8_0 -t 2");
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_HAS(ok.err, "no tokenizer.json");
  EXPECT_TRUE(std::filesystem::exists(f.out));

  const CliRun bad_type = run_magnetar("convert " + f.dir + " -o " + f.out + " --outtype q4_k");
  EXPECT_EQ(bad_type.status, 2);
  EXPECT_HAS(bad_type.err, "--outtype 'q4_k'");
  const CliRun no_out = run_magnetar("convert " + f.dir);
  EXPECT_EQ(no_out.status, 2);
  EXPECT_HAS(no_out.err, "-o OUT.gguf is required");
  const CliRun missing = run_magnetar("convert " + f.dir + "/nope -o " + f.out);
  EXPECT_EQ(missing.status, 2);
  EXPECT_HAS(missing.err, "nope: not a directory");

  nlohmann::json c = g.config();
  c["architectures"] = {"MixtralForCausalLM"};
  testing::write_text(f.dir + "/config.json", c.dump());
  const CliRun unsupported = run_magnetar("convert " + f.dir + " -o " + f.tmp.file("x.gguf"));
  EXPECT_EQ(unsupported.status, 2);
  EXPECT_HAS(unsupported.err, "architecture 'MixtralForCausalLM' is not supported");
  EXPECT_FALSE(std::filesystem::exists(f.tmp.file("x.gguf")));

  testing::write_text(f.dir + "/config.json", g.config().dump());
  const CliRun unwritable = run_magnetar("convert " + f.dir + " -o " + f.tmp.file("no/such/dir/x.gguf"));
  EXPECT_EQ(unwritable.status, 1) << unwritable.err;

  // An output that is one of the inputs (the rename would replace it) or a directory is refused before any work.
  const CliRun over_input = run_magnetar("convert " + f.dir + " -o " + f.dir + "/config.json");
  EXPECT_EQ(over_input.status, 2);
  EXPECT_HAS(over_input.err, "config.json of the model folder");
  std::ifstream config(f.dir + "/config.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(config), {}), g.config().dump());
  const CliRun to_dir = run_magnetar("convert " + f.dir + " -o " + f.tmp.file(""));
  EXPECT_EQ(to_dir.status, 1) << to_dir.err;
  EXPECT_HAS(to_dir.err, "is a directory");
}

// A Hugging Face cache snapshot (models--ORG--NAME/snapshots/COMMIT) is named NAME, not by its commit.
TEST(ConvertCli, ACacheSnapshotIsNamedByItsRepository) {
  testing::TempDir tmp;
  const std::string dir = tmp.file("models--Org--Tiny-MoE/snapshots/0123abcd");
  std::filesystem::create_directories(dir);
  const TinyQwen3 g;
  testing::write_hf_folder(dir, g.config(), g.tensors());
  const CliRun ok = run_magnetar("convert " + dir + "/ -o " + tmp.file("m.gguf"));
  ASSERT_EQ(ok.status, 0) << ok.err;
  Result<std::unique_ptr<gguf::Model>> m = gguf::Model::open(tmp.file("m.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m.value()->get_string("general.name"), "Tiny-MoE");
}

}  // namespace
}  // namespace magnetar
