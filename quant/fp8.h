// FP8 E4M3 (OCP 8-bit floating point, the "E4M3FN" variant NVIDIA's cvt and PyTorch's float8_e4m3fn use): a sign, 4
// exponent bits of bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN, the largest finite is 448
// (S.1111.110), subnormals m * 2^-9. The reference of the GPU's e4m3 KV cache. `static inline` as quant/fp16.h's
// helpers: the AVX2 kernel files include it too (docs/STYLE.md, SIMD kernels).
#pragma once

#include <cmath>
#include <cstdint>

namespace magnetar::quant {

inline constexpr float kFp8E4M3Max = 448.0f;

static inline float fp8_e4m3_to_float(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  float mag;
  if (e == 15 && m == 7) {
    mag = NAN;
  } else if (e == 0) {
    mag = std::ldexp(float(m), -9);
  } else {
    mag = std::ldexp(float(8 + m), e - 10);
  }
  return (c & 0x80) != 0 ? -mag : mag;
}

// Round to nearest, ties to even mantissa, saturating: |x| >= 448 (and infinities) give +-448, NaN gives 0x7f with
// x's sign (cvt.rn.satfinite.e4m3x2.f32's results).
static inline uint8_t float_to_fp8_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return uint8_t(sign | 0x7f);
  const float a = std::fabs(x);
  if (a >= kFp8E4M3Max) return uint8_t(sign | 0x7e);
  int e2 = 0;
  std::frexp(a, &e2);              // a = f * 2^e2, f in [0.5, 1): the normal exponent is e2 - 1
  if (a == 0.0f || e2 - 1 < -6) {  // subnormal range: steps of 2^-9 (a rounding up to 8 * 2^-9 is the smallest normal)
    return uint8_t(sign | int(std::nearbyint(std::ldexp(a, 9))));
  }
  const int e = e2 - 1;
  int m = int(std::nearbyint(std::ldexp(a, 3 - e))) - 8;  // (a / 2^e - 1) * 8, rounded half to even: 0..8
  int be = e + 7;
  if (m == 8) {
    m = 0;
    ++be;
  }
  if (be > 15 || (be == 15 && m == 7)) return uint8_t(sign | 0x7e);  // rounded past 448
  return uint8_t(sign | (be << 3) | m);
}

}  // namespace magnetar::quant
