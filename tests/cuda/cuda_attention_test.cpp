// The attention ops on the GPU (attention, attention_prefill_mma, attention_decode_mma, over F16, Q8_0 and FP8 caches)
// against a double reference over the same K/V and float q (STYLE.md rule 7). Needs a GPU: without one every test
// reports SKIPPED, never passed (their argument checks run in cuda_ops_test.cpp's RejectsBadArguments). What is
// asserted, and why each bound holds (u = 2^-24, float's unit roundoff):
//   attention               (random data) per element d: (2 eps + 2 gamma_N + u) * max_j |v_jd| against a double
//                           reference over the same F16 K/V and float q, eps and N derived in attention_bound().
//                           (exact data) K = 0 makes every score 0 and every exp factor exactly 1; V holds small
//                           integers, so every sum is exact and out = fl(sum / count) bit for bit: a dropped,
//                           doubled or misplaced row, a wrong window edge or a wrong V head fails exactly.
//                           Rows past the attended range hold F16 NaN, so reading one poisons the output.
//   attention_prefill_mma   (random data) per element: the bound derived above mma_expect() from the f16
//                           rounding of Q and P (2^-11 each), ex2.approx and the f32 sums, against the same double
//                           reference; many tokens per call against one call per token within twice that bound.
//                           (exact data) the K = 0 check above holds bit for bit (ex2(0) = 1, integer sums exact).
//   attention_decode_mma    the same bound and exact check (F16), and over Q8_0 and FP8 caches the bound against
//                           the values it is specified to compute with, f16(d * q) and the e4m3 values; with
//                           prepare (qkv_prepare's work in
//                           the launch) bit for bit the output and caches of qkv_prepare + the plain call.
// Shapes: head_dim 64, 96, 128, 256, n_head/n_head_kv 8/2, 4/4, 32/4, 16/1; contexts 1, 17, 300, 5000, 20000
// (several splits, a partial last chunk, several chunks per split), windows that cut inside a chunk; prefill of 7
// and 33 tokens after 0, 17 and 300 cached rows. attention_prefill_mma: prefill_mma_cases() (groups 1, 3, 4, 8, 16;
// head_dim 64, 128, 256; 1 to 200 tokens after 0 or 1000 rows; windows 0, 1, 100, 5000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "quant/fp16.h"
#include "quant/fp8.h"
#include "quant/quant.h"
#include "tests/cuda/cuda_test_util.h"

namespace magnetar {
namespace {

using cuda_test::from_device;
using cuda_test::gaussian;
using cuda_test::kU;
using cuda_test::Rng;
using cuda_test::to_device;

constexpr uint64_t kSeed = 20261130;  // the seeds of cuda_ops_test.cpp's attention tests before the split

// ---- attention -----------------------------------------------------------------------------------------------

struct AttnShape {
  int64_t n_head, n_head_kv, head_dim;
};

struct AttnCase {
  AttnShape shape;
  int64_t n_tok, pos0, window;
};

std::string describe(const AttnCase& c) {
  return "n_head " + std::to_string(c.shape.n_head) + "/" + std::to_string(c.shape.n_head_kv) + " head_dim " +
         std::to_string(c.shape.head_dim) + " n_tok " + std::to_string(c.n_tok) + " pos0 " + std::to_string(c.pos0) +
         " window " + std::to_string(c.window);
}

// The decode contexts (rows attended = pos0 + 1) and prefill batches of the tests.
std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases;
  const AttnShape shapes[] = {{8, 2, 128}, {4, 4, 64}, {8, 2, 64}, {4, 4, 128}, {32, 4, 128}, {16, 1, 96}, {4, 2, 256}};
  for (const AttnShape& s : shapes) {
    for (const int64_t ctx : {int64_t(1), int64_t(17), int64_t(300), int64_t(5000)})
      cases.push_back({s, 1, ctx - 1, 0});
    cases.push_back({s, 1, 299, 100});    // window edge inside a chunk
    cases.push_back({s, 1, 4999, 4096});  // window of many chunks, not chunk-aligned
    cases.push_back({s, 7, 0, 0});        // prefill from an empty cache
    cases.push_back({s, 33, 17, 0});
    cases.push_back({s, 7, 300, 50});  // prefill with a sliding window
  }
  cases.push_back({{8, 2, 128}, 1, 19999, 0});  // > 64 chunks: several chunks per split
  cases.push_back({{4, 4, 64}, 1, 19999, 0});
  return cases;
}

struct AttnData {
  std::vector<float> q;        // [n_tok, n_head, head_dim]
  std::vector<uint16_t> k, v;  // [n_rows, n_head_kv, head_dim] F16 bits
};

int64_t n_rows_of(const AttnCase& c) { return c.pos0 + c.n_tok + 5; }  // 5 NaN rows past the last position

// A Q8_0 cache of `rows` rows of kv elements: the first `valid` the reference quantizer's blocks of x (valid * kv
// values), the rest blocks of NaN scale (NaN when dequantized: a kernel that read them would show it).
std::vector<uint8_t> q8_cache(const std::vector<float>& x, int64_t valid, int64_t rows, int64_t kv) {
  const size_t row_bytes = quant::row_size(quant::Type::Q8_0, kv);
  std::vector<uint8_t> c(size_t(rows) * row_bytes);
  quant::traits(quant::Type::Q8_0).from_float(x.data(), c.data(), valid * kv);
  const quant::BlockQ8_0 nan_block = {0x7e00, {}};
  for (size_t b = size_t(valid) * row_bytes; b < c.size(); b += sizeof nan_block) {
    std::memcpy(c.data() + b, &nan_block, sizeof nan_block);
  }
  return c;
}

// The same for an F16, Q8_0 or FP8 cache: the first `valid` rows x as F16 (FP8: quant::float_to_fp8_e4m3's bytes), the
// rest NaN.
std::vector<uint8_t> kv_cache(const std::vector<float>& x, int64_t valid, int64_t rows, int64_t kv, quant::Type type) {
  if (type == quant::Type::Q8_0) return q8_cache(x, valid, rows, kv);
  if (type == quant::Type::F8_E4M3) {
    std::vector<uint8_t> c(size_t(rows * kv), 0x7f);
    for (size_t i = 0; i < size_t(valid * kv); ++i) c[i] = quant::float_to_fp8_e4m3(x[i]);
    return c;
  }
  std::vector<uint8_t> c(size_t(rows * kv) * 2);
  auto* h = reinterpret_cast<uint16_t*>(c.data());
  for (size_t i = 0; i < c.size() / 2; ++i) h[i] = i < size_t(valid * kv) ? quant::float_to_fp16(x[i]) : 0x7e00;
  return c;
}

// kRandom: Gaussian K and V. kUniformScores: K = 0 (every score 0) and V integers in [-8, 8].
enum class AttnFill { kRandom, kUniformScores };

// Gaussian q; K/V rows 0 .. pos0 + n_tok - 1 filled as `fill` says, the rows past them F16 NaN.
AttnData attention_data(Rng& rng, const AttnCase& c, AttnFill fill) {
  const uint16_t nan16 = 0x7e00;
  const int64_t HK = c.shape.n_head_kv, D = c.shape.head_dim;
  const int64_t rows = n_rows_of(c), valid = c.pos0 + c.n_tok;
  AttnData d;
  d.q = gaussian(rng, size_t(c.n_tok * c.shape.n_head * D));
  d.k.assign(size_t(rows * HK * D), nan16);
  d.v.assign(size_t(rows * HK * D), nan16);
  for (size_t i = 0; i < size_t(valid * HK * D); ++i) {
    if (fill == AttnFill::kRandom) {
      d.k[i] = quant::float_to_fp16(rng.gaussian());
      d.v[i] = quant::float_to_fp16(rng.gaussian());
    } else {
      d.k[i] = quant::float_to_fp16(0.0f);
      d.v[i] = quant::float_to_fp16(float(int(rng.bits() % 17) - 8));
    }
  }
  return d;
}

// The op under test: attention (split-K decode, per-token prefill), attention_prefill_mma (its own choice of query
// rows per warp, or 16 or 32 forced) or attention_decode_mma (tensor cores).
enum class AttnOp { kAttention, kPrefillMma, kPrefillMma16, kPrefillMma32, kDecodeMma };

const char* op_name(AttnOp op) {
  switch (op) {
    case AttnOp::kAttention: return "attention";
    case AttnOp::kPrefillMma: return "attention_prefill_mma";
    case AttnOp::kPrefillMma16: return "attention_prefill_mma (16-row warps)";
    case AttnOp::kPrefillMma32: return "attention_prefill_mma (32-row warps)";
    case AttnOp::kDecodeMma: break;
  }
  return "attention_decode_mma";
}

Status run_op(AttnOp op, const cuda::AttentionArgs& args, cuda::AttentionWorkspace& ws, cuda::Stream& stream) {
  cuda::AttentionArgs a = args;
  switch (op) {
    case AttnOp::kAttention:
      return cuda::attention(args, ws, stream);
    case AttnOp::kPrefillMma32:
    case AttnOp::kPrefillMma16:
      a.prefill_warp_rows = op == AttnOp::kPrefillMma16 ? 16 : 32;
      [[fallthrough]];
    case AttnOp::kPrefillMma:
      return cuda::attention_prefill_mma(a, stream);
    case AttnOp::kDecodeMma:
      break;
  }
  return cuda::attention_decode_mma(args, ws, stream);
}

// Runs the GPU op on the data; rows past pos0 + n_tok - 1 are F16 NaN. attention_prefill_mma does not use `ws`.
std::vector<float> run_attention(const AttnCase& c, const AttnData& d, cuda::AttentionWorkspace& ws,
                                 cuda::Stream& stream, AttnOp op = AttnOp::kAttention) {
  const size_t out_n = size_t(c.n_tok * c.shape.n_head * c.shape.head_dim);
  auto dq = to_device(d.q);
  auto dk = to_device(d.k);
  auto dv = to_device(d.v);
  auto dout = cuda::DeviceBuffer::allocate(out_n * sizeof(float));
  EXPECT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok());
  if (!dq.ok() || !dk.ok() || !dv.ok() || !dout.ok()) return {};
  const cuda::AttentionArgs args{.q = dq->as<float>(),
                                 .k_cache = dk->as<uint16_t>(),
                                 .v_cache = dv->as<uint16_t>(),
                                 .out = dout->as<float>(),
                                 .n_tok = c.n_tok,
                                 .pos0 = c.pos0,
                                 .n_head = c.shape.n_head,
                                 .n_head_kv = c.shape.n_head_kv,
                                 .head_dim = c.shape.head_dim,
                                 .window = c.window,
                                 .scale = float(1.0 / std::sqrt(double(c.shape.head_dim)))};
  const Status s = run_op(op, args, ws, stream);
  EXPECT_TRUE(s.ok()) << op_name(op) << ": " << s.message();
  stream.synchronize();
  return from_device<float>(*dout, out_n);
}

int64_t first_row(const AttnCase& c, int64_t pos) {
  return c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
}

// Tolerance of one query head against the exact (double) result, from the kernel's float arithmetic:
//   scores: a float dot of head_dim terms and a multiply by scale: |ds_j| <= A_j = gamma_(D+1) scale sum_d |q_d k_jd|;
//   softmax weights exp(s_j - m): relative error <= eps = 2 A + 4u S + (C + 2)(2^-22 + 2u), with A = max A_j,
//     S = max |s_j| (the rounding of s_j - m and m_c - M), and per exp factor 2 ulp of expf plus a rounding, for
//     the C <= chunks per split rescales and the split's combine factor;
//   a weighted mean moves by <= 2 eps max_j |v_jd| under relative weight errors eps (numerator and denominator);
//   the sums: at most N = rows per split + splits + 16 float additions deep (a thread's rows, the row-subset fold,
//     the warp tree for the denominator, the combine), gamma_N relative to sum p |v| <= max|v| sum p, in the
//     numerator and the denominator; plus the final division's rounding.
double attention_bound(double eps, int64_t depth, double vmax) {
  const double gamma = double(depth) * kU / (1.0 - double(depth) * kU);
  return (2.0 * eps + 2.0 * gamma + kU) * vmax * 1.01 + 1e-30;
}

TEST(CudaOps, AttentionMatchesReference) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(32, 256));
  Rng rng(kSeed + 7);
  for (const AttnCase& c : attention_cases()) {
    const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> got = run_attention(c, d, ws, stream);
    ASSERT_EQ(got.size(), size_t(c.n_tok * H * D)) << describe(c);
    const double scale = double(float(1.0 / std::sqrt(double(D))));
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok && bad < 5; ++t) {
      const int64_t pos = c.pos0 + t, lo = first_row(c, pos), n_att = pos - lo + 1;
      // Chunks per split: attention.cuh's plan_splits restated (decode: about 8 CTAs per SM, at most
      // kMaxAttentionSplits splits, at most one per chunk; prefill: one split of all chunks).
      const int64_t chunks = (n_att + 127) / 128;
      const int64_t want = std::max<int64_t>(
          1, std::min({(8 * int64_t(ws.sm_count()) + HK - 1) / HK, cuda::kMaxAttentionSplits, chunks}));
      const int64_t per_split = c.n_tok == 1 ? (chunks + want - 1) / want : chunks;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / group;
        const float* q = d.q.data() + (t * H + h) * D;
        std::vector<double> s(static_cast<size_t>(n_att));
        double a_max = 0, s_max_abs = 0, m = -INFINITY;
        for (int64_t j = lo; j <= pos; ++j) {
          const uint16_t* kr = d.k.data() + (j * HK + hk) * D;
          double dot = 0, mag = 0;
          for (int64_t e = 0; e < D; ++e) {
            const double kv = double(quant::fp16_to_float(kr[e]));
            dot += double(q[e]) * kv;
            mag += std::fabs(double(q[e]) * kv);
          }
          s[size_t(j - lo)] = double(float(scale)) * dot;
          a_max = std::max(a_max, double(D + 1) * kU * scale * mag);
          s_max_abs = std::max(s_max_abs, std::fabs(s[size_t(j - lo)]));
          m = std::max(m, s[size_t(j - lo)]);
        }
        const double eps =
            2.0 * a_max + 4.0 * kU * s_max_abs + double(per_split + 2) * (std::ldexp(1.0, -22) + 2.0 * kU);
        const int64_t depth = per_split * 128 + 64 + 16;
        for (double& x : s) x = std::exp(x - m);  // now the softmax numerators
        for (int64_t e = 0; e < D; ++e) {
          double num = 0, den = 0, vmax = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            const double p = s[size_t(j - lo)];
            const double vv = double(quant::fp16_to_float(d.v[size_t((j * HK + hk) * D + e)]));
            num += p * vv;
            den += p;
            vmax = std::max(vmax, std::fabs(vv));
          }
          const double want = num / den;
          const double g = double(got[size_t((t * H + h) * D + e)]);
          const double tol = attention_bound(eps, depth, vmax);
          if (!(std::fabs(g - want) <= tol) && bad++ < 5) {
            ADD_FAILURE() << describe(c) << " token " << t << " head " << h << " element " << e << ": got " << g
                          << ", want " << want << " (tolerance " << tol << ")";
          }
        }
      }
    }
  }
}

// Decode with the position read from device memory (pos0_device, the decode graph's form) in a graph captured at
// another position (of the same kernel) with a grid sized for a longer cache (max_rows): replayed at each decode
// case's position it gives the same bits as attention() with that pos0 from the host (the same split plan, made on
// the device), including the cases of one split (no combine) and of several chunks per split. For attention() and
// attention_decode_mma().
void expect_graph_position_matches_host(AttnOp op, const std::vector<AttnShape>& shapes, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(32, 256));
  Rng rng(seed);
  for (const AttnShape& shape : shapes) {
    for (const int64_t window : {int64_t(0), int64_t(4096)}) {
      const int64_t max_rows = 25000;
      // One cache of max_rows random rows; each case reads its first pos0 + 1.
      const AttnData d = attention_data(rng, {shape, 1, max_rows - 1, 0}, AttnFill::kRandom);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(d.q));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(d.k));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(d.v));
      const size_t out_n = size_t(shape.n_head * shape.head_dim);
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
      ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>{0}));
      cuda::AttentionArgs args{.q = dq.as<float>(), .k_cache = dk.as<uint16_t>(), .v_cache = dv.as<uint16_t>(),
                               .out = dout.as<float>(), .n_tok = 1, .pos0 = 0, .n_head = shape.n_head,
                               .n_head_kv = shape.n_head_kv, .head_dim = shape.head_dim, .window = window,
                               .scale = float(1.0 / std::sqrt(double(shape.head_dim)))};
      for (const int64_t pos : {int64_t(0), int64_t(16), int64_t(299), int64_t(4999), int64_t(19999),
                                max_rows - 1}) {
        // Captured at another position of the same kernel (attention_decode_variant: a decode graph is captured
        // again when a sequence crosses a variant's bound), replayed at pos.
        cuda::AttentionArgs graphed = args;
        graphed.pos0 = pos > 777 ? pos - 777 : 777;
        ASSERT_EQ(cuda::attention_decode_variant(shape.head_dim, quant::Type::F16, graphed.pos0 + 1),
                  cuda::attention_decode_variant(shape.head_dim, quant::Type::F16, pos + 1));
        graphed.pos0_device = dpos.as<int32_t>();
        graphed.max_rows = max_rows;
        cuda::Graph::begin_capture(stream);
        const Status st = run_op(op, graphed, ws, stream);
        ASSERT_OK_AND_ASSIGN(cuda::Graph graph, cuda::Graph::end_capture(stream));
        ASSERT_OK(st);
        args.pos0 = pos;
        ASSERT_OK(run_op(op, args, ws, stream));
        stream.synchronize();
        const std::vector<float> want = from_device<float>(dout, out_n);
        ASSERT_OK(dout.upload(std::vector<float>(out_n, NAN).data(), out_n * sizeof(float)));
        const int32_t p32 = int32_t(pos);
        ASSERT_OK(dpos.upload(&p32, sizeof p32));
        graph.launch(stream);
        stream.synchronize();
        const std::vector<float> got = from_device<float>(dout, out_n);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), out_n * sizeof(float)))
            << op_name(op) << " n_head " << shape.n_head << " head_dim " << shape.head_dim << " window " << window
            << " pos " << pos;
      }
    }
  }
}

TEST(CudaOps, AttentionDecodePositionFromDeviceInAGraph) {
  SKIP_WITHOUT_GPU();
  expect_graph_position_matches_host(AttnOp::kAttention, {{32, 4, 128}, {16, 1, 96}}, kSeed + 62);
}

// K = 0: all scores 0, every exp factor exactly 1, so out = mean of V over the attended rows; V holds integers
// in [-8, 8] (exact in F16, every partial sum exact in float), so the result is fl(sum / count) exactly.
// attention_prefill_mma too: Q * 0 = 0 in the tensor core, ex2.approx(0) is exactly 1 (PTX ISA 9.7.3.21), the f16
// P = 1 is exact, and the tensor core's sums of integers of magnitude < 2^24 are exact (it keeps at least float's
// 24 bits below the largest term), so its result is the same fl(sum / count) (one IEEE division at the end).
void expect_uniform_scores_exact(AttnOp op, const std::vector<AttnCase>& cases, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(seed);
  for (const AttnCase& c : cases) {
    const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
    const AttnData d = attention_data(rng, c, AttnFill::kUniformScores);
    const std::vector<float> got = run_attention(c, d, ws, stream, op);
    ASSERT_EQ(got.size(), size_t(c.n_tok * H * D)) << describe(c);
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const int64_t pos = c.pos0 + t, lo = first_row(c, pos);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t e = 0; e < D; ++e) {
          int64_t sum = 0;
          for (int64_t j = lo; j <= pos; ++j) {
            sum += int64_t(quant::fp16_to_float(d.v[size_t((j * HK + h / group) * D + e)]));
          }
          const float want = float(double(sum) / double(pos - lo + 1));
          const float g = got[size_t((t * H + h) * D + e)];
          if (g != want && bad++ < 5) {
            ADD_FAILURE() << op_name(op) << " " << describe(c) << " token " << t << " head " << h << " element " << e
                          << ": got " << g << ", want " << want;
          }
        }
      }
    }
  }
}

TEST(CudaOps, AttentionUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  expect_uniform_scores_exact(AttnOp::kAttention, attention_cases(), kSeed + 8);
}

// ---- attention_prefill_mma -----------------------------------------------------------------------------------

// A full grid (groups 1, 4, 8 through n_head/n_head_kv 2/2, 8/2, 16/2; head_dim 64 and 128; 1, 7, 64 and 200
// tokens; empty and 1000-row histories; no window and a window of 100) and beyond it: group 3 (42 tokens per CTA,
// 2 idle rows), group 16 with one KV head, head_dim 256 (64 rows per CTA, 32-row K/V tiles), a window of one row and
// a window longer than the history (folded into none).
std::vector<AttnCase> prefill_mma_cases() {
  std::vector<AttnCase> cases;
  const AttnShape grid[] = {{2, 2, 64}, {8, 2, 64}, {16, 2, 64}, {2, 2, 128}, {8, 2, 128}, {16, 2, 128}};
  for (const AttnShape& s : grid) {
    for (const int64_t n_tok : {1, 7, 64, 200}) {
      for (const int64_t pos0 : {0, 1000}) {
        for (const int64_t window : {0, 100}) cases.push_back({s, n_tok, pos0, window});
      }
    }
  }
  const AttnShape more[] = {{6, 2, 128}, {16, 1, 128}, {8, 2, 256}};
  for (const AttnShape& s : more) {
    for (const int64_t n_tok : {7, 200}) {
      for (const int64_t pos0 : {0, 1000}) {
        for (const int64_t window : {0, 100}) cases.push_back({s, n_tok, pos0, window});
      }
    }
  }
  cases.push_back({{8, 2, 128}, 64, 1000, 1});
  cases.push_back({{8, 2, 128}, 64, 1000, 5000});
  return cases;
}

// The exact output (double, over the same F16 K/V and float q: what cpu::attention computes up to its own float
// rounding) and the bound on attention_prefill_mma's error, per element [n_tok, n_head, head_dim].
//
// Derivation (attention_prefill.cu lists the kernel's arithmetic). u = 2^-24; gamma(n, w) = n w / (1 - n w). For one
// query row: S_j = scale q.k_j the exact scores, M = max S_j, p_j = e^(S_j - M), l = sum p_j, w_j = p_j / l.
//   Scores. The kernel's q' = f16(f32(q c)), c = f32(scale log2 e), is within |q c| (2^-11 + 3u) + 2^-25 of q c
//   (f16's unit roundoff 2^-11, or half its subnormal spacing 2^-25 below 2^-14; u each for c and the product). The
//   products q' k are exact in the tensor core; its sums truncate (<= 1 ulp = 2u of the largest term per addition,
//   D/16 chained mma of 16 products + C: gamma(2D + 16, 2u) of sum |q' k| covers it). In natural units (times ln 2,
//   and ln 2 c = scale) each score is off by at most
//     E_j = scale sum_d |q_d k_jd| (2^-11 + 3u + gamma(2D + 16, 2u)) + ln 2 2^-25 sum_d |k_jd|.
//   Exponentials. p_j = ex2(s_j - m) with m the running max: the subtraction rounds (u |s - m| <= 2u max|S| after
//   ln 2), ex2.approx is within 2 ulp of the rounded result (<= 2.5 ulp <= 5u relative); every rescale factor alpha
//   (<= one per tile) multiplies the keys before it by another such error (5u, and the telescoping subtractions
//   m_old - m_new add <= 2u max|S| in all). The running maxima cancel otherwise, so each key's weight is off by a
//   factor e^(d_j) apart from a factor common to all keys, |d_j| <= delta = max_j E_j + 4u max|S| + 5u (tiles + 1).
//   Normalized weights then move by a factor in [e^(-2 delta), e^(2 delta)]:
//     |d out| <= (e^(2 delta) - 1) sum_j w_j |v_jd|.
//   P to f16. The numerator uses f16(p), the denominator the f32 p: on the running max's scale the rounding is <=
//   max(2^-11 p, 2^-25), and the later rescales (<= 1) only shrink it, so on the final scale <= max(2^-11 p_j,
//   2^-25) per key, with the kernel's p_j and l within e^(2 delta) of the exact ones:
//     |d out| <= e^(4 delta) sum_j max(2^-11 p_j, 2^-25) |v_jd| / l.
//   Sums. The P V chain (tensor-core truncation, 2u per addition, <= keys loaded + 4 per tile; the f32 rescales),
//   the f32 sum l (thread partials, then the quad) and the final division:
//     |d out| <= e^(2 delta) (2 gamma(N, 2u) + u) sum_j w_j |v_jd|, N = 2 (rows attended + 192) + 4 tiles.
//   A CTA spans <= 128 tokens and a tile is >= 32 keys: tiles <= (rows attended + 128) / 32 + 2.
// attention_decode_mma (same arithmetic, tiles of 16 keys per warp, then the 4 warps merged with ex2 weights and
// the splits combined with expf of the max difference after a conversion to natural units): tiles <= rows attended
// / 16 + 4 rescales (the merge and the combine among them), another 4u max|S| for the conversion and the
// combine's subtraction, and N grows by the merge and the combine's sums (<= kMaxAttentionSplits + 8).
// The bound is the sum of the three, times 1.01, plus 1e-30. It assumes the tensor core keeps at least float's 24
// bits below the largest term of its sums (measured on V100/T4/A100 by Fasi et al. 2021; a Hopper that kept fewer
// would fail here, not pass silently). Typical size: head_dim 128, Gaussian data: E ~ 4e-3, bound ~ 1e-2 sum w|v|.
struct AttnExpect {
  std::vector<double> want, tol;  // [n_tok, n_head, head_dim]
};

AttnExpect mma_expect(const AttnCase& c, const AttnData& d, AttnOp op = AttnOp::kPrefillMma) {
  const bool decode = op == AttnOp::kDecodeMma;
  const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, group = H / HK;
  const double scale = double(float(1.0 / std::sqrt(double(D))));  // as run_attention passes it
  const double f16_u = std::ldexp(1.0, -11), f16_sub = std::ldexp(1.0, -25), ln2 = std::log(2.0);
  auto gamma = [](double n, double w) { return n * w / (1.0 - n * w); };
  const double score_rel = f16_u + 3.0 * kU + gamma(double(2 * D + 16), 2.0 * kU);
  std::vector<double> kf(d.k.size()), vf(d.v.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    kf[i] = double(quant::fp16_to_float(d.k[i]));
    vf[i] = double(quant::fp16_to_float(d.v[i]));
  }
  AttnExpect x;
  x.want.resize(size_t(c.n_tok * H * D));
  x.tol.resize(x.want.size());
  for (int64_t t = 0; t < c.n_tok; ++t) {
    const int64_t pos = c.pos0 + t, lo = first_row(c, pos), n_att = pos - lo + 1;
    const double tiles = decode ? double(n_att / 16 + 4) : double((n_att + 128) / 32 + 2);
    const double depth =
        2.0 * double(n_att + 192) + 4.0 * tiles + (decode ? double(cuda::kMaxAttentionSplits + 8) : 0.0);
    const double acc = 2.0 * gamma(depth, 2.0 * kU) + kU;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      const float* q = d.q.data() + (t * H + h) * D;
      std::vector<double> p(static_cast<size_t>(n_att));
      double m = -INFINITY, s_abs = 0, e_max = 0;
      for (int64_t j = lo; j <= pos; ++j) {
        const double* kr = kf.data() + (j * HK + hk) * D;
        double dot = 0, mag = 0, ksum = 0;
        for (int64_t e = 0; e < D; ++e) {
          dot += double(q[e]) * kr[e];
          mag += std::fabs(double(q[e]) * kr[e]);
          ksum += std::fabs(kr[e]);
        }
        const double sj = scale * dot;
        p[size_t(j - lo)] = sj;
        m = std::max(m, sj);
        s_abs = std::max(s_abs, std::fabs(sj));
        e_max = std::max(e_max, scale * mag * score_rel + ln2 * f16_sub * ksum);
      }
      const double delta = e_max + (decode ? 8.0 : 4.0) * kU * s_abs + 5.0 * kU * (tiles + 1.0);
      double l = 0;
      for (double& pj : p) {
        pj = std::exp(pj - m);
        l += pj;
      }
      for (int64_t e = 0; e < D; ++e) {
        double num = 0, wv = 0, rounding = 0;
        for (int64_t j = lo; j <= pos; ++j) {
          const double pj = p[size_t(j - lo)], vv = vf[size_t((j * HK + hk) * D + e)];
          num += pj * vv;
          wv += pj * std::fabs(vv);
          rounding += std::max(f16_u * pj, f16_sub) * std::fabs(vv);
        }
        const size_t i = size_t((t * H + h) * D + e);
        x.want[i] = num / l;
        x.tol[i] = 1.01 * ((std::expm1(2.0 * delta) + std::exp(2.0 * delta) * acc) * wv / l +
                           std::exp(4.0 * delta) * rounding / l) +
                   1e-30;
      }
    }
  }
  return x;
}

// A tensor-core op (attention_prefill_mma or attention_decode_mma) on random data against the exact result, within
// mma_expect's bound, element by element.
void expect_mma_within_bound(AttnOp op, const std::vector<AttnCase>& cases, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(seed);
  for (const AttnCase& c : cases) {
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> got = run_attention(c, d, ws, stream, op);
    const AttnExpect x = mma_expect(c, d, op);
    ASSERT_EQ(got.size(), x.want.size()) << op_name(op) << " " << describe(c);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(double(got[i]) - x.want[i]) <= x.tol[i]) && bad++ < 5) {
        const int64_t D = c.shape.head_dim, H = c.shape.n_head;
        ADD_FAILURE() << op_name(op) << " " << describe(c) << " token " << int64_t(i) / (H * D) << " head "
                      << int64_t(i) / D % H << " element " << int64_t(i) % D << ": got " << got[i] << ", want "
                      << x.want[i] << " (tolerance " << x.tol[i] << ")";
      }
    }
  }
}

// Both warp shapes on every case (the automatic choice depends on the GPU's SM count: 16-row warps for the small
// grids of these cases on an H200), head_dim 256 only with 16.
TEST(CudaOps, AttentionPrefillMmaMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_mma_within_bound(AttnOp::kPrefillMma16, prefill_mma_cases(), kSeed + 9);
  std::vector<AttnCase> cases;
  for (const AttnCase& c : prefill_mma_cases()) {
    if (c.shape.head_dim <= 128) cases.push_back(c);
  }
  expect_mma_within_bound(AttnOp::kPrefillMma32, cases, kSeed + 12);
}

// Many tokens in one call (CTAs of up to 128 tokens, tiles starting at the window of the CTA's first token) against
// the same tokens one call each (n_tok = 1: tiles start at the token's own window): different tile boundaries,
// rescale sequences and summation orders, so not bit-identical; both are within the bound of the exact result, so
// they are within twice the bound of each other. Cases: a group-8 tile over a 1000-row history, two CTAs of group 1,
// a window inside a 200-token batch, head_dim 256.
TEST(CudaOps, AttentionPrefillMmaTileMatchesSingleTokens) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::AttentionWorkspace ws;
  Rng rng(kSeed + 10);
  const AttnCase cases[] = {
      {{16, 2, 128}, 64, 1000, 0}, {{2, 2, 128}, 200, 0, 0}, {{8, 2, 64}, 200, 1000, 100}, {{8, 2, 256}, 70, 0, 0}};
  for (const AttnCase& c : cases) {
    const int64_t H = c.shape.n_head, D = c.shape.head_dim;
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    const std::vector<float> batched = run_attention(c, d, ws, stream, AttnOp::kPrefillMma);
    ASSERT_EQ(batched.size(), size_t(c.n_tok * H * D)) << describe(c);
    const AttnExpect x = mma_expect(c, d);
    int bad = 0;
    for (int64_t t = 0; t < c.n_tok; ++t) {
      const AttnCase one{c.shape, 1, c.pos0 + t, c.window};
      AttnData d1;
      d1.q.assign(d.q.begin() + t * H * D, d.q.begin() + (t + 1) * H * D);
      d1.k = d.k;  // rows past pos0 + t are attended by neither call's token t
      d1.v = d.v;
      const std::vector<float> single = run_attention(one, d1, ws, stream, AttnOp::kPrefillMma);
      ASSERT_EQ(single.size(), size_t(H * D)) << describe(one);
      for (int64_t i = 0; i < H * D; ++i) {
        const size_t k = size_t(t * H * D + i);
        if (!(std::fabs(double(batched[k]) - double(single[size_t(i)])) <= 2.0 * x.tol[k]) && bad++ < 5) {
          ADD_FAILURE() << describe(c) << " token " << t << " head " << i / D << " element " << i % D << ": batched "
                        << batched[k] << ", alone " << single[size_t(i)] << " (tolerance " << 2.0 * x.tol[k] << ")";
        }
      }
    }
  }
}

// An infinite V value (an F16 overflow in the cache) at one position and a NaN at another, inside the batch: a token
// that does not see the position (before it, or past it by more than the window) gets the bits it gets with 0 there,
// and one that sees it gets +inf (NaN) in that element and the same bits in every other. Before, a masked key's
// exact-zero weight times the infinity in the tensor-core product made NaN for the tokens before it in its tile.
// Cases: a group-8 tile over 236 cached rows, two CTAs of group 1, a window of 100, head_dim 256 and 64; each with
// 16-row and 32-row warps (head_dim <= 128).
TEST(CudaOps, AttentionPrefillMmaNonFiniteVReachesOnlyTheRowsThatSeeIt) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  cuda::AttentionWorkspace ws;
  Rng rng(kSeed + 13);
  const AttnCase cases[] = {{{8, 2, 128}, 64, 236, 0},
                            {{2, 2, 128}, 200, 0, 0},
                            {{8, 2, 64}, 200, 1000, 100},
                            {{8, 2, 256}, 70, 0, 0},
                            {{4, 4, 64}, 40, 3, 0}};
  constexpr int64_t kInfDim = 5, kNanDim = 9;
  for (const AttnCase& c : cases) {
    const int64_t H = c.shape.n_head, HK = c.shape.n_head_kv, D = c.shape.head_dim, G = H / HK;
    const int64_t inf_pos = c.pos0 + 21, nan_pos = c.pos0 + c.n_tok - 3;
    AttnData zero = attention_data(rng, c, AttnFill::kRandom);
    for (int64_t hk = 0; hk < HK; ++hk) {
      zero.v[size_t((inf_pos * HK + hk) * D + kInfDim)] = quant::float_to_fp16(0.0f);
      zero.v[size_t((nan_pos * HK + hk) * D + kNanDim)] = quant::float_to_fp16(0.0f);
    }
    AttnData bad = zero;
    for (int64_t hk = 0; hk < HK; ++hk) {
      bad.v[size_t((inf_pos * HK + hk) * D + kInfDim)] = 0x7c00;  // +inf
      bad.v[size_t((nan_pos * HK + hk) * D + kNanDim)] = 0x7e00;  // NaN
    }
    for (const AttnOp op : {AttnOp::kPrefillMma16, AttnOp::kPrefillMma32}) {
      if (op == AttnOp::kPrefillMma32 && D > 128) continue;
      const std::vector<float> want = run_attention(c, zero, ws, stream, op);
      const std::vector<float> got = run_attention(c, bad, ws, stream, op);
      ASSERT_EQ(got.size(), size_t(c.n_tok * H * D)) << describe(c);
      ASSERT_EQ(want.size(), got.size()) << describe(c);
      int wrong = 0;
      for (int64_t t = 0; t < c.n_tok; ++t) {
        const int64_t pos = c.pos0 + t, lo = first_row(c, pos);
        const bool sees_inf = lo <= inf_pos && inf_pos <= pos, sees_nan = lo <= nan_pos && nan_pos <= pos;
        for (int64_t i = 0; i < H * D; ++i) {
          const size_t k = size_t(t * H * D + i);
          const float x = got[k];
          bool ok = std::memcmp(&x, &want[k], sizeof x) == 0;
          if (i % D == kInfDim && sees_inf) ok = std::isinf(x) && x > 0;
          if (i % D == kNanDim && sees_nan) ok = std::isnan(x);
          if (!ok && wrong++ < 5) {
            ADD_FAILURE() << op_name(op) << " " << describe(c) << " token " << t << " head " << i / D << " (group "
                          << i / D / G << ") element " << i % D << ": got " << x << ", with 0 there " << want[k]
                          << (sees_inf ? " (sees the +inf)" : "") << (sees_nan ? " (sees the NaN)" : "");
          }
        }
      }
    }
  }
}

// A warp shape the kernel does not have is a Status naming it, before any device work (host pointers stand in).
TEST(CudaOps, AttentionPrefillMmaRejectsBadWarpRows) {
  alignas(16) static float q[16], out[16];
  alignas(16) static uint16_t kv[16];
  cuda::Stream stream;
  cuda::AttentionArgs a{.q = q, .k_cache = kv, .v_cache = kv, .out = out, .n_tok = 1, .pos0 = 0, .n_head = 1,
                        .n_head_kv = 1, .head_dim = 256, .scale = 1.0f};
  for (const int rows : {24, 32}) {  // 32: only head_dim <= 128
    a.prefill_warp_rows = rows;
    const Status s = cuda::attention_prefill_mma(a, stream);
    EXPECT_NE(s.message().find("prefill_warp_rows=" + std::to_string(rows)), std::string::npos) << s.message();
  }
}

// The exact K = 0 check above, on prefill_mma_cases() and on attention()'s cases with a supported head_dim (decode
// contexts of up to 20000 rows: many tiles, windows of 4096 that start inside a tile).
TEST(CudaOps, AttentionPrefillMmaUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  std::vector<AttnCase> cases = prefill_mma_cases();
  for (const AttnCase& c : attention_cases()) {
    if (c.shape.head_dim == 64 || c.shape.head_dim == 128 || c.shape.head_dim == 256) cases.push_back(c);
  }
  expect_uniform_scores_exact(AttnOp::kPrefillMma, cases, kSeed + 11);
}

// ---- attention_decode_mma -------------------------------------------------------------------------------------

// attention()'s cases with a kernel (head_dim 64, 128, 256; groups 1 to 16) plus decode at the shapes the model runs:
// the 30B-A3B geometry (32 heads over 4 KV heads of 128) and a group of 16 (the 235B geometry's 64 over 4), at
// contexts of 1, 15, 16, 17 rows (a warp step of 16 and its edges), 128 and 129 (two splits of one 64-row step; a last
// split of one row, its other warps idle), 3000 (splits of one or two steps, some warps idle) and 40000 (splits of many
// steps, more than the ring holds), with and without a window. Every multi-split case takes and resets the
// workspace's tickets: a ticket left behind would make the next case's combine run early or never.
std::vector<AttnCase> decode_mma_cases() {
  std::vector<AttnCase> cases;
  for (const AttnCase& c : attention_cases()) {
    if (cuda::has_attention_decode_mma(c.shape.head_dim, c.shape.n_head / c.shape.n_head_kv)) cases.push_back(c);
  }
  const AttnShape shapes[] = {{32, 4, 128}, {16, 1, 128}, {64, 4, 128}, {32, 4, 64}};
  for (const AttnShape& s : shapes) {
    for (const int64_t ctx : {1, 15, 16, 17, 128, 129, 3000, 40000}) {
      cases.push_back({s, 1, ctx - 1, 0});
      if (ctx > 1000) cases.push_back({s, 1, ctx - 1, 1000});
    }
  }
  return cases;
}

TEST(CudaOps, AttentionDecodeMmaMatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_mma_within_bound(AttnOp::kDecodeMma, decode_mma_cases(), kSeed + 12);
}

TEST(CudaOps, AttentionDecodeMmaUniformScoresExact) {
  SKIP_WITHOUT_GPU();
  expect_uniform_scores_exact(AttnOp::kDecodeMma, decode_mma_cases(), kSeed + 13);
}

TEST(CudaOps, AttentionDecodeMmaPositionFromDeviceInAGraph) {
  SKIP_WITHOUT_GPU();
  expect_graph_position_matches_host(AttnOp::kDecodeMma, {{32, 4, 128}, {16, 1, 128}, {8, 2, 64}}, kSeed + 14);
}

// attention_decode_mma with out_q8k (the output also quantized to Q8_K in the launch, for the output projection): the
// float output is bit for bit the call's without it, and the bytes are quantize_activations' of that output, for every
// decode_mma_cases() shape whose KV head's outputs are whole Q8_K blocks (attention_decode_quantizes): one split (the
// CTA writes), several (the last CTA's combine writes) and n_tok > 1 (a CTA per token). A shape with a partial block
// is refused with a Status.
TEST(CudaOps, AttentionDecodeMmaQuantizesItsOutput) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(kSeed + 16);
  int covered = 0;
  for (const AttnCase& c : decode_mma_cases()) {
    const int64_t G = c.shape.n_head / c.shape.n_head_kv, D = c.shape.head_dim, width = c.shape.n_head * D;
    const AttnData d = attention_data(rng, c, AttnFill::kRandom);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(d.q));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(d.k));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(d.v));
    const size_t out_n = size_t(c.n_tok * width), q_bytes = size_t(c.n_tok) * quant::row_size(quant::Type::Q8_K, width);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout2, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq8, cuda::DeviceBuffer::allocate(q_bytes + 4));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq8_ref, cuda::DeviceBuffer::allocate(q_bytes + 4));
    cuda::AttentionArgs args{.q = dq.as<float>(), .k_cache = dk.data(), .v_cache = dv.data(), .out = dout.as<float>(),
                             .n_tok = c.n_tok, .pos0 = c.pos0, .n_head = c.shape.n_head,
                             .n_head_kv = c.shape.n_head_kv, .head_dim = D, .window = c.window,
                             .scale = float(1.0 / std::sqrt(double(D)))};
    ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
    args.out = dout2.as<float>();
    args.out_q8k = dq8.data();
    if (!cuda::attention_decode_quantizes(D, G)) {
      const Status st = cuda::attention_decode_mma(args, ws, stream);
      EXPECT_FALSE(st.ok()) << describe(c);
      EXPECT_NE(st.message().find("out_q8k"), std::string::npos) << st.message();
      continue;
    }
    ++covered;
    ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
    ASSERT_OK(cuda::quantize_activations(quant::Type::Q8_K, dout2.as<float>(), dq8_ref.data(), width, c.n_tok,
                                         stream));
    stream.synchronize();
    const std::vector<float> plain = from_device<float>(dout, out_n), with_q = from_device<float>(dout2, out_n);
    ASSERT_EQ(0, std::memcmp(plain.data(), with_q.data(), out_n * sizeof(float))) << describe(c) << ": output";
    const std::vector<uint8_t> got = from_device<uint8_t>(dq8, q_bytes), want = from_device<uint8_t>(dq8_ref, q_bytes);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), q_bytes)) << describe(c) << ": quantized bytes";
  }
  EXPECT_GT(covered, 20);
}

// attention_decode_mma with prepare (qkv_prepare's work for the token inside the launch, the rotation from rope_table's
// host values) against qkv_prepare followed by attention_decode_mma over the prepared q: the outputs and both caches
// (every row: the token's row written, the others untouched) bit for bit, the raw q unchanged; F16 and Q8_0 caches,
// the position from the host and from the device (a graph's), head_dim 64/128/256, groups 2 to 16, one split (the CTA
// that writes the row is the only one) and several (the last split's CTA writes it, the others must not need it), a
// sliding window. The rows past the token's hold NaN (F16 NaN, Q8_0 blocks of NaN scale): a kernel that read one would
// poison the output.
TEST(CudaOps, AttentionDecodeMmaPrepareEqualsQkvPrepare) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  Rng rng(kSeed + 17);
  const AttnShape shapes[] = {{32, 4, 128}, {16, 1, 128}, {8, 2, 64}, {4, 2, 256}, {64, 4, 128}};
  struct Ctx {
    int64_t rows, window;
  };
  for (const AttnShape& sh : shapes) {
    // A shape this GPU has no kernel for (head_dim 256 where a CTA has under ~144 KB: CudaSmallSmem) is left out.
    if (!cuda::has_attention_decode_mma(sh.head_dim, sh.n_head / sh.n_head_kv)) continue;
    // Q8_0 at head_dim 128 takes a wide kernel at every length (12 warps, or 8 for groups over 8 query heads:
    // cuda::attention_decode_variant), F16 the 8-warp one up to 4K rows.
    for (const Ctx ctx :
         {Ctx{1, 0}, Ctx{17, 0}, Ctx{65, 0}, Ctx{600, 0}, Ctx{5000, 0}, Ctx{3000, 700}, Ctx{25000, 0}}) {
      for (const quant::Type kv_type : {quant::Type::F16, quant::Type::Q8_0, quant::Type::F8_E4M3}) {
        for (const bool device_pos : {false, true}) {
          const int64_t HK = sh.n_head_kv, D = sh.head_dim, kv = HK * D, pos0 = ctx.rows - 1, n_rows = ctx.rows + 3;
          // The cache: rows before pos0 random (Q8_0: the reference quantizer's blocks), the rest NaN.
          std::vector<uint8_t> cache[2];
          for (std::vector<uint8_t>& c : cache)
            c = kv_cache(gaussian(rng, size_t(pos0 * kv)), pos0, n_rows, kv, kv_type);
          const std::vector<float> q = gaussian(rng, size_t(sh.n_head * D), 2.0f);
          const std::vector<float> k = gaussian(rng, size_t(kv), 2.0f), v = gaussian(rng, size_t(kv), 3.0f);
          const std::vector<float> qw = gaussian(rng, size_t(D)), kw = gaussian(rng, size_t(D));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer q_prepared, to_device(q));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer q_raw, to_device(q));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer k_normed, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(k));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dqw, to_device(qw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dkw, to_device(kw));
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>{int32_t(pos0)}));
          std::vector<float> rope(static_cast<size_t>(D));
          cuda::rope_table(int32_t(pos0), D, 1e6f, rope.data());
          ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer drope, to_device(rope));
          cuda::DeviceBuffer kc[2], vc[2], out[2];
          for (int i = 0; i < 2; ++i) {
            ASSERT_OK_AND_ASSIGN(kc[i], to_device(cache[0]));
            ASSERT_OK_AND_ASSIGN(vc[i], to_device(cache[1]));
            ASSERT_OK_AND_ASSIGN(out[i], cuda::DeviceBuffer::allocate(q.size() * sizeof(float)));
          }
          ASSERT_OK(cuda::qkv_prepare({.q = q_prepared.as<float>(), .q_weight = dqw.as<float>(),
                                       .k = k_normed.as<float>(), .k_weight = dkw.as<float>(), .v = dv.as<float>(),
                                       .k_cache = kc[0].data(), .v_cache = vc[0].data(),
                                       .positions = dpos.as<int32_t>(), .n_tok = 1, .n_head = sh.n_head,
                                       .n_head_kv = HK, .head_dim = D, .eps = 1e-6f, .theta = 1e6f, .row0 = pos0,
                                       .kv_type = kv_type},
                                      stream));
          cuda::AttentionArgs args{.q = q_prepared.as<float>(),
                                   .k_cache = kc[0].data(),
                                   .v_cache = vc[0].data(),
                                   .out = out[0].as<float>(),
                                   .n_tok = 1,
                                   .pos0 = device_pos ? 777 : pos0,
                                   .n_head = sh.n_head,
                                   .n_head_kv = HK,
                                   .head_dim = D,
                                   .window = ctx.window,
                                   .scale = float(1.0 / std::sqrt(double(D))),
                                   .pos0_device = device_pos ? dpos.as<int32_t>() : nullptr,
                                   .max_rows = device_pos ? n_rows : 0,
                                   .kv_type = kv_type};
          ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
          args.q = q_raw.as<float>();
          args.k_cache = kc[1].data();
          args.v_cache = vc[1].data();
          args.out = out[1].as<float>();
          args.prepare = {.q_weight = dqw.as<float>(), .k = dk.as<float>(), .k_weight = dkw.as<float>(),
                          .v = dv.as<float>(), .rope = drope.as<float>(), .eps = 1e-6f};
          ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
          stream.synchronize();
          const std::string what = "n_head " + std::to_string(sh.n_head) + "/" + std::to_string(HK) + " head_dim " +
                                   std::to_string(D) + " rows " + std::to_string(ctx.rows) + " window " +
                                   std::to_string(ctx.window) + " " + std::string(quant::type_name(kv_type)) +
                                   (device_pos ? " position on the device" : "");
          const std::vector<float> want = from_device<float>(out[0], q.size());
          const std::vector<float> got = from_device<float>(out[1], q.size());
          for (size_t i = 0; i < want.size(); ++i) ASSERT_FALSE(std::isnan(want[i])) << what << " element " << i;
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what << ": output";
          const size_t bytes = cache[0].size();
          ASSERT_EQ(from_device<uint8_t>(kc[0], bytes), from_device<uint8_t>(kc[1], bytes)) << what << ": K cache";
          ASSERT_EQ(from_device<uint8_t>(vc[0], bytes), from_device<uint8_t>(vc[1], bytes)) << what << ": V cache";
          ASSERT_EQ(from_device<float>(q_raw, q.size()), q) << what << ": q changed";
        }
      }
    }
  }
}

// The outputs of the two sides of a comparison (out[0]: the reference launches) bit for bit, `floats` of them, and
// their Q8_K bytes (q8_bytes, 0: none); every reference output is a number.
void expect_same_outputs(const cuda::DeviceBuffer (&out)[2], const cuda::DeviceBuffer (&q8)[2], size_t floats,
                         size_t q8_bytes, const std::string& what) {
  const std::vector<float> want = from_device<float>(out[0], floats), got = from_device<float>(out[1], floats);
  const auto nan = std::find_if(want.begin(), want.end(), [](float x) { return std::isnan(x); });
  EXPECT_EQ(nan, want.end()) << what << ": element " << (nan - want.begin()) << " is NaN";
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), floats * sizeof(float))) << what << ": output";
  if (q8_bytes > 0) {
    EXPECT_EQ(from_device<uint8_t>(q8[0], q8_bytes), from_device<uint8_t>(q8[1], q8_bytes)) << what << ": Q8_K";
  }
}

// attention_decode_mma over several sequences in one launch (AttentionArgs::seq_k, a batched decode step) against one
// launch per sequence with the same arguments: every output, its Q8_K bytes and both caches of every sequence bit for
// bit (each sequence gets its own plan, the same as alone). Sequences of different lengths in one call (one split and
// many; a split count above the one-wave target of the others), F16, Q8_0 and FP8 caches, head_dim 64/128/256, a
// sliding window, 2 to 8 sequences, the positions on the device with a grid sized for the longest cache; Q8_0 at
// head_dim 128 also past 24K rows (a wide kernel throughout). A batch whose lengths take two kernels
// (attention_decode_variant: F16 at head_dim 128 up to 4K rows on 8 warps, 4 beyond; Q8_0 at head_dim 128 on 12 or 8 at
// every length) goes out as a launch per kernel over its tokens' rows (seq_tok, not contiguous). Rows past each token's
// hold NaN, as above.
TEST(CudaOps, AttentionDecodeMmaSequencesEqualOneLaunchEach) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256, cuda::kMaxDecodeSeqs));
  Rng rng(kSeed + 18);
  const AttnShape shapes[] = {{32, 4, 128}, {16, 1, 128}, {8, 2, 64}, {4, 2, 256}};
  struct Batch {
    std::vector<int64_t> rows;  // each sequence's rows with the token's (its position + 1)
    int64_t window;
  };
  const Batch batches[] = {{{600, 1}, 0},
                           {{65, 5000, 17, 600}, 0},
                           {{1, 2, 63, 64, 65, 600, 2000, 9000}, 0},
                           {{3000, 700, 5000}, 700}};
  const Batch wide = {{25000, 30000, 24577}, 0};  // Q8_0, head_dim 128: the wide kernel for all three
  for (const AttnShape& sh : shapes) {
    if (!cuda::has_attention_decode_mma(sh.head_dim, sh.n_head / sh.n_head_kv)) continue;  // as above
    for (const quant::Type kv_type : {quant::Type::F16, quant::Type::Q8_0, quant::Type::F8_E4M3}) {
      std::vector<Batch> todo(std::begin(batches), std::end(batches));
      if (kv_type != quant::Type::F16 && sh.head_dim == 128 && sh.n_head_kv == 4) todo.push_back(wide);
      for (const Batch& b : todo) {
        const int64_t n = int64_t(b.rows.size()), HK = sh.n_head_kv, D = sh.head_dim, kv = HK * D;
        const int64_t width = sh.n_head * D, G = sh.n_head / HK;
        const bool quantizes = cuda::attention_decode_quantizes(D, G);
        const size_t q8_row = quant::row_size(quant::Type::Q8_K, width);
        const std::string what = "n_head " + std::to_string(sh.n_head) + "/" + std::to_string(HK) + " head_dim " +
                                 std::to_string(D) + " " + std::string(quant::type_name(kv_type)) + " window " +
                                 std::to_string(b.window) + " first rows " + std::to_string(b.rows[0]) + " of " +
                                 std::to_string(n) + " sequences";
        // Per sequence: caches of rows + 3 (random before the token's row, NaN from it), a copy for each side.
        int64_t max_rows = 0;
        std::vector<int32_t> positions;
        std::vector<float> rope;
        std::vector<cuda::DeviceBuffer> caches[2][2];  // [side][K, V]
        std::vector<std::vector<uint8_t>> host_caches;
        for (const int64_t rows : b.rows) {
          const int64_t pos0 = rows - 1, n_rows = rows + 3;
          max_rows = std::max(max_rows, n_rows);
          positions.push_back(int32_t(pos0));
          std::vector<float> table(static_cast<size_t>(D));
          cuda::rope_table(int32_t(pos0), D, 1e6f, table.data());
          rope.insert(rope.end(), table.begin(), table.end());
          for (int m = 0; m < 2; ++m) {
            std::vector<uint8_t> c = kv_cache(gaussian(rng, size_t(pos0 * kv)), pos0, n_rows, kv, kv_type);
            for (int side = 0; side < 2; ++side) {
              ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dc, to_device(c));
              caches[side][m].push_back(std::move(dc));
            }
            host_caches.push_back(std::move(c));
          }
        }
        const std::vector<float> q = gaussian(rng, size_t(n * width), 2.0f);
        const std::vector<float> k = gaussian(rng, size_t(n * kv), 2.0f), v = gaussian(rng, size_t(n * kv), 3.0f);
        const std::vector<float> qw = gaussian(rng, size_t(D)), kw = gaussian(rng, size_t(D));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(q));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(k));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dqw, to_device(qw));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dkw, to_device(kw));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(positions));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer drope, to_device(rope));
        cuda::DeviceBuffer out[2], q8[2];
        for (int side = 0; side < 2; ++side) {
          ASSERT_OK_AND_ASSIGN(out[side], cuda::DeviceBuffer::allocate(q.size() * sizeof(float)));
          ASSERT_OK_AND_ASSIGN(q8[side], cuda::DeviceBuffer::allocate(size_t(n) * q8_row + 4));
        }
        cuda::AttentionArgs args{.q = dq.as<float>(),
                                 .out = out[0].as<float>(),
                                 .n_tok = 1,
                                 .n_head = sh.n_head,
                                 .n_head_kv = HK,
                                 .head_dim = D,
                                 .window = b.window,
                                 .scale = float(1.0 / std::sqrt(double(D))),
                                 .max_rows = max_rows,
                                 .kv_type = kv_type};
        args.prepare = {.q_weight = dqw.as<float>(), .k_weight = dkw.as<float>(), .eps = 1e-6f};
        for (int64_t s = 0; s < n; ++s) {  // one launch each
          cuda::AttentionArgs one = args;
          one.q = dq.as<float>() + s * width;
          one.k_cache = caches[0][0][size_t(s)].data();
          one.v_cache = caches[0][1][size_t(s)].data();
          one.out = out[0].as<float>() + s * width;
          one.pos0 = positions[size_t(s)];
          one.pos0_device = dpos.as<int32_t>() + s;
          one.out_q8k = quantizes ? q8[0].as<uint8_t>() + size_t(s) * q8_row : nullptr;
          one.prepare.k = dk.as<float>() + s * kv;
          one.prepare.v = dv.as<float>() + s * kv;
          one.prepare.rope = drope.as<float>() + s * D;
          ASSERT_OK(cuda::attention_decode_mma(one, ws, stream));
        }
        // One launch per kernel the sequences take at their lengths (the call's precondition), each over its tokens'
        // rows (seq_tok: not contiguous where a batch's lengths straddle a variant's bound).
        std::map<int, std::vector<int32_t>> by_variant;
        for (int64_t s = 0; s < n; ++s) {
          by_variant[cuda::attention_decode_variant(D, kv_type, b.rows[size_t(s)])].push_back(int32_t(s));
        }
        for (const auto& [variant, toks] : by_variant) {
          std::vector<const void*> seq_k, seq_v;
          for (const int32_t s : toks) {
            seq_k.push_back(caches[1][0][size_t(s)].data());
            seq_v.push_back(caches[1][1][size_t(s)].data());
          }
          cuda::AttentionArgs some = args;
          some.n_tok = int64_t(toks.size());
          some.pos0 = positions[size_t(toks[0])];
          some.pos0_device = dpos.as<int32_t>();
          some.out = out[1].as<float>();
          some.out_q8k = quantizes ? q8[1].data() : nullptr;
          some.prepare.k = dk.as<float>();
          some.prepare.v = dv.as<float>();
          some.prepare.rope = drope.as<float>();
          some.seq_k = seq_k.data();
          some.seq_v = seq_v.data();
          some.seq_tok = toks.data();
          const Status launched = cuda::attention_decode_mma(some, ws, stream);
          ASSERT_TRUE(launched.ok()) << what << ": variant " << variant << ": " << launched.message();
        }
        stream.synchronize();
        expect_same_outputs(out, q8, q.size(), quantizes ? size_t(n) * q8_row : 0, what);
        for (int64_t s = 0; s < n; ++s) {
          for (int m = 0; m < 2; ++m) {
            const size_t bytes = host_caches[size_t(2 * s + m)].size();
            ASSERT_EQ(from_device<uint8_t>(caches[0][m][size_t(s)], bytes),
                      from_device<uint8_t>(caches[1][m][size_t(s)], bytes))
                << what << ": sequence " << s << (m == 0 ? " K" : " V") << " cache";
          }
        }
      }
    }
  }
}

// A few tokens of one sequence (speculative decoding's drafts: AttentionArgs::fresh_row, every token's row stored
// before the call) in attention_decode_mma launches of several tokens, one per kernel the tokens take at their lengths
// as the model makes them, against one launch per token: every output and its Q8_K bytes bit for bit. Groups of 8 take
// the tokens in position pairs (one CTA reads the rows once for an even position and the next), so the first
// position is odd and even, 2 to 8 tokens, around split-length and split-count changes of the plan (the rows of a
// pair must share it), across the 4K-row change of kernel, F16, FP8 and Q8_0 (one CTA per token) caches, head_dim
// 128 and 64, and a group of 4 (no pairs). Rows past the last token hold NaN.
TEST(CudaOps, AttentionDecodeMmaDraftsEqualOneLaunchEach) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256, cuda::kMaxDecodeSeqs));
  Rng rng(kSeed + 23);
  const AttnShape shapes[] = {{32, 4, 128}, {16, 2, 64}, {16, 4, 128}};
  const int64_t firsts[] = {0, 1, 62, 63, 600, 2111, 2112, 4093, 4094, 8447, 8448, 16383, 33000};
  const int64_t counts[] = {2, 3, 7, 8};
  for (const AttnShape& sh : shapes) {
    if (!cuda::has_attention_decode_mma(sh.head_dim, sh.n_head / sh.n_head_kv)) continue;
    for (const quant::Type kv_type : {quant::Type::F16, quant::Type::F8_E4M3, quant::Type::Q8_0}) {
      for (size_t c = 0; c < std::size(firsts); ++c) {
        const int64_t pos0 = firsts[c], n = counts[c % std::size(counts)];
        const int64_t HK = sh.n_head_kv, D = sh.head_dim, kv = HK * D, width = sh.n_head * D;
        const bool quantizes = cuda::attention_decode_quantizes(D, sh.n_head / HK);
        const size_t q8_row = quant::row_size(quant::Type::Q8_K, width);
        const std::string what = "n_head " + std::to_string(sh.n_head) + "/" + std::to_string(HK) + " head_dim " +
                                 std::to_string(D) + " " + std::string(quant::type_name(kv_type)) + " first position " +
                                 std::to_string(pos0) + ", " + std::to_string(n) + " tokens";
        const int64_t n_rows = pos0 + n + 3;
        const std::vector<uint8_t> host[2] = {
            kv_cache(gaussian(rng, size_t((pos0 + n) * kv)), pos0 + n, n_rows, kv, kv_type),
            kv_cache(gaussian(rng, size_t((pos0 + n) * kv)), pos0 + n, n_rows, kv, kv_type)};
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer kc, to_device(host[0]));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer vc, to_device(host[1]));
        std::vector<int32_t> positions;
        for (int64_t z = 0; z < n; ++z) positions.push_back(int32_t(pos0 + z));
        const std::vector<float> q = gaussian(rng, size_t(n * width), 2.0f);
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(q));
        ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(positions));
        cuda::DeviceBuffer out[2], q8[2];
        for (int side = 0; side < 2; ++side) {
          ASSERT_OK_AND_ASSIGN(out[side], cuda::DeviceBuffer::allocate(q.size() * sizeof(float)));
          ASSERT_OK_AND_ASSIGN(q8[side], cuda::DeviceBuffer::allocate(size_t(n) * q8_row + 4));
        }
        const cuda::AttentionArgs args{.q = dq.as<float>(),
                                       .k_cache = kc.data(),
                                       .v_cache = vc.data(),
                                       .n_tok = 1,
                                       .n_head = sh.n_head,
                                       .n_head_kv = HK,
                                       .head_dim = D,
                                       .scale = float(1.0 / std::sqrt(double(D))),
                                       .max_rows = n_rows,
                                       .kv_type = kv_type};
        for (int64_t z = 0; z < n; ++z) {  // one launch each
          cuda::AttentionArgs one = args;
          one.q = dq.as<float>() + z * width;
          one.out = out[0].as<float>() + z * width;
          one.pos0 = pos0 + z;
          one.pos0_device = dpos.as<int32_t>() + z;
          one.out_q8k = quantizes ? q8[0].as<uint8_t>() + size_t(z) * q8_row : nullptr;
          ASSERT_OK(cuda::attention_decode_mma(one, ws, stream));
        }
        for (int64_t first = 0; first < n;) {  // as Qwen3Cuda::attention: a launch per kernel
          const int variant = cuda::attention_decode_variant(D, kv_type, pos0 + first + 1);
          std::vector<const void*> seq_k, seq_v;
          std::vector<int32_t> toks;
          while (first + int64_t(toks.size()) < n &&
                 cuda::attention_decode_variant(D, kv_type, pos0 + first + int64_t(toks.size()) + 1) == variant) {
            seq_k.push_back(kc.data());
            seq_v.push_back(vc.data());
            toks.push_back(int32_t(first + int64_t(toks.size())));
          }
          cuda::AttentionArgs some = args;
          some.n_tok = int64_t(toks.size());
          some.pos0 = pos0 + first;
          some.pos0_device = dpos.as<int32_t>();
          some.out = out[1].as<float>();
          some.out_q8k = quantizes ? q8[1].data() : nullptr;
          some.seq_k = seq_k.data();
          some.seq_v = seq_v.data();
          some.seq_tok = toks.data();
          some.fresh_row = dpos.as<int32_t>();  // the first draft's row
          const Status launched = cuda::attention_decode_mma(some, ws, stream);
          ASSERT_TRUE(launched.ok()) << what << ": " << launched.message();
          first += int64_t(toks.size());
        }
        stream.synchronize();
        expect_same_outputs(out, q8, q.size(), quantizes ? size_t(n) * q8_row : 0, what);
      }
    }
  }
}

// Several sequences in one attention_decode_mma launch are refused with a Status without their positions on the
// device, with more than kMaxDecodeSeqs, with a null cache, on a workspace made for fewer, with token rows repeated,
// out of range or past the workspace's sequences, and by attention().
TEST(CudaOps, AttentionDecodeMmaSequencesRejectBadArguments) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws1, cuda::AttentionWorkspace::create(8, 64));
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(8, 64, 4));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(64 << 20));
  float* f = buf.as<float>();
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>(16, 4000)));
  const void* caches[16];
  for (int i = 0; i < 16; ++i) caches[i] = f + (1 << 20) + i * (1 << 18);  // 4,096 rows of 2 x 64 F16 each
  const cuda::AttentionArgs args{.q = f, .out = f + 4096, .n_tok = 3, .pos0 = 4000, .n_head = 8, .n_head_kv = 2,
                                 .head_dim = 64, .pos0_device = dpos.as<int32_t>(), .max_rows = 4096,
                                 .seq_k = caches, .seq_v = caches + 8};
  ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
  auto refused = [&](const cuda::AttentionArgs& a, cuda::AttentionWorkspace& w, const char* word) {
    const Status st = cuda::attention_decode_mma(a, w, stream);
    EXPECT_FALSE(st.ok()) << word;
    EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  };
  cuda::AttentionArgs bad = args;
  bad.pos0_device = nullptr;
  refused(bad, ws, "pos0_device");
  bad = args;
  bad.n_tok = cuda::kMaxDecodeSeqs + 1;
  refused(bad, ws, "at most");
  bad = args;
  const void* with_null[3] = {caches[0], nullptr, caches[2]};
  bad.seq_k = with_null;
  refused(bad, ws, "sequence 1");
  bad = args;
  bad.seq_v = nullptr;
  refused(bad, ws, "seq_v");
  refused(args, ws1, "workspace");
  bad = args;
  bad.n_tok = 5;
  refused(bad, ws, "workspace");
  // Token rows (seq_tok): each once, within kMaxDecodeSeqs, within the workspace's sequences.
  bad = args;
  const int32_t repeated[3] = {0, 2, 0}, outside[3] = {0, 1, int32_t(cuda::kMaxDecodeSeqs)}, past[3] = {2, 0, 4};
  const int32_t fine[3] = {3, 0, 2};
  bad.seq_tok = repeated;
  refused(bad, ws, "seq_tok");
  bad.seq_tok = outside;
  refused(bad, ws, "seq_tok");
  bad.seq_tok = past;
  refused(bad, ws, "workspace");
  bad.seq_tok = fine;
  ASSERT_OK(cuda::attention_decode_mma(bad, ws, stream));
  const Status st = cuda::attention(args, ws, stream);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("seq_k"), std::string::npos) << st.message();
  EXPECT_FALSE(cuda::AttentionWorkspace::create(8, 64, cuda::kMaxDecodeSeqs + 1).ok());
  stream.synchronize();
}

// attention_decode_mma's prepare is refused with a Status for more than one token and for a missing vector, and by
// the other attention ops.
TEST(CudaOps, AttentionDecodeMmaPrepareRejectsBadArguments) {
  SKIP_WITHOUT_GPU();
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(1 << 20));
  float* f = buf.as<float>();
  cuda::AttentionArgs args{.q = f, .k_cache = f + 4096, .v_cache = f + 8192, .out = f + 12288, .n_tok = 1,
                           .pos0 = 3, .n_head = 8, .n_head_kv = 2, .head_dim = 64};
  args.prepare = {.q_weight = f, .k = f, .k_weight = f, .v = f, .rope = f};
  auto refused = [&](const cuda::AttentionArgs& a, const Status& st) {
    EXPECT_FALSE(st.ok()) << "n_tok " << a.n_tok;
    EXPECT_NE(st.message().find("prepare"), std::string::npos) << st.message();
  };
  cuda::AttentionArgs bad = args;
  bad.n_tok = 2;
  refused(bad, cuda::attention_decode_mma(bad, ws, stream));
  bad = args;
  bad.prepare.v = nullptr;
  refused(bad, cuda::attention_decode_mma(bad, ws, stream));
  bad = args;
  bad.prepare.rope = nullptr;
  refused(bad, cuda::attention_decode_mma(bad, ws, stream));
  refused(args, cuda::attention(args, ws, stream));
  refused(args, cuda::attention_prefill_mma(args, stream));
  stream.synchronize();
}

// attention_decode_mma over a Q8_0 cache: within mma_expect's bound of the exact attention over the values the kernel
// is specified to compute with, each element f16(d * q) (kv_to_f16's, computed here on the host), for
// decode_mma_cases() (contexts of 1 to 40000 rows, windows, groups 1 to 16, head_dim 64/128/256; cache rows 16-byte
// aligned or not, so staging windows with and without skew) and one KV head of 128 under 8 query heads (rows not
// 16-byte aligned on the 12-warp kernel); and, for decode, the position read from device memory (as
// a graph reads it) gives the host position's output bit for bit. Gaussian K/V quantized by the reference quantizer;
// the rows past the last position are blocks with a NaN scale (NaN when dequantized: a kernel that read them would
// show it). Not compared bit for bit with the F16 kernel: at head_dim 128 the Q8_0 kernel runs 12 warps per CTA
// (another merge order).
// The same over an FP8 E4M3 cache (quant::Type::F8_E4M3): Gaussian K/V as quant::float_to_fp8_e4m3 rounds them, the
// values the kernel computes with those of quant::fp8_e4m3_to_float (exact in f16), the rows past the last position
// the NaN code 0x7f.
void expect_decode_over_cache(quant::Type kv_type, uint64_t seed) {
  ASSERT_OK_AND_ASSIGN(cuda::Stream stream, cuda::Stream::create());
  ASSERT_OK_AND_ASSIGN(cuda::AttentionWorkspace ws, cuda::AttentionWorkspace::create(64, 256));
  const bool f8 = kv_type == quant::Type::F8_E4M3;
  Rng rng(seed);
  // Also 8 query heads over one KV head of 128: cache rows of 136 bytes, not a multiple of 16 apart, so the 12-warp
  // kernel stages them with their skews instead of its lean steps' copies.
  std::vector<AttnCase> cases = decode_mma_cases();
  for (const int64_t ctx : {600, 5000, 40000}) cases.push_back({{8, 1, 128}, 1, ctx - 1, 0});
  cases.push_back({{8, 1, 128}, 1, 39999, 1000});
  for (const AttnCase& c : cases) {
    const int64_t HK = c.shape.n_head_kv, D = c.shape.head_dim, kv = HK * D;
    const int64_t rows = n_rows_of(c), valid = c.pos0 + c.n_tok;
    AttnData d;  // q and the F16 values of the caches' elements (Q8_0: f16(d * q))
    d.q = gaussian(rng, size_t(c.n_tok * c.shape.n_head * D));
    std::vector<uint8_t> k8, v8;
    for (auto [c8, c16] : {std::pair{&k8, &d.k}, std::pair{&v8, &d.v}}) {
      std::vector<float> x = gaussian(rng, size_t(valid * kv)), deq(size_t(rows * kv));
      if (f8) {
        c8->assign(size_t(rows * kv), 0x7f);
        for (size_t i = 0; i < x.size(); ++i) (*c8)[i] = quant::float_to_fp8_e4m3(x[i]);
        for (size_t i = 0; i < deq.size(); ++i) deq[i] = quant::fp8_e4m3_to_float((*c8)[i]);
      } else {
        *c8 = q8_cache(x, valid, rows, kv);
        quant::traits(quant::Type::Q8_0).to_float(c8->data(), deq.data(), rows * kv);
      }
      c16->resize(deq.size());
      for (size_t i = 0; i < deq.size(); ++i) (*c16)[i] = quant::float_to_fp16(deq[i]);
    }
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dq, to_device(d.q));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dk, to_device(k8));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dv, to_device(v8));
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dpos, to_device(std::vector<int32_t>{int32_t(c.pos0)}));
    const size_t out_n = size_t(c.n_tok * c.shape.n_head * D);
    ASSERT_OK_AND_ASSIGN(cuda::DeviceBuffer dout, cuda::DeviceBuffer::allocate(out_n * sizeof(float)));
    std::vector<float> got[2];  // position from the host, from the device
    // The host's stand-in position for the device's: wrong, but of the same kernel (attention_decode_variant), whose
    // merge order the two calls then share.
    const int64_t stand_in = c.pos0 > 777 ? c.pos0 - 777 : 777;
    ASSERT_EQ(cuda::attention_decode_variant(D, kv_type, stand_in + c.n_tok),
              cuda::attention_decode_variant(D, kv_type, c.pos0 + c.n_tok));
    for (const bool device_pos : {false, true}) {
      if (device_pos && c.n_tok != 1) continue;
      ASSERT_OK(dout.upload(std::vector<float>(out_n, NAN).data(), out_n * sizeof(float)));
      const cuda::AttentionArgs args{.q = dq.as<float>(),
                                     .k_cache = dk.data(),
                                     .v_cache = dv.data(),
                                     .out = dout.as<float>(),
                                     .n_tok = c.n_tok,
                                     .pos0 = device_pos ? stand_in : c.pos0,
                                     .n_head = c.shape.n_head,
                                     .n_head_kv = HK,
                                     .head_dim = D,
                                     .window = c.window,
                                     .scale = float(1.0 / std::sqrt(double(D))),
                                     .pos0_device = device_pos ? dpos.as<int32_t>() : nullptr,
                                     .max_rows = device_pos ? rows : 0,
                                     .kv_type = kv_type};
      ASSERT_OK(cuda::attention_decode_mma(args, ws, stream));
      stream.synchronize();
      got[device_pos] = from_device<float>(dout, out_n);
    }
    const AttnExpect x = mma_expect(c, d, AttnOp::kDecodeMma);
    int bad = 0;
    for (size_t i = 0; i < out_n; ++i) {
      if (!(std::fabs(double(got[0][i]) - x.want[i]) <= x.tol[i]) && bad++ < 5) {
        ADD_FAILURE() << describe(c) << " element " << i << ": got " << got[0][i] << ", want " << x.want[i]
                      << " (tolerance " << x.tol[i] << ")";
      }
    }
    if (c.n_tok == 1) {
      ASSERT_EQ(0, std::memcmp(got[0].data(), got[1].data(), out_n * sizeof(float)))
          << describe(c) << ": the position from the device differs";
    }
  }
}

TEST(CudaOps, AttentionDecodeMmaQ8MatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_decode_over_cache(quant::Type::Q8_0, kSeed + 15);
}

TEST(CudaOps, AttentionDecodeMmaF8MatchesReference) {
  SKIP_WITHOUT_GPU();
  expect_decode_over_cache(quant::Type::F8_E4M3, kSeed + 70);
}

}  // namespace
}  // namespace magnetar
