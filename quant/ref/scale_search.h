// Building blocks of the K-quant reference quantizers: ggml's rounding rule, the two scale searches
// its reference quantizers use, and the 12-byte packing of 6-bit scales and mins (Q4_K, Q5_K).
//
// The searches reproduce the float operation order of llama.cpp's quantize_row_*_ref so that, fed the same
// float32 source, Magnetar writes the same bytes as llama-quantize without an importance matrix. That
// equality is how the quantizers are verified against the conformance vectors, so change an expression
// here only together with a re-run of that comparison.
//
// Scalar code only: include this header from quant/ref and from tests, never from an ISA-flagged kernel file
// (its inline functions would be compiled with AVX flags there; see backends/cpu/kernels.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace magnetar::quant::ref {

// ggml's nearest_int: round to nearest, ties to even, valid for |v| < 2^22. Adding 1.5 * 2^23 moves the
// integer part of v into the low mantissa bits, where the FPU's round-to-nearest-even already rounded it.
// Bit-for-bit what SIMD code gets from cvtps_epi32 under the default rounding mode.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.f;  // 1.5 * 2^23
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

// Groups whose largest magnitude is below this are stored as all-zero (ggml's GROUP_MAX_EPS).
inline constexpr float kGroupMaxEps = 1e-15f;
// The longest group any search handles (a Q4_K/Q5_K sub-block).
inline constexpr int kMaxSearchGroup = 32;

// ---- asymmetric search: x ~= scale * L - min, L in [0, nmax] -----------------------------------------------
// ggml's make_qkx2_quants. Starts from the min/max grid, then tries nstep+1 alternative grids with
// iscale = (nmax + rmin + rdelta * is) / (max - min) and, for each, the weighted least-squares scale and
// offset of the rounded levels; keeps whichever has the smallest weighted error (squared, or absolute when
// use_mad). The offset is never positive: a group of positive values keeps min = 0.
struct MinScaleSearch {
  int n = 0;         // elements in the group, 1..kMaxSearchGroup
  int nmax = 0;      // largest level: 3 (Q2_K), 15 (Q4_K), 31 (Q5_K)
  float rmin = 0;    // first trial offset of the level count
  float rdelta = 0;  // step between trials
  int nstep = 0;     // trials after the first; < 1 keeps the min/max grid
  bool use_mad = false;
};
// x[n], weights[n] (non-negative) in; levels[n] out. Returns the scale; *neg_min receives -offset (>= 0),
// the value the K-quant formats store as "min".
float search_scale_min(const MinScaleSearch& params, const float* x, const float* weights, uint8_t* levels,
                       float* neg_min);

// ---- symmetric search: x ~= scale * (L - nmax), L in [0, 2 * nmax) -----------------------------------------
// ggml's make_qx_quants with rmse_type 1: starts from the grid that maps the largest-magnitude element to
// -nmax, tries 18 nearby grids (nmax +- 0.1 * is), and keeps the least-squares scale of the best fit under
// weights w = weights[i], or x[i]^2 when weights is null. A group with max |x| < kGroupMaxEps gets all
// levels 0 and scale 0. The returned scale usually has the opposite sign of the largest-magnitude element.
float search_scale_symmetric(int n, int nmax, const float* x, const float* weights, int8_t* levels);

// ---- 6-bit scales and mins in 12 bytes (Q4_K, Q5_K) ------------------------------------------------------
// Layout (values 0..63, j = sub-block 0..7):
//   bytes 0-3:  scale[j]  in bits 0-5 for j < 4;  bits 6-7 hold bits 4-5 of scale[j+4]
//   bytes 4-7:  min[j]    in bits 0-5 for j < 4;  bits 6-7 hold bits 4-5 of min[j+4]
//   bytes 8-11: bits 0-3 of scale[j+4] in the low nibble, bits 0-3 of min[j+4] in the high nibble
// Inputs above 63 are a programmer error (CHECKed).
void pack_scales_mins_k4(const uint8_t scales[8], const uint8_t mins[8], uint8_t packed[12]);
// Sub-block j's scale and min (ggml's get_scale_min_k4).
inline void unpack_scale_min_k4(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = uint8_t((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    *min = uint8_t((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

}  // namespace magnetar::quant::ref
