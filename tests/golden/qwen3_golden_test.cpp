// Dense Qwen3 against transformers (tests/golden/golden_util.h has the method and thresholds):
//   qwen3  2 layers, tied embeddings (no lm_head.weight), head_dim 64 * 4 heads != hidden 128, weights sharded
//          in two safetensors files with model.safetensors.index.json
#include <algorithm>
#include <filesystem>

#include "tests/golden/golden_util.h"

namespace magnetar::golden {
namespace {

class Qwen3Golden : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3Golden, MatchesTransformers) { check_against_reference(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Golden, Qwen3Golden,
                         ::testing::Values(Case{"qwen3", "f32"}, Case{"qwen3", "bf16"}, Case{"qwen3", "q8_0"}),
                         case_name);

class Qwen3Decode : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3Decode, MatchesPrefill) { check_decode_matches_prefill(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Golden, Qwen3Decode, ::testing::Values(Case{"qwen3", "f32"}, Case{"qwen3", "bf16"}),
                         case_name);

// Every fixture folder is exercised by some golden test (a new one must be added to a Values() list).
TEST(GoldenFixtures, AllAreCovered) {
  const std::vector<std::string> covered = {"qwen3_moe", "qwen3_moe_nohd", "qwen3"};
  ASSERT_TRUE(std::filesystem::is_directory(kFixtures)) << kFixtures << " is missing";
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    EXPECT_NE(std::find(covered.begin(), covered.end(), name), covered.end())
        << "tests/fixtures/" << name << " has no golden test";
  }
}

}  // namespace
}  // namespace magnetar::golden
