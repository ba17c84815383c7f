// Scalar reference for the low-bit 256-element super-block formats: Q2_K, Q3_K and IQ4_XS.
//
// Dequantization repeats ggml's float operations in ggml's order (scale = d * sub_scale first, then
// scale * q, then the min subtracted), so every value is bit-identical to llama.cpp's. The quantizers
// follow llama.cpp's reference quantizers without an importance matrix (quantize_row_q2_K_ref,
// quantize_row_q3_K_ref, quantize_iq4_xs with no weights), which is what `llama-quantize` runs when no
// imatrix is given; the conformance test holds them to <= 1.05x llama.cpp's RMS error. The dot products
// against Q8_K keep the integer sums and the float accumulation order of ggml's generic CPU code.
//
// Element order shared by Q2_K and Q3_K: the 256 values are two halves of 128; in half h, byte
// qs[32*h + l] holds elements 128*h + l + 32*s in bits 2s..2s+1 (s = 0..3). Sub-block j (16 elements,
// 16*j .. 16*j+15) therefore reads bytes 32*(j/8) + 16*(j%2) .. +15 at shift 2*((j%8)/2).
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "quant/formats.h"
#include "quant/fp16.h"
#include "quant/ref/ref.h"
#include "quant/ref/scale_search.h"

namespace magnetar::quant::ref {
namespace {

constexpr int kSubBlocks16 = kQK_K / 16;  // Q2_K / Q3_K sub-blocks per super-block
constexpr int kSubBlocks32 = kQK_K / 32;  // IQ4_XS sub-blocks per super-block

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// ---- 2-bit packing shared by Q2_K and Q3_K ---------------------------------------------------------------

// The 2-bit field of element e (0..255) of a super-block, see the element order above.
int get_2bit(const uint8_t* qs, int e) {
  const int half = e / 128;
  const int r = e % 128;
  return (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3;
}

// L: [256] values in 0..3 -> qs: [64] bytes.
void pack_2bit(const uint8_t* levels, uint8_t* qs) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* l = levels + 128 * half;
    for (int i = 0; i < 32; ++i) {
      qs[32 * half + i] = uint8_t(l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6));
    }
  }
}

// ---- Q3_K 6-bit scale packing ------------------------------------------------------------------------------
// Scale j (0..63, stored with offset 32): low nibble in byte j%8 (low nibble for j < 8, high for j >= 8),
// high two bits in byte 8 + j%4 at bit 2*(j/4).

void pack_q3_k_scales(const int* scales64, uint8_t* packed) {
  std::memset(packed, 0, kKScaleSize);
  for (int j = 0; j < kSubBlocks16; ++j) {
    const int s = scales64[j];
    packed[j % 8] |= uint8_t((s & 0xF) << (4 * (j / 8)));
    packed[8 + j % 4] |= uint8_t((s >> 4) << (2 * (j / 4)));
  }
}

// Returns the signed scale (-32..31) of sub-block j.
int unpack_q3_k_scale(const uint8_t* packed, int j) {
  const int low = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// ---- IQ4_XS scale packing ------------------------------------------------------------------------------------
// Scale ib (0..63, offset 32): low nibble in scales_l[ib/2] (low nibble for even ib), high two bits in
// scales_h at bit 2*ib.

int unpack_iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
  const int low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * ib)) & 3;
  return (low | (high << 4)) - 32;
}

// ---- scale searches -------------------------------------------------------------------------------------------
// Q2_K uses scale_search.h's search_scale_min (shared with Q4_K/Q5_K); the two below are this file's own.

// Q3_K's per-16 symmetric fit x ~ scale * l with l in -nmax..nmax-1, weights x^2. Starts from the
// level grid through the largest magnitude, then moves single levels while the weighted
// least-squares objective (sum lx)^2 / sum l^2 improves (at most 5 passes). Writes l + nmax to L and
// returns the least-squares scale; an all-zero group gets L = 0 and scale 0. Matches ggml's
// make_q3_quants with do_rmse.
float fit_scale_symmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  // The extreme value maps to -nmax (the side with one more level), whatever its sign.
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = int8_t(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx <= 0) continue;
      float sl2 = suml2 - w * L[i] * L[i];
      const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      slx += w * x[i] * new_l;
      sl2 += w * new_l * new_l;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = int8_t(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++n_changed;
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Index of the IQ4_NL level nearest to v (ties go to the upper level, as ggml's best_index_int8).
int nearest_iq4nl_index(float v) {
  constexpr int kLevels = 16;
  if (v <= kIQ4NLValues[0]) return 0;
  if (v >= kIQ4NLValues[kLevels - 1]) return kLevels - 1;
  int lo = 0;
  int hi = kLevels - 1;
  while (hi - lo > 1) {  // invariant: values[lo] <= v < values[hi]
    const int mid = (lo + hi) / 2;
    if (v < kIQ4NLValues[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return v - kIQ4NLValues[hi - 1] < kIQ4NLValues[hi] - v ? hi - 1 : hi;
}

// IQ4_XS's per-32 fit x ~ d * kIQ4NLValues[l] with weights x^2. Tries the grid that puts the
// largest-magnitude element at +127 (past the top level, 113), then the 2*ntry+1 grids that put it at
// -127 + t, on the table's longer side; keeps the least-squares scale of the best assignment. Returns
// the signed scale (0 for an all-zero block). Matches ggml's quantize_row_iq4_nl_impl without weights.
float fit_iq4_scale(const float* xb, int ntry) {
  constexpr int kBlock = 32;
  float amax = 0, max = 0;
  for (int j = 0; j < kBlock; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.f;
  const float level0 = kIQ4NLValues[0];
  float d = -max / level0;
  float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < kBlock; ++j) {
    const float q = kIQ4NLValues[nearest_iq4nl_index(id * xb[j])];
    const float w = xb[j] * xb[j];
    sumqx += w * q * xb[j];
    sumq2 += w * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int t = -ntry; t <= ntry; ++t) {
    id = (t + level0) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < kBlock; ++j) {
      const float q = kIQ4NLValues[nearest_iq4nl_index(id * xb[j])];
      const float w = xb[j] * xb[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

}  // namespace

// ==== Q2_K: x = d * (sc & 15) * q - dmin * (sc >> 4), 2-bit q ==================================================

void dequantize_q2_k(const void* src, float* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockQ2_K* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const BlockQ2_K& b = blocks[i];
    const float d = fp16_to_float(b.d);
    const float dmin = fp16_to_float(b.dmin);
    for (int j = 0; j < kSubBlocks16; ++j) {
      const float dl = d * (b.scales[j] & 0xF);
      const float ml = dmin * (b.scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        *dst++ = dl * get_2bit(b.qs, 16 * j + l) - ml;
      }
    }
  }
}

void quantize_q2_k(const float* src, void* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  constexpr float kScaleLevels = 15.f;  // 4-bit sub-block scales and mins
  // llama.cpp's parameters for Q2_K: weights |x|, absolute error, 16 grids stretched by -0.5 .. +1.0 levels.
  constexpr MinScaleSearch kSearch = {.n = 16, .nmax = 3, .rmin = -0.5f, .rdelta = 0.1f, .nstep = 15,
                                      .use_mad = true};
  BlockQ2_K* blocks = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ2_K& b = blocks[i];
    uint8_t L[kQK_K];
    float scales[kSubBlocks16];
    float mins[kSubBlocks16];
    float max_scale = 0;  // the min is split off, so scales are never negative
    float max_min = 0;
    for (int j = 0; j < kSubBlocks16; ++j) {
      float w[16];
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
      scales[j] = search_scale_min(kSearch, x + 16 * j, w, L + 16 * j, &mins[j]);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    for (int j = 0; j < kSubBlocks16; ++j) b.scales[j] = 0;
    b.d = float_to_fp16(0.f);
    b.dmin = float_to_fp16(0.f);
    if (max_scale > 0) {
      const float iscale = kScaleLevels / max_scale;
      for (int j = 0; j < kSubBlocks16; ++j) b.scales[j] = uint8_t(nearest_int(iscale * scales[j]));
      b.d = float_to_fp16(max_scale / kScaleLevels);
    }
    if (max_min > 0) {
      const float iscale = kScaleLevels / max_min;
      for (int j = 0; j < kSubBlocks16; ++j) b.scales[j] |= uint8_t(nearest_int(iscale * mins[j]) << 4);
      b.dmin = float_to_fp16(max_min / kScaleLevels);
    }
    // Re-pick the levels against the scales as stored (fp16 d, 4-bit sub-scales).
    for (int j = 0; j < kSubBlocks16; ++j) {
      const float d = fp16_to_float(b.d) * (b.scales[j] & 0xF);
      if (d == 0) continue;
      const float dm = fp16_to_float(b.dmin) * (b.scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = uint8_t(clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
      }
    }
    pack_2bit(L, b.qs);
  }
}

float vec_dot_q2_k(int64_t n, const void* vx, const void* vy) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockQ2_K* x = static_cast<const BlockQ2_K*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    // The min term needs only the per-16 sums of y: sum(m * y) = m * bsum.
    int sum_mins = 0;
    for (int j = 0; j < kSubBlocks16; ++j) sum_mins += y[i].bsums[j] * (x[i].scales[j] >> 4);
    const float dall = y[i].d * fp16_to_float(x[i].d);
    const float dmin = y[i].d * fp16_to_float(x[i].dmin);
    int isum = 0;
    for (int j = 0; j < kSubBlocks16; ++j) {
      int sub = 0;
      for (int l = 0; l < 16; ++l) sub += y[i].qs[16 * j + l] * get_2bit(x[i].qs, 16 * j + l);
      isum += (x[i].scales[j] & 0xF) * sub;
    }
    sumf += dall * isum - dmin * sum_mins;
  }
  return sumf;
}

// ==== Q3_K: x = d * s * (q - 4 * !hbit), 6-bit signed s, 2+1-bit q ============================================
// The high bit of element e is bit e/32 of hmask[e%32]; a clear bit subtracts 4 (levels -4..3).

void dequantize_q3_k(const void* src, float* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockQ3_K* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const BlockQ3_K& b = blocks[i];
    const float d_all = fp16_to_float(b.d);
    for (int j = 0; j < kSubBlocks16; ++j) {
      const float dl = d_all * unpack_q3_k_scale(b.scales, j);
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l;
        const int high = (b.hmask[e % 32] >> (e / 32)) & 1;
        *dst++ = dl * (get_2bit(b.qs, e) - (high ? 0 : 4));
      }
    }
  }
}

void quantize_q3_k(const float* src, void* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  BlockQ3_K* blocks = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockQ3_K& b = blocks[i];
    int8_t L[kQK_K];
    float scales[kSubBlocks16];
    float max_scale = 0;  // the signed scale of largest magnitude
    float amax = 0;
    for (int j = 0; j < kSubBlocks16; ++j) {
      scales[j] = fit_scale_symmetric(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }
    int packed[kSubBlocks16] = {};
    if (max_scale != 0) {
      // The largest scale maps to -32, the side of the signed 6-bit range with one more level.
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kSubBlocks16; ++j) {
        packed[j] = clamp_int(nearest_int(iscale * scales[j]), -32, 31) + 32;
      }
      b.d = float_to_fp16(1 / iscale);
    } else {
      for (int j = 0; j < kSubBlocks16; ++j) packed[j] = 0;
      b.d = float_to_fp16(0.f);
    }
    pack_q3_k_scales(packed, b.scales);
    // Re-pick the levels against the scales as stored; sub-blocks with a zero scale keep the fit's.
    for (int j = 0; j < kSubBlocks16; ++j) {
      const float d = fp16_to_float(b.d) * unpack_q3_k_scale(b.scales, j);
      if (d == 0) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = int8_t(clamp_int(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
      }
    }
    std::memset(b.hmask, 0, sizeof(b.hmask));
    uint8_t low[kQK_K];
    for (int e = 0; e < kQK_K; ++e) {
      if (L[e] > 3) b.hmask[e % 32] |= uint8_t(1 << (e / 32));
      low[e] = uint8_t(L[e] & 3);
    }
    pack_2bit(low, b.qs);
  }
}

float vec_dot_q3_k(int64_t n, const void* vx, const void* vy) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockQ3_K* x = static_cast<const BlockQ3_K*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  // Eight float lanes (lane = element % 8), summed in lane order at the end: ggml's generic order.
  float sums[8] = {};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    int32_t lanes[8] = {};
    for (int e = 0; e < kQK_K; ++e) {
      const int high = (x[i].hmask[e % 32] >> (e / 32)) & 1;
      const int q = get_2bit(x[i].qs, e) - (high ? 0 : 4);
      lanes[e % 8] += unpack_q3_k_scale(x[i].scales, e / 16) * (q * y[i].qs[e]);
    }
    const float d = fp16_to_float(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * lanes[l];
  }
  float sumf = 0;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

// ==== IQ4_XS: x = d * s * kIQ4NLValues[q], 6-bit signed s per 32, 4-bit q =======================================
// Within sub-block ib, element j (0..15) is the low nibble of qs[16*ib + j], element j + 16 the high one.

void dequantize_iq4_xs(const void* src, float* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockIQ4_XS* blocks = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const BlockIQ4_XS& b = blocks[i];
    const float d = fp16_to_float(b.d);
    for (int ib = 0; ib < kSubBlocks32; ++ib) {
      const float dl = d * unpack_iq4_xs_scale(b, ib);
      const uint8_t* qs = b.qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        dst[j] = dl * kIQ4NLValues[qs[j] & 0xF];
        dst[j + 16] = dl * kIQ4NLValues[qs[j] >> 4];
      }
      dst += 32;
    }
  }
}

void quantize_iq4_xs(const float* src, void* dst, int64_t n) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  constexpr int kScaleTries = 7;  // llama.cpp's ntry for IQ4_XS
  BlockIQ4_XS* blocks = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    BlockIQ4_XS& b = blocks[i];
    float scales[kSubBlocks32];
    float max_scale = 0;  // the signed scale of largest magnitude
    float amax_scale = 0;
    for (int ib = 0; ib < kSubBlocks32; ++ib) {
      scales[ib] = fit_iq4_scale(x + 32 * ib, kScaleTries);
      const float a = std::fabs(scales[ib]);
      if (a > amax_scale) {
        amax_scale = a;
        max_scale = scales[ib];
      }
    }
    // The largest scale maps to -32 (the 6-bit range's longer side); d keeps its fp32 value for the
    // level choice below, as llama.cpp does.
    const float d = -max_scale / 32;
    b.d = float_to_fp16(d);
    const float id = d != 0 ? 1 / d : 0.f;
    b.scales_h = 0;
    std::memset(b.scales_l, 0, sizeof(b.scales_l));
    for (int ib = 0; ib < kSubBlocks32; ++ib) {
      const int l = clamp_int(nearest_int(id * scales[ib]), -32, 31);
      const float dl = d * l;
      const float idl = dl != 0 ? 1 / dl : 0.f;
      const float* xb = x + 32 * ib;
      uint8_t* qs = b.qs + 16 * ib;
      for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t(nearest_iq4nl_index(idl * xb[j]) | (nearest_iq4nl_index(idl * xb[j + 16]) << 4));
      }
      const int stored = l + 32;
      b.scales_l[ib / 2] |= uint8_t((stored & 0xF) << (4 * (ib % 2)));
      b.scales_h |= uint16_t((stored >> 4) << (2 * ib));
    }
  }
}

float vec_dot_iq4_xs(int64_t n, const void* vx, const void* vy) {
  MAGNETAR_CHECK(n % kQK_K == 0);
  const BlockIQ4_XS* x = static_cast<const BlockIQ4_XS*>(vx);
  const BlockQ8_K* y = static_cast<const BlockQ8_K*>(vy);
  float sumf = 0;
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d4d8 = fp16_to_float(x[i].d) * y[i].d;
    for (int ib = 0; ib < kSubBlocks32; ++ib) {
      const float dl = d4d8 * unpack_iq4_xs_scale(x[i], ib);
      const uint8_t* qs = x[i].qs + 16 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      int sum_low = 0, sum_high = 0;
      for (int j = 0; j < 16; ++j) {
        sum_low += q8[j] * kIQ4NLValues[qs[j] & 0xF];
        sum_high += q8[j + 16] * kIQ4NLValues[qs[j] >> 4];
      }
      sumf += dl * (sum_low + sum_high);
    }
  }
  return sumf;
}

}  // namespace magnetar::quant::ref
