// Qwen3-MoE against transformers (tests/golden/golden_util.h has the method and thresholds):
//   qwen3_moe       4 layers, 8 experts top-2 with norm_topk_prob, layer 1 dense (mlp_only_layers), head_dim given
//   qwen3_moe_nohd  2 layers, no head_dim in config.json (hidden / heads), decoder_sparse_step 2 (layer 0 dense),
//                   one KV head, rope_theta 1e4
#include "tests/golden/golden_util.h"

namespace magnetar::golden {
namespace {

class Qwen3MoeGolden : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3MoeGolden, MatchesTransformers) { check_against_reference(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Golden, Qwen3MoeGolden,
                         ::testing::Values(Case{"qwen3_moe", "f32"}, Case{"qwen3_moe", "bf16"},
                                           Case{"qwen3_moe", "q8_0"}, Case{"qwen3_moe_nohd", "f32"},
                                           Case{"qwen3_moe_nohd", "bf16"}, Case{"qwen3_moe_nohd", "q8_0"}),
                         case_name);

class Qwen3MoeDecode : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3MoeDecode, MatchesPrefill) { check_decode_matches_prefill(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Golden, Qwen3MoeDecode,
                         ::testing::Values(Case{"qwen3_moe", "f32"}, Case{"qwen3_moe", "bf16"},
                                           Case{"qwen3_moe_nohd", "f32"}),
                         case_name);

class Qwen3MoeCuda : public ::testing::TestWithParam<Case> {};

TEST_P(Qwen3MoeCuda, MatchesCpu) { check_cuda_matches_cpu(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Golden, Qwen3MoeCuda,
                         ::testing::Values(Case{"qwen3_moe", "f32"}, Case{"qwen3_moe", "bf16"},
                                           Case{"qwen3_moe_nohd", "f32"}, Case{"qwen3_moe_nohd", "bf16"}),
                         case_name);

}  // namespace
}  // namespace magnetar::golden
