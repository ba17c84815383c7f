// The CUDA matrix-vector products (matvec) and activation quantizer (quantize_activations) against the
// scalar reference (STYLE.md rule 7). Needs a GPU: without one every test that launches a kernel reports
// SKIPPED, never passed; the argument checks (RejectsBadArguments) need no device and always run.
//
// What is asserted:
//   quantize_activations  byte-identical with the reference quantizer of Q8_0, Q8_1 and Q8_K, on Gaussian
//                         rows with outliers and on edge blocks (zeros, equal magnitudes of both signs,
//                         constants, tiny and huge values);
//   matvec, quantized     every output element within a derived float-rounding bound (below) of the
//                         reference vec_dot of the same quantized weight row with the activations that
//                         matvec itself used (quantize_activations' bytes, which the test above pins to the
//                         reference quantizer's);
//   matvec, x_quantized   bit-identical with matvec from x (same kernel, same activation bytes);
//   matvec, F32/F16/BF16  every output element within a derived bound of a double-precision dot product of
//                         the (exactly representable) weights and the float32 activations;
// for every weight type of the trait table, rows 1, 7, 33 and 4096 (prefixes of one 4096-row matrix made
// by the reference quantizer from Gaussian data), cols 256, 512, 2816 and 4096 (plus 37 and 4099 for the
// element types: the unvectorized path), and 1 to 8 activation vectors per launch. Outputs sit between
// poisoned guard floats: a missed row or a write past the end fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "tests/cuda/cuda_test_util.h"
#include "quant/quant.h"

namespace magnetar {
namespace mmvq_test {

using cuda_test::activations;
using cuda_test::dequantize_ref;
using cuda_test::expect_error;
using cuda_test::from_device;
using cuda_test::gaussian;
using cuda_test::guard_intact;
using cuda_test::poisoned;
using cuda_test::quantize_ref;
using cuda_test::quantized_tolerance;
using cuda_test::Rng;

using quant::Type;
using quant::TypeTraits;

constexpr uint64_t kSeed = 20261130;
constexpr int64_t kMaxRows = 4096;
constexpr int64_t kRowCounts[] = {1, 7, 33, 4096};
constexpr int64_t kColCounts[] = {256, 512, 2816, 4096};
constexpr int64_t kOddColCounts[] = {37, 4099};  // element types only: not a multiple of the 8-wide path
constexpr int64_t kMaxCols = 4099;
constexpr size_t kGuardFloats = 64;  // poisoned floats after each output

// ---- tolerances (quantized types: cuda_test::quantized_tolerance) ------------------------------------------------

// Element types: the kernel rounds each of the n products and n additions at most once (fmaf rounds the
// pair once), so |kernel - exact| <= gamma_(n+1) sum|w_i x_i|; the double reference is exact to ~n 2^-53
// relative. Bound: 2 (n + 3) u sum|w_i x_i|.
double float_tolerance(const float* w, const float* x, int64_t n, double* exact) {
  double sum = 0;
  double abs_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = double(w[i]) * double(x[i]);
    sum += p;
    abs_sum += std::fabs(p);
  }
  *exact = sum;
  return 2.0 * (double(n) + 3.0) * std::ldexp(1.0, -24) * abs_sum + 1e-30;
}

// ---- matvec ----------------------------------------------------------------------------------------------------

std::vector<Type> weight_types() {
  std::vector<Type> types;
  for (const TypeTraits& t : quant::all_types()) {
    if (quant::is_weight_type(t.type)) types.push_back(t.type);
  }
  return types;
}

std::vector<int64_t> col_counts(const TypeTraits& t) {
  std::vector<int64_t> cols(std::begin(kColCounts), std::end(kColCounts));
  if (t.block_size == 1) cols.insert(cols.end(), std::begin(kOddColCounts), std::end(kOddColCounts));
  return cols;
}

// Vectors per launch for a row count: 1 everywhere, batches on the small and the large matrices.
std::vector<int64_t> vector_counts(int64_t rows) {
  if (rows == 1) return {1, 8};
  if (rows == 7) return {1, 3};
  if (rows == 33) return {1, 8};
  return {1, 2};
}

// The kernels a launch can take: the default (rows_per_warp 0) and, for one vector of a type with the rows
// kernel, that kernel at 1, 2 and 4 rows per warp.
std::vector<int> rows_per_warp_arms(Type type, int64_t n_vectors) {
  if (n_vectors != 1 || !cuda::has_matvec_rows_kernel(type)) return {0};
  return {0, 1, 2, 4};
}

class CudaMatvecTest : public ::testing::TestWithParam<Type> {};

std::string type_case_name(const ::testing::TestParamInfo<Type>& info) {
  return std::string(quant::type_name(info.param));
}

TEST_P(CudaMatvecTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const TypeTraits& t = quant::traits(GetParam());
  const bool quantized = t.is_quantized;
  const TypeTraits& act = quant::traits(t.vec_dot_type);
  Rng rng(kSeed ^ uint64_t(t.type));
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::MatvecWorkspace workspace,
                       cuda::MatvecWorkspace::create(kMaxCols, cuda::kMaxMatvecVectors));

  for (int64_t cols : col_counts(t)) {
    const size_t row_bytes = quant::row_size(t.type, cols);
    // One matrix per width; the row counts take its first rows.
    const std::vector<uint8_t> qw = quantize_ref(t.type, gaussian(rng, kMaxRows * cols), cols);
    const std::vector<float> w = dequantize_ref(t.type, qw.data(), kMaxRows * cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
    ASSERT_OK(w_dev.upload(qw.data(), qw.size()));

    for (int64_t rows : kRowCounts) {
      for (int64_t n_vectors : vector_counts(rows)) {
        for (const int rows_per_warp : rows_per_warp_arms(t.type, n_vectors)) {
          const std::string where = std::string(t.name) + " rows=" + std::to_string(rows) +
                                    " cols=" + std::to_string(cols) + " n_vectors=" + std::to_string(n_vectors) +
                                    " rows_per_warp=" + std::to_string(rows_per_warp);
          const std::vector<float> x = activations(rng, n_vectors, cols);
          const size_t y_count = size_t(n_vectors * rows);
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev,
                               cuda::DeviceBuffer::allocate((y_count + kGuardFloats) * sizeof(float)));
          ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
          const std::vector<float> poison = poisoned(y_count + kGuardFloats);
          ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));

          ASSERT_OK(cuda::matvec({.type = t.type,
                                  .weights = w_dev.data(),
                                  .rows = rows,
                                  .cols = cols,
                                  .x = x_dev.as<float>(),
                                  .y = y_dev.as<float>(),
                                  .n_vectors = n_vectors,
                                  .rows_per_warp = rows_per_warp},
                                 workspace, stream));
          stream.synchronize();
          std::vector<float> got(y_count + kGuardFloats);
          ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));
          ASSERT_TRUE(guard_intact(got, y_count)) << where;

          // The activations matvec used, for the reference dot (quantized types).
          std::vector<uint8_t> qx;
          if (quantized) {
            const size_t act_row = quant::row_size(act.type, cols);
            ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer qx_dev, cuda::DeviceBuffer::allocate(act_row * size_t(n_vectors)));
            ASSERT_OK(cuda::quantize_activations(act.type, x_dev.as<float>(), qx_dev.data(), cols, n_vectors, stream));
            stream.synchronize();
            qx.resize(act_row * size_t(n_vectors));
            ASSERT_OK(qx_dev.download(qx.data(), qx.size()));

            // The same product from those pre-quantized activations (x_quantized): the same kernel on the same
            // bytes, so bit-identical outputs.
            ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));
            ASSERT_OK(cuda::matvec({.type = t.type,
                                    .weights = w_dev.data(),
                                    .rows = rows,
                                    .cols = cols,
                                    .x = nullptr,
                                    .y = y_dev.as<float>(),
                                    .n_vectors = n_vectors,
                                    .x_quantized = qx_dev.data(),
                                    .rows_per_warp = rows_per_warp},
                                   workspace, stream));
            stream.synchronize();
            std::vector<float> again(got.size());
            ASSERT_OK(y_dev.download(again.data(), again.size() * sizeof(float)));
            EXPECT_EQ(std::memcmp(again.data(), got.data(), y_count * sizeof(float)), 0)
                << where << ": x_quantized gives other outputs than x";
          }

          int64_t bad = 0;
          for (int64_t v = 0; v < n_vectors; ++v) {
            std::vector<float> y_act;  // dequantized activations of vector v (quantized types)
            const uint8_t* qx_v = nullptr;
            if (quantized) {
              qx_v = qx.data() + size_t(v) * quant::row_size(act.type, cols);
              y_act = dequantize_ref(act.type, qx_v, cols);
            }
            for (int64_t r = 0; r < rows; ++r) {
              const float* w_row = w.data() + size_t(r * cols);
              double want;
              double tol;
              if (quantized) {
                want = double(t.vec_dot(cols, qw.data() + size_t(r) * row_bytes, qx_v));
                tol = quantized_tolerance(t.block_size, w_row, y_act.data(), cols);
              } else {
                tol = float_tolerance(w_row, x.data() + size_t(v * cols), cols, &want);
              }
              const float g = got[size_t(v * rows + r)];
              if (std::fabs(double(g) - want) <= tol) continue;  // false for NaN: an unwritten output fails
              if (++bad <= 5) {
                ADD_FAILURE() << where << ": y[" << v << "][" << r << "] = " << g << ", reference " << want
                              << ", |diff| " << std::fabs(double(g) - want) << " > bound " << tol;
              }
            }
          }
          EXPECT_EQ(bad, 0) << where << ": outputs outside the bound";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, CudaMatvecTest, ::testing::ValuesIn(weight_types()), type_case_name);

// Single-vector products of `type` at each of `cols` and row counts 1, 3, 9, 67 and max_rows (default 1,031: cutting
// the warps' and CTAs' row groups), with MatvecArgs::stationary / staged both set and both clear, against the reference
// vec_dot of the same quantized row with the activations quantize_activations made (within the derived bound, as
// above). Outputs sit between poisoned guard floats.
void expect_single_vector_products(Type type, std::initializer_list<int64_t> col_list, uint64_t seed,
                                   int64_t max_rows = 1031) {
  const TypeTraits& t = quant::traits(type);
  const TypeTraits& act = quant::traits(t.vec_dot_type);
  Rng rng(seed);
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::MatvecWorkspace workspace;  // not used: x_quantized
  for (const int64_t cols : col_list) {
    const size_t row_bytes = quant::row_size(type, cols);
    const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, max_rows * cols), cols);
    const std::vector<float> w = dequantize_ref(type, qw.data(), max_rows * cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
    ASSERT_OK(w_dev.upload(qw.data(), qw.size()));
    const std::vector<float> x = activations(rng, 1, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
    ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
    const size_t act_row = quant::row_size(act.type, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer qx_dev, cuda::DeviceBuffer::allocate(act_row));
    ASSERT_OK(cuda::quantize_activations(act.type, x_dev.as<float>(), qx_dev.data(), cols, 1, stream));
    stream.synchronize();
    std::vector<uint8_t> qx(act_row);
    ASSERT_OK(qx_dev.download(qx.data(), qx.size()));
    const std::vector<float> y_act = dequantize_ref(act.type, qx.data(), cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev,
                         cuda::DeviceBuffer::allocate((max_rows + kGuardFloats) * sizeof(float)));
    for (const int64_t rows : {int64_t(1), int64_t(3), int64_t(9), int64_t(67), max_rows}) {
      for (const bool fast : {true, false}) {
        const std::string where = std::string(t.name) + " rows=" + std::to_string(rows) + " cols=" +
                                  std::to_string(cols) + (fast ? " stationary/staged" : " rows kernel");
        const size_t y_count = size_t(rows);
        const std::vector<float> poison = poisoned(y_count + kGuardFloats);
        ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));
        ASSERT_OK(cuda::matvec({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols, .x = nullptr,
                                .y = y_dev.as<float>(), .x_quantized = qx_dev.data(), .rows_per_warp = 1,
                                .stationary = fast, .staged = fast},
                               workspace, stream));
        stream.synchronize();
        std::vector<float> got(y_count + kGuardFloats);
        ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));
        ASSERT_TRUE(guard_intact(got, y_count)) << where;
        int64_t bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const double want = double(t.vec_dot(cols, qw.data() + size_t(r) * row_bytes, qx.data()));
          const double tol = quantized_tolerance(t.block_size, w.data() + size_t(r * cols), y_act.data(), cols);
          if (std::fabs(double(got[size_t(r)]) - want) <= tol) continue;  // false for NaN: an unwritten row fails
          if (++bad <= 5) {
            ADD_FAILURE() << where << ": y[" << r << "] = " << got[size_t(r)] << ", reference " << want << ", |diff| "
                          << std::fabs(double(got[size_t(r)]) - want) << " > bound " << tol;
          }
        }
        EXPECT_EQ(bad, 0) << where << ": outputs outside the bound";
      }
    }
  }
}

// The activation-stationary kernel (MatvecArgs::stationary, Q4_K) at every row shape it takes: groups of 4 rows (256,
// 768, 1,280, 1,792 columns: 1, 3, 5, 7 parts per lane), of 2 rows (512, 1,536, 2,560, 3,584) and of 1 row (1,024 to
// 8,192 in steps of 1,024: 1 to 8 parts), and at 2,816 and 9,216 columns, which it does not take (the rows kernel
// runs).
TEST(CudaMatvec, StationaryMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_single_vector_products(Type::Q4_K, {256, 768, 1280, 1792, 512, 1536, 2560, 3584, 1024, 2048, 3072, 4096, 5120,
                                             6144, 7168, 8192, 2816, 9216},
                                kSeed ^ 0x57a7);
}
// The same shapes for Q6_K (the output matrix and some layers' attn_v and ffn_down of llama.cpp's Q4_K_M mix): its
// 210-byte blocks put rows at 2-byte alignment only (768 columns: 630 bytes a row).
TEST(CudaMatvec, StationaryQ6KMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_single_vector_products(
      Type::Q6_K,
      {256, 768, 1280, 1792, 512, 1536, 2560, 3584, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 2816, 9216},
      kSeed ^ 0x6b6b);
}

// Products of 2 to 8 vectors (the decode of several sessions at once) of `type` with MatvecArgs::stationary and staged
// set, at each of `cols` and `rows` rows: each vector's outputs bit for bit those of a launch of that vector alone
// (which the single-vector tests check against the reference), except at `other` columns, which the kernel does not
// take for several vectors (only the guard floats are checked there); outputs between guard floats.
void expect_vectors_equal_one_at_a_time(Type type, std::initializer_list<int64_t> col_list, int64_t other,
                                        int64_t rows, uint64_t seed) {
  const TypeTraits& act = quant::traits(quant::traits(type).vec_dot_type);
  Rng rng(seed);
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::MatvecWorkspace workspace;  // not used: x_quantized
  constexpr int64_t kMaxN = cuda::kMaxMatvecVectors;
  for (const int64_t cols : col_list) {
    const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, rows * cols), cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
    ASSERT_OK(w_dev.upload(qw.data(), qw.size()));
    const std::vector<float> x = activations(rng, kMaxN, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
    ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
    const size_t act_row = quant::row_size(act.type, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer qx_dev, cuda::DeviceBuffer::allocate(act_row * size_t(kMaxN)));
    ASSERT_OK(cuda::quantize_activations(act.type, x_dev.as<float>(), qx_dev.data(), cols, kMaxN, stream));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev,
                         cuda::DeviceBuffer::allocate((kMaxN * rows + kGuardFloats) * sizeof(float)));
    // Each vector alone.
    std::vector<float> alone(size_t(kMaxN * rows));
    for (int64_t v = 0; v < kMaxN; ++v) {
      ASSERT_OK(cuda::matvec({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols, .x = nullptr,
                              .y = y_dev.as<float>(), .x_quantized = qx_dev.as<uint8_t>() + size_t(v) * act_row,
                              .stationary = true, .staged = true},
                             workspace, stream));
      stream.synchronize();
      ASSERT_OK(y_dev.download(alone.data() + size_t(v * rows), size_t(rows) * sizeof(float)));
    }
    for (const int64_t n : {2, 3, 4, 5, 8}) {
      const std::string where = std::string(quant::type_name(type)) + " cols=" + std::to_string(cols) +
                                " n_vectors=" + std::to_string(n);
      const size_t y_count = size_t(n * rows);
      const std::vector<float> poison = poisoned(y_count + kGuardFloats);
      ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));
      ASSERT_OK(cuda::matvec({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols, .x = nullptr,
                              .y = y_dev.as<float>(), .n_vectors = n, .x_quantized = qx_dev.data(),
                              .stationary = true, .staged = true},
                             workspace, stream));
      stream.synchronize();
      std::vector<float> got(y_count + kGuardFloats);
      ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));
      ASSERT_TRUE(guard_intact(got, y_count)) << where;
      if (cols == other) continue;  // another kernel for several vectors than for one: no claim of equal bits
      EXPECT_EQ(std::memcmp(got.data(), alone.data(), y_count * sizeof(float)), 0) << where;
    }
  }
}

// The stationary kernel (Q4_K, Q6_K) for several vectors at every row shape it takes for one, and at 2,816 columns.
TEST(CudaMatvec, StationaryVectorsEqualOneAtATime) {
  SKIP_WITHOUT_GPU();
  expect_vectors_equal_one_at_a_time(Type::Q4_K, {256, 768, 1792, 512, 1536, 3584, 1024, 2048, 3072, 4096, 8192, 2816},
                                     2816, 523, kSeed ^ 0x57b0);
  expect_vectors_equal_one_at_a_time(Type::Q6_K, {256, 768, 1792, 512, 1536, 3584, 1024, 2048, 3072, 4096, 8192, 2816},
                                     2816, 523, kSeed ^ 0x57b6);
}

// MatvecArgs::split (a merged q|k|v matrix into three buffers): for 1, 3, 4 and 8 vectors, each part's outputs bit for
// bit a launch of its rows alone into its own buffer, nothing written past a part's [n_vectors, rows] (guard floats):
// Q4_K on the stationary kernel (the split in its one launch; 2,048 columns as q|k|v of the 30B-A3B geometry, 1,536),
// Q8_0 and F16 (a launch per part). A split out of order, past the rows or without both outputs is refused.
TEST(CudaMatvec, SplitEqualsPartsAlone) {
  SKIP_WITHOUT_GPU();
  Rng rng(kSeed + 95);
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::MatvecWorkspace workspace, cuda::MatvecWorkspace::create(2048, cuda::kMaxMatvecVectors));
  constexpr int64_t kMaxN = 8;
  for (const auto& [type, cols, at0, at1, rows] :
       {std::tuple<Type, int64_t, int64_t, int64_t, int64_t>{Type::Q4_K, 2048, 4096, 4608, 5120},
        {Type::Q4_K, 1536, 48, 64, 104}, {Type::Q8_0, 2048, 256, 288, 320}, {Type::F16, 1024, 64, 80, 96}}) {
    const std::vector<float> wf = gaussian(rng, rows * cols);
    const std::vector<uint8_t> qw = quantize_ref(type, wf, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
    ASSERT_OK(w_dev.upload(qw.data(), qw.size()));
    const std::vector<float> x = activations(rng, kMaxN, cols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
    ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
    const int64_t bounds[4] = {0, at0, at1, rows};
    const size_t row_bytes = quant::row_size(type, cols);
    for (const int64_t n : {1, 3, 4, 8}) {
      const std::string where = std::string(quant::type_name(type)) + " cols=" + std::to_string(cols) +
                                " n_vectors=" + std::to_string(n);
      std::vector<cuda::DeviceBuffer> y;  // the split's three outputs, each with guard floats after it
      std::vector<std::vector<float>> want;
      for (int p = 0; p < 3; ++p) {
        const int64_t part_rows = bounds[p + 1] - bounds[p];
        const std::vector<float> poison = poisoned(size_t(n * part_rows) + kGuardFloats);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer alone, cuda::DeviceBuffer::allocate(poison.size() * sizeof(float)));
        ASSERT_OK(alone.upload(poison.data(), poison.size() * sizeof(float)));
        ASSERT_OK(cuda::matvec({.type = type, .weights = w_dev.as<uint8_t>() + size_t(bounds[p]) * row_bytes,
                                .rows = part_rows, .cols = cols, .x = x_dev.as<float>(), .y = alone.as<float>(),
                                .n_vectors = n, .stationary = true, .staged = true},
                               workspace, stream));
        stream.synchronize();
        want.emplace_back(poison.size());
        ASSERT_OK(alone.download(want.back().data(), poison.size() * sizeof(float)));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer out, cuda::DeviceBuffer::allocate(poison.size() * sizeof(float)));
        ASSERT_OK(out.upload(poison.data(), poison.size() * sizeof(float)));
        y.push_back(std::move(out));
      }
      ASSERT_OK(cuda::matvec({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols,
                              .x = x_dev.as<float>(), .y = y[0].as<float>(), .n_vectors = n, .stationary = true,
                              .staged = true, .split = {at0, at1}, .y_split = {y[1].as<float>(), y[2].as<float>()}},
                             workspace, stream));
      stream.synchronize();
      for (int p = 0; p < 3; ++p) {
        std::vector<float> got(want[size_t(p)].size());
        ASSERT_OK(y[size_t(p)].download(got.data(), got.size() * sizeof(float)));
        const size_t outputs = got.size() - kGuardFloats;
        for (size_t i = 0; i < outputs; ++i) ASSERT_FALSE(std::isnan(got[i])) << where << " part " << p << " at " << i;
        EXPECT_EQ(0, std::memcmp(got.data(), want[size_t(p)].data(), got.size() * sizeof(float)))
            << where << ": part " << p;
      }
    }
    for (const auto& [a, b, second] : {std::tuple<int64_t, int64_t, bool>{at1, at0, true}, {at0, rows, true},
                                       {0, at1, true}, {at0, at1, false}}) {
      const Status st = cuda::matvec({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols,
                                      .x = x_dev.as<float>(), .y = x_dev.as<float>(), .n_vectors = 1,
                                      .split = {a, b},
                                      .y_split = {x_dev.as<float>(), second ? x_dev.as<float>() : nullptr}},
                                     workspace, stream);
      EXPECT_FALSE(st.ok()) << "split {" << a << ", " << b << "}";
      EXPECT_NE(st.message().find("split"), std::string::npos) << st.message();
    }
  }
}

// The staged kernel (Q8_0) for several vectors: rows of 512 to 2,048 columns (1-4 items per lane; 4 vectors a launch,
// so 5 and 8 take two), over enough rows that the warps loop (the LM head's 2,048 columns: ~4,200 rows per wave on an
// H200), and 4,096 columns, which it takes for one vector only.
TEST(CudaMatvec, StagedVectorsEqualOneAtATime) {
  SKIP_WITHOUT_GPU();
  expect_vectors_equal_one_at_a_time(Type::Q8_0, {512, 1024, 1536, 2048, 4096}, 4096, 9001, kSeed ^ 0x57b1);
}

// The staged kernel (MatvecArgs::staged, Q8_0): rows of 256 to 11,264 columns (whole 16-byte units up to 12 KiB), and
// rows it does not take (288 columns: 306 bytes; 11,520: over 12 KiB).
TEST(CudaMatvec, StagedMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_single_vector_products(Type::Q8_0, {256, 512, 2048, 2816, 4096, 11264, 288, 11520}, kSeed ^ 0x57a8);
}

// The staged kernel's grid is one wave of CTAs whose warps loop over the rows through a ring of row buffers: rows
// enough for several rows per warp (the LM head's 2,048 columns: 8 CTAs per SM, ~4,200 rows per wave on an H200;
// 11,264 columns: 1 CTA per SM, ~530), so that every buffer is refilled.
TEST(CudaMatvec, StagedLoopsOverManyRows) {
  SKIP_WITHOUT_GPU();
  expect_single_vector_products(Type::Q8_0, {2048}, kSeed ^ 0x57a9, 20011);
  expect_single_vector_products(Type::Q8_0, {11264}, kSeed ^ 0x57aa, 3001);
}

// ---- quantize_activations ---------------------------------------------------------------------------------

// Rows of Gaussian activations with outliers, then edge blocks written over the start of vector 0: an
// all-zero block, equal magnitudes of both signs (the first one decides Q8_K's sign), a constant block,
// values whose Q8 scale is an fp16 subnormal, values near the fp16 limit.
std::vector<float> quantizer_input(Rng& rng, int64_t n_vectors, int64_t cols, int64_t block) {
  std::vector<float> x = activations(rng, n_vectors, cols);
  const int64_t blocks = cols / block;
  auto fill = [&](int64_t b, auto&& f) {
    if (b >= blocks) return;
    for (int64_t i = 0; i < block; ++i) x[size_t(b * block + i)] = f(i);
  };
  fill(0, [](int64_t) { return 0.0f; });
  fill(1, [&](int64_t i) { return i == 3 ? -2.5f : (i == 7 ? 2.5f : 0.25f * rng.gaussian()); });
  fill(2, [&](int64_t i) { return i == 3 ? 2.5f : (i == 7 ? -2.5f : 0.25f * rng.gaussian()); });
  fill(3, [](int64_t) { return 7.0f; });
  fill(4, [&](int64_t) { return 1e-6f * rng.gaussian(); });
  fill(5, [&](int64_t) { return 6e4f * rng.gaussian(); });
  return x;
}

TEST(CudaQuantizeActivations, ByteIdenticalWithReference) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 1);
  for (Type act_type : {Type::Q8_0, Type::Q8_1, Type::Q8_K}) {
    const TypeTraits& a = quant::traits(act_type);
    for (int64_t cols : {int64_t(256), int64_t(2816), int64_t(4096)}) {
      for (int64_t n_vectors : {int64_t(1), int64_t(8)}) {
        const std::string where = std::string(a.name) + " cols=" + std::to_string(cols) +
                                  " n_vectors=" + std::to_string(n_vectors);
        const std::vector<float> x = quantizer_input(rng, n_vectors, cols, a.block_size);
        const size_t row = quant::row_size(act_type, cols);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer q_dev, cuda::DeviceBuffer::allocate(row * size_t(n_vectors)));
        ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
        ASSERT_OK(cuda::quantize_activations(act_type, x_dev.as<float>(), q_dev.data(), cols, n_vectors, stream));
        stream.synchronize();
        std::vector<uint8_t> got(row * size_t(n_vectors));
        ASSERT_OK(q_dev.download(got.data(), got.size()));
        for (int64_t v = 0; v < n_vectors; ++v) {
          const std::vector<float> xv(x.begin() + v * cols, x.begin() + (v + 1) * cols);
          const std::vector<uint8_t> want = quantize_ref(act_type, xv, cols);
          const uint8_t* g = got.data() + size_t(v) * row;
          const auto mismatch = std::mismatch(want.begin(), want.end(), g);
          if (mismatch.first == want.end()) continue;
          const size_t byte = size_t(mismatch.first - want.begin());
          ADD_FAILURE() << where << " vector " << v << ": bytes differ first in block " << byte / a.type_size
                        << " byte " << byte % a.type_size << ": reference 0x" << std::hex << int(*mismatch.first)
                        << ", kernel 0x" << int(*mismatch.second) << std::dec;
        }
      }
    }
  }
}

// ---- argument checks (no device needed) -------------------------------------------------------------------------

TEST(CudaMatvec, RejectsBadArguments) {
  // Validation happens before any device call, so host pointers stand in for device ones and the stream and
  // workspace may be empty: none of these calls reaches a kernel.
  alignas(16) static float fake[64];
  cuda::Stream stream;
  cuda::MatvecWorkspace workspace;
  auto call = [&](cuda::MatvecArgs args) { return cuda::matvec(args, workspace, stream); };
  const cuda::MatvecArgs ok{.type = Type::Q4_0, .weights = fake, .rows = 7, .cols = 256, .x = fake, .y = fake,
                            .n_vectors = 1};

  cuda::MatvecArgs a = ok;
  a.type = Type::Q8_K;  // an activation format: no weight kernel
  expect_error(call(a), "no CUDA kernel for Q8_K");
  a.type = Type::Q8_1;
  expect_error(call(a), "no CUDA kernel for Q8_1");
  a.type = Type(4);  // an id ggml retired
  expect_error(call(a), "unknown");
  a = ok;
  a.cols = 100;
  expect_error(call(a), "cols=100");
  a = ok;
  a.rows = 0;
  expect_error(call(a), "rows=0");
  a = ok;
  a.n_vectors = cuda::kMaxMatvecVectors + 1;
  expect_error(call(a), "n_vectors");
  a = ok;
  a.weights = reinterpret_cast<const uint8_t*>(fake) + 2;
  expect_error(call(a), "16-byte aligned");
  a = ok;
  a.y = nullptr;
  expect_error(call(a), "null");
  a = ok;
  a.type = Type::F32;
  a.x_quantized = fake;
  expect_error(call(a), "x_quantized");
  // Everything else valid, but the (empty) workspace has no room for the quantized activations.
  expect_error(call(ok), "workspace");
  expect_error(cuda::quantize_activations(Type::Q4_0, fake, fake, 256, 1, stream), "not an activation format");
  expect_error(cuda::quantize_activations(Type::Q8_K, fake, fake, 100, 1, stream), "cols=100");
  a = ok;
  a.rows_per_warp = 3;
  expect_error(call(a), "rows_per_warp=3");
  const cuda::GroupedMatvecArgs grouped{.type = Type::Q4_K, .items = reinterpret_cast<const cuda::GroupItem*>(fake),
                                        .n_items = 1, .rows = 7, .cols = 256, .x = fake, .y = fake,
                                        .rows_per_warp = 8};
  expect_error(cuda::grouped_matvec(grouped, stream), "rows_per_warp=8");
  EXPECT_TRUE(cuda::has_matvec_rows_kernel(Type::Q4_K));
  EXPECT_FALSE(cuda::has_matvec_rows_kernel(Type::F32));
}

// ---- matmul_float ----------------------------------------------------------------------------------------------

// The float matrix-matrix product (matmul_float.cu: the prefill router) within float_tolerance of a double dot
// product of the exactly representable weights with the float32 activations, for F32, F16 and BF16 at shapes that
// cut every tile edge (32 weight rows, 16 activation rows, K-steps of 128 in a ring of 4): rows 1, 65, 128; cols 1,
// 37, 1001 (8 steps, the last partial; rows not 16-byte aligned, staged at their offsets), 2048; n 9, 64, 130.
// Outputs sit before poisoned guard floats: every output written, nothing past the end. Bad arguments fail.
TEST(CudaMatmulFloat, MatchesReference) {
  SKIP_WITHOUT_GPU();
  Rng rng(kSeed ^ 0xf10a7);
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  for (Type type : {Type::F32, Type::F16, Type::BF16}) {
    for (int64_t cols : {int64_t(1), int64_t(37), int64_t(1001), int64_t(2048)}) {
      for (int64_t rows : {int64_t(1), int64_t(65), int64_t(128)}) {
        for (int64_t n : {int64_t(9), int64_t(64), int64_t(130)}) {
          const std::string where = std::string(quant::type_name(type)) + " rows=" + std::to_string(rows) +
                                    " cols=" + std::to_string(cols) + " n=" + std::to_string(n);
          const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, size_t(rows * cols)), cols);
          const std::vector<float> w = dequantize_ref(type, qw.data(), rows * cols);
          const std::vector<float> x = activations(rng, n, cols);
          const size_t y_count = size_t(n * rows);
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer w_dev, cuda::DeviceBuffer::allocate(qw.size()));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev,
                               cuda::DeviceBuffer::allocate((y_count + kGuardFloats) * sizeof(float)));
          ASSERT_OK(w_dev.upload(qw.data(), qw.size()));
          ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
          const std::vector<float> poison = poisoned(y_count + kGuardFloats);
          ASSERT_OK(y_dev.upload(poison.data(), poison.size() * sizeof(float)));
          ASSERT_OK(cuda::matmul_float({.type = type, .weights = w_dev.data(), .rows = rows, .cols = cols,
                                        .x = x_dev.data(), .y = y_dev.as<float>(), .n = n},
                                       stream));
          stream.synchronize();
          std::vector<float> got(y_count + kGuardFloats);
          ASSERT_OK(y_dev.download(got.data(), got.size() * sizeof(float)));
          ASSERT_TRUE(guard_intact(got, y_count)) << where;
          int64_t bad = 0;
          for (int64_t v = 0; v < n; ++v) {
            for (int64_t r = 0; r < rows; ++r) {
              double want;
              const double tol = float_tolerance(w.data() + size_t(r * cols), x.data() + size_t(v * cols), cols, &want);
              const float g = got[size_t(v * rows + r)];
              if (std::fabs(double(g) - want) <= tol) continue;  // false for NaN: an unwritten output fails
              if (++bad <= 5) {
                ADD_FAILURE() << where << ": y[" << v << "][" << r << "] = " << g << ", reference " << want
                              << " > bound " << tol;
              }
            }
          }
          EXPECT_EQ(bad, 0) << where;
        }
      }
    }
  }
  // Bad arguments: a Status naming the problem, nothing queued.
  cuda::MatmulArgs a{.type = Type::Q4_K, .weights = &rng, .rows = 4, .cols = 16, .x = &rng, .y = nullptr, .n = 9};
  const Status not_float = cuda::matmul_float(a, stream);
  EXPECT_NE(not_float.message().find("not F32, F16 or BF16"), std::string::npos) << not_float.message();
  a.type = Type::F32;
  const Status null_y = cuda::matmul_float(a, stream);
  EXPECT_NE(null_y.message().find("null"), std::string::npos) << null_y.message();
  alignas(16) static float fake[16];
  a.y = fake;
  a.x = fake + 1;  // the staged copies read whole 16-byte lines from x's start
  const Status unaligned = cuda::matmul_float(a, stream);
  EXPECT_NE(unaligned.message().find("16-byte aligned"), std::string::npos) << unaligned.message();
  EXPECT_FALSE(cuda::has_matmul_float(Type::Q8_0));
}

// ---- grouped_matvec ---------------------------------------------------------------------------------------------

// One single-row item per entry of expert_of (item i: row0 i, n 1), pointing at expert e's weights w[per_expert e + p]
// (p < per_expert: gate, up[, down]); an expert of -1 gives null weights ("not on this device").
std::vector<cuda::GroupItem> expert_items(std::span<const int32_t> expert_of, const std::vector<cuda::DeviceBuffer>& w,
                                          int per_expert) {
  std::vector<cuda::GroupItem> items(expert_of.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const int32_t e = expert_of[i];
    for (int p = 0; p < per_expert; ++p) items[i].w[p] = e < 0 ? nullptr : w[size_t(per_expert * e + p)].data();
    items[i].row0 = int32_t(i);
    items[i].n = 1;
  }
  return items;
}

// grouped_matvec against matvec: each item's rows of each part are the plain product of that part's weights with the
// item's activation row (x_rows), bit for bit (the same kernel on the same bytes); an item whose weights are null
// ("not on this device") leaves its rows as they were; gate and up land y_part_stride apart. Q4_K with the default
// kernel, the rows kernel at 1, 2 and 4 rows per warp and the stationary kernel, its items read before or after
// waiting (items_settled; the decode path of the synthetic 30B-A3B model), and Q8_0.
// With single_x every row reads activation row 0 whatever x_rows says (the rows would differ if it were read).
TEST(CudaMatvec, GroupedMatchesSingleProducts) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::MatvecWorkspace workspace;  // not used: x_quantized
  Rng rng(kSeed + 77);
  constexpr int64_t kRows = 768, kCols = 2048, kExperts = 3, kActRows = 4;
  auto download = [](const cuda::DeviceBuffer& buf, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(buf.download(v.data(), n * sizeof(float)).ok());
    return v;
  };
  const int32_t expert_of[] = {0, 2, 1, 0, -1};  // item -> expert; -1: null weights
  const int32_t act_row_of[] = {3, 0, 2, 1, 0};  // output row -> activation row
  constexpr int64_t kItems = int64_t(std::size(expert_of));
  for (const Type type : {Type::Q4_K, Type::Q8_0}) {
    const size_t row_bytes = quant::row_size(type, kCols);
    const Type act_type = quant::traits(type).vec_dot_type;
    const size_t act_row = quant::row_size(act_type, kCols);
    std::vector<cuda::DeviceBuffer> w;  // [expert][part]
    for (int64_t i = 0; i < kExperts * 2; ++i) {
      const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, kRows * kCols), kCols);
      ASSERT_EQ(qw.size(), size_t(kRows) * row_bytes);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(qw.size()));
      ASSERT_OK(buf.upload(qw.data(), qw.size()));
      w.push_back(std::move(buf));
    }
    const std::vector<float> x = activations(rng, kActRows, kCols);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer x_dev, cuda::DeviceBuffer::allocate(x.size() * sizeof(float)));
    ASSERT_OK(x_dev.upload(x.data(), x.size() * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer xq, cuda::DeviceBuffer::allocate(act_row * kActRows));
    ASSERT_OK(cuda::quantize_activations(act_type, x_dev.as<float>(), xq.data(), kCols, kActRows, stream));
    const std::vector<cuda::GroupItem> items = expert_items(expert_of, w, 2);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items_dev, cuda::DeviceBuffer::allocate(sizeof(cuda::GroupItem) * kItems));
    ASSERT_OK(items_dev.upload(items.data(), sizeof(cuda::GroupItem) * kItems));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer rows_dev, cuda::DeviceBuffer::allocate(sizeof(act_row_of)));
    ASSERT_OK(rows_dev.upload(act_row_of, sizeof(act_row_of)));
    const size_t y_count = size_t(2 * kItems * kRows);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer y_dev, cuda::DeviceBuffer::allocate(y_count * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer one_dev, cuda::DeviceBuffer::allocate(kRows * sizeof(float)));
    struct Arm {
      int rows_per_warp;
      bool stationary;
      bool settled;
    };
    std::vector<Arm> arms;
    for (const int rows_per_warp : rows_per_warp_arms(type, 1)) arms.push_back({rows_per_warp, false, false});
    if (cuda::has_matvec_stationary_kernel(type)) {
      arms.push_back({1, true, false});
      arms.push_back({1, true, true});
    }
    for (const auto& [rows_per_warp, stationary, settled] : arms) {
      for (const bool single : {false, true}) {
        const std::string where = std::string(quant::type_name(type)) + " rows_per_warp=" +
                                  std::to_string(rows_per_warp) + (stationary ? " stationary" : "") +
                                  (settled ? " items_settled" : "") + (single ? " single_x" : "");
        const std::vector<float> poison = poisoned(y_count);
        ASSERT_OK(y_dev.upload(poison.data(), y_count * sizeof(float)));
        ASSERT_OK(cuda::grouped_matvec({.type = type, .items = items_dev.as<cuda::GroupItem>(), .n_items = kItems,
                                        .part = 0, .n_parts = 2, .rows = kRows, .cols = kCols, .x = xq.data(),
                                        .x_rows = rows_dev.as<int32_t>(), .single_x = single, .y = y_dev.as<float>(),
                                        .y_part_stride = kItems * kRows, .max_n = 1, .rows_per_warp = rows_per_warp,
                                        .stationary = stationary, .items_settled = settled},
                                       stream));
        stream.synchronize();
        const std::vector<float> got = download(y_dev, y_count);
        for (int64_t i = 0; i < kItems; ++i) {
          for (int p = 0; p < 2; ++p) {
            const float* rows_got = got.data() + size_t((p * kItems + i) * kRows);
            if (expert_of[i] < 0) {
              for (int64_t r = 0; r < kRows; ++r) {
                ASSERT_TRUE(std::isnan(rows_got[r])) << where << ": item " << i << " (null weights) row " << r;
              }
              continue;
            }
            ASSERT_OK(cuda::matvec({.type = type, .weights = w[size_t(2 * expert_of[i] + p)].data(), .rows = kRows,
                                    .cols = kCols, .y = one_dev.as<float>(),
                                    .x_quantized = static_cast<const uint8_t*>(xq.data()) +
                                                   size_t(single ? 0 : act_row_of[i]) * act_row,
                                    .rows_per_warp = rows_per_warp, .stationary = stationary},
                                   workspace, stream));
            stream.synchronize();
            const std::vector<float> want = download(one_dev, size_t(kRows));
            EXPECT_EQ(0, std::memcmp(rows_got, want.data(), size_t(kRows) * sizeof(float)))
                << where << ": item " << i << " part " << p;
          }
        }
      }
    }
  }
}

// Decode's SwiGLU folded into the expert products (GroupedMatvecArgs::swiglu, x_float) against the launches it
// replaces, bit for bit: gate/up with swiglu = true writes what the plain gate/up launch followed by cuda::swiglu
// writes (each row's sums are the same butterfly over the lanes, and the same silu_mul); the down projection from
// those float rows with x_float writes what it writes from quantize_activations' Q8_K bytes of them, its items read
// before (items_settled) or after waiting. An item with null weights leaves its rows as they were. Shapes (hidden E,
// expert width F): groups of 1, 2 and 4 rows on either side; gate/up Q4_K, down Q4_K or Q6_K (llama.cpp's Q4_K_M mix
// gives half the layers' down Q6_K). Bad combinations are refused with a Status.
TEST(CudaMatvec, SwigluInProductsMatchesSeparateLaunches) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 91);
  auto download = [](const cuda::DeviceBuffer& buf, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(buf.download(v.data(), n * sizeof(float)).ok());
    return v;
  };
  auto upload = [](const std::vector<float>& v) {
    auto buf = cuda::DeviceBuffer::allocate(v.size() * sizeof(float));
    EXPECT_TRUE(buf.ok() && buf->upload(v.data(), v.size() * sizeof(float)).ok());
    return std::move(buf).value();
  };
  const int32_t expert_of[] = {1, 0, -1, 2, 1};  // item -> expert; -1: null weights
  const int32_t act_row_of[] = {2, 0, 1, 3, 1};  // item -> activation row
  constexpr int64_t kItems = int64_t(std::size(expert_of)), kExperts = 3, kActRows = 4;
  const Type type = Type::Q4_K;  // gate and up
  for (const Type down_type : {Type::Q4_K, Type::Q6_K})
    for (const auto& [E, F] : {std::pair<int64_t, int64_t>{2048, 768}, {1024, 1536}, {4096, 256}, {512, 2048}}) {
      ASSERT_TRUE(cuda::matvec_stationary_fits(type, E) && cuda::matvec_stationary_fits(down_type, F));
      const std::string shape =
          "down " + std::string(quant::traits(down_type).name) + " E=" + std::to_string(E) + " F=" + std::to_string(F);
      std::vector<cuda::DeviceBuffer> w;  // [expert][gate, up, down]
      for (int64_t i = 0; i < kExperts * 3; ++i) {
        const bool down = i % 3 == 2;
        const std::vector<uint8_t> qw = quantize_ref(down ? down_type : type, gaussian(rng, E * F), down ? F : E);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(qw.size()));
        ASSERT_OK(buf.upload(qw.data(), qw.size()));
        w.push_back(std::move(buf));
      }
      const std::vector<cuda::GroupItem> items = expert_items(expert_of, w, 3);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items_dev,
                           cuda::DeviceBuffer::allocate(sizeof(cuda::GroupItem) * kItems));
      ASSERT_OK(items_dev.upload(items.data(), sizeof(cuda::GroupItem) * kItems));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer rows_dev, cuda::DeviceBuffer::allocate(sizeof(act_row_of)));
      ASSERT_OK(rows_dev.upload(act_row_of, sizeof(act_row_of)));
      const cuda::DeviceBuffer x_dev = upload(activations(rng, kActRows, E));
      const size_t act_e = quant::row_size(Type::Q8_K, E), act_f = quant::row_size(Type::Q8_K, F);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer xq, cuda::DeviceBuffer::allocate(act_e * kActRows));
      ASSERT_OK(cuda::quantize_activations(Type::Q8_K, x_dev.as<float>(), xq.data(), E, kActRows, stream));
      const cuda::GroupedMatvecArgs gate_up{.type = type,
                                            .items = items_dev.as<cuda::GroupItem>(),
                                            .n_items = kItems,
                                            .part = 0,
                                            .n_parts = 2,
                                            .rows = F,
                                            .cols = E,
                                            .x = xq.data(),
                                            .x_rows = rows_dev.as<int32_t>(),
                                            .max_n = 1,
                                            .stationary = true};
      const cuda::GroupedMatvecArgs down{.type = down_type,
                                         .items = items_dev.as<cuda::GroupItem>(),
                                         .n_items = kItems,
                                         .part = 2,
                                         .n_parts = 1,
                                         .rows = E,
                                         .cols = F,
                                         .max_n = 1,
                                         .stationary = true};

      // The separate launches: gate/up, swiglu, quantize_activations, down.
      cuda::DeviceBuffer gu = upload(std::vector<float>(size_t(2 * kItems * F), 0.0f));
      cuda::GroupedMatvecArgs a = gate_up;
      a.y = gu.as<float>();
      a.y_part_stride = kItems * F;
      ASSERT_OK(cuda::grouped_matvec(a, stream));
      ASSERT_OK(cuda::swiglu(gu.as<float>(), gu.as<float>() + kItems * F, kItems * F, stream));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer hq, cuda::DeviceBuffer::allocate(act_f * kItems));
      ASSERT_OK(cuda::quantize_activations(Type::Q8_K, gu.as<float>(), hq.data(), F, kItems, stream));
      cuda::DeviceBuffer want_down = upload(poisoned(size_t(kItems * E)));
      a = down;
      a.x = hq.data();
      a.y = want_down.as<float>();
      ASSERT_OK(cuda::grouped_matvec(a, stream));
      stream.synchronize();
      const std::vector<float> want_h = download(gu, size_t(kItems * F));
      const std::vector<float> want_y = download(want_down, size_t(kItems * E));

      // The folded launches.
      cuda::DeviceBuffer h = upload(poisoned(size_t(kItems * F)));
      a = gate_up;
      a.y = h.as<float>();
      a.swiglu = true;
      ASSERT_OK(cuda::grouped_matvec(a, stream));
      stream.synchronize();
      // Each item's rows of got ([kItems, width]) bit for bit want's; a null item's still NaN.
      auto expect_rows = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t width,
                             const std::string& what) {
        for (int64_t i = 0; i < kItems; ++i) {
          const float* row = got.data() + size_t(i * width);
          if (expert_of[i] < 0) {
            for (int64_t r = 0; r < width; ++r)
              ASSERT_TRUE(std::isnan(row[r])) << what << ": item " << i << " row " << r;
            continue;
          }
          EXPECT_EQ(0, std::memcmp(row, want.data() + size_t(i * width), size_t(width) * sizeof(float)))
              << what << ": rows of item " << i;
        }
      };
      expect_rows(download(h, size_t(kItems * F)), want_h, F, shape + " swiglu");
      // The same launch with the weights streamed through shared memory (GroupedMatvecArgs::bulk; the stationary kernel
      // where the row or the GPU does not take it: the same bits either way).
      cuda::DeviceBuffer h_bulk = upload(poisoned(size_t(kItems * F)));
      a.y = h_bulk.as<float>();
      a.bulk = true;
      ASSERT_OK(cuda::grouped_matvec(a, stream));
      stream.synchronize();
      expect_rows(download(h_bulk, size_t(kItems * F)), want_h, F, shape + " swiglu, bulk");
      for (const bool settled : {false, true}) {
        cuda::DeviceBuffer y = upload(poisoned(size_t(kItems * E)));
        a = down;
        a.x = h.data();
        a.x_float = true;
        a.items_settled = settled;
        a.y = y.as<float>();
        ASSERT_OK(cuda::grouped_matvec(a, stream));
        stream.synchronize();
        expect_rows(download(y, size_t(kItems * E)), want_y, E,
                    shape + " down from float input" + (settled ? ", items_settled" : ""));
      }
    }
}

// The bulk launches over more rows than one wave of CTAs stages at once (the batched decode of several sessions: one
// item per token and slot): the SwiGLU gate/up and the down projection of its float rows (x_float), against the
// stationary kernel's, bit for bit: each CTA's rows go through its ring of stages more than once and straddle items;
// items share experts, read activation rows out of order, write output rows out of order, and some are null (their
// rows keep the poison). Enough items that a CTA of the H200's one wave takes more chunks than it has stages.
TEST(CudaMatvec, BulkRingEqualsStationary) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 93);
  const Type type = Type::Q4_K;
  constexpr int64_t kItems = 72, kExperts = 9, kActRows = 8;
  std::vector<int32_t> expert_of(kItems), act_row_of(kItems);
  for (int64_t i = 0; i < kItems; ++i) {
    expert_of[size_t(i)] = i % 17 == 5 ? -1 : int32_t((i * 7) % kExperts);
    act_row_of[size_t(i)] = int32_t((i * 5 + 3) % kActRows);
  }
  auto upload = [](const std::vector<float>& v) {
    auto buf = cuda::DeviceBuffer::allocate(v.size() * sizeof(float));
    EXPECT_TRUE(buf.ok() && buf->upload(v.data(), v.size() * sizeof(float)).ok());
    return std::move(buf).value();
  };
  auto download = [](const cuda::DeviceBuffer& buf, size_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(buf.download(v.data(), n * sizeof(float)).ok());
    return v;
  };
  // (gate/up rows, columns): the bulk gate/up shapes with one, one and two rows per part group, and one it leaves to
  // the stationary kernel (4,096 columns) whose down projection (256 columns) the ring takes.
  for (const auto& [E, F] : {std::pair<int64_t, int64_t>{2048, 768}, {1024, 1536}, {512, 2048}, {4096, 256}}) {
    const std::string shape = "E=" + std::to_string(E) + " F=" + std::to_string(F);
    std::vector<cuda::DeviceBuffer> w;  // [expert][gate, up, down]
    for (int64_t i = 0; i < kExperts * 3; ++i) {
      const std::vector<uint8_t> qw = quantize_ref(type, gaussian(rng, E * F), i % 3 == 2 ? F : E);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(qw.size()));
      ASSERT_OK(buf.upload(qw.data(), qw.size()));
      w.push_back(std::move(buf));
    }
    std::vector<cuda::GroupItem> items = expert_items(expert_of, w, 3);
    for (int64_t i = 0; i < kItems; ++i) items[size_t(i)].row0 = int32_t(kItems - 1 - i);  // outputs reversed
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items_dev, cuda::DeviceBuffer::allocate(sizeof(cuda::GroupItem) * kItems));
    ASSERT_OK(items_dev.upload(items.data(), sizeof(cuda::GroupItem) * kItems));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer rows_dev, cuda::DeviceBuffer::allocate(sizeof(int32_t) * kItems));
    ASSERT_OK(rows_dev.upload(act_row_of.data(), sizeof(int32_t) * kItems));
    const cuda::DeviceBuffer x_dev = upload(activations(rng, kActRows, E));
    const size_t act_row = quant::row_size(Type::Q8_K, E);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer xq, cuda::DeviceBuffer::allocate(act_row * kActRows));
    ASSERT_OK(cuda::quantize_activations(Type::Q8_K, x_dev.as<float>(), xq.data(), E, kActRows, stream));
    std::vector<float> h[2], y[2];  // stationary, bulk
    for (const bool bulk : {false, true}) {
      cuda::DeviceBuffer h_dev = upload(poisoned(size_t(kItems * F)));
      ASSERT_OK(cuda::grouped_matvec({.type = type, .items = items_dev.as<cuda::GroupItem>(), .n_items = kItems,
                                      .part = 0, .n_parts = 2, .rows = F, .cols = E, .x = xq.data(),
                                      .x_rows = rows_dev.as<int32_t>(), .y = h_dev.as<float>(), .max_n = 1,
                                      .stationary = true, .swiglu = true, .bulk = bulk},
                                     stream));
      // The down projection of the stationary gate/up's rows in both arms (a null item's NaN rows are never read).
      const cuda::DeviceBuffer h_in = upload(h[0].empty() ? std::vector<float>(size_t(kItems * F), 0.0f) : h[0]);
      cuda::DeviceBuffer y_dev = upload(poisoned(size_t(kItems * E)));
      ASSERT_OK(cuda::grouped_matvec({.type = type, .items = items_dev.as<cuda::GroupItem>(), .n_items = kItems,
                                      .part = 2, .n_parts = 1, .rows = E, .cols = F,
                                      .x = bulk ? h_in.data() : h_dev.data(), .y = y_dev.as<float>(), .max_n = 1,
                                      .stationary = true, .items_settled = bulk, .x_float = true, .bulk = bulk},
                                     stream));
      stream.synchronize();
      h[bulk] = download(h_dev, size_t(kItems * F));
      y[bulk] = download(y_dev, size_t(kItems * E));
    }
    for (int64_t i = 0; i < kItems; ++i) {
      const size_t at_h = size_t((kItems - 1 - i) * F), at_y = size_t((kItems - 1 - i) * E);
      if (expert_of[size_t(i)] < 0) {
        for (int64_t r = 0; r < F; ++r) ASSERT_TRUE(std::isnan(h[1][at_h + size_t(r)])) << shape << " item " << i;
        for (int64_t r = 0; r < E; ++r) ASSERT_TRUE(std::isnan(y[1][at_y + size_t(r)])) << shape << " item " << i;
        continue;
      }
      for (int64_t r = 0; r < F; ++r) ASSERT_FALSE(std::isnan(h[0][at_h + size_t(r)])) << shape << " item " << i;
      for (int64_t r = 0; r < E; ++r) ASSERT_FALSE(std::isnan(y[0][at_y + size_t(r)])) << shape << " item " << i;
      EXPECT_EQ(0, std::memcmp(h[1].data() + at_h, h[0].data() + at_h, size_t(F) * sizeof(float)))
          << shape << ": gate/up rows of item " << i;
      EXPECT_EQ(0, std::memcmp(y[1].data() + at_y, y[0].data() + at_y, size_t(E) * sizeof(float)))
          << shape << ": down rows of item " << i;
    }
  }
}

// Expert products that route themselves (GroupedMatvecArgs::route) against route_topk with a table and the launches
// that read its items, bit for bit: the ids, weights (renormalized or not) and slot rows gate/up writes, the SwiGLU
// rows and the down projection's rows (the logits read before or after waiting). Every expert of the layer lies in one
// buffer (256-byte aligned parts, as the model uploads them). Logits: gaussian; in steps of 0.5 (many ties, broken
// by the lower id); with +-0, -inf and one far above the rest. Shapes: the 30B-A3B geometry's rows (2,048 x 768, on
// few experts) and 256-column rows on up to 128 experts.
TEST(CudaMatvec, RouteInProductsMatchesRouteTopk) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  Rng rng(kSeed + 92);
  const Type type = Type::Q4_K;
  // Whether two device buffers hold the same first `bytes` bytes.
  auto same = [](const cuda::DeviceBuffer& a, const cuda::DeviceBuffer& b, size_t bytes) {
    return from_device<uint8_t>(a, bytes) == from_device<uint8_t>(b, bytes);
  };
  auto device = [](const void* data, size_t bytes) {
    auto buf = cuda::DeviceBuffer::allocate(bytes);
    EXPECT_TRUE(buf.ok() && buf->upload(data, bytes).ok());
    return std::move(buf).value();
  };
  auto align256 = [](size_t n) { return (n + 255) / 256 * 256; };
  struct Case {
    int64_t E, F;
    int n_expert, k;
  };
  for (const Case c : {Case{2048, 768, 12, 8}, Case{2048, 768, 9, 3}, Case{256, 256, 128, 8}, Case{256, 256, 100, 4},
                       Case{256, 512, 33, 1}}) {
    const std::string shape = "E=" + std::to_string(c.E) + " F=" + std::to_string(c.F) + " experts=" +
                              std::to_string(c.n_expert) + " k=" + std::to_string(c.k);
    const size_t part_bytes[3] = {align256(quant::row_size(type, c.E) * size_t(c.F)),
                                  align256(quant::row_size(type, c.E) * size_t(c.F)),
                                  align256(quant::row_size(type, c.F) * size_t(c.E))};
    const size_t stride = part_bytes[0] + part_bytes[1] + part_bytes[2];
    std::vector<uint8_t> experts(stride * size_t(c.n_expert), 0);
    for (int e = 0; e < c.n_expert; ++e) {
      size_t off = size_t(e) * stride;
      for (int p = 0; p < 3; ++p) {
        const std::vector<uint8_t> q = quantize_ref(type, gaussian(rng, c.E * c.F), p == 2 ? c.F : c.E);
        std::memcpy(experts.data() + off, q.data(), q.size());
        off += part_bytes[p];
      }
    }
    const cuda::DeviceBuffer experts_dev = device(experts.data(), experts.size());
    std::vector<const void*> table(size_t(c.n_expert) * 3);
    for (int e = 0; e < c.n_expert; ++e) {
      size_t off = size_t(e) * stride;
      for (int p = 0; p < 3; ++p) {
        table[size_t(e) * 3 + size_t(p)] = static_cast<const uint8_t*>(experts_dev.data()) + off;
        off += part_bytes[p];
      }
    }
    const cuda::DeviceBuffer table_dev = device(table.data(), table.size() * sizeof(void*));
    const cuda::DeviceBuffer x_dev = device(activations(rng, 1, c.E).data(), size_t(c.E) * sizeof(float));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer xq, cuda::DeviceBuffer::allocate(quant::row_size(Type::Q8_K, c.E)));
    ASSERT_OK(cuda::quantize_activations(Type::Q8_K, x_dev.as<float>(), xq.data(), c.E, 1, stream));
    const size_t k = size_t(c.k);
    for (int logit_case = 0; logit_case < 3; ++logit_case) {
      std::vector<float> logits = gaussian(rng, c.n_expert);
      if (logit_case == 1) {
        for (float& l : logits) l = std::round(l * 2.0f) / 2.0f;
      } else if (logit_case == 2) {
        for (int e = 0; e < c.n_expert; ++e) {
          if (e % 5 == 1) logits[size_t(e)] = e % 2 ? 0.0f : -0.0f;
          if (e % 7 == 3) logits[size_t(e)] = -INFINITY;
        }
        logits[size_t(c.n_expert / 2)] = 1e30f;
      }
      const cuda::DeviceBuffer logits_dev = device(logits.data(), logits.size() * sizeof(float));
      for (const bool normalize : {true, false}) {
        const std::string where = shape + " logits case " + std::to_string(logit_case) +
                                  (normalize ? " normalized" : "");
        // route_topk with the table, then the products on its items.
        const std::vector<float> nan(std::max(c.E, c.F) * int64_t(k), std::nanf(""));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer items, cuda::DeviceBuffer::allocate(k * sizeof(cuda::GroupItem)));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer rows, cuda::DeviceBuffer::allocate(2 * k * sizeof(int32_t)));
        cuda::DeviceBuffer ids_a = device(nan.data(), k * 4), weights_a = device(nan.data(), k * 4),
                           slots_a = device(nan.data(), k * 4);
        ASSERT_OK(cuda::route_topk({.logits = logits_dev.as<float>(), .ids = ids_a.as<int32_t>(),
                                    .weights = weights_a.as<float>(), .n_tok = 1, .n_expert = c.n_expert, .k = c.k,
                                    .normalize = normalize, .table = table_dev.as<const void*>(),
                                    .items = items.as<cuda::GroupItem>(), .x_rows = rows.as<int32_t>(),
                                    .slot_rows = slots_a.as<int32_t>()},
                                   stream));
        cuda::DeviceBuffer h_a = device(nan.data(), k * size_t(c.F) * 4), y_a = device(nan.data(), k * size_t(c.E) * 4);
        const cuda::GroupedMatvecArgs gate_up{.type = type, .items = items.as<cuda::GroupItem>(), .n_items = c.k,
                                              .part = 0, .n_parts = 2, .rows = c.F, .cols = c.E, .x = xq.data(),
                                              .single_x = true, .y = h_a.as<float>(), .max_n = 1, .stationary = true,
                                              .swiglu = true};
        ASSERT_OK(cuda::grouped_matvec(gate_up, stream));
        const cuda::GroupedMatvecArgs down{.type = type, .items = items.as<cuda::GroupItem>(), .n_items = c.k,
                                           .part = 2, .n_parts = 1, .rows = c.E, .cols = c.F, .x = h_a.data(),
                                           .y = y_a.as<float>(), .max_n = 1, .stationary = true,
                                           .items_settled = true, .x_float = true};
        ASSERT_OK(cuda::grouped_matvec(down, stream));
        stream.synchronize();

        // The products routing themselves (gate/up on the stationary kernel, then streaming its weights through
        // shared memory: GroupedMatvecArgs::bulk).
        const cuda::RouteInProducts route{.logits = logits_dev.as<float>(),
                                          .n_expert = c.n_expert,
                                          .k = c.k,
                                          .base = experts_dev.data(),
                                          .stride = stride,
                                          .offset = {0, part_bytes[0], part_bytes[0] + part_bytes[1]}};
        cuda::GroupedMatvecArgs a;
        cuda::DeviceBuffer h_b;
        for (const bool bulk : {false, true}) {
          cuda::DeviceBuffer ids_b = device(nan.data(), k * 4), weights_b = device(nan.data(), k * 4),
                             slots_b = device(nan.data(), k * 4);
          h_b = device(nan.data(), k * size_t(c.F) * 4);
          a = gate_up;
          a.items = nullptr;
          a.y = h_b.as<float>();
          a.route = route;
          a.route.ids = ids_b.as<int32_t>();
          a.route.weights = weights_b.as<float>();
          a.route.slot_rows = slots_b.as<int32_t>();
          a.route.normalize = normalize;
          a.bulk = bulk;
          ASSERT_OK(cuda::grouped_matvec(a, stream));
          stream.synchronize();
          const std::string how = where + (bulk ? ", bulk" : "");
          EXPECT_TRUE(same(ids_a, ids_b, k * 4)) << how << ": ids";
          EXPECT_TRUE(same(weights_a, weights_b, k * 4)) << how << ": weights";
          EXPECT_TRUE(same(slots_a, slots_b, k * 4)) << how << ": slot rows";
          EXPECT_TRUE(same(h_a, h_b, k * size_t(c.F) * 4)) << how << ": swiglu rows";
        }
        for (const bool settled : {true, false}) {
          cuda::DeviceBuffer y_b = device(nan.data(), k * size_t(c.E) * 4);
          a = down;
          a.items = nullptr;
          a.x = h_b.data();
          a.y = y_b.as<float>();
          a.items_settled = settled;
          a.route = route;
          ASSERT_OK(cuda::grouped_matvec(a, stream));
          stream.synchronize();
          EXPECT_TRUE(same(y_a, y_b, k * size_t(c.E) * 4))
              << where << ": down rows" << (settled ? ", logits read before waiting" : "");
        }
      }
    }
  }
}

// Which rows the stationary kernel takes, and the folded products' bad arguments (refused with a Status before any
// device call: these run on every machine): without the stationary kernel, swiglu without both parts, a shape or type
// the kernel does not take, a float input not 16-byte aligned.
TEST(CudaMatvec, StationaryShapesAndFoldedArguments) {
  EXPECT_TRUE(cuda::has_matvec_stationary_kernel(Type::Q4_K));
  EXPECT_TRUE(cuda::has_matvec_stationary_kernel(Type::Q6_K));
  EXPECT_FALSE(cuda::has_matvec_stationary_kernel(Type::Q8_0));
  EXPECT_TRUE(cuda::matvec_stationary_fits(Type::Q6_K, 768));  // the Q4_K_M mix's expert down rows
  std::vector<int64_t> taken;
  for (int64_t cols = 256; cols <= 16384; cols += 256) {
    if (cuda::matvec_stationary_fits(Type::Q4_K, cols)) taken.push_back(cols);
  }
  // Groups of 4 rows (an odd number of blocks, at most 7), of 2 (2 mod 4 blocks, at most 14), of 1 (a multiple of 4
  // blocks, at most 32).
  const std::vector<int64_t> want = {256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144,
                                     7168, 8192};
  EXPECT_EQ(taken, want);
  EXPECT_FALSE(cuda::matvec_stationary_fits(Type::Q4_K, 300));
  EXPECT_FALSE(cuda::matvec_stationary_fits(Type::Q8_0, 2048));

  cuda::Stream stream;
  const Type type = Type::Q4_K;
  alignas(16) static uint8_t fake[64];
  const cuda::GroupedMatvecArgs ok{.type = type, .items = reinterpret_cast<const cuda::GroupItem*>(fake),
                                   .n_items = 1, .part = 0, .n_parts = 2, .rows = 8, .cols = 2048, .x = fake,
                                   .y = reinterpret_cast<float*>(fake), .max_n = 1, .stationary = true,
                                   .swiglu = true};
  cuda::GroupedMatvecArgs bad = ok;
  bad.stationary = false;
  expect_error(cuda::grouped_matvec(bad, stream), "stationary");
  bad = ok;
  bad.n_parts = 1;
  expect_error(cuda::grouped_matvec(bad, stream), "not 1)");
  bad = ok;
  bad.cols = 2816;
  expect_error(cuda::grouped_matvec(bad, stream), "2816 columns");
  bad = ok;
  bad.swiglu = false;
  bad.x_float = true;
  bad.type = Type::Q8_0;
  expect_error(cuda::grouped_matvec(bad, stream), "Q8_0 row");
  bad = ok;
  bad.swiglu = false;
  bad.x_float = true;
  bad.x = fake + 4;
  expect_error(cuda::grouped_matvec(bad, stream), "aligned");
  // Routing in the products: no items, n_items = k, up to kMaxRoutedExperts experts, 16-byte aligned parts.
  cuda::GroupedMatvecArgs routed = ok;
  routed.items = nullptr;
  routed.n_items = 8;
  routed.route = {.logits = reinterpret_cast<const float*>(fake), .n_expert = 128, .k = 8, .base = fake,
                  .stride = 256};
  bad = routed;
  bad.items = ok.items;
  expect_error(cuda::grouped_matvec(bad, stream), "route needs no items");
  bad = routed;
  bad.route.n_expert = cuda::kMaxRoutedExperts + 1;
  expect_error(cuda::grouped_matvec(bad, stream), "route needs");
  bad = routed;
  bad.n_items = 4;
  expect_error(cuda::grouped_matvec(bad, stream), "route needs");
  bad = routed;
  bad.route.stride = 264;
  expect_error(cuda::grouped_matvec(bad, stream), "route needs");
  bad = routed;
  bad.route.offset[1] = 8;
  expect_error(cuda::grouped_matvec(bad, stream), "offsets");
  bad = routed;
  bad.route.ids = reinterpret_cast<int32_t*>(fake);
  expect_error(cuda::grouped_matvec(bad, stream), "weights and slot_rows");
  bad = ok;
  bad.items = nullptr;
  expect_error(cuda::grouped_matvec(bad, stream), "null device pointer (items)");
}

}  // namespace mmvq_test
}  // namespace magnetar
