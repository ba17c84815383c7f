// EngineOptions::profile on the CPU: the ops' times are taken one after another on the thread that computes, never
// one inside another, so for a prompt and for decode steps they add up to no more than the wall time of the calls
// that ran them, and the ops that ran (attention, the experts' products, the head) have time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <map>

#include "engine/engine.h"
#include "quant/quant.h"
#include "tests/unit/tiny_qwen3.h"

namespace magnetar {
namespace {

TEST(EngineProfile, OpsAddUpToNoMoreThanTheWallTime) {
  const std::string path = ::testing::TempDir() + "engine_profile_" + std::to_string(getpid()) + ".gguf";
  testing::write_tiny(path, quant::Type::F32, 7, /*k_quant_rows=*/true);
  EngineOptions options;
  options.n_threads = 2;
  options.n_ctx = 256;
  options.n_batch = 64;
  options.experts = ExpertMode::kResident;
  options.profile = true;
  auto engine = Engine::load(path, options);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  auto session = engine.value()->new_session();
  ASSERT_TRUE(session.ok());
  Session& s = *session.value();
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % 97);
  auto sum_and_ops = [&] {
    std::map<std::string, double> ops;
    double sum = 0;
    for (const auto& [name, seconds] : s.op_profile()) {
      ops[name] = seconds;
      sum += seconds;
    }
    return std::make_pair(sum, ops);
  };
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(s.sync(tokens).ok());
  const double prefill_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto [prefill_sum, prefill_ops] = sum_and_ops();
  EXPECT_LE(prefill_sum, prefill_wall) << "prefill";
  s.reset_stats();
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(s.step(int32_t(i % 97)).ok());
  const double decode_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const auto [decode_sum, decode_ops] = sum_and_ops();
  EXPECT_LE(decode_sum, decode_wall) << "decode";
  for (const auto* ops : {&prefill_ops, &decode_ops}) {
    for (const char* op : {"attention", "experts gate+up", "experts down", "lm head"}) {
      EXPECT_GT(ops->at(op), 0.0) << op;
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace magnetar
