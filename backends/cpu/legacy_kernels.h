// AVX2 kernels for the 32-element block family (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 IQ4_NL MXFP4), the body of two
// builds: avx2/legacy.cpp (-mavx2: register_avx2_legacy) and avx512/legacy.cpp (MAGNETAR_LEGACY_VNNI, with
// -mavx512vnni: register_avx512_legacy, on CPUs with AVX-512 VNNI only), whose u8 x s8 products are one vpdpbusd
// instead of vpmaddubsw + vpmaddwd. Both make the same int32 lanes (the sum of the same four products each; no
// int16 saturation with either: see dot_u8_i8), so the two builds give the same bits.
//
// Contracts, per kernel kind (the oracle is quant/ref/legacy.cpp):
//   vec_dot     same integer dot per block as the reference, block sums accumulated in 8 float lanes with
//               FMA, so the result differs from the reference only by float summation order. The signed
//               products use the sign trick (|x| * sign(x) * y), which needs y in [-127, 127]: true for
//               every Q8_0/Q8_1 block a quantizer writes (|q| = round(|x| * 127 / amax) <= 127).
//   vec_dot_2x2 (Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4; the prefill tiles) bit-identical to vec_dot per product.
//   quantize    Q8_0 and Q8_1, the activation formats: the same bytes as the reference, which rounds half
//               away from zero (roundf), not the CPU's default round-half-to-even.
//   dequantize  bit-exact with the reference: per element the same single multiply, or, for Q4_1/Q5_1,
//               the same rounded multiply followed by a rounded add (never one FMA).
// Built with -mavx2 -mfma -mf16c (+ AVX-512 for the VNNI build): every helper lives in the anonymous namespace (see
// STYLE.md on ODR). Include it from those two files only.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels.h"
#include "quant/formats.h"
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

using quant::BlockIQ4_NL;
using quant::BlockMXFP4;
using quant::BlockQ4_0;
using quant::BlockQ4_1;
using quant::BlockQ5_0;
using quant::BlockQ5_1;
using quant::BlockQ8_0;
using quant::BlockQ8_1;
using quant::kQK32;
using quant::Type;

// ---- helpers ------------------------------------------------------------------------------------------
// Unpacking 4-bit codes and 5th bits into one byte per element, int8 dot products, reductions.

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact, like quant::fp16_to_float

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// 16 packed bytes -> 32 codes in element order: low nibbles (elements 0..15) then high nibbles (16..31).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// Bit j of the little-endian word qh -> byte j = 0xff if set, 0x00 if clear.
inline __m256i expand_bits(const uint8_t qh[4]) {
  const uint32_t bits = uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
  // Byte j takes byte j / 8 of the word (the shuffle is per 128-bit lane; each lane holds the whole word).
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(int(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i select = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// x unsigned in [0, 128], y signed (in [-127, 127] where x reaches 128): 8 lanes of 4-product sums (|pair sum| <= 2
// * 128 * 127: no saturation in maddubs' int16 pairs).
#if defined(MAGNETAR_LEGACY_VNNI)
inline __m256i dot_u8_i8(__m256i x, __m256i y) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y); }
#else
inline __m256i dot_u8_i8(__m256i x, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));  // int16 pairs -> int32
}
#endif

// x signed, y signed in [-127, 127]: |x| * (y * sign(x)); |x| of -128 reads as unsigned 128, still exact.
inline __m256i dot_i8_i8(__m256i x, __m256i y) { return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

inline __m256i table16(const int8_t* values) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
}

// Stores 32 int8 values times d as floats: one rounded multiply each, as the reference.
inline void store_scaled(__m256i q, float d, float* dst) {
  const __m256 vd = _mm256_set1_ps(d);
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int h = 0; h < 2; ++h) {
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8)));
    _mm256_storeu_ps(dst + 16 * h, _mm256_mul_ps(a, vd));
    _mm256_storeu_ps(dst + 16 * h + 8, _mm256_mul_ps(b, vd));
  }
}

// As store_scaled, then + m in a second rounding. The empty asm keeps the compiler from fusing the
// multiply and the add into one FMA (GCC contracts intrinsics too under its default -ffp-contract=fast).
inline void store_scaled_plus(__m256i q, float d, float m, float* dst) {
  const __m256 vd = _mm256_set1_ps(d);
  const __m256 vm = _mm256_set1_ps(m);
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int h = 0; h < 2; ++h) {
    __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h])), vd);
    __m256 b = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8))), vd);
    __asm__("" : "+x"(a), "+x"(b));
    _mm256_storeu_ps(dst + 16 * h, _mm256_add_ps(a, vm));
    _mm256_storeu_ps(dst + 16 * h + 8, _mm256_add_ps(b, vm));
  }
}

// ---- code extraction per type -------------------------------------------------------------------------
// Each returns the 32 codes of one block, one byte per element in element order, in the form its dot uses.

inline __m256i codes_q4_0(const BlockQ4_0& b) {  // signed, q - 8
  return _mm256_sub_epi8(unpack_nibbles(b.qs), _mm256_set1_epi8(8));
}
// Signed, q - 16: with the 5th bit clear, q - 16 = nibble - 16 is the byte (nibble | 0xf0).
inline __m256i codes_q5_0(const BlockQ5_0& b) {
  const __m256i high = _mm256_andnot_si256(expand_bits(b.qh), _mm256_set1_epi8(int8_t(0xf0)));
  return _mm256_or_si256(unpack_nibbles(b.qs), high);
}
inline __m256i codes_q5_1(const BlockQ5_1& b) {  // unsigned, 0..31
  const __m256i high = _mm256_and_si256(expand_bits(b.qh), _mm256_set1_epi8(0x10));
  return _mm256_or_si256(unpack_nibbles(b.qs), high);
}
inline __m256i codes_iq4_nl(const BlockIQ4_NL& b) {  // kIQ4NLValues[q]
  return _mm256_shuffle_epi8(table16(quant::kIQ4NLValues), unpack_nibbles(b.qs));
}
inline __m256i codes_mxfp4(const BlockMXFP4& b) {  // kMXFP4Values[q]
  return _mm256_shuffle_epi8(table16(quant::kMXFP4Values), unpack_nibbles(b.qs));
}

// ---- vec_dot ------------------------------------------------------------------------------------------

// Weight types with a scale only, against Q8_0: sum_b scale(x_b, y_b) * dot(codes(x_b), y_b).
template <typename Block, __m256i (*codes)(const Block&), float (*scale)(const Block&, const BlockQ8_0&)>
float dot_vs_q8_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const Block*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  const int64_t nb = n / kQK32;
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {  // two independent chains hide the FMA latency
    const __m256i p0 = dot_i8_i8(codes(x[i]), load32(y[i].qs));
    const __m256i p1 = dot_i8_i8(codes(x[i + 1]), load32(y[i + 1].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(x[i], y[i])), _mm256_cvtepi32_ps(p0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale(x[i + 1], y[i + 1])), _mm256_cvtepi32_ps(p1), acc1);
  }
  if (i < nb) {
    const __m256i p = dot_i8_i8(codes(x[i]), load32(y[i].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale(x[i], y[i])), _mm256_cvtepi32_ps(p), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// The 2x2 tile of dot_vs_q8_0 (kernels.h: out = {x0.y0, x0.y1, x1.y0, x1.y1}): each weight block's codes
// and their absolute values are formed once for both tokens. Per product it keeps dot_vs_q8_0's exact
// arithmetic: the same int32 lanes per block, the same scale, even blocks fma'd into one 8-lane chain and odd
// blocks into another, the same final sum, so each output is bit-identical to dot_vs_q8_0.
template <typename Block, __m256i (*codes)(const Block&), float (*scale)(const Block&, const BlockQ8_0&)>
void dot_2x2_vs_q8_0(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const Block* x[2] = {static_cast<const Block*>(vx0), static_cast<const Block*>(vx1)};
  const BlockQ8_0* y[2] = {static_cast<const BlockQ8_0*>(vy0), static_cast<const BlockQ8_0*>(vy1)};
  const int64_t nb = n / kQK32;
  __m256 acc[2][4];  // [block parity][2 r + c]
  for (auto& chain : acc) {
    for (__m256& a : chain) a = _mm256_setzero_ps();
  }
  auto block = [&](int64_t i, __m256(&chain)[4]) {
    for (int r = 0; r < 2; ++r) {
      const __m256i cx = codes(x[r][i]);
      const __m256i ax = _mm256_sign_epi8(cx, cx);  // |x|, as dot_i8_i8
      for (int c = 0; c < 2; ++c) {
        const __m256i p = dot_u8_i8(ax, _mm256_sign_epi8(load32(y[c][i].qs), cx));
        chain[2 * r + c] =
            _mm256_fmadd_ps(_mm256_set1_ps(scale(x[r][i], y[c][i])), _mm256_cvtepi32_ps(p), chain[2 * r + c]);
      }
    }
  };
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    block(i, acc[0]);
    block(i + 1, acc[1]);
  }
  if (i < nb) block(i, acc[0]);
  for (int k = 0; k < 4; ++k) out[k] = hsum(_mm256_add_ps(acc[0][k], acc[1][k]));
}

template <typename Block>
float fp16_scales(const Block& x, const BlockQ8_0& y) {
  return half_to_float(x.d) * half_to_float(y.d);
}
float mxfp4_scales(const BlockMXFP4& x, const BlockQ8_0& y) {
  return half_to_float(y.d) * quant::e8m0_to_float_half(x.e);
}
__m256i codes_q8_0(const BlockQ8_0& b) { return load32(b.qs); }

// Weight types with scale and min, against Q8_1: d_x d_y dot(q_x, q_y) + m_x s_y.
template <typename Block, __m256i (*codes)(const Block&)>
float dot_vs_q8_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const Block*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  const int64_t nb = n / kQK32;
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i p = dot_u8_i8(codes(x[i]), load32(y[i].qs));
    const float d = half_to_float(x[i].d) * half_to_float(y[i].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    mins += half_to_float(x[i].m) * half_to_float(y[i].s);
  }
  return hsum(acc) + mins;
}

inline __m256i codes_q4_1(const BlockQ4_1& b) { return unpack_nibbles(b.qs); }  // unsigned, 0..15

// ---- quantize Q8_0 / Q8_1 ------------------------------------------------------------------------------

// One block: d = amax / 127, q = roundf(x / d) exactly as the reference computes them. Returns d (float,
// before fp16 rounding) and writes the 32 codes; *sum gets the sum of the codes.
inline float quantize_block_q8(const float* x, int8_t* qs, int* sum) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    // Operand order: maxps returns its second operand when one is NaN, so a NaN input is skipped here
    // as std::max(amax, |x|) in the reference skips it.
    amax = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[k]), amax);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float d = _mm_cvtss_f32(m4) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;

  const __m256 vid = _mm256_set1_ps(id);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 s = _mm256_mul_ps(v[k], vid);
    // roundf: truncate, then step away from zero when the dropped fraction is >= 0.5. s - trunc(s) is
    // exact, so the comparison sees the true fraction (adding 0.5 first would round 0.49999997 up).
    const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(s, t));
    const __m256 step = _mm256_or_ps(_mm256_and_ps(s, sign_bit), one);  // +-1 with the sign of s
    const __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
    q[k] = _mm256_cvtps_epi32(r);  // r is integral: exact
  }
  *sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  // Saturating packs work per 128-bit lane; the permute restores element order.
  const __m256i q01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i q23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i bytes =
      _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), bytes);
  return d;
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  int sum = 0;
  for (int64_t i = 0; i < n / kQK32; ++i) {
    y[i].d = quant::float_to_fp16(quantize_block_q8(src + i * kQK32, y[i].qs, &sum));
  }
}

void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK32; ++i) {
    int sum = 0;
    const float d = quantize_block_q8(src + i * kQK32, y[i].qs, &sum);
    y[i].d = quant::float_to_fp16(d);
    y[i].s = quant::float_to_fp16(float(sum) * d);
  }
}

// ---- dequantize ---------------------------------------------------------------------------------------

template <typename Block, __m256i (*codes)(const Block&)>
void dequantize_scaled(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i) store_scaled(codes(x[i]), half_to_float(x[i].d), dst + i * kQK32);
}

template <typename Block, __m256i (*codes)(const Block&)>
void dequantize_scaled_min(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i) {
    store_scaled_plus(codes(x[i]), half_to_float(x[i].d), half_to_float(x[i].m), dst + i * kQK32);
  }
}

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / kQK32; ++i) {
    store_scaled(codes_mxfp4(x[i]), quant::e8m0_to_float_half(x[i].e), dst + i * kQK32);
  }
}

}  // namespace

#if defined(MAGNETAR_LEGACY_VNNI)
void register_avx512_legacy(KernelTable& table) {
  if (!__builtin_cpu_supports("avx512vnni")) return;  // the AVX2 build's kernels stay (fill_from)
#else
void register_avx2_legacy(KernelTable& table) {
#endif
  auto& q4_0 = table[uint32_t(Type::Q4_0)];
  q4_0.vec_dot = dot_vs_q8_0<BlockQ4_0, codes_q4_0, fp16_scales<BlockQ4_0>>;
  q4_0.vec_dot_2x2 = dot_2x2_vs_q8_0<BlockQ4_0, codes_q4_0, fp16_scales<BlockQ4_0>>;
  q4_0.dequantize = dequantize_scaled<BlockQ4_0, codes_q4_0>;

  auto& q4_1 = table[uint32_t(Type::Q4_1)];
  q4_1.vec_dot = dot_vs_q8_1<BlockQ4_1, codes_q4_1>;
  q4_1.dequantize = dequantize_scaled_min<BlockQ4_1, codes_q4_1>;

  auto& q5_0 = table[uint32_t(Type::Q5_0)];
  q5_0.vec_dot = dot_vs_q8_0<BlockQ5_0, codes_q5_0, fp16_scales<BlockQ5_0>>;
  q5_0.vec_dot_2x2 = dot_2x2_vs_q8_0<BlockQ5_0, codes_q5_0, fp16_scales<BlockQ5_0>>;
  q5_0.dequantize = dequantize_scaled<BlockQ5_0, codes_q5_0>;

  auto& q5_1 = table[uint32_t(Type::Q5_1)];
  q5_1.vec_dot = dot_vs_q8_1<BlockQ5_1, codes_q5_1>;
  q5_1.dequantize = dequantize_scaled_min<BlockQ5_1, codes_q5_1>;

  auto& q8_0 = table[uint32_t(Type::Q8_0)];
  q8_0.vec_dot = dot_vs_q8_0<BlockQ8_0, codes_q8_0, fp16_scales<BlockQ8_0>>;
  q8_0.vec_dot_2x2 = dot_2x2_vs_q8_0<BlockQ8_0, codes_q8_0, fp16_scales<BlockQ8_0>>;
  q8_0.quantize = quantize_q8_0;
  q8_0.dequantize = dequantize_scaled<BlockQ8_0, codes_q8_0>;

  auto& q8_1 = table[uint32_t(Type::Q8_1)];
  q8_1.quantize = quantize_q8_1;

  auto& iq4_nl = table[uint32_t(Type::IQ4_NL)];
  iq4_nl.vec_dot = dot_vs_q8_0<BlockIQ4_NL, codes_iq4_nl, fp16_scales<BlockIQ4_NL>>;
  iq4_nl.vec_dot_2x2 = dot_2x2_vs_q8_0<BlockIQ4_NL, codes_iq4_nl, fp16_scales<BlockIQ4_NL>>;
  iq4_nl.dequantize = dequantize_scaled<BlockIQ4_NL, codes_iq4_nl>;

  auto& mxfp4 = table[uint32_t(Type::MXFP4)];
  mxfp4.vec_dot = dot_vs_q8_0<BlockMXFP4, codes_mxfp4, mxfp4_scales>;
  mxfp4.vec_dot_2x2 = dot_2x2_vs_q8_0<BlockMXFP4, codes_mxfp4, mxfp4_scales>;
  mxfp4.dequantize = dequantize_mxfp4;
}

}  // namespace magnetar::cpu
