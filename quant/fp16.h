// IEEE half and bfloat16 <-> float conversions, bit-exact with the conversions ggml uses on the CPU
// (round-to-nearest-even; bf16 NaNs stay quiet NaNs). Scalar and header-only so every kernel can inline them.
// static: each translation unit keeps its own copy, so a copy compiled with -mavx512f in a kernel file can
// never be the one the linker picks for code that runs on an older CPU.
#pragma once

#include <cstdint>
#include <cstring>

namespace magnetar::quant {

static inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

static inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // subnormal: value = mant * 2^-24, exact in float
    float v = float(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t float_to_fp16(float f) {
  const uint32_t x = float_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));  // inf/nan
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // result is subnormal or zero: round abs * 2^24 to nearest even integer
    if (abs < 0x33000000u) return uint16_t(sign);  // < 2^-25: rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (112 - e) ... m is 24 bits; value = m * 2^(e-150)
    // half subnormal unit is 2^-24: q = m * 2^(e-150+24) = m >> (126 - e)
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return uint16_t(sign | q);
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits, nearest-even (carry may bump exponent)
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return uint16_t(sign | h);
}

// MXFP4's E8M0 block exponent as ggml applies it: 2^(e - 128), half the OCP scale 2^(e - 127), because the
// element table kMXFP4Values holds the E2M1 values doubled. e = 0 and 1 give the float subnormals 2^-128 and
// 2^-127; e = 255 (NaN in the OCP spec) gives 2^127, as in ggml.
static inline float e8m0_to_float_half(uint8_t e) {
  return bits_to_float(e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23));
}

static inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

static inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64);  // quiet nan
  return uint16_t((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

}  // namespace magnetar::quant
