// AVX2 + FMA + F16C versions of the float-vector primitives (attention scores and accumulations, softmax).
#include <immintrin.h>

#include <cmath>

#include "backends/cpu/avx2/score_sum.h"
#include "backends/cpu/kernels.h"
#include "quant/fp8.h"

namespace magnetar::cpu {
namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float tail_half(uint16_t h) { return _cvtsh_ss(h); }

float dot_f32(int64_t n, const float* a, const float* b) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float dot_f16_f32(int64_t n, const uint16_t* a, const float* b) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8)));
    acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + i), acc0);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += tail_half(a[i]) * b[i];
  return sum;
}

void axpy_f32(int64_t n, float alpha, const float* x, float* y) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void axpy_f16(int64_t n, float alpha, const uint16_t* x, float* y) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, vx, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * tail_half(x[i]);
}

void widen_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) dst[i] = tail_half(h[i]);
}

// An e4m3 byte's magnitude bits placed at f16 bit 7 are an f16 of the same mantissa and exponent field, worth the
// e4m3 value times 2^-8 (the biases 15 and 7; subnormals alike): the hardware's f16 conversion and an exact multiply
// by 256 give the value. The NaN codes (magnitude 0x7f, which would read 480) get f16 NaN bits first.
void widen_f8(const void* src, float* dst, int64_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(src);
  const __m256i mag_mask = _mm256_set1_epi16(0x7f), sign_mask = _mm256_set1_epi16(0x80);
  const __m256i nan_bits = _mm256_set1_epi16(0x7e00);
  const __m256 scale = _mm256_set1_ps(256.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256i mag = _mm256_and_si256(w, mag_mask);
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, sign_mask), 8), _mm256_slli_epi16(mag, 7));
    h = _mm256_or_si256(h, _mm256_and_si256(_mm256_cmpeq_epi16(mag, mag_mask), nan_bits));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), scale));
    _mm256_storeu_ps(dst + i + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), scale));
  }
  for (; i < n; ++i) dst[i] = quant::fp8_e4m3_to_float(b[i]);
}

float dot_tree(int64_t d, const float* q, const float* k) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), acc);
  return hsum_tree(acc);
}

// Tiles of 4 query rows x 2 cached rows (8 accumulators); rows left over take dot_tree. Heads whose length is not a
// multiple of 8 (no current model) take the scalar version, the whole call alike.
void attn_scores(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const float* k, int64_t ldk, float scale,
                 float* s, int64_t lds) {
  if (d % 8 != 0) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int64_t c = 0; c < d; ++c) sum += q[r * ldq + c] * k[j * ldk + c];
        s[r * lds + j] = scale * sum;
      }
    }
    return;
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) {
    const float* q0 = q + r * ldq;
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const float* k0 = k + j * ldk;
      __m256 acc[8];
      for (__m256& a : acc) a = _mm256_setzero_ps();
      for (int64_t c = 0; c < d; c += 8) {
        const __m256 ka = _mm256_loadu_ps(k0 + c), kb = _mm256_loadu_ps(k0 + ldk + c);
        for (int ri = 0; ri < 4; ++ri) {
          const __m256 qv = _mm256_loadu_ps(q0 + ri * ldq + c);
          acc[2 * ri] = _mm256_fmadd_ps(qv, ka, acc[2 * ri]);
          acc[2 * ri + 1] = _mm256_fmadd_ps(qv, kb, acc[2 * ri + 1]);
        }
      }
      alignas(32) float out[8];
      _mm256_store_ps(out, _mm256_mul_ps(reduce8(acc), vscale));
      for (int ri = 0; ri < 4; ++ri) {
        s[(r + ri) * lds + j] = out[2 * ri];
        s[(r + ri) * lds + j + 1] = out[2 * ri + 1];
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

// kRows query rows x kVecs vectors of 8 outputs held in registers over the block's cached rows.
template <int kRows, int kVecs>
void accumulate_tile(int64_t n, const float* p, int64_t ldp, const float* v, int64_t ldv, float* o, int64_t ldo) {
  __m256 acc[kRows * kVecs];  // flat and fully unrolled: GCC keeps it in registers
#pragma GCC unroll 8
  for (int x = 0; x < kRows * kVecs; ++x) acc[x] = _mm256_loadu_ps(o + x / kVecs * ldo + 8 * (x % kVecs));
  for (int64_t j = 0; j < n; ++j) {
    __m256 vv[kVecs];
#pragma GCC unroll 2
    for (int vi = 0; vi < kVecs; ++vi) vv[vi] = _mm256_loadu_ps(v + j * ldv + 8 * vi);
#pragma GCC unroll 8
    for (int x = 0; x < kRows * kVecs; ++x) {
      acc[x] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + x / kVecs * ldp + j), vv[x % kVecs], acc[x]);
    }
  }
#pragma GCC unroll 8
  for (int x = 0; x < kRows * kVecs; ++x) _mm256_storeu_ps(o + x / kVecs * ldo + 8 * (x % kVecs), acc[x]);
}

// Tiles of 4 query rows x 16 outputs; every output is one chain of multiply-adds over j (std::fma where the head
// length is not a multiple of 8).
void attn_accumulate(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp, const float* v, int64_t ldv,
                     float* o, int64_t ldo) {
  if (d % 8 != 0) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < d; ++i) o[r * ldo + i] = std::fma(p[r * ldp + j], v[j * ldv + i], o[r * ldo + i]);
      }
    }
    return;
  }
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) {
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) accumulate_tile<4, 2>(n, p + r * ldp, ldp, v + i, ldv, o + r * ldo + i, ldo);
    if (i < d) accumulate_tile<4, 1>(n, p + r * ldp, ldp, v + i, ldv, o + r * ldo + i, ldo);
  }
  for (; r < m; ++r) {
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) accumulate_tile<1, 2>(n, p + r * ldp, ldp, v + i, ldv, o + r * ldo + i, ldo);
    if (i < d) accumulate_tile<1, 1>(n, p + r * ldp, ldp, v + i, ldv, o + r * ldo + i, ldo);
  }
}

// exp(x) for x <= 0 (softmax after subtracting the max): Cody-Waite range reduction x = n ln2 + r,
// |r| <= ln2/2, a degree-6 polynomial for e^r (Cephes' expf coefficients, relative error ~1e-7), and 2^n
// built in the exponent field. Inputs below -87.3 flush to 0 (e^-87.3 is below FLT_MIN anyway).
__m256 exp_nonpositive(__m256 x) {
  const __m256 min_x = _mm256_set1_ps(-87.3f);
  const __m256 underflow = _mm256_cmp_ps(x, min_x, _CMP_LT_OQ);
  x = _mm256_max_ps(x, min_x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

float max(int64_t n, const float* x) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  float out = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  for (; i < n; ++i) out = x[i] > out ? x[i] : out;
  return out;
}

float exp_sum(int64_t n, float* x, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    alignas(32) float lane[8] = {x[i] - max};
    const __m256 e = exp_nonpositive(_mm256_load_ps(lane));
    x[i] = _mm256_cvtss_f32(e);
    sum += x[i];
  }
  return sum;
}

}  // namespace

void register_avx2_vector(VectorKernels& k) {
  k.max = max;
  k.exp_sum = exp_sum;
  k.attn_scores = attn_scores;
  k.attn_accumulate = attn_accumulate;
  k.dot_f32 = dot_f32;
  k.dot_f16_f32 = dot_f16_f32;
  k.axpy_f32 = axpy_f32;
  k.axpy_f16 = axpy_f16;
  k.widen_f16 = widen_f16;
  k.widen_f8 = widen_f8;
}

}  // namespace magnetar::cpu
