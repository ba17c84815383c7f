// The summation order of attention scores on AVX2 and AVX-512 (avx2/vector.cpp, avx512/vector.cpp): a score's eight
// partial sums are added as ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)), whether the score is computed alone
// (hsum_tree) or in a register tile of eight (reduce8), so a query row gets the same bits in any tile.
// Included only by files compiled with AVX2 or wider flags. The functions are static: each file keeps its own copy,
// so the linker can never hand an AVX-512-compiled copy to code that runs on an AVX2-only CPU.
#pragma once

#include <immintrin.h>

namespace magnetar::cpu {

static inline float hsum_tree(__m256 v) {
  const __m256 h = _mm256_hadd_ps(v, v);
  const __m256 h2 = _mm256_hadd_ps(h, h);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

// The eight sums of v[0..7], each in hsum_tree's order, as one vector.
static inline __m256 reduce8(const __m256* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);  // per 128-bit half: 4 sums each
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

}  // namespace magnetar::cpu
