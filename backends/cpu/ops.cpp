#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/fp16.h"
#include "quant/fp8.h"

namespace magnetar::cpu {

// ---- matmul ------------------------------------------------------------------------------------------------
// Weights are read once per token tile; activations for all tokens stay hot in L1/L2 while a tile of
// kRowTile weight rows is multiplied with every token, which is what makes prefill cheaper per token than
// decode.

namespace {

constexpr int64_t kRowTile = 16;

bool is_float_type(quant::Type t) {
  return t == quant::Type::F32 || t == quant::Type::F16 || t == quant::Type::BF16;
}

// Per-thread buffer for a widened F16/BF16 weight row. Grows once to the largest row, then never allocates.
float* widen_buffer(int64_t n) {
  thread_local std::vector<float> buffer;
  if (int64_t(buffer.size()) < n) buffer.resize(size_t(n));
  return buffer.data();
}

void matmul_rows(const MatmulJob& job, int64_t row_begin, int64_t row_end) {
  const size_t w_row_bytes = quant::row_size(job.type, job.n_in);
  const uint8_t* w = static_cast<const uint8_t*>(job.w);
  const uint8_t* x = static_cast<const uint8_t*>(job.x.data);
  const int64_t n_tok = job.x.n_tok;
  if (job.x.is_float) {
    const VectorKernels& vk = vector_kernels();
    const quant::ToFloatFn widen = kernels(job.type).dequantize;
    for (int64_t o = row_begin; o < row_end; ++o) {
      const float* row = reinterpret_cast<const float*>(w + size_t(o) * w_row_bytes);
      if (job.type != quant::Type::F32) {
        float* buf = widen_buffer(job.n_in);
        widen(w + size_t(o) * w_row_bytes, buf, job.n_in);
        row = buf;
      }
      for (int64_t t = 0; t < n_tok; ++t) {
        job.y[t * job.ldy + o] = vk.dot_f32(job.n_in, row, reinterpret_cast<const float*>(x + size_t(t) * job.x.row_bytes));
      }
    }
    return;
  }
  const TypeKernels& k = kernels(job.type);
  const quant::VecDotFn dot = k.vec_dot;
  const VecDot2x2Fn dot_2x2 = k.vec_dot_2x2;
  auto w_row = [&](int64_t o) { return w + size_t(o) * w_row_bytes; };
  auto x_row = [&](int64_t t) { return x + size_t(t) * job.x.row_bytes; };
  for (int64_t o0 = row_begin; o0 < row_end; o0 += kRowTile) {
    const int64_t o1 = std::min(row_end, o0 + kRowTile);
    // Token pairs x row pairs through the 2x2 tile (each weight block unpacked once per two tokens); an odd
    // last row or token takes the single dot, which the tile matches bit for bit (kernels.h), so a token's
    // outputs do not depend on the batch it is in.
    int64_t t = 0;
    for (; t + 1 < n_tok; t += 2) {
      float* y0 = job.y + t * job.ldy;
      float* y1 = y0 + job.ldy;
      int64_t o = o0;
      for (; o + 1 < o1; o += 2) {
        float out[4];
        dot_2x2(job.n_in, w_row(o), w_row(o + 1), x_row(t), x_row(t + 1), out);
        y0[o] = out[0];
        y1[o] = out[1];
        y0[o + 1] = out[2];
        y1[o + 1] = out[3];
      }
      if (o < o1) {
        y0[o] = dot(job.n_in, w_row(o), x_row(t));
        y1[o] = dot(job.n_in, w_row(o), x_row(t + 1));
      }
    }
    if (t < n_tok) {
      float* yt = job.y + t * job.ldy;
      for (int64_t o = o0; o < o1; ++o) yt[o] = dot(job.n_in, w_row(o), x_row(t));
    }
  }
}

}  // namespace

size_t prepare_input_bytes(quant::Type type, int64_t n_in, int64_t n_tok) {
  if (is_float_type(type)) return 0;
  return quant::row_size(quant::traits(type).vec_dot_type, n_in) * size_t(n_tok);
}

PreparedInput prepare_input(ThreadPool& pool, quant::Type type, const float* x, int64_t ldx, int64_t n_in,
                            int64_t n_tok, void* scratch) {
  if (is_float_type(type)) {
    return {.data = x, .row_bytes = size_t(ldx) * sizeof(float), .n_tok = n_tok, .is_float = true};
  }
  const quant::Type act = quant::traits(type).vec_dot_type;
  const size_t row_bytes = quant::row_size(act, n_in);
  const quant::FromFloatFn quantize = kernels(act).quantize;
  uint8_t* out = static_cast<uint8_t*>(scratch);
  if (n_tok == 1) {
    quantize(x, out, n_in);  // one row: not worth waking the pool
  } else {
    pool.parallel_for(n_tok, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) quantize(x + t * ldx, out + size_t(t) * row_bytes, n_in);
    });
  }
  return {.data = out, .row_bytes = row_bytes, .n_tok = n_tok, .is_float = false};
}

void matmul(ThreadPool& pool, std::span<const MatmulJob> jobs) {
  int64_t total = 0;
  for (const MatmulJob& j : jobs) {
    MAGNETAR_CHECK(j.x.is_float == is_float_type(j.type));
    total += j.n_out;
  }
  // Ranges of the jobs' rows laid end to end, in whole tiles so that threads do not share cache lines of y.
  const int64_t tiles = (total + kRowTile - 1) / kRowTile;
  pool.parallel_for(tiles, [&](int64_t tile_begin, int64_t tile_end, int) {
    const int64_t begin = tile_begin * kRowTile, end = std::min(total, tile_end * kRowTile);
    int64_t base = 0;
    for (const MatmulJob& j : jobs) {
      const int64_t lo = std::max(begin, base), hi = std::min(end, base + j.n_out);
      if (lo < hi) matmul_rows(j, lo - base, hi - base);
      base += j.n_out;
    }
  });
}

// ---- elementwise -----------------------------------------------------------------------------------------

void swiglu(ThreadPool& pool, float* gate, const float* up, int64_t count) {
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  };
  if (count < 8192) {
    body(0, count, 0);
  } else {
    pool.parallel_for(count, body);
  }
}

void rms_norm(ThreadPool& pool, const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += double(xr[i]) * double(xr[i]);
      const float scale = float(1.0 / std::sqrt(sum / double(n) + double(eps)));
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
    }
  };
  if (n_rows * n < 16384) {
    body(0, n_rows, 0);
  } else {
    pool.parallel_for(n_rows, body);
  }
}

void rope_neox(ThreadPool& pool, float* x, int64_t n_tok, int64_t n_head, int64_t head_dim, const int32_t* pos,
               float theta) {
  const int64_t half = head_dim / 2;
  // inv_freq as transformers computes it (float32 values), the angle in double.
  float inv_freq[512];
  MAGNETAR_CHECK(half <= 512);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = float(1.0 / std::pow(double(theta), double(2 * i) / double(head_dim)));
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      float cs[512], sn[512];
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(pos[t]) * double(inv_freq[i]);
        cs[i] = float(std::cos(angle));
        sn[i] = float(std::sin(angle));
      }
      for (int64_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b2 = v[i + half];
          v[i] = a * cs[i] - b2 * sn[i];
          v[i + half] = b2 * cs[i] + a * sn[i];
        }
      }
    }
  };
  if (n_tok == 1) {
    body(0, 1, 0);
  } else {
    pool.parallel_for(n_tok, body);
  }
}

// ---- attention ---------------------------------------------------------------------------------------------

// Flash-attention style. The query rows of a job walk the cached rows in blocks of kBlockRows, whose K and V are
// widened to float once per block, with an online softmax. Blocks start at multiples of kBlockRows and are grouped into
// chunks of kChunkRows, also at fixed positions: each chunk's softmax starts afresh and chunks are merged into the
// running result in order. A prefill job is a tile of tokens on one KV head (each cached row read once per tile); a
// decode step makes one item per (chunk, pass over up to kPassElems elements of KV heads), so each thread streams whole
// stretches of the cache, and the chunks' records are merged in order afterwards. A row's result is therefore the same
// bits whatever the thread count and whether its token is decoded alone or inside a prefill tile (scores outside its
// range are discarded, and its products with V cover its range only).

namespace {

constexpr int64_t kBlockRows = 32;
constexpr int64_t kChunkRows = 256;
constexpr int64_t kPrefetchBlocks = 2;    // how many blocks ahead a decode pass asks for K and V
constexpr int64_t kTileRows = 64;         // query rows of one job at most (a group takes one token's at least)
constexpr int64_t kPassElems = 512;       // K/V elements per cached row a decode pass widens (whole heads, >= 1)
constexpr int64_t kMaxHeadDim = 1024;     // what model loading accepts
constexpr int64_t kMaxGroup = kTileRows;  // query heads per KV head: one token's group fits a job

int64_t tile_tokens(int64_t group) { return std::max<int64_t>(1, kTileRows / group); }
int64_t tile_rows(int64_t group) { return tile_tokens(group) * group; }
// KV heads of one decode pass.
int64_t pass_heads(int64_t n_head_kv, int64_t group, int64_t head_dim) {
  return std::clamp<int64_t>(std::min(kPassElems / head_dim, kTileRows / group), 1, n_head_kv);
}
int64_t chunk_of(int64_t row) { return row / kChunkRows; }
int64_t max_chunks(int64_t n_ctx) { return n_ctx / kChunkRows + 2; }

// One thread's buffers: the job's queries, running and chunk outputs, scores, K and V blocks, and per query row the
// running and chunk maxima and sums.
struct ThreadBuffers {
  float *q, *o_run, *o_chunk, *scores, *k, *v, *m_run, *l_run, *m_chunk, *l_chunk;

  static int64_t rows(int64_t group) { return std::max(tile_rows(group), group); }
  static int64_t floats(int64_t group, int64_t head_dim) {
    const int64_t m = rows(group), kv = kBlockRows * std::max(head_dim, kPassElems);
    return (3 * m * head_dim + m * kBlockRows + 2 * kv + 4 * m + 15) / 16 * 16;
  }
  ThreadBuffers(float* base, int64_t group, int64_t head_dim) {
    const int64_t m = rows(group);
    q = base;
    o_run = q + m * head_dim;
    o_chunk = o_run + m * head_dim;
    scores = o_chunk + m * head_dim;
    k = scores + m * kBlockRows;
    v = k + kBlockRows * std::max(head_dim, kPassElems);
    m_run = v + kBlockRows * std::max(head_dim, kPassElems);
    l_run = m_run + m;
    m_chunk = l_run + m;
    l_chunk = m_chunk + m;
  }
};

// n_heads consecutive KV heads of the cache and how their rows become float rows.
struct KvHeads {
  const uint8_t *k, *v;              // row 0 of the first head
  int64_t n_heads = 1;
  int64_t head_dim = 0;
  size_t row_bytes = 0;              // bytes from one cached position to the next
  size_t span_bytes = 0;             // bytes of the heads in one position
  int64_t float_stride = 0;          // F32: floats from one position to the next (rows are used in place)
  quant::ToFloatFn widen = nullptr;  // F16 / Q8_0 / F8_E4M3 to floats

  void prefetch(int64_t j0, int64_t j1) const {
    for (int64_t j = j0; j < j1; ++j) {
      for (size_t line = 0; line < span_bytes; line += 64) {
        __builtin_prefetch(k + size_t(j) * row_bytes + line);
        __builtin_prefetch(v + size_t(j) * row_bytes + line);
      }
    }
  }

  // Float rows [j0, j1) of K or V: in place (F32) or widened into buf; returns the first row and sets its stride.
  const float* rows(const uint8_t* base, int64_t j0, int64_t j1, float* buf, int64_t* ld) const {
    if (!widen) {
      *ld = float_stride;
      return reinterpret_cast<const float*>(base + size_t(j0) * row_bytes);
    }
    const int64_t n = n_heads * head_dim;
    *ld = n;
    if (span_bytes == row_bytes) {  // whole positions: one call
      widen(base + size_t(j0) * row_bytes, buf, (j1 - j0) * n);
    } else {
      for (int64_t j = j0; j < j1; ++j) widen(base + size_t(j) * row_bytes, buf + (j - j0) * n, n);
    }
    return buf;
  }
};

// The query rows of a job: per KV head of its KvHeads, rows_per_head consecutive rows.
struct Tile {
  int64_t m = 0;                         // query rows
  int64_t rows_per_head = 0;
  const float* q = nullptr;              // [m, head_dim]
  int64_t lo[kTileRows], hi[kTileRows];  // row r attends to cached rows [lo[r], hi[r])
  int64_t first = 0, end = 0;            // the union of those ranges
};

// One chunk [c0, c1) of cached rows for a tile, from a fresh softmax state into m_c, l_c, o_c ([m, head_dim]).
void attend_chunk(const VectorKernels& vk, const KvHeads& kv, const Tile& t, float scale, int64_t c0, int64_t c1,
                  bool prefetch, ThreadBuffers& w, float* m_c, float* l_c, float* o_c) {
  const int64_t D = kv.head_dim;
  std::fill(m_c, m_c + t.m, -INFINITY);
  std::fill(l_c, l_c + t.m, 0.0f);
  std::fill(o_c, o_c + t.m * D, 0.0f);
  for (int64_t b0 = c0; b0 < c1; b0 += kBlockRows) {
    const int64_t j0 = std::max(b0, t.first), j1 = std::min(b0 + kBlockRows, t.end);
    if (j0 >= j1) continue;
    if (prefetch)
      kv.prefetch(b0 + kPrefetchBlocks * kBlockRows, std::min(b0 + (kPrefetchBlocks + 1) * kBlockRows, t.end));
    int64_t ldk = 0, ldv = 0;
    const float* k = kv.rows(kv.k, j0, j1, w.k, &ldk);
    const float* v = kv.rows(kv.v, j0, j1, w.v, &ldv);
    for (int64_t h = 0; h < kv.n_heads; ++h) {
      const int64_t r0 = h * t.rows_per_head, r1 = r0 + t.rows_per_head;
      vk.attn_scores(t.rows_per_head, j1 - j0, D, t.q + r0 * D, D, k + h * D, ldk, scale,
                     w.scores + r0 * kBlockRows + (j0 - b0), kBlockRows);
      for (int64_t r = r0; r < r1; ++r) {
        float* s = w.scores + r * kBlockRows;  // the block's kBlockRows entries, -inf outside the row's range
        const int64_t lo = std::clamp(t.lo[r] - b0, int64_t(0), kBlockRows);
        const int64_t hi = std::clamp(t.hi[r] - b0, lo, kBlockRows);
        std::fill(s, s + lo, -INFINITY);
        std::fill(s + hi, s + kBlockRows, -INFINITY);
        const float block_max = vk.max(kBlockRows, s);
        const float m_new = std::max(m_c[r], block_max);
        if (m_new == -INFINITY) {  // nothing to attend to yet: zero weights
          std::fill(s, s + kBlockRows, 0.0f);
          continue;
        }
        if (m_new > m_c[r] && m_c[r] != -INFINITY) {
          const float rescale = std::exp(m_c[r] - m_new);
          for (int64_t i = 0; i < D; ++i) o_c[r * D + i] *= rescale;
          l_c[r] *= rescale;
        }
        m_c[r] = m_new;
        l_c[r] += vk.exp_sum(kBlockRows, s, m_new);
      }
      // Each run of rows with one range in this block takes only that range's V rows: a masked row's exact-zero
      // weight times an infinite V value (an F16 overflow) would make NaN where the row decoded alone is finite.
      for (int64_t r = r0; r < r1;) {
        const int64_t lo = std::clamp(t.lo[r], j0, j1), hi = std::clamp(t.hi[r], lo, j1);
        int64_t run = r + 1;
        while (run < r1 && std::clamp(t.lo[run], j0, j1) == lo && std::clamp(t.hi[run], lo, j1) == hi) ++run;
        if (hi > lo) {
          vk.attn_accumulate(run - r, hi - lo, D, w.scores + r * kBlockRows + (lo - b0), kBlockRows,
                             v + (lo - j0) * ldv + h * D, ldv, o_c + r * D, D);
        }
        r = run;
      }
    }
  }
}

// Merges a chunk's state into the running one (a chunk with nothing attended leaves it as it was).
void merge_chunk(int64_t m, int64_t head_dim, const float* m_c, const float* l_c, const float* o_c, float* m_run,
                 float* l_run, float* o_run) {
  for (int64_t r = 0; r < m; ++r) {
    if (m_c[r] == -INFINITY) continue;
    const float m_new = std::max(m_run[r], m_c[r]);
    const float a = std::exp(m_run[r] - m_new), b = std::exp(m_c[r] - m_new);  // a = 0 while nothing ran
    for (int64_t i = 0; i < head_dim; ++i)
      o_run[r * head_dim + i] = o_run[r * head_dim + i] * a + o_c[r * head_dim + i] * b;
    l_run[r] = l_run[r] * a + l_c[r] * b;
    m_run[r] = m_new;
  }
}

}  // namespace

size_t attention_scratch_floats(int64_t n_ctx, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int n_threads) {
  const int64_t group = n_head / std::max<int64_t>(1, n_head_kv);
  const int64_t heads = pass_heads(n_head_kv, group, head_dim), passes = (n_head_kv + heads - 1) / heads;
  const int64_t records = max_chunks(n_ctx) * passes * heads * group * (head_dim + 2);  // a decode step's chunks
  return size_t(ThreadBuffers::floats(group, head_dim)) * size_t(n_threads) + size_t(records);
}

void attention(ThreadPool& pool, const AttentionArgs& a) {
  MAGNETAR_CHECK(a.kv_type == quant::Type::F16 || a.kv_type == quant::Type::F32 || a.kv_type == quant::Type::Q8_0 ||
                 a.kv_type == quant::Type::F8_E4M3);
  MAGNETAR_CHECK(a.kv_type != quant::Type::Q8_0 || a.head_dim % 32 == 0);
  MAGNETAR_CHECK(a.head_dim <= kMaxHeadDim && a.n_head % a.n_head_kv == 0);
  const VectorKernels& vk = vector_kernels();
  const int64_t group = a.n_head / a.n_head_kv, D = a.head_dim;
  MAGNETAR_CHECK(group <= kMaxGroup);
  const int64_t kv_row = a.n_head_kv * D;  // elements per cached position
  const size_t row_bytes = quant::row_size(a.kv_type, kv_row), head_bytes = quant::row_size(a.kv_type, D);
  const int nth = pool.size();
  auto kv_heads = [&](int64_t hk, int64_t n) {
    KvHeads h{.k = static_cast<const uint8_t*>(a.k_cache) + size_t(hk) * head_bytes,
              .v = static_cast<const uint8_t*>(a.v_cache) + size_t(hk) * head_bytes, .n_heads = n, .head_dim = D,
              .row_bytes = row_bytes, .span_bytes = size_t(n) * head_bytes, .float_stride = kv_row};
    if (a.kv_type == quant::Type::F16) h.widen = vk.widen_f16;
    if (a.kv_type == quant::Type::Q8_0) h.widen = kernels(a.kv_type).dequantize;
    if (a.kv_type == quant::Type::F8_E4M3) h.widen = vk.widen_f8;
    return h;
  };
  auto buffers = [&](int ith) {
    return ThreadBuffers(a.scratch + size_t(ith) * size_t(ThreadBuffers::floats(group, D)), group, D);
  };
  // The query rows of tokens [t0, t1) on KV heads [hk, hk + n_heads), copied into w.q: per head, per token, its group.
  auto make_tile = [&](int64_t t0, int64_t t1, int64_t hk, int64_t n_heads, ThreadBuffers& w) {
    Tile t;
    t.rows_per_head = (t1 - t0) * group;
    t.m = n_heads * t.rows_per_head;
    t.q = w.q;
    t.first = INT64_MAX;
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t tok = t0; tok < t1; ++tok) {
        const int64_t r0 = h * t.rows_per_head + (tok - t0) * group;
        std::copy_n(a.q + (tok * a.n_head + (hk + h) * group) * D, group * D, w.q + r0 * D);
        const int64_t p = a.pos0 + tok;
        const int64_t lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
        std::fill_n(t.lo + r0, group, lo);
        std::fill_n(t.hi + r0, group, p + 1);
        t.first = std::min(t.first, lo);
        t.end = std::max(t.end, p + 1);
      }
    }
    return t;
  };
  // Query row r of a tile of tokens from t0 on KV heads from hk, normalized into the output.
  auto write_out = [&](int64_t t0, int64_t hk, const Tile& t, const float* o, const float* l) {
    for (int64_t r = 0; r < t.m; ++r) {
      const int64_t h = r / t.rows_per_head, tok = t0 + r % t.rows_per_head / group, g = r % group;
      float* out = a.out + (tok * a.n_head + (hk + h) * group + g) * D;
      const float inv = float(1.0 / double(l[r]));
      for (int64_t i = 0; i < D; ++i) out[i] = o[r * D + i] * inv;
    }
  };
  auto start_running = [&](ThreadBuffers& w, int64_t m) {
    std::fill(w.m_run, w.m_run + m, -INFINITY);
    std::fill(w.l_run, w.l_run + m, 0.0f);
    std::fill(w.o_run, w.o_run + m * D, 0.0f);
  };

  if (a.n_tok == 1) {
    // Decode: items (chunk, pass) write one record each (per query row of the pass: max, sum, output), then the
    // records are merged.
    const int64_t p = a.pos0, lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
    const int64_t c_first = chunk_of(lo), n_chunks = chunk_of(p) - c_first + 1;
    const int64_t heads = pass_heads(a.n_head_kv, group, D), passes = (a.n_head_kv + heads - 1) / heads;
    const int64_t record = heads * group * (D + 2);
    float* records = a.scratch + size_t(ThreadBuffers::floats(group, D)) * size_t(nth);  // [chunk][pass]
    auto pass_of = [&](int64_t pass) { return std::pair{pass * heads, std::min(heads, a.n_head_kv - pass * heads)}; };
    pool.parallel_for(n_chunks * passes, [&](int64_t b, int64_t e, int ith) {
      ThreadBuffers w = buffers(ith);
      for (int64_t item = b; item < e; ++item) {
        const int64_t c = c_first + item / passes;
        const auto [hk, n] = pass_of(item % passes);
        const Tile t = make_tile(0, 1, hk, n, w);
        float* rec = records + item * record;
        attend_chunk(vk, kv_heads(hk, n), t, a.scale, c * kChunkRows, (c + 1) * kChunkRows, true, w, rec, rec + t.m,
                     rec + 2 * t.m);
      }
    });
    // Each query row merges its chunks' records in order; rows are independent, so every thread takes a share.
    pool.parallel_for(passes * heads * group, [&](int64_t b, int64_t e, int ith) {
      ThreadBuffers w = buffers(ith);
      for (int64_t item = b; item < e; ++item) {
        const int64_t pass = item / (heads * group), r = item % (heads * group);
        const auto [hk, n] = pass_of(pass);
        const int64_t m = n * group;  // the pass's rows: query heads hk * group .. hk * group + m - 1
        if (r >= m) continue;         // the last pass may hold fewer heads
        *w.m_run = -INFINITY;
        *w.l_run = 0.0f;
        std::fill(w.o_run, w.o_run + D, 0.0f);
        for (int64_t c = 0; c < n_chunks; ++c) {
          const float* rec = records + (c * passes + pass) * record;
          merge_chunk(1, D, rec + r, rec + m + r, rec + 2 * m + r * D, w.m_run, w.l_run, w.o_run);
        }
        float* out = a.out + (hk * group + r) * D;
        const float inv = float(1.0 / double(*w.l_run));
        for (int64_t i = 0; i < D; ++i) out[i] = w.o_run[i] * inv;
      }
    });
    return;
  }
  // Prefill: jobs (tile of tokens, KV head), each merging its chunks as it goes.
  const int64_t tokens = tile_tokens(group), n_tiles = (a.n_tok + tokens - 1) / tokens;
  pool.parallel_for(n_tiles * a.n_head_kv, [&](int64_t b, int64_t e, int ith) {
    ThreadBuffers w = buffers(ith);
    for (int64_t job = b; job < e; ++job) {
      const int64_t tile = job / a.n_head_kv, hk = job % a.n_head_kv;
      const int64_t t0 = tile * tokens, t1 = std::min(a.n_tok, t0 + tokens);
      const Tile t = make_tile(t0, t1, hk, 1, w);
      const KvHeads kv = kv_heads(hk, 1);
      start_running(w, t.m);
      for (int64_t c = chunk_of(t.first); c <= chunk_of(t.end - 1); ++c) {
        attend_chunk(vk, kv, t, a.scale, c * kChunkRows, (c + 1) * kChunkRows, false, w, w.m_chunk, w.l_chunk,
                     w.o_chunk);
        merge_chunk(t.m, D, w.m_chunk, w.l_chunk, w.o_chunk, w.m_run, w.l_run, w.o_run);
      }
      write_out(t0, hk, t, w.o_run, w.l_run);
    }
  });
}

void store_kv(const float* x, int64_t n_tok, int64_t n, quant::Type kv_type, void* cache, int64_t row0) {
  MAGNETAR_CHECK(kv_type == quant::Type::F32 || kv_type == quant::Type::F16 || kv_type == quant::Type::F8_E4M3 ||
                 (kv_type == quant::Type::Q8_0 && n % 32 == 0));
  uint8_t* dst = static_cast<uint8_t*>(cache) + size_t(row0) * quant::row_size(kv_type, n);
  if (kv_type == quant::Type::F32) {
    std::memcpy(dst, x, size_t(n_tok * n) * sizeof(float));
  } else if (kv_type == quant::Type::F8_E4M3) {
    for (int64_t i = 0; i < n_tok * n; ++i) dst[i] = quant::float_to_fp8_e4m3(x[i]);
  } else {
    kernels(kv_type).quantize(x, dst, n_tok * n);
  }
}

}  // namespace magnetar::cpu
