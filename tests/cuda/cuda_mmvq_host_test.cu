// The per-type block dot products of backends/cuda/mmvq.cuh run on the HOST, through their scalar
// stand-ins for __dp4a, __vsub4 and __byte_perm, against the scalar reference (quant/ref). This checks
// every type's block layout, part split and unpacking on any machine with nvcc, GPU or not (CI included);
// the intrinsics themselves and the kernels are checked on the GPU by cuda_mmvq_test.cpp.
//
// Compiled by nvcc as C++17, so it uses quant/ref/ref.h (plain C++) rather than the C++20 trait table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/mmvq.cuh"
#include "quant/formats.h"
#include "quant/ref/ref.h"
#include "quant/ref/scale_search.h"
#include "tests/cuda/quantized_tolerance.h"

namespace magnetar {
namespace {

using quant::Type;

using QuantizeFn = void (*)(const float*, void*, int64_t);
using DequantizeFn = void (*)(const void*, float*, int64_t);
using DotFn = float (*)(int64_t, const void*, const void*);

constexpr size_t kMaxBlockBytes = sizeof(quant::BlockQ6_K);  // the largest weight block

// One row of the table: a weight type, its reference functions, and its activation format's.
struct HostCase {
  const char* name;
  int64_t block;  // elements per weight block (= per activation block)
  QuantizeFn quantize;
  DequantizeFn dequantize;
  DotFn ref_dot;
  QuantizeFn quantize_act;
  DequantizeFn dequantize_act;
  size_t act_block_bytes;
  // The mmvq dot of a row of nb blocks: every part of every block, summed in double.
  double (*mmvq_row)(const void* w, const void* a, int64_t nb);
};

template <Type T>
double mmvq_row(const void* w, const void* a, int64_t nb) {
  using Ops = cuda::mmvq::MmvqType<T>;
  const auto* wb = static_cast<const typename Ops::Block*>(w);
  const auto* ab = static_cast<const typename Ops::Act*>(a);
  double sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    for (int part = 0; part < Ops::kParts; ++part) sum += double(Ops::dot(wb[b], ab[b], part));
  }
  return sum;
}

HostCase make_case(const char* name, int64_t block, QuantizeFn q, DequantizeFn dq, DotFn dot, QuantizeFn qa,
                   DequantizeFn dqa, size_t act_bytes, double (*row)(const void*, const void*, int64_t)) {
  return HostCase{name, block, q, dq, dot, qa, dqa, act_bytes, row};
}

std::vector<HostCase> host_cases() {
  namespace ref = quant::ref;
  using quant::kQK32;
  using quant::kQK_K;
  const size_t q80 = sizeof(quant::BlockQ8_0);
  const size_t q81 = sizeof(quant::BlockQ8_1);
  const size_t q8k = sizeof(quant::BlockQ8_K);
  return {
      make_case("Q4_0", kQK32, ref::quantize_q4_0, ref::dequantize_q4_0, ref::vec_dot_q4_0, ref::quantize_q8_0,
                ref::dequantize_q8_0, q80, mmvq_row<Type::Q4_0>),
      make_case("Q4_1", kQK32, ref::quantize_q4_1, ref::dequantize_q4_1, ref::vec_dot_q4_1, ref::quantize_q8_1,
                ref::dequantize_q8_1, q81, mmvq_row<Type::Q4_1>),
      make_case("Q5_0", kQK32, ref::quantize_q5_0, ref::dequantize_q5_0, ref::vec_dot_q5_0, ref::quantize_q8_0,
                ref::dequantize_q8_0, q80, mmvq_row<Type::Q5_0>),
      make_case("Q5_1", kQK32, ref::quantize_q5_1, ref::dequantize_q5_1, ref::vec_dot_q5_1, ref::quantize_q8_1,
                ref::dequantize_q8_1, q81, mmvq_row<Type::Q5_1>),
      make_case("Q8_0", kQK32, ref::quantize_q8_0, ref::dequantize_q8_0, ref::vec_dot_q8_0, ref::quantize_q8_0,
                ref::dequantize_q8_0, q80, mmvq_row<Type::Q8_0>),
      make_case("IQ4_NL", kQK32, ref::quantize_iq4_nl, ref::dequantize_iq4_nl, ref::vec_dot_iq4_nl,
                ref::quantize_q8_0, ref::dequantize_q8_0, q80, mmvq_row<Type::IQ4_NL>),
      make_case("MXFP4", kQK32, ref::quantize_mxfp4, ref::dequantize_mxfp4, ref::vec_dot_mxfp4, ref::quantize_q8_0,
                ref::dequantize_q8_0, q80, mmvq_row<Type::MXFP4>),
      make_case("Q2_K", kQK_K, ref::quantize_q2_k, ref::dequantize_q2_k, ref::vec_dot_q2_k, ref::quantize_q8_k,
                ref::dequantize_q8_k, q8k, mmvq_row<Type::Q2_K>),
      make_case("Q3_K", kQK_K, ref::quantize_q3_k, ref::dequantize_q3_k, ref::vec_dot_q3_k, ref::quantize_q8_k,
                ref::dequantize_q8_k, q8k, mmvq_row<Type::Q3_K>),
      make_case("Q4_K", kQK_K, ref::quantize_q4_k, ref::dequantize_q4_k, ref::vec_dot_q4_k, ref::quantize_q8_k,
                ref::dequantize_q8_k, q8k, mmvq_row<Type::Q4_K>),
      make_case("Q5_K", kQK_K, ref::quantize_q5_k, ref::dequantize_q5_k, ref::vec_dot_q5_k, ref::quantize_q8_k,
                ref::dequantize_q8_k, q8k, mmvq_row<Type::Q5_K>),
      make_case("Q6_K", kQK_K, ref::quantize_q6_k, ref::dequantize_q6_k, ref::vec_dot_q6_k, ref::quantize_q8_k,
                ref::dequantize_q8_k, q8k, mmvq_row<Type::Q6_K>),
      make_case("IQ4_XS", kQK_K, ref::quantize_iq4_xs, ref::dequantize_iq4_xs, ref::vec_dot_iq4_xs,
                ref::quantize_q8_k, ref::dequantize_q8_k, q8k, mmvq_row<Type::IQ4_XS>),
  };
}

class MmvqHostTest : public testing::TestWithParam<HostCase> {};

std::string host_case_name(const testing::TestParamInfo<HostCase>& info) { return info.param.name; }

// Tolerance: the bound of cuda_mmvq_test.cpp (2 (n/8 + 3) u 3 M, M = sum_i amax_block(i) |y_i|); the mmvq
// side here is summed in double, so it is looser than needed.
TEST_P(MmvqHostTest, BlockDotsMatchReference) {
  const HostCase& c = GetParam();
  std::mt19937_64 gen(20261130);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(16)}) {
    const int64_t n = blocks * c.block;
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (float& f : x) f = dist(gen);
      for (float& f : y) f = dist(gen);
      if (trial % 2 == 1) y[size_t(gen() % uint64_t(n))] = 60.0f;  // an activation outlier
      std::vector<uint8_t> qx(size_t(blocks) * kMaxBlockBytes), qy(size_t(blocks) * c.act_block_bytes);
      c.quantize(x.data(), qx.data(), n);
      c.quantize_act(y.data(), qy.data(), n);
      const double want = double(c.ref_dot(n, qx.data(), qy.data()));
      const double got = c.mmvq_row(qx.data(), qy.data(), blocks);

      std::vector<float> wd(static_cast<size_t>(n)), yd(static_cast<size_t>(n));
      c.dequantize(qx.data(), wd.data(), n);
      c.dequantize_act(qy.data(), yd.data(), n);
      const double tol = cuda_test::quantized_tolerance(c.block, wd.data(), yd.data(), n);
      EXPECT_LE(std::fabs(got - want), tol)
          << c.name << " n=" << n << " trial " << trial << ": reference " << want << ", mmvq " << got;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllQuantizedTypes, MmvqHostTest, testing::ValuesIn(host_cases()), host_case_name);

// The byte-table lookup used by IQ4_NL, IQ4_XS and MXFP4, for every index in every byte position.
TEST(MmvqHost, NibbleLookupMatchesTables) {
  for (uint32_t i = 0; i < 16; ++i) {
    for (int pos = 0; pos < 4; ++pos) {
      const uint32_t q = (i << (8 * pos)) | (((i + 5) & 15) << (8 * ((pos + 1) % 4)));
      const uint32_t nl = uint32_t(cuda::mmvq::lookup_iq4nl(q));
      const uint32_t mx = uint32_t(cuda::mmvq::lookup_mxfp4(q));
      EXPECT_EQ(int8_t(nl >> (8 * pos)), quant::kIQ4NLValues[i]) << "index " << i << " byte " << pos;
      EXPECT_EQ(int8_t(mx >> (8 * pos)), quant::kMXFP4Values[i]) << "index " << i << " byte " << pos;
      const int other = (pos + 1) % 4;
      EXPECT_EQ(int8_t(nl >> (8 * other)), quant::kIQ4NLValues[(i + 5) & 15]);
    }
  }
}

// Q4_K's part dot reads the 6-bit scales and mins of its two sub-blocks as the bytes of one word (scales_mins: two
// byte permutes and masks, no branch on the part): every byte pattern of the 12 scale bytes (random, all bits) decodes
// as the reference's get_scale_min_k4 (quant/ref/scale_search.h) decodes it.
TEST(MmvqHost, Q4KScalesAndMinsMatchReference) {
  using Ops = cuda::mmvq::MmvqType<Type::Q4_K>;
  std::mt19937 gen(20261202);
  for (int trial = 0; trial < 4096; ++trial) {
    uint8_t packed[12];
    for (uint8_t& b : packed) b = uint8_t(gen());
    uint32_t words[3];
    std::memcpy(words, packed, sizeof(words));
    for (int k = 0; k < 4; ++k) {
      const uint32_t sm = Ops::scales_mins(words[0], words[1], words[2], k);
      for (int h = 0; h < 2; ++h) {
        uint8_t scale = 0, min = 0;
        quant::ref::unpack_scale_min_k4(2 * k + h, packed, &scale, &min);
        ASSERT_EQ(uint8_t(sm >> (8 * h)), scale) << "trial " << trial << " sub-block " << 2 * k + h;
        ASSERT_EQ(uint8_t(sm >> (16 + 8 * h)), min) << "trial " << trial << " sub-block " << 2 * k + h;
      }
    }
  }
}

// Q6_K's split for the stationary kernel (act_part, load_part, dot_loaded: its 2-byte loads of the 210-byte blocks and
// the scales picked by a byte permute) gives dot()'s float bit for bit, every part of random blocks (all bits of ql, qh
// and the signed scales; d a finite f16) against random activations.
TEST(MmvqHost, Q6KStationaryPartsEqualDot) {
  using Ops = cuda::mmvq::MmvqType<Type::Q6_K>;
  std::mt19937 gen(20261205);
  std::vector<quant::BlockQ6_K> blocks(3);
  quant::BlockQ8_K act;
  for (int trial = 0; trial < 512; ++trial) {
    for (quant::BlockQ6_K& w : blocks) {
      for (uint8_t& b : w.ql) b = uint8_t(gen());
      for (uint8_t& b : w.qh) b = uint8_t(gen());
      for (int8_t& b : w.scales) b = int8_t(gen());
      w.d = uint16_t(0x3000 + gen() % 0x1000);  // a positive normal f16, 2^-3 .. 2^0
    }
    for (int8_t& q : act.qs) q = int8_t(gen());
    act.d = std::ldexp(float(gen() % 1000 + 1), -12);
    for (int b = 0; b < 3; ++b) {
      for (int part = 0; part < Ops::kParts; ++part) {
        const float split = Ops::dot_loaded(Ops::load_part(blocks[b], part), Ops::act_part(act, part), part);
        const float whole = Ops::dot(blocks[b], act, part);
        ASSERT_EQ(std::memcmp(&split, &whole, sizeof(float)), 0)
            << "trial " << trial << " block " << b << " part " << part << ": " << split << " vs " << whole;
      }
    }
  }
}

}  // namespace
}  // namespace magnetar
