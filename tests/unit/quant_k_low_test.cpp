// Unit tests of the Q2_K, Q3_K and IQ4_XS scalar references (quant/ref/k_low.cpp).
//
// Expected values come from outside the code under test: blocks are packed here from the format
// description (element order and scale packing written out independently, in ggml's loop form), inputs
// are built to be exactly representable, quantization error is held to the nearest-level property and to
// the Lloyd-Max bound, and dot products are compared with a double-precision dot of dequantized values.
// Bit-exactness against llama.cpp itself is the conformance test's job (tests/conformance/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/ref/ref.h"

namespace magnetar::quant {
namespace {

// The IQ4_NL levels as published with the format (llama.cpp PR 5590), written out here rather than
// taken from formats.h.
constexpr int kNonLinear[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Where element e of a Q2_K / Q3_K super-block keeps its 2 bits, enumerated in the order ggml's
// dequantize_row_q2_K walks the block: two halves of 32 bytes, four shifts each, 32 elements per shift.
struct TwoBitSlot {
  int byte;
  int shift;
};
std::vector<TwoBitSlot> two_bit_slots() {
  std::vector<TwoBitSlot> slots;
  for (int half = 0; half < 2; ++half) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int l = 0; l < 32; ++l) slots.push_back({32 * half + l, shift});
    }
  }
  return slots;
}

// Q3_K's 12-byte scale packing, byte by byte: byte k < 8 holds scale k (low nibble) and scale k + 8
// (high nibble); byte 8 + k holds bits 4-5 of scales k, k + 4, k + 8, k + 12 at bits 0, 2, 4, 6.
void pack_q3_k_scales_bytewise(const int stored[16], uint8_t packed[12]) {
  for (int k = 0; k < 8; ++k) packed[k] = uint8_t((stored[k] & 0xF) | ((stored[k + 8] & 0xF) << 4));
  for (int k = 0; k < 4; ++k) {
    packed[8 + k] = uint8_t((stored[k] >> 4) | ((stored[k + 4] >> 4) << 2) | ((stored[k + 8] >> 4) << 4) |
                            ((stored[k + 12] >> 4) << 6));
  }
}

// The stored (0..63) scale j, read back the same byte-wise way.
int unpack_q3_k_scale_bytewise(const uint8_t packed[12], int j) {
  const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
  return low | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A Q8_K block built by hand: values in -127..127 (the quantizer's range), bsums from the values.
BlockQ8_K random_q8_k(std::mt19937& rng) {
  BlockQ8_K b{};
  b.d = std::ldexp(float(rng() % 1000 + 1) / 1000.f, -int(rng() % 12));
  for (int k = 0; k < kQK_K; ++k) b.qs[k] = int8_t(int(rng() % 255) - 127);
  for (int j = 0; j < kQK_K / 16; ++j) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
    b.bsums[j] = int16_t(sum);
  }
  return b;
}

double rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(sum / double(a.size()));
}

// Quantize then dequantize with the given reference pair.
template <typename Block>
std::vector<float> round_trip(const std::vector<float>& x, void (*quantize)(const float*, void*, int64_t),
                              void (*dequantize)(const void*, float*, int64_t)) {
  const int64_t n = int64_t(x.size());
  std::vector<Block> blocks(size_t(n / kQK_K));
  quantize(x.data(), blocks.data(), n);
  std::vector<float> y(x.size());
  dequantize(blocks.data(), y.data(), n);
  return y;
}

// ---- dequantization of hand-packed blocks ---------------------------------------------------------------

TEST(QuantKLow, Q2KDequantizeFollowsTheLayout) {
  std::mt19937 rng(7);
  const std::vector<TwoBitSlot> slots = two_bit_slots();
  BlockQ2_K b{};
  b.d = float_to_fp16(0.5f);
  b.dmin = float_to_fp16(0.125f);
  for (int j = 0; j < 16; ++j) b.scales[j] = uint8_t(j | ((15 - j) << 4));  // every 4-bit value once
  int q[kQK_K];
  for (int e = 0; e < kQK_K; ++e) {
    q[e] = int(rng() % 4);
    b.qs[slots[e].byte] |= uint8_t(q[e] << slots[e].shift);
  }
  float out[kQK_K];
  ref::dequantize_q2_k(&b, out, kQK_K);
  for (int e = 0; e < kQK_K; ++e) {
    const int j = e / 16;
    // Powers of two times small integers: exact in float, so equality is the right test.
    EXPECT_EQ(out[e], 0.5f * float(j * q[e]) - 0.125f * float(15 - j)) << "element " << e;
  }
}

// Every stored 6-bit value (0..63) at every one of the 16 scale positions, through the byte-wise packer.
TEST(QuantKLow, Q3KScalePackingCoversAllValuesAndPositions) {
  const std::vector<TwoBitSlot> slots = two_bit_slots();
  for (int v = 0; v < 64; ++v) {
    BlockQ3_K b{};
    b.d = float_to_fp16(0.25f);
    int stored[16];
    for (int j = 0; j < 16; ++j) stored[j] = (v + 5 * j) % 64;  // 5 is odd: each j sees all 64 values over v
    pack_q3_k_scales_bytewise(stored, b.scales);
    // Level of element e: 2-bit field e % 4, high bit set for odd sub-blocks: covers -4..3.
    int level[kQK_K];
    for (int e = 0; e < kQK_K; ++e) {
      const int low = e % 4;
      const bool high = (e / 16) % 2 == 1;
      level[e] = low - (high ? 0 : 4);
      b.qs[slots[e].byte] |= uint8_t(low << slots[e].shift);
      if (high) b.hmask[e % 32] |= uint8_t(1 << (e / 32));
    }
    float out[kQK_K];
    ref::dequantize_q3_k(&b, out, kQK_K);
    for (int e = 0; e < kQK_K; ++e) {
      EXPECT_EQ(out[e], 0.25f * float((stored[e / 16] - 32) * level[e])) << "v " << v << " element " << e;
    }
  }
}

// Every stored 6-bit value at every one of the 8 positions of scales_l / scales_h, and all 16 table levels.
TEST(QuantKLow, IQ4XSScalePackingCoversAllValuesAndPositions) {
  for (int v = 0; v < 64; ++v) {
    BlockIQ4_XS b{};
    b.d = float_to_fp16(0.125f);
    int stored[8];
    for (int ib = 0; ib < 8; ++ib) {
      stored[ib] = (v + 9 * ib) % 64;
      b.scales_l[ib / 2] |= uint8_t((stored[ib] & 0xF) << (ib % 2 == 0 ? 0 : 4));
      b.scales_h |= uint16_t((stored[ib] >> 4) << (2 * ib));
    }
    for (int ib = 0; ib < 8; ++ib) {
      for (int j = 0; j < 16; ++j) b.qs[16 * ib + j] = uint8_t(j | ((15 - j) << 4));
    }
    float out[kQK_K];
    ref::dequantize_iq4_xs(&b, out, kQK_K);
    for (int ib = 0; ib < 8; ++ib) {
      const float dl = 0.125f * float(stored[ib] - 32);
      for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(out[32 * ib + j], dl * float(kNonLinear[j])) << "v " << v << " ib " << ib;
        EXPECT_EQ(out[32 * ib + 16 + j], dl * float(kNonLinear[15 - j])) << "v " << v << " ib " << ib;
      }
    }
  }
}

// ---- quantization: exactly representable inputs come back exactly --------------------------------------

TEST(QuantKLow, Q2KReproducesRepresentableInput) {
  // x = d * sc * q - dmin * m with d = 2^-8, dmin = 2^-9; each sub-block uses levels 0 and 3 (so its
  // range is exactly [−dmin*m, 3*d*sc − dmin*m]) and one sub-block each has sc = 15 and m = 15.
  std::mt19937 rng(11);
  const float d = 1.f / 256, dmin = 1.f / 512;
  std::vector<float> x(2 * kQK_K);
  for (int blk = 0; blk < 2; ++blk) {
    for (int j = 0; j < 16; ++j) {
      const int sc = j == 3 ? 15 : 1 + int(rng() % 15);
      const int m = j == 5 ? 15 : int(rng() % 16);
      for (int l = 0; l < 16; ++l) {
        const int q = l == 0 ? 0 : (l == 1 ? 3 : int(rng() % 4));
        x[size_t(kQK_K * blk + 16 * j + l)] = d * float(sc * q) - dmin * float(m);
      }
    }
  }
  EXPECT_EQ(round_trip<BlockQ2_K>(x, ref::quantize_q2_k, ref::dequantize_q2_k), x);
}

TEST(QuantKLow, Q3KReproducesRepresentableInput) {
  // x = c_j * l with c_j = k_j * 2^-10 (k_j in 1..32, one sub-block with 32) and l in -4..3, each
  // sub-block containing l = -4 so that its largest magnitude sits on the longer side of the range.
  std::mt19937 rng(12);
  std::vector<float> x(2 * kQK_K);
  for (int blk = 0; blk < 2; ++blk) {
    for (int j = 0; j < 16; ++j) {
      const int k = j == 9 ? 32 : 1 + int(rng() % 32);
      for (int l = 0; l < 16; ++l) {
        const int level = l == 0 ? -4 : int(rng() % 8) - 4;
        x[size_t(kQK_K * blk + 16 * j + l)] = std::ldexp(float(k * level), -10);
      }
    }
  }
  EXPECT_EQ(round_trip<BlockQ3_K>(x, ref::quantize_q3_k, ref::dequantize_q3_k), x);
}

TEST(QuantKLow, IQ4XSReproducesRepresentableInput) {
  // x = c_ib * level with c_ib = k_ib * 2^-12 (one sub-block with k = 32); every sub-block holds the
  // level -127 so its extreme maps onto the table's end.
  std::mt19937 rng(13);
  std::vector<float> x(2 * kQK_K);
  for (int blk = 0; blk < 2; ++blk) {
    for (int ib = 0; ib < 8; ++ib) {
      const int k = ib == 2 ? 32 : 1 + int(rng() % 32);
      for (int l = 0; l < 32; ++l) {
        const int level = l == 7 ? kNonLinear[0] : kNonLinear[rng() % 16];
        x[size_t(kQK_K * blk + 32 * ib + l)] = std::ldexp(float(k * level), -12);
      }
    }
  }
  EXPECT_EQ(round_trip<BlockIQ4_XS>(x, ref::quantize_iq4_xs, ref::dequantize_iq4_xs), x);
}

// ---- quantization: zero input -----------------------------------------------------------------------------

TEST(QuantKLow, ZeroInputAndZeroSubBlocksDequantizeToZero) {
  // One all-zero super-block, then one whose sub-blocks alternate between zero and Gaussian values.
  std::vector<float> x(2 * kQK_K, 0.f);
  const std::vector<float> g = gaussian(kQK_K, 3);
  for (int e = 0; e < kQK_K; ++e) {
    if ((e / 32) % 2 == 1) x[size_t(kQK_K + e)] = g[size_t(e)];
  }
  const std::vector<float> outs[] = {round_trip<BlockQ2_K>(x, ref::quantize_q2_k, ref::dequantize_q2_k),
                                     round_trip<BlockQ3_K>(x, ref::quantize_q3_k, ref::dequantize_q3_k),
                                     round_trip<BlockIQ4_XS>(x, ref::quantize_iq4_xs, ref::dequantize_iq4_xs)};
  for (const std::vector<float>& y : outs) {
    for (size_t e = 0; e < x.size(); ++e) {
      if (x[e] == 0.f) {
        EXPECT_EQ(y[e], 0.f) << "element " << e;
      }
    }
  }
}

// ---- quantization: error bounds ----------------------------------------------------------------------------

// Given the scales as stored, every value must sit on the level nearest to its input, or tie with it.
TEST(QuantKLow, Q2KAndQ3KPickTheNearestLevel) {
  const int64_t n = 32 * kQK_K;
  const std::vector<float> x = gaussian(n, 21);
  std::vector<BlockQ2_K> q2(size_t(n / kQK_K));
  std::vector<BlockQ3_K> q3(size_t(n / kQK_K));
  ref::quantize_q2_k(x.data(), q2.data(), n);
  ref::quantize_q3_k(x.data(), q3.data(), n);
  std::vector<float> y2(static_cast<size_t>(n)), y3(static_cast<size_t>(n));
  ref::dequantize_q2_k(q2.data(), y2.data(), n);
  ref::dequantize_q3_k(q3.data(), y3.data(), n);
  for (int64_t e = 0; e < n; ++e) {
    const BlockQ2_K& b2 = q2[size_t(e / kQK_K)];
    const int j = int(e % kQK_K) / 16;
    const double d = fp16_to_float(b2.d) * (b2.scales[j] & 0xF);
    const double m = fp16_to_float(b2.dmin) * (b2.scales[j] >> 4);
    if (d == 0) continue;  // a zero scale keeps whatever levels the sub-block search chose
    double best = 1e30;
    for (int q = 0; q < 4; ++q) best = std::min(best, std::fabs(x[size_t(e)] - (d * q - m)));
    EXPECT_LE(std::fabs(double(x[size_t(e)]) - y2[size_t(e)]), best + 1e-6 * d) << "Q2_K element " << e;
  }
  for (int64_t e = 0; e < n; ++e) {
    const BlockQ3_K& b3 = q3[size_t(e / kQK_K)];
    const int j = int(e % kQK_K) / 16;
    const double d = fp16_to_float(b3.d) * (unpack_q3_k_scale_bytewise(b3.scales, j) - 32);
    if (d == 0) continue;
    double best = 1e30;
    for (int q = -4; q < 4; ++q) best = std::min(best, std::fabs(x[size_t(e)] - d * q));
    EXPECT_LE(std::fabs(double(x[size_t(e)]) - y3[size_t(e)]), best + 1e-6 * std::fabs(d)) << "Q3_K element " << e;
  }
  EXPECT_LT(rmse(x, y3), rmse(x, y2));  // one more bit per weight must help on the same data
}

// Lloyd-Max optimum for a unit Gaussian with one fixed (non-adaptive) quantizer: RMSE 0.3428 at 2 bits,
// 0.1858 at 3, 0.0975 at 4 (Max 1960, Table I: MSE 0.1175, 0.03454, 0.009497). Per-block scales must do
// better than the best global quantizer of the same bit count.
TEST(QuantKLow, ErrorBelowLloydMaxOnGaussianData) {
  const std::vector<float> x = gaussian(64 * kQK_K, 5);
  EXPECT_LT(rmse(x, round_trip<BlockQ2_K>(x, ref::quantize_q2_k, ref::dequantize_q2_k)), 0.3428);
  EXPECT_LT(rmse(x, round_trip<BlockQ3_K>(x, ref::quantize_q3_k, ref::dequantize_q3_k)), 0.1858);
  EXPECT_LT(rmse(x, round_trip<BlockIQ4_XS>(x, ref::quantize_iq4_xs, ref::dequantize_iq4_xs)), 0.0975);
}

// Scale invariance: the searches are ratios, so scaling the input by a power of two scales the output by
// the same power as long as the fp16 super-block scales stay normal (sigma 0.5 keeps them above 2^-14;
// at sigma 0.02 IQ4_XS scales are fp16 subnormals and lose bits).
TEST(QuantKLow, PowerOfTwoScalingCommutes) {
  const std::vector<float> x = gaussian(4 * kQK_K, 8, 0.5f);
  std::vector<float> x4(x.size());
  for (size_t i = 0; i < x.size(); ++i) x4[i] = 4.f * x[i];
  const auto check = [&](const std::vector<float>& y, const std::vector<float>& y4, const char* name) {
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(4.f * y[i], y4[i]) << name << " element " << i;
  };
  check(round_trip<BlockQ2_K>(x, ref::quantize_q2_k, ref::dequantize_q2_k),
        round_trip<BlockQ2_K>(x4, ref::quantize_q2_k, ref::dequantize_q2_k), "Q2_K");
  check(round_trip<BlockQ3_K>(x, ref::quantize_q3_k, ref::dequantize_q3_k),
        round_trip<BlockQ3_K>(x4, ref::quantize_q3_k, ref::dequantize_q3_k), "Q3_K");
  check(round_trip<BlockIQ4_XS>(x, ref::quantize_iq4_xs, ref::dequantize_iq4_xs),
        round_trip<BlockIQ4_XS>(x4, ref::quantize_iq4_xs, ref::dequantize_iq4_xs), "IQ4_XS");
}

// ---- vec_dot against Q8_K ----------------------------------------------------------------------------------

template <typename Block>
void expect_dot_matches_dequantized(void (*quantize)(const float*, void*, int64_t),
                                    void (*dequantize)(const void*, float*, int64_t),
                                    float (*vec_dot)(int64_t, const void*, const void*), const char* name) {
  std::mt19937 rng(99);
  for (int nb : {1, 2, 7}) {
    const int64_t n = int64_t(nb) * kQK_K;
    const std::vector<float> x = gaussian(n, uint32_t(nb), 0.05f);
    std::vector<Block> xq(static_cast<size_t>(nb));
    quantize(x.data(), xq.data(), n);
    std::vector<BlockQ8_K> yq(static_cast<size_t>(nb));
    for (BlockQ8_K& b : yq) b = random_q8_k(rng);
    std::vector<float> xd(static_cast<size_t>(n));
    dequantize(xq.data(), xd.data(), n);
    double expected = 0, magnitude = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double yv = double(yq[size_t(i / kQK_K)].d) * yq[size_t(i / kQK_K)].qs[i % kQK_K];
      expected += xd[size_t(i)] * yv;
      magnitude += std::fabs(xd[size_t(i)] * yv);
    }
    // The integer sums are exact; the float part adds a few roundings per super-block.
    EXPECT_NEAR(vec_dot(n, xq.data(), yq.data()), expected, 1e-5 * magnitude) << name << " nb " << nb;
  }
}

TEST(QuantKLow, VecDotMatchesDoubleDotOfDequantized) {
  expect_dot_matches_dequantized<BlockQ2_K>(ref::quantize_q2_k, ref::dequantize_q2_k, ref::vec_dot_q2_k, "Q2_K");
  expect_dot_matches_dequantized<BlockQ3_K>(ref::quantize_q3_k, ref::dequantize_q3_k, ref::vec_dot_q3_k, "Q3_K");
  expect_dot_matches_dequantized<BlockIQ4_XS>(ref::quantize_iq4_xs, ref::dequantize_iq4_xs, ref::vec_dot_iq4_xs,
                                              "IQ4_XS");
}

// Extreme inputs: every field at its maximum magnitude and y at +-127 keeps the integer sums exact (no
// int16 saturation, no int32 overflow); the float results are small multiples of powers of two, so exact.
TEST(QuantKLow, VecDotExtremeBlocks) {
  BlockQ2_K q2;
  std::memset(&q2, 0xFF, sizeof(q2));  // levels 3, scales and mins 15
  q2.d = float_to_fp16(1.f);
  q2.dmin = float_to_fp16(0.5f);
  BlockQ3_K q3;
  std::memset(&q3, 0, sizeof(q3));  // levels -4, scales -32
  q3.d = float_to_fp16(1.f);
  BlockIQ4_XS iq;
  std::memset(&iq, 0, sizeof(iq));  // levels -127, scales -32
  iq.d = float_to_fp16(1.f);
  for (int sign : {1, -1}) {
    BlockQ8_K y{};
    y.d = 1.f;
    for (int k = 0; k < kQK_K; ++k) y.qs[k] = int8_t(127 * sign);
    for (int j = 0; j < 16; ++j) y.bsums[j] = int16_t(16 * 127 * sign);
    float xd[kQK_K];
    const auto expected = [&] {
      double sum = 0;
      for (int k = 0; k < kQK_K; ++k) sum += double(xd[k]) * y.qs[k];
      return sum;
    };
    ref::dequantize_q2_k(&q2, xd, kQK_K);
    EXPECT_EQ(double(ref::vec_dot_q2_k(kQK_K, &q2, &y)), expected()) << "Q2_K sign " << sign;
    ref::dequantize_q3_k(&q3, xd, kQK_K);
    EXPECT_EQ(double(ref::vec_dot_q3_k(kQK_K, &q3, &y)), expected()) << "Q3_K sign " << sign;
    ref::dequantize_iq4_xs(&iq, xd, kQK_K);
    EXPECT_EQ(double(ref::vec_dot_iq4_xs(kQK_K, &iq, &y)), expected()) << "IQ4_XS sign " << sign;
  }
}

}  // namespace
}  // namespace magnetar::quant
