// Scalar references of Q4_K, Q5_K, Q6_K and Q8_K (quant/ref/k_quants.cpp, quant/ref/scale_search.*).
//
// Expected values come from the format description, not from the code under test: this file has its own
// encoders ("element e lives in byte b, bits s..t") that build blocks by hand, exact products of small
// integers and powers of two, double-precision dot products of dequantized values, and the math of each
// format (a quantizer that re-rounds against its stored scales must pick the nearest representable level).
// Bit-exactness with llama.cpp is checked against its own files in tests/conformance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/quant.h"
#include "quant/ref/ref.h"
#include "quant/ref/scale_search.h"

namespace magnetar::quant {
namespace {

constexpr uint16_t kHalfOne = 0x3C00;      // 1.0
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25

// ---- independent encoders -----------------------------------------------------------------------------------

// Writes `width` bits of `value` into byte `byte` starting at bit `shift`.
void put_bits(uint8_t* bytes, int byte, int shift, int width, int value) {
  const int mask = ((1 << width) - 1) << shift;
  bytes[byte] = uint8_t((bytes[byte] & ~mask) | ((value << shift) & mask));
}

// The 12-byte scale/min field of Q4_K/Q5_K, field by field as ggml-common.h describes it.
void encode_scales_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[12]) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      put_bits(out, j, 0, 6, sc[j]);
      put_bits(out, j + 4, 0, 6, mn[j]);
    } else {
      put_bits(out, j + 4, 0, 4, sc[j] & 15);
      put_bits(out, j - 4, 6, 2, sc[j] >> 4);
      put_bits(out, j + 4, 4, 4, mn[j] & 15);
      put_bits(out, j, 6, 2, mn[j] >> 4);
    }
  }
}

// Q4_K/Q5_K element e: low 4 bits in qs[32 (e / 64) + e % 32], low nibble for the first 32 of each 64.
void encode_q4_level(uint8_t* qs, int e, int q) {
  put_bits(qs, 32 * (e / 64) + e % 32, (e % 64) < 32 ? 0 : 4, 4, q & 15);
}
// Q5_K's 5th bit: bit (e / 32) of qh[e % 32].
void encode_q5_high(uint8_t* qh, int e, int q) { put_bits(qh, e % 32, e / 32, 1, q >> 4); }

// Q6_K element e (h = e / 128, r = e % 128, g = r / 32, l = r % 32): low 4 bits in ql[64h + 32 (g & 1) + l]
// (low nibble for g < 2), high 2 bits in bits 2g..2g+1 of qh[32h + l]. u = q + 32 in 0..63.
void encode_q6_level(BlockQ6_K& b, int e, int u) {
  const int h = e / 128, r = e % 128, g = r / 32, l = r % 32;
  put_bits(b.ql, 64 * h + 32 * (g & 1) + l, g < 2 ? 0 : 4, 4, u & 15);
  put_bits(b.qh, 32 * h + l, 2 * g, 2, u >> 4);
}

// Decoded d * sc and dmin * m of every 32-element sub-block of a Q4_K/Q5_K block (exact in double).
struct SubBlockFactors {
  double d1[8];
  double m1[8];
};
template <class Block>
SubBlockFactors factors_k4(const Block& b) {
  SubBlockFactors f;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    ref::unpack_scale_min_k4(j, b.scales, &sc, &m);
    f.d1[j] = double(fp16_to_float(b.d)) * sc;
    f.m1[j] = double(fp16_to_float(b.dmin)) * m;
  }
  return f;
}

std::vector<float> gaussian_with_outliers(int64_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, sigma);
  std::vector<float> v(size_t(n), 0.f);
  for (auto& x : v) x = g(rng);
  for (int64_t i = 0; i < n; i += 211) v[size_t(i)] *= 12;  // the 0.5% outliers real weights have
  return v;
}

template <class Block>
std::vector<Block> quantize(Type type, const std::vector<float>& x) {
  std::vector<Block> blocks(x.size() / kQK_K);
  traits(type).from_float(x.data(), blocks.data(), int64_t(x.size()));
  return blocks;
}

template <class Block>
std::vector<float> dequantize(Type type, const std::vector<Block>& blocks) {
  std::vector<float> y(blocks.size() * kQK_K);
  traits(type).to_float(blocks.data(), y.data(), int64_t(y.size()));
  return y;
}

// ---- 6-bit scale packing ------------------------------------------------------------------------------------

TEST(KQuantScales, PackUnpackRoundTripsEveryPairAtEveryPosition) {
  for (int s = 0; s < 64; ++s) {
    for (int m = 0; m < 64; ++m) {
      // Every position sees every (scale, min) pair while its neighbours hold different values.
      uint8_t sc[8], mn[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = uint8_t((s + 7 * j) & 63);
        mn[j] = uint8_t((m + 13 * j) & 63);
      }
      uint8_t packed[12], expected[12];
      ref::pack_scales_mins_k4(sc, mn, packed);
      encode_scales_k4(sc, mn, expected);
      ASSERT_EQ(0, std::memcmp(packed, expected, 12)) << "s=" << s << " m=" << m;
      for (int j = 0; j < 8; ++j) {
        uint8_t got_sc, got_m;
        ref::unpack_scale_min_k4(j, packed, &got_sc, &got_m);
        ASSERT_EQ(got_sc, sc[j]) << "s=" << s << " m=" << m << " j=" << j;
        ASSERT_EQ(got_m, mn[j]) << "s=" << s << " m=" << m << " j=" << j;
      }
    }
  }
}

TEST(KQuantScales, Q4KDequantizeUsesEachSubBlocksScaleAndMin) {
  // d = dmin = 1 and every level 1: element e of sub-block j dequantizes to sc_j - m_j exactly.
  for (int s = 0; s < 64; ++s) {
    for (int m = 0; m < 64; m += 3) {
      uint8_t sc[8], mn[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = uint8_t((s + 5 * j) & 63);
        mn[j] = uint8_t((m + 11 * j) & 63);
      }
      BlockQ4_K b{};
      b.d = kHalfOne;
      b.dmin = kHalfOne;
      encode_scales_k4(sc, mn, b.scales);
      std::memset(b.qs, 0x11, sizeof(b.qs));
      float y[kQK_K];
      ref::dequantize_q4_k(&b, y, kQK_K);
      for (int e = 0; e < kQK_K; ++e) {
        const int j = e / 32;  // sub-block
        ASSERT_EQ(y[e], float(sc[j] - mn[j])) << "e=" << e;
      }
    }
  }
}

// ---- dequantize: hand-built blocks with exactly representable results ----------------------------------

TEST(KQuantDequantize, Q4KHandBuiltBlock) {
  BlockQ4_K b{};
  b.d = kHalfHalf;
  b.dmin = kHalfQuarter;
  const uint8_t sc[8] = {1, 63, 17, 32, 0, 5, 48, 9};
  const uint8_t mn[8] = {0, 3, 63, 40, 7, 31, 1, 16};
  encode_scales_k4(sc, mn, b.scales);
  int q[kQK_K];
  for (int e = 0; e < kQK_K; ++e) {
    q[e] = (7 * e + e / 16) % 16;
    encode_q4_level(b.qs, e, q[e]);
  }
  float y[kQK_K];
  ref::dequantize_q4_k(&b, y, kQK_K);
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 32;
    EXPECT_EQ(double(y[e]), 0.5 * sc[j] * q[e] - 0.25 * mn[j]) << "e=" << e;
  }
}

TEST(KQuantDequantize, Q5KHandBuiltBlock) {
  BlockQ5_K b{};
  b.d = kHalfQuarter;
  b.dmin = kHalfHalf;
  const uint8_t sc[8] = {63, 2, 33, 16, 8, 0, 21, 44};
  const uint8_t mn[8] = {5, 0, 62, 17, 31, 9, 48, 63};
  encode_scales_k4(sc, mn, b.scales);
  int q[kQK_K];
  for (int e = 0; e < kQK_K; ++e) {
    q[e] = (11 * e + 3) % 32;
    encode_q4_level(b.qs, e, q[e]);
    encode_q5_high(b.qh, e, q[e]);
  }
  float y[kQK_K];
  ref::dequantize_q5_k(&b, y, kQK_K);
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 32;
    EXPECT_EQ(double(y[e]), 0.25 * sc[j] * q[e] - 0.5 * mn[j]) << "e=" << e;
  }
}

TEST(KQuantDequantize, Q6KHandBuiltBlock) {
  BlockQ6_K b{};
  b.d = kHalfHalf;
  int q[kQK_K];
  for (int j = 0; j < 16; ++j) b.scales[j] = int8_t(j % 2 ? -9 * j : 8 * j - 128 + j);  // negatives included
  for (int e = 0; e < kQK_K; ++e) {
    q[e] = (5 * e + e / 64) % 64 - 32;
    encode_q6_level(b, e, q[e] + 32);
  }
  float y[kQK_K];
  ref::dequantize_q6_k(&b, y, kQK_K);
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 16;
    EXPECT_EQ(double(y[e]), 0.5 * b.scales[j] * q[e]) << "e=" << e;
  }
}

TEST(KQuantDequantize, Q8KIsScaleTimesValue) {
  BlockQ8_K b{};
  b.d = -0.125f;
  for (int e = 0; e < kQK_K; ++e) b.qs[e] = int8_t(e - 128);
  float y[kQK_K];
  ref::dequantize_q8_k(&b, y, kQK_K);
  for (int e = 0; e < kQK_K; ++e) EXPECT_EQ(double(y[e]), -0.125 * (e - 128)) << "e=" << e;
}

// ---- zero input -----------------------------------------------------------------------------------------------

TEST(KQuantQuantize, ZeroBlocksStayZero) {
  const std::vector<float> zeros(3 * kQK_K, 0.f);
  for (float v : dequantize(Type::Q4_K, quantize<BlockQ4_K>(Type::Q4_K, zeros))) ASSERT_EQ(v, 0.f);
  for (float v : dequantize(Type::Q5_K, quantize<BlockQ5_K>(Type::Q5_K, zeros))) ASSERT_EQ(v, 0.f);
  for (float v : dequantize(Type::Q6_K, quantize<BlockQ6_K>(Type::Q6_K, zeros))) ASSERT_EQ(v, 0.f);
  for (const BlockQ8_K& b : quantize<BlockQ8_K>(Type::Q8_K, zeros)) {
    EXPECT_EQ(b.d, 0.f);
    for (int8_t q : b.qs) ASSERT_EQ(q, 0);
    for (int16_t s : b.bsums) ASSERT_EQ(s, 0);
  }
}

// ---- quantizers pick the nearest level of the grid they store ------------------------------------------

// After choosing scales, the K-quant quantizers re-round every element against the stored (fp16, 6- or
// 8-bit) scales, so each value must be a nearest point of its sub-block's grid. `slack` absorbs the float
// rounding of x / d in the quantizer (relative to the grid step).
void expect_nearest(double x, double y, const std::vector<double>& grid, double step, int e) {
  double best = INFINITY;
  for (double g : grid) best = std::min(best, std::fabs(x - g));
  ASSERT_LE(std::fabs(x - y), best + 1e-5 * std::fabs(step) + 1e-12) << "element " << e;
}

TEST(KQuantQuantize, Q4KAndQ5KPickNearestLevel) {
  const std::vector<float> x = gaussian_with_outliers(64 * kQK_K, 0.02f, 1);
  auto check = [&](auto blocks, Type type, int nmax) {
    const std::vector<float> y = dequantize(type, blocks);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const SubBlockFactors f = factors_k4(blocks[i]);
      for (int j = 0; j < 8; ++j) {
        std::vector<double> grid;
        for (int q = 0; q <= nmax; ++q) grid.push_back(f.d1[j] * q - f.m1[j]);
        for (int l = 0; l < 32; ++l) {
          const int e = int(i) * kQK_K + 32 * j + l;
          expect_nearest(x[size_t(e)], y[size_t(e)], grid, f.d1[j], e);
        }
      }
    }
  };
  check(quantize<BlockQ4_K>(Type::Q4_K, x), Type::Q4_K, 15);
  check(quantize<BlockQ5_K>(Type::Q5_K, x), Type::Q5_K, 31);
}

TEST(KQuantQuantize, Q6KPicksNearestLevel) {
  const std::vector<float> x = gaussian_with_outliers(64 * kQK_K, 0.02f, 2);
  const auto blocks = quantize<BlockQ6_K>(Type::Q6_K, x);
  const std::vector<float> y = dequantize(Type::Q6_K, blocks);
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (int j = 0; j < 16; ++j) {
      const double step = double(fp16_to_float(blocks[i].d)) * blocks[i].scales[j];
      std::vector<double> grid;
      for (int q = -32; q < 32; ++q) grid.push_back(step * q);
      for (int l = 0; l < 16; ++l) {
        const int e = int(i) * kQK_K + 16 * j + l;
        expect_nearest(x[size_t(e)], y[size_t(e)], grid, step, e);
      }
    }
  }
}

// The error a plain quantizer with exact (unrounded) float scales makes on the same data: per group, the grid
// from the group's min to its max with nmax steps (asymmetric, the offset clamped to <= 0 as the K-quants
// store it), or the symmetric grid step * (-32..31) with step = max|x| / 32.
double plain_rmse(const std::vector<float>& x, int group, int nmax, bool symmetric) {
  double se = 0;
  for (size_t g = 0; g < x.size(); g += size_t(group)) {
    double lo = 0, hi = 0, amax = 0;
    for (int l = 0; l < group; ++l) {
      lo = std::min(lo, double(x[g + size_t(l)]));
      hi = std::max(hi, double(x[g + size_t(l)]));
      amax = std::max(amax, std::fabs(double(x[g + size_t(l)])));
    }
    const double step = symmetric ? amax / 32 : (hi - lo) / nmax;
    for (int l = 0; l < group; ++l) {
      const double v = x[g + size_t(l)];
      const double q = symmetric ? std::clamp(std::nearbyint(v / step), -32.0, 31.0)
                                 : std::clamp(std::nearbyint((v - lo) / step), 0.0, double(nmax));
      const double y = symmetric ? q * step : lo + q * step;
      se += (y - v) * (y - v);
    }
  }
  return std::sqrt(se / double(x.size()));
}

TEST(KQuantQuantize, SearchBeatsPlainQuantizer) {
  const std::vector<float> x = gaussian_with_outliers(64 * kQK_K, 0.02f, 3);
  auto rmse = [&](const std::vector<float>& y) {
    double se = 0;
    for (size_t i = 0; i < x.size(); ++i) se += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    return std::sqrt(se / double(x.size()));
  };
  const double e4 = rmse(dequantize(Type::Q4_K, quantize<BlockQ4_K>(Type::Q4_K, x)));
  const double e5 = rmse(dequantize(Type::Q5_K, quantize<BlockQ5_K>(Type::Q5_K, x)));
  const double e6 = rmse(dequantize(Type::Q6_K, quantize<BlockQ6_K>(Type::Q6_K, x)));
  // Measured margins on this data: 6%, 4% and 15% below the plain quantizer; over seeds 1..39 the smallest
  // were 5%, 1% and 10%, so the seed is not what makes this pass.
  EXPECT_LT(e4, plain_rmse(x, 32, 15, false));
  EXPECT_LT(e5, plain_rmse(x, 32, 31, false));
  EXPECT_LT(e6, plain_rmse(x, 16, 32, true));
}

// ---- Q8_K ------------------------------------------------------------------------------------------------------

TEST(KQuantQ8K, BsumsAreSumsOfSixteenAndErrorIsHalfAStep) {
  const std::vector<float> x = gaussian_with_outliers(16 * kQK_K, 1.f, 4);
  const auto blocks = quantize<BlockQ8_K>(Type::Q8_K, x);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockQ8_K& b = blocks[i];
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      ASSERT_EQ(b.bsums[j], sum) << "block " << i << " group " << j;
    }
    for (int l = 0; l < kQK_K; ++l) {
      const double err = std::fabs(double(b.d) * b.qs[l] - x[i * kQK_K + size_t(l)]);
      ASSERT_LE(err, 0.5 * std::fabs(b.d) * (1 + 1e-5)) << "block " << i << " element " << l;
      ASSERT_GE(b.qs[l], -127);  // the dot kernels rely on |q| <= 127
    }
  }
}

TEST(KQuantQ8K, FirstLargestMagnitudeMapsToMinus127) {
  std::vector<float> x(kQK_K);
  for (int l = 0; l < kQK_K; ++l) x[size_t(l)] = 0.01f * float(l % 37) - 0.15f;
  x[3] = -5.f;  // same magnitude, opposite signs: the first one decides the scale's sign
  x[100] = 5.f;
  const auto b = quantize<BlockQ8_K>(Type::Q8_K, x)[0];
  EXPECT_EQ(b.qs[3], -127);
  EXPECT_EQ(b.qs[100], 127);
  EXPECT_GT(b.d, 0.f);
  EXPECT_NEAR(b.d, 5.0 / 127, 1e-7);
}

// ---- vec_dot against a double dot of the dequantized values ---------------------------------------------

// Random blocks: arbitrary bytes with finite fp16 scales, so every scale, min and level combination occurs.
template <class Block>
std::vector<Block> random_blocks(int64_t nb, std::mt19937& rng, std::initializer_list<size_t> half_offsets) {
  std::vector<Block> blocks(static_cast<size_t>(nb));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (Block& b : blocks) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t k = 0; k < sizeof(Block); ++k) bytes[k] = uint8_t(rng());
    for (size_t off : half_offsets) {
      const uint16_t h = float_to_fp16(scale(rng));
      std::memcpy(bytes + off, &h, 2);
    }
  }
  return blocks;
}

// |vec_dot - exact| must stay within float rounding of the terms it sums: per super-block a few roundings
// of sums whose size is bounded by sum |y| (|d1 q| + |m1|).
template <class Block>
void expect_dot_close(Type type, const std::vector<Block>& x, const std::vector<BlockQ8_K>& y,
                      const std::vector<double>& magnitude_weight) {
  const int64_t n = int64_t(x.size()) * kQK_K;
  const std::vector<float> xf = dequantize(type, x);
  const std::vector<float> yf = dequantize(Type::Q8_K, y);
  double exact = 0, magnitude = 0;
  for (size_t i = 0; i < xf.size(); ++i) {
    exact += double(xf[i]) * yf[i];
    magnitude += magnitude_weight[i] * std::fabs(double(yf[i]));
  }
  const float got = traits(type).vec_dot(n, x.data(), y.data());
  const double tol = 4 * 1.2e-7 * double(x.size() + 2) * magnitude + 1e-30;
  EXPECT_NEAR(double(got), exact, tol) << traits(type).name << " n=" << n;
}

template <class Block>
std::vector<double> magnitude_k4(Type type, const std::vector<Block>& x) {
  std::vector<double> w;
  const std::vector<float> xf = dequantize(type, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const SubBlockFactors f = factors_k4(x[i]);
    for (int e = 0; e < kQK_K; ++e) {
      w.push_back(std::fabs(double(xf[i * kQK_K + size_t(e)]) + f.m1[e / 32]) + std::fabs(f.m1[e / 32]));
    }
  }
  return w;
}

TEST(KQuantVecDot, MatchesDoubleDotOfDequantizedValues) {
  std::mt19937 rng(5);
  for (int64_t nb : {1, 2, 7, 33}) {
    const int64_t n = nb * kQK_K;
    const auto y = quantize<BlockQ8_K>(Type::Q8_K, gaussian_with_outliers(n, 1.f, uint32_t(nb)));
    for (int variant = 0; variant < 2; ++variant) {
      const std::vector<float> w = gaussian_with_outliers(n, 0.02f, uint32_t(100 + nb));
      const auto q4 = variant ? random_blocks<BlockQ4_K>(nb, rng, {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)})
                              : quantize<BlockQ4_K>(Type::Q4_K, w);
      const auto q5 = variant ? random_blocks<BlockQ5_K>(nb, rng, {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)})
                              : quantize<BlockQ5_K>(Type::Q5_K, w);
      const auto q6 =
          variant ? random_blocks<BlockQ6_K>(nb, rng, {offsetof(BlockQ6_K, d)}) : quantize<BlockQ6_K>(Type::Q6_K, w);
      expect_dot_close(Type::Q4_K, q4, y, magnitude_k4(Type::Q4_K, q4));
      expect_dot_close(Type::Q5_K, q5, y, magnitude_k4(Type::Q5_K, q5));
      std::vector<double> m6;
      for (float v : dequantize(Type::Q6_K, q6)) m6.push_back(std::fabs(double(v)));
      expect_dot_close(Type::Q6_K, q6, y, m6);
    }
  }
}

}  // namespace
}  // namespace magnetar::quant
