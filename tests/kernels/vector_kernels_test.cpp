// The float-vector kernels of attention (cpu::VectorKernels) of every supported ISA against the scalar
// versions, on random data of odd lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "quant/fp16.h"
#include "quant/fp8.h"

namespace magnetar::cpu {
namespace {

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(VectorKernels, MaxOfNothingIsMinusInfinity) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) {
      EXPECT_EQ(vector_kernels(isa).max(0, nullptr), -INFINITY) << isa_name(isa);
    }
  }
}

TEST(VectorKernels, MatchScalar) {
  if (simd_isas().empty()) GTEST_SKIP() << "SKIP: no SIMD ISA on this CPU";
  const VectorKernels& ref = vector_kernels(Isa::kScalar);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (Isa isa : simd_isas()) {
    const VectorKernels& vk = vector_kernels(isa);
    for (int64_t n : {1, 7, 8, 33, 64, 128, 200, 256, 300}) {
      const int64_t G = 5;
      std::vector<float> a(static_cast<size_t>(n)), q(static_cast<size_t>(n * G)), y(static_cast<size_t>(n * G)), y_ref,
          alpha(static_cast<size_t>(G));
      std::vector<uint16_t> h(static_cast<size_t>(n));
      for (float& v : a) v = dist(rng);
      for (float& v : q) v = dist(rng);
      for (float& v : y) v = dist(rng);
      for (float& v : alpha) v = dist(rng);
      for (size_t i = 0; i < h.size(); ++i) h[i] = quant::float_to_fp16(dist(rng));
      double mag = 0;
      for (int64_t i = 0; i < n; ++i) mag += std::fabs(a[size_t(i)] * q[size_t(i)]);
      const double tol = 1e-6 * (mag + 1);
      EXPECT_NEAR(vk.dot_f32(n, a.data(), q.data()), ref.dot_f32(n, a.data(), q.data()), tol) << n;
      EXPECT_NEAR(vk.dot_f16_f32(n, h.data(), q.data()), ref.dot_f16_f32(n, h.data(), q.data()), 1e-5 * (mag + 1)) << n;
      // axpy: single multiply-add per element; FMA vs separate rounding differs by at most one rounding
      std::vector<float> y2 = y;
      y_ref = y;
      vk.axpy_f32(n, alpha[0], a.data(), y2.data());
      ref.axpy_f32(n, alpha[0], a.data(), y_ref.data());
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(y2[size_t(i)], y_ref[size_t(i)], 1e-6 * (std::fabs(y_ref[size_t(i)]) + 1)) << n;
      y2 = y;
      y_ref = y;
      vk.axpy_f16(n, alpha[0], h.data(), y2.data());
      ref.axpy_f16(n, alpha[0], h.data(), y_ref.data());
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(y2[size_t(i)], y_ref[size_t(i)], 1e-6 * (std::fabs(y_ref[size_t(i)]) + 1)) << n;
      EXPECT_EQ(vk.max(n, a.data()), ref.max(n, a.data())) << n;
      EXPECT_EQ(vk.max(n, a.data()), *std::max_element(a.begin(), a.end())) << n;
      // exp_sum: softmax numerators, including arguments far below the max (underflow to 0)
      std::vector<float> x(static_cast<size_t>(n)), x_ref;
      for (float& v : x) v = 20 * dist(rng);
      x[0] = -200;
      x_ref = x;
      const float max = 30;
      const float sum = vk.exp_sum(n, x.data(), max);
      const float sum_ref = ref.exp_sum(n, x_ref.data(), max);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(x[size_t(i)], x_ref[size_t(i)], 3e-7 * x_ref[size_t(i)] + 1e-37) << "exp at " << i;  // below FLT_MIN: flushed
      }
      EXPECT_NEAR(sum, sum_ref, 1e-6 * sum_ref);
    }
  }
}

// widen_f16 on every half value, at every offset of a vector: the values of quant's conversion, a NaN as a quiet NaN
// with the half's payload (the hardware's conversion), the same bits on every ISA.
TEST(VectorKernels, WidenF16IsTheConversionWithQuietNaNs) {
  std::vector<uint16_t> h(65536 + 37);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i * 40503u);  // 40503 is odd: every value once per 65536
  std::vector<float> want(h.size()), got(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    want[i] = quant::fp16_to_float(h[i]);
    if (std::isnan(want[i])) want[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(want[i]) | 0x00400000u);
  }
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    for (int64_t skip : {0, 1, 9}) {  // odd starts and lengths: the vector loops' tails
      std::fill(got.begin(), got.end(), -1.0f);
      vector_kernels(isa).widen_f16(h.data() + skip, got.data() + skip, int64_t(h.size()) - 2 * skip);
      size_t bad = 0;
      for (size_t i = size_t(skip); i + size_t(skip) < h.size(); ++i) {
        bad += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]);
      }
      EXPECT_EQ(bad, 0u) << isa_name(isa) << " skip " << skip;
      if (skip > 0) {
        EXPECT_EQ(got[size_t(skip) - 1], -1.0f) << isa_name(isa) << ": wrote before the start";
        EXPECT_EQ(got[h.size() - size_t(skip)], -1.0f) << isa_name(isa) << ": wrote past the end";
      }
    }
  }
}

// widen_f8 on every e4m3 code, at every offset of a vector: quant::fp8_e4m3_to_float's values bit for bit (exact in
// float), the NaN codes as NaN, on every ISA.
TEST(VectorKernels, WidenF8IsTheCodesValues) {
  std::vector<uint8_t> b(4 * 256 + 37);
  for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i * 167u);  // 167 is odd: every code once per 256
  std::vector<float> got(b.size());
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    for (int64_t skip : {0, 1, 9}) {  // odd starts and lengths: the vector loops' tails
      std::fill(got.begin(), got.end(), -1.0f);
      vector_kernels(isa).widen_f8(b.data() + skip, got.data() + skip, int64_t(b.size()) - 2 * skip);
      size_t bad = 0;
      for (size_t i = size_t(skip); i + size_t(skip) < b.size(); ++i) {
        const float want = quant::fp8_e4m3_to_float(b[i]);
        bad +=
            std::isnan(want) ? !std::isnan(got[i]) : std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want);
      }
      EXPECT_EQ(bad, 0u) << isa_name(isa) << " skip " << skip;
      if (skip > 0) {
        EXPECT_EQ(got[size_t(skip) - 1], -1.0f) << isa_name(isa) << ": wrote before the start";
        EXPECT_EQ(got[b.size() - size_t(skip)], -1.0f) << isa_name(isa) << ": wrote past the end";
      }
    }
  }
}

// attn_scores / attn_accumulate: close to the scalar version, and an output's bits do not depend on the tile it is
// computed in (a row alone, a cached row alone, the cached rows split over two calls, zero weights appended) — what
// cpu::attention relies on for a token to get the same result decoded alone or inside a prefill tile.
TEST(VectorKernels, AttentionBlocksMatchScalarWhateverTheTile) {
  if (simd_isas().empty()) GTEST_SKIP() << "SKIP: no SIMD ISA on this CPU";
  const VectorKernels& ref = vector_kernels(Isa::kScalar);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  for (Isa isa : simd_isas()) {
    const VectorKernels& vk = vector_kernels(isa);
    for (const int64_t d : {8, 12, 32, 128, 136}) {
      for (const int64_t m : {1, 4, 9}) {
        for (const int64_t n : {1, 5, 32}) {
          const int64_t ldq = d + 3, ldk = d + 5, lds = n + 2;
          const std::vector<float> q = random(size_t(m * ldq)), k = random(size_t(n * ldk));
          std::vector<float> s(size_t(m * lds)), s_ref(s.size());
          vk.attn_scores(m, n, d, q.data(), ldq, k.data(), ldk, 0.3f, s.data(), lds);
          ref.attn_scores(m, n, d, q.data(), ldq, k.data(), ldk, 0.3f, s_ref.data(), lds);
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t j = 0; j < n; ++j) {
              const float got = s[size_t(r * lds + j)];
              EXPECT_NEAR(got, s_ref[size_t(r * lds + j)], 1e-5 * double(d)) << "d " << d << " r " << r << " j " << j;
              float alone = 0;
              vk.attn_scores(1, 1, d, q.data() + r * ldq, ldq, k.data() + j * ldk, ldk, 0.3f, &alone, 1);
              EXPECT_EQ(alone, got) << "d " << d << " m " << m << " n " << n << " r " << r << " j " << j;
            }
          }
          // p: [m][n + 3], the last 3 weights zero; v: [n + 3][ldv]
          const int64_t ldp = n + 3, ldv = d + 1, ldo = d + 2;
          std::vector<float> p = random(size_t(m * ldp)), v = random(size_t((n + 3) * ldv));
          for (int64_t r = 0; r < m; ++r) std::fill_n(p.begin() + r * ldp + n, 3, 0.0f);
          const std::vector<float> o0 = random(size_t(m * ldo));
          std::vector<float> o = o0, o_ref = o0, o_split = o0, o_zeros = o0;
          vk.attn_accumulate(m, n, d, p.data(), ldp, v.data(), ldv, o.data(), ldo);
          ref.attn_accumulate(m, n, d, p.data(), ldp, v.data(), ldv, o_ref.data(), ldo);
          const int64_t n1 = n / 2;
          vk.attn_accumulate(m, n1, d, p.data(), ldp, v.data(), ldv, o_split.data(), ldo);
          vk.attn_accumulate(m, n - n1, d, p.data() + n1, ldp, v.data() + n1 * ldv, ldv, o_split.data(), ldo);
          vk.attn_accumulate(m, n + 3, d, p.data(), ldp, v.data(), ldv, o_zeros.data(), ldo);
          for (int64_t r = 0; r < m; ++r) {
            std::vector<float> alone(o0.begin() + r * ldo, o0.begin() + (r + 1) * ldo);
            vk.attn_accumulate(1, n, d, p.data() + r * ldp, ldp, v.data(), ldv, alone.data(), ldo);
            for (int64_t i = 0; i < d; ++i) {
              const size_t at = size_t(r * ldo + i);
              EXPECT_NEAR(o[at], o_ref[at], 2e-6 * double(n) * (std::fabs(o_ref[at]) + 1)) << "d " << d << " r " << r;
              EXPECT_EQ(alone[size_t(i)], o[at]) << "d " << d << " m " << m << " n " << n << " r " << r << " i " << i;
              EXPECT_EQ(o_split[at], o[at]) << "d " << d << " n " << n << " split at " << n1;
              EXPECT_EQ(o_zeros[at], o[at]) << "d " << d << " n " << n << " zero weights appended";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace magnetar::cpu
