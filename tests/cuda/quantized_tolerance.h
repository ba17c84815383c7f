// The rounding bound of the quantized matrix products against the reference vec_dot, shared by the device tests
// (cuda_mmvq_test.cpp, cuda_mmq_test.cpp through cuda_test_util.h) and the host tests of the per-type block
// arithmetic (cuda_mmvq_host_test.cu, cuda_mmq_host_test.cu, compiled by nvcc as C++17: plain C++ only here).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace magnetar::cuda_test {

// How far a quantized product may be from the reference vec_dot. Both compute sum_k t_k over float terms t_k:
// per block or block part (mmvq) or slice (mmq) an exact integer dot times float scales, plus min/offset terms.
// With u = 2^-24:
//  - each term is rounded at most 3 times (the scale products, the product with the integer, which converts
//    exactly as |sum| < 2^24), a relative error <= 3u;
//  - a sum of m terms in ANY order and grouping (the reference's block order, the kernels' per-thread strides,
//    warp shuffles, cross-warp sums, mma fragments) is within gamma_(m-1) * sum|t_k| of the exact sum (Higham,
//    Accuracy and Stability of Numerical Algorithms, 2nd ed., 4.2), gamma_j = j u / (1 - j u); FMAs only remove
//    roundings.
// So each is within (m + 3) u sum|t_k| of the exact value, and they differ by at most 2 (m + 3) u sum|t_k|.
// m <= n / 8 on either side (at most four terms per 32 elements: Q4_1/Q5_1 have two parts and a min term per
// block; mmq two terms per 16-element slice; every other layout fewer). sum|t_k| <= 3 M, M = sum_i amax_b(i)
// |y_i| with amax_b the largest |dequantized weight| of i's block and y the dequantized activations: the
// quantizers keep the scaled part of a block within 2 amax_b and the min within amax_b (the derivation of
// tests/kernels/kernels_test.cpp, whose bound this is with the kernels' larger m). Tight for 1-block rows, where
// a wrong element or scale misses by orders of magnitude; worst-case (not typical) rounding for long ones.
inline double quantized_tolerance(int64_t block, const float* w, const float* y, int64_t n) {
  double magnitude = 0;
  for (int64_t b = 0; b < n; b += block) {
    double amax = 0;
    double ysum = 0;
    for (int64_t i = b; i < b + block; ++i) {
      amax = std::max(amax, std::fabs(double(w[i])));
      ysum += std::fabs(double(y[i]));
    }
    magnitude += amax * ysum;
  }
  return 2.0 * (double(n) / 8.0 + 3.0) * std::ldexp(1.0, -24) * 3.0 * magnitude + 1e-30;
}

}  // namespace magnetar::cuda_test
