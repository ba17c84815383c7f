// Per-type slice unpackers of the quantized matrix-matrix product (mmq.cu): the weight block and the
// activation block cut into "slices" of kSlice elements that share one scale, as signed int8 quants plus
// per-slice floats, so that a tensor-core int8 mma can take the integer part of every slice.
//
// Contract of MmqType<T>::unpack(w, slice, q, &scale, &offset), slice in 0 .. kSlicesPerBlock - 1, q the
// kSlice / 4 words of the slice (element i = signed byte i % 4 of word i / 4, the layout the mma fragments
// read): for each element i of the slice (block element slice * kSlice + i), the reference dequantization
// (quant/ref: dequantize_*) of that element equals, bit for bit, the float expression
// scale * float(q[i]) + offset evaluated without FMA contraction (offset is 0 for the types whose
// kHasOffset is false, and then the value is scale * float(q[i]) exactly). Every reference dequantizer
// computes its value as (per-slice float) * (small integer) [+ or - per-slice float], so the split is exact:
//   Q4_0  q = nibble - 8,         scale = d                    Q4_1  q = nibble, scale = d, offset = m
//   Q5_0  q = 5-bit - 16,         scale = d                    Q5_1  q = 5-bit,  scale = d, offset = m
//   Q8_0  q = qs,                 scale = d                    IQ4_NL q = kIQ4NLValues[nibble], scale = d
//   MXFP4 q = kMXFP4Values[nibble], scale = 2^(e-128) (the "half" E8M0 of mmvq.cuh / quant/fp16.h)
//   Q2_K  q = 2-bit, scale = d * (sc & 15), offset = -(dmin * (sc >> 4))         (slices of 16)
//   Q3_K  q = 3-bit - 4 * !hbit, scale = d * s6                                   (slices of 16)
//   Q4_K  q = nibble, scale = d * sc6, offset = -(dmin * m6)                      (slices of 32)
//   Q5_K  q = 5-bit,  scale = d * sc6, offset = -(dmin * m6)                      (slices of 32)
//   Q6_K  q = 6-bit - 32, scale = d * sc8                                         (slices of 16)
//   IQ4_XS q = kIQ4NLValues[nibble], scale = d * s6                               (slices of 32)
// (d * (sc & 15) etc. are the same float products the reference forms, and x - y == x + (-y) in IEEE.)
//
// The activation side (ActSlice<Act>::view): the slice's int8 quants, its scale d_x and its sum
// d_x * sum(q_x) where the reference dot needs one: Q8_1's s field (which covers its 32 elements), Q8_K's
// d * bsums (16 elements per entry; two entries for a slice of 32). Q8_0 carries no sum and is only paired
// with offset-free weight types; its sum is reported as 0 and never used.
//
// Then for one weight row and one activation row, in exact arithmetic,
//   vec_dot = sum over slices of scale_w * d_x * isum(q_w, q_x) + offset_w * sum_x
// which is the same sum of terms as the reference's (its integer dots per sub-block, its min terms via
// bsums or s) regrouped; only the float rounding of the scale products and of the summation differs.
//
// Loads: each type reads its words with the widest load its block layout allows when rows start 16-byte aligned
// (mmq.cu's contract): 16 bytes for Q4_K / Q5_K (144- and 176-byte blocks, quants at offsets 16 and 48), 4 for
// the 4-byte multiples (Q4_1, Q5_1, Q2_K, IQ4_XS, Q8_1, Q8_K), 2 for the 2-byte ones, bytes only for MXFP4 (17-byte
// blocks). A slice is a handful of wide loads and word operations, never byte loads and byte repacking.
//
// Everything here is __host__ __device__ and free of intrinsics (it builds on mmvq.cuh's helpers, whose
// host fallbacks are scalar), so tests/cuda/cuda_mmq_host_test.cu checks it against the reference without
// a GPU.
#pragma once

#include <cstdint>

#include "backends/cuda/mmvq.cuh"
#include "quant/formats.h"

namespace magnetar::cuda::mmq {

using quant::Type;
using mmvq::e8m0_to_float_half;
using mmvq::fp16_to_float;

// The word at p from storage aligned to A bytes (A = 1, 2 or 4; 16: four words by one 16-byte load).
template <int A>
MAGNETAR_HD uint32_t load_word(const uint8_t* p) {
  if constexpr (A >= 4) return uint32_t(mmvq::load_a4(p));
  if constexpr (A == 2) return uint32_t(mmvq::load_a2(p));
  return uint32_t(mmvq::load_a1(p));
}
template <int A>
MAGNETAR_HD void load_words(const uint8_t* p, uint32_t* w, int n) {
  if constexpr (A == 16) {
    for (int i = 0; i < n; i += 4) mmvq::load_a16(p + 4 * i, reinterpret_cast<int*>(w + i));
  } else {
    for (int i = 0; i < n; ++i) w[i] = load_word<A>(p + 4 * i);
  }
}

// Nibbles j (low) and j + 16 (high) of the 16 bytes qs (aligned to A), mapped with `map` (bytes in, signed bytes
// out), into words q[0..7]: the element order of Q4_0, Q4_1, IQ4_NL, MXFP4 and of one IQ4_XS sub-block.
template <int A, typename Map>
MAGNETAR_HD void unpack_nibbles32(const uint8_t* qs, uint32_t* q, Map map) {
  uint32_t v[4];
  load_words<A>(qs, v, 4);
  for (int w = 0; w < 4; ++w) {
    q[w] = uint32_t(map(v[w] & 0x0F0F0F0Fu));
    q[4 + w] = uint32_t(map((v[w] >> 4) & 0x0F0F0F0Fu));
  }
}

// ---- the per-type table ------------------------------------------------------------------------------------

template <Type T>
struct MmqType;  // no definition: a type without a kernel fails to compile where it is instantiated

// Members: those of Shape (below) and unpack().

// What every type states: its block, the reference's activation block (same element count), the slice length
// (32, or 16 for Q2_K/Q3_K/Q6_K) and whether its slices carry an offset.
template <typename B, typename A, int BlockElems, int Slice, bool Offset>
struct Shape {
  using Block = B;
  using Act = A;
  static constexpr int kBlockElems = BlockElems, kActBlockElems = BlockElems, kSlice = Slice;
  static constexpr int kSlicesPerBlock = BlockElems / Slice;
  static constexpr bool kHasOffset = Offset;
  static constexpr bool kIntScales = false;
};

// The K-quants (Q8_K activations, blocks of 256): every slice's scale and offset are the block's two floats
// times small integers, scale = d * float(isc), offset = -(dmin * float(imin)) (0 without kHasOffset), so that
// the kernel can sum a block's slices in int32 (sum of isc * isum, sum of imin * the activation's slice sums) and
// scale once per block. Each type defines unpack_int(b, s, q, &isc, &imin) (q as unpack's) and
// block_scales(b, &d, &dmin); unpack is derived from them, so the host test of unpack covers both.
// |isc| <= 128 and |imin| <= 63 (6-bit mins; 4-bit for Q2_K): a block's int32 sums cannot overflow (at most 16
// slices of |isum| <= 32 * 127 * 128).
template <typename Self, typename B, int Slice, bool Offset>
struct KShape : Shape<B, quant::BlockQ8_K, quant::kQK_K, Slice, Offset> {
  static constexpr bool kIntScales = true;
  static MAGNETAR_HD void unpack(const B& b, int s, uint32_t* q, float* scale, float* offset) {
    int isc = 0, imin = 0;
    float d = 0.0f, dmin = 0.0f;
    Self::unpack_int(b, s, q, &isc, &imin);
    Self::block_scales(b, &d, &dmin);
    *scale = d * float(isc);
    *offset = Offset ? -(dmin * float(imin)) : 0.0f;
  }
};

template <>
struct MmqType<Type::Q4_0> : Shape<quant::BlockQ4_0, quant::BlockQ8_0, quant::kQK32, 32, false> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_nibbles32<2>(b.qs, q, [](uint32_t v) { return mmvq::sub_bytes(int(v), 0x08080808); });
    *scale = fp16_to_float(b.d);
    *offset = 0.0f;
  }
};

template <>
struct MmqType<Type::Q4_1> : Shape<quant::BlockQ4_1, quant::BlockQ8_1, quant::kQK32, 32, true> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_nibbles32<4>(b.qs, q, [](uint32_t v) { return v; });
    *scale = fp16_to_float(b.d);
    *offset = fp16_to_float(b.m);
  }
};

// Q5_0 / Q5_1: nibbles as Q4_0 plus bit j of qh as bit 4 of element j; minus 16 for Q5_0.
template <int A>
MAGNETAR_HD void unpack_q5(const uint8_t* qs, const uint8_t* qh_bytes, int bias, uint32_t* q) {
  const uint32_t qh = load_word<A>(qh_bytes);
  uint32_t v[4];
  load_words<A>(qs, v, 4);
  for (int w = 0; w < 4; ++w) {
    const int lo = int(v[w] & 0x0F0F0F0Fu) | mmvq::spread_bit4((qh >> (4 * w)) & 0xF);
    const int hi = int((v[w] >> 4) & 0x0F0F0F0Fu) | mmvq::spread_bit4((qh >> (16 + 4 * w)) & 0xF);
    q[w] = uint32_t(mmvq::sub_bytes(lo, bias));
    q[4 + w] = uint32_t(mmvq::sub_bytes(hi, bias));
  }
}

template <>
struct MmqType<Type::Q5_0> : Shape<quant::BlockQ5_0, quant::BlockQ8_0, quant::kQK32, 32, false> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_q5<2>(b.qs, b.qh, 0x10101010, q);
    *scale = fp16_to_float(b.d);
    *offset = 0.0f;
  }
};

template <>
struct MmqType<Type::Q5_1> : Shape<quant::BlockQ5_1, quant::BlockQ8_1, quant::kQK32, 32, true> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_q5<4>(b.qs, b.qh, 0, q);
    *scale = fp16_to_float(b.d);
    *offset = fp16_to_float(b.m);
  }
};

template <>
struct MmqType<Type::Q8_0> : Shape<quant::BlockQ8_0, quant::BlockQ8_0, quant::kQK32, 32, false> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    load_words<2>(mmvq::bytes(b.qs), q, 8);
    *scale = fp16_to_float(b.d);
    *offset = 0.0f;
  }
};

template <>
struct MmqType<Type::IQ4_NL> : Shape<quant::BlockIQ4_NL, quant::BlockQ8_0, quant::kQK32, 32, false> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_nibbles32<2>(b.qs, q, [](uint32_t v) { return mmvq::lookup_iq4nl(v); });
    *scale = fp16_to_float(b.d);
    *offset = 0.0f;
  }
};

template <>
struct MmqType<Type::MXFP4> : Shape<quant::BlockMXFP4, quant::BlockQ8_0, quant::kQK32, 32, false> {
  static MAGNETAR_HD void unpack(const Block& b, int /*slice*/, uint32_t* q, float* scale, float* offset) {
    unpack_nibbles32<1>(b.qs, q, [](uint32_t v) { return mmvq::lookup_mxfp4(v); });
    *scale = e8m0_to_float_half(b.e);
    *offset = 0.0f;
  }
};

// Q2_K: slice j (16 elements 16j .. 16j+15) = half h = j / 8, shift s = (j % 8) / 2, bytes
// qs[32h + 16 (j % 2) ..] (element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]).
template <>
struct MmqType<Type::Q2_K> : KShape<MmqType<Type::Q2_K>, quant::BlockQ2_K, 16, true> {
  static MAGNETAR_HD void unpack_int(const Block& b, int j, uint32_t* q, int* isc, int* imin) {
    const uint8_t* qs = b.qs + 32 * (j / 8) + 16 * (j % 2);
    const int shift = 2 * ((j % 8) / 2);
    for (int w = 0; w < 4; ++w) q[w] = (load_word<4>(qs + 4 * w) >> shift) & 0x03030303u;
    *isc = b.scales[j] & 0xF;
    *imin = b.scales[j] >> 4;
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = fp16_to_float(b.dmin);
  }
};

// Q3_K: low bits as Q2_K; the high bit of element e = 16j + l is bit e / 32 = j / 2 of hmask[e % 32].
template <>
struct MmqType<Type::Q3_K> : KShape<MmqType<Type::Q3_K>, quant::BlockQ3_K, 16, false> {
  static MAGNETAR_HD void unpack_int(const Block& b, int j, uint32_t* q, int* isc, int* imin) {
    const uint8_t* qs = b.qs + 32 * (j / 8) + 16 * (j % 2);
    const uint8_t* hm = b.hmask + 16 * (j % 2);
    const int shift = 2 * ((j % 8) / 2);
    const int hshift = j / 2;
    for (int w = 0; w < 4; ++w) {
      const uint32_t low = (load_word<2>(qs + 4 * w) >> shift) & 0x03030303u;
      const uint32_t high = (load_word<2>(hm + 4 * w) >> hshift) & 0x01010101u;
      q[w] = uint32_t(mmvq::sub_bytes(int(low | (high << 2)), 0x04040404));
    }
    *isc = mmvq::q3_k_scale(b.scales, j);
    *imin = 0;
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = 0.0f;
  }
};

// Q4_K / Q5_K: slice s = 2k + h is sub-block s of 32: the low (h = 0) or high (h = 1) nibbles of
// qs[32k .. 32k+31]; Q5_K's 5th bit of its element l is bit s of qh[l].
template <>
struct MmqType<Type::Q4_K> : KShape<MmqType<Type::Q4_K>, quant::BlockQ4_K, 32, true> {
  static MAGNETAR_HD void unpack_int(const Block& b, int s, uint32_t* q, int* isc, int* imin) {
    const uint8_t* qs = b.qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    load_words<16>(qs, q, 8);
    for (int w = 0; w < 8; ++w) q[w] = (q[w] >> shift) & 0x0F0F0F0Fu;
    mmvq::scale_min_k4(s, b.scales, isc, imin);
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = fp16_to_float(b.dmin);
  }
};

template <>
struct MmqType<Type::Q5_K> : KShape<MmqType<Type::Q5_K>, quant::BlockQ5_K, 32, true> {
  static MAGNETAR_HD void unpack_int(const Block& b, int s, uint32_t* q, int* isc, int* imin) {
    const uint8_t* qs = b.qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    uint32_t qh[8];
    load_words<16>(qs, q, 8);
    load_words<16>(b.qh, qh, 8);
    for (int w = 0; w < 8; ++w) q[w] = ((q[w] >> shift) & 0x0F0F0F0Fu) | (((qh[w] >> s) & 0x01010101u) << 4);
    mmvq::scale_min_k4(s, b.scales, isc, imin);
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = fp16_to_float(b.dmin);
  }
};

// Q6_K: slice j = 16 elements of 128h + 32g + l, h = j / 8, g = (j % 8) / 2, l in [16 (j % 2), +16): low 4
// bits in ql[64h + 32 (g & 1) + l] (low nibble for g < 2, high otherwise), high 2 bits in bits 2g..2g+1 of
// qh[32h + l]; minus 32.
template <>
struct MmqType<Type::Q6_K> : KShape<MmqType<Type::Q6_K>, quant::BlockQ6_K, 16, false> {
  static MAGNETAR_HD void unpack_int(const Block& b, int j, uint32_t* q, int* isc, int* imin) {
    const int h = j / 8;
    const int g = (j % 8) / 2;
    const int l0 = 16 * (j % 2);
    const uint8_t* ql = b.ql + 64 * h + 32 * (g & 1) + l0;
    const uint8_t* qh = b.qh + 32 * h + l0;
    const int lshift = 4 * (g / 2);
    for (int w = 0; w < 4; ++w) {
      const uint32_t low = (load_word<2>(ql + 4 * w) >> lshift) & 0x0F0F0F0Fu;
      const uint32_t high = (load_word<2>(qh + 4 * w) >> (2 * g)) & 0x03030303u;
      q[w] = uint32_t(mmvq::sub_bytes(int(low | (high << 4)), 0x20202020));
    }
    *isc = b.scales[j];
    *imin = 0;
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = 0.0f;
  }
};

// IQ4_XS: slice ib = sub-block ib of 32, nibble order as IQ4_NL within qs[16 ib ..].
template <>
struct MmqType<Type::IQ4_XS> : KShape<MmqType<Type::IQ4_XS>, quant::BlockIQ4_XS, 32, false> {
  static MAGNETAR_HD void unpack_int(const Block& b, int ib, uint32_t* q, int* isc, int* imin) {
    unpack_nibbles32<4>(b.qs + 16 * ib, q, [](uint32_t v) { return mmvq::lookup_iq4nl(v); });
    *isc = (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b.scales_h >> (2 * ib)) & 3) << 4)) - 32;
    *imin = 0;
  }
  static MAGNETAR_HD void block_scales(const Block& b, float* d, float* dmin) {
    *d = fp16_to_float(b.d);
    *dmin = 0.0f;
  }
};

// ---- the activation side -----------------------------------------------------------------------------------

// view(a, slice, q, &d, &sum): the kSlice quants of slice `slice` of the block, its scale and (where the
// format has one) d * sum(q). kSlice is 32 for Q8_0 / Q8_1 (one slice per block), 16 or 32 for Q8_K.
template <typename Act, int kSlice>
struct ActSlice;

template <>
struct ActSlice<quant::BlockQ8_0, 32> {
  static MAGNETAR_HD void view(const quant::BlockQ8_0& a, int /*slice*/, uint32_t* q, float* d, float* sum) {
    load_words<2>(mmvq::bytes(a.qs), q, 8);
    *d = fp16_to_float(a.d);
    *sum = 0.0f;  // no s field: only offset-free weight types pair with Q8_0
  }
};

template <>
struct ActSlice<quant::BlockQ8_1, 32> {
  static MAGNETAR_HD void view(const quant::BlockQ8_1& a, int /*slice*/, uint32_t* q, float* d, float* sum) {
    load_words<4>(mmvq::bytes(a.qs), q, 8);
    *d = fp16_to_float(a.d);
    *sum = fp16_to_float(a.s);
  }
};

template <int kSlice>
struct ActSlice<quant::BlockQ8_K, kSlice> {
  static_assert(kSlice == 16 || kSlice == 32);
  // The integer form the K-quant kernel uses: the quants and sum(q) of the slice (the block's d is a.d).
  static MAGNETAR_HD void view_int(const quant::BlockQ8_K& a, int slice, uint32_t* q, int* bsum) {
    load_words<4>(mmvq::bytes(a.qs) + kSlice * slice, q, kSlice / 4);
    *bsum = slice_sum(a, slice);
  }
  // sum(q) of the slice.
  static MAGNETAR_HD int slice_sum(const quant::BlockQ8_K& a, int slice) {
    return kSlice == 32 ? a.bsums[2 * slice] + a.bsums[2 * slice + 1] : a.bsums[slice];
  }
  static MAGNETAR_HD void view(const quant::BlockQ8_K& a, int slice, uint32_t* q, float* d, float* sum) {
    int bsum = 0;
    view_int(a, slice, q, &bsum);
    *d = a.d;
    *sum = a.d * float(bsum);
  }
};

// A K-quant slice sum (|bsum| <= 32 * 128) as two int8 mma operands: bsum = 64 * hi + lo, hi in [-64, 63], lo in
// [0, 63]; the kernel's min terms are 64 * sum(imin * hi) + sum(imin * lo).
MAGNETAR_HD void split_sum(int bsum, int8_t* hi, int8_t* lo) {
  *hi = int8_t(bsum >> 6);  // arithmetic shift: the floor, so lo is never negative
  *lo = int8_t(bsum & 63);
}

}  // namespace magnetar::cuda::mmq
