// AVX-512 (F+BW+VL+DQ) dot products for the 32-element weight types that decode to signed int8 codes
// against Q8_0: Q4_0, Q8_0, IQ4_NL and MXFP4. Everything else falls back to the AVX2 file.
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
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

using quant::BlockIQ4_NL;
using quant::BlockMXFP4;
using quant::BlockQ4_0;
using quant::BlockQ8_0;
using quant::kQK32;
using quant::Type;

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact, like quant::fp16_to_float

// 16 packed bytes -> 32 codes in element order: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// A 16-entry int8 table indexed by the nibble codes (vpshufb looks up within each 128-bit lane).
inline __m256i lookup16(const int8_t* values, const uint8_t* qs) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
  return _mm256_shuffle_epi8(table, unpack_nibbles(qs));
}

// Per-type signed codes (one int8 per element, element order) and the block's float scale.
inline __m256i codes(const BlockQ4_0& b) {
  return _mm256_sub_epi8(unpack_nibbles(b.qs), _mm256_set1_epi8(8));
}
inline __m256i codes(const BlockQ8_0& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}
inline __m256i codes(const BlockIQ4_NL& b) { return lookup16(quant::kIQ4NLValues, b.qs); }
inline __m256i codes(const BlockMXFP4& b) { return lookup16(quant::kMXFP4Values, b.qs); }

template <typename Block>
inline float scale(const Block& x, const BlockQ8_0& y) {
  return half_to_float(x.d) * half_to_float(y.d);
}
inline float scale(const BlockMXFP4& x, const BlockQ8_0& y) {
  return half_to_float(y.d) * quant::e8m0_to_float_half(x.e);
}

// 32 int8 x 32 int8 -> 16 int32 lanes, each the exact sum of two products.
inline __m512i block_products(__m256i x, const BlockQ8_0& y) {
  const __m512i x16 = _mm512_cvtepi8_epi16(x);
  const __m512i y16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs)));
  return _mm512_madd_epi16(x16, y16);
}

template <typename Block>
float dot_vs_q8_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const Block*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  const int64_t nb = n / kQK32;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m512 p = _mm512_cvtepi32_ps(block_products(codes(x[i]), y[i]));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(scale(x[i], y[i])), p, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

void register_avx512_legacy(KernelTable& table) {
  table[uint32_t(Type::Q4_0)].vec_dot = dot_vs_q8_0<BlockQ4_0>;
  table[uint32_t(Type::Q8_0)].vec_dot = dot_vs_q8_0<BlockQ8_0>;
  table[uint32_t(Type::IQ4_NL)].vec_dot = dot_vs_q8_0<BlockIQ4_NL>;
  table[uint32_t(Type::MXFP4)].vec_dot = dot_vs_q8_0<BlockMXFP4>;
}

}  // namespace magnetar::cpu
