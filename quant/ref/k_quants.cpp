// Scalar references for Q4_K, Q5_K, Q6_K and the activation type Q8_K (the oracle for backends/cpu and
// backends/cuda; STYLE.md rule 7).
//
// Dequantize reproduces llama.cpp's dequantize_row_* bit-exactly: every value is computed with the same
// float32 operations in the same order (Q4_K/Q5_K: d1 = d * sc, m1 = dmin * m, y = d1 * q - m1; Q6_K:
// y = (d * sc) * q). Keep it that way: the conformance test hashes these floats.
//
// Quantize follows llama.cpp's quantize_row_*_ref (the path llama-quantize takes without an importance
// matrix), so Magnetar writes the same bytes for the same float32 source.
//
// vec_dot against Q8_K takes llama.cpp's generic route: exact integer sums per super-block (sub-block dots
// times their 6- or 8-bit scales, the Q4_K/Q5_K mins applied through Q8_K's bsums), then one float step per
// super-block:  acc = fma(d_x * d_y, sumi, acc)  and, with mins,  acc = fma(-(dmin_x * d_y), summ, acc).
// The SIMD kernels compute the same integers and the same float steps, so they match this bit for bit.
//
// All functions take n as a multiple of kQK_K (CHECKed) and any alignment. Inputs to quantize must be
// finite.
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/ref/ref.h"
#include "quant/ref/scale_search.h"

namespace magnetar::quant::ref {
namespace {

int64_t super_blocks(int64_t n) {
  MAGNETAR_CHECK(n >= 0 && n % kQK_K == 0);
  return n / kQK_K;
}

// The float step of every K-quant dot product (see the file comment); fused so that it does not depend
// on whether the compiler contracts a * b + c.
float accumulate(float acc, float d, int32_t sumi) { return std::fma(d, float(sumi), acc); }

// ---- Q4_K and Q5_K quantization (shared: they differ only in the level count and search settings) -------
// Fills sc_levels/min_levels (6-bit), the fp16 d/dmin and the per-element levels L[256] in 0..nmax of one
// super-block x[256], exactly as quantize_row_q4_K_ref / q5_K_ref do.
struct MinBlock {
  uint8_t scales[kKScaleSize];
  uint16_t d;
  uint16_t dmin;
  uint8_t levels[kQK_K];
};

void quantize_min_block(const float* x, const MinScaleSearch& search, MinBlock* out) {
  const int nmax = search.nmax;
  constexpr int kSub = 32;
  float scales[kQK_K / kSub];
  float mins[kQK_K / kSub];
  float weights[kSub];
  float max_scale = 0;  // scales are non-negative since the min is subtracted
  float max_min = 0;
  for (int j = 0; j < kQK_K / kSub; ++j) {
    const float* xs = x + kSub * j;
    // Weight each element by the sub-block's rms plus its own magnitude: large values matter more.
    float sum_x2 = 0;
    for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / kSub);
    for (int l = 0; l < kSub; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = search_scale_min(search, xs, weights, out->levels + kSub * j, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  // Quantize the eight scales and mins to 6 bits against the super-block's largest.
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t sc6[8];
  uint8_t m6[8];
  for (int j = 0; j < 8; ++j) {
    // uint8_t first, then clamp: a negative trial scale wraps and clamps to 63, as in ggml.
    const uint8_t ls = uint8_t(nearest_int(inv_scale * scales[j]));
    const uint8_t lm = uint8_t(nearest_int(inv_min * mins[j]));
    sc6[j] = ls < 63 ? ls : 63;
    m6[j] = lm < 63 ? lm : 63;
  }
  pack_scales_mins_k4(sc6, m6, out->scales);
  out->d = float_to_fp16(max_scale / 63.f);
  out->dmin = float_to_fp16(max_min / 63.f);

  // Re-round every element against the scales actually stored. A sub-block whose stored scale is 0 keeps
  // the search's levels (they dequantize to -m1 whatever they are).
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, out->scales, &sc, &m);
    const float d = fp16_to_float(out->d) * sc;
    if (!d) continue;
    const float dm = fp16_to_float(out->dmin) * m;
    for (int ii = 0; ii < kSub; ++ii) {
      const int l = nearest_int((x[kSub * j + ii] + dm) / d);
      out->levels[kSub * j + ii] = uint8_t(l < 0 ? 0 : l > nmax ? nmax : l);
    }
  }
}

// Sub-block dots of one Q4_K/Q5_K super-block with Q8_K: sum_j scale_j * sum_l q_l * y_l over the eight
// sub-blocks of 32 (q already unpacked to 0..31), and sum_j min_j * (sum of y over sub-block j) from bsums.
void min_block_dot(const uint8_t* q, const uint8_t* packed_scales, const BlockQ8_K& y, int32_t* sumi, int32_t* summ) {
  int32_t s = 0;
  int32_t m_sum = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, packed_scales, &sc, &m);
    int32_t dot = 0;
    for (int l = 0; l < 32; ++l) dot += int32_t(q[32 * j + l]) * y.qs[32 * j + l];
    s += int32_t(sc) * dot;
    m_sum += int32_t(m) * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
  }
  *sumi = s;
  *summ = m_sum;
}

}  // namespace

// ---- Q4_K ---------------------------------------------------------------------------------------------------

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ4_K*>(src);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ4_K& b = blocks[i];
    const float d = fp16_to_float(b.d);
    const float min = fp16_to_float(b.dmin);
    const uint8_t* q = b.qs;
    float* y = dst + i * kQK_K;
    // 64 elements per step: sub-block 2k in the low nibbles of 32 bytes, 2k+1 in the high nibbles.
    for (int k = 0; k < 4; ++k) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * k, b.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      unpack_scale_min_k4(2 * k + 1, b.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * (q[l] >> 4) - m2;
      q += 32;
      y += 64;
    }
  }
}

void quantize_q4_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ4_K*>(dst);
  const int64_t nb = super_blocks(n);
  const MinScaleSearch search{.n = 32, .nmax = 15, .rmin = -1.f, .rdelta = 0.1f, .nstep = 20, .use_mad = false};
  for (int64_t i = 0; i < nb; ++i) {
    MinBlock mb;
    quantize_min_block(src + i * kQK_K, search, &mb);
    BlockQ4_K& b = blocks[i];
    b.d = mb.d;
    b.dmin = mb.dmin;
    std::memcpy(b.scales, mb.scales, kKScaleSize);
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        b.qs[32 * k + l] = uint8_t(mb.levels[64 * k + l] | (mb.levels[64 * k + 32 + l] << 4));
      }
    }
  }
}

float vec_dot_q4_k(int64_t n, const void* x, const void* y) {
  const auto* xb = static_cast<const BlockQ4_K*>(x);
  const auto* yb = static_cast<const BlockQ8_K*>(y);
  const int64_t nb = super_blocks(n);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t q[kQK_K];
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        q[64 * k + l] = xb[i].qs[32 * k + l] & 0xF;
        q[64 * k + 32 + l] = xb[i].qs[32 * k + l] >> 4;
      }
    }
    int32_t sumi, summ;
    min_block_dot(q, xb[i].scales, yb[i], &sumi, &summ);
    acc = accumulate(acc, fp16_to_float(xb[i].d) * yb[i].d, sumi);
    acc = accumulate(acc, -(fp16_to_float(xb[i].dmin) * yb[i].d), summ);
  }
  return acc;
}

// ---- Q5_K ---------------------------------------------------------------------------------------------------

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ5_K*>(src);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    const BlockQ5_K& b = blocks[i];
    const float d = fp16_to_float(b.d);
    const float min = fp16_to_float(b.dmin);
    const uint8_t* ql = b.qs;
    float* y = dst + i * kQK_K;
    // As Q4_K; the 5th bit of element l of sub-block j is bit j of qh[l].
    for (int k = 0; k < 4; ++k) {
      const uint8_t u1 = uint8_t(1u << (2 * k));
      const uint8_t u2 = uint8_t(2u << (2 * k));
      uint8_t sc, m;
      unpack_scale_min_k4(2 * k, b.scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      unpack_scale_min_k4(2 * k + 1, b.scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) y[l] = d1 * ((ql[l] & 0xF) + (b.qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * ((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
      ql += 32;
      y += 64;
    }
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ5_K*>(dst);
  const int64_t nb = super_blocks(n);
  const MinScaleSearch search{.n = 32, .nmax = 31, .rmin = -0.5f, .rdelta = 0.1f, .nstep = 15, .use_mad = false};
  for (int64_t i = 0; i < nb; ++i) {
    MinBlock mb;
    quantize_min_block(src + i * kQK_K, search, &mb);
    BlockQ5_K& b = blocks[i];
    b.d = mb.d;
    b.dmin = mb.dmin;
    std::memcpy(b.scales, mb.scales, kKScaleSize);
    std::memset(b.qh, 0, sizeof(b.qh));
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int lo = mb.levels[64 * k + l];
        const int hi = mb.levels[64 * k + 32 + l];
        b.qs[32 * k + l] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
        b.qh[l] |= uint8_t(((lo >> 4) << (2 * k)) | ((hi >> 4) << (2 * k + 1)));
      }
    }
  }
}

float vec_dot_q5_k(int64_t n, const void* x, const void* y) {
  const auto* xb = static_cast<const BlockQ5_K*>(x);
  const auto* yb = static_cast<const BlockQ8_K*>(y);
  const int64_t nb = super_blocks(n);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t q[kQK_K];
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t h = xb[i].qh[l];
        q[64 * k + l] = uint8_t((xb[i].qs[32 * k + l] & 0xF) | (((h >> (2 * k)) & 1) << 4));
        q[64 * k + 32 + l] = uint8_t((xb[i].qs[32 * k + l] >> 4) | (((h >> (2 * k + 1)) & 1) << 4));
      }
    }
    int32_t sumi, summ;
    min_block_dot(q, xb[i].scales, yb[i], &sumi, &summ);
    acc = accumulate(acc, fp16_to_float(xb[i].d) * yb[i].d, sumi);
    acc = accumulate(acc, -(fp16_to_float(xb[i].dmin) * yb[i].d), summ);
  }
  return acc;
}

// ---- Q6_K ---------------------------------------------------------------------------------------------------
// Element e of a super-block (half h = e / 128, r = e % 128, l = r % 32, quarter g = r / 32) has its low 4
// bits in ql[64h + l + 32 (g & 1)] (low nibble for g < 2, high nibble otherwise) and its high 2 bits in
// bits 2g..2g+1 of qh[32h + l]; the stored value is q + 32 with q in -32..31; scale index e / 16.

namespace {

void unpack_q6_k(const BlockQ6_K& b, int8_t q[kQK_K]) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = int8_t(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      out[l + 32] = int8_t(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = int8_t(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = int8_t(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

}  // namespace

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ6_K*>(src);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    int8_t q[kQK_K];
    unpack_q6_k(blocks[i], q);
    const float d = fp16_to_float(blocks[i].d);
    float* y = dst + i * kQK_K;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float ds = d * blocks[i].scales[j];  // ggml evaluates d * sc * q left to right
      for (int l = 0; l < 16; ++l) y[16 * j + l] = ds * q[16 * j + l];
    }
  }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ6_K*>(dst);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ6_K& b = blocks[i];
    int8_t levels[kQK_K];  // 0..63
    float scales[kQK_K / 16];
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = search_scale_symmetric(16, 32, x + 16 * j, nullptr, levels + 16 * j);
      const float abs_scale = std::fabs(scales[j]);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&b, 0, sizeof(b));
      continue;
    }

    // 8-bit sub-block scales: the largest-magnitude one maps to -128.
    const float iscale = -128.f / max_scale;
    b.d = float_to_fp16(1 / iscale);
    for (int j = 0; j < kQK_K / 16; ++j) {
      const int l = nearest_int(iscale * scales[j]);
      b.scales[j] = int8_t(l < 127 ? l : 127);
    }
    // Re-round against the stored scales; a sub-block whose scale rounded to 0 keeps the search's levels.
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_float(b.d) * b.scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        levels[16 * j + ii] = int8_t(l + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* lv = levels + 128 * h;
      for (int l = 0; l < 32; ++l) {
        b.ql[64 * h + l] = uint8_t((lv[l] & 0xF) | ((lv[l + 64] & 0xF) << 4));
        b.ql[64 * h + l + 32] = uint8_t((lv[l + 32] & 0xF) | ((lv[l + 96] & 0xF) << 4));
        b.qh[32 * h + l] =
            uint8_t((lv[l] >> 4) | ((lv[l + 32] >> 4) << 2) | ((lv[l + 64] >> 4) << 4) | ((lv[l + 96] >> 4) << 6));
      }
    }
  }
}

float vec_dot_q6_k(int64_t n, const void* x, const void* y) {
  const auto* xb = static_cast<const BlockQ6_K*>(x);
  const auto* yb = static_cast<const BlockQ8_K*>(y);
  const int64_t nb = super_blocks(n);
  float acc = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int8_t q[kQK_K];
    unpack_q6_k(xb[i], q);
    int32_t sumi = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l) dot += int32_t(q[16 * j + l]) * yb[i].qs[16 * j + l];
      sumi += int32_t(xb[i].scales[j]) * dot;
    }
    acc = accumulate(acc, fp16_to_float(xb[i].d) * yb[i].d, sumi);
  }
  return acc;
}

// ---- Q8_K ---------------------------------------------------------------------------------------------------

void dequantize_q8_k(const void* src, float* dst, int64_t n) {
  const auto* blocks = static_cast<const BlockQ8_K*>(src);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    for (int l = 0; l < kQK_K; ++l) dst[i * kQK_K + l] = blocks[i].d * blocks[i].qs[l];
  }
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  const int64_t nb = super_blocks(n);
  for (int64_t i = 0; i < nb; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ8_K& b = blocks[i];
    // The first element of largest magnitude maps to -127 exactly, so |q| <= 127 everywhere (the vec_dot
    // kernels rely on that to keep maddubs pair sums inside int16).
    float max = 0;
    float amax = 0;
    for (int l = 0; l < kQK_K; ++l) {
      const float ax = std::fabs(x[l]);
      if (ax > amax) {
        amax = ax;
        max = x[l];
      }
    }
    if (!amax) {
      std::memset(&b, 0, sizeof(b));  // ggml leaves bsums unset here; zero is what they sum to
      continue;
    }
    const float iscale = -127.f / max;
    for (int l = 0; l < kQK_K; ++l) {
      const int v = nearest_int(iscale * x[l]);
      b.qs[l] = int8_t(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      b.bsums[j] = int16_t(sum);
    }
    b.d = 1 / iscale;
  }
}

}  // namespace magnetar::quant::ref
