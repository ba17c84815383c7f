// The non-matmul ops of the forward pass on the GPU (rms_norm, add_rms_norm, add_rms_norm_matvec, rope_neox,
// qk_norm_rope, swiglu, route_topk, store_kv, qkv_prepare, kv_to_f16) against the scalar CPU formulas (STYLE.md
// rule 7). Needs a GPU: without one every test that launches a kernel reports SKIPPED, never passed; the argument
// checks (RejectsBadArguments) need no device and always run.
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
//                           order), each of which is held to its bound above; n_tok 1, 7 (a warp per head row) and
//                           33 (a CTA per token, its cos/sin shared by the heads).
//   swiglu                  |out - ref| <= 16u |ref| + 1e-37. expf is within 2 ulp on the GPU, std::exp(float)
//                           within 1 ulp: 3 ulp (6u) on exp, carried through 1 + e (e / (1 + e) <= 1), plus one
//                           rounding each of add, divide and multiply on both sides (6u).
//   route_topk              ids identical (comparisons only, same tie order); |w - ref| <= 1e-6: both compute
//                           in double and round to float, so they differ by at most one float ulp (<= 6e-8 for
//                           weights <= 1) per rounding step.
//   add_rms_norm_matvec     bit-identical with add_rms_norm then matvec where add_rms_norm runs on clusters; x_out,
//                           y and out also against the CPU references (the test states the product's bound).
//   store_kv                bit-identical with quant::float_to_fp16 (both round to nearest even); rows outside
//                           [row0, row0 + n_tok) untouched.
// The attention ops are checked in cuda_attention_test.cpp. Shapes: rows 1, 7, 33 (and long rows through the CTA
// path), head_dim 64, 96, 128, 256.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "quant/fp16.h"
#include "quant/fp8.h"
#include "quant/quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace magnetar {
namespace ops_test {

using cuda_test::from_device;
using cuda_test::gaussian;
using cuda_test::kU;
using cuda_test::Rng;
using cuda_test::to_device;

constexpr uint64_t kSeed = 20261130;

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
// bit the y of moe_combine followed by the plain add_rms_norm on the GPU. k = 1, 8 and 64 (the bound); cols 37 (a warp
// per row), 2048 and 4099 (a CTA per row: the pairs staged in shared memory) and 8200 (8 kept elements per thread).
TEST(CudaOps, AddRmsNormCombinesExpertRows) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 3);
  for (const int64_t k : {int64_t(1), int64_t(8), int64_t(64)}) {
    for (const int64_t rows : {int64_t(1), int64_t(3)}) {
      for (const int64_t cols : {int64_t(37), int64_t(2048), int64_t(4099), int64_t(8200)}) {
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
        const std::string where =
            "k " + std::to_string(k) + " rows " + std::to_string(rows) + " cols " + std::to_string(cols);
        const std::vector<float> got_x = from_device<float>(dx, x.size());
        ASSERT_EQ(0, std::memcmp(got_x.data(), want_x.data(), x.size() * sizeof(float))) << where << ": x";
        const std::vector<float> got_y = from_device<float>(dy, x.size()), want_y = from_device<float>(dy2, x.size());
        EXPECT_EQ(0, std::memcmp(got_y.data(), want_y.data(), x.size() * sizeof(float))) << where << ": y";
      }
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
// CTA part-filled) and of one CTA, up to kMaxNormQuantizeCols (Q8_K: quantized from registers up to 8,192 columns,
// 1,280 and 7,168 with a last round of 1,024 part-filled).
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
      std::vector<float> w = gaussian(rng, size_t(cols));
      std::fill(x.begin(), x.begin() + 256, 0.0f);  // x + r = 0 there: an all-zero first block
      std::fill(r.begin(), r.begin() + 256, 0.0f);
      if (cols >= 512) {  // the second block's largest magnitude twice, + then -: the first one sets the scale
        x[300] = 6.0f;
        x[400] = -6.0f;
        r[300] = r[400] = 0.0f;
        w[300] = w[400] = 5.0f;
      }
      expect_same(add_norm_quantized(x, r, w, rows, cols, t, true, stream),
                  add_norm_quantized(x, r, w, rows, cols, t, false, stream), shape_name(t, rows, cols));
    }
  }
}

// add_rms_norm_matvec (the norm inside the router's product) against add_rms_norm then matvec on the GPU: bit for bit
// where add_rms_norm runs on clusters (norm_in_cluster: the fused kernel restates that kernel's order of the sum of
// squares and matvec_float's order of the product), and against the CPU references everywhere: x_out exactly
// x + residual, y within add_rms_norm's bound, out within (n + 8) u sum |w y| + 2^-21 sum |w y| of the double dot
// product of the weights with the reference y (float accumulation of n terms, plus y's own error). Weights F32, F16 and
// BF16; 1,024-8,192 columns (1, 2, 3, 4, 7 and 8 steps of 1,024); 1, 5 and 128 rows; y unquantized and as Q8_K.
TEST(CudaOps, AddRmsNormMatvecEqualsNormThenMatvec) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::MatvecWorkspace ws, cuda::MatvecWorkspace::create(8192, 1));
  Rng rng(kSeed + 45);
  struct Case {
    quant::Type w_type;
    int64_t cols, rows;
    quant::Type y_type;  // F32: y not quantized
  };
  std::vector<Case> cases;
  for (const quant::Type y_type : {quant::Type::F32, quant::Type::Q8_K}) {
    cases.push_back({quant::Type::F32, 2048, 128, y_type});
  }
  for (const quant::Type w_type : {quant::Type::F32, quant::Type::F16, quant::Type::BF16}) {
    for (const int64_t cols : {1024, 3072, 4096, 7168, 8192}) cases.push_back({w_type, cols, 5, quant::Type::Q8_K});
  }
  cases.push_back({quant::Type::F32, 2048, 1, quant::Type::Q8_K});  // one CTA quantizes every block
  for (const Case& c : cases) {
    const std::string what = shape_name(c.w_type, c.rows, c.cols) + " y " + std::string(quant::type_name(c.y_type));
    ASSERT_TRUE(cuda::add_rms_norm_matvec_fits(c.w_type, c.cols)) << what;
    const int64_t n = c.cols;
    const std::vector<float> x = gaussian(rng, size_t(n)), r = gaussian(rng, size_t(n), 0.5f);
    const std::vector<float> nw = gaussian(rng, size_t(n));
    std::vector<float> w = gaussian(rng, size_t(c.rows * n), 0.05f);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      if (c.w_type == quant::Type::F16) w16[i] = quant::float_to_fp16(w[i]), w[i] = quant::fp16_to_float(w16[i]);
      if (c.w_type == quant::Type::BF16) w16[i] = quant::float_to_bf16(w[i]), w[i] = quant::bf16_to_float(w16[i]);
    }
    const bool quantized = c.y_type != quant::Type::F32;
    const size_t qbytes = quantized ? quant::row_size(c.y_type, n) : 4;
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dw, c.w_type == quant::Type::F32 ? to_device(w) : to_device(w16));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dnw, to_device(nw));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dr, to_device(r));
    struct Out {
      std::vector<float> x, y, out;
      std::vector<uint8_t> q;
    } got[2];
    for (const bool fuse : {true, false}) {
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx, to_device(x));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dx_out, cuda::DeviceBuffer::allocate(size_t(n) * 4));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dy, cuda::DeviceBuffer::allocate(size_t(n) * 4));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, cuda::DeviceBuffer::allocate(qbytes));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(size_t(c.rows) * 4));
      const cuda::AddRmsNormArgs norm{.x = dx.as<float>(), .residual = dr.as<float>(), .weight = dnw.as<float>(),
                                      .y = dy.as<float>(), .n_rows = 1, .n_cols = n, .eps = 1e-6f,
                                      .y_type = c.y_type, .y_quantized = quantized ? dq.data() : nullptr,
                                      .x_out = dx_out.as<float>()};
      if (fuse) {
        ASSERT_OK(cuda::add_rms_norm_matvec(
            {.norm = norm, .type = c.w_type, .weights = dw.data(), .rows = c.rows, .out = dout.as<float>()}, stream));
      } else {
        ASSERT_OK(cuda::add_rms_norm(norm, stream));
        ASSERT_OK(cuda::matvec({.type = c.w_type, .weights = dw.data(), .rows = c.rows, .cols = n,
                                .x = dy.as<float>(), .y = dout.as<float>()},
                               ws, stream));
      }
      stream.synchronize();
      Out& o = got[fuse ? 0 : 1];
      o.x = from_device<float>(dx_out, size_t(n));
      o.y = from_device<float>(dy, size_t(n));
      o.out = from_device<float>(dout, size_t(c.rows));
      if (quantized) o.q = from_device<uint8_t>(dq, qbytes);
      EXPECT_EQ(0, std::memcmp(from_device<float>(dx, size_t(n)).data(), x.data(), x.size() * 4)) << what << ": x read";
    }
    if (cuda::norm_in_cluster(c.y_type, 1, n)) {
      EXPECT_EQ(0, std::memcmp(got[0].x.data(), got[1].x.data(), size_t(n) * 4)) << what << ": x_out";
      EXPECT_EQ(0, std::memcmp(got[0].y.data(), got[1].y.data(), size_t(n) * 4)) << what << ": y";
      EXPECT_EQ(0, std::memcmp(got[0].out.data(), got[1].out.data(), size_t(c.rows) * 4)) << what << ": out";
      EXPECT_EQ(got[0].q, got[1].q) << what << ": quantized y";
    }  // else (rows of 1,024 or 3,072 for Q8_K; GPUs before sm_90): the CPU references below only
    std::vector<float> sum(x.size()), want_y(x.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + r[i];
    ref_rms_norm(sum.data(), nw.data(), want_y.data(), 1, n, 1e-6f);
    EXPECT_EQ(0, std::memcmp(got[0].x.data(), sum.data(), size_t(n) * 4)) << what << ": x_out is not x + residual";
    expect_norm_close(got[0].y, want_y, what);
    for (int64_t row = 0; row < c.rows; ++row) {
      double dot = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        dot += double(w[size_t(row * n + i)]) * double(want_y[size_t(i)]);
        mag += std::fabs(double(w[size_t(row * n + i)]) * double(want_y[size_t(i)]));
      }
      EXPECT_NEAR(got[0].out[size_t(row)], dot, (double(n + 8) * kU + std::ldexp(1.0, -21)) * mag) << what << " row "
                                                                                                     << row;
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
      std::vector<float> up = gaussian(rng, size_t(rows * cols));
      std::fill(gate.begin(), gate.begin() + 256, 0.0f);  // swiglu(0) = 0: an all-zero first block
      // Ties for a block's largest magnitude (Q8_K keeps the first, sign included): +h then -h in block 1, -h then
      // +h in block 2, larger than anything else there.
      for (const auto& [i, j] : {std::pair{300, 400}, std::pair{600, 700}}) {
        if (j >= cols) continue;
        gate[size_t(i)] = gate[size_t(j)] = 30.0f;
        up[size_t(i)] = i == 300 ? 9.0f : -9.0f;
        up[size_t(j)] = -up[size_t(i)];
      }
      expect_same(swiglu_quantized(gate, up, rows, cols, t, true, stream),
                  swiglu_quantized(gate, up, rows, cols, t, false, stream), shape_name(t, rows, cols));
    }
  }
}

// ---- route_topk ------------------------------------------------------------------------------------------------

// route_topk over logits [n_tok, n_expert]: the ids and weights it writes.
Status run_route(cuda::Stream& stream, const std::vector<float>& logits, int64_t n_tok, int64_t n_expert, int64_t k,
                 bool normalize, std::vector<int32_t>* ids, std::vector<float>* weights) {
  const size_t n = size_t(n_tok * k);
  MAGNETAR_ASSIGN_OR_RETURN(cuda::DeviceBuffer dl, to_device(logits));
  MAGNETAR_ASSIGN_OR_RETURN(cuda::DeviceBuffer di, cuda::DeviceBuffer::allocate(n * 4));
  MAGNETAR_ASSIGN_OR_RETURN(cuda::DeviceBuffer dw, cuda::DeviceBuffer::allocate(n * 4));
  MAGNETAR_RETURN_IF_ERROR(cuda::route_topk({.logits = dl.as<float>(),
                                             .ids = di.as<int32_t>(),
                                             .weights = dw.as<float>(),
                                             .n_tok = n_tok,
                                             .n_expert = n_expert,
                                             .k = k,
                                             .normalize = normalize},
                                            stream));
  stream.synchronize();
  *ids = from_device<int32_t>(di, n);
  *weights = from_device<float>(dw, n);
  return Status();
}

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
            std::vector<int32_t> got_ids;
            std::vector<float> got_w;
            ASSERT_OK(run_route(stream, logits, n_tok, n_expert, k, normalize, &got_ids, &got_w));
            const std::string what = "route n_expert " + std::to_string(n_expert) + " k " + std::to_string(k) +
                                     " n_tok " + std::to_string(n_tok) + (ties ? " ties" : "") +
                                     (normalize ? " normalized" : "");
            ASSERT_EQ(got_ids, want_ids) << what;
            for (size_t i = 0; i < got_w.size(); ++i) ASSERT_NEAR(got_w[i], want_w[i], 1e-6) << what << " weight " << i;
          }
        }
      }
    }
  }
}

// NaN logits (a hidden state gone NaN) still give k distinct ids in range: a NaN of either sign ranks above every
// number (lower ids first among NaNs), the rest as usual. Compared as floats, a NaN ranked before nothing and nothing
// before it: slots went unwritten and their ids indexed past the expert tables.
TEST(CudaOps, RouteTopkWithNaNLogitsPicksValidDistinctIds) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 6);
  const int64_t n_expert = 128, k = 8, n_tok = 4;
  std::vector<float> logits = gaussian(rng, size_t(n_tok * n_expert), 2.0f);
  const int nan_count[n_tok] = {1, 3, 8, 128};  // one, a few, exactly k, all
  std::vector<int32_t> want(size_t(n_tok * k));
  for (int64_t t = 0; t < n_tok; ++t) {
    float* row = logits.data() + t * n_expert;
    // Every other NaN negative (x86's inf - inf is): it ranks above every number too, as torch.topk's NaNs
    for (int i = 0; i < nan_count[t]; ++i) {
      row[(i * 37 + 11) % n_expert] = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
      if (na || nb) return na && !nb;
      return row[a] > row[b];
    });
    std::copy(order.begin(), order.begin() + k, want.begin() + t * k);
  }
  std::vector<int32_t> got;
  std::vector<float> weights;
  ASSERT_OK(run_route(stream, logits, n_tok, n_expert, k, true, &got, &weights));
  EXPECT_EQ(got, want);
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
// and from device memory. FP8 caches: the bytes of quant::float_to_fp8_e4m3 (the device's cvt against the host's
// rounding), v with elements past 448 (saturated) and in the subnormal range.
void expect_qkv_prepare_matches_reference(quant::Type kv_type, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(seed);
  const bool f8 = kv_type == quant::Type::F8_E4M3;
  auto encode = [&](const float* x, uint8_t* out, int64_t n) {
    if (!f8) return quant::traits(quant::Type::Q8_0).from_float(x, out, n);
    for (int64_t i = 0; i < n; ++i) out[i] = quant::float_to_fp8_e4m3(x[i]);
  };
  struct Heads {
    int64_t n_head, n_head_kv;
  };
  for (const int64_t n_tok : {int64_t(1), int64_t(5), int64_t(20)}) {  // 20: a CTA per token
    for (const Heads heads : {Heads{32, 4}, Heads{6, 2}}) {
      for (const int64_t head_dim : {int64_t(64), int64_t(128), int64_t(256)}) {
        for (const bool device_row : {false, true}) {
          const int64_t HK = heads.n_head_kv, row0 = 3, n_rows = row0 + n_tok + 2, kv = HK * head_dim;
          const size_t row_bytes = quant::row_size(kv_type, kv);
          QkvInputs in = qkv_inputs(rng, n_tok, heads.n_head, HK, head_dim);
          if (f8) {
            for (size_t i = 0; i < in.v.size(); ++i) in.v[i] *= i % 7 == 0 ? 300.0f : i % 11 == 0 ? 1e-3f : 1.0f;
          }
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
          ASSERT_OK(cuda::qkv_prepare({.q = dq.as<float>(),
                                       .q_weight = dqw.as<float>(),
                                       .k = dk.as<float>(),
                                       .k_weight = dkw.as<float>(),
                                       .v = dv.as<float>(),
                                       .k_cache = kc.data(),
                                       .v_cache = vc.data(),
                                       .positions = dp.as<int32_t>(),
                                       .n_tok = n_tok,
                                       .n_head = heads.n_head,
                                       .n_head_kv = HK,
                                       .head_dim = head_dim,
                                       .eps = 1e-6f,
                                       .theta = 1e6f,
                                       .row0 = device_row ? 999 : row0,
                                       .row0_device = device_row ? drow.as<int32_t>() : nullptr,
                                       .kv_type = kv_type},
                                      stream));
          ASSERT_OK(cuda::qk_norm_rope({.x = dk_normed.as<float>(), .weight = dkw.as<float>(),
                                        .positions = dp.as<int32_t>(), .n_tok = n_tok, .n_head = HK,
                                        .head_dim = head_dim, .eps = 1e-6f, .theta = 1e6f},
                                       stream));
          stream.synchronize();
          const std::vector<float> k_normed = from_device<float>(dk_normed, k.size());
          std::vector<uint8_t> want_k = guard, want_v = guard;
          encode(k_normed.data(), want_k.data() + size_t(row0) * row_bytes, n_tok * kv);
          encode(v.data(), want_v.data() + size_t(row0) * row_bytes, n_tok * kv);
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

TEST(CudaOps, QkvPrepareQ8MatchesReferenceQuantizer) {
  SKIP_WITHOUT_GPU();
  expect_qkv_prepare_matches_reference(quant::Type::Q8_0, kSeed + 64);
}

TEST(CudaOps, QkvPrepareF8MatchesHostRounding) {
  SKIP_WITHOUT_GPU();
  expect_qkv_prepare_matches_reference(quant::Type::F8_E4M3, kSeed + 71);
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

// kv_to_f16 of an FP8 cache: every byte's value (quant::fp8_e4m3_to_float, exact in f16), every code but NaN's in
// random order; rows past the count untouched; the count from the host and from device memory.
TEST(CudaOps, KvToF16OfFp8EqualsTheCodesValues) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 72);
  for (const int64_t n : {int64_t(64), int64_t(512), int64_t(1056)}) {
    const int64_t n_rows = 300;
    std::vector<uint8_t> cache(size_t(n_rows * n));
    for (uint8_t& c : cache) {
      do {
        c = uint8_t(rng.bits() & 0xff);
      } while ((c & 0x7f) == 0x7f);
    }
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dc, to_device(cache));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dlast, to_device(std::vector<int32_t>{0}));
    for (const int64_t rows : {int64_t(1), int64_t(77), n_rows}) {
      for (const bool device_rows : {false, true}) {
        const std::vector<uint16_t> guard(cache.size(), 0xBEEF);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, to_device(guard));
        const int32_t last = int32_t(rows - 1);
        ASSERT_OK(dlast.upload(&last, sizeof last));
        ASSERT_OK(cuda::kv_to_f16({.cache = dc.data(),
                                   .type = quant::Type::F8_E4M3,
                                   .out = dout.as<uint16_t>(),
                                   .n = n,
                                   .rows = device_rows ? n_rows : rows,
                                   .last_row_device = device_rows ? dlast.as<int32_t>() : nullptr},
                                  stream));
        stream.synchronize();
        std::vector<uint16_t> want = guard;
        for (size_t i = 0; i < size_t(rows * n); ++i)
          want[i] = quant::float_to_fp16(quant::fp8_e4m3_to_float(cache[i]));
        ASSERT_EQ(from_device<uint16_t>(dout, want.size()), want)
            << "n " << n << " rows " << rows << (device_rows ? " (count on the device)" : "");
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
  fails(cuda::add_rms_norm({.x = f, .residual = f + 1, .weight = f, .y = f + 2, .n_rows = 1, .n_cols = 4,
                            .x_out = f + 1},
                           stream),
        "x_out");  // x_out aliases residual
  // add_rms_norm_matvec: its shapes, and what it refuses before launching anything.
  EXPECT_TRUE(cuda::add_rms_norm_matvec_fits(quant::Type::F32, 2048));
  EXPECT_TRUE(cuda::add_rms_norm_matvec_fits(quant::Type::BF16, 8192));
  EXPECT_FALSE(cuda::add_rms_norm_matvec_fits(quant::Type::F32, 1536));   // not whole steps of 1,024
  EXPECT_FALSE(cuda::add_rms_norm_matvec_fits(quant::Type::F16, 9216));   // past 8,192
  EXPECT_FALSE(cuda::add_rms_norm_matvec_fits(quant::Type::Q8_0, 2048));  // float weights only
  alignas(16) static float g[6][2048];
  const cuda::NormMatvecArgs nm{.norm = {.x = g[0], .residual = g[1], .weight = g[2], .y = g[3], .n_rows = 1,
                                         .n_cols = 2048, .x_out = g[4]},
                                .type = quant::Type::F32, .weights = g[5], .rows = 4, .out = g[5] + 2044};
  cuda::NormMatvecArgs bad_nm = nm;
  bad_nm.norm.n_cols = 1000;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "1000 columns");
  bad_nm = nm;
  bad_nm.norm.n_rows = 2;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "one row");
  bad_nm = nm;
  bad_nm.norm.residual_rows = ids;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "MoE combine");
  bad_nm = nm;
  bad_nm.norm.x_out = nullptr;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "x_out is required");
  bad_nm = nm;
  bad_nm.norm.x_out = g[0];
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "must not alias");
  bad_nm = nm;
  bad_nm.out = g[3];
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "three buffers");
  bad_nm = nm;
  bad_nm.norm.y = g[3] + 1;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "16-byte aligned");
  bad_nm = nm;
  bad_nm.rows = 0;
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "rows=0");
  bad_nm = nm;
  bad_nm.norm.y_quantized = g[5];
  bad_nm.norm.y_type = quant::Type::Q8_0;  // Q8_K only
  fails(cuda::add_rms_norm_matvec(bad_nm, stream), "cannot be quantized");
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

// Kernels whose shared memory a GPU may lack (99 KB a CTA on the RTX 30/40/50 series; the CudaSmallSmem run of
// tests/CMakeLists.txt is such a GPU, MAGNETAR_CUDA_SMEM_OPTIN): decode attention at head_dim 64 and 128 has a
// variant for every sm_80+ GPU, and matmul_q refuses a type whose tiles do not fit with a Status naming the shared
// memory (its attribute write aborted the process).
TEST(CudaOps, SharedMemoryBoundKernelsRefuseOrFallBack) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  EXPECT_TRUE(cuda::has_attention_decode_mma(64, 16));
  EXPECT_TRUE(cuda::has_attention_decode_mma(128, 16));
  const char* cap = std::getenv("MAGNETAR_CUDA_SMEM_OPTIN");
  if (cap != nullptr && std::atol(cap) < 140 * 1024) {
    EXPECT_FALSE(cuda::has_attention_decode_mma(256, 8));
  }
  int refused = 0;
  for (const quant::TypeTraits& t : quant::all_types()) {
    if (!t.is_quantized || !quant::is_weight_type(t.type) || cuda::has_matmul_q(t.type)) continue;
    const int64_t cols = 256, rows = 128;
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w, cuda::DeviceBuffer::allocate(quant::row_size(t.type, cols) * rows));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x, cuda::DeviceBuffer::allocate(quant::row_size(t.vec_dot_type, cols)));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y, cuda::DeviceBuffer::allocate(size_t(rows) * 4));
    const Status s = cuda::matmul_q(
        {.type = t.type, .weights = w.data(), .rows = rows, .cols = cols, .x = x.data(), .y = y.as<float>(), .n = 1},
        stream);
    EXPECT_FALSE(s.ok()) << quant::type_name(t.type);
    EXPECT_NE(s.message().find("shared memory"), std::string::npos) << s.message();
    ++refused;
  }
  // Where no cap lowers it (the H200: 227 KB), every type has its kernel.
  if (cap == nullptr) {
    EXPECT_EQ(refused, 0);
  }
}

}  // namespace ops_test
}  // namespace magnetar
