// CPU ops of the forward pass against straightforward double-precision formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/ops.h"
#include "quant/fp8.h"
#include "quant/quant.h"

namespace magnetar::cpu {
namespace {

// softmax(q.k * scale) v over positions max(0, p-window+1)..p, in double.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                    int64_t n_tok, int64_t pos0, int64_t H, int64_t HKV, int64_t D, int64_t window,
                                    float scale) {
  std::vector<double> out(size_t(n_tok * H * D));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / HKV), p = pos0 + t;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      std::vector<double> s;
      double m = -1e300;
      for (int64_t j = lo; j <= p; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(q[size_t((t * H + h) * D + d)]) * k[size_t((j * HKV + hk) * D + d)];
        s.push_back(dot * scale);
        m = std::max(m, s.back());
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - m));
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = lo; j <= p; ++j) acc += s[size_t(j - lo)] / z * v[size_t((j * HKV + hk) * D + d)];
        out[size_t((t * H + h) * D + d)] = acc;
      }
    }
  }
  return out;
}

TEST(CpuOps, AttentionMatchesNaiveWithGqaAndSlidingWindow) {
  const int64_t H = 4, HKV = 2, D = 32, n_ctx = 40, pos0 = 25, n_tok = 15;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q(size_t(n_tok * H * D)), k(size_t(n_ctx * HKV * D)), v(k.size());
  for (float& x : q) x = dist(rng);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  ThreadPool pool(2);
  std::vector<float> scratch(attention_scratch_floats(n_ctx, H, HKV, D, pool.size()));
  for (int64_t window : {0, 1, 8}) {
    for (quant::Type kv_type : {quant::Type::F32, quant::Type::F16}) {
      std::vector<uint8_t> kc(k.size() * 4), vc(v.size() * 4);
      store_kv(k.data(), n_ctx, HKV * D, kv_type, kc.data(), 0);
      store_kv(v.data(), n_ctx, HKV * D, kv_type, vc.data(), 0);
      std::vector<float> out(q.size());
      attention(pool, {.q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(), .kv_type = kv_type, .out = out.data(),
                       .n_tok = n_tok, .pos0 = pos0, .n_head = H, .n_head_kv = HKV, .head_dim = D, .window = window,
                       .scale = 0.2f, .scratch = scratch.data()});
      const std::vector<double> want = naive_attention(q, k, v, n_tok, pos0, H, HKV, D, window, 0.2f);
      const double tol = kv_type == quant::Type::F32 ? 1e-5 : 3e-3;  // f16 K/V: 11-bit mantissas
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], tol) << "window " << window << " kv " << int(kv_type) << " at " << i;
      }
    }
  }
}

// Shapes off the common path: 40 query heads on one KV head (a job holds one token's group), heads of 72 (a SIMD step
// left over) and 256, three KV heads of 256 (a decode step's passes over a position take two heads, then one), decode
// and a prompt chunk, with and without a window.
TEST(CpuOps, AttentionMatchesNaiveOnWideGroupsAndOddHeads) {
  struct Shape {
    int64_t H, HKV, D;
  };
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const Shape sh : {Shape{40, 1, 256}, Shape{6, 3, 72}, Shape{6, 3, 256}}) {
    const int64_t n_ctx = 310;
    std::vector<float> k(size_t(n_ctx * sh.HKV * sh.D)), v(k.size());
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    std::vector<uint8_t> kc(k.size() * 4), vc(v.size() * 4);
    store_kv(k.data(), n_ctx, sh.HKV * sh.D, quant::Type::F32, kc.data(), 0);
    store_kv(v.data(), n_ctx, sh.HKV * sh.D, quant::Type::F32, vc.data(), 0);
    ThreadPool pool(3);
    std::vector<float> scratch(attention_scratch_floats(n_ctx, sh.H, sh.HKV, sh.D, pool.size()));
    for (const int64_t n_tok : {int64_t(1), int64_t(9)}) {
      for (const int64_t window : {int64_t(0), int64_t(100)}) {
        const int64_t pos0 = n_ctx - n_tok;
        std::vector<float> q(size_t(n_tok * sh.H * sh.D)), out(q.size());
        for (float& x : q) x = dist(rng);
        attention(pool, {.q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(), .kv_type = quant::Type::F32,
                         .out = out.data(), .n_tok = n_tok, .pos0 = pos0, .n_head = sh.H, .n_head_kv = sh.HKV,
                         .head_dim = sh.D, .window = window, .scale = 0.1f, .scratch = scratch.data()});
        const std::vector<double> want = naive_attention(q, k, v, n_tok, pos0, sh.H, sh.HKV, sh.D, window, 0.1f);
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(out[i], want[i], 1e-5) << "heads " << sh.H << "/" << sh.HKV << " dim " << sh.D << " tokens "
                                             << n_tok << " window " << window << " at " << i;
        }
      }
    }
  }
}

// Longer than one chunk of cached rows (ops.cpp merges chunks of 256): a prompt chunk prefilled at depth is close to
// the exact result, and every token of it gets the same bits decoded alone, on 1 thread or on more threads than KV
// heads (a decode step spreads its chunks over the threads and merges them afterwards), with and without a window.
TEST(CpuOps, AttentionGivesATokenTheSameBitsAloneOrInAPrefillOnAnyThreadCount) {
  const int64_t H = 8, HKV = 2, D = 64, n_ctx = 1300, n_tok = 40, pos0 = n_ctx - n_tok;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q(size_t(n_tok * H * D)), k(size_t(n_ctx * HKV * D)), v(k.size());
  for (float& x : q) x = dist(rng);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (quant::Type kv_type : {quant::Type::F32, quant::Type::F16}) {
    std::vector<uint8_t> kc(k.size() * 4), vc(v.size() * 4);
    store_kv(k.data(), n_ctx, HKV * D, kv_type, kc.data(), 0);
    store_kv(v.data(), n_ctx, HKV * D, kv_type, vc.data(), 0);
    for (int64_t window : {int64_t(0), int64_t(700)}) {
      ThreadPool pool(2);
      std::vector<float> scratch(attention_scratch_floats(n_ctx, H, HKV, D, pool.size()));
      std::vector<float> prefill(q.size());
      AttentionArgs a{.q = q.data(), .k_cache = kc.data(), .v_cache = vc.data(), .kv_type = kv_type,
                      .out = prefill.data(), .n_tok = n_tok, .pos0 = pos0, .n_head = H, .n_head_kv = HKV,
                      .head_dim = D, .window = window, .scale = 0.125f, .scratch = scratch.data()};
      attention(pool, a);
      if (kv_type == quant::Type::F32) {
        const std::vector<double> want = naive_attention(q, k, v, n_tok, pos0, H, HKV, D, window, 0.125f);
        for (size_t i = 0; i < prefill.size(); ++i) {
          ASSERT_NEAR(prefill[i], want[i], 1e-5) << "window " << window << " at " << i;
        }
      }
      for (int threads : {1, 3, 5}) {
        ThreadPool decode_pool(threads);
        std::vector<float> decode_scratch(attention_scratch_floats(n_ctx, H, HKV, D, threads));
        for (int64_t t = 0; t < n_tok; t += 7) {
          std::vector<float> alone(size_t(H * D));
          AttentionArgs d = a;
          d.q = q.data() + t * H * D;
          d.out = alone.data();
          d.n_tok = 1;
          d.pos0 = pos0 + t;
          d.scratch = decode_scratch.data();
          attention(decode_pool, d);
          ASSERT_TRUE(std::equal(alone.begin(), alone.end(), prefill.begin() + t * H * D))
              << "kv " << int(kv_type) << " window " << window << " threads " << threads << " token " << t;
        }
      }
    }
  }
}

// An infinite V value (an F16 cache's overflow) at a position inside a prefill: the tokens before it never attend to
// it, and their rows stay finite and the bits they get decoded alone (before, a prefill tile multiplied the masked
// position's V by an exact-zero weight: NaN).
TEST(CpuOps, AnInfiniteVLaterInThePrefillLeavesTheEarlierTokensFinite) {
  const int64_t H = 8, HKV = 2, D = 64, n_ctx = 300, n_tok = 64, pos0 = n_ctx - n_tok, inf_at = 21;
  std::mt19937 rng(12);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q(size_t(n_tok * H * D)), k(size_t(n_ctx * HKV * D)), v(k.size());
  for (float& x : q) x = dist(rng);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (int64_t hk = 0; hk < HKV; ++hk) v[size_t(((pos0 + inf_at) * HKV + hk) * D + 5)] = 1e6f;  // > F16's 65,504
  for (quant::Type kv_type : {quant::Type::F32, quant::Type::F16}) {
    std::vector<float> vv = v;
    if (kv_type == quant::Type::F32) {
      for (float& x : vv) x = x == 1e6f ? INFINITY : x;
    }
    std::vector<uint8_t> kc(k.size() * 4), vc(v.size() * 4);
    store_kv(k.data(), n_ctx, HKV * D, kv_type, kc.data(), 0);
    store_kv(vv.data(), n_ctx, HKV * D, kv_type, vc.data(), 0);
    ThreadPool pool(2);
    std::vector<float> scratch(attention_scratch_floats(n_ctx, H, HKV, D, pool.size()));
    std::vector<float> prefill(q.size());
    AttentionArgs a{.q = q.data(),
                    .k_cache = kc.data(),
                    .v_cache = vc.data(),
                    .kv_type = kv_type,
                    .out = prefill.data(),
                    .n_tok = n_tok,
                    .pos0 = pos0,
                    .n_head = H,
                    .n_head_kv = HKV,
                    .head_dim = D,
                    .window = 0,
                    .scale = 0.125f,
                    .scratch = scratch.data()};
    attention(pool, a);
    for (int64_t t = 0; t < inf_at; ++t) {
      std::vector<float> alone(size_t(H * D));
      AttentionArgs d = a;
      d.q = q.data() + t * H * D;
      d.out = alone.data();
      d.n_tok = 1;
      d.pos0 = pos0 + t;
      attention(pool, d);
      for (int64_t i = 0; i < H * D; ++i) {
        ASSERT_TRUE(std::isfinite(prefill[size_t(t * H * D + i)])) << "kv " << int(kv_type) << " token " << t;
      }
      ASSERT_TRUE(std::equal(alone.begin(), alone.end(), prefill.begin() + t * H * D))
          << "kv " << int(kv_type) << " token " << t;
    }
    EXPECT_TRUE(std::isinf(prefill[size_t(inf_at * H * D + 5)]));  // the overflowing token's own row sees it
  }
}

// A Q8_0 KV cache: store_kv writes each row where it belongs (row0 > 0, rows before it untouched) as the reference
// quantizer (quant traits' from_float, the scalar oracle) rounds it; attention over it equals, bit for bit, attention
// over an F32 cache holding the reference's dequantization of the same rows (Q8_0's d * q is exact in float), so its
// closeness to the exact result is the F32 path's, checked above. Heads of 32 and 64, GQA, windows. The same for an
// FP8 E4M3 cache: each element quant::float_to_fp8_e4m3's byte, read as its value (exact in float).
void expect_quantized_cache_equals_f32(quant::Type kv_type) {
  const bool f8 = kv_type == quant::Type::F8_E4M3;
  auto encode = [&](const float* x, uint8_t* out, int64_t n) {
    if (!f8) return quant::traits(quant::Type::Q8_0).from_float(x, out, n);
    for (int64_t i = 0; i < n; ++i) out[i] = quant::float_to_fp8_e4m3(x[i]);
  };
  auto decode = [&](const uint8_t* c, float* out, int64_t n) {
    if (!f8) return quant::traits(quant::Type::Q8_0).to_float(c, out, n);
    for (int64_t i = 0; i < n; ++i) out[i] = quant::fp8_e4m3_to_float(c[i]);
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  ThreadPool pool(2);
  for (const int64_t D : {32, 64}) {
    const int64_t H = 8, HKV = 2, n_ctx = 70, row0 = 5, pos0 = 50, n_tok = 20, row = HKV * D;
    const size_t row_bytes = quant::row_size(kv_type, row);
    std::vector<float> q(size_t(n_tok * H * D)), k(size_t((n_ctx - row0) * row)), v(k.size());
    for (float& x : q) x = dist(rng);
    for (float& x : k) x = 3.0f * dist(rng);
    for (float& x : v) x = dist(rng);
    std::vector<uint8_t> kc(size_t(n_ctx) * row_bytes), vc(kc.size());
    store_kv(k.data(), n_ctx - row0, row, kv_type, kc.data(), row0);
    store_kv(v.data(), n_ctx - row0, row, kv_type, vc.data(), row0);
    std::vector<uint8_t> want_k((n_ctx - row0) * row_bytes);
    encode(k.data(), want_k.data(), int64_t(k.size()));
    for (size_t i = 0; i < size_t(row0) * row_bytes; ++i) ASSERT_EQ(kc[i], 0) << "byte " << i << " before row0";
    ASSERT_TRUE(std::equal(want_k.begin(), want_k.end(), kc.begin() + std::ptrdiff_t(size_t(row0) * row_bytes)))
        << "head_dim " << D;
    // The F32 cache: rows 0..row0-1 are zero bytes in the cache (Q8_0: d = 0; FP8: +0), then the dequantized rows.
    std::vector<float> kf(size_t(n_ctx * row)), vf(kf.size());
    decode(kc.data(), kf.data(), int64_t(kf.size()));
    decode(vc.data(), vf.data(), int64_t(vf.size()));
    std::vector<float> scratch(attention_scratch_floats(n_ctx, H, HKV, D, pool.size()));
    for (const int64_t window : {0, 1, 16}) {
      std::vector<float> got(q.size()), want(q.size());
      AttentionArgs a{.q = q.data(),
                      .k_cache = kc.data(),
                      .v_cache = vc.data(),
                      .kv_type = kv_type,
                      .out = got.data(),
                      .n_tok = n_tok,
                      .pos0 = pos0,
                      .n_head = H,
                      .n_head_kv = HKV,
                      .head_dim = D,
                      .window = window,
                      .scale = 0.125f,
                      .scratch = scratch.data()};
      attention(pool, a);
      a.k_cache = kf.data();
      a.v_cache = vf.data();
      a.kv_type = quant::Type::F32;
      a.out = want.data();
      attention(pool, a);
      ASSERT_EQ(got, want) << "head_dim " << D << " window " << window;
    }
  }
}

TEST(CpuOps, AttentionOverQ8CacheEqualsF32OverItsDequantization) {
  expect_quantized_cache_equals_f32(quant::Type::Q8_0);
}

TEST(CpuOps, AttentionOverFp8CacheEqualsF32OverItsValues) { expect_quantized_cache_equals_f32(quant::Type::F8_E4M3); }

TEST(CpuOps, RopeNeoxRotatesPairsHalfADimensionApart) {
  const int64_t D = 8, H = 2;
  std::vector<float> x(size_t(H * D));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i + 1);
  const std::vector<float> orig = x;
  const int32_t pos = 3;
  ThreadPool pool(1);
  rope_neox(pool, x.data(), 1, H, D, &pos, 10000.0f);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * double(i) / double(D));
      const double a = orig[size_t(h * D + i)], b = orig[size_t(h * D + i + D / 2)];
      EXPECT_NEAR(x[size_t(h * D + i)], a * std::cos(theta) - b * std::sin(theta), 1e-5);
      EXPECT_NEAR(x[size_t(h * D + i + D / 2)], b * std::cos(theta) + a * std::sin(theta), 1e-5);
    }
  }
}

TEST(CpuOps, RmsNorm) {
  std::vector<float> x = {1, -2, 3, -4}, w = {1, 2, 0.5f, 1}, y(4);
  ThreadPool pool(1);
  rms_norm(pool, x.data(), w.data(), y.data(), 1, 4, 0.0f);
  const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)] / rms * w[size_t(i)], 1e-6);
}

}  // namespace
}  // namespace magnetar::cpu
