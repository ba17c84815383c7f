// Scalar references for the 32-element block family: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, MXFP4.
//
// What "reference" means here, per operation:
//   dequantize  bit-exact with ggml's dequantize_row_*: the same float operations in the same order, and
//               `q * d + m` as a rounded multiply followed by a rounded add, never one FMA (see
//               mul_then_add; ggml's reference code is built without FMA contraction).
//   quantize    ggml's quantize_row_*_ref algorithms (quantize_iq4_nl without an importance matrix for
//               IQ4_NL), so a tensor quantized here matches what llama-quantize --pure writes.
//   vec_dot     ggml's generic quants.c formulation: an exact integer dot per block, scaled by the block
//               scales and accumulated in float, block after block. SIMD kernels reorder that float sum, so
//               they are compared with this within a tolerance, not bit for bit.
// Nibble order of every 4-bit type: element j is the low nibble of qs[j], element j + 16 the high nibble.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/ref/ref.h"

namespace magnetar::quant::ref {
namespace {

constexpr int kHalf = kQK32 / 2;

// ---- shared helpers ------------------------------------------------------------------------------------
// Block counting, unfused multiply-add, the 5th-bit word of Q5_*, and the searches the quantizers share.

// a * b + c with two roundings. GCC's C++ default is -ffp-contract=fast: wherever the target has FMA
// (-march=native, AArch64) it would fuse the two operations across statements and change the last bit of
// Q4_1/Q5_1 values and the quantizers' codes at rounding boundaries. The empty asm makes the product an
// opaque, already rounded value.
inline float mul_then_add(float a, float b, float c) {
  float p = a * b;
#if defined(__GNUC__)
  __asm__("" : "+m"(p));
#endif
  return p + c;
}

int64_t block_count(int64_t n) {
  MAGNETAR_CHECK(n >= 0 && n % kQK32 == 0);
  return n / kQK32;
}

// Q5_0 / Q5_1 store the 5th bit of element j as bit j of a little-endian 32-bit word.
uint32_t load_qh(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
void store_qh(uint32_t v, uint8_t qh[4]) {
  for (int i = 0; i < 4; ++i) qh[i] = uint8_t(v >> (8 * i));
}

// The element of largest magnitude, keeping its sign (the first one on ties), as Q4_0/Q5_0/IQ4_NL pick it.
float signed_abs_max(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Smallest and largest element; on equal values the first one wins (this matters for the sign of zero).
struct MinMax {
  float min;
  float max;
};
MinMax min_max(const float* x, int n) {
  MinMax r{x[0], x[0]};
  for (int j = 1; j < n; ++j) {
    if (x[j] < r.min) r.min = x[j];
    if (x[j] > r.max) r.max = x[j];
  }
  return r;
}

float abs_max(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

// Index of the level of the ascending table `values` nearest to x; a tie between two levels picks the
// upper one. Comparing 2x with the (exact, integer) sum of two neighbours decides on the true midpoint
// without a rounded subtraction.
int nearest_level(const int8_t* values, int n_values, float x) {
  const float x2 = x + x;
  int idx = 0;
  for (int j = 1; j < n_values; ++j) {
    if (x2 >= float(int(values[j - 1]) + int(values[j]))) idx = j;
  }
  return idx;
}

// Index of the MXFP4 level nearest to x at half-scale d; the first index wins a tie. kMXFP4Values is not
// sorted (it is sign-magnitude), so this is the plain search ggml's quantize_row_mxfp4_ref does, with the
// same float error expression.
int nearest_mxfp4(float x, float d) {
  int best = 0;
  float best_err = std::fabs(float(kMXFP4Values[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(float(kMXFP4Values[i]) * d - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return best;
}

// A code from its rounding-biased value (v = x / d + offset + 0.5): truncated as ggml's integer cast does,
// clamped to [0, top] (only the element opposite the block's extreme can reach top + 1).
uint8_t to_code(float v, int top) { return uint8_t(std::clamp(int(v), 0, top)); }

// Splits 32 4-bit codes into the packed nibble layout.
void pack_nibbles(const uint8_t* codes, uint8_t* qs) {
  for (int j = 0; j < kHalf; ++j) qs[j] = uint8_t(codes[j] | codes[j + kHalf] << 4);
}

// ---- IQ4_NL scale search -------------------------------------------------------------------------------
// ggml's quantize_iq4_nl without importance weights (weights = x^2, ntry = 7): start from d = max / 127
// (max the signed largest-magnitude element), refine by least squares, then try the 15 scales that map max
// onto -127 + itry, itry in [-7, 7], and keep the best weighted fit (largest sumqx^2 / sumq2, i.e. the
// smallest weighted squared error at the least-squares scale). Codes are then re-picked for the final d.

constexpr int kIQ4NLTries = 7;
// Blocks whose largest magnitude is below this are stored as all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

struct FitSums {
  float sumqx = 0.0f;  // sum w * q * x
  float sumq2 = 0.0f;  // sum w * q * q
};

// Weighted fit sums when every element takes the level nearest to x * id.
FitSums iq4nl_fit(const float* x, const float* w, float id) {
  FitSums s;
  for (int j = 0; j < kQK32; ++j) {
    const float q = kIQ4NLValues[nearest_level(kIQ4NLValues, 16, id * x[j])];
    s.sumqx = mul_then_add(w[j] * q, x[j], s.sumqx);
    s.sumq2 = mul_then_add(w[j] * q, q, s.sumq2);
  }
  return s;
}

void quantize_block_iq4_nl(const float* x, BlockIQ4_NL& y) {
  float w[kQK32];
  for (int j = 0; j < kQK32; ++j) w[j] = x[j] * x[j];
  const float max = signed_abs_max(x, kQK32);

  float d = 0.0f;
  if (std::fabs(max) >= kGroupMaxEps) {
    const float v0 = kIQ4NLValues[0];
    FitSums s = iq4nl_fit(x, w, 1.0f / (-max / v0));
    d = s.sumq2 > 0 ? s.sumqx / s.sumq2 : 0.0f;
    float best = d * s.sumqx;
    for (int itry = -kIQ4NLTries; itry <= kIQ4NLTries; ++itry) {
      const float id = float(itry + kIQ4NLValues[0]) / max;
      s = iq4nl_fit(x, w, id);
      if (s.sumq2 > 0 && s.sumqx * s.sumqx > best * s.sumq2) {
        d = s.sumqx / s.sumq2;
        best = d * s.sumqx;
      }
    }
  }
  // Codes are chosen against the unrounded scale (as ggml does); the fp16 rounding of d costs < 2^-11.
  y.d = float_to_fp16(d);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint8_t codes[kQK32];
  for (int j = 0; j < kQK32; ++j) codes[j] = uint8_t(nearest_level(kIQ4NLValues, 16, id * x[j]));
  pack_nibbles(codes, y.qs);
}

}  // namespace

// ---- Q4_0: x = d * (q - 8) -----------------------------------------------------------------------------

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = float((x[i].qs[j] & 0x0f) - 8) * d;
      dst[j + kHalf] = float((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// d = max / -8 maps the largest-magnitude element to code 0 exactly; its opposite clamps at code 15.
void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    const float d = signed_abs_max(src, kQK32) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_fp16(d);
    uint8_t codes[kQK32];
    for (int j = 0; j < kQK32; ++j) codes[j] = to_code(mul_then_add(src[j], id, 8.5f), 15);
    pack_nibbles(codes, y[i].qs);
  }
}

float vec_dot_q4_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ4_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += ((x[i].qs[j] & 0x0f) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + kHalf];
    }
    sum += float(sumi) * fp16_to_float(x[i].d) * fp16_to_float(y[i].d);
  }
  return sum;
}

// ---- Q4_1: x = d * q + m -------------------------------------------------------------------------------

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    const float m = fp16_to_float(x[i].m);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = mul_then_add(float(x[i].qs[j] & 0x0f), d, m);
      dst[j + kHalf] = mul_then_add(float(x[i].qs[j] >> 4), d, m);
    }
  }
}

// The block's [min, max] range split into 15 steps; codes round half up from the min.
void quantize_q4_1(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    const auto [min, max] = min_max(src, kQK32);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_fp16(d);
    y[i].m = float_to_fp16(min);
    uint8_t codes[kQK32];
    for (int j = 0; j < kQK32; ++j) codes[j] = to_code(mul_then_add(src[j] - min, id, 0.5f), 15);
    pack_nibbles(codes, y[i].qs);
  }
}

float vec_dot_q4_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ4_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += (x[i].qs[j] & 0x0f) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + kHalf];
    }
    // y.s = d_y * sum(q_y) carries the min term: sum(m * d_y * q_y) = m * s.
    sum += fp16_to_float(x[i].d) * fp16_to_float(y[i].d) * float(sumi) +
           fp16_to_float(x[i].m) * fp16_to_float(y[i].s);
  }
  return sum;
}

// ---- Q5_0: x = d * (q - 16), 5th bit in qh ----------------------------------------------------------------

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (x[i].qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int q1 = (x[i].qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      dst[j] = float(q0 - 16) * d;
      dst[j + kHalf] = float(q1 - 16) * d;
    }
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    const float d = signed_abs_max(src, kQK32) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_fp16(d);
    uint8_t codes[kQK32];
    uint32_t qh = 0;
    for (int j = 0; j < kQK32; ++j) {
      codes[j] = to_code(mul_then_add(src[j], id, 16.5f), 31);
      qh |= uint32_t(codes[j] >> 4) << j;
      codes[j] &= 0x0f;
    }
    store_qh(qh, y[i].qh);
    pack_nibbles(codes, y[i].qs);
  }
}

float vec_dot_q5_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ5_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (x[i].qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int q1 = (x[i].qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      sumi += (q0 - 16) * y[i].qs[j] + (q1 - 16) * y[i].qs[j + kHalf];
    }
    sum += fp16_to_float(x[i].d) * fp16_to_float(y[i].d) * float(sumi);
  }
  return sum;
}

// ---- Q5_1: x = d * q + m, 5th bit in qh -------------------------------------------------------------------

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    const float m = fp16_to_float(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (x[i].qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int q1 = (x[i].qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      dst[j] = mul_then_add(float(q0), d, m);
      dst[j + kHalf] = mul_then_add(float(q1), d, m);
    }
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    const auto [min, max] = min_max(src, kQK32);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = float_to_fp16(d);
    y[i].m = float_to_fp16(min);
    uint8_t codes[kQK32];
    uint32_t qh = 0;
    for (int j = 0; j < kQK32; ++j) {
      codes[j] = to_code(mul_then_add(src[j] - min, id, 0.5f), 31);
      qh |= uint32_t(codes[j] >> 4) << j;
      codes[j] &= 0x0f;
    }
    store_qh(qh, y[i].qh);
    pack_nibbles(codes, y[i].qs);
  }
}

float vec_dot_q5_1(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ5_1*>(vx);
  const auto* y = static_cast<const BlockQ8_1*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    const uint32_t qh = load_qh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      const int q0 = (x[i].qs[j] & 0x0f) | int((qh >> j) & 1) << 4;
      const int q1 = (x[i].qs[j] >> 4) | int((qh >> (j + kHalf)) & 1) << 4;
      sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + kHalf];
    }
    sum += fp16_to_float(x[i].d) * fp16_to_float(y[i].d) * float(sumi) +
           fp16_to_float(x[i].m) * fp16_to_float(y[i].s);
  }
  return sum;
}

// ---- Q8_0 and Q8_1: x = d * q ----------------------------------------------------------------------------
// Both quantize with d = amax / 127 and round half away from zero (roundf), which the AVX2 quantizers must
// reproduce byte for byte: they run on activations, and the kernel tests compare bytes.

// Q8_0 and Q8_1 share d and qs (Q8_1 adds s): one dequantizer and one block quantizer for both.
template <typename Block>
void dequantize_q8(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const Block*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    for (int j = 0; j < kQK32; ++j) dst[j] = float(x[i].qs[j]) * d;
  }
}

// Sets y.d and y.qs from 32 floats; returns the float d (before its fp16 rounding) and the sum of the codes.
template <typename Block>
float quantize_q8_block(const float* src, Block& y, int* code_sum) {
  const float d = abs_max(src, kQK32) / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y.d = float_to_fp16(d);
  int sum = 0;
  for (int j = 0; j < kQK32; ++j) {
    y.qs[j] = int8_t(std::round(src[j] * id));
    sum += y.qs[j];
  }
  *code_sum = sum;
  return d;
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) { dequantize_q8<BlockQ8_0>(src, dst, n); }

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(dst);
  int code_sum = 0;
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) quantize_q8_block(src, y[i], &code_sum);
}

float vec_dot_q8_0(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockQ8_0*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK32; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += float(sumi) * (fp16_to_float(x[i].d) * fp16_to_float(y[i].d));
  }
  return sum;
}

void dequantize_q8_1(const void* src, float* dst, int64_t n) { dequantize_q8<BlockQ8_1>(src, dst, n); }

// s = fp16(d * sum(q)) with the float d before its fp16 rounding, as ggml stores it.
void quantize_q8_1(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    int code_sum = 0;
    const float d = quantize_q8_block(src, y[i], &code_sum);
    y[i].s = float_to_fp16(float(code_sum) * d);
  }
}

// ---- IQ4_NL: x = d * kIQ4NLValues[q] ----------------------------------------------------------------------

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = fp16_to_float(x[i].d);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = d * float(kIQ4NLValues[x[i].qs[j] & 0x0f]);
      dst[j + kHalf] = d * float(kIQ4NLValues[x[i].qs[j] >> 4]);
    }
  }
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i) quantize_block_iq4_nl(src + i * kQK32, y[i]);
}

float vec_dot_iq4_nl(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockIQ4_NL*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += kIQ4NLValues[x[i].qs[j] & 0x0f] * y[i].qs[j];
      sumi += kIQ4NLValues[x[i].qs[j] >> 4] * y[i].qs[j + kHalf];
    }
    sum += fp16_to_float(y[i].d) * fp16_to_float(x[i].d) * float(sumi);
  }
  return sum;
}

// ---- MXFP4: x = 2^(e - 128) * kMXFP4Values[q] -------------------------------------------------------------

void dequantize_mxfp4(const void* src, float* dst, int64_t n) {
  const auto* x = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < block_count(n); ++i, dst += kQK32) {
    const float d = e8m0_to_float_half(x[i].e);
    for (int j = 0; j < kHalf; ++j) {
      dst[j] = float(kMXFP4Values[x[i].qs[j] & 0x0f]) * d;
      dst[j + kHalf] = float(kMXFP4Values[x[i].qs[j] >> 4]) * d;
    }
  }
}

// The shared exponent puts the block's largest magnitude in the top binade of E2M1 (values 4..6 at OCP
// scale): e = floor(log2(amax)) - 2 + 127. log2f, not an exact exponent extraction, to match ggml also for
// an amax just below a power of two (where log2f rounds up to the integer). Blocks below 2^-125 would need
// an exponent under 0, which E8M0 cannot hold: they clamp to e = 0 (ggml's cast is undefined there).
void quantize_mxfp4(const float* src, void* dst, int64_t n) {
  auto* y = static_cast<BlockMXFP4*>(dst);
  for (int64_t i = 0; i < block_count(n); ++i, src += kQK32) {
    const float amax = abs_max(src, kQK32);
    const float e = amax > 0.0f ? std::floor(std::log2(amax)) - 2.0f + 127.0f : 0.0f;
    y[i].e = uint8_t(std::clamp(e, 0.0f, 254.0f));
    const float d = e8m0_to_float_half(y[i].e);
    uint8_t codes[kQK32];
    for (int j = 0; j < kQK32; ++j) codes[j] = uint8_t(nearest_mxfp4(src[j], d));
    pack_nibbles(codes, y[i].qs);
  }
}

float vec_dot_mxfp4(int64_t n, const void* vx, const void* vy) {
  const auto* x = static_cast<const BlockMXFP4*>(vx);
  const auto* y = static_cast<const BlockQ8_0*>(vy);
  float sum = 0.0f;
  for (int64_t i = 0; i < block_count(n); ++i) {
    int sumi = 0;
    for (int j = 0; j < kHalf; ++j) {
      sumi += kMXFP4Values[x[i].qs[j] & 0x0f] * y[i].qs[j];
      sumi += kMXFP4Values[x[i].qs[j] >> 4] * y[i].qs[j + kHalf];
    }
    sum += fp16_to_float(y[i].d) * e8m0_to_float_half(x[i].e) * float(sumi);
  }
  return sum;
}

}  // namespace magnetar::quant::ref
