// Host side of matvec and quantize_activations: argument checks (every expected failure is a Status that
// names the argument), sizes from the trait table, and the launches (launch.h). Allocates nothing.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/launch.h"
#include "quant/quant.h"

namespace magnetar::cuda {
namespace detail {

size_t act_row_bytes(quant::Type act_type, int64_t cols) { return quant::row_size(act_type, cols); }

bool is_activation_format(quant::Type type) {
  return type == quant::Type::Q8_0 || type == quant::Type::Q8_1 || type == quant::Type::Q8_K;
}

}  // namespace detail

namespace {

using detail::act_row_bytes;
using detail::is_activation_format;

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// Room needed for n_vectors rows of cols activations in the largest format that a cols-wide row can use.
size_t scratch_bytes_for(int64_t cols, int64_t n_vectors) {
  const int64_t cols32 = (cols + quant::kQK32 - 1) / quant::kQK32 * quant::kQK32;
  const int64_t cols256 = (cols + quant::kQK_K - 1) / quant::kQK_K * quant::kQK_K;
  size_t row = quant::row_size(quant::Type::Q8_1, cols32);  // >= Q8_0's
  const size_t row_k = quant::row_size(quant::Type::Q8_K, cols256);
  if (row_k > row) row = row_k;
  return row * size_t(n_vectors);
}

Status check_vectors(const char* op, int64_t n_vectors) {
  if (n_vectors < 1 || n_vectors > kMaxMatvecVectors) {
    return Status::error(format("%s: n_vectors=%lld is outside 1..%lld", op, (long long)n_vectors,
                                (long long)kMaxMatvecVectors));
  }
  return Status();
}

Status check_rows_per_warp(const char* op, int rows_per_warp) {
  if (rows_per_warp != 0 && rows_per_warp != 1 && rows_per_warp != 2 && rows_per_warp != 4) {
    return Status::error(format("%s: rows_per_warp=%d must be 0, 1, 2 or 4", op, rows_per_warp));
  }
  return Status();
}

}  // namespace

// ---- MatvecWorkspace ----------------------------------------------------------------------------------------

Result<MatvecWorkspace> MatvecWorkspace::create(int64_t max_cols, int64_t max_vectors) {
  if (max_cols < 1) return Status::error(format("MatvecWorkspace: max_cols=%lld must be positive", (long long)max_cols));
  MAGNETAR_RETURN_IF_ERROR(check_vectors("MatvecWorkspace", max_vectors));
  MAGNETAR_ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::allocate(scratch_bytes_for(max_cols, max_vectors)));
  MatvecWorkspace ws;
  ws.scratch_ = std::move(scratch);
  ws.max_cols_ = max_cols;
  ws.max_vectors_ = max_vectors;
  return Result<MatvecWorkspace>(std::move(ws));
}

// ---- quantize_activations ------------------------------------------------------------------------------------

Status quantize_activations(quant::Type act_type, const float* x, void* out, int64_t cols, int64_t n_vectors,
                            Stream& stream) {
  if (!is_activation_format(act_type)) {
    const quant::TypeTraits* t = quant::find_traits(uint32_t(act_type));
    return Status::error(format("quantize_activations: %s is not an activation format (Q8_0, Q8_1, Q8_K)",
                                t ? std::string(t->name).c_str() : "an unknown type id"));
  }
  const quant::TypeTraits& t = quant::traits(act_type);
  if (cols < 1 || cols % t.block_size != 0) {
    return Status::error(format("quantize_activations: cols=%lld is not a positive multiple of %s's block of %lld",
                                (long long)cols, std::string(t.name).c_str(), (long long)t.block_size));
  }
  if (n_vectors < 1 || n_vectors > INT_MAX / 8) {
    return Status::error(format("quantize_activations: n_vectors=%lld out of range", (long long)n_vectors));
  }
  if (x == nullptr || out == nullptr) return Status::error("quantize_activations: null device pointer");
  if (!aligned(x, 4) || !aligned(out, 4)) {
    return Status::error("quantize_activations: x and out must be 4-byte aligned device pointers");
  }
  detail::launch_quantize_q8(act_type, x, out, act_row_bytes(act_type, cols), cols, n_vectors, stream.raw());
  return Status();
}

// ---- matvec -----------------------------------------------------------------------------------------------------

Status matvec(const MatvecArgs& args, MatvecWorkspace& workspace, Stream& stream) {
  const quant::TypeTraits* t = quant::find_traits(uint32_t(args.type));
  if (t == nullptr) {
    return Status::error(format("matvec: weight type id %u is unknown or not implemented", unsigned(args.type)));
  }
  const std::string name(t->name);
  const bool quantized = detail::mmvq_supports(args.type);
  if (!quantized && !detail::matvec_float_supports(args.type)) {
    return Status::error(format("matvec: no CUDA kernel for %s weights%s", name.c_str(),
                                quant::is_weight_type(args.type) ? "" : " (an activation-only format)"));
  }
  if (args.rows < 1 || args.rows > INT_MAX) {
    return Status::error(format("matvec: rows=%lld is outside 1..%d", (long long)args.rows, INT_MAX));
  }
  // The kernels index a row's elements (float types) and block parts (quantized types) with int.
  if (args.cols < 1 || args.cols % t->block_size != 0 || args.cols > INT_MAX / 8) {
    return Status::error(format("matvec: cols=%lld is not a positive multiple of %s's block of %lld (at most %d)",
                                (long long)args.cols, name.c_str(), (long long)t->block_size, INT_MAX / 8));
  }
  MAGNETAR_RETURN_IF_ERROR(check_vectors("matvec", args.n_vectors));
  MAGNETAR_RETURN_IF_ERROR(check_rows_per_warp("matvec", args.rows_per_warp));
  if (args.x_quantized != nullptr && !quantized) {
    return Status::error(format("matvec: x_quantized is for quantized weight types, not %s", name.c_str()));
  }
  const void* x = args.x_quantized != nullptr ? args.x_quantized : static_cast<const void*>(args.x);
  if (args.weights == nullptr || x == nullptr || args.y == nullptr) {
    return Status::error("matvec: null device pointer (weights, x or y)");
  }
  if (!aligned(args.weights, 16)) return Status::error("matvec: weights must be 16-byte aligned");
  const bool split = args.y_split[0] != nullptr;
  if (split && !(0 < args.split[0] && args.split[0] < args.split[1] && args.split[1] < args.rows &&
                 args.y_split[1] != nullptr && aligned(args.y_split[0], 4) && aligned(args.y_split[1], 4))) {
    return Status::error(format("matvec: split {%lld, %lld} of %lld rows needs 0 < split[0] < split[1] < rows and "
                                "two 4-byte aligned y_split outputs",
                                (long long)args.split[0], (long long)args.split[1], (long long)args.rows));
  }
  // Each part's rows start 16-byte aligned where the parts run as launches of their own.
  const size_t row_bytes = quant::row_size(args.type, args.cols);
  if (split && (row_bytes * size_t(args.split[0]) % 16 != 0 || row_bytes * size_t(args.split[1]) % 16 != 0)) {
    return Status::error("matvec: split rows must start 16-byte aligned in the weights");
  }
  if (!aligned(x, 4) || !aligned(args.y, 4))
    return Status::error("matvec: x (or x_quantized) and y must be 4-byte aligned");

  detail::MatvecLaunch launch{
      .weights = args.weights,
      .row_bytes = row_bytes,
      .rows = args.rows,
      .cols = args.cols,
      .act = args.x,
      .act_row_bytes = size_t(args.cols) * sizeof(float),
      .y = args.y,
      .n_vectors = int(args.n_vectors),
      .group = {},
      .rows_per_warp = args.rows_per_warp,
      .stationary = args.stationary,
      .staged = args.staged,
      .split = split ? detail::YSplit{.at = {int(args.split[0]), int(args.split[1])},
                                      .y = {args.y_split[0], args.y_split[1]}}
                     : detail::YSplit{},
  };
  if (!quantized) {
    if (split) {
      detail::for_each_split_part(launch, [&](const detail::MatvecLaunch& part) {
        detail::launch_matvec_float(args.type, part, stream.raw());
      });
      return Status();
    }
    detail::launch_matvec_float(args.type, launch, stream.raw());
    return Status();
  }

  const quant::Type act_type = t->vec_dot_type;
  launch.act_row_bytes = act_row_bytes(act_type, args.cols);
  if (args.x_quantized != nullptr) {
    launch.act = args.x_quantized;
    detail::launch_mmvq(args.type, launch, stream.raw());
    return Status();
  }
  if (args.cols > workspace.max_cols() || args.n_vectors > workspace.max_vectors()) {
    return Status::error(format("matvec: %lld x %lld activations exceed the workspace (%lld x %lld)",
                                (long long)args.n_vectors, (long long)args.cols,
                                (long long)workspace.max_vectors(), (long long)workspace.max_cols()));
  }
  launch.act = workspace.scratch();
  detail::launch_quantize_q8(act_type, args.x, workspace.scratch(), launch.act_row_bytes, args.cols,
                             args.n_vectors, stream.raw());
  detail::launch_mmvq(args.type, launch, stream.raw());
  return Status();
}

bool has_matvec_rows_kernel(quant::Type type) { return detail::mmvq_has_rows_kernel(type); }
bool has_matvec_stationary_kernel(quant::Type type) { return detail::mmvq_has_stationary_kernel(type); }
bool has_matvec_swiglu(quant::Type type) { return detail::mmvq_has_stationary_glu(type); }
bool matvec_stationary_fits(quant::Type type, int64_t cols) { return detail::mmvq_stationary_fits(type, cols); }

// ---- grouped_matvec ---------------------------------------------------------------------------------------------

Status grouped_matvec(const GroupedMatvecArgs& args, Stream& stream) {
  const quant::TypeTraits* t = quant::find_traits(uint32_t(args.type));
  const bool quantized = t != nullptr && detail::mmvq_supports(args.type);
  if (t == nullptr || (!quantized && !detail::matvec_float_supports(args.type))) {
    return Status::error(format("grouped_matvec: no CUDA kernel for weight type id %u", unsigned(args.type)));
  }
  if (args.n_items < 1 || args.n_items > 65535) {
    return Status::error(format("grouped_matvec: n_items=%lld is outside 1..65535", (long long)args.n_items));
  }
  if (args.part < 0 || args.n_parts < 1 || args.n_parts > 2 || args.part + args.n_parts > 3) {
    return Status::error(format("grouped_matvec: parts %d..%d are not within gate, up, down", args.part,
                                args.part + args.n_parts - 1));
  }
  if (args.rows < 1 || args.rows > INT_MAX || args.cols < 1 || args.cols % t->block_size != 0 ||
      args.cols > INT_MAX / 8) {
    return Status::error(format("grouped_matvec: %lld x %lld is not a shape of whole %s blocks", (long long)args.rows,
                                (long long)args.cols, std::string(t->name).c_str()));
  }
  MAGNETAR_RETURN_IF_ERROR(check_vectors("grouped_matvec", args.max_n));
  MAGNETAR_RETURN_IF_ERROR(check_rows_per_warp("grouped_matvec", args.rows_per_warp));
  const RouteInProducts& route = args.route;
  if (route.logits != nullptr) {
    if (args.items != nullptr || route.n_expert < 1 || route.n_expert > kMaxRoutedExperts || route.k < 1 ||
        route.k > std::min(route.n_expert, kMaxRoutedK) || args.n_items != route.k || route.base == nullptr ||
        !aligned(route.base, 16) || route.stride % 16 != 0 || args.max_n != 1 || !args.stationary ||
        !quantized || !detail::mmvq_stationary_fits(args.type, args.cols)) {
      return Status::error(format("grouped_matvec: route needs no items, n_expert in 1..%d, n_items = k <= %d, a "
                                  "16-byte aligned expert buffer and the stationary kernel (max_n 1, a %s row of "
                                  "%lld columns that it takes)",
                                  kMaxRoutedExperts, kMaxRoutedK, std::string(t->name).c_str(), (long long)args.cols));
    }
    for (int p = args.part; p < args.part + args.n_parts; ++p) {
      if (route.offset[p] % 16 != 0) return Status::error("grouped_matvec: route offsets must be 16-byte aligned");
    }
    if (route.ids != nullptr && (route.weights == nullptr || route.slot_rows == nullptr)) {
      return Status::error("grouped_matvec: route ids need weights and slot_rows");
    }
  } else if (args.items == nullptr) {
    return Status::error("grouped_matvec: null device pointer (items)");
  }
  if (args.x == nullptr || args.y == nullptr) return Status::error("grouped_matvec: null device pointer (x or y)");
  if (!aligned(args.items, alignof(GroupItem)) || !aligned(args.x, args.x_float ? 16 : 4) || !aligned(args.y, 4)) {
    return Status::error("grouped_matvec: items, x and y must be aligned");
  }
  if ((args.swiglu || args.x_float) &&
      (!args.stationary || args.max_n != 1 || !detail::mmvq_stationary_fits(args.type, args.cols) ||
       (args.swiglu && !detail::mmvq_has_stationary_glu(args.type)))) {
    return Status::error(
        format("grouped_matvec: swiglu / x_float need the stationary kernel (stationary, max_n=1, "
               "a %s row of %lld columns that it takes; swiglu: Q4_K)",
               std::string(t->name).c_str(), (long long)args.cols));
  }
  if (args.swiglu && args.n_parts != 2) {
    return Status::error(format("grouped_matvec: swiglu needs gate and up (n_parts=2, not %d)", args.n_parts));
  }
  detail::MatvecLaunch launch{
      .weights = nullptr,
      .row_bytes = quant::row_size(args.type, args.cols),
      .rows = args.rows,
      .cols = args.cols,
      .act = args.x,
      .act_row_bytes =
          quantized && !args.x_float ? act_row_bytes(t->vec_dot_type, args.cols) : size_t(args.cols) * sizeof(float),
      .y = args.y,
      .n_vectors = int(args.max_n),
      .group = {.items = args.items,
                .n_items = int(args.n_items),
                .part = args.part,
                .n_parts = args.n_parts,
                .act_rows = args.x_rows,
                .single_act = args.single_x,
                .y_part_stride = size_t(args.y_part_stride),
                .items_settled = args.items_settled,
                .route = args.route},
      .rows_per_warp = args.rows_per_warp,
      .stationary = args.stationary,
      .swiglu = args.swiglu,
      .act_float = args.x_float,
      .bulk = args.bulk,
      .split = {},
  };
  if (quantized) {
    detail::launch_mmvq(args.type, launch, stream.raw());
  } else {
    detail::launch_matvec_float(args.type, launch, stream.raw());
  }
  return Status();
}

}  // namespace magnetar::cuda
