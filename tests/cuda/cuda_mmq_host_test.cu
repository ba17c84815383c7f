// The slice unpackers of backends/cuda/mmq.cuh run on the HOST against the scalar reference (quant/ref):
// no GPU needed. What is asserted, for every weight type mmq supports:
//   - every slice of every block (random Gaussian blocks with outliers, quantized by the reference
//     quantizer): scale * float(q_i) + offset == the reference dequantization, bit for bit (the split is
//     exact, see mmq.cuh; the host build has no FMA contraction, as the reference);
//   - the activation view (Q8_0 / Q8_1 / Q8_K from the reference quantizer): d_x * float(q_i) == the
//     reference dequantization bit for bit, and sum_x == d_x * sum(q) as the reference dot uses it (Q8_1:
//     the stored s; Q8_K: d * the bsums);
//   - the slice-sum formula the kernel evaluates, sum over slices of (scale_w * d_x) * isum + offset_w *
//     sum_x in float32 FMAs in the kernel's order (the K-quants: per block (d_w d_x) * the int32 sum of
//     isc * isum minus (dmin_w d_x) * the int32 min terms through split_sum), over whole rows of 1, 3 and 16
//     blocks against the reference vec_dot, within the bound of cuda_mmvq_host_test.cu / cuda_mmvq_test.cpp.
// The mma fragment layouts, the tiling and the launches are checked on the GPU by cuda_mmq_test.cpp.
//
// Compiled by nvcc as C++17, so it uses quant/ref/ref.h (plain C++) rather than the C++20 trait table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/mmq.cuh"
#include "quant/formats.h"
#include "quant/ref/ref.h"
#include "tests/cuda/quantized_tolerance.h"

namespace magnetar {
namespace {

using quant::Type;

using QuantizeFn = void (*)(const float*, void*, int64_t);
using DequantizeFn = void (*)(const void*, float*, int64_t);
using DotFn = float (*)(int64_t, const void*, const void*);

constexpr size_t kMaxBlockBytes = sizeof(quant::BlockQ8_K);  // larger than any weight block

struct SliceCheck {
  int64_t values = 0;      // elements compared
  int64_t mismatches = 0;  // not bit-identical
};

// One row of the table: a weight type, its reference functions, its activation format's, and the
// mmq.cuh functions instantiated for it.
struct HostCase {
  const char* name;
  int64_t block;  // elements per weight block (= per activation block)
  QuantizeFn quantize;
  DequantizeFn dequantize;
  DotFn ref_dot;
  QuantizeFn quantize_act;
  DequantizeFn dequantize_act;
  size_t act_block_bytes;
  // Unpacks every slice of nb weight blocks and compares scale * q + offset with `want` (nb * block floats).
  void (*check_weights)(const void* w, const float* want, int64_t nb, SliceCheck* out, std::string* first);
  // The same for the activation view, plus its sum against d * sum(q).
  void (*check_acts)(const void* a, const float* want, int64_t nb, SliceCheck* out, std::string* first);
  // The kernel's formula over a row of nb blocks (float32 FMAs, slice order).
  float (*mmq_row)(const void* w, const void* a, int64_t nb);
};

bool same_bits(float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub || (a == 0.0f && b == 0.0f);  // +0 and -0 are the same weight
}

// Element i of a slice unpacked as words (mmq.cuh's contract: signed byte i % 4 of word i / 4).
int element(const uint32_t* q, int i) { return int(int8_t(uint8_t(q[i / 4] >> (8 * (i % 4))))); }

template <Type T>
void check_weights(const void* w, const float* want, int64_t nb, SliceCheck* out, std::string* first) {
  using Ops = cuda::mmq::MmqType<T>;
  const auto* blocks = static_cast<const typename Ops::Block*>(w);
  for (int64_t b = 0; b < nb; ++b) {
    for (int s = 0; s < Ops::kSlicesPerBlock; ++s) {
      uint32_t q[Ops::kSlice / 4];
      float scale = 0, offset = 0;
      Ops::unpack(blocks[b], s, q, &scale, &offset);
      if (!Ops::kHasOffset && offset != 0.0f) {
        ++out->mismatches;
        if (first->empty()) *first = "nonzero offset for a type without offsets";
      }
      for (int i = 0; i < Ops::kSlice; ++i) {
        const float got = scale * float(element(q, i)) + offset;
        const float ref = want[b * Ops::kBlockElems + s * Ops::kSlice + i];
        ++out->values;
        if (same_bits(got, ref)) continue;
        if (++out->mismatches == 1) {
          *first = "block " + std::to_string(b) + " slice " + std::to_string(s) + " element " + std::to_string(i) +
                   ": " + std::to_string(got) + " != reference " + std::to_string(ref);
        }
      }
    }
  }
}

template <Type T>
void check_acts(const void* a, const float* want, int64_t nb, SliceCheck* out, std::string* first) {
  using Ops = cuda::mmq::MmqType<T>;
  using View = cuda::mmq::ActSlice<typename Ops::Act, Ops::kSlice>;
  const auto* blocks = static_cast<const typename Ops::Act*>(a);
  constexpr int kActSlices = Ops::kActBlockElems / Ops::kSlice;
  for (int64_t b = 0; b < nb * Ops::kBlockElems / Ops::kActBlockElems; ++b) {
    for (int s = 0; s < kActSlices; ++s) {
      uint32_t q[Ops::kSlice / 4];
      float d = 0, sum = 0;
      View::view(blocks[b], s, q, &d, &sum);
      int isum = 0;
      for (int i = 0; i < Ops::kSlice; ++i) {
        isum += element(q, i);
        const float ref = want[b * Ops::kActBlockElems + s * Ops::kSlice + i];
        ++out->values;
        if (same_bits(d * float(element(q, i)), ref)) continue;
        if (++out->mismatches == 1) *first = "activation block " + std::to_string(b) + " slice " + std::to_string(s);
      }
      // Q8_1's s is d * sum(q) rounded to fp16 (from the unrounded d): within fp16 rounding of it. Q8_K: the
      // exact float product. Q8_0: no sum (0).
      // Q8_K: the float product d * float(sum of its bsums) must be d * float(sum(q)) exactly (the bsums hold
      // the sums of the quants).
      double want_sum = double(d * float(isum));
      double tol = 0;
      if constexpr (std::is_same_v<typename Ops::Act, quant::BlockQ8_1>) tol = std::fabs(want_sum) * 2e-3 + 1e-7;
      if constexpr (std::is_same_v<typename Ops::Act, quant::BlockQ8_0>) want_sum = 0;
      if (!(std::fabs(double(sum) - want_sum) <= tol)) {
        if (++out->mismatches == 1) {
          *first = "activation block " + std::to_string(b) + " slice " + std::to_string(s) + ": sum " +
                   std::to_string(sum) + " != " + std::to_string(want_sum);
        }
      }
    }
  }
}

// The per-slice float form (every type but the K-quants).
template <Type T>
float mmq_row_float(const void* w, const void* a, int64_t nb) {
  using Ops = cuda::mmq::MmqType<T>;
  using View = cuda::mmq::ActSlice<typename Ops::Act, Ops::kSlice>;
  const auto* wb = static_cast<const typename Ops::Block*>(w);
  const auto* ab = static_cast<const typename Ops::Act*>(a);
  float acc = 0.0f;
  for (int64_t k = 0; k < nb * Ops::kBlockElems; k += Ops::kSlice) {
    uint32_t qw[Ops::kSlice / 4], qx[Ops::kSlice / 4];
    float scale, offset, d, sum;
    Ops::unpack(wb[k / Ops::kBlockElems], int(k % Ops::kBlockElems) / Ops::kSlice, qw, &scale, &offset);
    View::view(ab[k / Ops::kActBlockElems], int(k % Ops::kActBlockElems) / Ops::kSlice, qx, &d, &sum);
    int isum = 0;
    for (int i = 0; i < Ops::kSlice; ++i) isum += element(qw, i) * element(qx, i);
    acc = std::fma(scale * d, float(isum), acc);
    if (Ops::kHasOffset) acc = std::fma(offset, sum, acc);
  }
  return acc;
}

// The K-quants' integer form, in the kernel's order: per block the min terms through split_sum's hi and lo bytes,
// then the int32 sum of isc * isum, each scaled once.
template <Type T>
float mmq_row_int(const void* w, const void* a, int64_t nb) {
  using Ops = cuda::mmq::MmqType<T>;
  using View = cuda::mmq::ActSlice<typename Ops::Act, Ops::kSlice>;
  const auto* wb = static_cast<const typename Ops::Block*>(w);
  const auto* ab = static_cast<const typename Ops::Act*>(a);
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    float d = 0, dmin = 0;
    Ops::block_scales(wb[b], &d, &dmin);
    int isum = 0, min_hi = 0, min_lo = 0;
    for (int s = 0; s < Ops::kSlicesPerBlock; ++s) {
      uint32_t qw[Ops::kSlice / 4], qx[Ops::kSlice / 4];
      int isc = 0, imin = 0, bsum = 0;
      Ops::unpack_int(wb[b], s, qw, &isc, &imin);
      View::view_int(ab[b], s, qx, &bsum);
      int dot = 0;
      for (int i = 0; i < Ops::kSlice; ++i) dot += element(qw, i) * element(qx, i);
      isum += isc * dot;
      int8_t hi = 0, lo = 0;
      cuda::mmq::split_sum(bsum, &hi, &lo);
      min_hi += imin * hi;
      min_lo += imin * lo;
    }
    if (Ops::kHasOffset) acc = std::fma(-(dmin * ab[b].d), float(64 * min_hi + min_lo), acc);
    acc = std::fma(d * ab[b].d, float(isum), acc);
  }
  return acc;
}

template <Type T>
float mmq_row(const void* w, const void* a, int64_t nb) {
  if constexpr (cuda::mmq::MmqType<T>::kIntScales) {
    return mmq_row_int<T>(w, a, nb);
  } else {
    return mmq_row_float<T>(w, a, nb);
  }
}

template <Type T>
HostCase make_case(const char* name, QuantizeFn q, DequantizeFn dq, DotFn dot, QuantizeFn qa, DequantizeFn dqa) {
  using Ops = cuda::mmq::MmqType<T>;
  return HostCase{name,          Ops::kBlockElems, q,  dq, dot, qa, dqa, sizeof(typename Ops::Act), check_weights<T>,
                  check_acts<T>, mmq_row<T>};
}

std::vector<HostCase> host_cases() {
  namespace ref = quant::ref;
  return {
      make_case<Type::Q4_0>("Q4_0", ref::quantize_q4_0, ref::dequantize_q4_0, ref::vec_dot_q4_0, ref::quantize_q8_0,
                            ref::dequantize_q8_0),
      make_case<Type::Q4_1>("Q4_1", ref::quantize_q4_1, ref::dequantize_q4_1, ref::vec_dot_q4_1, ref::quantize_q8_1,
                            ref::dequantize_q8_1),
      make_case<Type::Q5_0>("Q5_0", ref::quantize_q5_0, ref::dequantize_q5_0, ref::vec_dot_q5_0, ref::quantize_q8_0,
                            ref::dequantize_q8_0),
      make_case<Type::Q5_1>("Q5_1", ref::quantize_q5_1, ref::dequantize_q5_1, ref::vec_dot_q5_1, ref::quantize_q8_1,
                            ref::dequantize_q8_1),
      make_case<Type::Q8_0>("Q8_0", ref::quantize_q8_0, ref::dequantize_q8_0, ref::vec_dot_q8_0, ref::quantize_q8_0,
                            ref::dequantize_q8_0),
      make_case<Type::IQ4_NL>("IQ4_NL", ref::quantize_iq4_nl, ref::dequantize_iq4_nl, ref::vec_dot_iq4_nl,
                              ref::quantize_q8_0, ref::dequantize_q8_0),
      make_case<Type::MXFP4>("MXFP4", ref::quantize_mxfp4, ref::dequantize_mxfp4, ref::vec_dot_mxfp4,
                             ref::quantize_q8_0, ref::dequantize_q8_0),
      make_case<Type::Q2_K>("Q2_K", ref::quantize_q2_k, ref::dequantize_q2_k, ref::vec_dot_q2_k, ref::quantize_q8_k,
                            ref::dequantize_q8_k),
      make_case<Type::Q3_K>("Q3_K", ref::quantize_q3_k, ref::dequantize_q3_k, ref::vec_dot_q3_k, ref::quantize_q8_k,
                            ref::dequantize_q8_k),
      make_case<Type::Q4_K>("Q4_K", ref::quantize_q4_k, ref::dequantize_q4_k, ref::vec_dot_q4_k, ref::quantize_q8_k,
                            ref::dequantize_q8_k),
      make_case<Type::Q5_K>("Q5_K", ref::quantize_q5_k, ref::dequantize_q5_k, ref::vec_dot_q5_k, ref::quantize_q8_k,
                            ref::dequantize_q8_k),
      make_case<Type::Q6_K>("Q6_K", ref::quantize_q6_k, ref::dequantize_q6_k, ref::vec_dot_q6_k, ref::quantize_q8_k,
                            ref::dequantize_q8_k),
      make_case<Type::IQ4_XS>("IQ4_XS", ref::quantize_iq4_xs, ref::dequantize_iq4_xs, ref::vec_dot_iq4_xs,
                              ref::quantize_q8_k, ref::dequantize_q8_k),
  };
}

class MmqHostTest : public testing::TestWithParam<HostCase> {};

std::string host_case_name(const testing::TestParamInfo<HostCase>& info) { return info.param.name; }

// Gaussian data with an outlier in every other trial (weights and activations both).
std::vector<float> data(std::mt19937_64& gen, int64_t n, bool outlier) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(gen);
  if (outlier) v[size_t(gen() % uint64_t(n))] = 60.0f;
  return v;
}

TEST_P(MmqHostTest, SlicesDequantizeExactly) {
  const HostCase& c = GetParam();
  std::mt19937_64 gen(20261130);
  constexpr int64_t kBlocks = 64;
  const int64_t n = kBlocks * c.block;
  SliceCheck w_check, a_check;
  std::string w_first, a_first;
  for (int trial = 0; trial < 4; ++trial) {
    const std::vector<float> x = data(gen, n, trial % 2 == 1);
    std::vector<uint8_t> qx(size_t(kBlocks) * kMaxBlockBytes), qa(size_t(kBlocks) * c.act_block_bytes);
    c.quantize(x.data(), qx.data(), n);
    c.quantize_act(x.data(), qa.data(), n);
    std::vector<float> wd(static_cast<size_t>(n)), ad(static_cast<size_t>(n));
    c.dequantize(qx.data(), wd.data(), n);
    c.dequantize_act(qa.data(), ad.data(), n);
    c.check_weights(qx.data(), wd.data(), kBlocks, &w_check, &w_first);
    c.check_acts(qa.data(), ad.data(), kBlocks, &a_check, &a_first);
  }
  EXPECT_EQ(w_check.values, 4 * n);
  EXPECT_EQ(w_check.mismatches, 0) << c.name << " weights, first: " << w_first;
  EXPECT_EQ(a_check.mismatches, 0) << c.name << " activations, first: " << a_first;
  std::printf("[ mmq host ] %-6s %lld weight values and %lld activation values bit-exact\n", c.name,
              (long long)(w_check.values - w_check.mismatches), (long long)(a_check.values - a_check.mismatches));
}

// Tolerance: the bound of cuda_mmvq_test.cpp, 2 (n/8 + 3) u 3 M with M = sum_i amax_block(i) |y_i|: the
// kernel's formula has at most two terms per slice of 16 (n/8 terms), each rounded at most 3 times (the
// scale product, the product with the exactly converted integer, the FMA's one rounding of the pair; the K-quants'
// two terms per block: the scale product, the conversion of the block's int32 sum, the FMA).
TEST_P(MmqHostTest, SliceSumsMatchReferenceDot) {
  const HostCase& c = GetParam();
  std::mt19937_64 gen(20261201);
  int64_t checked = 0;
  for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(16)}) {
    const int64_t n = blocks * c.block;
    for (int trial = 0; trial < 8; ++trial) {
      const std::vector<float> x = data(gen, n, false);
      const std::vector<float> y = data(gen, n, trial % 2 == 1);
      std::vector<uint8_t> qx(size_t(blocks) * kMaxBlockBytes), qy(size_t(blocks) * c.act_block_bytes);
      c.quantize(x.data(), qx.data(), n);
      c.quantize_act(y.data(), qy.data(), n);
      const double want = double(c.ref_dot(n, qx.data(), qy.data()));
      const double got = double(c.mmq_row(qx.data(), qy.data(), blocks));

      std::vector<float> wd(static_cast<size_t>(n)), yd(static_cast<size_t>(n));
      c.dequantize(qx.data(), wd.data(), n);
      c.dequantize_act(qy.data(), yd.data(), n);
      const double tol = cuda_test::quantized_tolerance(c.block, wd.data(), yd.data(), n);
      EXPECT_LE(std::fabs(got - want), tol)
          << c.name << " n=" << n << " trial " << trial << ": reference " << want << ", mmq " << got;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 24);
}

INSTANTIATE_TEST_SUITE_P(AllMmqTypes, MmqHostTest, testing::ValuesIn(host_cases()), host_case_name);

}  // namespace
}  // namespace magnetar
