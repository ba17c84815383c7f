// AVX-512 (F + BW + VL + DQ) dot product of Q6_K against Q8_K. The rest of the K-quant family falls back
// to backends/cpu/avx2/k_quants.cpp on purpose: without VNNI, 512-bit maddubs/madd versions of Q4_K and Q5_K
// (two layouts tried: 256-bit halves joined, and a broadcast load with per-half shifts) measured slower than
// AVX2, likely because Intel cores run 512-bit integer multiplies on one port where 256-bit ones use two.
// Q6_K gains because its 512-bit form needs fewer shuffles.
// Measured 2025-11-30 on the H200 host's Intel Xeon (lscpu: "Intel(R) Xeon(R) Processor"), one thread,
// dot products of 4096-element rows over an 8192-row matrix, median of 5 runs of best-of-30, ns per
// 256-element super-block:
//   Q4_K avx2 11.7  avx512 14.1 | Q5_K avx2 15.5  avx512 16.0 | Q6_K avx2 14.1  avx512 12.3
//
// Same contract and same arithmetic as the AVX2 kernel: exact integer sums per super-block, then the
// reference's float step, so the result is bit-identical to quant/ref/k_quants.cpp (tests/kernels checks).
//
// This file is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq: every helper is in the anonymous
// namespace so that no AVX-512-encoded copy of an inline function can be picked by the linker for code that
// runs on older CPUs.
//
// GCC 12's AVX-512 intrinsics pass _mm*_undefined_*() as the ignored merge source of masked builtins, which
// -Wmaybe-uninitialized reports at every inlined use (even _mm512_castsi512_si256). Silenced for the
// header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/formats.h"

namespace magnetar::cpu {
namespace {

using quant::BlockQ6_K;
using quant::BlockQ8_K;
using quant::kQK_K;

int64_t super_blocks(int64_t n) {
  MAGNETAR_CHECK(n >= 0 && n % kQK_K == 0);
  return n / kQK_K;
}

__m512i load512(const void* p) { return _mm512_loadu_si512(p); }
__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
__m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The reference's float step, acc + d * sumi rounded once; sumi is the float the reference gets from
// float(int32) (cvtepi32_ps rounds the same way).
float accumulate(float acc, float d, float sumi) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(d), _mm_set_ss(sumi), _mm_set_ss(acc)));
}

// Two 256-bit halves into one register: `lo` becomes bytes 0..31, `hi` bytes 32..63.
__m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

__m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }

// Horizontal sum (integer addition is exact, so any order gives the reference's sum), as a float.
float reduce(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(_mm_cvtepi32_ps(t));
}

// ---- Q6_K ---------------------------------------------------------------------------------------------------

float vec_dot_q6_k(int64_t n, const void* vx, const void* vy) {
  const auto* xb = static_cast<const BlockQ6_K*>(vx);
  const auto* yb = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = super_blocks(n);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i shift_01 = join(_mm256_set1_epi16(4), _mm256_set1_epi16(2));    // left
  const __m512i shift_23 = join(_mm256_setzero_si256(), _mm256_set1_epi16(2));  // right
  // Word permutations that give each 128-bit lane (8 int16 products = one sub-block of 16 elements) its
  // sub-block's scale: lane L of quarter c (c = 0..3, 64 elements each) is sub-block 4c + L.
  __m512i scale_index[4];
  for (int c = 0; c < 4; ++c) {
    alignas(64) int16_t idx[32];
    for (int w = 0; w < 32; ++w) idx[w] = int16_t(4 * c + w / 8);
    scale_index[c] = _mm512_load_si512(idx);
  }
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& x = xb[i];
    const BlockQ8_K& y = yb[i];
    const __m256i sc16 = _mm256_cvtepi8_epi16(load128(x.scales));
    const __m512i scales = _mm512_castsi256_si512(sc16);  // words 16..31 are never selected
    __m512i sumi = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      // Unsigned levels q + 32 (layout in quant/ref/k_quants.cpp). Elements 0..63 of this half take the
      // low nibbles of ql[0..63] and qh bits 0-1 (bytes 0..31) or 2-3 (bytes 32..63); elements 64..127 the
      // high nibbles and qh bits 4-5 or 6-7. Each is moved to bits 4-5 with a per-half shift.
      const __m512i l = load512(x.ql + 64 * half);
      const __m512i h = _mm512_broadcast_i64x4(load256(x.qh + 32 * half));
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_and_si512(_mm512_sllv_epi16(h, shift_01), bits45));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                          _mm512_and_si512(_mm512_srlv_epi16(h, shift_23), bits45));
      const __m512i p01 = _mm512_maddubs_epi16(q01, load512(y.qs + 128 * half));
      const __m512i p23 = _mm512_maddubs_epi16(q23, load512(y.qs + 128 * half + 64));
      sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_permutexvar_epi16(scale_index[2 * half], scales), p01));
      sumi =
          _mm512_add_epi32(sumi, _mm512_madd_epi16(_mm512_permutexvar_epi16(scale_index[2 * half + 1], scales), p23));
    }
    // The stored levels are q + 32: subtract 32 * sum_j sc_j * bsums_j.
    const __m256i offset = _mm256_madd_epi16(sc16, load256(y.bsums));
    acc = accumulate(acc, half_to_float(x.d) * y.d, reduce(_mm256_sub_epi32(fold(sumi), _mm256_slli_epi32(offset, 5))));
  }
  return acc;
}

}  // namespace

void register_avx512_k_quants(KernelTable& table) { table[uint32_t(quant::Type::Q6_K)].vec_dot = vec_dot_q6_k; }

}  // namespace magnetar::cpu
