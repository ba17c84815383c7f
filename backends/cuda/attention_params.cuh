// The parameters of the attention kernels, which attention.cu's host code fills (make_params) for either of its two
// kernels: attention_decode_mma's on tensor cores (attention.cu) and attention()'s on FP32 cores
// (attention_fp32.cu, launched through launch_fp32 below).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"

namespace magnetar::cuda::attn {

struct Params {
  const float* q;     // [n_tok, n_head, head_dim]
  const uint16_t* k;  // [n_ctx, n_head_kv, head_dim]
  const uint16_t* v;
  float* out;       // [n_tok, n_head, head_dim]
  float* partials;  // [n_head, n_splits, head_dim + 2] (n_splits > 1 only)
  int64_t kv_row;   // elements per cached position: n_head_kv * head_dim
  int64_t pos0;
  int64_t window;
  int n_head;
  int head_dim;
  int group;
  int chunks_per_split;
  int n_splits;
  float scale;
  // Decode in a CUDA graph: pos0 read here at run time, the plan made on the device (plan_splits with
  // sm_count and max_splits); the grid has room for the largest plan.
  const int32_t* pos0_device;
  int sm_count;
  int max_splits;
  // attention_decode_mma's plan (attn::plan_decode_rows of the decode_want splits aimed at; rows_per_split INT_MAX with
  // one split) and its per-KV-head tickets (workspace, zero between launches; a set per token of several sequences).
  int rows_per_split;
  int decode_want;
  unsigned* tickets;
  // attention_decode_mma: the output also as Q8_K rows (AttentionArgs::out_q8k), or null.
  uint8_t* out_q8k;
  size_t q8k_row_bytes;
  // attention_decode_mma with AttentionArgs::prepare (prep_k non-null): q holds the raw projections, the kernel norms
  // and rotates them and the split holding row pos0 stores the token's K and V there.
  const float* prep_q_weight;
  const float* prep_k;
  const float* prep_k_weight;
  const float* prep_v;
  const float* prep_rope;
  float prep_eps;
  // attention_decode_mma over several sequences (AttentionArgs::seq_k: the kSeqs kernels): token z's caches, its
  // position pos0_device[z]. split_stride: records per (token, head) in partials (the grid's splits).
  const uint16_t* seq_k[kMaxDecodeSeqs];
  const uint16_t* seq_v[kMaxDecodeSeqs];
  int seq_tok[kMaxDecodeSeqs];  // grid z's token row (AttentionArgs::seq_tok)
  const int32_t* fresh_row;     // AttentionArgs::fresh_row
  // > 0 (drafts of one sequence, AttentionArgs::fresh_row): the grid is (splits x tokens_in_x, n_head_kv, 1), CTA x
  // taking split x / tokens_in_x of token x % tokens_in_x, so that the tokens' CTAs of the same rows run at the same
  // time and all but one find the rows in L2 (grid z holds the token otherwise).
  int tokens_in_x;
  // > 0 (drafts of one sequence, kHT 2 kernels, groups of 8): this many tokens, taken in position pairs (an even
  // position and the next) by one CTA each, the pair's query heads as the two head tiles (attention_decode_mma's
  // pairs): the cached rows are read once for both. Grid z (or x, tokens_in_x) is then the pair: pair_tokens / 2 + 1
  // of them, the first token alone where its position is odd.
  int pair_tokens;
  int split_stride;
  // attention_decode_mma's combine of many splits (the kernel's kChunkSplits): kCombineChunks, or kCombineSpread where
  // the grid fits one wave of CTAs (its last CTAs share the combine); kCombineBatches: the last CTA in batches of 8
  // splits (MAGNETAR_CUDA_ATTN_COMBINE=0).
  int combine;
  uint64_t spin_ns;  // how long a combining CTA waits for the last split before it leaves its chunk to the last CTA
};

// attention()'s kernels (attention_fp32.cu): the one for p.group (<= 4, 8 or 16 query heads per KV head) over grid
// (splits, n_head_kv, n_tok), then, with grid_splits > 1, the launch that merges each query head's splits.
void launch_fp32(const Params& p, dim3 grid, cudaStream_t stream);
void launch_fp32_combine(const Params& p, int grid_splits, int64_t n_head, cudaStream_t stream);

}  // namespace magnetar::cuda::attn
