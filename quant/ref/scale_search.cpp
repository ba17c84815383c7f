// Scale searches of the K-quant reference quantizers. Every arithmetic expression keeps the operand order of
// ggml's make_qkx2_quants / make_qx_quants (see scale_search.h for why that matters); the comments say
// what each step is for, not how ggml spells it.
#include "quant/ref/scale_search.h"

#include <cmath>

#include "base/check.h"

namespace magnetar::quant::ref {

float search_scale_min(const MinScaleSearch& p, const float* x, const float* weights, uint8_t* levels, float* neg_min) {
  MAGNETAR_CHECK(p.n >= 1 && p.n <= kMaxSearchGroup);
  const int n = p.n;
  const int nmax = p.nmax;

  // Range of the group and the weighted moments the least-squares fits need.
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;  // the formats subtract a non-negative "min" only
  if (max == min) {
    for (int i = 0; i < n; ++i) levels[i] = 0;
    *neg_min = -min;
    return 0.f;
  }

  // Baseline: the grid spanning [min, max] exactly.
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    levels[i] = uint8_t(l < 0 ? 0 : l > nmax ? nmax : l);
    float diff = scale * levels[i] + min - x[i];
    diff = p.use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (p.nstep < 1) {
    *neg_min = -min;
    return scale;
  }

  // Trials: round on a slightly different grid, then refit scale and offset to the rounded levels.
  uint8_t trial[kMaxSearchGroup];
  for (int is = 0; is <= p.nstep; ++is) {
    iscale = (p.rmin + p.rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = l < 0 ? 0 : l > nmax ? nmax : l;
      trial[i] = uint8_t(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {  // a positive offset is not representable: refit the scale alone
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * trial[i] + this_min - x[i];
        diff = p.use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) levels[i] = trial[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *neg_min = -min;
  return scale;
}

float search_scale_symmetric(int n, int nmax, const float* x, const float* weights, int8_t* levels) {
  // The largest-magnitude element (first one on ties) fixes the sign and the starting grid.
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
    for (int i = 0; i < n; ++i) levels[i] = 0;
    return 0.f;
  }
  auto weight = [&](int i) { return weights ? weights[i] : x[i] * x[i]; };
  auto clamp_level = [&](int l) { return l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l; };

  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_level(nearest_int(iscale * x[i]));
    levels[i] = int8_t(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  // For the least-squares scale s = sumlx / suml2 the weighted error is sum(w x^2) - s * sumlx, so the
  // best grid is the one with the largest sumlx^2 / suml2.
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_level(nearest_int(iscale * x[i]));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) levels[i] = int8_t(nmax + clamp_level(nearest_int(iscale * x[i])));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void pack_scales_mins_k4(const uint8_t scales[8], const uint8_t mins[8], uint8_t packed[12]) {
  for (int j = 0; j < 8; ++j) MAGNETAR_CHECK(scales[j] < 64 && mins[j] < 64);
  for (int j = 0; j < 4; ++j) {
    packed[j] = uint8_t(scales[j] | ((scales[j + 4] >> 4) << 6));
    packed[j + 4] = uint8_t(mins[j] | ((mins[j + 4] >> 4) << 6));
    packed[j + 8] = uint8_t((scales[j + 4] & 0xF) | ((mins[j + 4] & 0xF) << 4));
  }
}

}  // namespace magnetar::quant::ref
