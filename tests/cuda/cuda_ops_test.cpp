// The non-matmul ops of the forward pass on the GPU (rms_norm, add_rms_norm, rope_neox, qk_norm_rope, swiglu,
// route_topk, store_kv, attention, attention_prefill_mma) against the scalar CPU formulas (STYLE.md rule 7). Needs a
// GPU: without one every test that launches a kernel reports SKIPPED, never passed; the argument checks
// (RejectsBadArguments) need no device and always run.
//
// The references restate the CPU ops (backends/cpu/ops.cpp, models/qwen3_moe/qwen3_moe.cpp) in scalar code,
// step for step where the op is exact and in double where it is not; this executable does not link
// backends/cpu. What is asserted, and why each bound holds (u = 2^-24, float's unit roundoff):
//   rms_norm, add_rms_norm  |y - ref| <= 2^-21 |ref|. Both sum squares in double; the float scale may differ by
//                           one ulp (2^-23 relative) where the two summation orders straddle a rounding
//                           boundary, and the two float products then differ by <= 2^-23 + 4u relative.
//                           add_rms_norm's updated x is bit-identical to x + residual.
//   rope_neox               |out - ref| <= 6u (|a| + |b|) for the pair (a, b). cos/sin are the same float
//                           except where CUDA's double pow/sin/cos (<= 2 ulp of double) cross a float rounding
//                           boundary: one ulp, <= 2^-24 absolute as |cos|, |sin| <= 1; each product then moves
//                           by <= |a| (2^-24 + 2u), and the final add by 2u (|a| + |b|).
//   qk_norm_rope            bit-identical with rms_norm then rope_neox on the GPU (same operations in the same
//                           order), each of which is held to its bound above.
//   swiglu                  |out - ref| <= 16u |ref| + 1e-37. expf is within 2 ulp on the GPU, std::exp(float)
//                           within 1 ulp: 3 ulp (6u) on exp, carried through 1 + e (e / (1 + e) <= 1), plus one
//                           rounding each of add, divide and multiply on both sides (6u).
//   route_topk              ids identical (comparisons only, same tie order); |w - ref| <= 1e-6: both compute
//                           in double and round to float, so they differ by at most one float ulp (<= 6e-8 for
//                           weights <= 1) per rounding step.
//   store_kv                bit-identical with quant::float_to_fp16 (both round to nearest even); rows outside
//                           [row0, row0 + n_tok) untouched.
//   attention               (random data) per element d: (2 eps + 2 gamma_N + u) * max_j |v_jd| against a double
//                           reference over the same F16 K/V and float q, eps and N derived in attention_bound().
//                           (exact data) K = 0 makes every score 0 and every exp factor exactly 1; V holds small
//                           integers, so every sum is exact and out = fl(sum / count) bit for bit: a dropped,
//                           doubled or misplaced row, a wrong window edge or a wrong V head fails exactly.
//                           Rows past the attended range hold F16 NaN, so reading one poisons the output.
//   attention_prefill_mma   (random data) per element: the bound derived above mma_expect() from the f16
//                           rounding of Q and P (2^-11 each), ex2.approx and the f32 sums, against the same double
//                           reference; many tokens per call against one call per token within twice that bound.
//                           (exact data) the K = 0 check above holds bit for bit (ex2(0) = 1, integer sums exact).
// Shapes: rows 1, 7, 33 (and long rows through the CTA path), head_dim 64, 96, 128, 256, n_head/n_head_kv 8/2,
// 4/4, 32/4, 16/1; contexts 1, 17, 300, 5000, 20000 (several splits, a partial last chunk, several chunks per
// split), windows that cut inside a chunk; prefill of 7 and 33 tokens after 0, 17 and 300 cached rows.
// attention_prefill_mma: prefill_mma_cases() (groups 1, 3, 4, 8, 16; head_dim 64, 128, 256; 1 to 200 tokens after
// 0 or 1000 rows; windows 0, 1, 100, 5000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "quant/fp16.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

using cuda_test::gaussian;
using cuda_test::Rng;

constexpr uint64_t kSeed = 20261130;
constexpr double kU = 5.9604644775390625e-08;  // 2^-24


// ---- data and device helpers ------------------------------------------------------------------------------



template <typename T>
Result<cuda::DeviceBuffer> to_device(const std::vector<T>& v) {
  MAGNETAR_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(v.size() * sizeof(T)));
  MAGNETAR_RETURN_IF_ERROR(buf.upload(v.data(), v.size() * sizeof(T)));
  return Result<cuda::DeviceBuffer>(std::move(buf));
}

template <typename T>
std::vector<T> from_device(const cuda::DeviceBuffer& buf, size_t n) {
  std::vector<T> v(n);
  const Status s = buf.download(v.data(), n * sizeof(T));
  EXPECT_TRUE(s.ok()) << s.message();
  return v;
}

// ---- CPU references (restated) -------------------------------------------------------------------------------

// cpu::rms_norm
void ref_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i]) * double(xr[i]);
    const float scale = float(1.0 / std::sqrt(sum / double(n) + double(eps)));
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = xr[i] * scale * w[i];
  }
}

// cpu::rope_neox
void ref_rope(float* x, int64_t n_tok, int64_t n_head, int64_t head_dim, const int32_t* pos, float theta) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq = float(1.0 / std::pow(double(theta), double(2 * i) / double(head_dim)));
      const double angle = double(pos[t]) * double(inv_freq);
      const float cs = float(std::cos(angle)), sn = float(std::sin(angle));
      for (int64_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * head_dim;
        const float a = v[i], b = v[i + half];
        v[i] = a * cs - b * sn;
        v[i + half] = b * cs + a * sn;
      }
    }
  }
}

// Qwen3Model::route()'s softmax, top-k and renormalization for one token.
void ref_route(const float* logits, int64_t n_expert, int64_t k, bool normalize, int32_t* ids, float* weights) {
  const float max_logit = *std::max_element(logits, logits + n_expert);
  double sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) sum += std::exp(double(logits[e] - max_logit));
  std::vector<int32_t> idx(static_cast<size_t>(n_expert));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  double top_sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = idx[size_t(j)];
    weights[j] = float(std::exp(double(logits[ids[j]] - max_logit)) / sum);
    top_sum += weights[j];
  }
  if (normalize) {
    for (int64_t j = 0; j < k; ++j) weights[j] = float(weights[j] / top_sum);
  }
}

// ---- rms_norm / add_rms_norm ---------------------------------------------------------------------------------

void expect_norm_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = std::ldexp(std::fabs(double(want[i])), -21);
    if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

TEST(CudaOps, RmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed);
  for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(33)}) {
    for (const int64_t cols : {int64_t(37), int64_t(64), int64_t(128), int64_t(1024), int64_t(1025), int64_t(2048),
                               int64_t(4099), int64_t(8200)}) {
      for (const bool in_place : {false, true}) {
        std::vector<float> x = gaussian(rng, size_t(rows * cols));
        x[size_t(rng.bits() % x.size())] = 300.0f;  // an outlier, as residual streams have
        const std::vector<float> w = gaussian(rng, size_t(cols));
        std::vector<float> want(x.size());
        ref_rms_norm(x.data(), w.data(), want.data(), rows, cols, 1e-6f);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, to_device(w));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dy, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
        float* y = in_place ? dx.as<float>() : dy.as<float>();
        ASSERT_OK(cuda::rms_norm(
            {.x = dx.as<float>(), .weight = dw.as<float>(), .y = y, .n_rows = rows, .n_cols = cols, .eps = 1e-6f},
            stream));
        stream.synchronize();
        expect_norm_close(from_device<float>(in_place ? dx : dy, x.size()), want,
                          "rms_norm rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      }
    }
  }
}

// The per-head q/k norm of Qwen3: rows = tokens * heads, cols = head_dim.
TEST(CudaOps, RmsNormPerHead) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 1);
  for (const int64_t n_tok : {int64_t(1), int64_t(7), int64_t(33)}) {
    for (const int64_t head_dim : {int64_t(64), int64_t(128)}) {
      const int64_t rows = n_tok * 8;
      std::vector<float> x = gaussian(rng, size_t(rows * head_dim), 3.0f);
      const std::vector<float> w = gaussian(rng, size_t(head_dim));
      std::vector<float> want(x.size());
      ref_rms_norm(x.data(), w.data(), want.data(), rows, head_dim, 1e-6f);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, to_device(w));
      ASSERT_OK(cuda::rms_norm({.x = dx.as<float>(),
                                .weight = dw.as<float>(),
                                .y = dx.as<float>(),
                                .n_rows = rows,
                                .n_cols = head_dim,
                                .eps = 1e-6f},
                               stream));
      stream.synchronize();
      expect_norm_close(from_device<float>(dx, x.size()), want, "q/k norm");
    }
  }
}

TEST(CudaOps, AddRmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 2);
  for (const int64_t rows : {int64_t(1), int64_t(7), int64_t(33)}) {
    for (const int64_t cols : {int64_t(37), int64_t(128), int64_t(2048), int64_t(4099), int64_t(8200)}) {
      const std::vector<float> x = gaussian(rng, size_t(rows * cols));
      const std::vector<float> r = gaussian(rng, size_t(rows * cols), 0.5f);
      const std::vector<float> w = gaussian(rng, size_t(cols));
      std::vector<float> sum(x.size()), want(x.size());
      for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + r[i];
      ref_rms_norm(sum.data(), w.data(), want.data(), rows, cols, 1e-6f);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dr, to_device(r));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, to_device(w));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dy, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
      ASSERT_OK(cuda::add_rms_norm({.x = dx.as<float>(),
                                    .residual = dr.as<float>(),
                                    .weight = dw.as<float>(),
                                    .y = dy.as<float>(),
                                    .n_rows = rows,
                                    .n_cols = cols,
                                    .eps = 1e-6f},
                                   stream));
      stream.synchronize();
      const std::vector<float> got_x = from_device<float>(dx, x.size());
      ASSERT_EQ(0, std::memcmp(got_x.data(), sum.data(), sum.size() * sizeof(float))) << "x + residual not exact";
      expect_norm_close(from_device<float>(dy, x.size()), want, "add_rms_norm");
    }
  }
}

// add_rms_norm with the MoE combine folded in (residual_rows): x becomes x + the weighted sum of each token's k expert
// rows, summed as moe_combine does (fmaf in slot order; checked exactly against that sum made here), and y is bit for
// bit the y of moe_combine followed by the plain add_rms_norm on the GPU.
TEST(CudaOps, AddRmsNormCombinesExpertRows) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 3);
  constexpr int64_t k = 8;
  for (const int64_t rows : {int64_t(1), int64_t(3)}) {
    for (const int64_t cols : {int64_t(37), int64_t(2048), int64_t(4099)}) {
      const int64_t n_slot = rows * k + 5;  // more expert rows than slots: some are never read
      const std::vector<float> x = gaussian(rng, size_t(rows * cols));
      const std::vector<float> expert = gaussian(rng, size_t(n_slot * cols), 0.5f);
      const std::vector<float> slot_w = gaussian(rng, size_t(rows * k), 0.3f);
      const std::vector<float> w = gaussian(rng, size_t(cols));
      std::vector<int32_t> slot_rows(size_t(rows * k));
      for (size_t i = 0; i < slot_rows.size(); ++i) slot_rows[i] = int32_t((i * 7 + 3) % size_t(n_slot));
      std::vector<float> want_x(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          float s = 0.0f;
          for (int64_t j = 0; j < k; ++j) {
            s = std::fmaf(slot_w[size_t(r * k + j)], expert[size_t(slot_rows[size_t(r * k + j)] * cols + c)], s);
          }
          want_x[size_t(r * cols + c)] = x[size_t(r * cols + c)] + s;
        }
      }
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx2, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer de, to_device(expert));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dsw, to_device(slot_w));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dsr, to_device(slot_rows));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, to_device(w));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dcomb, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dy, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dy2, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
      ASSERT_OK(cuda::add_rms_norm({.x = dx.as<float>(), .residual = de.as<float>(), .weight = dw.as<float>(),
                                    .y = dy.as<float>(), .n_rows = rows, .n_cols = cols, .eps = 1e-6f,
                                    .residual_rows = dsr.as<int32_t>(), .residual_weights = dsw.as<float>(),
                                    .residual_k = k},
                                   stream));
      ASSERT_OK(cuda::moe_combine({.rows = de.as<float>(), .slot_rows = dsr.as<int32_t>(),
                                   .weights = dsw.as<float>(), .out = dcomb.as<float>(), .n_tok = rows, .k = k,
                                   .n = cols},
                                  stream));
      ASSERT_OK(cuda::add_rms_norm({.x = dx2.as<float>(), .residual = dcomb.as<float>(), .weight = dw.as<float>(),
                                    .y = dy2.as<float>(), .n_rows = rows, .n_cols = cols, .eps = 1e-6f},
                                   stream));
      stream.synchronize();
      const std::string where = "rows " + std::to_string(rows) + " cols " + std::to_string(cols);
      const std::vector<float> got_x = from_device<float>(dx, x.size());
      ASSERT_EQ(0, std::memcmp(got_x.data(), want_x.data(), x.size() * sizeof(float))) << where << ": x";
      const std::vector<float> got_y = from_device<float>(dy, x.size()), want_y = from_device<float>(dy2, x.size());
      EXPECT_EQ(0, std::memcmp(got_y.data(), want_y.data(), x.size() * sizeof(float))) << where << ": y";
    }
  }
}

// ---- rope ----------------------------------------------------------------------------------------------------

TEST(CudaOps, RopeNeoxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 3);
  for (const float theta : {10000.0f, 1000000.0f}) {
    for (const int64_t n_tok : {int64_t(1), int64_t(7), int64_t(33)}) {
      for (const int64_t n_head : {int64_t(2), int64_t(4), int64_t(9), int64_t(32)}) {
        for (const int64_t head_dim : {int64_t(64), int64_t(128)}) {
          std::vector<int32_t> pos(static_cast<size_t>(n_tok));
          for (int64_t t = 0; t < n_tok; ++t) pos[size_t(t)] = t == 0 ? 0 : int32_t(rng.bits() % 40000);
          const std::vector<float> x = gaussian(rng, size_t(n_tok * n_head * head_dim), 2.0f);
          std::vector<float> want = x;
          ref_rope(want.data(), n_tok, n_head, head_dim, pos.data(), theta);
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dp, to_device(pos));
          ASSERT_OK(cuda::rope_neox({.x = dx.as<float>(),
                                     .positions = dp.as<int32_t>(),
                                     .n_tok = n_tok,
                                     .n_head = n_head,
                                     .head_dim = head_dim,
                                     .theta = theta},
                                    stream));
          stream.synchronize();
          const std::vector<float> got = from_device<float>(dx, x.size());
          const int64_t half = head_dim / 2;
          int bad = 0;
          for (int64_t row = 0; row < n_tok * n_head && bad < 5; ++row) {
            for (int64_t i = 0; i < half; ++i) {
              const size_t lo = size_t(row * head_dim + i), hi = lo + size_t(half);
              const double tol = 6.0 * kU * (std::fabs(double(x[lo])) + std::fabs(double(x[hi])));
              for (const size_t e : {lo, hi}) {
                if (!(std::fabs(double(got[e]) - double(want[e])) <= tol) && bad++ < 5) {
                  ADD_FAILURE() << "rope theta " << theta << " n_tok " << n_tok << " n_head " << n_head << " head_dim "
                                << head_dim << " element " << e << ": got " << got[e] << ", want " << want[e];
                }
              }
            }
          }
        }
      }
    }
  }
}

// ---- qk_norm_rope ----------------------------------------------------------------------------------------------

// The fused op against the two ops it replaces, on the GPU: bit-identical by construction (same summation order,
// same scale, same cos/sin, same unfused products); each of those two is checked against the CPU above.
TEST(CudaOps, QkNormRopeBitIdenticalToNormThenRope) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 9);
  for (const int64_t n_tok : {int64_t(1), int64_t(7), int64_t(33)}) {
    for (const int64_t n_head : {int64_t(2), int64_t(4), int64_t(8), int64_t(9)}) {
      for (const int64_t head_dim : {int64_t(64), int64_t(128), int64_t(256)}) {
        std::vector<int32_t> pos(static_cast<size_t>(n_tok));
        for (int64_t t = 0; t < n_tok; ++t) pos[size_t(t)] = int32_t(rng.bits() % 40000);
        const std::vector<float> x = gaussian(rng, size_t(n_tok * n_head * head_dim), 2.0f);
        const std::vector<float> w = gaussian(rng, size_t(head_dim));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer fused, to_device(x));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer split, to_device(x));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, to_device(w));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dp, to_device(pos));
        ASSERT_OK(cuda::qk_norm_rope({.x = fused.as<float>(),
                                      .weight = dw.as<float>(),
                                      .positions = dp.as<int32_t>(),
                                      .n_tok = n_tok,
                                      .n_head = n_head,
                                      .head_dim = head_dim,
                                      .eps = 1e-6f,
                                      .theta = 1e6f},
                                     stream));
        ASSERT_OK(cuda::rms_norm({.x = split.as<float>(),
                                  .weight = dw.as<float>(),
                                  .y = split.as<float>(),
                                  .n_rows = n_tok * n_head,
                                  .n_cols = head_dim,
                                  .eps = 1e-6f},
                                 stream));
        ASSERT_OK(cuda::rope_neox({.x = split.as<float>(),
                                   .positions = dp.as<int32_t>(),
                                   .n_tok = n_tok,
                                   .n_head = n_head,
                                   .head_dim = head_dim,
                                   .theta = 1e6f},
                                  stream));
        stream.synchronize();
        const std::vector<float> a = from_device<float>(fused, x.size());
        const std::vector<float> b = from_device<float>(split, x.size());
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << "n_tok " << n_tok << " n_head " << n_head << " head_dim " << head_dim;
      }
    }
  }
}

// ---- swiglu --------------------------------------------------------------------------------------------------

TEST(CudaOps, SwigluMatchesCpu) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 4);
  for (const int64_t count : {int64_t(1), int64_t(7), int64_t(33), int64_t(6144), int64_t(100003)}) {
    std::vector<float> gate = gaussian(rng, size_t(count), 4.0f);
    const std::vector<float> up = gaussian(rng, size_t(count));
    const float extremes[] = {-100.0f, -88.0f, -20.0f, -0.0f, 0.0f, 1e-30f, 20.0f, 88.0f, 100.0f};
    for (size_t i = 0; i < std::size(extremes) && i < gate.size(); ++i) gate[i] = extremes[i];
    std::vector<float> want(gate.size());
    for (size_t i = 0; i < gate.size(); ++i) want[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dg, to_device(gate));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer du, to_device(up));
    ASSERT_OK(cuda::swiglu(dg.as<float>(), du.as<float>(), count, stream));
    stream.synchronize();
    const std::vector<float> got = from_device<float>(dg, gate.size());
    int bad = 0;
    for (size_t i = 0; i < got.size() && bad < 5; ++i) {
      const double tol = 16.0 * kU * std::fabs(double(want[i])) + 1e-37;
      if (!(std::fabs(double(got[i]) - double(want[i])) <= tol)) {
        ADD_FAILURE() << "swiglu count " << count << " element " << i << " gate " << gate[i] << ": got " << got[i]
                      << ", want " << want[i];
        ++bad;
      }
    }
  }
}

// ---- quantizing in the producing op (add_rms_norm's y_quantized, swiglu_quantize) ------------------------------

// The fused ops against the unfused pair on the GPU, bit for bit: the floats are those add_rms_norm / swiglu write
// without quantizing, the bytes those quantize_activations writes for them (whose bytes the matvec tests check
// against the reference quantizer). For Q8_0, Q8_1 and Q8_K; rows of one warp (<= 1024 columns, 8 per CTA, a last
// CTA part-filled) and of one CTA, up to kMaxNormQuantizeCols.
const quant::Type kActTypes[] = {quant::Type::Q8_0, quant::Type::Q8_1, quant::Type::Q8_K};

struct FusedOut {
  std::vector<float> x, y;  // add_rms_norm: x and y; swiglu: gate in x
  std::vector<uint8_t> q;   // the quantized rows
};

// add_rms_norm(x, r, w) on a copy of x with y quantized to t: in the same launch (fuse) or by quantize_activations.
FusedOut add_norm_quantized(const std::vector<float>& x, const std::vector<float>& r, const std::vector<float>& w,
                            int64_t rows, int64_t cols, quant::Type t, bool fuse, cuda::Stream& stream) {
  FusedOut o;
  const size_t n = x.size(), qbytes = size_t(rows) * quant::row_size(t, cols);
  auto dx = to_device(x);
  auto dr = to_device(r);
  auto dw = to_device(w);
  auto dy = cuda::DeviceBuffer::allocate(n * sizeof(float));
  auto dq = cuda::DeviceBuffer::allocate(qbytes);
  if (!dx.ok() || !dr.ok() || !dw.ok() || !dy.ok() || !dq.ok()) {
    ADD_FAILURE() << "device allocation";
    return o;
  }
  const Status st = cuda::add_rms_norm({.x = dx->as<float>(), .residual = dr->as<float>(), .weight = dw->as<float>(),
                                        .y = dy->as<float>(), .n_rows = rows, .n_cols = cols, .eps = 1e-6f,
                                        .y_type = fuse ? t : quant::Type::F32,
                                        .y_quantized = fuse ? dq->data() : nullptr},
                                       stream);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!fuse) {
    EXPECT_TRUE(cuda::quantize_activations(t, dy->as<float>(), dq->data(), cols, rows, stream).ok());
  }
  stream.synchronize();
  o.x = from_device<float>(*dx, n);
  o.y = from_device<float>(*dy, n);
  o.q = from_device<uint8_t>(*dq, qbytes);
  return o;
}

// swiglu over [rows, cols] on copies, the result quantized to t: swiglu_quantize (fuse) or swiglu then
// quantize_activations.
FusedOut swiglu_quantized(const std::vector<float>& gate, const std::vector<float>& up, int64_t rows, int64_t cols,
                          quant::Type t, bool fuse, cuda::Stream& stream) {
  FusedOut o;
  const size_t n = gate.size(), qbytes = size_t(rows) * quant::row_size(t, cols);
  auto dg = to_device(gate);
  auto du = to_device(up);
  auto dq = cuda::DeviceBuffer::allocate(qbytes);
  if (!dg.ok() || !du.ok() || !dq.ok()) {
    ADD_FAILURE() << "device allocation";
    return o;
  }
  if (fuse) {
    const Status st = cuda::swiglu_quantize({.gate = dg->as<float>(), .up = du->as<float>(), .n_rows = rows,
                                             .n_cols = cols, .out_type = t, .out = dq->data()},
                                            stream);
    EXPECT_TRUE(st.ok()) << st.message();
  } else {
    EXPECT_TRUE(cuda::swiglu(dg->as<float>(), du->as<float>(), int64_t(n), stream).ok());
    EXPECT_TRUE(cuda::quantize_activations(t, dg->as<float>(), dq->data(), cols, rows, stream).ok());
  }
  stream.synchronize();
  o.x = from_device<float>(*dg, n);
  o.q = from_device<uint8_t>(*dq, qbytes);
  return o;
}

void expect_same(const FusedOut& fused, const FusedOut& plain, const std::string& what) {
  ASSERT_EQ(fused.x.size(), plain.x.size()) << what;
  ASSERT_EQ(fused.y.size(), plain.y.size()) << what;
  ASSERT_EQ(fused.q.size(), plain.q.size()) << what;
  EXPECT_EQ(0, std::memcmp(fused.x.data(), plain.x.data(), plain.x.size() * sizeof(float))) << what << ": x";
  EXPECT_EQ(0, std::memcmp(fused.y.data(), plain.y.data(), plain.y.size() * sizeof(float))) << what << ": y";
  EXPECT_EQ(0, std::memcmp(fused.q.data(), plain.q.data(), plain.q.size())) << what << ": quantized bytes";
}

std::string shape_name(quant::Type t, int64_t rows, int64_t cols) {
  return std::string(quant::type_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
}

TEST(CudaOps, AddRmsNormQuantizeEqualsNormThenQuantize) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 40);
  const std::pair<int64_t, int64_t> shapes[] = {{1, 2048}, {3, 4096}, {9, 256}, {17, 1024},
                                                {2, 1280}, {1, 8192}, {2, 7168}};
  for (const quant::Type t : kActTypes) {
    for (const auto& [rows, cols] : shapes) {
      if (t == quant::Type::Q8_K && cols % 256 != 0) continue;
      ASSERT_TRUE(cuda::can_quantize_norm(t, cols)) << shape_name(t, rows, cols);
      std::vector<float> x = gaussian(rng, size_t(rows * cols));
      std::vector<float> r = gaussian(rng, size_t(rows * cols), 0.5f);
      const std::vector<float> w = gaussian(rng, size_t(cols));
      std::fill(x.begin(), x.begin() + 256, 0.0f);  // x + r = 0 there: an all-zero first block
      std::fill(r.begin(), r.begin() + 256, 0.0f);
      expect_same(add_norm_quantized(x, r, w, rows, cols, t, true, stream),
                  add_norm_quantized(x, r, w, rows, cols, t, false, stream), shape_name(t, rows, cols));
    }
  }
}

TEST(CudaOps, SwigluQuantizeEqualsSwigluThenQuantize) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 41);
  const std::pair<int64_t, int64_t> shapes[] = {{8, 768}, {1, 256}, {37, 1536}, {300, 512}};
  for (const quant::Type t : kActTypes) {
    for (const auto& [rows, cols] : shapes) {
      std::vector<float> gate = gaussian(rng, size_t(rows * cols), 4.0f);
      const std::vector<float> up = gaussian(rng, size_t(rows * cols));
      std::fill(gate.begin(), gate.begin() + 256, 0.0f);  // swiglu(0) = 0: an all-zero first block
      expect_same(swiglu_quantized(gate, up, rows, cols, t, true, stream),
                  swiglu_quantized(gate, up, rows, cols, t, false, stream), shape_name(t, rows, cols));
    }
  }
}

// ---- route_topk ------------------------------------------------------------------------------------------------

TEST(CudaOps, RouteTopkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 5);
  for (const int64_t n_expert : {int64_t(8), int64_t(60), int64_t(128), int64_t(256), int64_t(1000)}) {
    for (const int64_t k : {int64_t(1), int64_t(2), int64_t(8), int64_t(32)}) {
      if (k > n_expert) continue;
      for (const int64_t n_tok : {int64_t(1), int64_t(7), int64_t(33)}) {
        for (const bool ties : {false, true}) {
          for (const bool normalize : {false, true}) {
            std::vector<float> logits = gaussian(rng, size_t(n_tok * n_expert), 2.0f);
            if (ties) {
              for (float& l : logits) l = std::round(2.0f * l) / 2.0f;  // many equal logits
            }
            std::vector<int32_t> want_ids(size_t(n_tok * k));
            std::vector<float> want_w(size_t(n_tok * k));
            for (int64_t t = 0; t < n_tok; ++t) {
              ref_route(logits.data() + t * n_expert, n_expert, k, normalize, want_ids.data() + t * k,
                        want_w.data() + t * k);
            }
            ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dl, to_device(logits));
            ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer di, cuda::DeviceBuffer::allocate(want_ids.size() * 4));
            ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, cuda::DeviceBuffer::allocate(want_w.size() * 4));
            ASSERT_OK(cuda::route_topk({.logits = dl.as<float>(),
                                        .ids = di.as<int32_t>(),
                                        .weights = dw.as<float>(),
                                        .n_tok = n_tok,
                                        .n_expert = n_expert,
                                        .k = k,
                                        .normalize = normalize},
                                       stream));
            stream.synchronize();
            const std::string what = "route n_expert " + std::to_string(n_expert) + " k " + std::to_string(k) +
                                     " n_tok " + std::to_string(n_tok) + (ties ? " ties" : "") +
                                     (normalize ? " normalized" : "");
            ASSERT_EQ(from_device<int32_t>(di, want_ids.size()), want_ids) << what;
            const std::vector<float> got_w = from_device<float>(dw, want_w.size());
            for (size_t i = 0; i < got_w.size(); ++i) ASSERT_NEAR(got_w[i], want_w[i], 1e-6) << what << " weight " << i;
          }
        }
      }
    }
  }
}

// route_topk with a table (decode): the items built in the same launch follow the chosen ids exactly: row
// r = t * k + j gets table[3 id], table[3 id + 1], table[3 id + 2], row0 r, n 1; x_rows[r] = t; slot_rows[r] = r.
// The table holds distinct fake pointers (never dereferenced).
TEST(CudaOps, RouteTopkBuildsDecodeItems) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 64);
  for (const int64_t n_expert : {int64_t(16), int64_t(128)}) {
    for (const int64_t n_tok : {int64_t(1), int64_t(8)}) {
      const int64_t k = 8, R = n_tok * k;
      std::vector<uintptr_t> table(size_t(n_expert * 3));
      for (size_t i = 0; i < table.size(); ++i) table[i] = 0x1000 + 0x40 * i;
      const std::vector<float> logits = gaussian(rng, size_t(n_tok * n_expert), 2.0f);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dl, to_device(logits));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dt, to_device(table));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer di, cuda::DeviceBuffer::allocate(size_t(R) * 4));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, cuda::DeviceBuffer::allocate(size_t(R) * 4));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items, cuda::DeviceBuffer::allocate(size_t(R) * sizeof(cuda::GroupItem)));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_rows, cuda::DeviceBuffer::allocate(size_t(R) * 4));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer slot_rows, cuda::DeviceBuffer::allocate(size_t(R) * 4));
      ASSERT_OK(cuda::route_topk({.logits = dl.as<float>(), .ids = di.as<int32_t>(), .weights = dw.as<float>(),
                                  .n_tok = n_tok, .n_expert = n_expert, .k = k, .normalize = true,
                                  .table = dt.as<const void*>(), .items = items.as<cuda::GroupItem>(),
                                  .x_rows = x_rows.as<int32_t>(), .slot_rows = slot_rows.as<int32_t>()},
                                 stream));
      stream.synchronize();
      const std::vector<int32_t> ids = from_device<int32_t>(di, size_t(R));
      const std::vector<cuda::GroupItem> got = from_device<cuda::GroupItem>(items, size_t(R));
      const std::vector<int32_t> xr = from_device<int32_t>(x_rows, size_t(R));
      const std::vector<int32_t> sr = from_device<int32_t>(slot_rows, size_t(R));
      for (int64_t r = 0; r < R; ++r) {
        const size_t e = size_t(ids[size_t(r)]);
        ASSERT_LT(e, size_t(n_expert));
        for (size_t p = 0; p < 3; ++p) {
          ASSERT_EQ(reinterpret_cast<uintptr_t>(got[size_t(r)].w[p]), table[3 * e + p]) << "row " << r << " part " << p;
        }
        ASSERT_EQ(got[size_t(r)].row0, int32_t(r));
        ASSERT_EQ(got[size_t(r)].n, 1);
        ASSERT_EQ(xr[size_t(r)], int32_t(r / k));
        ASSERT_EQ(sr[size_t(r)], int32_t(r));
      }
    }
  }
}

// ---- store_kv --------------------------------------------------------------------------------------------------

TEST(CudaOps, StoreKvBitIdenticalToCpuF16) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 6);
  for (const int64_t n : {int64_t(64), int64_t(512), int64_t(1000)}) {
    for (const int64_t n_tok : {int64_t(1), int64_t(7), int64_t(33)}) {
      const int64_t row0 = 5, n_rows = row0 + n_tok + 3;
      std::vector<float> x = gaussian(rng, size_t(n_tok * n), 8.0f);
      const float edges[] = {0.0f, -0.0f, 1e-8f, -3e-6f, 6e-5f, 65504.0f, 65519.0f, 65520.0f, -1e6f, 0.1f};
      for (size_t i = 0; i < std::size(edges) && i < x.size(); ++i) x[i] = edges[i];
      std::vector<uint16_t> want(size_t(n_rows * n), 0xBEEF);  // guard value outside the stored rows
      for (size_t i = 0; i < x.size(); ++i) want[size_t(row0 * n) + i] = quant::float_to_fp16(x[i]);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dc, to_device(std::vector<uint16_t>(size_t(n_rows * n), 0xBEEF)));
      ASSERT_OK(cuda::store_kv({.x = dx.as<float>(), .cache = dc.as<uint16_t>(), .n_tok = n_tok, .n = n, .row0 = row0},
                               stream));
      stream.synchronize();
      ASSERT_EQ(from_device<uint16_t>(dc, want.size()), want) << "n " << n << " n_tok " << n_tok;
    }
  }
}

// Random inputs of one qkv_prepare call: RoPE positions, q [n_tok, n_head, head_dim], k and v [n_tok, n_head_kv,
// head_dim], the q and k norm weights.
struct QkvInputs {
  std::vector<int32_t> pos;
  std::vector<float> q, k, v, qw, kw;
};
QkvInputs qkv_inputs(Rng& rng, int64_t n_tok, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
  QkvInputs in;
  in.pos.resize(static_cast<size_t>(n_tok));
  for (int32_t& p : in.pos) p = int32_t(rng.bits() % 40000);
  in.q = gaussian(rng, size_t(n_tok * n_head * head_dim), 2.0f);
  in.k = gaussian(rng, size_t(n_tok * n_head_kv * head_dim), 2.0f);
  in.v = gaussian(rng, size_t(n_tok * n_head_kv * head_dim), 3.0f);
  in.qw = gaussian(rng, size_t(head_dim));
  in.kw = gaussian(rng, size_t(head_dim));
  return in;
}

// qkv_prepare (one launch) against the four ops it replaces: qk_norm_rope of q and of k, store_kv of k and v;
// q, the K cache and the V cache bit-identical (the cache rows outside the tokens' untouched), with row0 from the
// host and from device memory.
TEST(CudaOps, QkvPrepareBitIdenticalToNormRopeAndStores) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 63);
  struct Heads {
    int64_t n_head, n_head_kv;
  };
  for (const int64_t n_tok : {int64_t(1), int64_t(5), int64_t(70)}) {
    for (const Heads heads : {Heads{32, 4}, Heads{8, 8}, Heads{6, 2}}) {
      for (const int64_t head_dim : {int64_t(64), int64_t(128), int64_t(256)}) {
        for (const bool device_row : {false, true}) {
          const int64_t HK = heads.n_head_kv, row0 = 3, n_rows = row0 + n_tok + 2, kv = HK * head_dim;
          const QkvInputs in = qkv_inputs(rng, n_tok, heads.n_head, HK, head_dim);
          const std::vector<float>& q = in.q;
          const std::vector<float>& k = in.k;
          const std::vector<float>& v = in.v;
          const std::vector<uint16_t> guard(size_t(n_rows * kv), 0xBEEF);
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer q1, to_device(q));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer q2, to_device(q));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer k1, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer k2, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dqw, to_device(in.qw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dkw, to_device(in.kw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dp, to_device(in.pos));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer drow, to_device(std::vector<int32_t>{int32_t(row0)}));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer kc1, to_device(guard));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer vc1, to_device(guard));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer kc2, to_device(guard));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer vc2, to_device(guard));
          ASSERT_OK(cuda::qkv_prepare({.q = q1.as<float>(), .q_weight = dqw.as<float>(), .k = k1.as<float>(),
                                       .k_weight = dkw.as<float>(), .v = dv.as<float>(), .k_cache = kc1.as<uint16_t>(),
                                       .v_cache = vc1.as<uint16_t>(), .positions = dp.as<int32_t>(), .n_tok = n_tok,
                                       .n_head = heads.n_head, .n_head_kv = HK, .head_dim = head_dim, .eps = 1e-6f,
                                       .theta = 1e6f, .row0 = device_row ? 999 : row0,
                                       .row0_device = device_row ? drow.as<int32_t>() : nullptr},
                                      stream));
          ASSERT_OK(cuda::qk_norm_rope({.x = q2.as<float>(), .weight = dqw.as<float>(), .positions = dp.as<int32_t>(),
                                        .n_tok = n_tok, .n_head = heads.n_head, .head_dim = head_dim, .eps = 1e-6f,
                                        .theta = 1e6f},
                                       stream));
          ASSERT_OK(cuda::qk_norm_rope({.x = k2.as<float>(), .weight = dkw.as<float>(), .positions = dp.as<int32_t>(),
                                        .n_tok = n_tok, .n_head = HK, .head_dim = head_dim, .eps = 1e-6f,
                                        .theta = 1e6f},
                                       stream));
          ASSERT_OK(cuda::store_kv({.x = k2.as<float>(), .cache = kc2.as<uint16_t>(), .n_tok = n_tok, .n = kv,
                                    .row0 = row0}, stream));
          ASSERT_OK(cuda::store_kv({.x = dv.as<float>(), .cache = vc2.as<uint16_t>(), .n_tok = n_tok, .n = kv,
                                    .row0 = row0}, stream));
          stream.synchronize();
          const std::string what = "n_tok " + std::to_string(n_tok) + " heads " + std::to_string(heads.n_head) + "/" +
                                   std::to_string(HK) + " head_dim " + std::to_string(head_dim) +
                                   (device_row ? " row0 on the device" : "");
          const std::vector<float> qa = from_device<float>(q1, q.size()), qb = from_device<float>(q2, q.size());
          ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size() * sizeof(float))) << what;
          ASSERT_EQ(from_device<uint16_t>(kc1, guard.size()), from_device<uint16_t>(kc2, guard.size())) << what;
          ASSERT_EQ(from_device<uint16_t>(vc1, guard.size()), from_device<uint16_t>(vc2, guard.size())) << what;
        }
      }
    }
  }
}

// qkv_prepare into Q8_0 caches: the K rows are the bytes the reference quantizer (quant traits' from_float, the scalar
// oracle) makes of qk_norm_rope's k, the V rows its bytes of v; rows outside the tokens untouched. Row0 from the host
// and from device memory.
TEST(CudaOps, QkvPrepareQ8MatchesReferenceQuantizer) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 64);
  const quant::TypeTraits& q8 = quant::traits(quant::Type::Q8_0);
  struct Heads {
    int64_t n_head, n_head_kv;
  };
  for (const int64_t n_tok : {int64_t(1), int64_t(5)}) {
    for (const Heads heads : {Heads{32, 4}, Heads{6, 2}}) {
      for (const int64_t head_dim : {int64_t(64), int64_t(128), int64_t(256)}) {
        for (const bool device_row : {false, true}) {
          const int64_t HK = heads.n_head_kv, row0 = 3, n_rows = row0 + n_tok + 2, kv = HK * head_dim;
          const size_t row_bytes = quant::row_size(quant::Type::Q8_0, kv);
          const QkvInputs in = qkv_inputs(rng, n_tok, heads.n_head, HK, head_dim);
          const std::vector<float>& q = in.q;
          const std::vector<float>& k = in.k;
          const std::vector<float>& v = in.v;
          const std::vector<uint8_t> guard(size_t(n_rows) * row_bytes, 0xAB);
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(q));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk_normed, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dqw, to_device(in.qw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dkw, to_device(in.kw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dp, to_device(in.pos));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer drow, to_device(std::vector<int32_t>{int32_t(row0)}));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer kc, to_device(guard));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer vc, to_device(guard));
          ASSERT_OK(cuda::qkv_prepare({.q = dq.as<float>(), .q_weight = dqw.as<float>(), .k = dk.as<float>(),
                                       .k_weight = dkw.as<float>(), .v = dv.as<float>(), .k_cache = kc.data(),
                                       .v_cache = vc.data(), .positions = dp.as<int32_t>(), .n_tok = n_tok,
                                       .n_head = heads.n_head, .n_head_kv = HK, .head_dim = head_dim, .eps = 1e-6f,
                                       .theta = 1e6f, .row0 = device_row ? 999 : row0,
                                       .row0_device = device_row ? drow.as<int32_t>() : nullptr,
                                       .kv_type = quant::Type::Q8_0},
                                      stream));
          ASSERT_OK(cuda::qk_norm_rope({.x = dk_normed.as<float>(), .weight = dkw.as<float>(),
                                        .positions = dp.as<int32_t>(), .n_tok = n_tok, .n_head = HK,
                                        .head_dim = head_dim, .eps = 1e-6f, .theta = 1e6f},
                                       stream));
          stream.synchronize();
          const std::vector<float> k_normed = from_device<float>(dk_normed, k.size());
          std::vector<uint8_t> want_k = guard, want_v = guard;
          q8.from_float(k_normed.data(), want_k.data() + size_t(row0) * row_bytes, n_tok * kv);
          q8.from_float(v.data(), want_v.data() + size_t(row0) * row_bytes, n_tok * kv);
          const std::string what = "n_tok " + std::to_string(n_tok) + " heads " + std::to_string(heads.n_head) + "/" +
                                   std::to_string(HK) + " head_dim " + std::to_string(head_dim) +
                                   (device_row ? " row0 on the device" : "");
          ASSERT_EQ(from_device<uint8_t>(kc, guard.size()), want_k) << what;
          ASSERT_EQ(from_device<uint8_t>(vc, guard.size()), want_v) << what;
        }
      }
    }
  }
}

// kv_to_f16: every element f16(d * q) as the host computes it (float product, quant::float_to_fp16), rows past the
// count untouched; the count from the host and from device memory (last_row_device).
TEST(CudaOps, KvToF16EqualsHostDequantization) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 65);
  const quant::TypeTraits& q8 = quant::traits(quant::Type::Q8_0);
  for (const int64_t n : {int64_t(64), int64_t(512), int64_t(1056)}) {
    const int64_t n_rows = 300;
    std::vector<float> x = gaussian(rng, size_t(n_rows * n), 3.0f);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= 1e-6f;  // row 0: scales in f16's subnormal range
    std::vector<uint8_t> cache(quant::row_size(quant::Type::Q8_0, n) * size_t(n_rows));
    q8.from_float(x.data(), cache.data(), n_rows * n);
    std::vector<float> deq(x.size());
    q8.to_float(cache.data(), deq.data(), n_rows * n);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dc, to_device(cache));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dlast, to_device(std::vector<int32_t>{0}));
    for (const int64_t rows : {int64_t(1), int64_t(77), n_rows}) {
      for (const bool device_rows : {false, true}) {
        const std::vector<uint16_t> guard(x.size(), 0xBEEF);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, to_device(guard));
        const int32_t last = int32_t(rows - 1);
        ASSERT_OK(dlast.upload(&last, sizeof last));
        ASSERT_OK(cuda::kv_to_f16({.cache = dc.data(), .out = dout.as<uint16_t>(), .n = n,
                                   .rows = device_rows ? n_rows : rows,
                                   .last_row_device = device_rows ? dlast.as<int32_t>() : nullptr},
                                  stream));
        stream.synchronize();
        std::vector<uint16_t> want = guard;
        for (size_t i = 0; i < size_t(rows * n); ++i) want[i] = quant::float_to_fp16(deq[i]);
        ASSERT_EQ(from_device<uint16_t>(dout, want.size()), want) << "n " << n << " rows " << rows
                                                                  << (device_rows ? " (count on the device)" : "");
      }
    }
  }
}

// The row read from device memory (row0_device, how a decode graph stores KV), in a graph captured once and
// replayed for two rows: each replay writes its row, `row0` is ignored.
TEST(CudaOps, StoreKvRowFromDeviceInAGraph) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 61);
  const int64_t n = 512, n_rows = 40;
  const std::vector<float> x = gaussian(rng, size_t(n), 4.0f);
  std::vector<uint16_t> want(size_t(n_rows * n), 0xBEEF);
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dc, to_device(want));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer drow, to_device(std::vector<int32_t>{0}));
  cuda::Graph::begin_capture(stream);
  const Status st = cuda::store_kv({.x = dx.as<float>(),
                                    .cache = dc.as<uint16_t>(),
                                    .n_tok = 1,
                                    .n = n,
                                    .row0 = 999,
                                    .row0_device = drow.as<int32_t>()},
                                   stream);
  ASSERT_OK_AND_ASSIGN(cuda::Graph graph, cuda::Graph::end_capture(stream));
  ASSERT_OK(st);
  for (const int32_t row : {7, 31}) {
    ASSERT_OK(drow.upload(&row, sizeof row));
    graph.launch(stream);
    stream.synchronize();
    for (int64_t i = 0; i < n; ++i) want[size_t(row * n + i)] = quant::float_to_fp16(x[size_t(i)]);
    ASSERT_EQ(from_device<uint16_t>(dc, want.size()), want) << "row " << row;
  }
}

// ---- attention -----------------------------------------------------------------------------------------------

struct AttnShape {
  int64_t n_head, n_head_kv, head_dim;
};

struct AttnCase {
  AttnShape shape;
  int64_t n_tok, pos0, window;
};

std::string describe(const AttnCase& c) {
  return "n_head " + std::to_string(c.shape.n_head) + "/" + std::to_string(c.shape.n_head_kv) + " head_dim " +
         std::to_string(c.shape.head_dim) + " n_tok " + std::to_string(c.n_tok) + " pos0 " + std::to_string(c.pos0) +
         " window " + std::to_string(c.window);
}

// The decode contexts (rows attended = pos0 + 1) and prefill batches of the tests.
std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases;
  const AttnShape shapes[] = {{8, 2, 128}, {4, 4, 64}, {8, 2, 64}, {4, 4, 128}, {32, 4, 128}, {16, 1, 96}, {4, 2, 256}};
  for (const AttnShape& s : shapes) {
    for (const int64_t ctx : {int64_t(1), int64_t(17), int64_t(300), int64_t(5000)})
      cases.push_back({s, 1, ctx - 1, 0});
    cases.push_back({s, 1, 299, 100});    // window edge inside a chunk
    cases.push_back({s, 1, 4999, 4096});  // window of many chunks, not chunk-aligned
    cases.push_back({s, 7, 0, 0});        // prefill from an empty cache
    cases.push_back({s, 33, 17, 0});
    cases.push_back({s, 7, 300, 50});  // prefill with a sliding window
  }
  cases.push_back({{8, 2, 128}, 1, 19999, 0});  // > 64 chunks: several chunks per split
  cases.push_back({{4, 4, 64}, 1, 19999, 0});
  return cases;
}

struct AttnData {
  std::vector<float> q;        // [n_tok, n_head, head_dim]
  std::vector<uint16_t> k, v;  // [n_rows, n_head_kv, head_dim] F16 bits
};

int64_t n_rows_of(const AttnCase& c) { return c.pos0 + c.n_tok + 5; }  // 5 NaN rows past the last position

// kRandom: Gaussian K and V. kUniformScores: K = 0 (every score 0) and V integers in [-8, 8].
enum class AttnFill { kRandom, kUniformScores };

// Gaussian q; K/V rows 0 .. pos0 + n_tok - 1 filled as `fill` says, the rows past them F16 NaN.
AttnData attention_data(Rng& rng, const AttnCase& c, AttnFill fill) {
  const uint16_t nan16 = 0x7e00;
  const int64_t HK = c.shape.n_head_kv, D = c.shape.head_dim;
  const int64_t rows = n_rows_of(c), valid = c.pos0 + c.n_tok;
  AttnData d;
  d.q = gaussian(rng, size_t(c.n_tok * c.shape.n_head * D));
  d.k.assign(size_t(rows * HK * D), nan16);
  d.v.assign(size_t(rows * HK * D), nan16);
  for (size_t i = 0; i < size_t(valid * HK * D); ++i) {
    if (fill == AttnFill::kRandom) {
      d.k[i] = quant::float_to_fp16(rng.gaussian());
      d.v[i] = quant::float_to_fp16(rng.gaussian());
    } else {
      d.k[i] = quant::float_to_fp16(0.0f);
      d.v[i] = quant::float_to_fp16(float(int(rng.bits() % 17) - 8));
    }
  }
  return d;
}

// The op under test: attention (split-K decode, per-token prefill), attention_prefill_mma or attention_decode_mma
// (tensor cores).
enum class AttnOp { kAttention, kPrefillMma, kDecodeMma };

const char* op_name(AttnOp op) {
  return op == AttnOp::kAttention    ? "attention"
         : op == AttnOp::kPrefillMma ? "attention_prefill_mma"
                                     : "attention_decode_mma";
}

Status run_op(AttnOp op, const cuda::AttentionArgs& args, cuda::AttentionWorkspace& ws, cuda::Stream& stream) {
  switch (op) {
    case AttnOp::kAttention:
      return cuda::attention(args, ws, stream);
    case AttnOp::kPrefillMma:
      return cuda::attention_prefill_mma(args, stream);
    case AttnOp::kDecodeMma:
      break;
  }
  return cuda::attention_decode_mma(args, ws, stream);
}

// Runs the GPU op on the data; rows past pos0 + n_tok - 1 are F16 NaN. attention_prefill_mma does not use `ws`.
std::vector<float> run_attention(const AttnCase& c, const AttnData& d, cuda::AttentionWorkspace& ws,
                                 cuda::Stream& stream, AttnOp op = AttnOp::kAttention) {
  const size_t out_n = size_t(c.n_tok * c.shape.n_head * c.shape.head_dim);
  auto dq = to_device(d.q);
  auto dk = to_device(d.k);
  auto dv = to_device(d.v);
  auto dout = cuda::DeviceBuffer::allocate(out_n * sizeof(float));
  EXPECT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok());
  if (!dq.ok() || !dk.ok() || !dv.ok() || !dout.ok()) return {};
  const cuda::AttentionArgs args{.q = dq->as<float>(),
                                 .k_cache = dk->as<uint16_t>(),
                                 .v_cache = dv->as<uint16_t>(),
                                 .out = dout->as<float>(),
                                 .n_tok = c.n_tok,
                                 .pos0 = c.pos0,
                                 .n_head = c.shape.n_head,
                                 .n_head_kv = c.shape.n_head_kv,
                                 .head_dim = c.shape.head_dim,
                                 .window = c.window,
                                 .scale = float(1.0 / std::sqrt(double(c.shape.head_dim)))};
  const Status s = run_op(op, args, ws, stream);
  EXPECT_TRUE(s.ok()) << op_name(op) << ": " << s.message();
  stream.synchronize();
  return from_device<float>(*dout, out_n);
}

int64_t first_row(const AttnCase& c, int64_t pos) {
  return c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
}

// Tolerance of one query head against the exact (double) result, from the kernel's float arithmetic:
//   scores: a float dot of head_dim terms and a multiply by scale: |ds_j| <= A_j = gamma_(D+1) scale sum_d |q_d k_jd|;
//   softmax weights exp(s_j - m): relative error <= eps = 2 A + 4u S + (C + 2)(2^-22 + 2u), with A = max A_j,
//     S = max |s_j| (the rounding of s_j - m and m_c - M), and per exp factor 2 ulp of expf plus a rounding, for
//     the C <= chunks per split rescales and the split's combine factor;
//   a weighted mean moves by <= 2 eps max_j |v_jd| under relative weight errors eps (numerator and denominator);
//   the sums: at most N = rows per split + splits + 16 float additions deep (a thread's rows, the row-subset fold,
//     the warp tree for the denominator, the combine), gamma_N relative to sum p |v| <= max|v| sum p, in the
//     numerator and the denominator; plus the final division's rounding.
double attention_bound(double eps, int64_t depth, double vmax) {
  const double gamma = double(depth) * kU / (1.0 - double(depth) * kU);
  return (2.0 * eps + 2.0 * gamma + kU) * vmax * 1.01 + 1e-30;
}

TEST(CudaOps, AttentionMatchesReference) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(32, 256));
  Rng rng(kSeed + 7);
  for (const AttnCase& c : attention_cases()) {
    const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> got = run_attention(c, d, ws, stream);
    ASSERT_EQ(got.size(), size_t(c.n_tok * H * D)) << describe(c);
    const double scale = double(float(1.0 / std::sqrt(double(D))));
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok && bad < 5; ++t) {
      const int64_t pos = c.pos0 + t, lo = first_row(c, pos), n_att = pos - lo + 1;
      // Chunks per split: attention.cuh's plan_splits restated (decode: about 8 CTAs per SM, at most
      // kMaxAttentionSplits splits, at most one per chunk; prefill: one split of all chunks).
      const int64_t chunks = (n_att + 127) / 128;
      const int64_t want = std::max<int64_t>(
          1, std::min({(8 * int64_t(ws.sm_count()) + HK - 1) / HK, cuda::kMaxAttentionSplits, chunks}));
      const int64_t per_split = c.n_tok == 1 ? (chunks + want - 1) / want : chunks;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / group;
        const float* q = d.q.data() + (t * H + h) * D;
        std::vector<double> s(static_cast<size_t>(n_att));
        double a_max = 0, s_max_abs = 0, m = -INFINITY;
        for (int64_t j = lo; j <= pos; ++j) {
          const uint16_t* kr = d.k.data() + (j * HK + hk) * D;
          double dot = 0, mag = 0;
          for (int64_t e = 0; e < D; ++e) {
            const double kv = double(quant::fp16_to_float(kr[e]));
            dot += double(q[e]) * kv;
            mag += std::fabs(double(q[e]) * kv);
          }
          s[size_t(j - lo)] = double(float(scale)) * dot;
          a_max = std::max(a_max, double(D + 1) * kU * scale * mag);
          s_max_abs = std::max(s_max_abs, std::fabs(s[size_t(j - lo)]));
          m = std::max(m, s[size_t(j - lo)]);
        }
        const double eps =
            2.0 * a_max + 4.0 * kU * s_max_abs + double(per_split + 2) * (std::ldexp(1.0, -22) + 2.0 * kU);
        const int64_t depth = per_split * 128 + 64 + 16;
        for (double& x : s) x = std::exp(x - m);  // now the softmax numerators
        for (int64_t e = 0; e < D; ++e) {
          double num = 0, den = 0, vmax = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            const double p = s[size_t(j - lo)];
            const double vv = double(quant::fp16_to_float(d.v[size_t((j * HK + hk) * D + e)]));
            num += p * vv;
            den += p;
            vmax = std::max(vmax, std::fabs(vv));
          }
          const double want = num / den;
          const double g = double(got[size_t((t * H + h) * D + e)]);
          const double tol = attention_bound(eps, depth, vmax);
          if (!(std::fabs(g - want) <= tol) && bad++ < 5) {
            ADD_FAILURE() << describe(c) << " token " << t << " head " << h << " element " << e << ": got " << g
                          << ", want " << want << " (tolerance " << tol << ")";
          }
        }
      }
    }
  }
}

// Decode with the position read from device memory (pos0_device, the decode graph's form) in a graph captured
// once with a grid sized for a longer cache (max_rows): replayed at each decode case's position it gives the same
// bits as attention() with that pos0 from the host (the same split plan, made on the device), including the
// cases of one split (no combine) and of several chunks per split. For attention() and attention_decode_mma().
void expect_graph_position_matches_host(AttnOp op, const std::vector<AttnShape>& shapes, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(32, 256));
  Rng rng(seed);
  for (const AttnShape& shape : shapes) {
    for (const int64_t window : {int64_t(0), int64_t(4096)}) {
      const int64_t max_rows = 25000;
      // One cache of max_rows random rows; each case reads its first pos0 + 1.
      const AttnData d = attention_data(rng, {shape, 1, max_rows - 1, 0}, AttnFill::kRandom);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(d.q));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(d.k));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(d.v));
      const size_t out_n = size_t(shape.n_head * shape.head_dim);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>{0}));
      cuda::AttentionArgs args{.q = dq.as<float>(), .k_cache = dk.as<uint16_t>(), .v_cache = dv.as<uint16_t>(),
                               .out = dout.as<float>(), .n_tok = 1, .pos0 = 0, .n_head = shape.n_head,
                               .n_head_kv = shape.n_head_kv, .head_dim = shape.head_dim, .window = window,
                               .scale = float(1.0 / std::sqrt(double(shape.head_dim)))};
      cuda::AttentionArgs graphed = args;
      graphed.pos0 = 12345;  // ignored
      graphed.pos0_device = dpos.as<int32_t>();
      graphed.max_rows = max_rows;
      cuda::Graph::begin_capture(stream);
      const Status st = run_op(op, graphed, ws, stream);
      ASSERT_OK_AND_ASSIGN(cuda::Graph graph, cuda::Graph::end_capture(stream));
      ASSERT_OK(st);
      for (const int64_t pos : {int64_t(0), int64_t(16), int64_t(299), int64_t(4999), int64_t(19999),
                                max_rows - 1}) {
        args.pos0 = pos;
        ASSERT_OK(run_op(op, args, ws, stream));
        stream.synchronize();
        const std::vector<float> want = from_device<float>(dout, out_n);
        ASSERT_OK(dout.upload(std::vector<float>(out_n, NAN).data(), out_n * sizeof(float)));
        const int32_t p32 = int32_t(pos);
        ASSERT_OK(dpos.upload(&p32, sizeof p32));
        graph.launch(stream);
        stream.synchronize();
        const std::vector<float> got = from_device<float>(dout, out_n);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), out_n * sizeof(float)))
            << op_name(op) << " n_head " << shape.n_head << " head_dim " << shape.head_dim << " window " << window
            << " pos " << pos;
      }
    }
  }
}

TEST(CudaOps, AttentionDecodePositionFromDeviceInAGraph) {
  SKIP_WITHOUT_GPU();
  expect_graph_position_matches_host(AttnOp::kAttention, {{32, 4, 128}, {16, 1, 96}}, kSeed + 62);
}

// K = 0: all scores 0, every exp factor exactly 1, so out = mean of V over the attended rows; V holds integers
// in [-8, 8] (exact in F16, every partial sum exact in float), so the result is fl(sum / count) exactly.
// attention_prefill_mma too: Q * 0 = 0 in the tensor core, ex2.approx(0) is exactly 1 (PTX ISA 9.7.3.21), the f16
// P = 1 is exact, and the tensor core's sums of integers of magnitude < 2^24 are exact (it keeps at least float's
// 24 bits below the largest term), so its result is the same fl(sum / count) (one IEEE division at the end).
void expect_uniform_scores_exact(AttnOp op, const std::vector<AttnCase>& cases, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(seed);
  for (const AttnCase& c : cases) {
    const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
    const AttnData d = attention_data(rng, c, AttnFill::kUniformScores);
    const std::vector<float> got = run_attention(c, d, ws, stream, op);
    ASSERT_EQ(got.size(), size_t(c.n_tok * H * D)) << describe(c);
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const int64_t pos = c.pos0 + t, lo = first_row(c, pos);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t e = 0; e < D; ++e) {
          int64_t sum = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            sum += int64_t(quant::fp16_to_float(d.v[size_t((j * HK + h / group) * D + e)]));
          }
          const float want = float(double(sum) / double(pos - lo + 1));
          const float g = got[size_t((t * H + h) * D + e)];
          if (g != want && bad++ < 5) {
            ADD_FAILURE() << op_name(op) << " " << describe(c) << " token " << t << " head " << h << " element " << e
                          << ": got " << g << ", want " << want;
          }
        }
      }
    }
  }
}

TEST(CudaOps, AttentionUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  expect_uniform_scores_exact(AttnOp::kAttention, attention_cases(), kSeed + 8);
}

// ---- attention_prefill_mma -----------------------------------------------------------------------------------

// A full grid (groups 1, 4, 8 through n_head/n_head_kv 2/2, 8/2, 16/2; head_dim 64 and 128; 1, 7, 64 and 200
// tokens; empty and 1000-row histories; no window and a window of 100) and beyond it: group 3 (42 tokens per CTA,
// 2 idle rows), group 16 with one KV head, head_dim 256 (64 rows per CTA, 32-row K/V tiles), a window of one row and
// a window longer than the history (folded into none).
std::vector<AttnCase> prefill_mma_cases() {
  std::vector<AttnCase> cases;
  const AttnShape grid[] = {{2, 2, 64}, {8, 2, 64}, {16, 2, 64}, {2, 2, 128}, {8, 2, 128}, {16, 2, 128}};
  for (const AttnShape& s : grid) {
    for (const int64_t n_tok : {1, 7, 64, 200}) {
      for (const int64_t pos0 : {0, 1000}) {
        for (const int64_t window : {0, 100}) cases.push_back({s, n_tok, pos0, window});
      }
    }
  }
  const AttnShape more[] = {{6, 2, 128}, {16, 1, 128}, {8, 2, 256}};
  for (const AttnShape& s : more) {
    for (const int64_t n_tok : {7, 200}) {
      for (const int64_t pos0 : {0, 1000}) {
        for (const int64_t window : {0, 100}) cases.push_back({s, n_tok, pos0, window});
      }
    }
  }
  cases.push_back({{8, 2, 128}, 64, 1000, 1});
  cases.push_back({{8, 2, 128}, 64, 1000, 5000});
  return cases;
}

// The exact output (double, over the same F16 K/V and float q: what cpu::attention computes up to its own float
// rounding) and the bound on attention_prefill_mma's error, per element [n_tok, n_head, head_dim].
//
// Derivation (attention_prefill.cu lists the kernel's arithmetic). u = 2^-24; gamma(n, w) = n w / (1 - n w). For one
// query row: S_j = scale q.k_j the exact scores, M = max S_j, p_j = e^(S_j - M), l = sum p_j, w_j = p_j / l.
//   Scores. The kernel's q' = f16(f32(q c)), c = f32(scale log2 e), is within |q c| (2^-11 + 3u) + 2^-25 of q c
//   (f16's unit roundoff 2^-11, or half its subnormal spacing 2^-25 below 2^-14; u each for c and the product). The
//   products q' k are exact in the tensor core; its sums truncate (<= 1 ulp = 2u of the largest term per addition,
//   D/16 chained mma of 16 products + C: gamma(2D + 16, 2u) of sum |q' k| covers it). In natural units (times ln 2,
//   and ln 2 c = scale) each score is off by at most
//     E_j = scale sum_d |q_d k_jd| (2^-11 + 3u + gamma(2D + 16, 2u)) + ln 2 2^-25 sum_d |k_jd|.
//   Exponentials. p_j = ex2(s_j - m) with m the running max: the subtraction rounds (u |s - m| <= 2u max|S| after
//   ln 2), ex2.approx is within 2 ulp of the rounded result (<= 2.5 ulp <= 5u relative); every rescale factor alpha
//   (<= one per tile) multiplies the keys before it by another such error (5u, and the telescoping subtractions
//   m_old - m_new add <= 2u max|S| in all). The running maxima cancel otherwise, so each key's weight is off by a
//   factor e^(d_j) apart from a factor common to all keys, |d_j| <= delta = max_j E_j + 4u max|S| + 5u (tiles + 1).
//   Normalized weights then move by a factor in [e^(-2 delta), e^(2 delta)]:
//     |d out| <= (e^(2 delta) - 1) sum_j w_j |v_jd|.
//   P to f16. The numerator uses f16(p), the denominator the f32 p: on the running max's scale the rounding is <=
//   max(2^-11 p, 2^-25), and the later rescales (<= 1) only shrink it, so on the final scale <= max(2^-11 p_j,
//   2^-25) per key, with the kernel's p_j and l within e^(2 delta) of the exact ones:
//     |d out| <= e^(4 delta) sum_j max(2^-11 p_j, 2^-25) |v_jd| / l.
//   Sums. The P V chain (tensor-core truncation, 2u per addition, <= keys loaded + 4 per tile; the f32 rescales),
//   the f32 sum l (thread partials, then the quad) and the final division:
//     |d out| <= e^(2 delta) (2 gamma(N, 2u) + u) sum_j w_j |v_jd|, N = 2 (rows attended + 192) + 4 tiles.
//   A CTA spans <= 128 tokens and a tile is >= 32 keys: tiles <= (rows attended + 128) / 32 + 2.
// attention_decode_mma (same arithmetic, tiles of 16 keys per warp, then the 4 warps merged with ex2 weights and
// the splits combined with expf of the max difference after a conversion to natural units): tiles <= rows attended
// / 16 + 4 rescales (the merge and the combine among them), another 4u max|S| for the conversion and the
// combine's subtraction, and N grows by the merge and the combine's sums (<= kMaxAttentionSplits + 8).
// The bound is the sum of the three, times 1.01, plus 1e-30. It assumes the tensor core keeps at least float's 24
// bits below the largest term of its sums (measured on V100/T4/A100 by Fasi et al. 2021; a Hopper that kept fewer
// would fail here, not pass silently). Typical size: head_dim 128, Gaussian data: E ~ 4e-3, bound ~ 1e-2 sum w|v|.
struct AttnExpect {
  std::vector<double> want, tol;  // [n_tok, n_head, head_dim]
};

AttnExpect mma_expect(const AttnCase& c, const AttnData& d, AttnOp op = AttnOp::kPrefillMma) {
  const bool decode = op == AttnOp::kDecodeMma;
  const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
  const double scale = double(float(1.0 / std::sqrt(double(D))));  // as run_attention passes it
  const double f16_u = std::ldexp(1.0, -11), f16_sub = std::ldexp(1.0, -25), ln2 = std::log(2.0);
  auto gamma = [](double n, double w) { return n * w / (1.0 - n * w); };
  const double score_rel = f16_u + 3.0 * kU + gamma(double(2 * D + 16), 2.0 * kU);
  std::vector<double> kf(d.k.size()), vf(d.v.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    kf[i] = double(quant::fp16_to_float(d.k[i]));
    vf[i] = double(quant::fp16_to_float(d.v[i]));
  }
  AttnExpect x;
  x.want.resize(size_t(c.n_tok * H * D));
  x.tol.resize(x.want.size());
  for (int64_t t = 0; t < c.n_tok; ++t) {
    const int64_t pos = c.pos0 + t, lo = first_row(c, pos), n_att = pos - lo + 1;
    const double tiles = decode ? double(n_att / 16 + 4) : double((n_att + 128) / 32 + 2);
    const double depth =
        2.0 * double(n_att + 192) + 4.0 * tiles + (decode ? double(cuda::kMaxAttentionSplits + 8) : 0.0);
    const double acc = 2.0 * gamma(depth, 2.0 * kU) + kU;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      const float* q = d.q.data() + (t * H + h) * D;
      std::vector<double> p(static_cast<size_t>(n_att));
      double m = -INFINITY, s_abs = 0, e_max = 0;
      for (int64_t j = lo; j <= pos; ++j) {
        const double* kr = kf.data() + (j * HK + hk) * D;
        double dot = 0, mag = 0, ksum = 0;
        for (int64_t e = 0; e < D; ++e) {
          dot += double(q[e]) * kr[e];
          mag += std::fabs(double(q[e]) * kr[e]);
          ksum += std::fabs(kr[e]);
        }
        const double sj = scale * dot;
        p[size_t(j - lo)] = sj;
        m = std::max(m, sj);
        s_abs = std::max(s_abs, std::fabs(sj));
        e_max = std::max(e_max, scale * mag * score_rel + ln2 * f16_sub * ksum);
      }
      const double delta = e_max + (decode ? 8.0 : 4.0) * kU * s_abs + 5.0 * kU * (tiles + 1.0);
      double l = 0;
      for (double& pj : p) {
        pj = std::exp(pj - m);
        l += pj;
      }
      for (int64_t e = 0; e < D; ++e) {
        double num = 0, wv = 0, rounding = 0;
        for (int64_t j = lo; j <= pos; ++j) {
          const double pj = p[size_t(j - lo)], vv = vf[size_t((j * HK + hk) * D + e)];
          num += pj * vv;
          wv += pj * std::fabs(vv);
          rounding += std::max(f16_u * pj, f16_sub) * std::fabs(vv);
        }
        const size_t i = size_t((t * H + h) * D + e);
        x.want[i] = num / l;
        x.tol[i] = 1.01 * ((std::expm1(2.0 * delta) + std::exp(2.0 * delta) * acc) * wv / l +
                           std::exp(4.0 * delta) * rounding / l) +
                   1e-30;
      }
    }
  }
  return x;
}

// A tensor-core op (attention_prefill_mma or attention_decode_mma) on random data against the exact result, within
// mma_expect's bound, element by element.
void expect_mma_within_bound(AttnOp op, const std::vector<AttnCase>& cases, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(seed);
  for (const AttnCase& c : cases) {
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> got = run_attention(c, d, ws, stream, op);
    const AttnExpect x = mma_expect(c, d, op);
    ASSERT_EQ(got.size(), x.want.size()) << op_name(op) << " " << describe(c);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(double(got[i]) - x.want[i]) <= x.tol[i]) && bad++ < 5) {
        const int64_t D = c.shape.head_dim, H = c.shape.n_head;
        ADD_FAILURE() << op_name(op) << " " << describe(c) << " token " << int64_t(i) / (H * D) << " head "
                      << int64_t(i) / D % H << " element " << int64_t(i) % D << ": got " << got[i] << ", want "
                      << x.want[i] << " (tolerance " << x.tol[i] << ")";
      }
    }
  }
}

TEST(CudaOps, AttentionPrefillMmaMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_mma_within_bound(AttnOp::kPrefillMma, prefill_mma_cases(), kSeed + 9);
}

// Many tokens in one call (CTAs of up to 128 tokens, tiles starting at the window of the CTA's first token) against
// the same tokens one call each (n_tok = 1: tiles start at the token's own window): different tile boundaries,
// rescale sequences and summation orders, so not bit-identical; both are within the bound of the exact result, so
// they are within twice the bound of each other. Cases: a group-8 tile over a 1000-row history, two CTAs of group 1,
// a window inside a 200-token batch, head_dim 256.
TEST(CudaOps, AttentionPrefillMmaTileMatchesSingleTokens) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::AttentionWorkspace ws;
  Rng rng(kSeed + 10);
  const AttnCase cases[] = {
      {{16, 2, 128}, 64, 1000, 0}, {{2, 2, 128}, 200, 0, 0}, {{8, 2, 64}, 200, 1000, 100}, {{8, 2, 256}, 70, 0, 0}};
  for (const AttnCase& c : cases) {
    const int64_t H = c.shape.n_head, D = c.shape.head_dim;
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> batched = run_attention(c, d, ws, stream, AttnOp::kPrefillMma);
    ASSERT_EQ(batched.size(), size_t(c.n_tok * H * D)) << describe(c);
    const AttnExpect x = mma_expect(c, d);
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const AttnCase one{c.shape, 1, c.pos0 + t, c.window};
      AttnData d1;
      d1.q.assign(d.q.begin() + t * H * D, d.q.begin() + (t + 1) * H * D);
      d1.k = d.k;  // rows past pos0 + t are attended by neither call's token t
      d1.v = d.v;
      const std::vector<float> single = run_attention(one, d1, ws, stream, AttnOp::kPrefillMma);
      ASSERT_EQ(single.size(), size_t(H * D)) << describe(one);
      for (int64_t i = 0; i < H * D; ++i) {
        const size_t k = size_t(t * H * D + i);
        if (!(std::fabs(double(batched[k]) - double(single[size_t(i)])) <= 2.0 * x.tol[k]) && bad++ < 5) {
          ADD_FAILURE() << describe(c) << " token " << t << " head " << i / D << " element " << i % D << ": batched "
                        << batched[k] << ", alone " << single[size_t(i)] << " (tolerance " << 2.0 * x.tol[k] << ")";
        }
      }
    }
  }
}

// The exact K = 0 check above, on prefill_mma_cases() and on attention()'s cases with a supported head_dim (decode
// contexts of up to 20000 rows: many tiles, windows of 4096 that start inside a tile).
TEST(CudaOps, AttentionPrefillMmaUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  std::vector<AttnCase> cases = prefill_mma_cases();
  for (const AttnCase& c : attention_cases()) {
    if (c.shape.head_dim == 64 || c.shape.head_dim == 128 || c.shape.head_dim == 256) cases.push_back(c);
  }
  expect_uniform_scores_exact(AttnOp::kPrefillMma, cases, kSeed + 11);
}

// ---- attention_decode_mma -------------------------------------------------------------------------------------

// attention()'s cases with a kernel (head_dim 64, 128, 256; groups 1 to 16) plus decode at the shapes the model runs:
// the 30B-A3B geometry (32 heads over 4 KV heads of 128) and a group of 16 (the 235B geometry's 64 over 4), at
// contexts of 1, 15, 16, 17 rows (a warp step of 16 and its edges), 128 and 129 (two splits of one 64-row step; a last
// split of one row, its other warps idle), 3000 (splits of one or two steps, some warps idle) and 40000 (splits of many
// steps, more than the ring holds), with and without a window. Every multi-split case takes and resets the
// workspace's tickets: a ticket left behind would make the next case's combine run early or never.
std::vector<AttnCase> decode_mma_cases() {
  std::vector<AttnCase> cases;
  for (const AttnCase& c : attention_cases()) {
    if (cuda::has_attention_decode_mma(c.shape.head_dim, c.shape.n_head / c.shape.n_head_kv)) cases.push_back(c);
  }
  const AttnShape shapes[] = {{32, 4, 128}, {16, 1, 128}, {64, 4, 128}, {32, 4, 64}};
  for (const AttnShape& s : shapes) {
    for (const int64_t ctx : {1, 15, 16, 17, 128, 129, 3000, 40000}) {
      cases.push_back({s, 1, ctx - 1, 0});
      if (ctx > 1000) cases.push_back({s, 1, ctx - 1, 1000});
    }
  }
  return cases;
}

TEST(CudaOps, AttentionDecodeMmaMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_mma_within_bound(AttnOp::kDecodeMma, decode_mma_cases(), kSeed + 12);
}

TEST(CudaOps, AttentionDecodeMmaUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  expect_uniform_scores_exact(AttnOp::kDecodeMma, decode_mma_cases(), kSeed + 13);
}

TEST(CudaOps, AttentionDecodeMmaPositionFromDeviceInAGraph) {
  SKIP_WITHOUT_GPU();
  expect_graph_position_matches_host(AttnOp::kDecodeMma, {{32, 4, 128}, {16, 1, 128}, {8, 2, 64}}, kSeed + 14);
}

// attention_decode_mma over a Q8_0 cache: within mma_expect's bound of the exact attention over the values the kernel
// is specified to compute with, each element f16(d * q) (kv_to_f16's, computed here on the host), for
// decode_mma_cases() (contexts of 1 to 40000 rows, windows, groups 1 to 16, head_dim 64/128/256; cache rows 16-byte
// aligned or not, so staging windows with and without skew); and, for decode, the position read from device memory (as
// a graph reads it) gives the host position's output bit for bit. Gaussian K/V quantized by the reference quantizer;
// the rows past the last position are blocks with a NaN scale (NaN when dequantized: a kernel that read them would
// show it). Not compared bit for bit with the F16 kernel: the Q8_0 kernel fits more CTAs per SM, so its split plan
// differs.
TEST(CudaOps, AttentionDecodeMmaQ8MatchesReference) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  const quant::TypeTraits& q8 = quant::traits(quant::Type::Q8_0);
  Rng rng(kSeed + 15);
  for (const AttnCase& c : decode_mma_cases()) {
    const int64_t HK = c.shape.n_head_kv, D = c.shape.head_dim, kv = HK * D;
    const int64_t rows = n_rows_of(c), valid = c.pos0 + c.n_tok;
    const size_t row_bytes = quant::row_size(quant::Type::Q8_0, kv);
    AttnData d;  // q and the F16 values f16(d * q) of the Q8_0 caches
    d.q = gaussian(rng, size_t(c.n_tok * c.shape.n_head * D));
    std::vector<uint8_t> k8(size_t(rows) * row_bytes), v8(k8.size());
    for (auto [c8, c16] : {std::pair{&k8, &d.k}, std::pair{&v8, &d.v}}) {
      const std::vector<float> x = gaussian(rng, size_t(valid * kv));
      q8.from_float(x.data(), c8->data(), valid * kv);
      for (size_t b = size_t(valid) * row_bytes; b < c8->size(); b += sizeof(quant::BlockQ8_0)) {
        const quant::BlockQ8_0 nan_block = {0x7e00, {}};
        std::memcpy(c8->data() + b, &nan_block, sizeof nan_block);
      }
      std::vector<float> deq(size_t(rows * kv));
      q8.to_float(c8->data(), deq.data(), rows * kv);
      c16->resize(deq.size());
      for (size_t i = 0; i < deq.size(); ++i) (*c16)[i] = quant::float_to_fp16(deq[i]);
    }
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(d.q));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(k8));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v8));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>{int32_t(c.pos0)}));
    const size_t out_n = size_t(c.n_tok * c.shape.n_head * D);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
    std::vector<float> got[2];  // position from the host, from the device
    for (const bool device_pos : {false, true}) {
      if (device_pos && c.n_tok != 1) continue;
      ASSERT_OK(dout.upload(std::vector<float>(out_n, NAN).data(), out_n * sizeof(float)));
      const cuda::AttentionArgs args{.q = dq.as<float>(),
                                     .k_cache = dk.data(),
                                     .v_cache = dv.data(),
                                     .out = dout.as<float>(),
                                     .n_tok = c.n_tok,
                                     .pos0 = device_pos ? 777 : c.pos0,
                                     .n_head = c.shape.n_head,
                                     .n_head_kv = HK,
                                     .head_dim = D,
                                     .window = c.window,
                                     .scale = float(1.0 / std::sqrt(double(D))),
                                     .pos0_device = device_pos ? dpos.as<int32_t>() : nullptr,
                                     .max_rows = device_pos ? rows : 0,
                                     .kv_type = quant::Type::Q8_0};
      ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
      stream.synchronize();
      got[device_pos] = from_device<float>(dout, out_n);
    }
    const AttnExpect x = mma_expect(c, d, AttnOp::kDecodeMma);
    int bad = 0;
    for (size_t i = 0; i < out_n; ++i) {
      if (!(std::fabs(double(got[0][i]) - x.want[i]) <= x.tol[i]) && bad++ < 5) {
        ADD_FAILURE() << describe(c) << " element " << i << ": got " << got[0][i] << ", want " << x.want[i]
                      << " (tolerance " << x.tol[i] << ")";
      }
    }
    if (c.n_tok == 1) {
      ASSERT_EQ(0, std::memcmp(got[0].data(), got[1].data(), out_n * sizeof(float)))
          << describe(c) << ": the position from the device differs";
    }
  }
}

// ---- argument checks (no device needed) ---------------------------------------------------------------------

// Bad shapes and null pointers are a Status naming the op, checked before anything touches the stream (a
// default Stream has no CUDA stream behind it).
TEST(CudaOps, RejectsBadArguments) {
  cuda::Stream stream;
  alignas(16) float f[8] = {};
  alignas(16) int32_t ids[8] = {};
  alignas(16) uint16_t h[8] = {};
  cuda::AttentionWorkspace ws;
  auto fails = [](const Status& s, const char* op) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(op), std::string::npos) << s.message();
  };
  fails(cuda::rms_norm({.x = f, .weight = f, .y = f, .n_rows = 0, .n_cols = 8}, stream), "rms_norm");
  fails(cuda::rms_norm({.x = nullptr, .weight = f, .y = f, .n_rows = 1, .n_cols = 8}, stream), "rms_norm");
  fails(cuda::add_rms_norm({.x = f, .residual = f + 1, .weight = f, .y = f, .n_rows = 1, .n_cols = 4}, stream),
        "add_rms_norm");  // y aliases x
  fails(cuda::add_rms_norm({.x = f, .residual = f + 1, .weight = f, .y = f + 2, .n_rows = 1, .n_cols = 4,
                            .residual_rows = reinterpret_cast<const int32_t*>(f)},
                           stream),
        "residual_rows");  // rows without weights
  fails(cuda::rope_neox({.x = f, .positions = ids, .n_tok = 1, .n_head = 1, .head_dim = 7}, stream), "rope_neox");
  fails(cuda::qk_norm_rope({.x = f, .weight = f, .positions = ids, .n_tok = 1, .n_head = 1, .head_dim = 96}, stream),
        "qk_norm_rope");
  fails(cuda::swiglu(f, f, 0, stream), "swiglu");
  fails(cuda::route_topk({.logits = f, .ids = ids, .weights = f, .n_tok = 1, .n_expert = 4, .k = 5}, stream),
        "route_topk");
  fails(cuda::route_topk({.logits = f, .ids = ids, .weights = f, .n_tok = 1, .n_expert = 2000, .k = 8}, stream),
        "route_topk");
  const void* table[3] = {};
  fails(cuda::route_topk({.logits = f, .ids = ids, .weights = f, .n_tok = 1, .n_expert = 1, .k = 1, .table = table},
                         stream),
        "route_topk");  // a table without items
  fails(cuda::store_kv({.x = f, .cache = h, .n_tok = 1, .n = 8, .row0 = -1}, stream), "store_kv");
  const cuda::QkvPrepareArgs qkv{.q = f, .q_weight = f, .k = f, .k_weight = f, .v = f, .k_cache = h, .v_cache = h,
                                 .positions = ids, .n_tok = 1, .n_head = 2, .n_head_kv = 1, .head_dim = 64};
  cuda::QkvPrepareArgs bad = qkv;
  bad.head_dim = 96;  // not a multiple of 64
  fails(cuda::qkv_prepare(bad, stream), "qkv_prepare");
  bad = qkv;
  bad.v = nullptr;
  fails(cuda::qkv_prepare(bad, stream), "qkv_prepare");
  bad = qkv;
  bad.row0 = -1;
  fails(cuda::qkv_prepare(bad, stream), "qkv_prepare");
  bad = qkv;
  bad.n_head_kv = 0;
  fails(cuda::qkv_prepare(bad, stream), "qkv_prepare");
  bad = qkv;
  bad.kv_type = quant::Type::F32;  // F16 or Q8_0 caches
  fails(cuda::qkv_prepare(bad, stream), "qkv_prepare");
  fails(cuda::kv_to_f16({.cache = h, .out = h, .n = 48, .rows = 1}, stream), "kv_to_f16");  // not a multiple of 32
  fails(cuda::kv_to_f16({.cache = nullptr, .out = h, .n = 64, .rows = 1}, stream), "kv_to_f16");
  const cuda::AttentionArgs good{.q = f,
                                 .k_cache = h,
                                 .v_cache = h,
                                 .out = f + 4,
                                 .n_tok = 1,
                                 .pos0 = 0,
                                 .n_head = 8,
                                 .n_head_kv = 2,
                                 .head_dim = 128,
                                 .scale = 1.0f};
  cuda::AttentionArgs a = good;
  a.n_head_kv = 3;  // does not divide n_head
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.n_head = 64;
  a.n_head_kv = 2;  // group 32 > kMaxAttentionGroup
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.head_dim = 100;  // not a multiple of 8
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.out = f;  // aliases q
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.window = -1;
  fails(cuda::attention(a, ws, stream), "attention");
  int32_t pos = 0;
  a = good;
  a.pos0_device = &pos;  // max_rows 0
  fails(cuda::attention(a, ws, stream), "attention");
  a.max_rows = 100;
  a.n_tok = 2;  // decode only
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.kv_type = quant::Type::Q8_0;  // attention_decode_mma reads Q8_0, the others F16 only
  fails(cuda::attention(a, ws, stream), "Q8_0");
  fails(cuda::attention_prefill_mma(a, stream), "Q8_0");
  a.kv_type = quant::Type::F32;
  fails(cuda::attention_decode_mma(a, ws, stream), "attention_decode_mma");

  // attention_prefill_mma: the same contract, head_dim 64, 128 or 256 only, v_cache 16-byte aligned.
  const char* mma = "attention_prefill_mma";
  for (const int64_t head_dim : {96, 100, 32, 512}) {  // multiples of 8 or 16 without a kernel, and off the grid
    a = good;
    a.head_dim = head_dim;
    fails(cuda::attention_prefill_mma(a, stream), mma);
  }
  a = good;
  a.n_head = 64;
  a.n_head_kv = 2;  // group 32 > kMaxAttentionGroup
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.n_head_kv = 3;  // does not divide n_head
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.q = nullptr;
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.v_cache = nullptr;
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.v_cache = h + 1;  // 2-byte aligned: both load V 16 bytes at a time
  fails(cuda::attention_prefill_mma(a, stream), mma);
  fails(cuda::attention(a, ws, stream), "attention");
  a = good;
  a.out = f;  // aliases q
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.n_tok = 0;
  fails(cuda::attention_prefill_mma(a, stream), mma);
  a = good;
  a.window = -1;
  fails(cuda::attention_prefill_mma(a, stream), mma);

  // attention_decode_mma: attention()'s checks, head_dim 64 or 128 (group <= 16) or 256 (group <= 8), q 16-byte
  // aligned.
  const char* dec = "attention_decode_mma";
  EXPECT_TRUE(cuda::has_attention_decode_mma(128, 16));
  EXPECT_TRUE(cuda::has_attention_decode_mma(256, 8));
  EXPECT_FALSE(cuda::has_attention_decode_mma(256, 16));
  EXPECT_FALSE(cuda::has_attention_decode_mma(96, 1));
  for (const int64_t head_dim : {96, 100, 32, 512}) {
    a = good;
    a.head_dim = head_dim;
    fails(cuda::attention_decode_mma(a, ws, stream), dec);
  }
  a = good;
  a.n_head = 32;
  a.n_head_kv = 2;
  a.head_dim = 256;  // group 16 at head_dim 256: no kernel
  fails(cuda::attention_decode_mma(a, ws, stream), dec);
  a = good;
  a.n_head_kv = 0;
  fails(cuda::attention_decode_mma(a, ws, stream), dec);
  a = good;
  a.q = f + 1;  // 4-byte aligned: Q is read 16 bytes at a time
  fails(cuda::attention_decode_mma(a, ws, stream), dec);
  a = good;
  a.v_cache = h + 1;
  fails(cuda::attention_decode_mma(a, ws, stream), dec);
  a = good;
  a.out = f;  // aliases q
  fails(cuda::attention_decode_mma(a, ws, stream), dec);
  a = good;
  a.pos0_device = &pos;  // max_rows 0
  fails(cuda::attention_decode_mma(a, ws, stream), dec);

  // Quantizing in the producing op: an activation format, n_cols a multiple of its block.
  const cuda::AddRmsNormArgs norm{.x = f, .residual = f + 4, .weight = f, .y = f + 2, .n_rows = 1, .n_cols = 256,
                                  .y_type = quant::Type::Q8_K, .y_quantized = h};
  cuda::AddRmsNormArgs bad_norm = norm;
  bad_norm.y_type = quant::Type::F16;
  fails(cuda::add_rms_norm(bad_norm, stream), "add_rms_norm");
  bad_norm = norm;
  bad_norm.n_cols = 96;  // not a multiple of 256
  fails(cuda::add_rms_norm(bad_norm, stream), "add_rms_norm");
  bad_norm = norm;
  bad_norm.n_cols = cuda::kMaxNormQuantizeCols + 256;
  fails(cuda::add_rms_norm(bad_norm, stream), "add_rms_norm");
  bad_norm = norm;
  bad_norm.y_quantized = h + 1;  // 2-byte aligned
  fails(cuda::add_rms_norm(bad_norm, stream), "add_rms_norm");
  EXPECT_FALSE(cuda::can_quantize_norm(quant::Type::Q4_K, 256));
  EXPECT_TRUE(cuda::can_quantize_norm(quant::Type::Q8_0, 96));
  const cuda::SwigluQuantizeArgs sq{.gate = f, .up = f, .n_rows = 1, .n_cols = 256, .out = h};
  cuda::SwigluQuantizeArgs bad_sq = sq;
  bad_sq.out_type = quant::Type::Q4_0;
  fails(cuda::swiglu_quantize(bad_sq, stream), "swiglu_quantize");
  bad_sq = sq;
  bad_sq.n_cols = 100;
  fails(cuda::swiglu_quantize(bad_sq, stream), "swiglu_quantize");
  bad_sq = sq;
  bad_sq.n_rows = 0;
  fails(cuda::swiglu_quantize(bad_sq, stream), "swiglu_quantize");
  bad_sq = sq;
  bad_sq.out = nullptr;
  fails(cuda::swiglu_quantize(bad_sq, stream), "swiglu_quantize");
}

}  // namespace
}  // namespace magnetar
