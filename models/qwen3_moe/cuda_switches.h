// The CUDA forward pass's diagnostic switches (qwen3_moe_cuda.cpp; STYLE.md rule 17): which kernels and fusions it
// takes, read from the environment once per process (refuse_captures at each capture). Turned off they are the
// baselines that the benchmark records measure against.
#pragma once

#include <cstdlib>
#include <string_view>
#include <utility>

#include "quant/quant.h"

namespace magnetar::models::qwen3_cuda {

// A diagnostic switch (STYLE.md rule 17): on unless the environment variable is "0".
inline bool switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string_view(v) != "0";
}

// The tiered mode's pool copies on their own stream, overlapped with the hits' compute. MAGNETAR_CUDA_TIER_OVERLAP=0
// (diagnostic) queues them on the compute stream before the layer's launches: the baseline of
// docs/benchmarks/2026-12-01-cuda-tier-overlap.md.
inline bool tier_overlap() {
  static const bool on = switch_on("MAGNETAR_CUDA_TIER_OVERLAP");
  return on;
}

// The pool's misses already in host memory are copied up before waiting for the disk reads of the others.
// MAGNETAR_CUDA_TIER_READY_FIRST=0 (diagnostic) copies them after that wait: the baseline of
// docs/benchmarks/2026-12-01-cuda-tier-ready-first.md.
inline bool copy_ready_first() {
  static const bool on = switch_on("MAGNETAR_CUDA_TIER_READY_FIRST");
  return on;
}

// The CPU expert lane takes only as many of a layer's cold misses as keep it within the time the bus needs for the
// others (experts::LaneBalance, from the measured times of both). MAGNETAR_CUDA_LANE_BALANCE=0 (diagnostic) gives it
// every cold miss: the baseline of docs/benchmarks/2026-12-04-cuda-tier-lane-balance.md.
inline bool lane_balance() {
  static const bool on = switch_on("MAGNETAR_CUDA_LANE_BALANCE");
  return on;
}

// Products of more than kVec rows go to the int8 tensor-core kernel (mmq.cu) when it takes the weight type, float
// weights (the router) to matmul_float.cu. MAGNETAR_CUDA_MMQ=0 keeps both on the matrix-vector kernels in chunks
// of kVec rows: the baseline of docs/benchmarks/2026-11-30-cuda-forward.md's mmq section.
inline bool mmq_enabled() {
  static const bool enabled = switch_on("MAGNETAR_CUDA_MMQ");
  return enabled;
}

// Decode steps (every sequence one new token, every weight resident) replay a CUDA graph of the whole forward pass,
// captured once per batch shape (the sequences' KV mirrors): one launch instead of ~1,100. MAGNETAR_CUDA_GRAPH=0
// launches every kernel from the host: the graph's baseline.
inline bool graphs_enabled() {
  static const bool enabled = switch_on("MAGNETAR_CUDA_GRAPH");
  return enabled;
}
// A step with drafts (speculative decoding: Session::step(id, drafts), a few tokens of one sequence, every row's
// logits) replays a graph too, captured per token count. MAGNETAR_CUDA_GRAPH_DRAFTS=0 launches its kernels from the
// host: the baseline of docs/benchmarks/2026-12-05-lookup-graph.md.
inline bool draft_graphs_enabled() {
  static const bool enabled = switch_on("MAGNETAR_CUDA_GRAPH_DRAFTS");
  return enabled;
}
// A session's logits land in its page-locked row (CudaWorkspace). MAGNETAR_CUDA_LOGITS_ROW=0 gives the sessions no
// such row (ordinary memory, which the driver copies into through its staging buffers): the baseline of
// docs/benchmarks/2026-12-02-cuda-decode-host.md.
inline bool logits_row_enabled() {
  static const bool enabled = switch_on("MAGNETAR_CUDA_LOGITS_ROW");
  return enabled;
}

// MAGNETAR_CUDA_GRAPH=refuse (a test switch, read at each capture): every decode graph is recorded and then refused,
// as a driver refusing the capture would, so the fallback to launching kernel by kernel runs.
inline bool refuse_captures() {
  const char* v = std::getenv("MAGNETAR_CUDA_GRAPH");
  return v != nullptr && std::string_view(v) == "refuse";
}

// Launches folded into others, each one launch fewer per layer and decode token:
//   kCombine     the MoE combine in the next add_rms_norm (AddRmsNormArgs::residual_rows);
//   kNormQuant   a norm whose output feeds quantized products writes the quantized rows too (y_quantized);
//   kSwigluQuant the MoE's swiglu quantizes for the down projection (swiglu_quantize);
//   kAttnQuant   decode attention quantizes its output for the output projection (AttentionArgs::out_q8k);
//   kSwigluMmvq  decode's swiglu inside the experts' gate/up product, the down projection quantizing its float input
//                (GroupedMatvecArgs::swiglu, x_float: where mmvq's stationary kernel takes both shapes);
//   kAttnPrepare a decode token's q/k norm, RoPE and K/V stores (qkv_prepare) inside its attention launch
//                (AttentionArgs::prepare);
//   kAttnSeqs    a batched decode's sequences in one attention launch (AttentionArgs::seq_k), not one each.
// MAGNETAR_CUDA_FUSE picks them: a comma list of combine, norm, cluster, swiglu, attn, mmvq, prepare, seqs; 1 for all,
// 0 for none; unset: the default set, combine, cluster (the norm's quantization where the norm runs on a cluster of
// CTAs, kNormQuantCluster: cuda::norm_in_cluster, decode rows), swiglu, attn, mmvq, prepare, seqs. H200, tg128 (run.sh
// --decode-bench, two rounds of one call each): combine + swiglu 416.4 / 416.4 t/s against combine 412.1 / 409.6,
// combine + norm on the one-CTA row kernel 411.5 / 406.5 (swiglu_quantize with a CTA per Q8_K block; with a warp per
// block it had cost 3%: docs/benchmarks/2026-11-30-cuda-decode-pdl.md); with the norm on clusters, the default 443.1 /
// 442.7 against 438.2 / 439.8 without attn and 425.8 / 423.8 without the norm's quantization
// (docs/benchmarks/2026-12-01-cuda-decode-norm-cluster.md); with mmvq 476.6 / 469.8 against 459.6 / 456.4
// (docs/benchmarks/2026-12-01-cuda-decode-stationary-mmvq.md); with prepare 596.0-598.4 against 574.8-575.1
// (docs/benchmarks/2026-12-02-cuda-decode-prepare-in-attention.md); with seqs 4 sessions decode 975 t/s in all against
// 811, 8 sessions 1,178 against 931 (docs/benchmarks/2026-12-02-cuda-decode-sessions-attention.md).
enum class Fusion {
  kCombine = 1,
  kNormQuant = 2,
  kSwigluQuant = 4,
  kNormQuantCluster = 8,
  kAttnQuant = 16,
  kSwigluMmvq = 32,
  kAttnPrepare = 64,
  kAttnSeqs = 128
};
inline bool fused(Fusion f) {
  static const int set = [] {
    const char* v = std::getenv("MAGNETAR_CUDA_FUSE");
    if (v == nullptr) {
      return int(Fusion::kCombine) | int(Fusion::kSwigluQuant) | int(Fusion::kNormQuantCluster) |
             int(Fusion::kAttnQuant) | int(Fusion::kSwigluMmvq) | int(Fusion::kAttnPrepare) | int(Fusion::kAttnSeqs);
    }
    const std::string_view s = v;
    if (s == "1") {
      return int(Fusion::kCombine) | int(Fusion::kNormQuant) | int(Fusion::kSwigluQuant) | int(Fusion::kAttnQuant) |
             int(Fusion::kSwigluMmvq) | int(Fusion::kAttnPrepare) | int(Fusion::kAttnSeqs);
    }
    int bits = 0;
    for (const auto& [name, bit] : {std::pair{"combine", Fusion::kCombine}, std::pair{"norm", Fusion::kNormQuant},
                                    std::pair{"cluster", Fusion::kNormQuantCluster},
                                    std::pair{"swiglu", Fusion::kSwigluQuant}, std::pair{"attn", Fusion::kAttnQuant},
                                    std::pair{"mmvq", Fusion::kSwigluMmvq},
                                    std::pair{"prepare", Fusion::kAttnPrepare}, std::pair{"seqs", Fusion::kAttnSeqs}}) {
      if (s.find(name) != std::string_view::npos) bits |= int(bit);
    }
    return bits;
  }();
  return (set & int(f)) != 0;
}

// The single-vector products of weight types with mmvq's rows kernel (Q4_K, Q8_0) take it with one row per warp,
// short rows with 4 (MatvecArgs::rows_per_warp): tg128 315.0 t/s against 290.0 with the default kernel (H200,
// run.sh --decode-bench, 2026-11-30). MAGNETAR_CUDA_MMVQ_ROWS=0 is the default kernel (the baseline), =2 or =4 ask
// that many rows per warp for long rows too (slower: 306.6 and 284.6 against 315.4).
inline int mmvq_rows_per_warp() {
  static const int rows = [] {
    const char* v = std::getenv("MAGNETAR_CUDA_MMVQ_ROWS");
    const std::string_view s = v != nullptr ? v : "1";
    return s == "1" ? 1 : s == "2" ? 2 : s == "4" ? 4 : 0;
  }();
  return rows;
}

// Q4_K and Q6_K products of 1-8 vectors take mmvq's activation-stationary kernel where the row fits it
// (MatvecArgs::stationary); MAGNETAR_CUDA_MMVQ_STATIONARY=0 is the baseline (the rows kernel): tg128 461.9 / 461.3
// against 451.7 / 451.1 (H200, docs/benchmarks/2026-12-01-cuda-decode-stationary-mmvq.md).
// Q6_K products (llama.cpp's Q4_K_M mix: the output matrix, half the layers' attn_v and ffn_down) take it too, and so
// the decode fusions that need it on those layers; MAGNETAR_CUDA_MMVQ_STATIONARY_Q6K=0 is that baseline (the rows
// kernel for Q6_K): docs/benchmarks/2026-12-05-cuda-q4km.md.
inline bool mmvq_stationary(quant::Type type) {
  static const bool on = switch_on("MAGNETAR_CUDA_MMVQ_STATIONARY");
  static const bool q6k = switch_on("MAGNETAR_CUDA_MMVQ_STATIONARY_Q6K");
  return on && (q6k || type != quant::Type::Q6_K);
}

// Single-vector Q8_0 products (the LM head) take mmvq's staged kernel where the row fits it (MatvecArgs::staged);
// MAGNETAR_CUDA_MMVQ_STAGED=0 is the baseline (the rows kernel): the LM head 115.8 us per token against 131.7 (H200).
inline bool mmvq_staged() {
  static const bool on = switch_on("MAGNETAR_CUDA_MMVQ_STAGED");
  return on;
}

// Decode's norm before an MoE layer runs inside the router's product (cuda::add_rms_norm_matvec: one launch and its
// boundary fewer per layer); MAGNETAR_CUDA_NORM_ROUTER=0 is the baseline (add_rms_norm, then the router's matvec):
// tg128 493.4 / 493.6 against 470.7 / 477.7 (H200, docs/benchmarks/2026-12-01-cuda-decode-norm-in-router.md).
inline bool norm_router() {
  static const bool on = switch_on("MAGNETAR_CUDA_NORM_ROUTER");
  return on;
}

// The down projection's stationary kernel loads its expert weights before waiting for swiglu (the items came from
// route_topk, two launches earlier: GroupedMatvecArgs::items_settled); MAGNETAR_CUDA_SETTLED=0 is the baseline (tg128
// 479.6 / 479.6 against 462.6 / 458.0, H200, docs/benchmarks/2026-12-01-cuda-decode-stationary-mmvq.md).
inline bool settled_items() {
  static const bool on = switch_on("MAGNETAR_CUDA_SETTLED");
  return on;
}

// A decode token's expert products route themselves (GroupedMatvecArgs::route: gate/up ranks the router's logits,
// writes the combine's ids and weights, and the down projection ranks them again before waiting): no route_topk
// launch; MAGNETAR_CUDA_ROUTE_IN_PRODUCTS=0 is the baseline (route_topk, then the products read its items): tg128
// 497.8 / 493.9 / 497.0 against 483.7 / 477.0 / 480.0 (H200,
// docs/benchmarks/2026-12-02-cuda-decode-route-in-products.md).
inline bool route_in_products() {
  static const bool on = switch_on("MAGNETAR_CUDA_ROUTE_IN_PRODUCTS");
  return on;
}

// A decode token's expert gate/up (one token, routed in the products) streams its weights through shared memory by
// bulk copies (GroupedMatvecArgs::bulk); MAGNETAR_CUDA_EXPERTS_BULK=0 is the baseline (the stationary kernel's SwiGLU
// launch): tg128 570.6 / 570.2 / 571.2 against 547.2 / 543.9 / 549.2 (H200,
// docs/benchmarks/2026-12-02-cuda-decode-bulk-experts.md).
inline bool experts_bulk() {
  static const bool on = switch_on("MAGNETAR_CUDA_EXPERTS_BULK");
  return on;
}

// The q/k/v products of a few tokens (the batched decode of several sessions) are one launch of the merged matrix
// whose rows split into q, k and v (MatvecArgs::split); MAGNETAR_CUDA_QKV_ONE=0 is the baseline (three launches):
// 1,117 / 1,375 t/s for 4 / 8 sessions against 1,048 / 1,295 (H200,
// docs/benchmarks/2026-12-03-cuda-batched-bulk-ring.md).
inline bool qkv_one_launch() {
  static const bool on = switch_on("MAGNETAR_CUDA_QKV_ONE");
  return on;
}

// The batched decode of several sessions (one item per token and slot, every expert resident) takes the bulk kernels
// for gate/up and down too, their CTAs' rows streamed through a ring of shared-memory stages;
// MAGNETAR_CUDA_EXPERTS_BULK_ITEMS=0 is the baseline (the stationary kernel; the bulk gate/up's first form, all of a
// CTA's rows staged at once, was slower there: 697 t/s against 739 for 4 sessions). Both rings: 1,050 / 1,307 t/s for
// 4 / 8 sessions against 976 / 1,180 (H200, docs/benchmarks/2026-12-03-cuda-batched-bulk-ring.md).
inline bool experts_bulk_items() {
  static const bool on = experts_bulk() && switch_on("MAGNETAR_CUDA_EXPERTS_BULK_ITEMS");
  return on;
}

}  // namespace magnetar::models::qwen3_cuda
