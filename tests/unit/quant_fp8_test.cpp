// quant/fp8.h: FP8 E4M3 against the format's definition (OCP 8-bit floating point, E4M3: bias 7, no infinities,
// S.1111.111 NaN) and round-to-nearest-even with saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "quant/fp8.h"

namespace magnetar::quant {
namespace {

TEST(Fp8E4M3, CodesHaveTheFormatsValues) {
  // Values from the format's table: exponent field e, mantissa m -> (1 + m / 8) 2^(e - 7); e = 0: m 2^-9.
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);  // e 7, m 0
  EXPECT_EQ(fp8_e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x3c), 1.5f);          // e 7, m 4
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);        // e 15, m 6: the largest finite
  EXPECT_EQ(fp8_e4m3_to_float(0x08), 0.015625f);     // 2^-6, the smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x07), 0.013671875f);  // 7 * 2^-9
  EXPECT_EQ(fp8_e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x77), 240.0f);  // e 14, m 7: 1.875 * 128
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
  // Every other code is finite, and the codes of one sign increase with the value.
  for (int c = 1; c < 0x7f; ++c) {
    EXPECT_LT(fp8_e4m3_to_float(uint8_t(c - 1)), fp8_e4m3_to_float(uint8_t(c))) << c;
    EXPECT_EQ(fp8_e4m3_to_float(uint8_t(c | 0x80)), -fp8_e4m3_to_float(uint8_t(c))) << c;
  }
}

TEST(Fp8E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(uint8_t(c))), c) << c;
  }
}

TEST(Fp8E4M3, RoundsToTheNearestCodeTiesToEven) {
  // Random magnitudes over the whole range: the code's value is at least as near as both neighbours'; at a tie the
  // code is the one with an even mantissa (even code).
  std::mt19937 rng(20261205);
  std::uniform_real_distribution<float> log2mag(-11.0f, 8.7f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(log2mag(rng)) * (i % 2 ? -1.0f : 1.0f);
    const uint8_t c = float_to_fp8_e4m3(x);
    const float got = fp8_e4m3_to_float(c), a = std::fabs(x);
    if (a >= 448.0f) {
      EXPECT_EQ(got, std::copysign(448.0f, x)) << x;
      continue;
    }
    const int mag = c & 0x7f;
    const float err = std::fabs(std::fabs(got) - a);
    if (mag > 0) {
      EXPECT_LE(err, std::fabs(fp8_e4m3_to_float(uint8_t(mag - 1)) - a)) << x;
    }
    if (mag < 0x7e) {
      EXPECT_LE(err, std::fabs(fp8_e4m3_to_float(uint8_t(mag + 1)) - a)) << x;
    }
    EXPECT_EQ(std::signbit(got), std::signbit(x)) << x;
  }
  // Ties: halfway between 1.0 (0x38) and 1.125 (0x39) goes to 0x38; between 1.125 and 1.25 (0x3a) to 0x3a; halfway
  // between the two smallest subnormals to the even one.
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(float_to_fp8_e4m3(0.0029296875f), 0x02);  // 1.5 * 2^-9
  EXPECT_EQ(float_to_fp8_e4m3(0.0009765625f), 0x00);  // 0.5 * 2^-9
  // The largest subnormal rounding up into the normals: 7.5 * 2^-9 -> 8 * 2^-9 = 2^-6.
  EXPECT_EQ(float_to_fp8_e4m3(0.0146484375f), 0x08);
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(460.0f), 0x7e);  // nearer 448 than the 480 the format lacks
  EXPECT_EQ(float_to_fp8_e4m3(1e6f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_fp8_e4m3(1e-30f), 0x00);
}

}  // namespace
}  // namespace magnetar::quant
