// What the CUDA tests share: the GPU skip, Status assertions, seeded Gaussian data (Box-Muller over mt19937_64, so
// the data does not depend on the standard library's distributions).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"

namespace magnetar::cuda_test {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "SKIP: no CUDA device on this machine: NOT tested"

// Fatal-on-error unwrapping of a Result inside a test body.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) ASSERT_OK_AND_ASSIGN_IMPL(MAGNETAR_CONCAT(result_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)  \
  auto tmp = (expr);                               \
  ASSERT_TRUE(tmp.ok()) << tmp.status().message(); \
  lhs = std::move(tmp).value()
#define ASSERT_OK(expr)                             \
  do {                                              \
    const Status status_ = (expr);                  \
    ASSERT_TRUE(status_.ok()) << status_.message(); \
  } while (0)

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  uint64_t bits() { return gen_(); }
  double uniform() { return double(gen_() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float gaussian() {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  std::mt19937_64 gen_;
};

inline std::vector<float> gaussian(Rng& rng, size_t n, float sigma = 1.0f) {
  std::vector<float> v(n);
  for (float& f : v) f = sigma * rng.gaussian();
  return v;
}

}  // namespace magnetar::cuda_test
