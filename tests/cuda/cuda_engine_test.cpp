// The CUDA forward pass (models/qwen3_moe/qwen3_moe_cuda.cpp) against the CPU one, through the engine, on the tiny
// synthetic qwen3moe of tests/unit/tiny_qwen3.h (random weights; F32, Q8_0 and Q4_K on K-quant-sized rows):
//   - greedy decode of 64 tokens after an 8-token prompt: the same tokens as the CPU, or the first divergence is
//     at a CPU logit tie (top-1 - top-2 < 1e-3), reported; the Q4_K variant of hidden 2,048, whose activations are
//     quantized over rows 8 times longer through three layers, drifts further (2026-12-05, H100: first divergence
//     at token 52 with a CPU lead of 0.157; at token 7, lead 0.41, before its weights were scaled to its rows), so
//     both decode the CPU's tokens for all 64 steps and the GPU's top-1 must be the CPU's at >= 90% of the steps the
//     CPU decides (lead >= 1e-3), as for the quantized prefill below;
//   - prefill logits of every position (chunks of 32 tokens: quantized weights take the int8 tensor-core
//     products): for F32 weights top-1 equal wherever the CPU's lead is >= 1e-3 and max |dlogit| <= 1e-3; for
//     quantized weights top-1 equal at >= 90% of those positions. Quantized weights quantize the activations,
//     where a 1e-7 difference can move a value across a rounding boundary, and this random model amplifies
//     that through its layers (Q4_K: max |dlogit| 0.1 on the matrix-vector kernel, 0.34 on mmq, one flip of
//     77 with a CPU lead of 0.067); the trained demo model below is the finer check of the quantized prefill;
//   - the demo model (trained, Q8_0) over 512 tokens of English in one prefill: mean negative log-likelihood
//     within 0.01 nats of the CPU's and top-1 equal at >= 90% of the positions (measured 2026-11-30 over 9,690
//     tokens with `magnetar perplexity`: PPL 1249.30 CPU, 1249.81 GPU, 1250.17 GPU without mmq);
//   - speculative decoding's few-token steps (Session::step(id, drafts)): each row as the single steps', by the
//     prefill's rules;
//   - batched decode of several sessions (Engine::step) gives each session's logits bit-identical to the session
//     decoded alone (the GPU kernels take each vector's sums in the same order whatever the batch);
//   - the GPU expert tier: bit-identical to resident; with the CPU expert lane close to it (tests at the end);
//   - disk KV: a prefix saved from GPU rows (downloaded for the checkpoint) and restored into a new session (host
//     rows uploaded to the GPU) continues bit-identically with the same computation done without disk KV.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/engine.h"
#include "models/model.h"
#include "quant/quant.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/unit/text_score.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace {

struct Variant {
  quant::Type type;
  bool k_quant_rows;
  int64_t hidden = 0;  // write_tiny's hidden size (0: its default)
  int moe_layers = 1;  // write_tiny's MoE layers before its dense one
  quant::Type more = quant::Type::F32;  // write_tiny's `more` (Q6_K: a Q4_K_M-like mix)
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) {
  return std::string(quant::traits(info.param.type).name) + (info.param.k_quant_rows ? "_k256" : "") +
         (info.param.hidden > 0 ? "_e" + std::to_string(info.param.hidden) : "") +
         (info.param.moe_layers > 1 ? "_moe" + std::to_string(info.param.moe_layers) : "") +
         (info.param.more != quant::Type::F32 ? "_" + std::string(quant::traits(info.param.more).name) : "");
}

std::unique_ptr<Engine> load(const std::string& path, Device device, const KvDiskOptions& disk = {},
                             int64_t n_ctx = 128, int64_t n_batch = 32, KvType kv_type = KvType::kF16,
                             bool profile = false) {
  EngineOptions options;
  options.profile = profile;
  options.kv_type = kv_type;
  options.n_threads = 2;
  options.n_ctx = n_ctx;
  options.n_batch = n_batch;
  options.device = device;
  options.experts = ExpertMode::kResident;
  options.kv_disk = disk;
  auto engine = Engine::load(path, options);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  if (!engine.ok()) return nullptr;
  EXPECT_STREQ(engine.value()->device(), device == Device::kCuda ? "cuda" : "cpu");
  return std::move(engine).value();
}

std::vector<int32_t> prompt(size_t n, int salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7 + size_t(salt) * 13 + 3) % 61);
  return t;
}

int32_t argmax(std::span<const float> l) { return int32_t(std::max_element(l.begin(), l.end()) - l.begin()); }

// Top-1 minus top-2.
float lead(std::span<const float> l) {
  float a = -INFINITY, b = -INFINITY;
  for (const float v : l) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return a - b;
}

// Two computations' logit rows of the same positions (the reference first): the largest |dlogit|, and the top-1s where
// the reference decides (its lead >= 1e-3). check(): F32 weights (exact) hold max |dlogit| <= 1e-3, quantized ones
// agree at >= 90% of the decided rows (the header says why).
struct RowAgreement {
  double max_abs = 0;
  int decided = 0, agree = 0;
  // Whether the reference decides the row and the top-1s differ.
  bool add(std::span<const float> want, std::span<const float> got) {
    for (size_t j = 0; j < want.size(); ++j) max_abs = std::max(max_abs, double(std::fabs(want[j] - got[j])));
    if (lead(want) < 1e-3f) return false;
    ++decided;
    agree += argmax(want) == argmax(got);
    return argmax(want) != argmax(got);
  }
  void check(const std::string& what, bool exact) const {
    std::printf("[cuda] %s max |dlogit| %.3e, top-1 equal at %d of %d decided rows\n", what.c_str(), max_abs, agree,
                decided);
    ASSERT_GT(decided, 0);
    if (exact) {
      EXPECT_LE(max_abs, 1e-3);
    } else {
      EXPECT_GE(double(agree), 0.9 * decided);
    }
  }
};

class CudaEngine : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();  // before writing the model: ~2 s a test at hidden 2,048 on the CPU box, for a skip
    path_ = ::testing::TempDir() + "cuda_engine_" + std::to_string(getpid()) + "_" + variant_name({GetParam(), 0}) + ".gguf";
    testing::write_tiny(path_, GetParam().type, 11, GetParam().k_quant_rows, GetParam().hidden, GetParam().moe_layers,
                        256, GetParam().more);
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  std::string path_;
};

// Greedy decode with F16 KV and with quantized KV (the GPU's qkv_prepare storing Q8_0 blocks or FP8 bytes, its decode
// kernel reading them) against the CPU with the same KV type. strict: the first divergence must be at a CPU tie;
// otherwise the GPU's top-1 must be the CPU's at >= 90% of the decided steps, both decoding the CPU's tokens (the
// header says why).
void expect_greedy_decode_matches_cpu(const std::string& path, KvType kv_type, const std::string& name,
                                      bool strict = true) {
  auto cpu = load(path, Device::kCpu, {}, 128, 32, kv_type), gpu = load(path, Device::kCuda, {}, 128, 32, kv_type);
  ASSERT_TRUE(cpu && gpu);
  auto sc = cpu->new_session(), sg = gpu->new_session();
  ASSERT_TRUE(sc.ok() && sg.ok());
  std::vector<int32_t> tokens = prompt(8, 1);
  ASSERT_OK(sc.value()->sync(tokens));
  ASSERT_OK(sg.value()->sync(tokens));
  int decided = 0, agree = 0;
  bool diverged = false;
  double max_abs = 0;
  for (int i = 0; i < 64; ++i) {
    const std::span<const float> a = sc.value()->logits(), b = sg.value()->logits();
    const int32_t want = argmax(a), got = argmax(b);
    for (size_t j = 0; j < a.size(); ++j) max_abs = std::max(max_abs, double(std::fabs(a[j] - b[j])));
    const float l = lead(a);
    decided += l >= 1e-3f;
    agree += l >= 1e-3f && want == got;
    if (want != got && !diverged) {
      diverged = true;
      std::printf("[cuda] %s: first divergence at generated token %d, CPU lead %.3e\n", name.c_str(), i, double(l));
      if (strict) {
        EXPECT_LT(l, 1e-3f) << "token " << i << ": GPU picked " << got << ", CPU " << want;
        return;
      }
    }
    ASSERT_OK(sc.value()->step(want));
    ASSERT_OK(sg.value()->step(want));
  }
  if (!strict) {
    std::printf("[cuda] %s: decode top-1 equal at %d of %d decided steps, max |dlogit| %.3e\n", name.c_str(), agree,
                decided, max_abs);
    ASSERT_GT(decided, 0);
    EXPECT_GE(double(agree), 0.9 * decided);
  }
}

TEST_P(CudaEngine, GreedyDecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  expect_greedy_decode_matches_cpu(path_, KvType::kF16, variant_name({GetParam(), 0}), GetParam().hidden == 0);
}

// A decode graph the driver refuses turns graphs off for a while (1,024 steps) and the step runs kernel by kernel,
// starting with the refused step itself (whose capture recorded the whole forward pass without running it). Simulated
// with MAGNETAR_CUDA_GRAPH=refuse: the model says so once on stderr, and the logits of every step equal the graph
// replays' bit for bit (same kernels, same arguments; a host-side effect of the discarded capture, applied twice,
// would show here).
TEST_P(CudaEngine, RefusedGraphFallsBackBitForBit) {
  SKIP_WITHOUT_GPU();
  auto decode = [&](std::vector<std::vector<float>>* logits) {
    auto gpu = load(path_, Device::kCuda);
    ASSERT_TRUE(gpu);
    auto s = gpu->new_session();
    ASSERT_TRUE(s.ok());
    ASSERT_OK(s.value()->sync(prompt(8, 2)));
    for (int i = 0; i < 12; ++i) {
      logits->emplace_back(s.value()->logits().begin(), s.value()->logits().end());
      ASSERT_OK(s.value()->step(argmax(s.value()->logits())));
    }
  };
  std::vector<std::vector<float>> graphed, refused;
  ::testing::internal::CaptureStderr();
  decode(&graphed);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("capture"), std::string::npos);
  ASSERT_EQ(setenv("MAGNETAR_CUDA_GRAPH", "refuse", 1), 0);  // read at each capture
  ::testing::internal::CaptureStderr();
  decode(&refused);
  const std::string said = ::testing::internal::GetCapturedStderr();
  unsetenv("MAGNETAR_CUDA_GRAPH");
  EXPECT_NE(said.find("graph capture of the decode step failed"), std::string::npos) << said;
  ASSERT_EQ(graphed.size(), 12u);
  ASSERT_EQ(refused.size(), graphed.size());
  for (size_t i = 0; i < graphed.size(); ++i) EXPECT_EQ(refused[i], graphed[i]) << "step " << i;
}

// `bench --profile` on the GPU: a forward pass's wall time split into the host's embedding rows, the device's span and
// the rest of the call. The CPU's per-op entries stay empty (the CUDA model queues whole passes), the device's share of
// a prefill and of each graphed decode step is positive, the three together fit inside the wall time the test measures
// around the calls, and profiling changes no logit (the events only bracket the same work).
TEST_P(CudaEngine, ProfileSplitsDeviceAndHost) {
  SKIP_WITHOUT_GPU();
  auto profiled = load(path_, Device::kCuda, {}, 128, 32, KvType::kF16, /*profile=*/true);
  auto plain = load(path_, Device::kCuda);
  ASSERT_TRUE(profiled && plain);
  auto sp = profiled->new_session(), sq = plain->new_session();
  ASSERT_TRUE(sp.ok() && sq.ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(sp.value()->sync(prompt(8, 3)));
  for (int i = 0; i < 6; ++i) ASSERT_OK(sp.value()->step(argmax(sp.value()->logits())));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_OK(sq.value()->sync(prompt(8, 3)));
  for (int i = 0; i < 6; ++i) ASSERT_OK(sq.value()->step(argmax(sq.value()->logits())));
  EXPECT_TRUE(std::equal(sp.value()->logits().begin(), sp.value()->logits().end(), sq.value()->logits().begin()));

  double device = -1, host = -1, embed = -1, total = 0;
  for (const auto& [name, seconds] : sp.value()->op_profile()) {
    total += seconds;
    if (name == "device (gpu)") {
      device = seconds;
    } else if (name == "host + sync") {
      host = seconds;
    } else if (name == "embed") {
      embed = seconds;
    } else {
      EXPECT_EQ(seconds, 0.0) << name;
    }
  }
  EXPECT_GT(device, 0.0);
  EXPECT_GE(host, 0.0);
  EXPECT_GE(embed, 0.0);
  EXPECT_LE(total, wall);
}

TEST_P(CudaEngine, PrefillLogitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = load(path_, Device::kCpu), gpu = load(path_, Device::kCuda);
  ASSERT_TRUE(cpu && gpu);
  auto sc = cpu->new_session(), sg = gpu->new_session();
  ASSERT_TRUE(sc.ok() && sg.ok());
  const std::vector<int32_t> tokens = prompt(77, 2);  // 3 chunks of n_batch 32 (the last a partial one)
  ASSERT_OK(sc.value()->sync(tokens, Logits::kAll));
  ASSERT_OK(sg.value()->sync(tokens, Logits::kAll));
  const std::span<const float> a = sc.value()->all_logits(), b = sg.value()->all_logits();
  ASSERT_EQ(a.size(), b.size());
  const int64_t V = cpu->info().n_vocab;
  const bool exact = GetParam().type == quant::Type::F32;
  RowAgreement rows;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::span<const float> ra = a.subspan(t * size_t(V), size_t(V)), rb = b.subspan(t * size_t(V), size_t(V));
    if (rows.add(ra, rb) && exact) ADD_FAILURE() << "position " << t << ", CPU lead " << lead(ra);
  }
  rows.check(variant_name({GetParam(), 0}) + ": prefill", exact);
}

// 3 sessions decoded together (one step of the batch; with head_dim 64 their attention in one launch:
// AttentionArgs::seq_k) and each alone, 5 steps: the logits bit for bit.
void expect_batched_decode_equals_alone(const std::string& path, KvType kv_type) {
  auto gpu = load(path, Device::kCuda, {}, 128, 32, kv_type);
  ASSERT_TRUE(gpu);
  const size_t kSessions = 3;
  std::vector<std::unique_ptr<Session>> alone, batched;
  for (size_t i = 0; i < kSessions; ++i) {
    for (auto* group : {&alone, &batched}) {
      auto s = gpu->new_session();
      ASSERT_TRUE(s.ok());
      ASSERT_OK(s.value()->sync(prompt(3 + 5 * i, int(i))));
      group->push_back(std::move(s).value());
    }
  }
  for (int step = 0; step < 5; ++step) {
    std::vector<Session*> members;
    std::vector<int32_t> ids;
    for (size_t i = 0; i < kSessions; ++i) {
      const int32_t id = int32_t((i * 17 + size_t(step) * 5 + 1) % 61);
      ASSERT_OK(alone[i]->step(id));
      members.push_back(batched[i].get());
      ids.push_back(id);
    }
    ASSERT_OK(gpu->step(members, ids));
    for (size_t i = 0; i < kSessions; ++i) {
      const std::span<const float> a = alone[i]->logits(), b = batched[i]->logits();
      ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "session " << i << " step " << step;
    }
  }
}

TEST_P(CudaEngine, BatchedDecodeEqualsAlone) {
  SKIP_WITHOUT_GPU();
  expect_batched_decode_equals_alone(path_, KvType::kF16);
}

// With F16 and with quantized KV (the mirror's rows are the host cache's bytes either way).
void expect_disk_kv_restore_continues_exactly(const std::string& path, KvType kv_type) {
  const std::string dir = ::testing::TempDir() + "cuda_kv_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto gpu = load(path, Device::kCuda, {.dir = dir, .gb = 1, .block_tokens = 16}, 128, 32, kv_type);
  ASSERT_TRUE(gpu);
  const std::vector<int32_t> tokens = prompt(50, 3);
  auto first = gpu->new_session();
  ASSERT_TRUE(first.ok());
  ASSERT_OK(first.value()->sync(tokens));  // saves blocks [0, 48): their rows come down from the GPU
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  ASSERT_OK(first.value()->sync(longer));
  auto second = gpu->new_session();
  ASSERT_TRUE(second.ok());
  ASSERT_OK(second.value()->sync(longer));  // 48 restored from disk, uploaded, 3 computed
  EXPECT_EQ(second.value()->stats().restored_tokens, 48);
  // The same computation without disk KV: 48 tokens, then the same 3 (one forward call of 3, as after the restore).
  auto plain = load(path, Device::kCuda, {}, 128, 32, kv_type);
  ASSERT_TRUE(plain);
  auto ref = plain->new_session();
  ASSERT_TRUE(ref.ok());
  ASSERT_OK(ref.value()->sync(std::span<const int32_t>(tokens).first(48)));
  ASSERT_OK(ref.value()->sync(longer));
  const std::span<const float> a = ref.value()->logits(), b = second.value()->logits();
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  std::filesystem::remove_all(dir);
}

TEST_P(CudaEngine, DiskKvRestoreContinuesExactly) {
  SKIP_WITHOUT_GPU();
  expect_disk_kv_restore_continues_exactly(path_, KvType::kF16);
}

// Speculative decoding on the GPU (Session::step(id, drafts): the few-token forward pass, in a graph per token count):
// each draft's row against the same tokens decoded one step at a time, over four rounds of 6, 3, 6 and 3 drafts (the
// last two replay the first two's graphs at later positions) that keep some drafts and rewind the rest (a decode graph
// step follows every rewind, reading its position from the device). F32 weights: top-1
// equal wherever the single step's lead is >= 1e-3 and max |dlogit| <= 1e-3; quantized weights: top-1 equal at >= 90%
// of those rows (the quantized prefill's rule: the few-token products quantize the activations in other launches).
TEST_P(CudaEngine, LookupDraftRowsMatchSingleSteps) {
  SKIP_WITHOUT_GPU();
  auto gpu = load(path_, Device::kCuda);
  ASSERT_TRUE(gpu);
  const size_t V = size_t(gpu->info().n_vocab);
  auto spec = gpu->new_session(), single = gpu->new_session();
  ASSERT_TRUE(spec.ok() && single.ok());
  std::vector<int32_t> timeline = prompt(20, 4);
  ASSERT_OK(spec.value()->sync(timeline));
  ASSERT_OK(single.value()->sync(timeline));
  const bool exact = GetParam().type == quant::Type::F32;
  RowAgreement rows;
  for (int round = 0; round < 4; ++round) {
    const int32_t id = int32_t((round * 11 + 5) % 61);
    std::vector<int32_t> drafts;
    for (int j = 0; j < (round % 2 == 0 ? 6 : 3); ++j) drafts.push_back(int32_t((round * 7 + j * 13 + 2) % 61));
    ASSERT_OK(spec.value()->step(id, drafts));
    ASSERT_OK(single.value()->sync(timeline));  // back to the timeline before the drafts
    for (size_t r = 0; r <= drafts.size(); ++r) {
      ASSERT_OK(single.value()->step(r == 0 ? id : drafts[r - 1]));
      if (rows.add(single.value()->logits(), spec.value()->all_logits().subspan(r * V, V)) && exact) {
        ADD_FAILURE() << "round " << round << " row " << r;
      }
    }
    // Keep id and `round` drafts, then one plain step (the decode graph) on both.
    timeline.push_back(id);
    timeline.insert(timeline.end(), drafts.begin(), drafts.begin() + round);
    spec.value()->rewind(timeline.size());
    timeline.push_back(int32_t(round + 40));
    ASSERT_OK(spec.value()->step(timeline.back()));
    ASSERT_OK(single.value()->sync(timeline));
    ASSERT_EQ(spec.value()->tokens(), timeline);
    if (rows.add(single.value()->logits(), spec.value()->logits()) && exact) ADD_FAILURE() << "round " << round;
  }
  rows.check(variant_name({GetParam(), 0}) + ": lookup draft rows", exact);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaEngine,
                         ::testing::Values(Variant{quant::Type::F32, false}, Variant{quant::Type::Q8_0, false},
                                           Variant{quant::Type::Q4_K, true},
                                           // hidden 2,048 (the 30B-A3B geometry's: the cluster norm, the bulk
                                           // gate/up and the stationary kernel's shapes of its rows), MoE, MoE, dense
                                           Variant{quant::Type::Q4_K, true, 2048, 2},
                                           // the same with Q6_K output, and attn_v and ffn_down_exps in layer 1
                                           // (llama.cpp's Q4_K_M mix gives half the layers' Q6_K)
                                           Variant{quant::Type::Q4_K, true, 2048, 2, quant::Type::Q6_K}),
                         variant_name);

// The quantized KV caches, Q8_0 and FP8 (fp8: E4M3 bytes the GPU's qkv_prepare and decode kernel store with cvt,
// read by decode directly and by prefill through kv_to_f16). Q8_0 takes heads of whole blocks: the tiny model with
// 64-wide heads (k_quant_rows), F32 and Q4_K weights. Its 2 KV heads of 68 bytes make 136-byte cache rows: the decode
// kernel's staging windows start 0, 4, 8 or 12 bytes before a head row.
struct QuantKv {
  quant::Type weights;
  KvType kv;
};
std::string quant_kv_name(const QuantKv& v) {
  return std::string(quant::traits(v.weights).name) + (v.kv == KvType::kQ8_0 ? "_q8_0" : "_fp8");
}
class CudaQuantKv : public ::testing::TestWithParam<QuantKv> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    path_ = ::testing::TempDir() + "cuda_qkv_" + std::to_string(getpid()) + "_" + quant_kv_name(GetParam()) + ".gguf";
    testing::write_tiny(path_, GetParam().weights, 12, true);
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  std::string path_;
};

// FP8 takes the relaxed rule: an element whose float differs in its last bits between the CPU and the GPU can round
// to another e4m3 code, a step of up to 2^-4 of its value (Q8_0's steps are a 1/127 of its block's largest), and the
// first divergence came at a CPU lead of 0.12 (H100, 2026-12-05).
TEST_P(CudaQuantKv, GreedyDecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  expect_greedy_decode_matches_cpu(path_, GetParam().kv, quant_kv_name(GetParam()) + " KV",
                                   GetParam().kv == KvType::kQ8_0);
}

// A 100-token prompt in chunks of 64 and 36 tokens: the first through kv_to_f16 and the F16 prefill kernel, the
// second on the decode kernel reading the cache (fewer tokens than kMmaAttentionTokens). Every position's logits
// against the CPU's with the same KV type: top-1 equal at >= 90% of the positions where the CPU's lead is >= 1e-3 (the
// GPU reads each Q8_0 element as f16(d * q), the CPU as float d * q; FP8 values are exact in both).
TEST_P(CudaQuantKv, PrefillLogitsMatchCpu) {
  SKIP_WITHOUT_GPU();
  auto cpu = load(path_, Device::kCpu, {}, 128, 64, GetParam().kv);
  auto gpu = load(path_, Device::kCuda, {}, 128, 64, GetParam().kv);
  ASSERT_TRUE(cpu && gpu);
  auto sc = cpu->new_session(), sg = gpu->new_session();
  ASSERT_TRUE(sc.ok() && sg.ok());
  const std::vector<int32_t> tokens = prompt(100, 4);
  ASSERT_OK(sc.value()->sync(tokens, Logits::kAll));
  ASSERT_OK(sg.value()->sync(tokens, Logits::kAll));
  const std::span<const float> a = sc.value()->all_logits(), b = sg.value()->all_logits();
  ASSERT_EQ(a.size(), b.size());
  const size_t V = size_t(cpu->info().n_vocab);
  double max_abs = 0;
  int decided = 0, agree = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::span<const float> ra = a.subspan(t * V, V), rb = b.subspan(t * V, V);
    for (size_t j = 0; j < V; ++j) max_abs = std::max(max_abs, double(std::fabs(ra[j] - rb[j])));
    if (lead(ra) >= 1e-3f) {
      ++decided;
      agree += argmax(ra) == argmax(rb);
    }
  }
  std::printf("[cuda] %s KV: prefill max |dlogit| %.3e, top-1 equal at %d of %d positions\n",
              quant_kv_name(GetParam()).c_str(), max_abs, agree, decided);
  ASSERT_GT(decided, 0);
  EXPECT_GE(double(agree), 0.9 * decided);
}

TEST_P(CudaQuantKv, BatchedDecodeEqualsAlone) {
  SKIP_WITHOUT_GPU();
  expect_batched_decode_equals_alone(path_, GetParam().kv);
}

TEST_P(CudaQuantKv, DiskKvRestoreContinuesExactly) {
  SKIP_WITHOUT_GPU();
  expect_disk_kv_restore_continues_exactly(path_, GetParam().kv);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaQuantKv,
                         ::testing::Values(QuantKv{quant::Type::F32, KvType::kQ8_0},
                                           QuantKv{quant::Type::Q4_K, KvType::kQ8_0},
                                           QuantKv{quant::Type::F32, KvType::kF8},
                                           QuantKv{quant::Type::Q4_K, KvType::kF8}),
                         [](const ::testing::TestParamInfo<QuantKv>& info) { return quant_kv_name(info.param); });

// bench's bandwidth columns on the GPU: the device reports a peak between 100 GB/s and 100 TB/s (the H200: ~4.8 TB/s),
// the CPU none, and what a decoded token reads is the same on both (a property of the file and the KV type).
TEST(CudaDemo, ReportsPeakBandwidthAndDecodeBytes) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  for (const KvType kv_type : {KvType::kF16, KvType::kQ8_0, KvType::kF8}) {
    const std::unique_ptr<Engine> gpu = load(demo, Device::kCuda, {}, 128, 32, kv_type);
    const std::unique_ptr<Engine> cpu = load(demo, Device::kCpu, {}, 128, 32, kv_type);
    ASSERT_TRUE(gpu && cpu);
    EXPECT_GT(gpu->peak_bandwidth(), 1e11);
    EXPECT_LT(gpu->peak_bandwidth(), 1e14);
    EXPECT_EQ(cpu->peak_bandwidth(), 0.0);
    const DecodeBytes g = gpu->decode_bytes(), c = cpu->decode_bytes();
    EXPECT_GT(g.weights, 0u);
    EXPECT_EQ(g.weights, c.weights);
    EXPECT_EQ(g.experts, c.experts);
    EXPECT_EQ(g.kv_per_row, c.kv_per_row);
  }
}

// The trained demo model over real text in one 512-token prefill (the int8 tensor-core path for every
// projection and expert group), against the CPU: the mean negative log-likelihood of the text's next tokens
// and how often the two pick the same top-1.
TEST(CudaDemo, PrefillScoresTextLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  std::ifstream in(std::string(MAGNETAR_SOURCE_DIR) + "/models/README.md");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 2000u);
  std::vector<int32_t> tokens;
  auto score = [&](Device device, KvType kv_type) -> testing::TextScore {
    const std::unique_ptr<Engine> engine = load(demo, device, {}, 512, 512, kv_type);
    if (!engine) return {};
    if (tokens.empty()) {
      auto t = engine->tokenize(text, false);
      EXPECT_TRUE(t.ok());
      if (!t.ok()) return {};
      tokens.assign(t.value().begin(), t.value().begin() + std::min<size_t>(t.value().size(), 512));
    }
    auto s = engine->new_session();
    EXPECT_TRUE(s.ok());
    if (!s.ok() || !s.value()->sync(tokens, Logits::kAll).ok()) return {};
    return testing::score_text(s.value()->all_logits(), tokens, size_t(engine->info().n_vocab));
  };
  for (const KvType kv_type : {KvType::kF16, KvType::kQ8_0, KvType::kF8}) {
    const char* kv = kv_type == KvType::kF16 ? "f16" : kv_type == KvType::kQ8_0 ? "q8_0" : "fp8";
    const testing::TextScore cpu = score(Device::kCpu, kv_type), gpu = score(Device::kCuda, kv_type);
    ASSERT_EQ(tokens.size(), 512u);
    ASSERT_EQ(cpu.top1.size(), 511u) << kv;
    ASSERT_EQ(gpu.top1.size(), cpu.top1.size()) << kv;
    int agree = 0;
    for (size_t i = 0; i < cpu.top1.size(); ++i) agree += cpu.top1[i] == gpu.top1[i];
    std::printf("[cuda] demo model, 512 tokens, %s KV: mean NLL CPU %.5f, GPU %.5f; top-1 equal at %d of 511\n", kv,
                cpu.nll, gpu.nll, agree);
    // q8_0: the GPU's tensor cores read each K/V element as f16(d * q), one rounding more than the CPU's float d * q;
    // that rounding alone moves this model's 512-token NLL by 0.020 (the CPU with it added: 7.1783 instead of
    // 7.1584, 2026-12-01), so the bound is 0.03 there. fp8: the values are exact in f16, but K and V round to e4m3 from
    // floats that differ in their last bits between the two, and a value at a rounding boundary moves by a step of up
    // to 2^-4 of itself (measured 7.18372 vs 7.17040 on an H100, 2026-12-05): the same 0.03.
    EXPECT_NEAR(gpu.nll, cpu.nll, kv_type == KvType::kF16 ? 0.01 : 0.03) << kv;
    EXPECT_GE(agree, int(0.9 * 511)) << kv;
  }
}

// --batch 0 (auto): prefill chunks of 2,048 tokens (at most the context) when the whole model runs on the GPU, 512 on
// the CPU and when the experts are tiered (the pool keeps that memory); an explicit n_batch is kept.
TEST(CudaEngineBatch, AutoBatchFollowsThePlan) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  auto batch_of = [&](Device device, int64_t n_ctx, double gpu_cache_gb, int64_t n_batch) -> int64_t {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = n_ctx;
    o.n_batch = n_batch;
    o.device = device;
    o.gpu_cache_gb = gpu_cache_gb;
    auto engine = Engine::load(demo, o);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? engine.value()->options().n_batch : -1;
  };
  EXPECT_EQ(batch_of(Device::kCuda, 4096, 0, 0), 2048);
  EXPECT_EQ(batch_of(Device::kCuda, 1000, 0, 0), 1000);
  EXPECT_EQ(batch_of(Device::kCuda, 4096, 0.01, 0), 512);
  EXPECT_EQ(batch_of(Device::kCpu, 4096, 0, 0), 512);
  EXPECT_EQ(batch_of(Device::kCuda, 4096, 0, 96), 96);
}

// The sessions planned for (EngineOptions::n_sessions, serve --parallel) each take their KV on the GPU: the demo
// model's is 4 KiB a token (8 layers x K, V x 2 heads of 64 in F16), 16 GiB at a context of 4M; one session fits
// a large GPU, twelve (192 GiB) none that exists, and --device cuda says so naming them.
TEST(CudaEngineBatch, TheGpuPlanCountsTheSessionsPlannedFor) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  if (models::gpu_info().free_bytes < (40ull << 30)) GTEST_SKIP() << "SKIP: less than 40 GiB free on the GPU";
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = int64_t(1) << 22;
  o.device = Device::kCuda;
  Result<std::unique_ptr<Engine>> one = Engine::load(demo, o);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(std::string(one.value()->device()), "cuda");
  one.value().reset();
  o.n_sessions = 12;
  Result<std::unique_ptr<Engine>> twelve = Engine::load(demo, o);
  ASSERT_FALSE(twelve.ok());
  EXPECT_NE(twelve.status().message().find("12 sessions' KV"), std::string::npos) << twelve.status().message();
}

// ---- the GPU expert tier ------------------------------------------------------------------------------------------

// The bundled demo model (16 MoE layers of 16 experts): resident on the GPU against the tiered mode with a pool of
// 20 experts (every layer evicts), experts in host memory mapped or streamed through a small RAM cache, with and
// without next-layer prefetch (--prefetch: the next router's guess read into the RAM cache while a layer's copies,
// no longer waited for, are still in flight). The same kernels compute the same rows wherever the weights came
// from: logits bit-identical, prefill and decode. The routing counts (the expert map's uses) agree as well: resident
// decode reads the ids back once per step, the tiered mode layer by layer; every token counts k uses per layer.
TEST(CudaTier, PoolEqualsResidentBitForBit) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  std::vector<std::vector<uint64_t>> uses;
  auto run = [&](double gpu_cache_gb, bool stream, std::vector<std::vector<float>>* logits, bool prefetch = false) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.n_batch = 16;
    o.n_sweep = 128;  // the tiered runs take the prompt in one sweep (auto would go chunk by chunk below 8 chunks)
    o.device = Device::kCuda;
    o.gpu_cache_gb = gpu_cache_gb;
    if (stream) {
      o.experts = ExpertMode::kStream;
      o.stream.cache_gb = 0.007;
      o.stream.census = false;
      o.stream.prefetch = prefetch;
    }
    auto engine = Engine::load(demo, o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ(engine.value()->expert_stats().gpu_tier, gpu_cache_gb > 0 || stream) << engine.value()->memory_plan();
    auto s = engine.value()->new_session();
    ASSERT_TRUE(s.ok());
    std::vector<int32_t> tokens = prompt(40, 4);  // 3 prefill chunks
    ASSERT_OK(s.value()->sync(tokens));
    for (int i = 0; i < 24; ++i) {
      logits->emplace_back(s.value()->logits().begin(), s.value()->logits().end());
      ASSERT_OK(s.value()->step(argmax(s.value()->logits())));
    }
    const ModelInfo info = engine.value()->info();
    const ExpertMap map = engine.value()->expert_map();
    uint64_t total = 0;
    for (const uint64_t u : map.uses) total += u;
    EXPECT_EQ(total, uint64_t(info.n_layer * info.n_expert_used) * (tokens.size() + 24)) << "routing counts";
    uses.push_back(map.uses);
    if (gpu_cache_gb > 0) {
      const ExpertStats st = engine.value()->expert_stats();
      EXPECT_EQ(st.sweeps, 1u) << "the 40-token prompt is one prefill sweep of 3 chunks";
      std::printf("[cuda] tier %.3f GiB%s: %llu slots, hits %llu, misses %llu, evictions %llu\n", gpu_cache_gb,
                  stream ? " + streamed host cache" : "", (unsigned long long)st.gpu_slots,
                  (unsigned long long)st.gpu_hits, (unsigned long long)st.gpu_misses,
                  (unsigned long long)st.gpu_evictions);
      EXPECT_GT(st.gpu_evictions, 0u) << "the pool is meant to be too small for the model";
      if (prefetch) {
        EXPECT_GT(st.prefetch_issued, 0u) << "the guesses are meant to miss the small RAM cache";
      }
    }
  };
  std::vector<std::vector<float>> resident, pooled, streamed, prefetched;
  run(0, false, &resident);
  run(0.004, false, &pooled);
  run(0.004, true, &streamed);
  run(0.004, true, &prefetched, true);
  ASSERT_EQ(resident.size(), 24u);
  ASSERT_EQ(pooled.size(), resident.size());
  ASSERT_EQ(streamed.size(), resident.size());
  ASSERT_EQ(prefetched.size(), resident.size());
  for (size_t i = 0; i < resident.size(); ++i) {
    EXPECT_EQ(pooled[i], resident[i]) << "token " << i << " (GPU pool, mapped host experts)";
    EXPECT_EQ(streamed[i], resident[i]) << "token " << i << " (GPU pool, streamed host experts)";
    EXPECT_EQ(prefetched[i], resident[i]) << "token " << i << " (GPU pool, streamed host experts, prefetch)";
  }
  ASSERT_EQ(uses.size(), 4u);
  for (size_t r = 1; r < uses.size(); ++r) EXPECT_EQ(uses[r], uses[0]) << "routing counts of tiered run " << r;
}

// The tiny model's experts (Q8_0, 32 columns into the down projection: one 34-byte block, so the down input's rows are
// not 4-byte aligned and the misses are not split into launches of their own) tiered through a pool of its 4 experts:
// the misses' copies run on the copy stream while the first launches, which hold the misses' items too, must wait for
// them. Logits bit for bit the resident engine's, prefill and decode.
TEST(CudaTier, UnsplitMissesWaitForTheirCopies) {
  SKIP_WITHOUT_GPU();
  const std::string path = ::testing::TempDir() + "cuda_tier_unsplit_" + std::to_string(getpid()) + ".gguf";
  testing::write_tiny(path, quant::Type::Q8_0, 5);
  auto run = [&](double gpu_cache_gb, std::vector<std::vector<float>>* logits) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 64;
    o.n_batch = 8;
    o.device = Device::kCuda;
    o.gpu_cache_gb = gpu_cache_gb;
    o.experts = gpu_cache_gb > 0 ? ExpertMode::kAuto : ExpertMode::kResident;
    auto engine = Engine::load(path, o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ(engine.value()->expert_stats().gpu_tier, gpu_cache_gb > 0) << engine.value()->memory_plan();
    auto s = engine.value()->new_session();
    ASSERT_TRUE(s.ok());
    ASSERT_OK(s.value()->sync(prompt(12, 2)));  // two chunks of 8 and 4 tokens
    for (int i = 0; i < 16; ++i) {
      logits->emplace_back(s.value()->logits().begin(), s.value()->logits().end());
      ASSERT_OK(s.value()->step(argmax(s.value()->logits())));
    }
    if (gpu_cache_gb > 0) {
      EXPECT_GT(engine.value()->expert_stats().gpu_misses, 0u);
    }
  };
  std::vector<std::vector<float>> resident, pooled;
  run(0, &resident);
  run(0.00003, &pooled);
  std::filesystem::remove(path);
  ASSERT_EQ(resident.size(), 16u);
  ASSERT_EQ(pooled.size(), resident.size());
  for (size_t i = 0; i < resident.size(); ++i) EXPECT_EQ(pooled[i], resident[i]) << "token " << i;
}

// The demo model tiered through a pool of 20 experts, 16-token chunks, prefill sweeps of up to n_sweep tokens.
EngineOptions sweep_options(int64_t n_sweep) {
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 160;
  o.n_batch = 16;
  o.n_sweep = n_sweep;
  o.device = Device::kCuda;
  o.gpu_cache_gb = 0.004;
  return o;
}

// Prefill sweeps (EngineOptions::n_sweep) against one forward call per chunk, tiered with the 20-expert pool: every
// position's logits (Logits::kAll) bit for bit, for sweeps of the whole prompt and of two chunks, prompts whose last
// chunk is a single token (the decode kernels inside a sweep), a second prompt continuing the first from a position
// inside a chunk, then decode steps over the KV the sweeps wrote, and the routing counts; whole-prompt sweeps again
// with the experts streamed through a small RAM cache and --prefetch (every chunk has the source read its guess of the
// next layer's experts). Each layer's experts come up once per sweep: fewer host-to-GPU bytes than chunk by chunk.
TEST(CudaTier, SweepsEqualChunks) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  struct Run {
    std::vector<std::vector<float>> logits;
    std::vector<uint64_t> uses;
    ExpertStats stats;
  };
  auto run = [&](int64_t n_sweep, bool stream = false) {
    Run out;
    EngineOptions o = sweep_options(n_sweep);
    if (stream) {
      o.experts = ExpertMode::kStream;
      o.stream.cache_gb = 0.007;
      o.stream.census = false;
      o.stream.prefetch = true;
    }
    auto engine = Engine::load(demo, o);
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    if (!engine.ok()) return out;
    auto s = engine.value()->new_session();
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return out;
    auto expect_ok = [](const Status& st) { EXPECT_TRUE(st.ok()) << st.message(); };
    std::vector<int32_t> tokens = prompt(49, 6);  // chunks of 16, 16, 16 and 1
    expect_ok(s.value()->sync(tokens, Logits::kAll));
    out.logits.emplace_back(s.value()->all_logits().begin(), s.value()->all_logits().end());
    const std::vector<int32_t> more = prompt(56, 7);  // from position 49: chunks of 16 x 3, then 8
    tokens.insert(tokens.end(), more.begin(), more.end());
    expect_ok(s.value()->sync(tokens, Logits::kAll));
    out.logits.emplace_back(s.value()->all_logits().begin(), s.value()->all_logits().end());
    for (int i = 0; i < 6; ++i) {
      expect_ok(s.value()->step(argmax(s.value()->logits())));
      out.logits.emplace_back(s.value()->logits().begin(), s.value()->logits().end());
    }
    out.uses = engine.value()->expert_map().uses;
    out.stats = engine.value()->expert_stats();
    return out;
  };
  const Run chunks = run(0), whole = run(160), pairs = run(32), streamed = run(160, true), automatic = run(-1);
  ASSERT_EQ(chunks.logits.size(), 8u);
  EXPECT_EQ(chunks.stats.sweeps, 0u);
  EXPECT_EQ(whole.stats.sweeps, 2u) << "one sweep per prompt";
  EXPECT_EQ(pairs.stats.sweeps, 4u) << "sweeps of two chunks: 32 + 17, then 32 + 24";
  EXPECT_EQ(streamed.stats.sweeps, 2u);
  EXPECT_EQ(automatic.stats.sweeps, 0u) << "--sweep -1 on the GPU: prompts of fewer than 8 chunks go chunk by chunk";
  EXPECT_GT(streamed.stats.prefetch_issued, 0u) << "the chunks' guesses of the next layer";
  for (const Run* r : {&whole, &pairs, &streamed}) {
    const char* what = r == &whole ? "whole-prompt sweeps" : r == &pairs ? "two-chunk sweeps" : "streamed, prefetched";
    ASSERT_EQ(r->logits.size(), chunks.logits.size()) << what;
    for (size_t i = 0; i < chunks.logits.size(); ++i) {
      EXPECT_EQ(r->logits[i], chunks.logits[i]) << what << ", call " << i;
    }
    EXPECT_EQ(r->uses, chunks.uses) << what << ": routing counts";
  }
  std::printf("[cuda] 105 prompt tokens + 6 decoded: copied up %.1f MiB chunk by chunk, %.1f MiB in whole-prompt "
              "sweeps, %.1f MiB in two-chunk sweeps\n", double(chunks.stats.gpu_bytes_h2d) / double(1 << 20),
              double(whole.stats.gpu_bytes_h2d) / double(1 << 20), double(pairs.stats.gpu_bytes_h2d) / double(1 << 20));
  EXPECT_LT(whole.stats.gpu_bytes_h2d, pairs.stats.gpu_bytes_h2d);
  EXPECT_LT(pairs.stats.gpu_bytes_h2d, chunks.stats.gpu_bytes_h2d);
}

// Prefill sweeps stopped by sync's progress hook (the server's turns) on the tiered demo model, whose sweep state lives
// in the model (one paused sweep at a time): a stopped sweep continues where it stopped after another session's
// prompt (which then goes chunk by chunk: the paused sweep is contested) and decode; a paused sweep that another
// session finds contested in an earlier call is dropped for that session's sweep, and its own session then computes
// its prompt again. Every session's logits are bit for bit those of a session of a chunk-by-chunk engine given the
// same calls (the same chunk boundaries: a chunk's rounding depends on its rows).
TEST(CudaTier, PausedSweepsContinueAcrossSessions) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  auto load = [&](int64_t n_sweep) {
    auto engine = Engine::load(demo, sweep_options(n_sweep));
    EXPECT_TRUE(engine.ok()) << engine.status().message();
    return engine.ok() ? std::move(engine).value() : nullptr;
  };
  std::unique_ptr<Engine> chunked = load(0), engine = load(160);
  ASSERT_TRUE(chunked && engine);
  // A session of the engine and its reference twin on the chunked one.
  struct Twin {
    std::unique_ptr<Session> s, ref;
  };
  auto twin = [&] {
    auto s = engine->new_session();
    auto r = chunked->new_session();
    EXPECT_TRUE(s.ok() && r.ok());
    return Twin{s.ok() ? std::move(s).value() : nullptr, r.ok() ? std::move(r).value() : nullptr};
  };
  Twin a = twin(), b = twin(), c = twin();
  ASSERT_TRUE(a.s && b.s && c.s && a.ref && b.ref && c.ref);
  auto logits = [](Session& s) { return std::vector<float>(s.logits().begin(), s.logits().end()); };
  // Progress calls of a sync, stopping at call `stop` (0: never).
  auto sync = [](Session& s, const std::vector<int32_t>& tokens, int stop, int* calls) {
    *calls = 0;
    return s.sync(tokens, Logits::kLast, [&](int64_t, int64_t) { return ++*calls != stop; });
  };
  // The reference's same call, then the comparison.
  auto check_sync = [&](Twin& t, const std::vector<int32_t>& tokens, const char* what) {
    ASSERT_TRUE(t.ref->sync(tokens).ok());
    EXPECT_EQ(logits(*t.s), logits(*t.ref)) << what;
  };
  auto step = [&](Twin& t, const char* what) {
    const int32_t id = argmax(t.s->logits());
    ASSERT_TRUE(t.s->step(id).ok());
    ASSERT_TRUE(t.ref->step(id).ok());
    EXPECT_EQ(logits(*t.s), logits(*t.ref)) << what;
  };
  int calls = 0, whole = 0;
  const std::vector<int32_t> pa = prompt(49, 8), pb = prompt(40, 9), pc = prompt(40, 10);
  ASSERT_TRUE(sync(*c.s, pa, 0, &whole).ok());  // an uninterrupted sweep of pa: one call per step
  c.s->clear();
  const uint64_t sweeps0 = engine->expert_stats().sweeps;
  EXPECT_EQ(sweeps0, 1u);

  const Status stopped = sync(*a.s, pa, 5, &calls);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.message(), "cancelled");
  EXPECT_TRUE(a.s->tokens().empty());
  EXPECT_EQ(engine->expert_stats().sweep_pauses, 1u);
  ASSERT_TRUE(b.s->sync(pb).ok());
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps0) << "b's prompt goes chunk by chunk while a's sweep is paused";
  check_sync(b, pb, "b's prompt while a's sweep is paused");
  step(b, "b's decode step while a's sweep is paused");
  ASSERT_TRUE(sync(*a.s, pa, 0, &calls).ok());
  EXPECT_EQ(calls, whole - 5) << "a's sweep continues after its fifth step";
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps0 + 1);
  check_sync(a, pa, "a's continued sweep");

  // a stops again in a sweep of 40 more tokens; b contests it (chunk by chunk), c's later call takes the model.
  std::vector<int32_t> pa2 = pa, pb2 = pb;
  pa2.insert(pa2.end(), pc.begin(), pc.end());
  pb2.insert(pb2.end(), pa.begin(), pa.begin() + 40);
  ASSERT_FALSE(sync(*a.s, pa2, 3, &calls).ok());
  ASSERT_EQ(a.s->tokens(), pa);
  ASSERT_TRUE(b.s->sync(pb2).ok());
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps0 + 1) << "contested: b goes chunk by chunk";
  check_sync(b, pb2, "b's second prompt, contested");
  ASSERT_TRUE(c.s->sync(pc).ok());
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps0 + 2) << "c's sweep replaces a's paused one";
  check_sync(c, pc, "c's sweep");
  ASSERT_TRUE(sync(*a.s, pa2, 0, &calls).ok());
  EXPECT_EQ(engine->expert_stats().sweeps, sweeps0 + 3) << "a computes its 40 tokens again, in a sweep";
  EXPECT_EQ(calls, 2 + (whole - 2) / 4 * 3) << "a's second sweep from its first step (3 chunks, not 4)";
  check_sync(a, pa2, "a's repeated sweep");
  step(a, "a's decode step over the KV its dropped and repeated sweeps wrote");
}

// The CPU expert lane (--cpu-experts): the demo model with the 20-expert pool, experts streamed through a small
// RAM cache; cold misses with few rows are computed on the CPU while the GPU computes the rest. Those rows carry
// the CPU kernels' rounding, so the check is closeness to the resident run on the same tokens (teacher-forced:
// both runs are fed the resident run's greedy tokens): the lane was used, top-1 equal at >= 22 of the 25
// positions (the prompt's last and 24 decoded) and max |dlogit| <= 2. On this model a rounding difference can
// flip a router's near-tie (GPU vs CPU over 9,690 tokens: top-1 equal at 95%, KL 0.0078); measured on the H200:
// 25 of 25 and 0.29 with the first admission rule, 24 of 25 and 0.78 with lru's. With the lane balanced against the
// copies (the default) it takes only a few lookups on the H200; ctest runs the test again as
// CudaTier.CpuLaneMatchesResidentEveryColdMiss (MAGNETAR_CUDA_LANE_BALANCE=0), where about half the expert lookups
// run on the CPU (536 of 1,039 on the H200, 25 of 25 and 0.22), so that lost or misplaced rows would break the top-1
// agreement of a trained model.
TEST(CudaTier, CpuLaneMatchesResident) {
  SKIP_WITHOUT_GPU();
  const std::string demo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
  const std::vector<int32_t> tokens = prompt(40, 5);
  std::vector<int32_t> forced;  // the resident run's greedy continuation
  auto run = [&](bool lane, std::vector<std::vector<float>>* logits) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    o.n_batch = 16;
    o.device = Device::kCuda;
    if (lane) {
      o.gpu_cache_gb = 0.004;
      o.gpu_cache_policy = "lru";  // the configuration measured on the H200 (numbers below)
      o.cpu_experts = true;
      o.experts = ExpertMode::kStream;
      o.stream.cache_gb = 0.007;
      o.stream.census = false;
    }
    auto engine = Engine::load(demo, o);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    auto s = engine.value()->new_session();
    ASSERT_TRUE(s.ok());
    ASSERT_OK(s.value()->sync(tokens));
    for (size_t i = 0; i < 25; ++i) {
      logits->emplace_back(s.value()->logits().begin(), s.value()->logits().end());
      if (!lane) forced.push_back(argmax(s.value()->logits()));
      if (i + 1 < 25) ASSERT_OK(s.value()->step(forced[i]));
    }
    if (lane) {
      const ExpertStats st = engine.value()->expert_stats();
      std::printf("[cuda] CPU lane: %llu of %llu pool lookups on the CPU (%llu rows), %llu copied up\n",
                  (unsigned long long)st.gpu_cpu_experts, (unsigned long long)st.gpu_lookups(),
                  (unsigned long long)st.gpu_cpu_rows, (unsigned long long)st.gpu_misses);
      EXPECT_GT(st.gpu_cpu_experts, 0u) << "the lane never ran: the test proves nothing";
    }
  };
  std::vector<std::vector<float>> resident, laned;
  run(false, &resident);
  run(true, &laned);
  ASSERT_EQ(resident.size(), 25u);
  ASSERT_EQ(laned.size(), resident.size());
  int agree = 0;
  double max_abs = 0;
  for (size_t i = 0; i < resident.size(); ++i) {
    agree += argmax(resident[i]) == argmax(laned[i]);
    for (size_t j = 0; j < resident[i].size(); ++j) {
      max_abs = std::max(max_abs, double(std::fabs(resident[i][j] - laned[i][j])));
    }
  }
  std::printf("[cuda] CPU lane vs resident: top-1 equal at %d of 25, max |dlogit| %.3e\n", agree, max_abs);
  EXPECT_GE(agree, 22);
  EXPECT_LE(max_abs, 2.0);
}

}  // namespace
}  // namespace magnetar
