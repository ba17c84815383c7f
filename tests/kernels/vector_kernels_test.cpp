// The float-vector kernels of attention (cpu::VectorKernels) of every supported ISA against the scalar
// versions, on random data of odd lengths.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels.h"
#include "quant/fp16.h"

namespace magnetar::cpu {
namespace {

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
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
      float out[G], out_ref[G];
      vk.dot_f16_multi(n, h.data(), q.data(), n, G, out);
      ref.dot_f16_multi(n, h.data(), q.data(), n, G, out_ref);
      for (int64_t g = 0; g < G; ++g) EXPECT_NEAR(out[g], out_ref[g], 1e-5 * (mag + 1)) << n << " g" << g;
      vk.dot_f32_multi(n, a.data(), q.data(), n, G, out);
      ref.dot_f32_multi(n, a.data(), q.data(), n, G, out_ref);
      for (int64_t g = 0; g < G; ++g) EXPECT_NEAR(out[g], out_ref[g], 1e-5 * (mag + 1)) << n << " g" << g;
      // axpy: single multiply-add per element; FMA vs separate rounding differs by at most one rounding
      y_ref = y;
      std::vector<float> y2 = y;
      vk.axpy_f16_multi(n, alpha.data(), h.data(), y2.data(), n, G);
      ref.axpy_f16_multi(n, alpha.data(), h.data(), y_ref.data(), n, G);
      for (size_t i = 0; i < y2.size(); ++i) EXPECT_NEAR(y2[i], y_ref[i], 1e-6 * (std::fabs(y_ref[i]) + 1)) << n;
      y_ref = y;
      y2 = y;
      vk.axpy_f32_multi(n, alpha.data(), a.data(), y2.data(), n, G);
      ref.axpy_f32_multi(n, alpha.data(), a.data(), y_ref.data(), n, G);
      for (size_t i = 0; i < y2.size(); ++i) EXPECT_NEAR(y2[i], y_ref[i], 1e-6 * (std::fabs(y_ref[i]) + 1)) << n;
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

}  // namespace
}  // namespace magnetar::cpu
