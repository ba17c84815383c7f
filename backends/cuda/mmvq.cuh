// Per-type integer dot products of one weight block with one activation block, for the quantized
// matrix-vector kernel (mmvq.cu). One place per type: MmvqType<T> says which activation format T pairs
// with (the reference's vec_dot_type), how the block splits into kParts parts that consecutive threads
// take, and `dot`, the float contribution of one part.
//
// Contract of MmvqType<T>::dot(w, a, part): the sum over part = 0 .. kParts-1 equals, in exact arithmetic,
// the reference vec_dot of the block (quant/ref: an exact integer dot per (sub-)block times the scales, the
// min/offset terms of Q4_1/Q5_1/Q2_K/Q4_K/Q5_K applied once per block); only the float rounding of the
// scale products and of the sum differs. Integer parts use __dp4a on int8x4 words, so every unpacked
// quant is first brought to a signed byte (offsets applied with a per-byte subtraction, non-linear levels
// through a 16-entry byte table).
//
// Layouts come from quant/formats.h; offsets and alignments below are derived from those structs. matvec
// requires the weight matrix to start 16-byte aligned; rows are whole numbers of blocks, so a block of
// type_size bytes is aligned to gcd(type_size, 16): the loads use the widest access that alignment allows
// (16 bytes for Q4_K/Q5_K, 4 for Q4_1/Q5_1/Q2_K/IQ4_XS, 2 for the rest, 1 for MXFP4's 17-byte blocks).
// Activation blocks start 256-byte aligned (the workspace) and have sizes 34 (Q8_0, qs 2-byte aligned),
// 36 (Q8_1, qs 4-byte aligned) and 292 (Q8_K, qs 4-byte aligned).
//
// Everything here is __host__ __device__: on the host the intrinsics fall back to scalar code, so the
// unpacking can be checked against the reference on a machine without a GPU.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "quant/formats.h"

#define MAGNETAR_HD __host__ __device__ __forceinline__

namespace magnetar::cuda::mmvq {

using quant::Type;

// ---- scalar helpers: loads, byte-wise integer ops, scales ------------------------------------------------

MAGNETAR_HD float fp16_to_float(uint16_t h) {
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
}

MAGNETAR_HD float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// MXFP4's E8M0 exponent as 2^(e - 128) (quant/fp16.h's e8m0_to_float_half: the table holds doubled values).
MAGNETAR_HD float e8m0_to_float_half(uint8_t e) {
  return bits_to_float(e < 2 ? (0x00200000u << e) : (uint32_t(e - 1) << 23));
}

// Four bytes as a little-endian int from an address aligned to 1, 2 or 4 bytes.
MAGNETAR_HD int load_a1(const uint8_t* p) {
  return int(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}
MAGNETAR_HD int load_a2(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return int(uint32_t(h[0]) | uint32_t(h[1]) << 16);
#else
  int v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
MAGNETAR_HD int load_a4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const int*>(p);
#else
  int v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// Sixteen bytes from a 16-byte aligned address (one 128-bit load on the device).
MAGNETAR_HD void load_a16(const uint8_t* p, int v[4]) {
#ifdef __CUDA_ARCH__
  const int4 t = *reinterpret_cast<const int4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
#else
  std::memcpy(v, p, 16);
#endif
}

// c + sum of the four products of the signed bytes of a and b.
MAGNETAR_HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i) c += int(int8_t(uint32_t(a) >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
  return c;
#endif
}

// c + sum of the four products of the unsigned bytes of a and the signed bytes of b.
MAGNETAR_HD int dp4a_us(uint32_t a, int b, int c) {
#ifdef __CUDA_ARCH__
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  for (int i = 0; i < 4; ++i) c += int(uint8_t(a >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
  return c;
#endif
}

// c + a.h0 * b.b0 + a.h1 * b.b1: the two signed 16-bit halves of a times the signed bytes 0, 1 (lo) or 2, 3 (hi) of b.
MAGNETAR_HD int dp2a_lo(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp2a_lo(a, b, c);
#else
  return c + int(int16_t(uint32_t(a))) * int(int8_t(uint32_t(b))) +
         int(int16_t(uint32_t(a) >> 16)) * int(int8_t(uint32_t(b) >> 8));
#endif
}
MAGNETAR_HD int dp2a_hi(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp2a_hi(a, b, c);
#else
  return c + int(int16_t(uint32_t(a))) * int(int8_t(uint32_t(b) >> 16)) +
         int(int16_t(uint32_t(a) >> 16)) * int(int8_t(uint32_t(b) >> 24));
#endif
}

// Per-byte a - b, modulo 256 (no carries between bytes).
MAGNETAR_HD int sub_bytes(int a, int b) {
#ifdef __CUDA_ARCH__
  return int(__vsub4(uint32_t(a), uint32_t(b)));
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (((uint32_t(a) >> (8 * i)) - (uint32_t(b) >> (8 * i))) & 0xffu) << (8 * i);
  return int(r);
#endif
}

// Byte i of the result is byte (s >> 4i) & 7 of the 8-byte value {hi, lo} (PRMT's default mode).
MAGNETAR_HD uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(lo, hi, s);
#else
  const uint64_t v = uint64_t(hi) << 32 | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// A 16-entry signed byte table packed as four little-endian words (entries 4w .. 4w+3 in word w).
constexpr uint32_t table_word(const int8_t* table, int w) {
  return uint32_t(uint8_t(table[4 * w])) | uint32_t(uint8_t(table[4 * w + 1])) << 8 |
         uint32_t(uint8_t(table[4 * w + 2])) << 16 | uint32_t(uint8_t(table[4 * w + 3])) << 24;
}
// Scalar constants (not arrays) so that device code may use them (CUDA forbids namespace-scope host arrays).
inline constexpr uint32_t kIQ4NLWord0 = table_word(quant::kIQ4NLValues, 0);
inline constexpr uint32_t kIQ4NLWord1 = table_word(quant::kIQ4NLValues, 1);
inline constexpr uint32_t kIQ4NLWord2 = table_word(quant::kIQ4NLValues, 2);
inline constexpr uint32_t kIQ4NLWord3 = table_word(quant::kIQ4NLValues, 3);
inline constexpr uint32_t kMXFP4Word0 = table_word(quant::kMXFP4Values, 0);
inline constexpr uint32_t kMXFP4Word1 = table_word(quant::kMXFP4Values, 1);
inline constexpr uint32_t kMXFP4Word2 = table_word(quant::kMXFP4Values, 2);
inline constexpr uint32_t kMXFP4Word3 = table_word(quant::kMXFP4Values, 3);

// Maps four 4-bit indices (one in the low nibble of each byte of q, high nibbles zero) through a 16-entry
// byte table: two PRMTs pick entry (index & 7) from the lower and the upper half of the table, and bit 3
// of each index selects between them.
template <uint32_t kW0, uint32_t kW1, uint32_t kW2, uint32_t kW3>
MAGNETAR_HD int lookup_nibbles(uint32_t q) {
  const uint32_t sel = (q & 0x7u) | ((q >> 4) & 0x70u) | ((q >> 8) & 0x700u) | ((q >> 12) & 0x7000u);
  const uint32_t lower = byte_perm(kW0, kW1, sel);
  const uint32_t upper = byte_perm(kW2, kW3, sel);
  const uint32_t upper_mask = ((q >> 3) & 0x01010101u) * 0xffu;
  return int((lower & ~upper_mask) | (upper & upper_mask));
}
MAGNETAR_HD int lookup_iq4nl(uint32_t q) { return lookup_nibbles<kIQ4NLWord0, kIQ4NLWord1, kIQ4NLWord2, kIQ4NLWord3>(q); }
MAGNETAR_HD int lookup_mxfp4(uint32_t q) { return lookup_nibbles<kMXFP4Word0, kMXFP4Word1, kMXFP4Word2, kMXFP4Word3>(q); }

// Bits 0..3 of b moved to bit 4 of bytes 0..3 (the 5th bit of four Q5_0/Q5_1 quants).
MAGNETAR_HD int spread_bit4(uint32_t b) {
  return int(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

// Sub-block j's 6-bit scale and min of Q4_K/Q5_K (ggml's get_scale_min_k4; quant/ref/scale_search.h).
MAGNETAR_HD void scale_min_k4(int j, const uint8_t* packed, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Sub-block j's signed 6-bit scale of Q3_K (quant/ref/k_low.cpp's unpack_q3_k_scale).
MAGNETAR_HD int q3_k_scale(const uint8_t* packed, int j) {
  const int low = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

MAGNETAR_HD const uint8_t* bytes(const int8_t* p) { return reinterpret_cast<const uint8_t*>(p); }

// ---- the per-type table ------------------------------------------------------------------------------------

template <Type T>
struct MmvqType;  // no definition: a type without a kernel fails to compile where it is instantiated

// ---- 32-element blocks against Q8_0 / Q8_1: two parts of 16 elements (elements 8p..8p+7 and 16+8p..16+8p+7
// for the 4-bit types, whose element j and j+16 share byte j; elements 16p..16p+15 for Q8_0) ----------------

template <>
struct MmvqType<Type::Q4_0> {
  using Block = quant::BlockQ4_0;
  using Act = quant::BlockQ8_0;
  static constexpr int kParts = 2;
  // x = d * (q - 8): the offset is applied to the nibbles before the dot.
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = uint32_t(load_a2(w.qs + 8 * part + 4 * i));
      const int lo = sub_bytes(int(v & 0x0F0F0F0Fu), 0x08080808);
      const int hi = sub_bytes(int((v >> 4) & 0x0F0F0F0Fu), 0x08080808);
      sumi = dp4a(lo, load_a2(bytes(a.qs) + 8 * part + 4 * i), sumi);
      sumi = dp4a(hi, load_a2(bytes(a.qs) + 16 + 8 * part + 4 * i), sumi);
    }
    return fp16_to_float(w.d) * fp16_to_float(a.d) * float(sumi);
  }
};

template <>
struct MmvqType<Type::Q4_1> {
  using Block = quant::BlockQ4_1;
  using Act = quant::BlockQ8_1;
  static constexpr int kParts = 2;
  // x = d * q + m: sum(x * y) = d * d_y * sum(q * q_y) + m * s_y, the min term once per block (part 0).
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = uint32_t(load_a4(w.qs + 8 * part + 4 * i));
      sumi = dp4a(int(v & 0x0F0F0F0Fu), load_a4(bytes(a.qs) + 8 * part + 4 * i), sumi);
      sumi = dp4a(int((v >> 4) & 0x0F0F0F0Fu), load_a4(bytes(a.qs) + 16 + 8 * part + 4 * i), sumi);
    }
    float r = fp16_to_float(w.d) * fp16_to_float(a.d) * float(sumi);
    if (part == 0) r += fp16_to_float(w.m) * fp16_to_float(a.s);
    return r;
  }
};

template <>
struct MmvqType<Type::Q5_0> {
  using Block = quant::BlockQ5_0;
  using Act = quant::BlockQ8_0;
  static constexpr int kParts = 2;
  // x = d * (q - 16), the 5th bit of element j in bit j of qh.
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const uint32_t qh = uint32_t(load_a2(w.qh));
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const int e = 8 * part + 4 * i;  // first of the four low-nibble elements
      const uint32_t v = uint32_t(load_a2(w.qs + e));
      const int lo = sub_bytes(int(v & 0x0F0F0F0Fu) | spread_bit4((qh >> e) & 0xF), 0x10101010);
      const int hi = sub_bytes(int((v >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (e + 16)) & 0xF), 0x10101010);
      sumi = dp4a(lo, load_a2(bytes(a.qs) + e), sumi);
      sumi = dp4a(hi, load_a2(bytes(a.qs) + 16 + e), sumi);
    }
    return fp16_to_float(w.d) * fp16_to_float(a.d) * float(sumi);
  }
};

template <>
struct MmvqType<Type::Q5_1> {
  using Block = quant::BlockQ5_1;
  using Act = quant::BlockQ8_1;
  static constexpr int kParts = 2;
  // x = d * q + m with a 5th bit as Q5_0; the min term as Q4_1.
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const uint32_t qh = uint32_t(load_a4(w.qh));
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const int e = 8 * part + 4 * i;
      const uint32_t v = uint32_t(load_a4(w.qs + e));
      const int lo = int(v & 0x0F0F0F0Fu) | spread_bit4((qh >> e) & 0xF);
      const int hi = int((v >> 4) & 0x0F0F0F0Fu) | spread_bit4((qh >> (e + 16)) & 0xF);
      sumi = dp4a(lo, load_a4(bytes(a.qs) + e), sumi);
      sumi = dp4a(hi, load_a4(bytes(a.qs) + 16 + e), sumi);
    }
    float r = fp16_to_float(w.d) * fp16_to_float(a.d) * float(sumi);
    if (part == 0) r += fp16_to_float(w.m) * fp16_to_float(a.s);
    return r;
  }
};

template <>
struct MmvqType<Type::Q8_0> {
  using Block = quant::BlockQ8_0;
  using Act = quant::BlockQ8_0;
  static constexpr int kParts = 2;
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    int sumi = 0;
    for (int i = 0; i < 4; ++i) {
      sumi = dp4a(load_a2(bytes(w.qs) + 16 * part + 4 * i), load_a2(bytes(a.qs) + 16 * part + 4 * i), sumi);
    }
    return float(sumi) * (fp16_to_float(w.d) * fp16_to_float(a.d));
  }
};

template <>
struct MmvqType<Type::IQ4_NL> {
  using Block = quant::BlockIQ4_NL;
  using Act = quant::BlockQ8_0;
  static constexpr int kParts = 2;
  // x = d * kIQ4NLValues[q]; nibble order as Q4_0.
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = uint32_t(load_a2(w.qs + 8 * part + 4 * i));
      sumi = dp4a(lookup_iq4nl(v & 0x0F0F0F0Fu), load_a2(bytes(a.qs) + 8 * part + 4 * i), sumi);
      sumi = dp4a(lookup_iq4nl((v >> 4) & 0x0F0F0F0Fu), load_a2(bytes(a.qs) + 16 + 8 * part + 4 * i), sumi);
    }
    return fp16_to_float(a.d) * fp16_to_float(w.d) * float(sumi);
  }
};

template <>
struct MmvqType<Type::MXFP4> {
  using Block = quant::BlockMXFP4;
  using Act = quant::BlockQ8_0;
  static constexpr int kParts = 2;
  // x = 2^(e - 128) * kMXFP4Values[q]; 17-byte blocks, so byte loads.
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = uint32_t(load_a1(w.qs + 8 * part + 4 * i));
      sumi = dp4a(lookup_mxfp4(v & 0x0F0F0F0Fu), load_a2(bytes(a.qs) + 8 * part + 4 * i), sumi);
      sumi = dp4a(lookup_mxfp4((v >> 4) & 0x0F0F0F0Fu), load_a2(bytes(a.qs) + 16 + 8 * part + 4 * i), sumi);
    }
    return fp16_to_float(a.d) * e8m0_to_float_half(w.e) * float(sumi);
  }
};

// ---- 256-element super-blocks against Q8_K -----------------------------------------------------------------

// Q2_K: element 128h + 32s + l (half h, l < 32) is bits 2s..2s+1 of qs[32h + l]; sub-block j of 16 is
// 8h + 2s + l / 16. Part p = 2h + c takes l in [16c, 16c + 16) for all four s: four whole sub-blocks, so
// it also applies their four mins through the activation's bsums.
template <>
struct MmvqType<Type::Q2_K> {
  using Block = quant::BlockQ2_K;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 4;
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const int h = part / 2;
    const int l0 = 16 * (part % 2);
    int v[4];
    for (int i = 0; i < 4; ++i) v[i] = load_a4(w.qs + 32 * h + l0 + 4 * i);
    int sumi = 0;
    int summ = 0;
    for (int s = 0; s < 4; ++s) {
      const int j = 8 * h + 2 * s + part % 2;
      int sub = 0;
      for (int i = 0; i < 4; ++i) {
        const int q = int((uint32_t(v[i]) >> (2 * s)) & 0x03030303u);
        sub = dp4a(q, load_a4(bytes(a.qs) + 128 * h + 32 * s + l0 + 4 * i), sub);
      }
      sumi += (w.scales[j] & 0xF) * sub;
      summ += (w.scales[j] >> 4) * a.bsums[j];
    }
    return a.d * fp16_to_float(w.d) * float(sumi) - a.d * fp16_to_float(w.dmin) * float(summ);
  }
};

// Q3_K: 2 low bits as Q2_K; the high bit of element e is bit e / 32 of hmask[e % 32] (clear: subtract 4).
// Parts as Q2_K (element 128h + 32s + l has its high bit in bit 4h + s of hmask[l]).
template <>
struct MmvqType<Type::Q3_K> {
  using Block = quant::BlockQ3_K;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 4;
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const int h = part / 2;
    const int l0 = 16 * (part % 2);
    int v[4];
    int hm[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = load_a2(w.qs + 32 * h + l0 + 4 * i);
      hm[i] = load_a2(w.hmask + l0 + 4 * i);
    }
    int sumi = 0;
    for (int s = 0; s < 4; ++s) {
      const int j = 8 * h + 2 * s + part % 2;
      int sub = 0;
      for (int i = 0; i < 4; ++i) {
        const uint32_t low = (uint32_t(v[i]) >> (2 * s)) & 0x03030303u;
        const uint32_t high = (uint32_t(hm[i]) >> (4 * h + s)) & 0x01010101u;
        const int q = sub_bytes(int(low | (high << 2)), 0x04040404);
        sub = dp4a(q, load_a4(bytes(a.qs) + 128 * h + 32 * s + l0 + 4 * i), sub);
      }
      sumi += q3_k_scale(w.scales, j) * sub;
    }
    return fp16_to_float(w.d) * a.d * float(sumi);
  }
};

// Q4_K: for k = 0..3, sub-block 2k (of 32) is the low nibbles of qs[32k .. 32k+31], sub-block 2k+1 the high
// nibbles. Part p = 2k + h takes bytes qs[32k + 16h .. +15] (one 16-byte load): half of each of the two
// sub-blocks, with the mins of those halves applied through bsums[4k + h] and bsums[4k + 2 + h].
template <>
struct MmvqType<Type::Q4_K> {
  using Block = quant::BlockQ4_K;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 8;
  // What part p of an activation block contributes whatever the weight row: its 32 quants (8 words: elements
  // 64k + 16h .. + 15 and 64k + 32 + 16h .. + 15, k = p / 2, h = p % 2), the two block sums of 16 they fall in,
  // and the scale. dot() loads it before the weight side: written as one function with the loads interleaved, the
  // rows kernel's one-row form takes 39 registers instead of 32 (ptxas sm_90), and 32 is what was measured. The
  // stationary kernel (mmvq.cu) keeps a lane's activation parts in registers for all its rows.
  struct ActPart {
    int lo[4];
    int hi[4];
    int bsums;  // the two block sums, lo in the low 16 bits (each at most 16 * 128 in magnitude)
    float d;
  };
  static MAGNETAR_HD ActPart act_part(const Act& a, int part) {
    const int k = part / 2;
    const int h = part % 2;
    const uint8_t* y = bytes(a.qs) + 64 * k + 16 * h;
    ActPart x;
    for (int i = 0; i < 4; ++i) {
      x.lo[i] = load_a4(y + 4 * i);
      x.hi[i] = load_a4(y + 32 + 4 * i);
    }
    x.bsums = int(uint32_t(uint16_t(a.bsums[4 * k + h])) | uint32_t(uint16_t(a.bsums[4 * k + 2 + h])) << 16);
    x.d = a.d;
    return x;
  }
  static_assert(sizeof(Block) % 16 == 0 && offsetof(Block, qs) == 16, "load_part's 16-byte loads");
  // What part p reads of a weight block: the block's first 16 bytes (d, dmin, the 12 scale bytes; the block is 144
  // bytes, so they are one 16-byte load) and its 16 quant bytes qs[32k + 16h ..]. Loaded apart from the arithmetic so
  // that the stationary kernel (mmvq.cu) can issue the loads of several rows before using any.
  struct WeightPart {
    int head[4];
    int q[4];
  };
  static MAGNETAR_HD WeightPart load_part(const Block& w, int part) {
    WeightPart p;
    load_a16(reinterpret_cast<const uint8_t*>(&w), p.head);
    load_a16(w.qs + 16 * part, p.q);  // 32k + 16h = 16p
    return p;
  }
  // The 6-bit scales and mins of sub-blocks 2k and 2k + 1 (get_scale_min_k4 on the scale words s0 = scales[0..3],
  // s1 = [4..7], s2 = [8..11]) as the bytes [scale 2k, scale 2k + 1, min 2k, min 2k + 1] of one word. k < 2: bytes
  // 2k, 2k + 1 of s0 (scales) and of s1 (mins), 6 bits each. k >= 2, j = 2k - 4: the low (scales) and high (mins)
  // nibbles of bytes j, j + 1 of s2, with the top 2 bits of the same bytes of s0 (scales) and s1 (mins) as bits 4-5.
  static MAGNETAR_HD uint32_t scales_mins(uint32_t s0, uint32_t s1, uint32_t s2, int k) {
    const uint32_t j = uint32_t(k < 2 ? 2 * k : 2 * k - 4);
    const uint32_t a = byte_perm(s0, s1, j | (j + 1) << 4 | (j + 4) << 8 | (j + 5) << 12);
    const uint32_t b = byte_perm(s2, s2, j | (j + 1) << 4 | j << 8 | (j + 1) << 12);
    const uint32_t high = (b & 0x00000F0Fu) | ((b >> 4) & 0x0F0F0000u) | ((a >> 2) & 0x30303030u);
    return k < 2 ? a & 0x3F3F3F3Fu : high;
  }
  // Part p of one weight block against an activation part. The integer sums are exact (scale times quant dot, each
  // dot of 16 quants of 0..15 with 16 int8 at most 30,720 in magnitude: int16, so both products take one dp2a).
  static MAGNETAR_HD float dot_loaded(const WeightPart& w, const ActPart& x, int part) {
    int dot_lo = 0;
    int dot_hi16 = 0;  // 16 times the high nibbles' dot: each taken in place, as 16 q
    for (int i = 0; i < 4; ++i) {
      dot_lo = dp4a(int(uint32_t(w.q[i]) & 0x0F0F0F0Fu), x.lo[i], dot_lo);
      dot_hi16 = dp4a_us(uint32_t(w.q[i]) & 0xF0F0F0F0u, x.hi[i], dot_hi16);
    }
    const int dot_hi = dot_hi16 >> 4;  // exact: a multiple of 16
    const int sm = int(scales_mins(uint32_t(w.head[1]), uint32_t(w.head[2]), uint32_t(w.head[3]), part / 2));
    const int dots = int(byte_perm(uint32_t(dot_lo), uint32_t(dot_hi), 0x5410));  // the low halves, dot_lo first
    const int sumi = dp2a_lo(dots, sm, 0);
    const int summ = dp2a_hi(x.bsums, sm, 0);
    const uint32_t dm = uint32_t(w.head[0]);
    return fp16_to_float(uint16_t(dm)) * x.d * float(sumi) - fp16_to_float(uint16_t(dm >> 16)) * x.d * float(summ);
  }
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const ActPart x = act_part(a, part);
    return dot_loaded(load_part(w, part), x, part);
  }
};

// Q5_K: Q4_K plus the 5th bit of element 64k + l (l < 32) in bit 2k of qh[l], of 64k + 32 + l in bit 2k+1.
template <>
struct MmvqType<Type::Q5_K> {
  using Block = quant::BlockQ5_K;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 8;
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const int k = part / 2;
    const int h = part % 2;
    int v[4];
    int hv[4];
    load_a16(w.qs + 32 * k + 16 * h, v);
    load_a16(w.qh + 16 * h, hv);
    const uint8_t* y = bytes(a.qs) + 64 * k + 16 * h;
    int dot_lo = 0;
    int dot_hi = 0;
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = uint32_t(v[i]);
      const uint32_t qh = uint32_t(hv[i]);
      const int lo = int((q & 0x0F0F0F0Fu) | (((qh >> (2 * k)) & 0x01010101u) << 4));
      const int hi = int(((q >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * k + 1)) & 0x01010101u) << 4));
      dot_lo = dp4a(lo, load_a4(y + 4 * i), dot_lo);
      dot_hi = dp4a(hi, load_a4(y + 32 + 4 * i), dot_hi);
    }
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * k, w.scales, &sc0, &m0);
    scale_min_k4(2 * k + 1, w.scales, &sc1, &m1);
    const int sumi = sc0 * dot_lo + sc1 * dot_hi;
    const int summ = m0 * a.bsums[4 * k + h] + m1 * a.bsums[4 * k + 2 + h];
    return fp16_to_float(w.d) * a.d * float(sumi) - fp16_to_float(w.dmin) * a.d * float(summ);
  }
};

// Q6_K: element 128h + 32g + l (l < 32) has its low 4 bits in ql[64h + l + 32 (g & 1)] (low nibble for
// g < 2, high otherwise) and its high 2 bits in bits 2g..2g+1 of qh[32h + l]; q - 32, int8 scale per 16.
// Part p = 4h + c takes l in [8c, 8c + 8) for all four g: 32 elements, each group of 8 in one sub-block.
template <>
struct MmvqType<Type::Q6_K> {
  using Block = quant::BlockQ6_K;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 8;
  // The stationary kernel's split of dot() (as Q4_K's): part p = 4h + l0 / 8 takes elements 128h + 32g + l0 .. + 7
  // for g = 0..3 (the four 32-element groups of half h, each 8 elements at l0). A block is 210 bytes, so a row's
  // blocks are only 2-byte aligned: every word is two 2-byte loads, as in dot().
  struct ActPart {
    int y[8];  // y[2g + i]: the activation word at 128h + 32g + l0 + 4i
    float d;
  };
  static MAGNETAR_HD ActPart act_part(const Act& a, int part) {
    const int h = part / 4;
    const int l0 = 8 * (part % 4);
    ActPart x;
    for (int g = 0; g < 4; ++g) {
      for (int i = 0; i < 2; ++i) x.y[2 * g + i] = load_a4(bytes(a.qs) + 128 * h + 32 * g + l0 + 4 * i);
    }
    x.d = a.d;
    return x;
  }
  struct WeightPart {
    int ql0[2];
    int ql1[2];
    int qh[2];
    uint32_t scales;  // scales[8h + 2g + l0 / 16] as byte g, g = 0..3
    uint32_t d;       // the block's f16 scale in the low half
  };
  static MAGNETAR_HD WeightPart load_part(const Block& w, int part) {
    const int h = part / 4;
    const int l0 = 8 * (part % 4);
    WeightPart p;
    for (int i = 0; i < 2; ++i) {
      p.ql0[i] = load_a2(w.ql + 64 * h + l0 + 4 * i);
      p.ql1[i] = load_a2(w.ql + 64 * h + 32 + l0 + 4 * i);
      p.qh[i] = load_a2(w.qh + 32 * h + l0 + 4 * i);
    }
    // The part's scales are bytes 0, 2, 4, 6 (l0 < 16) or 1, 3, 5, 7 of scales[8h .. 8h + 7].
    const uint8_t* sc = reinterpret_cast<const uint8_t*>(w.scales) + 8 * h;
    p.scales = byte_perm(uint32_t(load_a2(sc)), uint32_t(load_a2(sc + 4)), l0 < 16 ? 0x6420u : 0x7531u);
    p.d = w.d;
    return p;
  }
  // The integer sums are dot()'s, so each part's float is dot()'s bit for bit.
  static MAGNETAR_HD float dot_loaded(const WeightPart& w, const ActPart& x, int) {
    int dots[4] = {0, 0, 0, 0};
    for (int i = 0; i < 2; ++i) {
      const uint32_t ql0 = uint32_t(w.ql0[i]);
      const uint32_t ql1 = uint32_t(w.ql1[i]);
      const uint32_t qh = uint32_t(w.qh[i]);
      const uint32_t q[4] = {
          (ql0 & 0x0F0F0F0Fu) | ((qh << 4) & 0x30303030u),
          (ql1 & 0x0F0F0F0Fu) | ((qh << 2) & 0x30303030u),
          ((ql0 >> 4) & 0x0F0F0F0Fu) | (qh & 0x30303030u),
          ((ql1 >> 4) & 0x0F0F0F0Fu) | ((qh >> 2) & 0x30303030u),
      };
      for (int g = 0; g < 4; ++g) dots[g] = dp4a(sub_bytes(int(q[g]), 0x20202020), x.y[2 * g + i], dots[g]);
    }
    int sumi = 0;
    for (int g = 0; g < 4; ++g) sumi += int(int8_t(w.scales >> (8 * g))) * dots[g];
    return fp16_to_float(uint16_t(w.d)) * x.d * float(sumi);
  }
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const int h = part / 4;
    const int l0 = 8 * (part % 4);
    int dots[4] = {0, 0, 0, 0};
    for (int i = 0; i < 2; ++i) {
      const uint32_t ql0 = uint32_t(load_a2(w.ql + 64 * h + l0 + 4 * i));
      const uint32_t ql1 = uint32_t(load_a2(w.ql + 64 * h + 32 + l0 + 4 * i));
      const uint32_t qh = uint32_t(load_a2(w.qh + 32 * h + l0 + 4 * i));
      const uint32_t q[4] = {
          (ql0 & 0x0F0F0F0Fu) | ((qh << 4) & 0x30303030u),
          (ql1 & 0x0F0F0F0Fu) | ((qh << 2) & 0x30303030u),
          ((ql0 >> 4) & 0x0F0F0F0Fu) | (qh & 0x30303030u),
          ((ql1 >> 4) & 0x0F0F0F0Fu) | ((qh >> 2) & 0x30303030u),
      };
      for (int g = 0; g < 4; ++g) {
        const int y = load_a4(bytes(a.qs) + 128 * h + 32 * g + l0 + 4 * i);
        dots[g] = dp4a(sub_bytes(int(q[g]), 0x20202020), y, dots[g]);
      }
    }
    int sumi = 0;
    for (int g = 0; g < 4; ++g) sumi += int(w.scales[8 * h + 2 * g + l0 / 16]) * dots[g];
    return fp16_to_float(w.d) * a.d * float(sumi);
  }
};

// IQ4_XS: 8 sub-blocks of 32 with 6-bit scales (4 low bits in scales_l, 2 high in scales_h, offset 32);
// within sub-block ib, element j < 16 is the low nibble of qs[16 ib + j], element j + 16 the high one.
// One part per sub-block.
template <>
struct MmvqType<Type::IQ4_XS> {
  using Block = quant::BlockIQ4_XS;
  using Act = quant::BlockQ8_K;
  static constexpr int kParts = 8;
  static MAGNETAR_HD float dot(const Block& w, const Act& a, int part) {
    const int ib = part;
    const uint8_t* y = bytes(a.qs) + 32 * ib;
    int sumi = 0;
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = uint32_t(load_a4(w.qs + 16 * ib + 4 * i));
      sumi = dp4a(lookup_iq4nl(v & 0x0F0F0F0Fu), load_a4(y + 4 * i), sumi);
      sumi = dp4a(lookup_iq4nl((v >> 4) & 0x0F0F0F0Fu), load_a4(y + 16 + 4 * i), sumi);
    }
    const int ls = (((w.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w.scales_h >> (2 * ib)) & 3) << 4)) - 32;
    return fp16_to_float(w.d) * a.d * float(ls * sumi);
  }
};

// ---- the activation-stationary kernel's row shapes (mmvq.cu; mmvq_bulk.cu takes the same) ----------------------

// Groups of kQ consecutive rows whose parts tile whole warps, kJ parts per lane (at most 8): items (the parts of a
// row) times kQ is 32 kJ. kJ == 0 where the row does not fit.
struct StationaryShape {
  int kJ = 0;
  int kQ = 1;
};
inline StationaryShape stationary_shape(int items) {
  constexpr int kLanes = 32;
  StationaryShape s;
  int g = items;  // gcd(items, 32)
  for (int b = kLanes; b != 0;) {
    const int t = g % b;
    g = b;
    b = t;
  }
  s.kQ = kLanes / g;
  const int j = items * s.kQ / kLanes;
  if (s.kQ <= 4 && j <= 8) s.kJ = j;
  return s;
}

// A lane's kJ parts of a row group in that kernel's layout (mmvq.cu; mmvq_bulk.cu): part f = lane + 32 j of the group's
// kQ rows of `items` parts each is row f / items of the group, block (f % items) / kParts of that row and part
// (f % items) % kParts of the block; the same in every group, so a lane's activation parts never change.
template <int kJ>
struct LaneParts {
  int row_of[kJ];
  int block[kJ];
  int part[kJ];
};
template <int kJ, int kParts>
MAGNETAR_HD LaneParts<kJ> lane_parts(int lane, int items) {
  LaneParts<kJ> p;
  for (int j = 0; j < kJ; ++j) {
    const int f = lane + 32 * j;
    const int it = f % items;
    p.row_of[j] = f / items;
    p.block[j] = it / kParts;
    p.part[j] = it % kParts;
  }
  return p;
}

// The row groups a warp takes at once (its kJ kR weight parts in flight per lane, per matrix): enough for 4 or more
// parts where kJ allows, at most 8 rows per warp, halved for a SwiGLU launch (gate and up: both matrices' parts in
// flight). kJ = 3 (rows of 768, 1,536 or 3,072 columns: an expert's down projection) takes 2, 6 parts: 8 rows per
// warp instead of 4 added ~1% to tg128 (H200, 2026-12-01, docs/benchmarks/2026-12-01-cuda-decode-down-rows.md);
// 8 parts for gate/up (no halving) cost ~1.5%.
MAGNETAR_HD constexpr int stationary_groups(int kJ, int kQ, bool glu) {
  const int r4 = (4 + kJ - 1) / kJ;  // the row groups that put 4 or more parts in flight
  const int r0 = kJ >= 4 ? 1 : r4 * kQ <= 8 ? r4 : 8 / kQ;
  return glu && r0 > 1 ? r0 / 2 : r0;
}

}  // namespace magnetar::cuda::mmvq
