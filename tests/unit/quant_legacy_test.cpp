// Unit tests of the 32-element block family's scalar references (quant/ref/legacy.cpp): Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4.
//
// Expected values come from outside the code under test: hand-packed blocks decoded by the format's
// formula with literal tables (the IQ4_NL levels as published, the E2M1 values of the OCP MX spec),
// inputs built to be exactly representable, per-element error bounds derived from each format's rounding
// rule plus the fp16 rounding of its scales, and dot products checked against a double-precision dot of
// the dequantized operands. Bit-exactness against llama.cpp itself is the conformance test's job.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/quant.h"

namespace magnetar::quant {
namespace legacy_test {

// The IQ4_NL levels as published with the format (llama.cpp PR 5590), written out here.
constexpr double kNonLinear[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// OCP MX v1.0 E2M1 element values, codes 0..15 (sign bit 3, then 2 exponent bits and 1 mantissa bit).
constexpr double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
// fp16's unit roundoff: |fp16(v) - v| <= |v| * kHalfEps for normal results.
constexpr double kHalfEps = 1.0 / 2048;

constexpr Type kWeightTypes[] = {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1,
                                 Type::Q8_0, Type::IQ4_NL, Type::MXFP4};
constexpr Type kAllTypes[] = {Type::Q4_0, Type::Q4_1, Type::Q5_0,   Type::Q5_1,
                              Type::Q8_0, Type::Q8_1, Type::IQ4_NL, Type::MXFP4};

// Weight-like data: Gaussian (sigma 0.02) with 1% outliers 12x larger, as in the conformance vectors.
std::vector<float> weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 0.02f);
  std::vector<float> v(size_t(n), 0.f);
  for (float& x : v) x = dist(rng) * (rng() % 100 == 0 ? 12.f : 1.f);
  return v;
}

std::vector<uint8_t> quantize(Type type, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_size(type, int64_t(x.size())));
  traits(type).from_float(x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize(Type type, const void* q, int64_t n) {
  std::vector<float> x(size_t(n), 0.f);
  traits(type).to_float(q, x.data(), n);
  return x;
}

template <typename Block>
const Block& block_at(const std::vector<uint8_t>& q, int64_t i) {
  return reinterpret_cast<const Block*>(q.data())[i];
}

double f16(uint16_t h) { return fp16_to_float(h); }

// Distance from v to the nearest of d * levels[k] (in double).
double nearest_distance(double v, double d, const double* levels, int n_levels) {
  double best = INFINITY;
  for (int k = 0; k < n_levels; ++k) best = std::min(best, std::fabs(v - d * levels[k]));
  return best;
}

// ---- known values: hand-packed blocks decoded by the format formulas ------------------------------------

TEST(QuantLegacy, Q4_0DecodesNibblesAsSignedSteps) {
  BlockQ4_0 b{};
  b.d = 0x3800;     // 0.5
  b.qs[0] = 0xf3;   // element 0: code 3, element 16: code 15
  b.qs[15] = 0x08;  // element 15: code 8, element 31: code 0
  const std::vector<float> x = dequantize(Type::Q4_0, &b, kQK32);
  EXPECT_EQ(x[0], (3 - 8) * 0.5f);
  EXPECT_EQ(x[16], (15 - 8) * 0.5f);
  EXPECT_EQ(x[15], 0.f);
  EXPECT_EQ(x[31], -4.f);
  EXPECT_EQ(x[1], -4.f);  // untouched bytes hold code 0
}

TEST(QuantLegacy, Q4_1AddsTheMinAfterScaling) {
  BlockQ4_1 b{};
  b.d = 0x3400;  // 0.25
  b.m = 0xbc00;  // -1.0
  b.qs[1] = 0x5a;
  const std::vector<float> x = dequantize(Type::Q4_1, &b, kQK32);
  EXPECT_EQ(x[1], 10 * 0.25f - 1.f);
  EXPECT_EQ(x[17], 5 * 0.25f - 1.f);
  EXPECT_EQ(x[0], -1.f);
}

TEST(QuantLegacy, Q5TakesTheFifthBitFromTheLittleEndianWord) {
  BlockQ5_0 b{};
  b.d = 0x3c00;      // 1.0
  b.qs[2] = 0x1f;    // element 2: low bits 15, element 18: low bits 1
  b.qh[0] = 1 << 2;  // bit 2: element 2 has its 5th bit; bit 18 (element 18) stays clear
  b.qh[3] = 0x80;    // bit 31: element 31
  const std::vector<float> x = dequantize(Type::Q5_0, &b, kQK32);
  EXPECT_EQ(x[2], 31 - 16);
  EXPECT_EQ(x[18], 1 - 16);
  EXPECT_EQ(x[31], 16 - 16);
  EXPECT_EQ(x[0], -16);

  BlockQ5_1 c{};
  c.d = 0x3800;      // 0.5
  c.m = 0x4000;      // 2.0
  c.qh[2] = 1 << 3;  // bit 19: element 19
  const std::vector<float> y = dequantize(Type::Q5_1, &c, kQK32);
  EXPECT_EQ(y[3], 2.f);
  EXPECT_EQ(y[19], 16 * 0.5f + 2.f);
}

TEST(QuantLegacy, Q8DecodesSignedBytes) {
  BlockQ8_0 b{};
  b.d = 0x2c00;  // 2^-4
  b.qs[5] = -128;
  b.qs[31] = 127;
  const std::vector<float> x = dequantize(Type::Q8_0, &b, kQK32);
  EXPECT_EQ(x[5], -8.f);
  EXPECT_EQ(x[31], 127.f / 16);

  BlockQ8_1 c{};
  c.d = 0x3c00;
  c.s = 0x7bff;  // s is the dot product's helper, not part of the values
  c.qs[7] = -3;
  const std::vector<float> y = dequantize(Type::Q8_1, &c, kQK32);
  EXPECT_EQ(y[7], -3.f);
  EXPECT_EQ(y[8], 0.f);
}

TEST(QuantLegacy, IQ4_NLUsesThePublishedLevels) {
  BlockIQ4_NL b{};
  b.d = 0x3c00;  // 1.0
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (15 - j) << 4);
  const std::vector<float> x = dequantize(Type::IQ4_NL, &b, kQK32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], kNonLinear[j]) << j;
    EXPECT_EQ(x[16 + j], kNonLinear[15 - j]) << j;
  }
}

TEST(QuantLegacy, MXFP4DecodesE2M1TimesTheSharedExponent) {
  BlockMXFP4 b{};
  for (int j = 0; j < 16; ++j) b.qs[j] = uint8_t(j | (15 - j) << 4);
  // E8M0 exponent e scales by 2^(e - 127); e = 0 and 1 give float subnormal results, 254 the largest.
  for (int e : {127, 0, 1, 100, 150, 254}) {
    b.e = uint8_t(e);
    const std::vector<float> x = dequantize(Type::MXFP4, &b, kQK32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(x[j], float(std::ldexp(kE2M1[j], e - 127))) << "e=" << e << " code " << j;
      EXPECT_EQ(x[16 + j], float(std::ldexp(kE2M1[15 - j], e - 127))) << "e=" << e << " code " << 15 - j;
    }
  }
}

// ---- exact round trips: values on the format's grid come back unchanged, codes and all -----------------

// Packs 32 codes in the family's layout (element j in the low nibble of byte j, element j + 16 in the
// high nibble), written from the format description; the 5th bits as bit j of a little-endian word.
void pack_nibbles(const uint8_t codes[kQK32], uint8_t qs[kQK32 / 2]) {
  for (int j = 0; j < kQK32 / 2; ++j) qs[j] = uint8_t((codes[j] & 15) | (codes[j + 16] & 15) << 4);
}
void pack_fifth_bits(const uint8_t codes[kQK32], uint8_t qh[4]) {
  for (int j = 0; j < kQK32; ++j) qh[j / 8] = uint8_t(qh[j / 8] | ((codes[j] >> 4) & 1) << (j % 8));
}

// Random blocks on the format's grid whose largest magnitude sits where each quantizer takes its scale
// from, so that quantize(dequantize(b)) must give back b byte for byte.
//   Q4_0/Q5_0  d > 0 and one element at code 0 (value -2^(bits-1) d): d = max / -2^(bits-1) recovers d.
//   Q4_1/Q5_1  codes 0 and 2^bits - 1 both present; d a power of two and m a multiple of it keep every
//              m + q d, and (max - min) / (2^bits - 1), exact in float.
//   MXFP4      one element at code 7 (E2M1 6.0) puts the block max in the top binade; no code 8 (-0
//              reads back as +0, which quantizes to code 0).
std::vector<uint8_t> random_grid_blocks(Type type, int n_blocks, std::mt19937& rng) {
  const size_t bs = traits(type).type_size;
  std::vector<uint8_t> q(bs * size_t(n_blocks));
  auto code = [&](int lo, int hi) { return uint8_t(lo + int(rng() % uint32_t(hi - lo + 1))); };
  for (int i = 0; i < n_blocks; ++i) {
    const bool five = type == Type::Q5_0 || type == Type::Q5_1;
    const int top = five ? 31 : 15;
    const int pin = int(rng() % kQK32);
    uint8_t codes[kQK32];
    const uint16_t d = uint16_t(0x2000 + rng() % 0x2000);  // positive normal fp16 in [2^-7, 2^1)
    const uint16_t d_pow2 = uint16_t(d & 0x7c00);
    const uint16_t m = float_to_fp16(-float(rng() % 64) * fp16_to_float(d_pow2));
    uint8_t* dst = q.data() + bs * size_t(i);
    switch (type) {
      case Type::Q4_0:
      case Type::Q5_0:
        for (int j = 0; j < kQK32; ++j) codes[j] = j == pin ? 0 : code(1, top);
        break;
      case Type::Q4_1:
      case Type::Q5_1:
        for (int j = 0; j < kQK32; ++j) codes[j] = code(0, top);
        codes[pin] = 0;
        codes[(pin + 1) % kQK32] = uint8_t(top);
        break;
      case Type::MXFP4:
        for (int j = 0; j < kQK32; ++j) codes[j] = j == pin ? 7 : code(0, 14);
        for (int j = 0; j < kQK32; ++j) codes[j] = uint8_t(codes[j] + (j != pin && codes[j] >= 8));
        break;
      default:
        ADD_FAILURE() << "no grid generator for " << type_name(type);
        return q;
    }
    if (type == Type::Q4_0) {
      BlockQ4_0 b{.d = d, .qs = {}};
      pack_nibbles(codes, b.qs);
      std::memcpy(dst, &b, bs);
    } else if (type == Type::Q5_0) {
      BlockQ5_0 b{.d = d, .qh = {}, .qs = {}};
      pack_fifth_bits(codes, b.qh);
      pack_nibbles(codes, b.qs);
      std::memcpy(dst, &b, bs);
    } else if (type == Type::Q4_1) {
      BlockQ4_1 b{.d = d_pow2, .m = m, .qs = {}};
      pack_nibbles(codes, b.qs);
      std::memcpy(dst, &b, bs);
    } else if (type == Type::Q5_1) {
      BlockQ5_1 b{.d = d_pow2, .m = m, .qh = {}, .qs = {}};
      pack_fifth_bits(codes, b.qh);
      pack_nibbles(codes, b.qs);
      std::memcpy(dst, &b, bs);
    } else {
      BlockMXFP4 b{.e = uint8_t(60 + rng() % 140), .qs = {}};
      pack_nibbles(codes, b.qs);
      std::memcpy(dst, &b, bs);
    }
  }
  return q;
}

TEST(QuantLegacy, GridValuesRoundTripExactly) {
  std::mt19937 rng(7);
  for (Type type : {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::MXFP4}) {
    SCOPED_TRACE(std::string(type_name(type)));
    const int n_blocks = 33;
    const std::vector<uint8_t> q = random_grid_blocks(type, n_blocks, rng);
    const std::vector<float> x = dequantize(type, q.data(), n_blocks * kQK32);
    EXPECT_EQ(quantize(type, x), q);
  }
}

TEST(QuantLegacy, Q8GridValuesRoundTripExactly) {
  std::mt19937 rng(8);
  std::vector<BlockQ8_0> blocks(21);
  for (BlockQ8_0& b : blocks) {
    b.d = uint16_t(0x1000 + rng() % 0x3000);
    for (int8_t& q : b.qs) q = int8_t(int(rng() % 255) - 127);
    b.qs[rng() % kQK32] = rng() % 2 ? 127 : -127;  // amax = 127 d, so the quantizer recovers d
  }
  const int64_t n = int64_t(blocks.size()) * kQK32;
  const std::vector<float> x = dequantize(Type::Q8_0, blocks.data(), n);
  const std::vector<uint8_t> q = quantize(Type::Q8_0, x);
  EXPECT_EQ(std::memcmp(q.data(), blocks.data(), q.size()), 0);
}

TEST(QuantLegacy, IQ4_NLGridValuesRoundTripExactly) {
  // Values d * level with the -127 level present: the search's unshifted candidate (itry = 0) fits them
  // with zero error, and the fp16 scale absorbs the float rounding of the least-squares ratio.
  std::mt19937 rng(9);
  std::vector<float> x(size_t(kQK32) * 17);
  for (size_t b = 0; b < x.size() / kQK32; ++b) {
    const float d = std::ldexp(1.f, -int(rng() % 12));
    for (int j = 0; j < kQK32; ++j) x[b * kQK32 + j] = d * float(kNonLinear[rng() % 16]);
    x[b * kQK32 + rng() % kQK32] = -127 * d;
  }
  EXPECT_EQ(dequantize(Type::IQ4_NL, quantize(Type::IQ4_NL, x).data(), int64_t(x.size())), x);
}

// ---- quantization error: per-element bounds from each format's rounding rule ------------------------------

// Largest allowed |x - dequantized x| for element x of block i, from the stored block. Each quantizer picks
// its code with the float scale d_f and stores fp16(d_f); the second step moves a value with code q by
// at most |q| |d_f| 2^-11 (and the min of Q4_1/Q5_1 by |m| 2^-11), which is the kHalfEps slack below.
double error_bound(Type type, const std::vector<uint8_t>& q, int64_t i, double x) {
  constexpr double kSlack = 1 + 2 * kHalfEps;
  switch (type) {
    case Type::Q4_0:
    case Type::Q5_0: {
      // d = max / -2^(b-1): code = round(x / d) clamped to [-2^(b-1), 2^(b-1) - 1]; only x near -max
      // (x / d near +2^(b-1)) hits the clamp, costing up to one whole step.
      const double half = type == Type::Q4_0 ? 8 : 16;
      const double d = f16(type == Type::Q4_0 ? block_at<BlockQ4_0>(q, i).d : block_at<BlockQ5_0>(q, i).d);
      const double t = x / d;
      return std::fabs(d) * (std::max(0.5, t - (half - 1)) + half * 2 * kHalfEps) * kSlack;
    }
    case Type::Q4_1:
    case Type::Q5_1: {
      // d = (max - min) / (2^b - 1): every x is within half a step of a level.
      const bool four = type == Type::Q4_1;
      const double d = f16(four ? block_at<BlockQ4_1>(q, i).d : block_at<BlockQ5_1>(q, i).d);
      const double m = f16(four ? block_at<BlockQ4_1>(q, i).m : block_at<BlockQ5_1>(q, i).m);
      const double top = four ? 15 : 31;
      return d * (0.5 + top * kHalfEps) * kSlack + std::fabs(m) * kHalfEps + std::fabs(x) * 1e-7;
    }
    case Type::Q8_0:
    case Type::Q8_1: {
      const double d = f16(type == Type::Q8_0 ? block_at<BlockQ8_0>(q, i).d : block_at<BlockQ8_1>(q, i).d);
      return d * (0.5 + 127 * kHalfEps) * kSlack;
    }
    case Type::IQ4_NL: {
      // Whatever scale the search picked, each element takes the level nearest to it.
      const double d = f16(block_at<BlockIQ4_NL>(q, i).d);
      return nearest_distance(x, d, kNonLinear, 16) + std::fabs(d) * 127 * 2 * kHalfEps;
    }
    case Type::MXFP4: {
      // The scale is an exact power of two: nearest E2M1 level, with no scale rounding at all.
      const double d = std::ldexp(1.0, block_at<BlockMXFP4>(q, i).e - 127);
      return nearest_distance(x, d, kE2M1, 16) * (1 + 1e-6);
    }
    default: return 0;
  }
}

TEST(QuantLegacy, QuantizationErrorWithinFormatBounds) {
  const int64_t n = 64 * kQK32;
  const std::vector<float> x = weights(n, 11);
  for (Type type : kAllTypes) {
    SCOPED_TRACE(std::string(type_name(type)));
    const std::vector<uint8_t> q = quantize(type, x);
    const std::vector<float> y = dequantize(type, q.data(), n);
    int failures = 0;
    for (int64_t k = 0; k < n && failures < 5; ++k) {
      const double bound = error_bound(type, q, k / kQK32, x[k]);
      if (!(std::fabs(double(x[k]) - y[k]) <= bound)) {
        ++failures;
        ADD_FAILURE() << "element " << k << ": x " << x[k] << " -> " << y[k] << ", bound " << bound;
      }
    }
  }
}

TEST(QuantLegacy, MXFP4ExponentPutsTheBlockMaxInTheTopBinade) {
  // e = floor(log2(amax)) + 125, so amax / 2^(e-127) lies in [4, 8): the top E2M1 binade (4, 6).
  const std::vector<float> x = weights(64 * kQK32, 12);
  const std::vector<uint8_t> q = quantize(Type::MXFP4, x);
  for (int64_t i = 0; i < 64; ++i) {
    double amax = 0;
    for (int j = 0; j < kQK32; ++j) amax = std::max(amax, std::fabs(double(x[i * kQK32 + j])));
    int exp2 = 0;
    std::frexp(amax, &exp2);  // amax = f 2^exp2, f in [0.5, 1): floor(log2(amax)) = exp2 - 1
    EXPECT_EQ(block_at<BlockMXFP4>(q, i).e, exp2 - 1 + 125) << "block " << i;
  }
}

TEST(QuantLegacy, Q8RoundsHalfAwayFromZero) {
  // amax = 127 makes d = 1 exactly, so the codes are the inputs rounded: ties go away from zero.
  std::vector<float> x(kQK32, 0.f);
  x[0] = 127.f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = -0.5f;
  x[5] = 0.49999997f;  // the largest float below 0.5 rounds to 0, not up
  x[6] = 126.5f;
  const int8_t expected[7] = {127, 3, -3, 1, -1, 0, 127};
  for (Type type : {Type::Q8_0, Type::Q8_1}) {
    const std::vector<uint8_t> q = quantize(type, x);
    const int8_t* qs = type == Type::Q8_0 ? block_at<BlockQ8_0>(q, 0).qs : block_at<BlockQ8_1>(q, 0).qs;
    for (int j = 0; j < 7; ++j) EXPECT_EQ(qs[j], expected[j]) << type_name(type) << " element " << j;
  }
}

TEST(QuantLegacy, Q8_1MatchesQ8_0AndStoresScaledSum) {
  const int64_t n = 9 * kQK32;
  const std::vector<float> x = weights(n, 13);
  const std::vector<uint8_t> a = quantize(Type::Q8_0, x);
  const std::vector<uint8_t> b = quantize(Type::Q8_1, x);
  for (int64_t i = 0; i < n / kQK32; ++i) {
    const BlockQ8_0& p = block_at<BlockQ8_0>(a, i);
    const BlockQ8_1& r = block_at<BlockQ8_1>(b, i);
    EXPECT_EQ(p.d, r.d);
    EXPECT_EQ(std::memcmp(p.qs, r.qs, kQK32), 0);
    double sum = 0;
    for (int8_t v : r.qs) sum += v;
    // s = fp16(d_f * sum) while d is fp16(d_f): both roundings are within 2^-11.
    EXPECT_NEAR(f16(r.s), f16(r.d) * sum, std::fabs(f16(r.d) * sum) * 3 * kHalfEps + 1e-12) << i;
  }
}

TEST(QuantLegacy, IQ4_NLBeatsQ4_0OnGaussianWeights) {
  // Same 4.5 bits per weight; the non-linear levels plus the scale search must give a lower error
  // (llama.cpp's own vectors: about 0.0022 vs 0.0027 RMSE on this distribution).
  const int64_t n = 256 * kQK32;
  const std::vector<float> x = weights(n, 14);
  auto rmse = [&](Type type) {
    const std::vector<float> y = dequantize(type, quantize(type, x).data(), n);
    double se = 0;
    for (int64_t k = 0; k < n; ++k) se += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
    return std::sqrt(se / double(n));
  };
  EXPECT_LT(rmse(Type::IQ4_NL), 0.9 * rmse(Type::Q4_0));
}

// ---- blocks are independent; zero blocks -----------------------------------------------------------------

TEST(QuantLegacy, OddBlockCountsQuantizeBlockByBlock) {
  const int n_blocks = 7;
  const std::vector<float> x = weights(n_blocks * kQK32, 15);
  for (Type type : kAllTypes) {
    SCOPED_TRACE(std::string(type_name(type)));
    const std::vector<uint8_t> whole = quantize(type, x);
    const size_t bs = traits(type).type_size;
    ASSERT_EQ(whole.size(), n_blocks * bs);
    for (int i = 0; i < n_blocks; ++i) {
      const std::vector<float> one(x.begin() + i * kQK32, x.begin() + (i + 1) * kQK32);
      const std::vector<uint8_t> block(whole.begin() + i * bs, whole.begin() + (i + 1) * bs);
      EXPECT_EQ(quantize(type, one), block) << "block " << i;
    }
  }
}

TEST(QuantLegacy, ZeroBlocksStayZero) {
  std::vector<float> x = weights(3 * kQK32, 16);
  std::fill(x.begin() + kQK32, x.begin() + 2 * kQK32, 0.f);  // the middle block is all zero
  const std::vector<float> act = weights(3 * kQK32, 17);
  for (Type type : kAllTypes) {
    SCOPED_TRACE(std::string(type_name(type)));
    const std::vector<uint8_t> q = quantize(type, x);
    const std::vector<float> y = dequantize(type, q.data(), 3 * kQK32);
    for (int j = kQK32; j < 2 * kQK32; ++j) ASSERT_EQ(y[j], 0.f) << j;
    const VecDotFn dot = traits(type).vec_dot;
    if (!dot) continue;
    // The zero block alone contributes exactly nothing.
    const Type yt = traits(type).vec_dot_type;
    const std::vector<uint8_t> qa = quantize(yt, act);
    const size_t bs = traits(type).type_size;
    const size_t ys = traits(yt).type_size;
    EXPECT_EQ(dot(kQK32, q.data() + bs, qa.data() + ys), 0.f);
  }
}

// ---- vec_dot --------------------------------------------------------------------------------------------

// The reference dot computes exact integer block sums and rounds a few times per block plus once per block
// in the float accumulator: |error| <= (n_blocks + 4) 2^-24 sum |x_i y_i| to first order (see below for
// the types with a min). Q4_1/Q5_1 use
// the activation's fp16 sum s = fp16(d_f sum q) instead of the dequantized values' d sum q, which adds
// |m| (|s| + sum |y|) 2^-11 per block.
TEST(QuantLegacy, VecDotMatchesDoubleDotOfDequantizedValues) {
  for (int n_blocks : {1, 7, 64}) {
    const int64_t n = int64_t(n_blocks) * kQK32;
    const std::vector<float> w = weights(n, 100 + uint32_t(n_blocks));
    std::vector<float> a = weights(n, 200 + uint32_t(n_blocks));
    for (float& v : a) v *= 50.f;  // activations of order 1
    for (Type type : kWeightTypes) {
      SCOPED_TRACE(std::string(type_name(type)) + " blocks=" + std::to_string(n_blocks));
      const Type yt = traits(type).vec_dot_type;
      const std::vector<uint8_t> qw = quantize(type, w);
      const std::vector<uint8_t> qa = quantize(yt, a);
      const std::vector<float> dw = dequantize(type, qw.data(), n);
      const std::vector<float> da = dequantize(yt, qa.data(), n);
      double exact = 0, magnitude = 0, min_terms = 0;
      for (int64_t i = 0; i < n_blocks; ++i) {
        // With a min, the dot sums d sum(q y) and m s separately; their sizes, not the (possibly
        // cancelling) sizes of the x_i y_i, set the rounding error: |x - m| |y| + |m| |y| per element.
        double m = 0;
        if (yt == Type::Q8_1) {
          m = f16(type == Type::Q4_1 ? block_at<BlockQ4_1>(qw, i).m : block_at<BlockQ5_1>(qw, i).m);
        }
        double sum_abs_y = 0;
        for (int64_t k = i * kQK32; k < (i + 1) * kQK32; ++k) {
          exact += double(dw[k]) * da[k];
          magnitude += (std::fabs(dw[k] - m) + std::fabs(m)) * std::fabs(double(da[k]));
          sum_abs_y += std::fabs(double(da[k]));
        }
        if (yt == Type::Q8_1) {
          min_terms += std::fabs(m) * (std::fabs(f16(block_at<BlockQ8_1>(qa, i).s)) + sum_abs_y) * kHalfEps;
        }
      }
      const double got = traits(type).vec_dot(n, qw.data(), qa.data());
      const double tol = (n_blocks + 4) * std::ldexp(1.0, -24) * magnitude + min_terms;
      EXPECT_NEAR(got, exact, tol);
      EXPECT_GT(magnitude, 0);
    }
  }
}

TEST(QuantLegacy, TraitsDescribeTheFamily) {
  for (Type type : kAllTypes) {
    const TypeTraits& t = traits(type);
    EXPECT_EQ(t.block_size, kQK32) << t.name;
    EXPECT_TRUE(t.is_quantized) << t.name;
  }
  EXPECT_EQ(traits(Type::Q4_1).vec_dot_type, Type::Q8_1);
  EXPECT_EQ(traits(Type::Q5_1).vec_dot_type, Type::Q8_1);
  EXPECT_EQ(traits(Type::MXFP4).vec_dot_type, Type::Q8_0);
  EXPECT_EQ(traits(Type::Q8_1).vec_dot, nullptr);
}

}  // namespace legacy_test
}  // namespace magnetar::quant
