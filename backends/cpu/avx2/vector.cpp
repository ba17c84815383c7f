// AVX2 + FMA + F16C versions of the float-vector primitives (attention dot products and accumulations).
#include <immintrin.h>

#include "backends/cpu/kernels.h"

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

// Rows of up to kMaxDim elements are widened once into registers-sized chunks on the stack; longer rows
// (no current model) fall back to one query at a time.
constexpr int64_t kMaxDim = 256;
constexpr int64_t kMaxGroup = 16;

void dot_f16_multi(int64_t n, const uint16_t* k, const float* q, int64_t q_stride, int64_t n_q, float* out) {
  if (n > kMaxDim || n % 8 != 0 || n_q > kMaxGroup) {
    for (int64_t g = 0; g < n_q; ++g) out[g] = dot_f16_f32(n, k, q + g * q_stride);
    return;
  }
  alignas(32) float kf[kMaxDim];
  for (int64_t i = 0; i < n; i += 8) {
    _mm256_store_ps(kf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))));
  }
  for (int64_t g = 0; g < n_q; ++g) {
    const float* qg = q + g * q_stride;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_load_ps(kf + i), _mm256_loadu_ps(qg + i), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_load_ps(kf + i + 8), _mm256_loadu_ps(qg + i + 8), acc1);
    }
    if (i < n) acc0 = _mm256_fmadd_ps(_mm256_load_ps(kf + i), _mm256_loadu_ps(qg + i), acc0);
    out[g] = hsum(_mm256_add_ps(acc0, acc1));
  }
}

void dot_f32_multi(int64_t n, const float* k, const float* q, int64_t q_stride, int64_t n_q, float* out) {
  for (int64_t g = 0; g < n_q; ++g) out[g] = dot_f32(n, k, q + g * q_stride);
}

void axpy_f16_multi(int64_t n, const float* alpha, const uint16_t* v, float* y, int64_t y_stride, int64_t n_q) {
  if (n % 8 != 0) {
    for (int64_t g = 0; g < n_q; ++g) axpy_f16(n, alpha[g], v, y + g * y_stride);
    return;
  }
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 vi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    for (int64_t g = 0; g < n_q; ++g) {
      float* yg = y + g * y_stride + i;
      _mm256_storeu_ps(yg, _mm256_fmadd_ps(_mm256_set1_ps(alpha[g]), vi, _mm256_loadu_ps(yg)));
    }
  }
}

void axpy_f32_multi(int64_t n, const float* alpha, const float* v, float* y, int64_t y_stride, int64_t n_q) {
  for (int64_t g = 0; g < n_q; ++g) axpy_f32(n, alpha[g], v, y + g * y_stride);
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
  k.exp_sum = exp_sum;
  k.dot_f16_multi = dot_f16_multi;
  k.dot_f32_multi = dot_f32_multi;
  k.axpy_f16_multi = axpy_f16_multi;
  k.axpy_f32_multi = axpy_f32_multi;
  k.dot_f32 = dot_f32;
  k.dot_f16_f32 = dot_f16_f32;
  k.axpy_f32 = axpy_f32;
  k.axpy_f16 = axpy_f16;
}

}  // namespace magnetar::cpu
