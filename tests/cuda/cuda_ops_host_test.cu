// The host-callable logic of the forward-pass ops (backends/cuda/{rope,route_topk,attention}.cuh) run on the
// HOST, so CI (no GPU) checks it: the RoPE angle formula against cpu::rope_neox's, the router's rank-based
// top-k against the CPU route()'s partial_sort, attention's split-K plan and online-softmax merge against a direct
// softmax, and the Q8_0 decode kernel's staging windows. The kernels themselves are checked on the GPU by
// cuda_ops_test.cpp and cuda_attention_test.cpp.
//
// Compiled by nvcc as C++17 (like backends/cuda); the CPU formulas are restated here, not linked, because
// this test executable does not link backends/cpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/rope.cuh"
#include "backends/cuda/route_topk.cuh"

namespace magnetar {
namespace {

// ---- rope ------------------------------------------------------------------------------------------------

// cpu::rope_neox's table, restated (backends/cpu/ops.cpp).
void cpu_cos_sin(int32_t pos, int i, int head_dim, float theta, float* c, float* s) {
  const float inv_freq = float(1.0 / std::pow(double(theta), double(2 * i) / double(head_dim)));
  const double angle = double(pos) * double(inv_freq);
  *c = float(std::cos(angle));
  *s = float(std::sin(angle));
}

// On the host the shared formula must be the CPU's bit for bit (a float pow or a float angle would not be).
TEST(CudaOpsHost, RopeAnglesMatchCpuFormula) {
  for (const float theta : {10000.0f, 1000000.0f}) {
    for (const int head_dim : {64, 128}) {
      for (const int32_t pos : {0, 1, 17, 4095, 40000, 1000000}) {
        for (int i = 0; i < head_dim / 2; ++i) {
          float c, s, rc, rs;
          cuda::rope::cos_sin(pos, i, head_dim, theta, &c, &s);
          cpu_cos_sin(pos, i, head_dim, theta, &rc, &rs);
          ASSERT_EQ(c, rc) << "pos " << pos << " i " << i;
          ASSERT_EQ(s, rs) << "pos " << pos << " i " << i;
        }
      }
    }
  }
}

// ---- router top-k ------------------------------------------------------------------------------------------

// The kernel's selection: every expert's rank (route::rank_of, the sum of the parts the kernel counts with
// route::rank_part), the expert of rank j < k in slot j; a slot left empty or filled twice is -1 / -2 (ranks not
// distinct).
std::vector<int> rank_topk(const std::vector<float>& logits, int k) {
  std::vector<int> ids(size_t(k), -1);
  for (int e = 0; e < int(logits.size()); ++e) {
    const int rank = cuda::route::rank_of(logits.data(), int(logits.size()), e);
    if (rank < k) ids[size_t(rank)] = ids[size_t(rank)] == -1 ? e : -2;
  }
  return ids;
}

// The CPU route()'s selection (models/qwen3_moe/qwen3_moe.cpp), restated.
std::vector<int> cpu_topk(const std::vector<float>& logits, int k) {
  std::vector<int> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

// Ids identical, order included, on Gaussian logits and on logits with many ties (multiples of 0.5, and all
// equal), for expert counts around the lane count and up to the limit.
TEST(CudaOpsHost, RouterTopkMatchesCpuOrderWithTies) {
  std::mt19937_64 gen(20261130);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const int n : {1, 8, 31, 32, 33, 60, 128, 256, 1000, 1024}) {
    for (const int k : {1, 2, 8, 32}) {
      if (k > n) continue;
      for (int mode = 0; mode < 3; ++mode) {
        std::vector<float> logits(static_cast<size_t>(n));
        for (float& l : logits) {
          const float g = dist(gen);
          l = mode == 0 ? g : mode == 1 ? std::round(2.0f * g) / 2.0f : 0.25f;
        }
        EXPECT_EQ(rank_topk(logits, k), cpu_topk(logits, k)) << "n " << n << " k " << k << " mode " << mode;
      }
    }
  }
}

// NaN logits (a hidden state gone NaN): every expert still has a distinct rank, NaN above every number (lower ids
// first among NaNs), -0 equal to +0; compared as floats, a NaN ranked before nothing and nothing before it, so slots
// went unfilled (-1) or filled twice (-2).
TEST(CudaOpsHost, RouterTopkRanksNaNAboveEveryNumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {1.0f, nan, -0.0f, 3.0f, nan, 0.0f, -INFINITY, INFINITY};
  EXPECT_EQ(rank_topk(logits, 8), (std::vector<int>{1, 4, 7, 3, 0, 2, 5, 6}));
  const std::vector<float> all_nan(60, nan);
  std::vector<int> first(32);
  std::iota(first.begin(), first.end(), 0);
  EXPECT_EQ(rank_topk(all_nan, 32), first);
}

// ---- attention split-K ------------------------------------------------------------------------------------

// Every plan covers the chunks exactly once with non-empty splits, stays within max_splits, and uses one split
// for contexts of one chunk.
TEST(CudaOpsHost, AttentionSplitPlanCoversContext) {
  for (const int64_t rows : {int64_t(1), int64_t(17), int64_t(128), int64_t(129), int64_t(300), int64_t(5000),
                             int64_t(20000), int64_t(131072)}) {
    for (const int64_t n_head_kv : {int64_t(1), int64_t(2), int64_t(4), int64_t(8), int64_t(64)}) {
      for (const int sms : {1, 16, 132}) {
        const cuda::attn::SplitPlan p = cuda::attn::plan_splits(rows, n_head_kv, sms, 512);
        const int64_t chunks = (rows + cuda::attn::kChunk - 1) / cuda::attn::kChunk;
        ASSERT_EQ(p.n_chunks, chunks);
        ASSERT_GE(p.n_splits, 1);
        ASSERT_LE(p.n_splits, 512);
        ASSERT_GE(p.chunks_per_split, 1);
        ASSERT_GE(int64_t(p.n_splits) * p.chunks_per_split, chunks);      // covered
        ASSERT_LT(int64_t(p.n_splits - 1) * p.chunks_per_split, chunks);  // last split not empty
        if (chunks == 1) ASSERT_EQ(p.n_splits, 1);
      }
    }
  }
}

// The tensor-core decode plan: splits of whole steps (64 rows for 4 warps, 128 for 8) covering the rows once, none
// empty, no more than the slots per KV head (at least one) nor max_splits, and no more than decode_split_bound gives
// for any longer cache (a graph's grid); contexts of one step take one split.
TEST(CudaOpsHost, AttentionDecodePlanCoversContext) {
  for (const int64_t rows : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(127), int64_t(129),
                             int64_t(600), int64_t(3000), int64_t(40000), int64_t(65536), int64_t(1) << 20}) {
    for (const int64_t n_head_kv : {int64_t(1), int64_t(4), int64_t(8), int64_t(64), int64_t(300)}) {
      for (const int slots : {1, 132, 264, 396}) {
        const int64_t want = cuda::attn::decode_split_target(n_head_kv, slots, 512);
        for (const int step : {cuda::attn::kDecodeStep, 2 * cuda::attn::kDecodeStep}) {
          const cuda::attn::DecodePlan p = cuda::attn::plan_decode_rows(int(rows), int(want), step);
          const std::string at = std::to_string(rows) + " rows, " + std::to_string(n_head_kv) + " heads, " +
                                 std::to_string(slots) + " slots, step " + std::to_string(step);
          ASSERT_EQ(want, std::max<int64_t>(1, std::min<int64_t>(slots / n_head_kv, 512))) << at;
          ASSERT_EQ(p.rows_per_split % step, 0) << at;
          ASSERT_GE(p.rows_per_split, step) << at;
          ASSERT_GE(p.n_splits, 1) << at;
          ASSERT_LE(p.n_splits, want) << at;
          ASSERT_GE(int64_t(p.n_splits) * p.rows_per_split, rows) << at;      // covered
          ASSERT_LT(int64_t(p.n_splits - 1) * p.rows_per_split, rows) << at;  // last split not empty
          if (rows <= step) ASSERT_EQ(p.n_splits, 1) << at;
          for (const int64_t max_rows : {rows, rows + 1, 2 * rows, int64_t(1) << 21}) {
            ASSERT_LE(p.n_splits, cuda::attn::decode_split_bound(max_rows, n_head_kv, slots, 512)) << at;
          }
        }
        const cuda::attn::DecodePlan d = cuda::attn::plan_decode(rows, n_head_kv, slots, 512);  // 64-row steps
        const cuda::attn::DecodePlan s = cuda::attn::plan_decode_rows(int(rows), int(want), cuda::attn::kDecodeStep);
        ASSERT_EQ(d.rows_per_split, s.rows_per_split);
        ASSERT_EQ(d.n_splits, s.n_splits);
      }
    }
  }
}

// Tokens at positions P and P + 1 with P even (rows P + 1 and P + 2) get the same decode plan, split length and count:
// attention_decode_mma reads the rows once for such a pair of draft tokens, each with the bits of its own launch.
TEST(CudaOpsHost, AttentionDecodePlanSharedByPositionPairs) {
  for (const int want : {1, 4, 8, 33, 66, 132, 512}) {
    for (const int step : {cuda::attn::kDecodeStep, 2 * cuda::attn::kDecodeStep}) {
      for (int rows = 1; rows < 70000; rows += 2) {
        const cuda::attn::DecodePlan a = cuda::attn::plan_decode_rows(rows, want, step);
        const cuda::attn::DecodePlan b = cuda::attn::plan_decode_rows(rows + 1, want, step);
        ASSERT_EQ(a.rows_per_split, b.rows_per_split) << rows << " rows, want " << want << ", step " << step;
        ASSERT_EQ(a.n_splits, b.n_splits) << rows << " rows, want " << want << ", step " << step;
      }
    }
  }
}

// The Q8_0 decode kernel's staging of a head row (attn::q8_*): for head sizes 64/128/256, 1 to 8 KV heads (rows
// 16-byte aligned or not) and the first 40 cache rows, every head row's skew is within q8_skew_max, its window's
// pieces read exactly [at - skew, at + head bytes) (the whole row, nothing past it, nothing before the window), the
// window fits the staged pitch (16 x q8_window_pieces), and so does every 36-byte read the dequantization makes of
// a block (from the block's first byte rounded down to 4).
TEST(CudaOpsHost, Q8DecodeWindowsCoverEachHeadRow) {
  for (const int head_dim : {64, 128, 256}) {
    const int hb = cuda::attn::q8_head_bytes(head_dim), pieces = cuda::attn::q8_window_pieces(head_dim);
    ASSERT_EQ(hb, head_dim / 32 * 34);
    for (int64_t n_head_kv = 1; n_head_kv <= 8; ++n_head_kv) {
      const int64_t row_bytes = n_head_kv * hb;
      for (int64_t row = 0; row < 40; ++row) {
        for (int64_t hk = 0; hk < n_head_kv; ++hk) {
          const int64_t at = row * row_bytes + hk * hb;
          const int skew = int(at % 16);
          ASSERT_LE(skew, cuda::attn::q8_skew_max(head_dim)) << head_dim << " " << n_head_kv << " " << at;
          int64_t next = at - skew;  // the reads, piece by piece, are contiguous from the window's start
          for (int col = 0; col < pieces; ++col) {
            const int bytes = cuda::attn::q8_piece_bytes(at, hb, col);
            ASSERT_GE(bytes, 0);
            ASSERT_LE(bytes, 16);
            if (bytes > 0) {
              ASSERT_EQ((at & ~int64_t(15)) + 16 * col, next) << head_dim << " " << at << " piece " << col;
              next += bytes;
            }
          }
          ASSERT_EQ(next, at + hb) << head_dim << " " << n_head_kv << " " << at;
          for (int b = 0; b < head_dim / 32; ++b) ASSERT_LE(skew + (34 * b & ~3) + 36, 16 * pieces) << head_dim;
        }
      }
    }
  }
}

// The kernel's algebra on the host, in float: per split, chunks of kChunk scores folded with rescale();
// then the combine kernel's merge (weights exp(m_s - M)). Must equal the direct softmax-weighted mean of
// random values within float rounding (bound: 1e-5 relative to max|v|, far above the ~1e-6 these sums of
// <= 20000 terms reach and far below the effect of a dropped or doubled chunk, >= 1/157 of a weight).
TEST(CudaOpsHost, AttentionOnlineSoftmaxMergeMatchesDirect) {
  std::mt19937_64 gen(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (const int64_t rows : {int64_t(1), int64_t(17), int64_t(300), int64_t(5000), int64_t(20000)}) {
    std::vector<float> s(static_cast<size_t>(rows)), v(static_cast<size_t>(rows));
    for (float& x : s) x = dist(gen);
    for (float& x : v) x = dist(gen);
    const cuda::attn::SplitPlan plan = cuda::attn::plan_splits(rows, 1, 16, 64);
    std::vector<float> part_o, part_m, part_l;
    for (int sp = 0; sp < plan.n_splits; ++sp) {
      cuda::attn::SoftmaxState st;
      float o = 0.0f;
      const int c_end = std::min(plan.n_chunks, (sp + 1) * plan.chunks_per_split);
      for (int c = sp * plan.chunks_per_split; c < c_end; ++c) {
        const int64_t j0 = int64_t(c) * cuda::attn::kChunk;
        const int64_t j1 = std::min(rows, j0 + cuda::attn::kChunk);
        float mx = -INFINITY;
        for (int64_t j = j0; j < j1; ++j) mx = std::max(mx, s[size_t(j)]);
        o *= cuda::attn::rescale(st, mx);
        for (int64_t j = j0; j < j1; ++j) {
          const float e = std::exp(s[size_t(j)] - st.m);
          st.l += e;
          o += e * v[size_t(j)];
        }
      }
      part_o.push_back(o);
      part_m.push_back(st.m);
      part_l.push_back(st.l);
    }
    const float m_all = *std::max_element(part_m.begin(), part_m.end());
    float num = 0.0f, den = 0.0f;
    for (size_t i = 0; i < part_o.size(); ++i) {
      const float w = std::exp(part_m[i] - m_all);
      num += w * part_o[i];
      den += w * part_l[i];
    }
    const double got = double(num / den);
    const double ms = *std::max_element(s.begin(), s.end());
    double dn = 0, dd = 0, vmax = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      const double e = std::exp(double(s[j]) - ms);
      dn += e * double(v[j]);
      dd += e;
      vmax = std::max(vmax, std::fabs(double(v[j])));
    }
    EXPECT_NEAR(got, dn / dd, 1e-5 * vmax) << "rows " << rows << " splits " << plan.n_splits;
  }
}

}  // namespace
}  // namespace magnetar
