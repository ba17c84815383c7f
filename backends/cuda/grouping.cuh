// The CTA prologue of a grouped matrix-vector launch (launch.h's Grouping), shared by mmvq.cu and
// matvec_float.cu: which weights, output rows and activation rows this CTA's item names.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backends/cuda/launch.h"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::detail {

// For a grouped launch: points *weights at item blockIdx.y's part (part + blockIdx.z), sets its first output row
// and vector count and moves y to the part's outputs. False when that weight is null ("not on this device"): the
// whole CTA then returns without writing. A plain launch (no items) keeps its arguments and row 0.
// (Templates so that the kernels' __restrict__ pointers bind by reference.)
template <typename WeightPtr, typename OutPtr>
__device__ __forceinline__ bool resolve_group(const Grouping& g, WeightPtr& weights, int& row0, int& n_vectors,
                                              OutPtr& y) {
  row0 = 0;
  if (g.items == nullptr) return true;
  const GroupItem& item = g.items[blockIdx.y];
  weights = static_cast<const uint8_t*>(item.w[g.part + int(blockIdx.z)]);
  if (weights == nullptr) return false;
  row0 = item.row0;
  n_vectors = item.n;
  y += size_t(blockIdx.z) * g.y_part_stride;
  return true;
}

// The first thing a matrix-vector CTA does (programmatic dependent launch, ops_common.cuh): a plain launch's weights
// are no kernel's output, so thread 0 asks L2 for the CTA's rows [first, first + count) (clipped to rows) while the
// kernel before it may still run; then every thread waits for that kernel (items, activations and y are written by
// earlier kernels) and lets the next one start. A grouped launch learns its weights from its item: it only waits.
__device__ __forceinline__ void matvec_prologue(const Grouping& g, const uint8_t* weights, size_t row_bytes, int first,
                                                int count, int rows) {
  if (g.items == nullptr && threadIdx.x == 0 && first < rows) {
    const int n = first + count < rows ? count : rows - first;
    ops::prefetch_l2(weights + size_t(first) * row_bytes, size_t(n) * row_bytes);
  }
  ops::pdl_wait();
  ops::pdl_trigger();
}

// The activation row that output row r reads.
__device__ __forceinline__ size_t group_act_row(const Grouping& g, int r) {
  if (g.single_act) return 0;
  return size_t(g.act_rows != nullptr ? g.act_rows[r] : r);
}

}  // namespace magnetar::cuda::detail
