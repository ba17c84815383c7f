// AVX-512 (F+BW+VL+DQ) kernels for the low-bit super-block formats: IQ4_XS vec_dot against Q8_K and its 2x2 tile.
//
// Q2_K, Q3_K and the IQ4_XS dequantization are left to the AVX2 kernels (the dispatcher falls back):
// their 256-bit versions already run at load/shuffle throughput, and IQ4_XS is the one of the three whose
// dot is dominated by the table lookup that a 512-bit shuffle halves.
//
// Same arithmetic as avx2/k_low.cpp: u8 x s8 pairs in int16 (maddubs; no VNNI is assumed), int16 x scale
// into int32, one float multiply-add per super-block. Differs from the scalar reference only by float
// summation order. Input contract: y values in -127..127 (what the Q8_K quantizer produces).
//
// Compiled with -mavx512*: every helper is in the anonymous namespace (see backends/cpu/kernels.h).
#include <immintrin.h>

#include <cstdint>

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics as uninitialized
// (GCC bug 105593, fixed in GCC 13); the warnings are about the compiler's headers, not this file.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "backends/cpu/kernels.h"
#include "quant/formats.h"
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

using quant::BlockIQ4_XS;
using quant::BlockQ8_K;
using quant::kQK_K;

// The signed scale (-32..31) of sub-block ib: low nibble in scales_l[ib/2], high two bits in scales_h.
int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
  const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * ib)) & 3;
  return (low | (high << 4)) - 32;
}

// int16 multipliers for a register holding two sub-blocks: `first` in the low 256 bits, `second` above.
__m512i pair_scales(int first, int second) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(int16_t(first))),
                            _mm256_set1_epi16(int16_t(second)), 1);
}

// sum over 64 elements of table[v] * y, weighted per 32 by `scales`, as 16 int32 partial sums.
// |v| * y pairs stay below 2 * 127 * 127, inside int16.
__m512i dot_two_sub_blocks(__m512i values, __m512i q8, __m512i scales) {
  const __mmask64 negative = _mm512_movepi8_mask(values);
  const __m512i q8_signed = _mm512_mask_sub_epi8(q8, negative, _mm512_setzero_si512(), q8);
  const __m512i pairs = _mm512_maddubs_epi16(_mm512_abs_epi8(values), q8_signed);
  return _mm512_madd_epi16(pairs, scales);
}

float vec_dot_iq4_xs(int64_t n, const void* vx, const void* vy) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIQ4NLValues)));
  const __m512i mask4 = _mm512_set1_epi8(0xF);
  // qword indices that interleave the 128-bit lanes of lo (0..7) and hi (8..15): lo.0 hi.0 lo.1 hi.1 and
  // lo.2 hi.2 lo.3 hi.3, i.e. two whole sub-blocks each in element order.
  const __m512i first_pair = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second_pair = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = quant::fp16_to_float(x[i].d) * y[i].d;
    __m512i sumi = _mm512_setzero_si512();
    for (int quad = 0; quad < 2; ++quad) {  // sub-blocks 4*quad .. 4*quad+3, one per 128-bit lane of qs
      const __m512i q4 = _mm512_loadu_si512(x[i].qs + 64 * quad);
      const __m512i lo = _mm512_and_si512(q4, mask4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), mask4);
      const __m512i v01 = _mm512_shuffle_epi8(table, _mm512_permutex2var_epi64(lo, first_pair, hi));
      const __m512i v23 = _mm512_shuffle_epi8(table, _mm512_permutex2var_epi64(lo, second_pair, hi));
      const int8_t* q8 = y[i].qs + 128 * quad;
      const int ib = 4 * quad;
      const __m512i s01 = pair_scales(iq4_xs_scale(x[i], ib), iq4_xs_scale(x[i], ib + 1));
      const __m512i s23 = pair_scales(iq4_xs_scale(x[i], ib + 2), iq4_xs_scale(x[i], ib + 3));
      sumi = _mm512_add_epi32(sumi, dot_two_sub_blocks(v01, _mm512_loadu_si512(q8), s01));
      sumi = _mm512_add_epi32(sumi, dot_two_sub_blocks(v23, _mm512_loadu_si512(q8 + 64), s23));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// The 2x2 tile of vec_dot_iq4_xs (kernels.h: out = {x0.y0, x0.y1, x1.y0, x1.y1}): each weight row's values, their
// magnitudes and signs made once for both tokens, each activation chunk loaded once for both rows; per product the
// same int32 lanes and the same float steps in the same 16 lanes, so each output is bit-identical to vec_dot_iq4_xs.
void vec_dot_2x2_iq4_xs(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const BlockIQ4_XS* x[2] = {static_cast<const BlockIQ4_XS*>(vx0), static_cast<const BlockIQ4_XS*>(vx1)};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(vy0), static_cast<const BlockQ8_K*>(vy1)};
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIQ4NLValues)));
  const __m512i mask4 = _mm512_set1_epi8(0xF);
  const __m512i first_pair = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);  // as vec_dot_iq4_xs
  const __m512i second_pair = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m512i sumi[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int quad = 0; quad < 2; ++quad) {
      const int ib = 4 * quad;
      const __m512i q8[2][2] = {
          {_mm512_loadu_si512(y[0][i].qs + 128 * quad), _mm512_loadu_si512(y[0][i].qs + 128 * quad + 64)},
          {_mm512_loadu_si512(y[1][i].qs + 128 * quad), _mm512_loadu_si512(y[1][i].qs + 128 * quad + 64)}};
      for (int r = 0; r < 2; ++r) {
        const BlockIQ4_XS& b = x[r][i];
        const __m512i q4 = _mm512_loadu_si512(b.qs + 64 * quad);
        const __m512i lo = _mm512_and_si512(q4, mask4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), mask4);
        const __m512i v[2] = {_mm512_shuffle_epi8(table, _mm512_permutex2var_epi64(lo, first_pair, hi)),
                              _mm512_shuffle_epi8(table, _mm512_permutex2var_epi64(lo, second_pair, hi))};
        const __m512i sc[2] = {pair_scales(iq4_xs_scale(b, ib), iq4_xs_scale(b, ib + 1)),
                               pair_scales(iq4_xs_scale(b, ib + 2), iq4_xs_scale(b, ib + 3))};
        for (int h = 0; h < 2; ++h) {
          const __mmask64 negative = _mm512_movepi8_mask(v[h]);
          const __m512i magnitude = _mm512_abs_epi8(v[h]);
          for (int c = 0; c < 2; ++c) {
            const __m512i q8_signed = _mm512_mask_sub_epi8(q8[c][h], negative, _mm512_setzero_si512(), q8[c][h]);
            const __m512i pairs = _mm512_maddubs_epi16(magnitude, q8_signed);
            sumi[2 * r + c] = _mm512_add_epi32(sumi[2 * r + c], _mm512_madd_epi16(pairs, sc[h]));
          }
        }
      }
    }
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        const float d = quant::fp16_to_float(x[r][i].d) * y[c][i].d;
        acc[2 * r + c] = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi[2 * r + c]), acc[2 * r + c]);
      }
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = _mm512_reduce_add_ps(acc[k]);
}

}  // namespace

void register_avx512_k_low(KernelTable& table) {
  table[uint32_t(quant::Type::IQ4_XS)].vec_dot = vec_dot_iq4_xs;
  table[uint32_t(quant::Type::IQ4_XS)].vec_dot_2x2 = vec_dot_2x2_iq4_xs;
}

}  // namespace magnetar::cpu
