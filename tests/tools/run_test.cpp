// `magnetar run` and `magnetar bench` end to end on a synthetic model (no tokenizer: token ids in and out).
// The numbers checked here are properties of the computation (shapes, prefill == decode, determinism), not
// values copied from a previous run; agreement with transformers is tests/golden's job.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/reader.h"
#include "tests/tools/invoke.h"
#include "tests/unit/gguf_test_util.h"
#include "tests/unit/toy_tokenizer.h"

namespace magnetar {
namespace run_test {

using testing::Invocation;

Invocation magnetar(const std::string& args) { return testing::run_magnetar(args); }

// Reads a float32 .npy written by `run --dump-logits`: returns the values and the shape.
std::vector<float> read_npy(const std::string& path, int64_t* rows, int64_t* cols) {
  const std::vector<uint8_t> bytes = testing::read_all(path);
  EXPECT_GE(bytes.size(), 10u);
  EXPECT_EQ(std::memcmp(bytes.data(), "\x93NUMPY", 6), 0);
  const uint16_t header_len = uint16_t(bytes[8] | (bytes[9] << 8));
  const std::string header(bytes.begin() + 10, bytes.begin() + 10 + header_len);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
  EXPECT_EQ((10 + header_len) % 64, 0);
  long long r = 0, c = 0;
  EXPECT_EQ(std::sscanf(header.c_str() + header.find("'shape': (") + 10, "%lld, %lld", &r, &c), 2) << header;
  *rows = r;
  *cols = c;
  std::vector<float> v(static_cast<size_t>(r * c));
  EXPECT_EQ(bytes.size(), 10 + header_len + v.size() * 4);
  std::memcpy(v.data(), bytes.data() + 10 + header_len, v.size() * 4);
  return v;
}

class RunTool : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const Invocation s = magnetar("synth --preset tiny --type q8_0 --seed 2 -o " + model());
    ASSERT_EQ(s.status, 0) << s.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return dir_->file("tiny.gguf"); }
  static std::string file(const std::string& name) { return dir_->file(name); }
  static testing::TempDir* dir_;
};
testing::TempDir* RunTool::dir_ = nullptr;

TEST_F(RunTool, GreedyGenerationIsDeterministicAndReportsStats) {
  const Invocation a = magnetar("run -m " + model() + " --tokens 5,6,7,8 -n 12 --temp 0");
  ASSERT_EQ(a.status, 0) << a.err;
  const Invocation b = magnetar("run -m " + model() + " --tokens 5,6,7,8 -n 12 --temp 0 -t 1");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);                            // thread count does not change greedy output
  EXPECT_EQ(std::count(a.out.begin(), a.out.end(), ','), 11) << a.out;  // 12 ids (no tokenizer: ids printed)
  EXPECT_NE(a.err.find("prompt 4 tokens"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("generated 12 tokens"), std::string::npos) << a.err;
  const Invocation c = magnetar("run -m " + model() + " --tokens 5,6,7,8 -n 12 --temp 1 --seed 9");
  const Invocation d = magnetar("run -m " + model() + " --tokens 5,6,7,8 -n 12 --temp 1 --seed 9");
  EXPECT_EQ(c.out, d.out);  // seeded sampling is reproducible
}

// A flag that cannot apply to this run says so instead of being dropped in silence: --cpu-experts on the CPU.
TEST_F(RunTool, CpuExpertsOnTheCpuSaysItHasNoEffect) {
  const Invocation a = magnetar("run -m " + model() + " --device cpu --cpu-experts --tokens 5,6,7,8 -n 4 --temp 0");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_NE(a.err.find("--cpu-experts: no effect, the model runs on the CPU"), std::string::npos) << a.err;
  const Invocation b = magnetar("run -m " + model() + " --device cpu --tokens 5,6,7,8 -n 4 --temp 0");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(b.err.find("--cpu-experts"), std::string::npos) << b.err;
}

TEST_F(RunTool, DumpLogitsPrefillEqualsDecode) {
  const std::string ids = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20";
  const Invocation p = magnetar("run -m " + model() + " --tokens " + ids + " --dump-logits " + file("p.npy"));
  ASSERT_EQ(p.status, 0) << p.err;
  const Invocation d = magnetar("run -m " + model() + " --tokens " + ids + " --dump-logits " + file("d.npy") + " --decode");
  ASSERT_EQ(d.status, 0) << d.err;
  int64_t pr, pc, dr, dc;
  const std::vector<float> prefill = read_npy(file("p.npy"), &pr, &pc);
  const std::vector<float> decode = read_npy(file("d.npy"), &dr, &dc);
  EXPECT_EQ(pr, 20);
  EXPECT_EQ(pc, 1024);  // the tiny preset's vocabulary
  ASSERT_EQ(prefill.size(), decode.size());
  double max_diff = 0;
  for (size_t i = 0; i < prefill.size(); ++i) {
    ASSERT_TRUE(std::isfinite(prefill[i]));
    max_diff = std::max(max_diff, double(std::fabs(prefill[i] - decode[i])));
  }
  EXPECT_LE(max_diff, 1e-4);
}

// With disk KV checkpoints, a second dump of the same prompt computes every position again (before, the prefix came
// back from the disk, and the dump read the logits of positions never computed: past the end of the rows).
TEST_F(RunTool, DumpLogitsWithDiskKvComputesEveryPosition) {
  const std::string ids = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20";
  const std::string args = "run -m " + model() + " --tokens " + ids + " --kv-disk-dir " + file("kv") + " --kv-block 8";
  const Invocation first = magnetar(args + " --dump-logits " + file("k1.npy"));
  ASSERT_EQ(first.status, 0) << first.err;
  ASSERT_TRUE(std::filesystem::exists(file("kv")));
  const Invocation second = magnetar(args + " --dump-logits " + file("k2.npy"));
  ASSERT_EQ(second.status, 0) << second.err;
  int64_t r1, c1, r2, c2;
  EXPECT_EQ(read_npy(file("k1.npy"), &r1, &c1), read_npy(file("k2.npy"), &r2, &c2));
  EXPECT_EQ(r2, 20);
}

// Generation fills the context and says so; --truncate leaves room for -n tokens (the last one sampled from the last
// position's logits); a context beyond the model's training length is warned about.
TEST_F(RunTool, AFullContextStopsWithAMessageAndTruncateLeavesRoom) {
  const Invocation full = magnetar("run -m " + model() + " --tokens 1,2,3,4,5,6 --ctx 8 -n 10");
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_NE(full.err.find("generated 3 tokens"), std::string::npos) << full.err;  // positions 6, 7 and the last logits
  EXPECT_NE(full.err.find("the context of 8 tokens is full"), std::string::npos) << full.err;
  const Invocation fits = magnetar("run -m " + model() + " --tokens 1,2,3,4,5,6 --ctx 8 -n 3");
  ASSERT_EQ(fits.status, 0) << fits.err;
  EXPECT_NE(fits.err.find("generated 3 tokens"), std::string::npos) << fits.err;
  EXPECT_EQ(fits.err.find("is full"), std::string::npos) << fits.err;
  const Invocation beyond = magnetar("run -m " + model() + " --tokens 1,2 --ctx 8192 -n 1");  // the preset's 4,096
  ASSERT_EQ(beyond.status, 0) << beyond.err;
  EXPECT_NE(beyond.err.find("warning: --ctx 8192 is beyond the model's training context of 4096 tokens"),
            std::string::npos)
      << beyond.err;
  EXPECT_EQ(fits.err.find("training context"), std::string::npos) << fits.err;
  const Invocation cut = magnetar("run -m " + model() + " --tokens 1,2,3,4,5,6,7,8,9,10 --ctx 8 --truncate -n 3");
  ASSERT_EQ(cut.status, 0) << cut.err;
  EXPECT_NE(cut.err.find("prompt 6 tokens"), std::string::npos) << cut.err;
  EXPECT_NE(cut.err.find("generated 3 tokens"), std::string::npos) << cut.err;
}

TEST_F(RunTool, BadInputIsOneLineAndExit2) {
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"run -m " + model() + " --tokens 1,2,3 --ctx 2", "more than the context of 2"},
      {"run -m " + model() + " --tokens 1,x", "'x' is not a token id"},
      {"run -m " + model() + " --tokens 1,5000", "outside the vocabulary"},
      {"run -m " + model() + " -p hello", "has no tokenizer"},
      {"run -m " + model(), "exactly one of -p, -f, --tokens"},
      {"run -m " + file("missing.gguf") + " --tokens 1", "missing.gguf: cannot open"},
      {"run -m " + model() + " --tokens 1 --kv-type q4", "--kv-type must be f16, f32, q8_0 or fp8"},
      {"run -m " + model() + " --tokens 1 --temp nan", "'nan' is not a finite number"},
      {"run -m " + model() + " --tokens 1 --cache-gb inf", "'inf' is not a finite number"},
      {"run -m " + model() + " --tokens 1 -t 100000", "-t 100000: at most 1024 threads"},
      {"run -m " + model() + " --tokens 1 -t 4294967297", "-t 4294967297: at most 1024 threads"},  // was 1 thread
      {"run -m " + model() + " --tokens 1 --cache-policy bogus", "--cache-policy must be one of lfu, lru, got 'bogus'"},
      {"run -m " + model() + " --tokens 1 --gpu-cache-policy x", "--gpu-cache-policy must be one of lfu, lru, got 'x'"},
      {"run -m " + model() + " --tokens 1 --read-gap-kib -7", "--read-gap-kib must be -1 (measured), 0 or a size"},
      {"bench -m " + model() + " --reps 100000000000", "--reps in [1, 1000]"},  // allocated its tokens: bad_alloc
      {"bench -m " + model() + " --json --csv", "--json and --csv exclude each other"},
      {"bench -m " + model() + " --reps 1000 --step 16000000", "more than 134,217,728"},
      {"bench -m " + model() + " --sessions 2 --gen 0", "--sessions measures decoding: it needs --gen >= 1"},
      {"bench -m " + model() + " --drafts 2 --gen 0", "--drafts measures decoding: it needs --gen >= 1"},
      {"bench -m " + model() + " --drafts 65", "--drafts in [0, 64]"},
      {"run -m " + model() + " --tokens 1 --lookup 65", "--lookup must be in [0, 64]"},
      {"run -m " + model() + " --tokens 1 --lookup -1", "--lookup must be in [0, 64]"},
      {"bench -m " + model() + " --step 4611686018427387904 --gen 4611686018427387904", "each at most 16,777,216"},
      {"run -m " + model() + " --tokens 1 --ctx 100000000", "--ctx 100000000: at most 16777216 tokens"},
      {"run -m " + model() + " --tokens 1 --top-p 1.5", "--top-p must be in [0, 1]"},
      {"run -m " + model() + " --tokens 1 --top-k 4294967297", "--top-k must be in [0, 2147483647]"},
      {"run -m " + model() + " --tokens 1 --repeat-penalty 0", "--repeat-penalty must be > 0"},
      {"run -m " + model() + " --tokens 1 --ctx 64 --kv-disk-dir " + file("kv-bad") + " --kv-block 128",
       "--kv-block 128 is longer than the context of 64 tokens"},
      {"inspect " + model() + " --full", "--full applies to --kv"},
      {"synth --check " + model() + " --type q8_0", "--check reads MODEL.gguf: --preset, --type, -o"},
      {"synth --preset tiny -o " + file("never.gguf") + " --check-tokens 5", "--check-tokens applies to --check"},
  };
  for (const Case& c : cases) {
    const Invocation r = magnetar(c.args);
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
  }
  const Invocation t = magnetar("run -m " + model() + " --tokens 1,2,3 --ctx 2 --truncate -n 0");
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_FALSE(std::filesystem::exists(file("never.gguf")));
}

// Flags the engine adjusts say so: a --batch beyond the context becomes the context, a --sweep of fewer than two
// chunks turns sweeps off.
TEST_F(RunTool, AdjustedBatchAndSweepAreWarnedAbout) {
  const Invocation r = magnetar("run -m " + model() + " --tokens 1,2,3 -n 1 --ctx 64 --batch 100 --stream --sweep 100");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --batch 100: chunks of 64 tokens (the most the context"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("warning: --sweep 100 holds fewer than two --batch chunks of 64 tokens: prefill sweeps are off"),
            std::string::npos)
      << r.err;
  const Invocation quiet = magnetar("run -m " + model() + " --tokens 1,2,3 -n 1 --ctx 64 --batch 16 --sweep 32");
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("warning"), std::string::npos) << quiet.err;
}

TEST_F(RunTool, UnknownArchitectureIsNamed) {
  // Same file with general.architecture rewritten.
  std::vector<uint8_t> bytes = testing::read_all(model());
  const std::string from = "qwen3moe", to = "llama4xx";  // same length keeps the file valid
  auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
  ASSERT_NE(it, bytes.end());
  std::copy(to.begin(), to.end(), it);
  testing::write_all(file("other.gguf"), bytes);
  const Invocation r = magnetar("run -m " + file("other.gguf") + " --tokens 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("architecture 'llama4xx' is not supported (supported: qwen3, qwen3moe)"), std::string::npos)
      << r.err;
}

// Each row also says what a decoded token reads and the rate that makes: counted here from the file's tensors and
// metadata (every tensor but the routed experts' in full; of the token embedding one row when the output head is a
// tensor of its own; n_expert_used of n_expert experts; K and V in F16 of every row attended, the mean over the row's
// decoded tokens at positions depth + 16 .. depth + 19), and decode_gbps is that times decode t/s.
TEST_F(RunTool, BenchReportsEveryDepth) {
  const Invocation r =
      magnetar("bench -m " + model() + " --ctx-start 0 --ctx-max 32 --step 16 --gen 4 --reps 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  Result<std::unique_ptr<gguf::Model>> file = gguf::Model::open(model());
  ASSERT_TRUE(file.ok()) << file.status().message();
  const gguf::Model& m = *file.value();
  auto integer = [&](const std::string& key) {
    const gguf::Value* v = m.find("qwen3moe." + key);
    return v != nullptr && v->as_int() ? *v->as_int() : int64_t(-1);
  };
  const int64_t n_expert = integer("expert_count"), used = integer("expert_used_count");
  const int64_t head_dim = integer("attention.key_length") > 0
                               ? integer("attention.key_length")
                               : integer("embedding_length") / integer("attention.head_count");
  ASSERT_GT(n_expert, 0);
  ASSERT_GT(used, 0);
  ASSERT_GT(head_dim, 0);
  const bool own_head = m.find_tensor("output.weight") != nullptr;
  double weights = 0;
  for (const gguf::TensorInfo& t : m.tensors()) {
    if (t.name.find("_exps.") != std::string::npos) {
      weights += double(t.nbytes) * double(used) / double(n_expert);
    } else if (t.name == "token_embd.weight" && own_head) {
      weights += double(t.nbytes) / double(t.ne[1]);
    } else {
      weights += double(t.nbytes);
    }
  }
  const double kv_row = double(integer("block_count") * 2 * integer("attention.head_count_kv") * head_dim * 2);
  ASSERT_GT(kv_row, 0.0);
  std::vector<int64_t> depths;
  size_t pos = 0;
  while (pos < r.out.size()) {
    const size_t end = r.out.find('\n', pos);
    const nlohmann::json row = nlohmann::json::parse(r.out.substr(pos, end - pos));
    depths.push_back(row["depth"]);
    EXPECT_GT(row["prefill_tps"].get<double>(), 0.0);
    EXPECT_GT(row["decode_tps"].get<double>(), 0.0);
    EXPECT_EQ(row["decode_tokens"], 4);
    const double bytes = weights + kv_row * (double(depths.back()) + 16 + 2.5);
    EXPECT_NEAR(row["decode_bytes_per_token"].get<double>(), bytes, 1.0) << "depth " << depths.back();
    EXPECT_NEAR(row["decode_gbps"].get<double>(), bytes * row["decode_tps"].get<double>() / 1e9, 1e-6);
    EXPECT_FALSE(row.contains("decode_peak_fraction"));  // the CPU: no peak known
    pos = end + 1;
  }
  EXPECT_EQ(depths, (std::vector<int64_t>{0, 16, 32}));
}

// --ttft: a 100-token history + a 64-token turn, blocks of 16: the cold run saves blocks 0..9, the hit's new turn
// differs from token 100 on, so it restores the 6 blocks (96 tokens) that hold only history.
TEST_F(RunTool, BenchTimeToFirstTokenRestoresTheHistory) {
  const Invocation r = magnetar("bench -m " + model() + " --ttft 100 --kv-disk-dir " + file("kv") +
                                " --kv-block 16 --reps 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json row = nlohmann::json::parse(r.out);
  EXPECT_EQ(row["history_tokens"], 100);
  EXPECT_EQ(row["restored_tokens"], 96);
  EXPECT_GT(row["ttft_cold_s"].get<double>(), 0.0);
  EXPECT_GT(row["ttft_hit_s"].get<double>(), 0.0);
  EXPECT_GT(row["kv_bytes_per_token"].get<double>(), 0.0);
  const Invocation missing = magnetar("bench -m " + model() + " --ttft 100");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("--ttft needs --kv-disk-dir"), std::string::npos) << missing.err;
  // Flags that do not apply are refused, not ignored; the table refuses disk KV (its repetitions would be restores).
  const Invocation no_reps = magnetar("bench -m " + model() + " --ttft 100 --kv-disk-dir " + file("kv") + " --reps 0");
  EXPECT_EQ(no_reps.status, 2);
  EXPECT_NE(no_reps.err.find("--reps in [1, 1000]"), std::string::npos) << no_reps.err;
  const Invocation table = magnetar("bench -m " + model() + " --kv-disk-dir " + file("kv"));
  EXPECT_EQ(table.status, 2);
  EXPECT_NE(table.err.find("--kv-disk-dir is for --ttft"), std::string::npos) << table.err;
}

}  // namespace run_test
}  // namespace magnetar

// perplexity and chat need a tokenizer: a tiny synthetic model carrying the toy tokenizer.
namespace magnetar {
namespace run_test {

class TextTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    std::filesystem::create_directories(dir_->file("hf"));
    testing::write_toy_hf(dir_->file("hf"));
    const Invocation s = magnetar("synth --preset tiny --type q8_0 --tokenizer " + dir_->file("hf") + " -o " + model());
    ASSERT_EQ(s.status, 0) << s.err;
    std::string text;
    for (int i = 0; i < 40; ++i) text += "hello world, the quick brown fox " + std::to_string(i) + " jumps.\n";
    testing::write_file(dir_->file("text.txt"), text);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return dir_->file("tiny-tok.gguf"); }
  static std::string file(const std::string& name) { return dir_->file(name); }
  // The log-softmax rows, in double precision, of MODEL.gguf (under the suite's directory) over the text's first 64
  // tokens, from `run --dump-logits`: what perplexity's first window of --ctx 64 scores, computed independently.
  static std::vector<std::vector<double>> first_window_log_probs(const std::string& model_name) {
    const Invocation tok =
        magnetar("tokenize -m " + file(model_name + ".gguf") + " --no-special --file " + file("text.txt"));
    EXPECT_EQ(tok.status, 0) << tok.err;
    const std::vector<int32_t> ids = nlohmann::json::parse(tok.out).get<std::vector<int32_t>>();
    EXPECT_GE(ids.size(), 64u);
    if (ids.size() < 64) return {};
    std::string window;
    for (size_t i = 0; i < 64; ++i) window += (i ? "," : "") + std::to_string(ids[i]);
    const Invocation d = magnetar("run -m " + file(model_name + ".gguf") + " --ctx 64 --tokens " + window +
                                  " --dump-logits " + file(model_name + ".npy"));
    EXPECT_EQ(d.status, 0) << d.err;
    int64_t rows, cols;
    const std::vector<float> logits = read_npy(file(model_name + ".npy"), &rows, &cols);
    EXPECT_EQ(rows, 64);
    std::vector<std::vector<double>> out;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> row(logits.begin() + r * cols, logits.begin() + (r + 1) * cols);
      const double mx = *std::max_element(row.begin(), row.end());
      double z = 0;
      for (double x : row) z += std::exp(x - mx);
      for (double& x : row) x = x - mx - std::log(z);
      out.push_back(std::move(row));
    }
    return out;
  }
  static testing::TempDir* dir_;
};
testing::TempDir* TextTools::dir_ = nullptr;

// "tokens scored: N" and "PPL = X +/- Y" from perplexity's stdout.
void parse_ppl(const std::string& out, long long* scored, double* ppl, double* err) {
  ASSERT_EQ(std::sscanf(out.c_str() + out.find("tokens scored: "), "tokens scored: %lld", scored), 1) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + out.find("PPL = "), "PPL = %lf +/- %lf", ppl, err), 2) << out;
}

TEST_F(TextTools, PerplexityScoresWhatEachModeSays) {
  const Invocation w = magnetar("perplexity -m " + model() + " -f " + file("text.txt") + " --ctx 64");
  ASSERT_EQ(w.status, 0) << w.err;
  const Invocation c = magnetar("perplexity -m " + model() + " -f " + file("text.txt") + " --ctx 64 --mode continuous");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(w.out.find("mode: windowed"), std::string::npos);
  EXPECT_NE(c.out.find("mode: continuous"), std::string::npos);
  long long ws, cs;
  double wp, we, cp, ce;
  parse_ppl(w.out, &ws, &wp, &we);
  parse_ppl(c.out, &cs, &cp, &ce);
  const long long windows = cs / 63;  // continuous: every token after the first of each 64-token window
  EXPECT_EQ(cs % 63, 0);
  EXPECT_GT(windows, 0);
  EXPECT_EQ(ws, windows * 31);  // windowed: positions 32..62 of each window predict 33..63
  // A random model is close to uniform over its 1024-token vocabulary.
  EXPECT_GT(wp, 1.0);
  EXPECT_LT(wp, 1e5);
  EXPECT_GT(we, 0.0);
  const Invocation bad = magnetar("perplexity -m " + model() + " -f " + file("text.txt") + " --mode sliding");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--mode must be windowed or continuous"), std::string::npos);
  const Invocation tiny = magnetar("perplexity -m " + model() + " -f " + file("text.txt") + " --ctx 2");
  EXPECT_EQ(tiny.status, 2) << tiny.out;
  EXPECT_NE(tiny.err.find("--ctx 2 scores no token in windowed mode (needs at least 3)"), std::string::npos)
      << tiny.err;
}

// synth --tokenizer takes the tokenizer's vocabulary when it is larger than the preset's (the tiny preset's 1,024
// rows; the toy tokenizer with a token added at id 2,000): the embedding has 2,001 rows, the token is found.
TEST_F(TextTools, SynthTakesALargerTokenizersVocabulary) {
  std::filesystem::create_directories(file("hf-big"));
  testing::write_toy_hf(file("hf-big"));
  const std::vector<uint8_t> bytes = testing::read_all(file("hf-big") + "/tokenizer.json");
  nlohmann::json tj = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
  tj["added_tokens"].push_back({{"id", 2000}, {"content", "<|big|>"}, {"special", true}, {"normalized", false}});
  testing::write_file(file("hf-big") + "/tokenizer.json", tj.dump());
  const Invocation s =
      magnetar("synth --preset tiny --type f32 --tokenizer " + file("hf-big") + " -o " + file("big-vocab.gguf"));
  ASSERT_EQ(s.status, 0) << s.err;
  const Invocation i = magnetar("inspect --tensors " + file("big-vocab.gguf"));
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_NE(i.out.find("[256, 2001]"), std::string::npos) << i.out;
  const Invocation t = magnetar("tokenize -m " + file("big-vocab.gguf") + " --text '<|big|>'");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("2000"), std::string::npos) << t.out;
}

// "KEY VALUE" (and "KEY VALUE +/- ERR") lines of perplexity's stdout.
double value_of(const std::string& out, const std::string& key) {
  const size_t at = out.find("\n" + key + " ");
  EXPECT_NE(at, std::string::npos) << key << " in " << out;
  return at == std::string::npos ? NAN : std::strtod(out.c_str() + at + key.size() + 2, nullptr);
}

// A model whose tokenizer adds BOS sees it first in every window, as llama-perplexity does (windows after the first
// began with the text's token there): the PPL of two windows equals the one computed here from `run --dump-logits` of
// each window with its first token replaced by BOS, and differs from the one without the replacement.
TEST_F(TextTools, PerplexityStartsEveryWindowWithBos) {
  std::filesystem::create_directories(file("hf_bos"));
  testing::write_toy_hf(file("hf_bos"));
  std::ifstream config_in(file("hf_bos/tokenizer_config.json"));
  nlohmann::json config = nlohmann::json::parse(config_in);
  config["add_bos_token"] = true;
  config["bos_token"] = "<|pad|>";
  testing::write_file(file("hf_bos/tokenizer_config.json"), config.dump());
  ASSERT_EQ(
      magnetar("synth --preset tiny --type q8_0 --tokenizer " + file("hf_bos") + " -o " + file("bos.gguf")).status, 0);
  const Invocation p =
      magnetar("perplexity -m " + file("bos.gguf") + " -f " + file("text.txt") + " --ctx 64 --max-windows 2 --json");
  ASSERT_EQ(p.status, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(p.out);
  ASSERT_EQ(j["tokens_scored"], 62);
  const Invocation tok = magnetar("tokenize -m " + file("bos.gguf") + " --no-special --file " + file("text.txt"));
  ASSERT_EQ(tok.status, 0) << tok.err;
  const std::vector<int32_t> ids = nlohmann::json::parse(tok.out).get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), 128u);
  ASSERT_EQ(ids[0], 266);  // the BOS the tokenizer added
  // The summed NLL of positions 32..62 of window w, its first token replaced by BOS or not.
  auto window_nll = [&](int w, bool bos) {
    std::vector<int32_t> win(ids.begin() + 64 * w, ids.begin() + 64 * (w + 1));
    if (bos) win[0] = 266;
    std::string list;
    for (size_t i = 0; i < win.size(); ++i) list += (i ? "," : "") + std::to_string(win[i]);
    const std::string npy = file("w" + std::to_string(w) + (bos ? "b" : "") + ".npy");
    EXPECT_EQ(magnetar("run -m " + file("bos.gguf") + " --ctx 64 --tokens " + list + " --dump-logits " + npy).status,
              0);
    int64_t rows = 0, cols = 0;
    const std::vector<float> logits = read_npy(npy, &rows, &cols);
    double nll = 0;
    for (int64_t r = 32; r < 63; ++r) {
      const float* row = logits.data() + r * cols;
      const double mx = *std::max_element(row, row + cols);
      double z = 0;
      for (int64_t v = 0; v < cols; ++v) z += std::exp(double(row[v]) - mx);
      nll -= double(row[win[size_t(r + 1)]]) - mx - std::log(z);
    }
    return nll;
  };
  const double with_bos = std::exp((window_nll(0, true) + window_nll(1, true)) / 62);
  const double without = std::exp((window_nll(0, true) + window_nll(1, false)) / 62);
  ASSERT_GT(std::abs(with_bos - without), 1e-4 * with_bos) << "the first token does not change the scores";
  EXPECT_NEAR(j["ppl"].get<double>(), with_bos, 1e-4 * with_bos);
}

TEST_F(TextTools, KlDivergenceAgainstABaseFile) {
  // An F32 base model with the toy tokenizer, and a Q4_K copy of it.
  const std::string synth = "synth --preset tiny --type f32 --seed 7 --tokenizer " + file("hf");
  ASSERT_EQ(magnetar(synth + " -o " + file("base.gguf")).status, 0);
  ASSERT_EQ(magnetar("quantize " + file("base.gguf") + " -o " + file("q4k.gguf") + " --type q4_k").status, 0);
  const std::string common = " -f " + file("text.txt") + " --ctx 64";
  const Invocation b = magnetar("perplexity -m " + file("base.gguf") + common + " --kl-base " + file("base.kl"));
  ASSERT_EQ(b.status, 0) << b.err;
  long long scored;
  double ppl, err;
  parse_ppl(b.out, &scored, &ppl, &err);
  const uintmax_t bytes = std::filesystem::file_size(file("base.kl"));
  EXPECT_EQ(uintmax_t(value_of(b.out, "kl_base_bytes")), bytes);
  // one record per scored position holds at least the 1024 16-bit log-probabilities
  EXPECT_GE(bytes, uintmax_t(scored) * 1024 * 2);
  EXPECT_FALSE(std::filesystem::exists(file("base.kl.tmp")));

  // The same model against its own file: nothing differs.
  const Invocation same = magnetar("perplexity -m " + file("base.gguf") + common + " --kl " + file("base.kl"));
  ASSERT_EQ(same.status, 0) << same.err;
  long long same_scored;
  double same_ppl, same_err;
  parse_ppl(same.out, &same_scored, &same_ppl, &same_err);
  EXPECT_EQ(same_scored, scored);
  EXPECT_NEAR(value_of(same.out, "kl_mean"), 0.0, 1e-6) << same.out;
  EXPECT_NEAR(value_of(same.out, "kl_max"), 0.0, 1e-6) << same.out;
  EXPECT_EQ(value_of(same.out, "top1_agreement"), 100.0) << same.out;
  EXPECT_NEAR(value_of(same.out, "ppl_base"), ppl, 1e-4 * ppl) << same.out;
  EXPECT_NEAR(same_ppl, ppl, 1e-4 * ppl);

  // The Q4_K copy: its distributions differ, the base PPL in the file is still the base model's.
  const Invocation q = magnetar("perplexity -m " + file("q4k.gguf") + common + " --kl " + file("base.kl") + " --json");
  ASSERT_EQ(q.status, 0) << q.err;
  const nlohmann::json j = nlohmann::json::parse(q.out);
  EXPECT_GT(j["kl_mean"].get<double>(), 1e-5);
  EXPECT_GE(j["kl_max"].get<double>(), j["kl_p99"].get<double>());
  EXPECT_GE(j["kl_p99"].get<double>(), j["kl_median"].get<double>());
  EXPECT_GT(j["kl_median"].get<double>(), 0.0);
  EXPECT_LT(j["top1_agreement"].get<double>(), 100.0);
  EXPECT_GT(j["top1_agreement"].get<double>(), 0.0);
  EXPECT_NEAR(j["ppl_base"].get<double>(), ppl, 1e-4 * ppl);
  EXPECT_NE(j["ppl"].get<double>(), ppl);
  EXPECT_EQ(j["tokens_scored"], scored);

  // An independent computation for the first window: both models' logits from `run --dump-logits`, KL and
  // top-1 of the scored positions 32..62 computed here in double precision.
  const std::vector<std::vector<double>> pb = first_window_log_probs("base"), pq = first_window_log_probs("q4k");
  ASSERT_EQ(pb.size(), 64u);
  ASSERT_EQ(pq.size(), 64u);
  double kl_sum = 0;
  int same_top = 0;
  for (size_t r = 32; r < 63; ++r) {
    const std::vector<double>&p = pb[r], &q = pq[r];
    for (size_t v = 0; v < p.size(); ++v) kl_sum += std::exp(p[v]) * (p[v] - q[v]);
    same_top += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(q.begin(), q.end()) - q.begin();
  }
  const Invocation one =
      magnetar("perplexity -m " + file("q4k.gguf") + common + " --kl " + file("base.kl") + " --max-windows 1 --json");
  ASSERT_EQ(one.status, 0) << one.err;
  const nlohmann::json j1 = nlohmann::json::parse(one.out);
  EXPECT_EQ(j1["tokens_scored"], 31);
  EXPECT_NEAR(j1["kl_mean"].get<double>(), kl_sum / 31, 1e-3 * kl_sum / 31 + 1e-6);
  EXPECT_NEAR(j1["top1_agreement"].get<double>(), 100.0 * same_top / 31, 100.0 / 31 + 1e-9);

  // A base file made for another --ctx, another mode or another text is refused in one line.
  struct Case {
    std::string args, needle;
  };
  testing::write_file(file("other.txt"), "a different text entirely, " + std::string(2000, 'x'));
  const std::vector<Case> cases = {
      {" -f " + file("text.txt") + " --ctx 32", "made with --ctx 64, this run uses --ctx 32"},
      {common + " --mode continuous", "made with --mode windowed, this run uses --mode continuous"},
      {" -f " + file("other.txt") + " --ctx 64", "different text or tokenizer"},
  };
  for (const Case& c : cases) {
    const Invocation r = magnetar("perplexity -m " + file("q4k.gguf") + c.args + " --kl " + file("base.kl"));
    EXPECT_EQ(r.status, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << ": " << r.err;
  }
  // --kl-base replaces only a KL base file: naming the model (or the text) destroyed it.
  const uintmax_t model_bytes = std::filesystem::file_size(file("q4k.gguf"));
  const Invocation over = magnetar("perplexity -m " + file("q4k.gguf") + common + " --kl-base " + file("q4k.gguf"));
  EXPECT_EQ(over.status, 2);
  EXPECT_NE(over.err.find("exists and is not a KL base file: not replaced"), std::string::npos) << over.err;
  EXPECT_EQ(std::filesystem::file_size(file("q4k.gguf")), model_bytes);
  EXPECT_EQ(magnetar("inspect " + file("q4k.gguf")).status, 0);
  const Invocation again = magnetar("perplexity -m " + file("base.gguf") + common + " --kl-base " + file("base.kl"));
  EXPECT_EQ(again.status, 0) << again.err;  // an existing base file is replaced
  const Invocation negative = magnetar("perplexity -m " + file("q4k.gguf") + common + " --max-windows -3");
  EXPECT_EQ(negative.status, 2);
  EXPECT_NE(negative.err.find("--max-windows must be >= 0"), std::string::npos) << negative.err;
  testing::write_file(file("junk.kl"), "not a kl file at all, not at all, not at all, not at all");
  const Invocation junk = magnetar("perplexity -m " + file("q4k.gguf") + common + " --kl " + file("junk.kl"));
  EXPECT_EQ(junk.status, 2);
  EXPECT_NE(junk.err.find("junk.kl: not a KL base file"), std::string::npos) << junk.err;
}

// The KL's excluded outcome: a base made peaked (its output norm's weights x8, so its logits spread 8 times wider and
// most tokens' log-probs fall below the -16 cutoff the base file keeps) against the model it was made from, which puts
// much of its mass on those tokens. The reference is the full KL over every token, in double precision from both
// models' dumped logits; the sum over the kept tokens alone (with their -p + q terms) would lose that mass, Q_o, from
// every position's KL.
TEST_F(TextTools, KlCountsTheMassOnTokensTheBaseRulesOut) {
  ASSERT_EQ(
      magnetar("synth --preset tiny --type f32 --seed 7 --tokenizer " + file("hf") + " -o " + file("m.gguf")).status,
      0);
  std::vector<uint8_t> bytes = testing::read_all(file("m.gguf"));
  Result<gguf::Header> header = gguf::parse_header(bytes, bytes.size(), "m.gguf");
  ASSERT_TRUE(header.ok()) << header.status().message();
  bool scaled = false;
  for (const gguf::TensorInfo& t : header->tensors) {
    if (t.name != "output_norm.weight") continue;
    ASSERT_EQ(t.type_id, 0u);  // F32
    float* w = reinterpret_cast<float*>(bytes.data() + header->data_offset + t.offset);
    for (int64_t i = 0; i < t.n_elements(); ++i) w[i] *= 8.0f;
    scaled = true;
  }
  ASSERT_TRUE(scaled);
  testing::write_all(file("peaked.gguf"), bytes);
  const std::string common = " -f " + file("text.txt") + " --ctx 64 --max-windows 1";
  const Invocation b = magnetar("perplexity -m " + file("peaked.gguf") + common + " --kl-base " + file("peaked.kl"));
  ASSERT_EQ(b.status, 0) << b.err;
  const Invocation k = magnetar("perplexity -m " + file("m.gguf") + common + " --kl " + file("peaked.kl") + " --json");
  ASSERT_EQ(k.status, 0) << k.err;
  const nlohmann::json j = nlohmann::json::parse(k.out);
  ASSERT_EQ(j["tokens_scored"], 31);

  const std::vector<std::vector<double>> pp = first_window_log_probs("peaked"), pm = first_window_log_probs("m");
  ASSERT_EQ(pp.size(), 64u);
  ASSERT_EQ(pm.size(), 64u);
  double kl_sum = 0, q_out = 0;
  for (size_t r = 32; r < 63; ++r) {
    const std::vector<double>&p = pp[r], &q = pm[r];
    for (size_t v = 0; v < p.size(); ++v) {
      kl_sum += std::exp(p[v]) * (p[v] - q[v]);
      if (p[v] < -16.5) q_out += std::exp(q[v]);
    }
  }
  // The case this test is for: the model puts a tenth or more of its mass where the base's file keeps nothing.
  ASSERT_GT(q_out / 31, 0.1);
  EXPECT_NEAR(j["kl_mean"].get<double>(), kl_sum / 31, 0.01 + 1e-3 * kl_sum / 31) << "mass excluded " << q_out / 31;
}

TEST_F(TextTools, ChatAnswersEachTurnAndResets) {
  const std::string script = file("script.txt");
  testing::write_file(script, "hello\nworld \\\ncontinued\n/reset\nhello again\n");
  const Invocation r = magnetar("chat -m " + model() + " -n 6 --seed 3 < " + script);
  ASSERT_EQ(r.status, 0) << r.err;
  // three answers, each ended by a newline (generation stops at 6 tokens or <|im_end|>)
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 3) << r.out;
  EXPECT_NE(r.err.find("(conversation reset)"), std::string::npos) << r.err;
}

TEST_F(TextTools, RunTokenizesTextAndStopsOnStopStrings) {
  const Invocation r = magnetar("run -m " + model() + " -p 'hello world' -n 8 --temp 0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("prompt 2 tokens"), std::string::npos) << r.err;  // "hello" + " world" in the toy merges
  // Greedy output is deterministic: cutting it with a stop string taken from its middle must end it there.
  const std::string full = r.out.substr(0, r.out.size() - 1);  // without the final newline
  ASSERT_GE(full.size(), 6u) << full;
  const std::string stop = full.substr(3, 3);
  testing::write_file(file("stop.txt"), stop);
  const Invocation s = magnetar("run -m " + model() + " -p 'hello world' -n 8 --temp 0 --stop \"$(cat " +
                                file("stop.txt") + ")\"");
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(s.out, full.substr(0, full.find(stop)) + "\n");
}

}  // namespace run_test
}  // namespace magnetar
