// The `magnetar` binary end to end: inspect on llama.cpp-made files (expected values from the vectors'
// expected.json and the file system, not from our reader), error handling, and synth's output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/tools/invoke.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar {
namespace tools_test {

const std::string kVectors = std::string(MAGNETAR_SHARED_DIR) + "/vectors";

using testing::Invocation;

Invocation run(const std::string& args) { return testing::run_magnetar(args); }

TEST(Inspect, JsonCountsMatchTheVectors) {
  if (!std::filesystem::exists(kVectors + "/quant/expected.json")) {
    GTEST_SKIP() << "SKIP: conformance vectors not found at " << kVectors;
  }
  std::ifstream in(kVectors + "/quant/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    const std::string path = kVectors + "/quant/quant-" + it.key() + ".gguf";
    const Invocation r = run("inspect --json " + path);
    ASSERT_EQ(r.status, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["architecture"], "qwen3moe");
    EXPECT_EQ(j["gguf_version"], 3);
    EXPECT_EQ(j["n_tensors"], it.value().size());
    EXPECT_EQ(j["file_bytes"], std::filesystem::file_size(path));
    EXPECT_EQ(j["n_kv"], j["metadata"].size());
    uint64_t params = 0;
    std::map<std::string, std::pair<uint64_t, uint64_t>> types;
    for (const nlohmann::json& t : it.value()) {
      uint64_t n = 1;
      for (const nlohmann::json& d : t["shape"]) n *= d.get<uint64_t>();
      params += n;
      auto& [count, bytes] = types[t["type"]];
      count += 1;
      bytes += t["nbytes"].get<uint64_t>();
    }
    EXPECT_EQ(j["n_params"], params) << it.key();
    ASSERT_EQ(j["types"].size(), types.size()) << it.key();
    for (const auto& [name, cb] : types) {
      EXPECT_EQ(j["types"][name]["count"], cb.first) << it.key() << " " << name;
      EXPECT_EQ(j["types"][name]["bytes"], cb.second) << it.key() << " " << name;
    }
  }
}

TEST(Inspect, SplitSetShowsAsOneModel) {
  const std::string first = kVectors + "/models/split-q4k-00001-of-00003.gguf";
  if (!std::filesystem::exists(first)) GTEST_SKIP() << "SKIP: split vectors not found at " << kVectors;
  const Invocation r = run("inspect --json " + first);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["shards"], 3);
  EXPECT_EQ(j["n_tensors"], 15);
  uint64_t size = 0;
  for (int k = 1; k <= 3; ++k) {
    size += std::filesystem::file_size(kVectors + "/models/split-q4k-0000" + std::to_string(k) + "-of-00003.gguf");
  }
  EXPECT_EQ(j["file_bytes"], size);
  const Invocation text = run("inspect --kv --tensors " + first);
  ASSERT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("(3 shards)"), std::string::npos);
  EXPECT_NE(text.out.find("split.count"), std::string::npos);
  EXPECT_NE(text.out.find("blk.0.ffn_down_exps.weight"), std::string::npos);
}

TEST(Inspect, BadInputIsOneLineAndExitCode2) {
  testing::TempDir dir;
  testing::write_all(dir.file("junk.gguf"), {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1});
  for (const std::string& args : {"inspect " + dir.file("missing.gguf"), "inspect " + dir.file("junk.gguf"),
                                  std::string("inspect"), std::string("inspect --bogus x.gguf"),
                                  std::string("no-such-command")}) {
    const Invocation r = run(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
  EXPECT_NE(run("inspect " + dir.file("junk.gguf")).err.find("junk.gguf: tensor count at byte 8"), std::string::npos);
}

TEST(Synth, TinyModelHasQwen3MoeGeometryAndIsDeterministic) {
  testing::TempDir dir;
  const Invocation a = run("synth --preset tiny --type q4_k --seed 3 -t 1 -o " + dir.file("a.gguf"));
  ASSERT_EQ(a.status, 0) << a.err;
  const Invocation b = run("synth --preset tiny --type q4_k --seed 3 -t 2 -o " + dir.file("b.gguf"));
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(testing::read_all(dir.file("a.gguf")), testing::read_all(dir.file("b.gguf")));
  const Invocation c = run("synth --preset tiny --type q4_k --seed 4 -o " + dir.file("c.gguf"));
  EXPECT_NE(testing::read_all(dir.file("a.gguf")), testing::read_all(dir.file("c.gguf")));

  const Invocation r = run("inspect --json " + dir.file("a.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen3moe");
  EXPECT_EQ(j["metadata"]["qwen3moe.block_count"], 2);
  EXPECT_EQ(j["metadata"]["qwen3moe.expert_count"], 8);
  EXPECT_EQ(j["n_tensors"], 2 * 12 + 3);  // 12 per layer + embeddings, output norm, output
  for (const nlohmann::json& t : j["tensors"]) {
    const std::string name = t["name"];
    if (name == "blk.1.ffn_down_exps.weight") {
      EXPECT_EQ(t["type"], "Q4_K");
      EXPECT_EQ(t["shape"], nlohmann::json({256, 256, 8}));
    }
    if (name == "blk.0.ffn_gate_inp.weight") {
      EXPECT_EQ(t["type"], "F32");
    }
    if (name == "output.weight") {
      EXPECT_EQ(t["type"], "Q8_0");
    }
  }
}

// --type q4_k_m: llama.cpp's Q4_K_M mix. Of the tiny preset's 2 layers, llama_tensor_get_type's use_more_bits
// (i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2) holds for layer 1 only: its attn_v and ffn_down_exps are Q6_K, layer
// 0's Q4_K; the output matrix Q6_K; general.file_type LLAMA_FTYPE_MOSTLY_Q4_K_M (15). The model runs.
TEST(Synth, Q4KMIsLlamaCppsMix) {
  testing::TempDir dir;
  const Invocation a = run("synth --preset tiny --type q4_k_m -o " + dir.file("m.gguf"));
  ASSERT_EQ(a.status, 0) << a.err;
  const Invocation r = run("inspect --json " + dir.file("m.gguf"));
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["metadata"]["general.file_type"], 15);
  std::map<std::string, std::string> types;
  for (const nlohmann::json& t : j["tensors"]) types[t["name"]] = t["type"];
  const std::map<std::string, std::string> want = {
      {"token_embd.weight", "Q4_K"},          {"output.weight", "Q6_K"},
      {"blk.0.attn_q.weight", "Q4_K"},        {"blk.0.attn_k.weight", "Q4_K"},
      {"blk.0.attn_v.weight", "Q4_K"},        {"blk.1.attn_v.weight", "Q6_K"},
      {"blk.1.attn_output.weight", "Q4_K"},   {"blk.1.ffn_gate_inp.weight", "F32"},
      {"blk.0.ffn_down_exps.weight", "Q4_K"}, {"blk.1.ffn_down_exps.weight", "Q6_K"},
      {"blk.1.ffn_gate_exps.weight", "Q4_K"}, {"blk.1.ffn_up_exps.weight", "Q4_K"}};
  for (const auto& [name, type] : want) EXPECT_EQ(types[name], type) << name;
  const Invocation g = run("run -m " + dir.file("m.gguf") + " --tokens 1,2,3 -n 4 --temp 0");
  EXPECT_EQ(g.status, 0) << g.err;
}

// The share of expert selections taken by the most popular half of the experts, from `synth --check`.
double top_half_share(const std::string& out) {
  const size_t at = out.find("\n  mean");
  EXPECT_NE(at, std::string::npos) << out;
  double distinct, top10, top25, top50;
  EXPECT_EQ(std::sscanf(out.c_str() + at + 8, "%lf %lf%% %lf%% %lf%%", &distinct, &top10, &top25, &top50), 4) << out;
  return top50;
}

TEST(Synth, SkewConcentratesRoutingAndCheckMeasuresIt) {
  testing::TempDir dir;
  ASSERT_EQ(run("synth --preset tiny --type q8_0 -o " + dir.file("u.gguf")).status, 0);
  ASSERT_EQ(run("synth --preset tiny --type q8_0 --skew 2 -o " + dir.file("s.gguf")).status, 0);
  const Invocation u = run("synth --check " + dir.file("u.gguf") + " --check-tokens 256");
  const Invocation s = run("synth --check " + dir.file("s.gguf") + " --check-tokens 256");
  ASSERT_EQ(u.status, 0) << u.err;
  ASSERT_EQ(s.status, 0) << s.err;
  // 8 experts, top-2: the busiest half of the experts takes >= 50% by definition; skew must push it well up.
  EXPECT_GE(top_half_share(u.out), 50.0);
  EXPECT_GT(top_half_share(s.out), top_half_share(u.out) + 10.0) << u.out << s.out;
}

TEST(Synth, RejectsBadArguments) {
  const Invocation r = run("synth --preset huge --type q4_k -o /tmp/x.gguf");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--preset 'huge' is unknown"), std::string::npos) << r.err;
  const Invocation t = run("synth --preset tiny --type q8_k -o /tmp/x.gguf");
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.err.find("not a weight type"), std::string::npos) << t.err;
}

}  // namespace tools_test
}  // namespace magnetar
