// What the CUDA tests share: the GPU skip, Status assertions, seeded Gaussian data (Box-Muller over mt19937_64, so
// the data does not depend on the standard library's distributions), copies to and from the device.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "quant/quant.h"
#include "tests/cuda/quantized_tolerance.h"

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

constexpr double kU = 5.9604644775390625e-08;  // 2^-24, float's unit roundoff

// A host vector copied into a new device buffer, and n elements of a device buffer copied back.
template <typename T>
inline Result<cuda::DeviceBuffer> to_device(const std::vector<T>& v) {
  MAGNETAR_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(v.size() * sizeof(T)));
  MAGNETAR_RETURN_IF_ERROR(buf.upload(v.data(), v.size() * sizeof(T)));
  return Result<cuda::DeviceBuffer>(std::move(buf));
}

template <typename T>
inline std::vector<T> from_device(const cuda::DeviceBuffer& buf, size_t n) {
  std::vector<T> v(n);
  const Status s = buf.download(v.data(), n * sizeof(T));
  EXPECT_TRUE(s.ok()) << s.message();
  return v;
}

// ---- the matrix products' tests (cuda_mmvq_test.cpp, cuda_mmq_test.cpp) ----------------------------------------

// n rows of activations: Gaussian with a few outliers per row (as residual streams have).
inline std::vector<float> activations(Rng& rng, int64_t n, int64_t cols) {
  std::vector<float> x = gaussian(rng, size_t(n * cols));
  for (int64_t v = 0; v < n; ++v) {
    for (int k = 0; k < 3; ++k) {
      const int64_t i = int64_t(rng.bits() % uint64_t(cols));
      x[size_t(v * cols + i)] = (rng.bits() & 1 ? 40.0f : -40.0f) * (1.0f + float(k));
    }
  }
  return x;
}

// Rows of `cols` values quantized with the reference quantizer of `type`, row after row.
inline std::vector<uint8_t> quantize_ref(quant::Type type, const std::vector<float>& x, int64_t cols) {
  const int64_t n_rows = int64_t(x.size()) / cols;
  const size_t row = quant::row_size(type, cols);
  std::vector<uint8_t> q(row * size_t(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) quant::traits(type).from_float(x.data() + r * cols, q.data() + r * row, cols);
  return q;
}

inline std::vector<float> dequantize_ref(quant::Type type, const uint8_t* q, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  quant::traits(type).to_float(q, x.data(), n);
  return x;
}

inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// The poisoned guard floats after an output of `count` floats are all still NaN (nothing written past the end).
inline testing::AssertionResult guard_intact(const std::vector<float>& got, size_t count) {
  for (size_t i = count; i < got.size(); ++i) {
    if (!std::isnan(got[i])) {
      return testing::AssertionFailure() << "wrote " << (i - count + 1) << " floats past the output";
    }
  }
  return testing::AssertionSuccess();
}

// A Status that failed with a message naming `needle`.
inline void expect_error(const Status& s, const std::string& needle) {
  ASSERT_FALSE(s.ok()) << "expected an error mentioning '" << needle << "'";
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

}  // namespace magnetar::cuda_test
