// AVX-512 (F+BW+VL+DQ) kernels for the unquantized types F32, F16 and BF16: dot products (y has the type
// of x) and the element conversions to and from float.
//
// Contracts (quant/quant.h): n is any element count >= 0, pointers need no alignment.
// Conversions are bit-identical to quant/fp16.h (tests/kernels checks every 16-bit pattern); dot products
// accumulate in float. Only the instructions of the ISA's CMake flags are used (no AVX512_BF16: the
// dispatcher does not check for it). Tails use masked loads and stores, so there is no scalar epilogue.
// Compiled with -mavx512*: every helper is in the anonymous namespace (see avx2/float.cpp for why).
#include <immintrin.h>

#include <cstdint>

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics as uninitialized
// (GCC bug 105593, fixed in GCC 13); the warnings are about the compiler's headers, not this file.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "backends/cpu/kernels.h"

namespace magnetar::cpu {
namespace {

constexpr int kLanes = 16;  // floats per __m512
constexpr int kUnroll = 4;  // independent accumulators in the dot products
constexpr int kStep = kLanes * kUnroll;

// Mask of the first r lanes, 0 <= r <= 16.
__mmask16 first_lanes(int64_t r) { return __mmask16((1u << r) - 1); }

// ---- loads: 16 elements of each type as 16 floats; lanes outside the mask read as 0.0f ----------------------

struct LoadF32 {
  using Elem = float;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

struct LoadF16 {
  using Elem = uint16_t;
  // Exact for all finite halfs and infinities; signalling-NaN quieting does not matter to a dot.
  static __m512 load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load(const uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

struct LoadBF16 {
  using Elem = uint16_t;
  // A bf16 is the high half of a float.
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const uint16_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load(const uint16_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

// ---- dot products -----------------------------------------------------------------------------------------

// Four FMA chains in flight, then one masked step for the tail (masked-off lanes load 0 and add nothing).
template <typename L>
float dot(int64_t n, const void* vx, const void* vy) {
  using Elem = typename L::Elem;
  const Elem* x = static_cast<const Elem*>(vx);
  const Elem* y = static_cast<const Elem*>(vy);
  __m512 acc[kUnroll];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    for (int u = 0; u < kUnroll; ++u) {
      acc[u] = _mm512_fmadd_ps(L::load(x + i + u * kLanes), L::load(y + i + u * kLanes), acc[u]);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    acc[0] = _mm512_fmadd_ps(L::load(x + i), L::load(y + i), acc[0]);
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    acc[1] = _mm512_fmadd_ps(L::load(x + i, m), L::load(y + i, m), acc[1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

float vec_dot_f32(int64_t n, const void* x, const void* y) { return dot<LoadF32>(n, x, y); }
float vec_dot_f16(int64_t n, const void* x, const void* y) { return dot<LoadF16>(n, x, y); }
// BF16 without widening (see avx2/float.cpp): a 512-bit load holds 32 bf16; shifting each 32-bit lane left
// by 16 gives the even-indexed elements as floats, masking off the low half the odd-indexed ones, and x and
// y pair up lane for lane. The tail is one masked load (masked-off elements read as +0).
__m512 bf16_even(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
__m512 bf16_odd(__m512i v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u)))); }

float vec_dot_bf16(int64_t n, const void* vx, const void* vy) {
  constexpr int kChunk = 32;  // bf16 per 512-bit load
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  const uint16_t* y = static_cast<const uint16_t*>(vy);
  __m512 acc[2 * kUnroll];  // even and odd accumulators per unrolled chunk
  for (__m512& a : acc) a = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kChunk * kUnroll <= n; i += kChunk * kUnroll) {
    for (int u = 0; u < kUnroll; ++u) {
      const __m512i a = _mm512_loadu_si512(x + i + u * kChunk);
      const __m512i b = _mm512_loadu_si512(y + i + u * kChunk);
      acc[2 * u] = _mm512_fmadd_ps(bf16_even(a), bf16_even(b), acc[2 * u]);
      acc[2 * u + 1] = _mm512_fmadd_ps(bf16_odd(a), bf16_odd(b), acc[2 * u + 1]);
    }
  }
  for (; i < n; i += kChunk) {
    const int64_t r = n - i < kChunk ? n - i : kChunk;
    const __mmask32 m = r == kChunk ? ~__mmask32(0) : __mmask32((1u << r) - 1);
    const __m512i a = _mm512_maskz_loadu_epi16(m, x + i);
    const __m512i b = _mm512_maskz_loadu_epi16(m, y + i);
    acc[0] = _mm512_fmadd_ps(bf16_even(a), bf16_even(b), acc[0]);
    acc[1] = _mm512_fmadd_ps(bf16_odd(a), bf16_odd(b), acc[1]);
  }
  __m512 sum = acc[0];
  for (int k = 1; k < 2 * kUnroll; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}

// ---- F16 conversions --------------------------------------------------------------------------------------

// 16 halfs -> 16 floats. The hardware conversion quiets signalling NaNs (sets float bit 22); fp16.h keeps
// the payload, so bit 22 is cleared again in lanes holding a half signalling NaN (exponent all ones,
// mantissa non-zero, quiet bit 0x200 clear).
__m512 f16x16_to_float(__m256i h) {
  const __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
  const __mmask16 is_nan =
      _mm256_cmpgt_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x7c00));
  const __mmask16 snan = _mm256_mask_testn_epi16_mask(is_nan, h, _mm256_set1_epi16(0x0200));
  return _mm512_castsi512_ps(_mm512_mask_and_epi32(f, snan, f, _mm512_set1_epi32(~0x00400000)));
}

// 16 floats -> 16 halfs, round to nearest even (explicit rounding mode: MXCSR.RC is ignored). NaN lanes
// become fp16.h's canonical sign|0x7e00 (the hardware keeps the top 9 payload bits).
__m256i float_to_f16x16(__m512 f) {
  const __m256i h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm256_mask_blend_epi16(is_nan, h, _mm256_and_si256(h, _mm256_set1_epi16(int16_t(0xfe00))));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(dst + i, f16x16_to_float(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, f16x16_to_float(_mm256_maskz_loadu_epi16(m, s + i)));
  }
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), float_to_f16x16(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm256_mask_storeu_epi16(d + i, m, float_to_f16x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

// ---- BF16 conversions -------------------------------------------------------------------------------------

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm512_storeu_ps(dst + i, LoadBF16::load(s + i));
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, m, LoadBF16::load(s + i, m));
  }
}

// 16 floats -> 16 bf16, by fp16.h's formula: NaN -> (u >> 16) | 0x40 (quiet), otherwise round to nearest
// even by adding 0x7fff plus the lowest kept bit (no 32-bit overflow: only NaNs are above 0xff800000).
// The results are <= 0xffff, so the truncating 32 -> 16 narrowing (vpmovdw) is exact.
__m256i float_to_bf16x16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  const __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), float_to_bf16x16(_mm512_loadu_ps(src + i)));
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    _mm256_mask_storeu_epi16(d + i, m, float_to_bf16x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

}  // namespace

void register_avx512_float(KernelTable& table) {
  table[uint32_t(quant::Type::F32)].vec_dot = vec_dot_f32;  // F32 conversions are memcpy: reference is fine
  TypeKernels& f16 = table[uint32_t(quant::Type::F16)];
  f16 = {.vec_dot = vec_dot_f16, .quantize = quantize_f16, .dequantize = dequantize_f16};
  TypeKernels& bf16 = table[uint32_t(quant::Type::BF16)];
  bf16 = {.vec_dot = vec_dot_bf16, .quantize = quantize_bf16, .dequantize = dequantize_bf16};
}

}  // namespace magnetar::cpu
