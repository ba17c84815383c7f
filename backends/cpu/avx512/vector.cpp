// AVX-512 (F+VL) versions of attention's block products (cpu::VectorKernels::attn_scores / attn_accumulate); the
// other vector primitives come from avx2/vector.cpp. Heads of any length: the last 16-float step is masked.
// Compiled with -mavx512*: every helper is in the anonymous namespace (see avx2/float.cpp for why).
#include <immintrin.h>

#include <cstdint>

// GCC 12 reports the _mm512_undefined_*() placeholders inside its own AVX-512 intrinsics as uninitialized
// (GCC bug 105593, fixed in GCC 13); the warnings are about the compiler's headers, not this file.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "backends/cpu/avx2/score_sum.h"
#include "backends/cpu/kernels.h"

namespace magnetar::cpu {
namespace {

constexpr int64_t kLanes = 16;

// Lanes of the step at c of a d-float row: all 16, or the tail's.
__mmask16 step_mask(int64_t c, int64_t d) {
  return d - c >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (d - c)) - 1);
}

// Folds 16 lanes to 8 (lane i + lane i + 8).
__m256 fold(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

float dot_tree(int64_t d, const float* q, const float* k) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += kLanes) {
    const __mmask16 m = step_mask(c, d);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + c), _mm512_maskz_loadu_ps(m, k + c), acc);
  }
  return hsum_tree(fold(acc));
}

// Tiles of 4 query rows x 4 cached rows (16 accumulators); cached rows left over take dot_tree.
void attn_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const float* k, int64_t ldk, float scale,
                 float* s, int64_t lds) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) {
    const float* q0 = q + r * ldq;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const float* k0 = k + j * ldk;
      __m512 acc[4][4];
      for (auto& row : acc) {
        for (__m512& x : row) x = _mm512_setzero_ps();
      }
      for (int64_t c = 0; c < d; c += kLanes) {
        const __mmask16 mask = step_mask(c, d);
        __m512 kv[4];
        for (int ji = 0; ji < 4; ++ji) kv[ji] = _mm512_maskz_loadu_ps(mask, k0 + ji * ldk + c);
        for (int ri = 0; ri < 4; ++ri) {
          const __m512 qv = _mm512_maskz_loadu_ps(mask, q0 + ri * ldq + c);
          for (int ji = 0; ji < 4; ++ji) acc[ri][ji] = _mm512_fmadd_ps(qv, kv[ji], acc[ri][ji]);
        }
      }
      for (int half = 0; half < 2; ++half) {  // rows r + 2 * half and r + 2 * half + 1
        __m256 folded[8];
        for (int x = 0; x < 8; ++x) folded[x] = fold(acc[2 * half + x / 4][x % 4]);
        alignas(32) float out[8];
        _mm256_store_ps(out, _mm256_mul_ps(reduce8(folded), vscale));
        for (int x = 0; x < 8; ++x) s[(r + 2 * half + x / 4) * lds + j + x % 4] = out[x];
      }
    }
    for (; j < n; ++j) {
      for (int ri = 0; ri < 4; ++ri) s[(r + ri) * lds + j] = scale * dot_tree(d, q0 + ri * ldq, k + j * ldk);
    }
  }
  for (; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) s[r * lds + j] = scale * dot_tree(d, q + r * ldq, k + j * ldk);
  }
}

// kRows query rows x kVecs steps of 16 outputs (the last masked by `tail`) held in registers over the cached rows.
template <int kRows, int kVecs>
void accumulate_tile(int64_t n, const float* p, int64_t ldp, const float* v, int64_t ldv, float* o, int64_t ldo,
                     __mmask16 tail) {
  __mmask16 mask[kVecs];
  for (int vi = 0; vi < kVecs; ++vi) mask[vi] = vi == kVecs - 1 ? tail : __mmask16(0xffff);
  __m512 acc[kRows * kVecs];
#pragma GCC unroll 16
  for (int x = 0; x < kRows * kVecs; ++x)
    acc[x] = _mm512_maskz_loadu_ps(mask[x % kVecs], o + x / kVecs * ldo + kLanes * (x % kVecs));
  for (int64_t j = 0; j < n; ++j) {
    __m512 vv[kVecs];
#pragma GCC unroll 2
    for (int vi = 0; vi < kVecs; ++vi) vv[vi] = _mm512_maskz_loadu_ps(mask[vi], v + j * ldv + kLanes * vi);
#pragma GCC unroll 16
    for (int x = 0; x < kRows * kVecs; ++x) {
      acc[x] = _mm512_fmadd_ps(_mm512_set1_ps(p[x / kVecs * ldp + j]), vv[x % kVecs], acc[x]);
    }
  }
#pragma GCC unroll 16
  for (int x = 0; x < kRows * kVecs; ++x)
    _mm512_mask_storeu_ps(o + x / kVecs * ldo + kLanes * (x % kVecs), mask[x % kVecs], acc[x]);
}

template <int kRows>
void accumulate_rows(int64_t n, int64_t d, const float* p, int64_t ldp, const float* v, int64_t ldv, float* o,
                     int64_t ldo) {
  int64_t i = 0;
  for (; i + 2 * kLanes <= d; i += 2 * kLanes) {
    accumulate_tile<kRows, 2>(n, p, ldp, v + i, ldv, o + i, ldo, __mmask16(0xffff));
  }
  for (; i < d; i += kLanes) accumulate_tile<kRows, 1>(n, p, ldp, v + i, ldv, o + i, ldo, step_mask(i, d));
}

// Tiles of 8 (then 4, then 1) query rows x 32 outputs; every output is one chain of multiply-adds over j, so the bits
// are avx2/vector.cpp's.
void attn_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp, const float* v, int64_t ldv,
                     float* o, int64_t ldo) {
  int64_t r = 0;
  for (; r + 8 <= m; r += 8) accumulate_rows<8>(n, d, p + r * ldp, ldp, v, ldv, o + r * ldo, ldo);
  for (; r + 4 <= m; r += 4) accumulate_rows<4>(n, d, p + r * ldp, ldp, v, ldv, o + r * ldo, ldo);
  for (; r < m; ++r) accumulate_rows<1>(n, d, p + r * ldp, ldp, v, ldv, o + r * ldo, ldo);
}

void widen_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  }
  if (i < n) {
    const __mmask16 m = step_mask(i, n);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + i)));
  }
}

}  // namespace

void register_avx512_vector(VectorKernels& k) {
  k.attn_scores = attn_scores;
  k.attn_accumulate = attn_accumulate;
  k.widen_f16 = widen_f16;
}

}  // namespace magnetar::cpu
