// Streamed experts give the same logits as resident ones, bit for bit (issue: expert streaming, Correctness):
// the bundled demo model (real routing) run with --resident, then streamed through caches small enough to
// evict constantly, with io_uring and with the pread pool, O_DIRECT and buffered, with and without prefetch,
// from the standard and the packed (expert-major) layout, prefill (all positions at once) and decode
// (position by position).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/tools/invoke.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar {
namespace {

const std::string kDemo = std::string(MAGNETAR_SOURCE_DIR) + "/models/magnetar-demo-q8_0.gguf";
// A 9-line text whose tokens route to most of the demo model's experts.
const char* kPrompt =
    "In the beginning God created the heaven and the earth. Apple (noun): the fleshy fruit of a tree. "
    "The strlen() function calculates the length of the string pointed to by s. os.getcwd() returns a "
    "string representing the current working directory. Fortune: you will be streamed from disk.";

std::vector<uint8_t> dump(const std::string& flags, bool decode, testing::TempDir& dir, const std::string& name,
                          const std::string& model = kDemo) {
  std::ofstream(dir.file("prompt")) << kPrompt;
  const std::string out = dir.file(name + ".npy");
  const testing::Invocation r = testing::run_magnetar("run -m " + model + " -f " + dir.file("prompt") +
                                                      " --dump-logits " + out + (decode ? " --decode " : " ") +
                                                      "--device cpu " + flags);
  EXPECT_EQ(r.status, 0) << flags << "\n" << r.err;
  return testing::read_all(out);
}

TEST(Streaming, LogitsBitIdenticalToResident) {
  testing::TempDir dir;
  const std::string packed = dir.file("demo-packed.gguf");
  const testing::Invocation p = testing::run_magnetar("pack " + kDemo + " -o " + packed);
  ASSERT_EQ(p.status, 0) << p.err;
  // The census would warm later runs from earlier ones; each arm starts cold.
  for (const bool decode : {false, true}) {
    const std::vector<uint8_t> resident = dump("--resident", decode, dir, "resident");
    ASSERT_GT(resident.size(), 1000u);
    // 0.007 GiB = 34 slots of the 16 x 8 = 128 experts: above the planner's floor (max(16 + 4, 8 x 4) = 32),
    // far below the working set, so nearly every layer evicts.
    for (const std::string arm : {"--stream --no-census --cache-gb 0.007",
                                  "--stream --no-census --cache-gb 0.007 --prefetch",
                                  "--stream --no-census --cache-gb 0.007 --no-io-uring",
                                  "--stream --no-census --cache-gb 0.007 --no-direct --cache-policy lru",
                                  "--stream --no-census"}) {
      EXPECT_EQ(dump(arm, decode, dir, "streamed"), resident) << arm << (decode ? " (decode)" : " (prefill)");
    }
    // The expert-major layout: one record per expert, resident (mapped records) and streamed.
    for (const std::string arm : {"--resident", "--stream --no-census --cache-gb 0.007",
                                  "--stream --no-census --cache-gb 0.007 --no-io-uring"}) {
      EXPECT_EQ(dump(arm, decode, dir, "packed", packed), resident) << "packed " << arm;
    }
  }
}

// Prefill sweeps (--sweep): the prompt's 67 tokens in 16-token chunks, streamed through the 34-slot cache, layer by
// layer over the chunks (the whole prompt, or 32 tokens, per sweep) against chunk by chunk (--sweep 0) and against
// the resident model in the same chunks: every position's logits bit for bit. A sweep reads each layer's experts
// once instead of once per chunk: fewer bytes per prompt token (the run's statistics line).
TEST(Streaming, SweepsBitIdenticalToChunks) {
  testing::TempDir dir;
  const std::string cache = "--stream --no-census --cache-gb 0.007 --batch 16 ";
  const std::vector<uint8_t> resident = dump("--resident --batch 16", false, dir, "resident");
  ASSERT_GT(resident.size(), 1000u);
  for (const std::string arm : {"", "--sweep 32", "--sweep 0", "--no-io-uring"}) {
    EXPECT_EQ(dump(cache + arm, false, dir, "swept"), resident) << arm;
  }
  // MiB read per prompt token, and whether sweeps ran, from `run`'s statistics line. Reads merge only adjacent
  // pieces (--read-gap-kib 0): the gap measured at load varies with the machine's load, and with it the bytes read.
  auto read_per_token = [&](const std::string& arm, bool* swept) {
    const testing::Invocation r = testing::run_magnetar("run -m " + kDemo + " -f " + dir.file("prompt") +
                                                        " -n 1 --device cpu --read-gap-kib 0 " + cache + arm);
    EXPECT_EQ(r.status, 0) << arm << "\n" << r.err;
    *swept = r.err.find("prefill sweeps") != std::string::npos;
    const size_t at = r.err.find("| read ");
    EXPECT_NE(at, std::string::npos) << r.err;
    return at == std::string::npos ? 0.0 : std::stod(r.err.substr(at + 7));
  };
  bool swept = false, chunked = true;
  const double sweep_mib = read_per_token("", &swept), chunk_mib = read_per_token("--sweep 0", &chunked);
  std::printf("[stream] 67-token prompt in 16-token chunks: %.2f MiB read per token chunk by chunk, %.2f in a sweep\n",
              chunk_mib, sweep_mib);
  EXPECT_TRUE(swept);
  EXPECT_FALSE(chunked);
  EXPECT_LT(sweep_mib, 0.5 * chunk_mib);
}

TEST(Streaming, StatisticsAndFlagErrors) {
  testing::TempDir dir;
  std::ofstream(dir.file("prompt")) << kPrompt;
  testing::Invocation r = testing::run_magnetar("run -m " + kDemo + " --resident --stream -p hi -n 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("exclude each other"), std::string::npos) << r.err;
  // Below the floor: refused before anything is allocated, with the numbers.
  r = testing::run_magnetar("run -m " + kDemo + " --cache-gb 0.001 -p hi -n 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--cache-gb"), std::string::npos) << r.err;
  r = testing::run_magnetar("run -m " + kDemo + " --stream --no-census --cache-policy fifo -p hi -n 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("fifo"), std::string::npos) << r.err;
  r = testing::run_magnetar("run -m " + kDemo + " --stream --sweep -2 -p hi -n 1");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--sweep"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace magnetar
