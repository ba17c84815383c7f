// AVX-512 (F+BW+VL+DQ) dot product of Q8_0 against Q8_0. Everything else of the 32-element family uses the
// AVX2 file: measured on the H200 host's Xeon (2026-11-30, docs/benchmarks/2026-11-30-quant-kernels.md), this
// file's Q4_0, IQ4_NL and MXFP4 versions ran 4-15% slower than AVX2 (the nibble unpacking and the int16
// widening cost more than the wider multiply saves), so they were removed; Q8_0 ran 4% faster.
//
// Kept deliberately simple, because the machines these are written on cannot run them: each block's 32
// codes and 32 activations are widened to int16 and multiplied with vpmaddwd, which is exact for every
// int8 input (no saturation, no sign trick, so even -128 in y is right), giving 16 int32 partial sums;
// those are scaled by the block's float scale and accumulated in 16 float lanes with FMA. The result
// differs from the reference only by float summation order.
// Built with -mavx512{f,bw,vl,dq} -mavx2 -mfma -mf16c: every helper lives in the anonymous namespace.
// GCC 12's AVX-512 headers seed results with a self-initialized "undefined" vector (_mm512_undefined_ps)
// and then warn about it at the header line (GCC bug 105593, fixed in GCC 13); silence those lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "backends/cpu/kernels.h"
#include "quant/formats.h"

namespace magnetar::cpu {
namespace {

using quant::BlockQ8_0;
using quant::kQK32;
using quant::Type;

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact, like quant::fp16_to_float

// The block's float scale.
inline float scale(const BlockQ8_0& x, const BlockQ8_0& y) { return half_to_float(x.d) * half_to_float(y.d); }

// 32 int8 x 32 int8 -> 16 int32 lanes, each the exact sum of two products.
inline __m512i block_products(__m256i x, const BlockQ8_0& y) {
  const __m512i x16 = _mm512_cvtepi8_epi16(x);
  const __m512i y16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs)));
  return _mm512_madd_epi16(x16, y16);
}

float dot_q8_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  const int64_t nb = n / kQK32;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs));
    const __m512 p = _mm512_cvtepi32_ps(block_products(codes, y[i]));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(scale(x[i], y[i])), p, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

void register_avx512_legacy(KernelTable& table) {
  table[uint32_t(Type::Q8_0)].vec_dot = dot_q8_0;
}

}  // namespace magnetar::cpu
