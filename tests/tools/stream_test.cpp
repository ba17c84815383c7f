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
}

}  // namespace
}  // namespace magnetar
