// The int8 tensor-core matrix-matrix products (matmul_q, grouped_matmul_q; backends/cuda/mmq.cu) against
// the scalar reference (STYLE.md rule 7). Needs a GPU: without one every test that launches a kernel
// reports SKIPPED, never passed; the argument checks (RejectsBadArguments) need no device and always run.
//
// What is asserted, for every quantized weight type of the trait table:
//   matmul_q          outputs within the derived float-rounding bound (below) of the reference vec_dot of
//                     the same quantized weight row with the activation row quantized by the reference
//                     quantizer of traits(type).vec_dot_type (byte-identical with quantize_activations,
//                     cuda_mmvq_test.cpp), for rows 1, 7, 33, 4096 (prefixes of one matrix), cols 32, 96, 160,
//                     288 (block-32 types: a partial K-step), 256, 512, 2816, 4096 (rows in order: the K-quants but
//                     Q6_K take mmq.cu's direct forms at every cols) and n 1, 7, 64, 100, 200, 512
//                     activation rows. Large shapes check every weight row of 6 activation rows (first, last,
//                     tile edges 63/64, two random) and every activation row of 6 weight rows (first, last,
//                     tile edges 127/128, two random); every output must be written (NaN-poisoned) and nothing
//                     past the end (guard floats);
//   split outputs     matmul_q over stacked matrices into three buffers, bit for bit the plain launch's columns;
//   grouped_matmul_q  items of n 1, 5, 37, 64, 70 and 137 rows (70 and 137: several 64-row chunks; 5, 37 and the
//                     chunk tails of 70 and 137: warps with empty m16 tiles), two parts (gate, up) at a
//                     y_part_stride, cols 256, 2048 and 2816, a permuted x_rows (300 weight rows) or none (7), one
//                     item with a null up weight (its part-1 rows must stay untouched) and one with a null gate weight.
//                     The K-quants take mmq.cu's direct forms for cols 2048, and for every cols without x_rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "quant/quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace magnetar {
namespace mmq_test {

using cuda_test::activations;
using cuda_test::dequantize_ref;
using cuda_test::expect_error;
using cuda_test::gaussian;
using cuda_test::guard_intact;
using cuda_test::poisoned;
using cuda_test::quantize_ref;
using cuda_test::quantized_tolerance;
using cuda_test::Rng;

using quant::Type;
using quant::TypeTraits;

constexpr uint64_t kSeed = 20261201;
constexpr int64_t kMaxRows = 4096;
constexpr int64_t kRowCounts[] = {1, 7, 33, 4096};
// 32, 96, 160: rows shorter than one K-step of 256; 288: a last K-step of 32 after a full one, whose blocks the
// kernel's prefetch reaches (legacy types of 32-element blocks)
constexpr int64_t kColCounts[] = {32, 96, 160, 256, 288, 512, 2816, 4096};
constexpr int64_t kXCounts[] = {1, 7, 64, 100, 200, 512};  // 100: a last tile of 36 rows
constexpr size_t kGuardFloats = 64;
constexpr int64_t kFullCheckOps = int64_t(1) << 27;  // check every output below this many multiply-adds

std::vector<Type> mmq_types() {
  std::vector<Type> types;
  for (const TypeTraits& t : quant::all_types()) {
    if (t.is_quantized && quant::is_weight_type(t.type)) types.push_back(t.type);
  }
  return types;
}

std::string type_case_name(const ::testing::TestParamInfo<Type>& info) {
  return std::string(quant::type_name(info.param));
}

// A quantized matrix with its dequantized values, on the host and the device.
struct Matrix {
  std::vector<uint8_t> q;
  std::vector<float> w;
  cuda::DeviceBuffer dev;
};

// Compares one output with the reference; counts and reports the first failures.
struct Checker {
  const TypeTraits& t;
  int64_t cols;
  int64_t bad = 0;
  int64_t checked = 0;
  void check(const std::string& where, float got, const uint8_t* w_row, const float* w_deq, const uint8_t* x_row,
             const float* x_deq) {
    const double want = double(t.vec_dot(cols, w_row, x_row));
    const double tol = quantized_tolerance(t.block_size, w_deq, x_deq, cols);
    ++checked;
    if (std::fabs(double(got) - want) <= tol) return;  // false for NaN
    if (++bad <= 5) {
      ADD_FAILURE() << where << ": " << got << ", reference " << want << ", |diff| " << std::fabs(double(got) - want)
                    << " > bound " << tol;
    }
  }
};

std::vector<int64_t> sample(Rng& rng, int64_t count, std::initializer_list<int64_t> edges) {
  std::vector<int64_t> s;
  for (int64_t e : edges) {
    if (e >= 0 && e < count) s.push_back(e);
  }
  s.push_back(count - 1);
  for (int k = 0; k < 2; ++k) s.push_back(int64_t(rng.bits() % uint64_t(count)));
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// ---- matmul_q ---------------------------------------------------------------------------------------------------

class CudaMmqTest : public ::testing::TestWithParam<Type> {};

TEST_P(CudaMmqTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const TypeTraits& t = quant::traits(GetParam());
  const Type act_type = t.vec_dot_type;
  Rng rng(kSeed ^ uint64_t(t.type));
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  int64_t checked = 0;
  for (int64_t cols : kColCounts) {
    if (cols % t.block_size != 0) continue;
    Matrix m;
    m.q = quantize_ref(t.type, gaussian(rng, size_t(kMaxRows * cols)), cols);
    m.w = dequantize_ref(t.type, m.q.data(), kMaxRows * cols);
    ASSERT_OK_AND_ASSIGN(m.dev, cuda::DeviceBuffer::allocate(m.q.size()));
    ASSERT_OK(m.dev.upload(m.q.data(), m.q.size()));
    const size_t w_row = quant::row_size(t.type, cols);
    const size_t x_row = quant::row_size(act_type, cols);

    const int64_t max_n = kXCounts[std::size(kXCounts) - 1];
    const std::vector<uint8_t> qx = quantize_ref(act_type, activations(rng, max_n, cols), cols);
    const std::vector<float> xd = dequantize_ref(act_type, qx.data(), max_n * cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(qx.size()));
    ASSERT_OK(x_dev.upload(qx.data(), qx.size()));

    for (int64_t rows : kRowCounts) {
      for (int64_t n : kXCounts) {
        const std::string where = std::string(t.name) + " rows=" + std::to_string(rows) +
                                  " cols=" + std::to_string(cols) + " n=" + std::to_string(n);
        const size_t y_count = size_t(n * rows);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev, cuda::DeviceBuffer::allocate((y_count + kGuardFloats) * 4));
        const std::vector<float> poison = poisoned(y_count + kGuardFloats);
        ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));
        ASSERT_OK(cuda::matmul_q({.type = t.type,
                                  .weights = m.dev.data(),
                                  .rows = rows,
                                  .cols = cols,
                                  .x = x_dev.data(),
                                  .y = y_dev.as<float>(),
                                  .n = n},
                                 stream));
        stream.synchronize();
        std::vector<float> got(y_count + kGuardFloats);
        ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));
        ASSERT_TRUE(guard_intact(got, y_count)) << where;
        int64_t unwritten = 0;
        for (size_t i = 0; i < y_count; ++i) unwritten += std::isnan(got[i]) ? 1 : 0;
        EXPECT_EQ(unwritten, 0) << where << ": outputs not written";

        Checker c{t, cols};
        auto check = [&](int64_t v, int64_t r) {
          c.check(where + " y[" + std::to_string(v) + "][" + std::to_string(r) + "]", got[size_t(v * rows + r)],
                  m.q.data() + size_t(r) * w_row, m.w.data() + size_t(r * cols), qx.data() + size_t(v) * x_row,
                  xd.data() + size_t(v * cols));
        };
        if (n * rows * cols <= kFullCheckOps) {
          for (int64_t v = 0; v < n; ++v)
            for (int64_t r = 0; r < rows; ++r) check(v, r);
        } else {
          for (int64_t v : sample(rng, n, {0, 63, 64}))
            for (int64_t r = 0; r < rows; ++r) check(v, r);
          for (int64_t r : sample(rng, rows, {0, 127, 128}))
            for (int64_t v = 0; v < n; ++v) check(v, r);
        }
        EXPECT_EQ(c.bad, 0) << where << ": outputs outside the bound (of " << c.checked << " checked)";
        checked += c.checked;
      }
    }
  }
  std::printf("[ mmq ] %s: %lld outputs checked\n", std::string(t.name).c_str(), (long long)checked);
}

INSTANTIATE_TEST_SUITE_P(AllQuantizedTypes, CudaMmqTest, ::testing::ValuesIn(mmq_types()), type_case_name);

// ---- grouped_matmul_q ----------------------------------------------------------------------------------------------

class CudaGroupedMmqTest : public ::testing::TestWithParam<Type> {};

TEST_P(CudaGroupedMmqTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const TypeTraits& t = quant::traits(GetParam());
  const Type act_type = t.vec_dot_type;
  Rng rng(kSeed + 7 * uint64_t(t.type));
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  constexpr int32_t kItemRows[] = {1, 5, 37, 64, 70, 137};
  constexpr int kExperts = 3;
  int32_t total = 0;
  for (int32_t n : kItemRows) total += n;

  // 2048: Q8_K rows of a multiple of 16 bytes (mmq.cu's direct forms with x_rows); 256, 2816: tiled with x_rows
  for (int64_t cols : {int64_t(256), int64_t(2048), int64_t(2816)}) {
    for (int64_t rows : {int64_t(7), int64_t(300)}) {
      const std::string shape = std::string(t.name) + " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols);
      const size_t w_row = quant::row_size(t.type, cols);
      const size_t x_row = quant::row_size(act_type, cols);
      // Experts e = 0..2, each with a gate (part 0) and an up (part 1) matrix.
      std::vector<Matrix> mats(2 * kExperts);
      for (Matrix& m : mats) {
        m.q = quantize_ref(t.type, gaussian(rng, size_t(rows * cols)), cols);
        m.w = dequantize_ref(t.type, m.q.data(), rows * cols);
        ASSERT_OK_AND_ASSIGN(m.dev, cuda::DeviceBuffer::allocate(m.q.size()));
        ASSERT_OK(m.dev.upload(m.q.data(), m.q.size()));
      }
      // x has more rows than the output; x_rows is a random map into it (300 rows), or null: row r of x (7 rows;
      // rows in order: mmq.cu's direct forms for any row length).
      const bool mapped = rows == 300;
      const int64_t n_x = total + 11;
      const std::vector<uint8_t> qx = quantize_ref(act_type, activations(rng, n_x, cols), cols);
      const std::vector<float> xd = dequantize_ref(act_type, qx.data(), n_x * cols);
      std::vector<int32_t> x_rows(static_cast<size_t>(total));
      for (size_t r = 0; r < x_rows.size(); ++r) x_rows[r] = mapped ? int32_t(rng.bits() % uint64_t(n_x)) : int32_t(r);

      // Items: expert i % 3; item 1 has no up weight, item 3 no gate weight.
      std::vector<cuda::GroupItem> items;
      std::vector<int> expert;
      int32_t row0 = 0;
      for (size_t i = 0; i < std::size(kItemRows); ++i) {
        const int e = int(i % kExperts);
        cuda::GroupItem item;
        item.w[0] = i == 3 ? nullptr : mats[size_t(2 * e)].dev.data();
        item.w[1] = i == 1 ? nullptr : mats[size_t(2 * e + 1)].dev.data();
        item.w[2] = nullptr;
        item.row0 = row0;
        item.n = kItemRows[i];
        row0 += kItemRows[i];
        items.push_back(item);
        expert.push_back(e);
      }
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items_dev, cuda::DeviceBuffer::allocate(items.size() * sizeof(items[0])));
      ASSERT_OK(items_dev.upload(items.data(), items.size() * sizeof(items[0])));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(qx.size()));
      ASSERT_OK(x_dev.upload(qx.data(), qx.size()));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_rows_dev, cuda::DeviceBuffer::allocate(x_rows.size() * 4));
      ASSERT_OK(x_rows_dev.upload(x_rows.data(), x_rows.size() * 4));
      const int64_t stride = int64_t(total) * rows + 5;  // not a multiple of anything in particular
      const size_t y_count = size_t(2 * stride);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev, cuda::DeviceBuffer::allocate((y_count + kGuardFloats) * 4));
      const std::vector<float> poison = poisoned(y_count + kGuardFloats);
      ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));

      ASSERT_OK(cuda::grouped_matmul_q({.type = t.type,
                                        .items = items_dev.as<cuda::GroupItem>(),
                                        .n_items = int64_t(items.size()),
                                        .part = 0,
                                        .n_parts = 2,
                                        .rows = rows,
                                        .cols = cols,
                                        .x = x_dev.data(),
                                        .x_rows = mapped ? x_rows_dev.as<int32_t>() : nullptr,
                                        .y = y_dev.as<float>(),
                                        .y_part_stride = stride},
                                       stream));
      stream.synchronize();
      std::vector<float> got(y_count + kGuardFloats);
      ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));

      Checker c{t, cols};
      int64_t touched = 0;  // outputs of null weights that were written
      for (size_t i = 0; i < items.size(); ++i) {
        for (int z = 0; z < 2; ++z) {
          const Matrix& m = mats[size_t(2 * expert[i] + z)];
          for (int32_t j = 0; j < items[i].n; ++j) {
            const int32_t r = items[i].row0 + j;
            const int32_t xr = x_rows[size_t(r)];
            for (int64_t o = 0; o < rows; ++o) {
              const float g = got[size_t(z * stride + int64_t(r) * rows + o)];
              if (items[i].w[z] == nullptr) {
                touched += std::isnan(g) ? 0 : 1;
                continue;
              }
              c.check(shape + " item " + std::to_string(i) + " part " + std::to_string(z) + " row " + std::to_string(r) +
                          " out " + std::to_string(o),
                      g, m.q.data() + size_t(o) * w_row, m.w.data() + size_t(o * cols), qx.data() + size_t(xr) * x_row,
                      xd.data() + size_t(xr) * size_t(cols));
            }
          }
        }
      }
      for (size_t i = size_t(total) * size_t(rows); i < size_t(stride); ++i) touched += std::isnan(got[i]) ? 0 : 1;
      for (size_t i = y_count; i < got.size(); ++i) touched += std::isnan(got[i]) ? 0 : 1;
      EXPECT_EQ(touched, 0) << shape << ": wrote outputs of null weights, between parts or past the end";
      EXPECT_EQ(c.bad, 0) << shape << ": outputs outside the bound (of " << c.checked << " checked)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllQuantizedTypes, CudaGroupedMmqTest, ::testing::ValuesIn(mmq_types()), type_case_name);

// ---- matmul_q with split outputs (the prefill's q | k | v launch) ------------------------------------------------

// One launch over stacked matrices written to three buffers equals, bit for bit, the plain launch's output columns
// (the same tiles run the same code; only the address they store to differs): Q4_K (the 30B-A3B's q/k/v) and Q8_0,
// rows 640 split at 256 | 384, n 100 (a partial last activation tile). Every output of the three buffers written,
// nothing past their ends.
TEST(CudaMmq, SplitOutputsMatchPlainLaunch) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 640, kCols = 512, kN = 100, kSplit0 = 256, kSplit1 = 384;
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  for (Type type : {Type::Q4_K, Type::Q8_0}) {
    const TypeTraits& t = quant::traits(type);
    Rng rng(kSeed ^ 0x5917 ^ uint64_t(type));
    const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, size_t(kRows * kCols)), kCols);
    const std::vector<uint8_t> qx = quantize_ref(t.vec_dot_type, activations(rng, kN, kCols), kCols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(qx.size()));
    ASSERT_OK(w_dev.upload(qw.data(), qw.size()));
    ASSERT_OK(x_dev.upload(qx.data(), qx.size()));
    const int64_t seg_rows[3] = {kSplit0, kSplit1 - kSplit0, kRows - kSplit1};
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer full_dev, cuda::DeviceBuffer::allocate(size_t(kN * kRows) * 4));
    std::vector<cuda::DeviceBuffer> seg_dev;
    for (int64_t r : seg_rows) {
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer b, cuda::DeviceBuffer::allocate(size_t(kN * r + kGuardFloats) * 4));
      const std::vector<float> poison = poisoned(size_t(kN * r) + kGuardFloats);
      ASSERT_OK(b.upload(poison.data(), poison.size() * 4));
      seg_dev.push_back(std::move(b));
    }
    const cuda::MatmulArgs plain{.type = type, .weights = w_dev.data(), .rows = kRows, .cols = kCols,
                                 .x = x_dev.data(), .y = full_dev.as<float>(), .n = kN};
    ASSERT_OK(cuda::matmul_q(plain, stream));
    cuda::MatmulArgs split = plain;
    split.y = seg_dev[0].as<float>();
    split.split[0] = kSplit0;
    split.split[1] = kSplit1;
    split.y_split[0] = seg_dev[1].as<float>();
    split.y_split[1] = seg_dev[2].as<float>();
    ASSERT_OK(cuda::matmul_q(split, stream));
    stream.synchronize();
    std::vector<float> full(size_t(kN * kRows));
    ASSERT_OK(full_dev.download(full.data(), full.size() * 4));
    int64_t col0 = 0;
    for (int s = 0; s < 3; ++s) {
      std::vector<float> got(size_t(kN * seg_rows[s]) + kGuardFloats);
      ASSERT_OK(seg_dev[size_t(s)].download(got.data(), got.size() * 4));
      int64_t bad = 0;
      for (int64_t r = 0; r < kN; ++r) {
        for (int64_t c = 0; c < seg_rows[s]; ++c) {
          const float want = full[size_t(r * kRows + col0 + c)];
          const float g = got[size_t(r * seg_rows[s] + c)];
          if (std::memcmp(&want, &g, 4) != 0 && ++bad <= 3) {
            ADD_FAILURE() << t.name << " segment " << s << " y[" << r << "][" << c << "] = " << g << ", plain " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0) << t.name << " segment " << s;
      ASSERT_TRUE(guard_intact(got, size_t(kN * seg_rows[s]))) << t.name << " segment " << s;
      col0 += seg_rows[s];
    }
  }
}

// ---- argument checks (no device needed) -----------------------------------------------------------------------------

TEST(CudaMmq, RejectsBadArguments) {
  // Validation happens before any device call, so host pointers stand in for device ones and the stream may be
  // empty: none of these calls reaches a kernel.
  alignas(16) static float fake[64];
  alignas(16) static cuda::GroupItem fake_items[1];
  cuda::Stream stream;
  const cuda::MatmulArgs ok{.type = Type::Q4_0, .weights = fake, .rows = 7, .cols = 256, .x = fake, .y = fake, .n = 3};
  cuda::MatmulArgs a = ok;
  a.type = Type::Q8_K;
  expect_error(cuda::matmul_q(a, stream), "no int8 matrix-matrix kernel for Q8_K");
  a.type = Type::F32;
  expect_error(cuda::matmul_q(a, stream), "kernel for F32");
  a.type = Type(4);  // an id ggml retired
  expect_error(cuda::matmul_q(a, stream), "weight type id 4");
  a = ok;
  a.cols = 100;
  expect_error(cuda::matmul_q(a, stream), "cols=100");
  a = ok;
  a.type = Type::Q4_K;  // 256-element blocks
  a.cols = 288;
  expect_error(cuda::matmul_q(a, stream), "cols=288");
  a = ok;
  a.rows = 0;
  expect_error(cuda::matmul_q(a, stream), "rows=0");
  a = ok;
  a.rows = 640;
  a.split[0] = 200;  // not a multiple of the 128-row tile
  a.split[1] = 384;
  a.y_split[0] = a.y_split[1] = fake;
  expect_error(cuda::matmul_q(a, stream), "split rows 200, 384");
  a.split[0] = 256;
  a.y_split[1] = nullptr;
  expect_error(cuda::matmul_q(a, stream), "y_split");
  a = ok;
  a.n = 0;
  expect_error(cuda::matmul_q(a, stream), "n=0");
  a = ok;
  a.weights = nullptr;
  expect_error(cuda::matmul_q(a, stream), "null");
  a = ok;
  a.weights = reinterpret_cast<const uint8_t*>(fake) + 2;
  expect_error(cuda::matmul_q(a, stream), "16-byte aligned");
  a = ok;
  a.type = Type::Q8_0;
  a.cols = 2080000000;  // a multiple of 32 below INT_MAX - 256 whose rows of 34-byte blocks pass INT_MAX bytes
  expect_error(cuda::matmul_q(a, stream), "bytes, over the kernel's");
  a = ok;
  a.x = reinterpret_cast<const uint8_t*>(fake) + 4;  // the staged copies read whole 16-byte lines of x
  expect_error(cuda::matmul_q(a, stream), "x must be 16-byte aligned");

  const cuda::GroupedMatmulArgs gok{.type = Type::Q6_K, .items = fake_items, .n_items = 1, .part = 0, .n_parts = 2,
                                    .rows = 7, .cols = 256, .x = fake, .x_rows = nullptr, .y = fake,
                                    .y_part_stride = 7};
  cuda::GroupedMatmulArgs g = gok;
  g.type = Type::BF16;
  expect_error(cuda::grouped_matmul_q(g, stream), "kernel for BF16");
  g = gok;
  g.n_items = 0;
  expect_error(cuda::grouped_matmul_q(g, stream), "n_items=0");
  g = gok;
  g.part = 2;
  expect_error(cuda::grouped_matmul_q(g, stream), "parts 2..3");
  g = gok;
  g.y_part_stride = 6;
  expect_error(cuda::grouped_matmul_q(g, stream), "y_part_stride=6");
  g = gok;
  g.cols = 32;
  expect_error(cuda::grouped_matmul_q(g, stream), "cols=32");
  g = gok;
  g.items = nullptr;
  expect_error(cuda::grouped_matmul_q(g, stream), "null");
  g = gok;
  g.y = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(fake) + 2);
  expect_error(cuda::grouped_matmul_q(g, stream), "aligned");
  g = gok;
  g.x = reinterpret_cast<const uint8_t*>(fake) + 8;
  expect_error(cuda::grouped_matmul_q(g, stream), "x (16 bytes)");
}

}  // namespace mmq_test
}  // namespace magnetar
