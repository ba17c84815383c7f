// Internal seam between the host code of the backend (matvec.cpp: argument checks, sizes from the trait
// table, C++20) and the kernel files (*.cu, compiled by nvcc as C++17). Plain C++, no CUDA headers.
// Callers have validated every argument: these functions CHECK nothing and only queue kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/cuda_backend.h"
#include "quant/formats.h"

struct CUstream_st;

namespace magnetar::cuda::detail {

// A grouped launch (grouped_matvec in cuda_backend.h): item i of `items` (device memory) computes its weight
// w[part + z] for z < n_parts on output rows row0 .. row0 + n - 1 (n <= MatvecLaunch::n_vectors), reading
// the activation row act_rows[r] for output row r (r itself when act_rows is null) and writing
// y + z * y_part_stride + r * rows. Without items a launch is one plain matvec.
struct Grouping {
  const GroupItem* items = nullptr;
  int n_items = 0;
  int part = 0;
  int n_parts = 1;
  const int32_t* act_rows = nullptr;
  bool single_act = false;  // every output row reads activation row 0 (act_rows not read)
  size_t y_part_stride = 0;
  bool items_settled = false;  // GroupedMatvecArgs::items_settled
  RouteInProducts route = {};  // GroupedMatvecArgs::route (items null; the stationary kernel only)
};
inline bool grouped(const Grouping& g) { return g.items != nullptr || g.route.logits != nullptr; }

// MatvecArgs::split / y_split: rows [0, at[0]) go to y ([n_vectors, at[0]]), [at[0], at[1]) to y[0] ([n_vectors,
// at[1] - at[0]]), the rest to y[1]; y[0] null: no split.
struct YSplit {
  int at[2] = {0, 0};
  float* y[2] = {nullptr, nullptr};
};

// One matrix-vector launch, for quantized (mmvq.cu) and float (matvec_float.cu) weights alike.
struct MatvecLaunch {
  const void* weights = nullptr;  // [rows, row_bytes]
  size_t row_bytes = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  // Quantized weights: [n_vectors, act_row_bytes] blocks of the type's activation format.
  // Float weights: [n_vectors, cols] float32 (act_row_bytes = 4 * cols).
  const void* act = nullptr;
  size_t act_row_bytes = 0;
  float* y = nullptr;  // [n_vectors, rows]
  int n_vectors = 1;
  Grouping group;
  int rows_per_warp = 0;  // MatvecArgs::rows_per_warp (1, 2, 4: mmvq's rows kernel where the type has one)
  bool stationary = false;  // MatvecArgs::stationary (mmvq's stationary kernel where the type and row fit it)
  bool swiglu = false;      // GroupedMatvecArgs::swiglu (stationary kernel only)
  bool act_float = false;   // GroupedMatvecArgs::x_float (stationary kernel only): act is float rows
  bool staged = false;      // MatvecArgs::staged (mmvq's staged kernel where the type and row fit it)
  bool bulk = false;        // GroupedMatvecArgs::bulk (mmvq_bulk.cu where it takes the launch)
  YSplit split;             // plain launches: the stationary kernel writes the parts itself, others launch per part
};

// A launch with a split as one launch per part (its rows, its output), each through launch_part(part).
template <typename F>
void for_each_split_part(const MatvecLaunch& a, F&& launch_part) {
  const int64_t bounds[4] = {0, a.split.at[0], a.split.at[1], a.rows};
  for (int p = 0; p < 3; ++p) {
    MatvecLaunch part = a;
    part.split = {};
    part.weights = static_cast<const uint8_t*>(a.weights) + a.row_bytes * size_t(bounds[p]);
    part.rows = bounds[p + 1] - bounds[p];
    part.y = p == 0 ? a.y : a.split.y[p - 1];
    launch_part(part);
  }
}

// matvec.cpp: whether `type` is an activation format (Q8_0, Q8_1, Q8_K), and the bytes of one row of `cols` of it
// (cols a multiple of its block).
bool is_activation_format(quant::Type type);
size_t act_row_bytes(quant::Type act_type, int64_t cols);

// Whether kernels go out with programmatic dependent launch (ops_common.cuh's launch): on devices of compute
// capability 9.0 and up, unless MAGNETAR_CUDA_PDL=0 (the baseline switch). Read once per process (device_memory.cpp).
// H200, tg128 on the 30B-A3B geometry: 312.5 t/s with it, 281.8 without (docs/benchmarks/2026-11-30-cuda-decode-pdl.md).
bool pdl_enabled();

// Whether decode rows of add_rms_norm / rms_norm go to a cluster of CTAs (rms_norm.cu): on devices with thread-block
// clusters (compute capability 9.0 and up), unless MAGNETAR_CUDA_NORM_CLUSTER=0 (the baseline switch). Read once per
// process (device_memory.cpp).
bool norm_clusters();

// The CTAs of rms_norm.cu's cluster kernel for a decode row, its slices of the row: the order of its sum of squares
// (norm_order.cuh, which norm_matvec.cu restates).
inline constexpr int kNormClusterCtas = 8;

// Whether launches of `kernel` are dropped (MAGNETAR_CUDA_SKIP, a diagnostic: device_memory.cpp).
bool launch_skipped(const void* kernel);

// Weight types with mmvq.cu's rows kernel (MatvecArgs::rows_per_warp): those it was measured on (any type's block dot
// would do).
constexpr bool mmvq_has_rows_kernel(quant::Type type) {
  return type == quant::Type::Q4_K || type == quant::Type::Q8_0;
}

// Weight types with mmvq.cu's activation-stationary kernel (MatvecArgs::stationary), one vector or several (whose
// outputs must be the bits of each alone: a batched decode equals its sessions decoded apart). Q6_K (the output matrix
// and half the layers' attn_v and ffn_down_exps of llama.cpp's Q4_K_M mix) takes it without swiglu: the gate/up form
// would add 14 kernels to mmvq.cu for models that are Q6_K throughout.
constexpr bool mmvq_has_stationary_kernel(quant::Type type) {
  return type == quant::Type::Q4_K || type == quant::Type::Q6_K;
}
constexpr bool mmvq_has_stationary_glu(quant::Type type) { return type == quant::Type::Q4_K; }
// Weight types with mmvq.cu's staged kernel (MatvecArgs::staged).
constexpr bool mmvq_has_staged_kernel(quant::Type type) { return type == quant::Type::Q8_0; }

// Whether a row of `cols` of `type` fits that kernel (mmvq.cu).
bool mmvq_stationary_fits(quant::Type type, int64_t cols);

// mmvq.cu: whether `type` has a quantized kernel, and the launch (a no-op returning false without one).
bool mmvq_supports(quant::Type type);
bool launch_mmvq(quant::Type type, const MatvecLaunch& args, CUstream_st* stream);

// mmvq_bulk.cu: a SwiGLU launch (swiglu, one vector, grouped) or a plain one of float activations over items
// (act_float) with the weights streamed through shared memory by bulk copies, where the type (Q4_K), the row shape
// (the stationary kernel's) and the GPU (sm_90+) take it; false (nothing queued) otherwise.
bool launch_mmvq_bulk(quant::Type type, const MatvecLaunch& args, CUstream_st* stream);

// matvec_float.cu: F32, F16, BF16.
bool matvec_float_supports(quant::Type type);
bool launch_matvec_float(quant::Type type, const MatvecLaunch& args, CUstream_st* stream);

// quantize_q8.cu: x [n_vectors, cols] float32 -> [n_vectors, out_row_bytes] blocks of act_type
// (Q8_0, Q8_1 or Q8_K; cols a multiple of its block size). False for any other act_type.
bool launch_quantize_q8(quant::Type act_type, const float* x, void* out, size_t out_row_bytes, int64_t cols,
                        int64_t n_vectors, CUstream_st* stream);

}  // namespace magnetar::cuda::detail
