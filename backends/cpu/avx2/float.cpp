// AVX2 + FMA + F16C kernels for the unquantized types F32, F16 and BF16: dot products (y has the type of
// x) and the element conversions to and from float.
//
// Contracts (quant/quant.h): n is any element count >= 0, pointers need no alignment.
// Conversions are bit-identical to quant/fp16.h (tests/kernels checks every 16-bit pattern); dot products
// accumulate in float and so differ from the double-accumulating reference only by float rounding.
// This file is compiled with -mavx2 -mfma -mf16c: every helper is in the anonymous namespace so that no
// AVX2-encoded copy of an inline function can be picked by the linker for code that runs on older CPUs.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels.h"
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

constexpr int kLanes = 8;                // floats per __m256
constexpr int kUnroll = 4;               // independent accumulators in the dot products
constexpr int kStep = kLanes * kUnroll;  // elements per main-loop iteration

// ---- loads: 8 elements of each type as 8 floats -----------------------------------------------------------

struct LoadF32 {
  using Elem = float;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
};

struct LoadF16 {
  using Elem = uint16_t;
  // F16C converts exactly (halfs are a subset of floats); signalling-NaN quieting is irrelevant to a dot.
  static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

// Used by dequantize_bf16; the BF16 dot avoids the widening (see vec_dot_bf16).
struct LoadBF16 {
  using Elem = uint16_t;
  // A bf16 is the high half of a float: widen to 32 bits and shift into place.
  static __m256 load(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- dot products -----------------------------------------------------------------------------------------

// Four accumulators keep four FMA chains in flight (FMA latency 4 cycles on Zen 3 and Skylake); on rows
// that stream from memory the loop is bound by bandwidth either way. The tail of fewer than 8 elements
// goes through a zero-padded copy so it uses the same float arithmetic as the body (0 * 0 adds nothing).
template <typename L>
float dot(int64_t n, const void* vx, const void* vy) {
  using Elem = typename L::Elem;
  const Elem* x = static_cast<const Elem*>(vx);
  const Elem* y = static_cast<const Elem*>(vy);
  __m256 acc[kUnroll];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    for (int u = 0; u < kUnroll; ++u) {
      acc[u] = _mm256_fmadd_ps(L::load(x + i + u * kLanes), L::load(y + i + u * kLanes), acc[u]);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    acc[0] = _mm256_fmadd_ps(L::load(x + i), L::load(y + i), acc[0]);
  }
  if (i < n) {
    Elem tx[kLanes] = {};
    Elem ty[kLanes] = {};
    std::memcpy(tx, x + i, size_t(n - i) * sizeof(Elem));
    std::memcpy(ty, y + i, size_t(n - i) * sizeof(Elem));
    acc[1] = _mm256_fmadd_ps(L::load(tx), L::load(ty), acc[1]);
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  return hsum(sum);
}

float vec_dot_f32(int64_t n, const void* x, const void* y) { return dot<LoadF32>(n, x, y); }
float vec_dot_f16(int64_t n, const void* x, const void* y) { return dot<LoadF16>(n, x, y); }

// BF16 without widening: a 256-bit load holds 16 bf16 in 8 32-bit lanes. Shifting each lane left by 16
// gives the even-indexed elements as floats, masking off the low half gives the odd-indexed ones. x and y
// pair up lane for lane, so two FMAs per 16 elements compute the dot with no shuffle. Widening loads
// (LoadBF16: a cross-lane zero-extension per 8 elements) ran the L2-resident dot at 23.8 GB/s, this form
// at 28.8-33.5 GB/s (docs/benchmarks/2026-11-30-quant-kernels.md; F16 with F16C: 44 GB/s).
__m256 bf16_even(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
__m256 bf16_odd(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u)))); }

float vec_dot_bf16(int64_t n, const void* vx, const void* vy) {
  constexpr int kChunk = 16;  // bf16 per 256-bit load
  const uint16_t* x = static_cast<const uint16_t*>(vx);
  const uint16_t* y = static_cast<const uint16_t*>(vy);
  auto load = [](const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); };
  __m256 acc[2 * kUnroll];  // even and odd accumulators per unrolled chunk
  for (__m256& a : acc) a = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kChunk * kUnroll <= n; i += kChunk * kUnroll) {
    for (int u = 0; u < kUnroll; ++u) {
      const __m256i a = load(x + i + u * kChunk);
      const __m256i b = load(y + i + u * kChunk);
      acc[2 * u] = _mm256_fmadd_ps(bf16_even(a), bf16_even(b), acc[2 * u]);
      acc[2 * u + 1] = _mm256_fmadd_ps(bf16_odd(a), bf16_odd(b), acc[2 * u + 1]);
    }
  }
  for (; i + kChunk <= n; i += kChunk) {
    const __m256i a = load(x + i);
    const __m256i b = load(y + i);
    acc[0] = _mm256_fmadd_ps(bf16_even(a), bf16_even(b), acc[0]);
    acc[1] = _mm256_fmadd_ps(bf16_odd(a), bf16_odd(b), acc[1]);
  }
  if (i < n) {  // a partial chunk goes through a zero-padded copy (0 * 0 adds nothing)
    uint16_t tx[kChunk] = {};
    uint16_t ty[kChunk] = {};
    std::memcpy(tx, x + i, size_t(n - i) * sizeof(uint16_t));
    std::memcpy(ty, y + i, size_t(n - i) * sizeof(uint16_t));
    const __m256i a = load(tx);
    const __m256i b = load(ty);
    acc[2] = _mm256_fmadd_ps(bf16_even(a), bf16_even(b), acc[2]);
    acc[3] = _mm256_fmadd_ps(bf16_odd(a), bf16_odd(b), acc[3]);
  }
  __m256 sum = acc[0];
  for (int k = 1; k < 2 * kUnroll; ++k) sum = _mm256_add_ps(sum, acc[k]);
  return hsum(sum);
}

// ---- F16 conversions --------------------------------------------------------------------------------------

// 8 halfs -> 8 floats. F16C is exact for every finite half and infinity, but it quiets signalling NaNs
// (sets float bit 22) where fp16.h keeps the payload unchanged; clear bit 22 again in those lanes:
// exponent all ones, mantissa non-zero, half quiet bit (0x200) clear.
__m256 f16x8_to_float(__m128i h) {
  const __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(h));
  const __m128i abs = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
  const __m128i is_nan = _mm_cmpgt_epi16(abs, _mm_set1_epi16(0x7c00));  // abs <= 0x7fff: signed is fine
  // Weights and activations hold no NaNs: skipping the fix-up then (a predictable branch) took the
  // DRAM-streaming dequantize from 11.96 to 13.93 GB/s (docs/benchmarks/2026-11-30-quant-kernels.md).
  if (_mm_testz_si128(is_nan, is_nan)) return _mm256_castsi256_ps(f);
  const __m128i quiet = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x0200)), _mm_set1_epi16(0x0200));
  const __m256i snan = _mm256_cvtepi16_epi32(_mm_andnot_si128(quiet, is_nan));  // all-ones lanes
  const __m256i clear = _mm256_and_si256(snan, _mm256_set1_epi32(0x00400000));
  return _mm256_castsi256_ps(_mm256_andnot_si256(clear, f));
}

// 8 floats -> 8 halfs, round to nearest even (F16C with an explicit rounding mode ignores MXCSR.RC).
// F16C keeps the top 9 payload bits of a NaN; fp16.h returns the canonical sign|0x7e00, so NaN lanes
// are masked down to their sign and quiet-NaN bits.
__m128i float_to_f16x8(__m256 f) {
  const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  return _mm_andnot_si128(_mm_and_si128(nan16, _mm_set1_epi16(0x01ff)), h);
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm256_storeu_ps(dst + i, f16x8_to_float(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  for (; i < n; ++i) dst[i] = quant::fp16_to_float(s[i]);
}

void quantize_f16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), float_to_f16x8(_mm256_loadu_ps(src + i)));
  }
  for (; i < n; ++i) d[i] = quant::float_to_fp16(src[i]);
}

// ---- BF16 conversions -------------------------------------------------------------------------------------

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(dst + i, LoadBF16::load(s + i));
  for (; i < n; ++i) dst[i] = quant::bf16_to_float(s[i]);
}

// 8 floats -> 8 bf16 in the low 16 bits of each 32-bit lane, by fp16.h's formula: NaN -> (u >> 16) | 0x40
// (quiet), otherwise round to nearest even by adding 0x7fff plus the lowest kept bit (no 32-bit overflow:
// only NaNs are above 0xff800000).
__m256i float_to_bf16x8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256 is_nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet_nan), is_nan));
}

void quantize_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const __m256i lo = float_to_bf16x8(_mm256_loadu_ps(src + i));
    const __m256i hi = float_to_bf16x8(_mm256_loadu_ps(src + i + kLanes));
    // Lanes hold values <= 0xffff, so the unsigned-saturating pack is exact; it interleaves the 128-bit
    // halves (lo0 hi0 lo1 hi1), which the permute puts back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
  }
  for (; i < n; ++i) d[i] = quant::float_to_bf16(src[i]);
}

}  // namespace

void register_avx2_float(KernelTable& table) {
  table[uint32_t(quant::Type::F32)].vec_dot = vec_dot_f32;  // F32 conversions are memcpy: reference is fine
  TypeKernels& f16 = table[uint32_t(quant::Type::F16)];
  f16 = {.vec_dot = vec_dot_f16, .quantize = quantize_f16, .dequantize = dequantize_f16};
  TypeKernels& bf16 = table[uint32_t(quant::Type::BF16)];
  bf16 = {.vec_dot = vec_dot_bf16, .quantize = quantize_bf16, .dequantize = dequantize_bf16};
}

}  // namespace magnetar::cpu
