// CUDA kernels against the scalar reference. Needs a GPU: on a machine without one (CI) every test here
// reports SKIPPED, never passed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

TEST(CudaDequantize, Q8_0MatchesTheReferenceBitExactly) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "SKIP: no CUDA device on this machine";
  const quant::TypeTraits& q8 = quant::traits(quant::Type::Q8_0);
  const int64_t n = 32 * 4099;  // odd block count: exercises the grid tail
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  x[5] = 1e4f;  // an outlier block
  std::vector<uint8_t> packed(quant::row_size(quant::Type::Q8_0, n));
  q8.from_float(x.data(), packed.data(), n);
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  q8.to_float(packed.data(), want.data(), n);
  ASSERT_TRUE(cuda::dequantize_q8_0(packed.data(), got.data(), n).ok());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
}

TEST(CudaDequantize, RejectsPartialBlocks) {
  std::vector<float> out(33);
  std::vector<uint8_t> in(68);
  const Status s = cuda::dequantize_q8_0(in.data(), out.data(), 33);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not a multiple of 32"), std::string::npos);
}

}  // namespace
}  // namespace magnetar
