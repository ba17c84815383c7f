// AVX2 + FMA + F16C kernels for Q4_K, Q5_K and Q6_K (dot products against Q8_K, dequantization) and the
// Q8_K activation quantizer. The dot products are the decode hot path of K-quant models.
// The body of two builds (docs/STYLE.md, SIMD kernels): avx2/k_quants.cpp (register_avx2_k_quants) and
// avx512/k_quants_vnni.cpp (MAGNETAR_K_QUANTS_VNNI, with -mavx512vnni: register_avx512_k_quants_vnni, on CPUs with
// AVX-512 VNNI only), where each scaled sub-block sum added to an accumulator (add_madd) is one vpdpwssd instead of
// vpmaddwd + vpaddd: the same integers, so both builds are bit-identical to the reference as below.
//
// Contracts (quant/quant.h): n is a multiple of 256 (CHECKed), pointers need no alignment.
// Every kernel here is bit-identical to its scalar reference in quant/ref/k_quants.cpp:
//   - vec_dot computes the reference's exact integer sums per super-block (maddubs products of unsigned
//     quants with signed Q8_K values, then madd with the sub-block scales; mins and Q6_K's -32 offset are
//     applied through Q8_K's bsums) and then the reference's float steps, acc = fma(d, float(sumi), acc).
//   - vec_dot_2x2 (Q4_K, Q5_K, Q6_K; the prefill tiles) does the same per product, four products at once.
//   - quantize_q8_k rounds with cvtps_epi32, which under the default MXCSR rounding mode (nearest-even)
//     is ggml's nearest_int; it writes the reference's bytes.
//   - dequantize forms the reference's products in the reference's order.
// maddubs sums two u8 x s8 products into a saturating int16; with q <= 63 and |y| <= 128 a pair stays below
// 16,128, so it never saturates.
//
// Compiled with -mavx2 -mfma -mf16c (+ AVX-512 for the VNNI build): every helper is in the anonymous namespace so
// that no AVX2-encoded copy of an inline function can be picked by the linker for code that runs on older CPUs.
// Include it from those two files only.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/formats.h"

namespace magnetar::cpu {
namespace {

using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_K;
using quant::kQK_K;

int64_t super_blocks(int64_t n) {
  MAGNETAR_CHECK(n >= 0 && n % kQK_K == 0);
  return n / kQK_K;
}

__m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
__m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
__m128i load64(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }

float half_to_float(uint16_t h) { return _cvtsh_ss(h); }  // exact, subnormals included

// acc + the sums of adjacent int16 products of a and b, as int32 (madd): exact, a scale (<= 63 for Q4_K/Q5_K, a signed
// byte for Q6_K) times a maddubs pair sum (<= 16,128 in magnitude) stays far inside int32.
inline __m256i add_madd(__m256i acc, __m256i a, __m256i b) {
#if defined(MAGNETAR_K_QUANTS_VNNI)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// The reference's float step, acc + d * sumi rounded once; sumi is the float the reference gets from
// float(int32) (cvtepi32_ps rounds the same way).
float accumulate(float acc, float d, float sumi) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(d), _mm_set_ss(sumi), _mm_set_ss(acc)));
}

// ---- Q4_K / Q5_K scales ------------------------------------------------------------------------------------
// The 12 packed bytes (layout in quant/ref/scale_search.h) as 8 scales and 8 mins, one byte each, packed
// little-endian into two 64-bit halves.
struct ScalesMins {
  uint64_t scales;
  uint64_t mins;
};

ScalesMins unpack_scales_mins(const uint8_t* packed) {
  uint32_t w[3];
  std::memcpy(w, packed, sizeof(w));
  const uint32_t sc_lo = w[0] & 0x3f3f3f3fu;
  const uint32_t mn_lo = w[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  return {uint64_t(sc_lo) | (uint64_t(sc_hi) << 32), uint64_t(mn_lo) | (uint64_t(mn_hi) << 32)};
}

// Shuffle control that broadcasts int16 lane j of each 128-bit half to the whole half.
__m256i broadcast_lane16(int j) { return _mm256_set1_epi16(int16_t(0x0100 + 0x0202 * j)); }

// sum_j min_j * (bsums[2j] + bsums[2j+1]) as 4 partial int32 sums.
__m128i mins_dot_bsums(uint64_t mins, const int16_t* bsums) {
  const __m128i mins16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(mins)));
  const __m128i pair_sums = _mm_hadd_epi16(load128(bsums), load128(bsums + 8));  // 32-element sub-blocks
  return _mm_madd_epi16(mins16, pair_sums);
}

// Horizontal sums. Integer addition is exact, so any order gives the reference's sums; these use shuffles
// and adds only (hadd costs 3 uops).
// The sums of sumi (8 lanes) and summ (4 lanes), converted to float as the reference does (float(int)).
void reduce_pair(__m256i sumi, __m128i summ, float* s, float* m) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1));
  const __m128i t = _mm_add_epi32(_mm_unpacklo_epi64(s4, summ), _mm_unpackhi_epi64(s4, summ));
  const __m128 f = _mm_cvtepi32_ps(_mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1))));
  *s = _mm_cvtss_f32(f);
  *m = _mm_cvtss_f32(_mm_movehl_ps(f, f));
}

float reduce(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(_mm_cvtepi32_ps(t));
}

// ---- dot products ----------------------------------------------------------------------------------------

float vec_dot_q4_k(int64_t n, const void* vx, const void* vy) {
  const auto* xb = static_cast<const BlockQ4_K*>(vx);
  const auto* yb = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = super_blocks(n);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_K& x = xb[i];
    const BlockQ8_K& y = yb[i];
    const ScalesMins sm = unpack_scales_mins(x.scales);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm.scales))));
    const __m128i summ = mins_dot_bsums(sm.mins, y.bsums);

    // 64 elements per step: sub-block 2k in the low nibbles of 32 bytes, 2k+1 in the high nibbles.
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = load256(x.qs + 32 * k);
      const __m256i lo = _mm256_and_si256(q4, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
      const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(y.qs + 64 * k));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(y.qs + 64 * k + 32));
      sumi = add_madd(sumi, _mm256_shuffle_epi8(scales, broadcast_lane16(2 * k)), p_lo);
      sumi = add_madd(sumi, _mm256_shuffle_epi8(scales, broadcast_lane16(2 * k + 1)), p_hi);
    }
    float s, m;
    reduce_pair(sumi, summ, &s, &m);
    acc = accumulate(acc, half_to_float(x.d) * y.d, s);
    acc = accumulate(acc, -(half_to_float(x.dmin) * y.d), m);
  }
  return acc;
}

float vec_dot_q5_k(int64_t n, const void* vx, const void* vy) {
  const auto* xb = static_cast<const BlockQ5_K*>(vx);
  const auto* yb = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = super_blocks(n);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_K& x = xb[i];
    const BlockQ8_K& y = yb[i];
    const ScalesMins sm = unpack_scales_mins(x.scales);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm.scales))));
    const __m128i summ = mins_dot_bsums(sm.mins, y.bsums);

    // As Q4_K; bit j of qh[l] is the 5th bit of element l of sub-block j. `h` is qh shifted right by 2k,
    // so its bits 0 and 1 (moved to bit 4) belong to sub-blocks 2k and 2k+1.
    __m256i h = load256(x.qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i q4 = load256(x.qs + 32 * k);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), low4),
                                         _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
      h = _mm256_srli_epi16(h, 2);
      const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(y.qs + 64 * k));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(y.qs + 64 * k + 32));
      sumi = add_madd(sumi, _mm256_shuffle_epi8(scales, broadcast_lane16(2 * k)), p_lo);
      sumi = add_madd(sumi, _mm256_shuffle_epi8(scales, broadcast_lane16(2 * k + 1)), p_hi);
    }
    float s, m;
    reduce_pair(sumi, summ, &s, &m);
    acc = accumulate(acc, half_to_float(x.d) * y.d, s);
    acc = accumulate(acc, -(half_to_float(x.dmin) * y.d), m);
  }
  return acc;
}

// The four 32-element groups of one Q6_K half (128 elements) as unsigned 6-bit values (q + 32, 0..63).
// Layout in quant/ref/k_quants.cpp: group g takes the low (g < 2) or high nibble of ql[32 (g & 1) + l] and
// bits 2g..2g+1 of qh[l].
struct Q6Half {
  __m256i q[4];
};

Q6Half unpack_q6_half(const uint8_t* ql, const uint8_t* qh) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  const __m256i l0 = load256(ql);
  const __m256i l1 = load256(ql + 32);
  const __m256i h = load256(qh);
  return {{
      _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45)),
      _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45)),
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, bits45)),
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                      _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45)),
  }};
}

// Byte shuffle that spreads int8 scales s and s+1 over 8 bytes each (s = 2 * group, group < 8).
__m128i pair_spread(int group) {
  return _mm_set_epi64x(int64_t(0x0101010101010101ull * uint64_t(2 * group + 1)),
                        int64_t(0x0101010101010101ull * uint64_t(2 * group)));
}

float vec_dot_q6_k(int64_t n, const void* vx, const void* vy) {
  const auto* xb = static_cast<const BlockQ6_K*>(vx);
  const auto* yb = static_cast<const BlockQ8_K*>(vy);
  const int64_t nb = super_blocks(n);
  __m128i spread[8];
  for (int g = 0; g < 8; ++g) spread[g] = pair_spread(g);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& x = xb[i];
    const BlockQ8_K& y = yb[i];
    const __m128i sc8 = load128(x.scales);
    // The stored values are q + 32: sum(sc * q * y) = sum(sc * (q + 32) * y) - 32 * sum_j sc_j * bsums_j.
    const __m256i offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), load256(y.bsums));
    __m256i sumi = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const Q6Half qv = unpack_q6_half(x.ql + 64 * half, x.qh + 32 * half);
      for (int g = 0; g < 4; ++g) {
        const __m256i p = _mm256_maddubs_epi16(qv.q[g], load256(y.qs + 128 * half + 32 * g));
        // 128-bit half h of p holds sub-block 8 * half + 2g + h: scale it by that sub-block's scale.
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, spread[4 * half + g]));
        sumi = add_madd(sumi, sc, p);
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(offset, 5));
    acc = accumulate(acc, half_to_float(x.d) * y.d, reduce(sumi));
  }
  return acc;
}

// ---- 2x2 tiles: two weight rows x two activation rows ---------------------------------------------------------
// Each weight block is unpacked once and each activation block loaded once for four products; per product
// the integer sums are the ones vec_dot forms (integer addition is exact in any order) and the float steps
// are vec_dot's, done in the four lanes (x0.y0, x0.y1, x1.y0, x1.y1) of one vector: lane for lane the same
// rounded products and the same fmas in the same order, so out[] is bit-identical to four vec_dot calls.

// Lane k of the result: the sum of the 8 int32 lanes of v[k], k < 4.
__m128i reduce4(const __m256i (&v)[4]) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Lane k: the sum of the 4 int32 lanes of v[k].
__m128i reduce4(const __m128i (&v)[4]) {
  return _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]));
}

// {d(x0) d(y0), d(x0) d(y1), d(x1) d(y0), d(x1) d(y1)} as vec_dot forms each (one rounded float product).
__m128 scale_products(__m128 dx, float dy0, float dy1) { return _mm_mul_ps(dx, _mm_setr_ps(dy0, dy1, dy0, dy1)); }

// Two fp16 fields of two blocks, each field of a block widened into two adjacent lanes: {a0, a0, a1, a1}
// and {b0, b0, b1, b1}, where the fields lie at `offset` (a) and `offset + 2` (b) bytes of each block.
void widen_halves(const void* block0, const void* block1, size_t offset, __m128* a, __m128* b) {
  uint32_t h0, h1;
  std::memcpy(&h0, static_cast<const uint8_t*>(block0) + offset, 4);
  std::memcpy(&h1, static_cast<const uint8_t*>(block1) + offset, 4);
  const __m128 f = _mm_cvtph_ps(_mm_unpacklo_epi32(_mm_cvtsi32_si128(int(h0)), _mm_cvtsi32_si128(int(h1))));
  *a = _mm_shuffle_ps(f, f, _MM_SHUFFLE(2, 2, 0, 0));
  *b = _mm_shuffle_ps(f, f, _MM_SHUFFLE(3, 3, 1, 1));
}

// One Q4_K / Q5_K weight row's part of a 2x2 tile step k (sub-blocks 2k, 2k+1 of a super-block), given its codes of
// the two sub-blocks (lo: 2k, hi: 2k+1): adds the scaled sub-block dots with both tokens' activations (ya: sub-block
// 2k, yh: 2k+1) into sumi0, sumi1.
[[gnu::always_inline]] inline void k_tile_row(__m256i lo, __m256i hi, __m256i scales, __m256i ctrl_lo, __m256i ctrl_hi,
                                              const __m256i (&ya)[2], const __m256i (&yh)[2], __m256i& sumi0,
                                              __m256i& sumi1) {
  const __m256i sc_lo = _mm256_shuffle_epi8(scales, ctrl_lo);
  const __m256i sc_hi = _mm256_shuffle_epi8(scales, ctrl_hi);
  sumi0 = add_madd(add_madd(sumi0, sc_lo, _mm256_maddubs_epi16(lo, ya[0])), sc_hi, _mm256_maddubs_epi16(hi, yh[0]));
  sumi1 = add_madd(add_madd(sumi1, sc_lo, _mm256_maddubs_epi16(lo, ya[1])), sc_hi, _mm256_maddubs_epi16(hi, yh[1]));
}

// The 2x2 tile of Q4_K (kFifthBit false) or Q5_K (true: the 5th bits from qh, as vec_dot_q5_k places them).
template <typename Block, bool kFifthBit>
void vec_dot_2x2_q45_k(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const auto* xb0 = static_cast<const Block*>(vx0);
  const auto* xb1 = static_cast<const Block*>(vx1);
  const auto* yb0 = static_cast<const BlockQ8_K*>(vy0);
  const auto* yb1 = static_cast<const BlockQ8_K*>(vy1);
  const int64_t nb = super_blocks(n);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  __m128 acc = _mm_setzero_ps();  // lanes: x0.y0, x0.y1, x1.y0, x1.y1
  for (int64_t i = 0; i < nb; ++i) {
    const Block* x[2] = {&xb0[i], &xb1[i]};
    const BlockQ8_K& y0 = yb0[i];
    const BlockQ8_K& y1 = yb1[i];
    const ScalesMins sm0 = unpack_scales_mins(x[0]->scales);
    const ScalesMins sm1 = unpack_scales_mins(x[1]->scales);
    const __m256i scales[2] = {_mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm0.scales)))),
                               _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm1.scales))))};
    const __m128i mins0 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm0.mins)));
    const __m128i mins1 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sm1.mins)));
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256i h[2] = {};  // Q5_K: each row's qh shifted right by 2k (bits 0, 1 belong to sub-blocks 2k, 2k+1)
    if constexpr (kFifthBit) {
      h[0] = load256(x[0]->qh);
      h[1] = load256(x[1]->qh);
    }
    __m256i ctrl_lo = broadcast_lane16(0);
    __m256i ctrl_hi = broadcast_lane16(1);
#pragma GCC unroll 1
    for (int k = 0; k < 4; ++k) {
      const __m256i ya[2] = {load256(y0.qs + 64 * k), load256(y1.qs + 64 * k)};
      const __m256i yh[2] = {load256(y0.qs + 64 * k + 32), load256(y1.qs + 64 * k + 32)};
      for (int r = 0; r < 2; ++r) {
        const __m256i q4 = load256(x[r]->qs + 32 * k);
        __m256i lo = _mm256_and_si256(q4, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
        if constexpr (kFifthBit) {
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h[r], 4), bit4));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h[r], 3), bit4));
          h[r] = _mm256_srli_epi16(h[r], 2);
        }
        k_tile_row(lo, hi, scales[r], ctrl_lo, ctrl_hi, ya, yh, sumi[2 * r], sumi[2 * r + 1]);
      }
      ctrl_lo = _mm256_add_epi8(ctrl_lo, _mm256_set1_epi8(4));  // next sub-block pair's scales
      ctrl_hi = _mm256_add_epi8(ctrl_hi, _mm256_set1_epi8(4));
    }
    const __m128i pair_sums0 = _mm_hadd_epi16(load128(y0.bsums), load128(y0.bsums + 8));
    const __m128i pair_sums1 = _mm_hadd_epi16(load128(y1.bsums), load128(y1.bsums + 8));
    const __m128i summ[4] = {_mm_madd_epi16(mins0, pair_sums0), _mm_madd_epi16(mins0, pair_sums1),
                             _mm_madd_epi16(mins1, pair_sums0), _mm_madd_epi16(mins1, pair_sums1)};
    __m128 dx, dminx;
    widen_halves(x[0], x[1], offsetof(Block, d), &dx, &dminx);
    const __m128 d = scale_products(dx, y0.d, y1.d);
    const __m128 neg_dmin = _mm_xor_ps(scale_products(dminx, y0.d, y1.d), _mm_set1_ps(-0.0f));  // -(dmin d_y)
    acc = _mm_fmadd_ps(d, _mm_cvtepi32_ps(reduce4(sumi)), acc);
    acc = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(reduce4(summ)), acc);
  }
  _mm_storeu_ps(out, acc);
}

// One Q6_K weight row's half (128 elements) of a 2x2 tile: adds its scaled sub-block dots with both
// tokens' activations (y0, y1: the same half of their blocks) into sumi0, sumi1.
[[gnu::always_inline]] inline void q6_k_tile_row_half(const BlockQ6_K& x, int half, const __m128i (&spread)[8],
                                                      const int8_t* y0, const int8_t* y1, __m256i& sumi0,
                                                      __m256i& sumi1) {
  const __m128i sc8 = load128(x.scales);
  const Q6Half qv = unpack_q6_half(x.ql + 64 * half, x.qh + 32 * half);
  for (int g = 0; g < 4; ++g) {
    // 128-bit half h of a product holds sub-block 8 * half + 2g + h: scale it by that sub-block's scale.
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, spread[4 * half + g]));
    sumi0 = add_madd(sumi0, sc, _mm256_maddubs_epi16(qv.q[g], load256(y0 + 32 * g)));
    sumi1 = add_madd(sumi1, sc, _mm256_maddubs_epi16(qv.q[g], load256(y1 + 32 * g)));
  }
}

void vec_dot_2x2_q6_k(int64_t n, const void* vx0, const void* vx1, const void* vy0, const void* vy1, float* out) {
  const auto* xb0 = static_cast<const BlockQ6_K*>(vx0);
  const auto* xb1 = static_cast<const BlockQ6_K*>(vx1);
  const auto* yb0 = static_cast<const BlockQ8_K*>(vy0);
  const auto* yb1 = static_cast<const BlockQ8_K*>(vy1);
  const int64_t nb = super_blocks(n);
  __m128i spread[8];
  for (int g = 0; g < 8; ++g) spread[g] = pair_spread(g);
  __m128 acc = _mm_setzero_ps();  // lanes: x0.y0, x0.y1, x1.y0, x1.y1
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& x0 = xb0[i];
    const BlockQ6_K& x1 = xb1[i];
    const BlockQ8_K& y0 = yb0[i];
    const BlockQ8_K& y1 = yb1[i];
    __m256i sumi[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int half = 0; half < 2; ++half) {
      q6_k_tile_row_half(x0, half, spread, y0.qs + 128 * half, y1.qs + 128 * half, sumi[0], sumi[1]);
      q6_k_tile_row_half(x1, half, spread, y0.qs + 128 * half, y1.qs + 128 * half, sumi[2], sumi[3]);
    }
    // The stored values are q + 32: subtract 32 * sum_j sc_j * bsums_j, as vec_dot_q6_k.
    const __m256i sc16[2] = {_mm256_cvtepi8_epi16(load128(x0.scales)), _mm256_cvtepi8_epi16(load128(x1.scales))};
    const __m256i bsums[2] = {load256(y0.bsums), load256(y1.bsums)};
    for (int r = 0; r < 2; ++r) {
      for (int c = 0; c < 2; ++c) {
        const __m256i offset = _mm256_madd_epi16(sc16[r], bsums[c]);
        sumi[2 * r + c] = _mm256_sub_epi32(sumi[2 * r + c], _mm256_slli_epi32(offset, 5));
      }
    }
    const __m128 dx = _mm_cvtph_ps(_mm_setr_epi16(short(x0.d), short(x0.d), short(x1.d), short(x1.d), 0, 0, 0, 0));
    acc = _mm_fmadd_ps(scale_products(dx, y0.d, y1.d), _mm_cvtepi32_ps(reduce4(sumi)), acc);
  }
  _mm_storeu_ps(out, acc);
}

// ---- Q8_K quantization ------------------------------------------------------------------------------------

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  const int64_t nb = super_blocks(n);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i pack_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ8_K& b = blocks[i];

    // Largest magnitude, then the first element that has it (its sign picks the scale's sign). NaNs are skipped as
    // the reference's `>` skips them: maxps returns its second operand when either is NaN, so |x| goes first.
    __m256 vmax[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int c = 0; c < kQK_K / 8; ++c) {
      vmax[c & 3] = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * c), abs_mask), vmax[c & 3]);
    }
    __m256 m8 = _mm256_max_ps(_mm256_max_ps(vmax[0], vmax[1]), _mm256_max_ps(vmax[2], vmax[3]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0) {
      std::memset(&b, 0, sizeof(b));
      continue;
    }
    float max = 0;
    const __m256 vamax = _mm256_set1_ps(amax);
    for (int c = 0; c < kQK_K / 8; ++c) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + 8 * c), abs_mask);
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(a, vamax, _CMP_EQ_OQ));
      if (hit) {
        max = x[8 * c + __builtin_ctz(unsigned(hit))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 vscale = _mm256_set1_ps(iscale);

    // 32 elements per step: round, saturate to int8 (|v| <= 127 here, so saturation never bites), and
    // keep the sums of each 4 values for bsums. A NaN becomes 0, the reference's nearest_int of a quiet NaN
    // (cvtps_epi32 would give INT_MIN, -128 after the packs: outside the -127..127 the dot kernels rely on).
    const auto scaled = [&](const float* p) {
      const __m256 v = _mm256_mul_ps(vscale, _mm256_loadu_ps(p));
      return _mm256_cvtps_epi32(_mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q)));
    };
    __m256i sums4[8];
    for (int g = 0; g < 8; ++g) {
      const float* xg = x + 32 * g;
      const __m256i i0 = scaled(xg);
      const __m256i i1 = scaled(xg + 8);
      const __m256i i2 = scaled(xg + 16);
      const __m256i i3 = scaled(xg + 24);
      // packs works per 128-bit half; the permute restores element order.
      const __m256i q = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), pack_order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.qs + 32 * g), q);
      sums4[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    }
    // Two rounds of hadd turn four groups' sums of 4 into sums of 16: the low 128 bits get bsums 2g and the
    // high 128 bits bsums 2g+1 of groups g..g+3; interleaving the two halves restores order.
    const __m256i b0 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums4[0], sums4[1]), _mm256_hadd_epi32(sums4[2], sums4[3]));
    const __m256i b1 = _mm256_hadd_epi32(_mm256_hadd_epi32(sums4[4], sums4[5]), _mm256_hadd_epi32(sums4[6], sums4[7]));
    const __m256i b16 = _mm256_packs_epi32(b0, b1);  // |bsum| <= 16 * 127: no saturation
    const __m128i even = _mm256_castsi256_si128(b16);
    const __m128i odd = _mm256_extracti128_si256(b16, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.bsums), _mm_unpacklo_epi16(even, odd));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.bsums + 8), _mm_unpackhi_epi16(even, odd));
    b.d = 1 / iscale;
  }
}

// ---- dequantization ---------------------------------------------------------------------------------------

// y[32] = d1 * q - m1 for one Q4_K/Q5_K sub-block, q (0..31) given as 4 x 8 int32 vectors.
// The result would not change even if the multiply and subtraction were fused into one FMA (this file is
// built with -ffp-contract=off anyway): d1 * q is exact in float, as d1 = d * sc has at most 11 + 6
// significant bits and q at most 5, 22 bits in all.
void store_min_sub_block(const __m256i (&q)[4], float d1, float m1, float* y) {
  const __m256 vd = _mm256_set1_ps(d1);
  const __m256 vm = _mm256_set1_ps(m1);
  for (int t = 0; t < 4; ++t) {
    _mm256_storeu_ps(y + 8 * t, _mm256_sub_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(q[t])), vm));
  }
}

// The sub-block scale and min products exactly as the reference forms them (d * sc, dmin * m in float).
void sub_block_factors(const uint8_t* packed, int j, float d, float dmin, float* d1, float* m1) {
  const ScalesMins sm = unpack_scales_mins(packed);
  *d1 = d * float(uint8_t(sm.scales >> (8 * j)));
  *m1 = dmin * float(uint8_t(sm.mins >> (8 * j)));
}

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  const int64_t nb = super_blocks(n);
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_K& b = blocks[i];
    const float d = half_to_float(b.d);
    const float dmin = half_to_float(b.dmin);
    for (int k = 0; k < 4; ++k) {
      __m256i lo[4], hi[4];
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_cvtepu8_epi32(load64(b.qs + 32 * k + 8 * t));
        lo[t] = _mm256_and_si256(v, low4);
        hi[t] = _mm256_srli_epi32(v, 4);
      }
      float d1, m1, d2, m2;
      sub_block_factors(b.scales, 2 * k, d, dmin, &d1, &m1);
      sub_block_factors(b.scales, 2 * k + 1, d, dmin, &d2, &m2);
      float* y = dst + i * kQK_K + 64 * k;
      store_min_sub_block(lo, d1, m1, y);
      store_min_sub_block(hi, d2, m2, y + 32);
    }
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  const int64_t nb = super_blocks(n);
  const __m256i low4 = _mm256_set1_epi32(0x0F);
  const __m256i bit4 = _mm256_set1_epi32(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_K& b = blocks[i];
    const float d = half_to_float(b.d);
    const float dmin = half_to_float(b.dmin);
    for (int k = 0; k < 4; ++k) {
      __m256i lo[4], hi[4];
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_cvtepu8_epi32(load64(b.qs + 32 * k + 8 * t));
        const __m256i h = _mm256_srli_epi32(_mm256_cvtepu8_epi32(load64(b.qh + 8 * t)), 2 * k);
        lo[t] = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_slli_epi32(h, 4), bit4));
        hi[t] = _mm256_or_si256(_mm256_srli_epi32(v, 4), _mm256_and_si256(_mm256_slli_epi32(h, 3), bit4));
      }
      float d1, m1, d2, m2;
      sub_block_factors(b.scales, 2 * k, d, dmin, &d1, &m1);
      sub_block_factors(b.scales, 2 * k + 1, d, dmin, &d2, &m2);
      float* y = dst + i * kQK_K + 64 * k;
      store_min_sub_block(lo, d1, m1, y);
      store_min_sub_block(hi, d2, m2, y + 32);
    }
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  const int64_t nb = super_blocks(n);
  const __m256i offset = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ6_K& b = blocks[i];
    alignas(32) int8_t q[kQK_K];  // signed levels -32..31 in element order
    for (int half = 0; half < 2; ++half) {
      const Q6Half qv = unpack_q6_half(b.ql + 64 * half, b.qh + 32 * half);
      for (int g = 0; g < 4; ++g) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 128 * half + 32 * g), _mm256_sub_epi8(qv.q[g], offset));
      }
    }
    const float d = half_to_float(b.d);
    float* y = dst + i * kQK_K;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const __m256 ds = _mm256_set1_ps(d * float(b.scales[j]));  // (d * sc) * q, as the reference
      for (int t = 0; t < 2; ++t) {
        const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load64(q + 16 * j + 8 * t)));
        _mm256_storeu_ps(y + 16 * j + 8 * t, _mm256_mul_ps(ds, qf));
      }
    }
  }
}

}  // namespace

#if defined(MAGNETAR_K_QUANTS_VNNI)
// Registered before avx512/k_quants.cpp's Q6_K single dot, which replaces this one's (every one of these kernels gives
// the reference's bits, so the Q6_K tile here agrees with it).
void register_avx512_k_quants_vnni(KernelTable& table) {
  if (!__builtin_cpu_supports("avx512vnni")) return;  // the AVX2 build's kernels stay (fill_from)
#else
void register_avx2_k_quants(KernelTable& table) {
#endif
  table[uint32_t(quant::Type::Q4_K)] = {.vec_dot = vec_dot_q4_k,
                                        .quantize = nullptr,
                                        .dequantize = dequantize_q4_k,
                                        .vec_dot_2x2 = vec_dot_2x2_q45_k<BlockQ4_K, false>};
  table[uint32_t(quant::Type::Q5_K)] = {.vec_dot = vec_dot_q5_k,
                                        .quantize = nullptr,
                                        .dequantize = dequantize_q5_k,
                                        .vec_dot_2x2 = vec_dot_2x2_q45_k<BlockQ5_K, true>};
  table[uint32_t(quant::Type::Q6_K)] = {
      .vec_dot = vec_dot_q6_k, .quantize = nullptr, .dequantize = dequantize_q6_k, .vec_dot_2x2 = vec_dot_2x2_q6_k};
  table[uint32_t(quant::Type::Q8_K)] = {.vec_dot = nullptr, .quantize = quantize_q8_k, .dequantize = nullptr};
}

}  // namespace magnetar::cpu
