// Every quantized block layout Magnetar reads, byte-compatible with the GGUF files llama.cpp writes.
//
// This header is the single definition of each block: CPU reference code, SIMD kernels and CUDA kernels
// all include it (it is plain C++ with no standard-library dependency beyond <cstdint>, so nvcc accepts
// it). Half-precision scalars are stored as raw uint16_t bit patterns; quant/fp16.h converts them.
// Sizes are static_assert'ed: a layout change that would silently break file compatibility fails to build.
#pragma once

#include <cstdint>

namespace magnetar::quant {

// ggml's type ids as stored in GGUF tensor infos. Values are part of the file format: never renumber.
// Ids that ggml retired (4, 5, 31-33, 36-38) and the types Magnetar does not implement are absent;
// find_traits() returns nullptr for them so readers can name the unsupported id.
enum class Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  MXFP4 = 39,
  // Not a GGUF type: the KV cache's FP8 E4M3, one byte per element (quant/fp8.h). row_size and type_name know it;
  // the trait table (weights' kernels) does not, and no GGUF file can name it (its id is past ggml's).
  F8_E4M3 = 0x100,
};

// Elements per block.
inline constexpr int kQK32 = 32;    // the "legacy" 32-element blocks: Q4_0 ... Q8_1, IQ4_NL, MXFP4
inline constexpr int kQK_K = 256;   // K-quant super-blocks: Q2_K ... Q8_K, IQ4_XS
inline constexpr int kKScaleSize = 12;  // packed 6-bit scales+mins of Q4_K/Q5_K, packed scales of Q3_K

// ---- 32-element blocks -------------------------------------------------------------------------------
// x[i] = d * (q[i] - 8); q is 4-bit, element j in low nibble of qs[j], element j+16 in high nibble.
struct BlockQ4_0 {
  uint16_t d;        // fp16 scale
  uint8_t qs[kQK32 / 2];
};
// x[i] = d * q[i] + m
struct BlockQ4_1 {
  uint16_t d;        // fp16 scale
  uint16_t m;        // fp16 min
  uint8_t qs[kQK32 / 2];
};
// x[i] = d * (q[i] - 16); the 5th bit of element j is bit j of qh (little-endian uint32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK32 / 2];
};
// x[i] = d * q[i]
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK32];
};
// Activation type for Q4_1/Q5_1: s = d * sum(q[i]) lets the dot product apply the weight block's min.
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK32];
};
// x[i] = d * kIQ4NLValues[q[i]]; nibble order as Q4_0.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK32 / 2];
};
// OCP microscaling FP4: x[i] = 2^(e-128) * kMXFP4Values[q[i]] where kMXFP4Values are the E2M1 values
// doubled (so the shared E8M0 exponent is offset by one); nibble order as Q4_0.
struct BlockMXFP4 {
  uint8_t e;         // E8M0 shared exponent
  uint8_t qs[kQK32 / 2];
};

// ---- 256-element super-blocks ------------------------------------------------------------------------
// 16 sub-blocks of 16; scales[j] low nibble = 4-bit scale, high nibble = 4-bit min;
// x = d * sc * q - dmin * m with 2-bit q.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
// 16 sub-blocks of 16; 3-bit q = 2 low bits in qs + high bit in hmask (set = no offset, clear = -4);
// 6-bit signed scales (offset 32) packed in 12 bytes.
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[kKScaleSize];
  uint16_t d;
};
// 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes; x = d * sc * q - dmin * m, 4-bit q.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
// As Q4_K plus a 5th bit per element in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16; 6-bit q = 4 low bits in ql + 2 high bits in qh, minus 32; int8 scales.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// Activation type for the K-quants and IQ4_XS: float scale, int8 values, sums of each 16 values.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
// 8 sub-blocks of 32 with 6-bit scales (4 low bits in scales_l, 2 high bits in scales_h, offset 32);
// values through the IQ4_NL table.
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_XS) == 136);

// The 16 non-linear levels of IQ4_NL / IQ4_XS (part of the format).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// E2M1 magnitudes times two: 0, 0.5, 1, 1.5, 2, 3, 4, 6 -> 0, 1, 2, 3, 4, 6, 8, 12, then negatives.
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace magnetar::quant
