// AVX2 kernels for the low-bit super-block formats: vec_dot for Q2_K, Q3_K and IQ4_XS against Q8_K, 2x2 prefill
// tiles for all three (bit-identical to their vec_dot per product), and IQ4_XS dequantization.
//
// The dot products keep every per-super-block sum in exact int32 arithmetic (maddubs pairs of u8 x s8
// into int16, madd with the sub-block scales into int32) and only then scale by the float block scales,
// so they differ from the scalar reference (quant/ref/k_low.cpp) only by float summation order.
// Dequantization of IQ4_XS is bit-exact with the reference (same single multiply per value).
//
// Input contract shared with the reference: y comes from the Q8_K quantizer, whose values lie in
// -127..127 (-128 would overflow the sign trick IQ4_XS uses to feed signed table values to maddubs).
//
// Compiled with -mavx2 -mfma -mf16c: every helper lives in the anonymous namespace (see STYLE.md and
// backends/cpu/kernels.h on why no inline function may be shared with scalar code).
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/kernels.h"
#include "quant/formats.h"
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

using quant::BlockIQ4_XS;
using quant::BlockQ2_K;
using quant::BlockQ3_K;
using quant::BlockQ8_K;
using quant::kQK_K;

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Shuffle control that turns a register holding 16 byte-sized scales in both 128-bit lanes into int16
// multipliers for one 32-element chunk c (0..7): sub-block 2c in the low lane, 2c+1 in the high lane
// (matching the lanes of a maddubs result over those 32 elements). Bytes 0x80 zero the high halves,
// so the scales are taken as unsigned.
__m256i chunk_scale_control(int c) {
  const __m256i base = _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
                                        1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128);
  return _mm256_add_epi16(base, _mm256_set1_epi16(int16_t(2 * c)));
}

// ---- Q2_K --------------------------------------------------------------------------------------------------
// Chunk c (elements 32c..32c+31) is bits 2*(c%4) of qs[32*(c/4) .. +31]; its sub-blocks are 2c and 2c+1.

float vec_dot_q2_k(int64_t n, const void* vx, const void* vy) {
  const BlockQ2_K* x = static_cast<const BlockQ2_K*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  const __m256i mask2 = _mm256_set1_epi8(3);
  const __m128i mask4 = _mm_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float dall = y[i].d * quant::fp16_to_float(x[i].d);
    const float dmin = y[i].d * quant::fp16_to_float(x[i].dmin);

    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m128i scales8 = _mm_and_si128(packed, mask4);
    const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(packed, 4), mask4);
    // sum_j min_j * bsum_j: the whole min term of the super-block.
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    const __m256i min_prod = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins8), bsums);

    const __m256i scales = _mm256_broadcastsi128_si256(scales8);
    __m256i sumi = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * half));
      for (int s = 0; s < 4; ++s) {
        const int c = 4 * half + s;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * s), mask2);
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 32 * c));
        const __m256i pairs = _mm256_maddubs_epi16(q, q8);  // |pair| <= 2*3*128: no saturation
        const __m256i sc = _mm256_shuffle_epi8(scales, chunk_scale_control(c));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, sc));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
    acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_prod), acc);
  }
  return hsum(acc);
}

// The 2x2 tile of vec_dot_q2_k (kernels.h: out = {x0.y0, x0.y1, x1.y0, x1.y1}): each weight chunk is unpacked and
// each activation chunk loaded once for four products; per product the same int32 lanes (integer sums, any order)
// and the same float steps in the same 8 lanes, so each output is bit-identical to vec_dot_q2_k.
void vec_dot_2x2_q2_k(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const BlockQ2_K* x[2] = {static_cast<const BlockQ2_K*>(vx0), static_cast<const BlockQ2_K*>(vx1)};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(vy0), static_cast<const BlockQ8_K*>(vy1)};
  const __m256i mask2 = _mm256_set1_epi8(3);
  const __m128i mask4 = _mm_set1_epi8(0xF);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i scales[2], min_prod[4];
    for (int r = 0; r < 2; ++r) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r][i].scales));
      scales[r] = _mm256_broadcastsi128_si256(_mm_and_si128(packed, mask4));
      const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), mask4));
      for (int c = 0; c < 2; ++c) {
        min_prod[2 * r + c] =
            _mm256_madd_epi16(mins16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[c][i].bsums)));
      }
    }
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int half = 0; half < 2; ++half) {
      const __m256i q2[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[0][i].qs + 32 * half)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[1][i].qs + 32 * half))};
      for (int s = 0; s < 4; ++s) {
        const int ch = 4 * half + s;
        const __m256i q8[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[0][i].qs + 32 * ch)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[1][i].qs + 32 * ch))};
        const __m256i control = chunk_scale_control(ch);
        for (int r = 0; r < 2; ++r) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2[r], 2 * s), mask2);
          const __m256i sc = _mm256_shuffle_epi8(scales[r], control);
          for (int c = 0; c < 2; ++c) {
            sumi[2 * r + c] = _mm256_add_epi32(sumi[2 * r + c], _mm256_madd_epi16(_mm256_maddubs_epi16(q, q8[c]), sc));
          }
        }
      }
    }
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        const float dall = y[c][i].d * quant::fp16_to_float(x[r][i].d);
        const float dmin = y[c][i].d * quant::fp16_to_float(x[r][i].dmin);
        __m256& a = acc[2 * r + c];
        a = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi[2 * r + c]), a);
        a = _mm256_fnmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_prod[2 * r + c]), a);
      }
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = hsum(acc[k]);
}

// ---- Q3_K --------------------------------------------------------------------------------------------------
// Same chunk layout as Q2_K; the high bit of chunk c is bit c of hmask[0..31] (clear = subtract 4).

// The 16 signed scales (-32..31) of a Q3_K block as bytes. Scale j: low nibble in byte j%8 (nibble j/8),
// high two bits in byte 8 + j%4 at bit 2*(j/4); working on 32-bit words handles four scales at once.
__m128i unpack_q3_k_scales(const uint8_t* packed) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof(w));
  constexpr uint32_t kLow = 0x0f0f0f0f;
  constexpr uint32_t kHigh = 0x03030303;
  const uint32_t s0 = (w[0] & kLow) | (((w[2] >> 0) & kHigh) << 4);         // scales 0..3
  const uint32_t s1 = (w[1] & kLow) | (((w[2] >> 2) & kHigh) << 4);         // scales 4..7
  const uint32_t s2 = ((w[0] >> 4) & kLow) | (((w[2] >> 4) & kHigh) << 4);  // scales 8..11
  const uint32_t s3 = ((w[1] >> 4) & kLow) | (((w[2] >> 6) & kHigh) << 4);  // scales 12..15
  return _mm_sub_epi8(_mm_setr_epi32(int(s0), int(s1), int(s2), int(s3)), _mm_set1_epi8(32));
}

// Q3_K's scales are signed, so they are widened to int16 first and picked with int16-pair controls: for chunk
// c' = c%4 of a half, int16 2c' goes to the low lane and 2c'+1 to the high lane (this, plus 4c' in every byte).
__m256i q3_k_pick_base() {
  return _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                          3);
}

float vec_dot_q3_k(int64_t n, const void* vx, const void* vy) {
  const BlockQ3_K* x = static_cast<const BlockQ3_K*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  const __m256i mask2 = _mm256_set1_epi8(3);
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i pick_base = q3_k_pick_base();
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = quant::fp16_to_float(x[i].d) * y[i].d;
    const __m128i scales8 = unpack_q3_k_scales(x[i].scales);
    const __m128i scales16[2] = {_mm_cvtepi8_epi16(scales8), _mm_cvtepi8_epi16(_mm_srli_si128(scales8, 8))};
    const __m256i hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].hmask));

    __m256i sumi = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * half));
      const __m256i half_scales = _mm256_broadcastsi128_si256(scales16[half]);
      for (int s = 0; s < 4; ++s) {
        const int c = 4 * half + s;
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q3, 2 * s), mask2);
        // 4 where the high bit is clear: q = low - offset, levels -4..3.
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hbits, c), ones);
        const __m256i offset = _mm256_slli_epi16(_mm256_andnot_si256(h, ones), 2);
        const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 32 * c));
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(low, q8), _mm256_maddubs_epi16(offset, q8));
        const __m256i control = _mm256_add_epi8(pick_base, _mm256_set1_epi8(char(4 * s)));
        const __m256i sc = _mm256_shuffle_epi8(half_scales, control);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, sc));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// The 2x2 tile of vec_dot_q3_k, as vec_dot_2x2_q2_k is of vec_dot_q2_k: bit-identical to it per product.
void vec_dot_2x2_q3_k(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const BlockQ3_K* x[2] = {static_cast<const BlockQ3_K*>(vx0), static_cast<const BlockQ3_K*>(vx1)};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(vy0), static_cast<const BlockQ8_K*>(vy1)};
  const __m256i mask2 = _mm256_set1_epi8(3);
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i pick_base = q3_k_pick_base();
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m128i scales8[2];
    __m256i hbits[2];
    for (int r = 0; r < 2; ++r) {
      scales8[r] = unpack_q3_k_scales(x[r][i].scales);
      hbits[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][i].hmask));
    }
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int half = 0; half < 2; ++half) {
      __m256i q3[2], half_scales[2];
      for (int r = 0; r < 2; ++r) {
        q3[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][i].qs + 32 * half));
        half_scales[r] =
            _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(half == 0 ? scales8[r] : _mm_srli_si128(scales8[r], 8)));
      }
      for (int s = 0; s < 4; ++s) {
        const int ch = 4 * half + s;
        const __m256i q8[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[0][i].qs + 32 * ch)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[1][i].qs + 32 * ch))};
        const __m256i control = _mm256_add_epi8(pick_base, _mm256_set1_epi8(char(4 * s)));
        for (int r = 0; r < 2; ++r) {
          const __m256i low = _mm256_and_si256(_mm256_srli_epi16(q3[r], 2 * s), mask2);
          const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hbits[r], ch), ones);
          const __m256i offset = _mm256_slli_epi16(_mm256_andnot_si256(h, ones), 2);
          const __m256i sc = _mm256_shuffle_epi8(half_scales[r], control);
          for (int c = 0; c < 2; ++c) {
            const __m256i pairs =
                _mm256_sub_epi16(_mm256_maddubs_epi16(low, q8[c]), _mm256_maddubs_epi16(offset, q8[c]));
            sumi[2 * r + c] = _mm256_add_epi32(sumi[2 * r + c], _mm256_madd_epi16(pairs, sc));
          }
        }
      }
    }
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        const float d = quant::fp16_to_float(x[r][i].d) * y[c][i].d;
        acc[2 * r + c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[2 * r + c]), acc[2 * r + c]);
      }
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = hsum(acc[k]);
}

// ---- IQ4_XS ------------------------------------------------------------------------------------------------
// Sub-block ib: qs[16*ib + j] holds element j (low nibble) and j + 16 (high nibble).

int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
  const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * ib)) & 3;
  return (low | (high << 4)) - 32;
}

__m256i iq4nl_table() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIQ4NLValues)));
}

float vec_dot_iq4_xs(int64_t n, const void* vx, const void* vy) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  const __m256i table = iq4nl_table();
  const __m256i mask4 = _mm256_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = quant::fp16_to_float(x[i].d) * y[i].d;
    __m256i sumi = _mm256_setzero_si256();
    for (int pair = 0; pair < 4; ++pair) {  // sub-blocks 2*pair (low lane of qs) and 2*pair+1 (high lane)
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * pair));
      const __m256i lo = _mm256_and_si256(q4, mask4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), mask4);
      const __m256i v0 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
      const __m256i v1 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
      const __m256i q8a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * pair));
      const __m256i q8b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * pair + 32));
      // maddubs needs an unsigned left operand: |v| times y with v's sign. |pair| <= 2*127*127.
      const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(v0, v0), _mm256_sign_epi8(q8a, v0));
      const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(v1, v1), _mm256_sign_epi8(q8b, v1));
      const __m256i s0 = _mm256_set1_epi16(int16_t(iq4_xs_scale(x[i], 2 * pair)));
      const __m256i s1 = _mm256_set1_epi16(int16_t(iq4_xs_scale(x[i], 2 * pair + 1)));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum(acc);
}

// The 2x2 tile of vec_dot_iq4_xs: each weight row's values and magnitudes made once for both tokens, each activation
// chunk loaded once for both rows; per product the same int32 lanes and float steps, bit-identical to vec_dot_iq4_xs.
void vec_dot_2x2_iq4_xs(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const BlockIQ4_XS* x[2] = {static_cast<const BlockIQ4_XS*>(vx0), static_cast<const BlockIQ4_XS*>(vx1)};
  const BlockQ8_K* y[2] = {static_cast<const BlockQ8_K*>(vy0), static_cast<const BlockQ8_K*>(vy1)};
  const __m256i table = iq4nl_table();
  const __m256i mask4 = _mm256_set1_epi8(0xF);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i q8[2][2] = {{_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[0][i].qs + 64 * pair)),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[0][i].qs + 64 * pair + 32))},
                                {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[1][i].qs + 64 * pair)),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[1][i].qs + 64 * pair + 32))}};
      for (int r = 0; r < 2; ++r) {
        const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][i].qs + 32 * pair));
        const __m256i lo = _mm256_and_si256(q4, mask4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), mask4);
        const __m256i v[2] = {_mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20)),
                              _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31))};
        const __m256i magnitude[2] = {_mm256_sign_epi8(v[0], v[0]), _mm256_sign_epi8(v[1], v[1])};
        const __m256i s0 = _mm256_set1_epi16(int16_t(iq4_xs_scale(x[r][i], 2 * pair)));
        const __m256i s1 = _mm256_set1_epi16(int16_t(iq4_xs_scale(x[r][i], 2 * pair + 1)));
        for (int c = 0; c < 2; ++c) {
          const __m256i p0 = _mm256_maddubs_epi16(magnitude[0], _mm256_sign_epi8(q8[c][0], v[0]));
          const __m256i p1 = _mm256_maddubs_epi16(magnitude[1], _mm256_sign_epi8(q8[c][1], v[1]));
          sumi[2 * r + c] =
              _mm256_add_epi32(sumi[2 * r + c], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
        }
      }
    }
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        const float d = quant::fp16_to_float(x[r][i].d) * y[c][i].d;
        acc[2 * r + c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[2 * r + c]), acc[2 * r + c]);
      }
    }
  }
  for (int k = 0; k < 4; ++k) out[k] = hsum(acc[k]);
}

// Bit-exact with the reference: dl = d * scale, then each value is dl * float(table value).
void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(src);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIQ4NLValues));
  const __m128i mask4 = _mm_set1_epi8(0xF);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = quant::fp16_to_float(x[i].d);
    for (int ib = 0; ib < kQK_K / 32; ++ib) {
      const __m256 dl = _mm256_set1_ps(d * iq4_xs_scale(x[i], ib));
      const __m128i q4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16 * ib));
      const __m128i halves[2] = {_mm_shuffle_epi8(table, _mm_and_si128(q4, mask4)),
                                 _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q4, 4), mask4))};
      for (int h = 0; h < 2; ++h) {  // elements 0..15 from the low nibbles, 16..31 from the high ones
        const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
        const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8)));
        _mm256_storeu_ps(dst + 16 * h, _mm256_mul_ps(dl, a));
        _mm256_storeu_ps(dst + 16 * h + 8, _mm256_mul_ps(dl, b));
      }
      dst += 32;
    }
  }
}

}  // namespace

void register_avx2_k_low(KernelTable& table) {
  table[uint32_t(quant::Type::Q2_K)].vec_dot = vec_dot_q2_k;
  table[uint32_t(quant::Type::Q2_K)].vec_dot_2x2 = vec_dot_2x2_q2_k;
  table[uint32_t(quant::Type::Q3_K)].vec_dot = vec_dot_q3_k;
  table[uint32_t(quant::Type::Q3_K)].vec_dot_2x2 = vec_dot_2x2_q3_k;
  table[uint32_t(quant::Type::IQ4_XS)].vec_dot = vec_dot_iq4_xs;
  table[uint32_t(quant::Type::IQ4_XS)].vec_dot_2x2 = vec_dot_2x2_iq4_xs;
  table[uint32_t(quant::Type::IQ4_XS)].dequantize = dequantize_iq4_xs;
}

}  // namespace magnetar::cpu
