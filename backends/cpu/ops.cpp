#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/fp16.h"

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
  pool.run([&](int ith, int nth) {
    // Global row range of this thread, rounded to tiles so threads do not share cache lines of y.
    const int64_t begin = total * ith / nth, end = total * (ith + 1) / nth;
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

constexpr int64_t kMaxQ8HeadDim = 512;  // Q8_0 KV: the largest head row dequantized on the stack

// One job per (token, KV head): the group of query heads sharing that KV head is processed together, so each
// cached K/V row is read (and widened from F16) once per group rather than once per head.
size_t attention_scratch_floats(int64_t n_ctx, int n_threads) {
  return size_t(n_ctx + 64) * 16 * size_t(n_threads);  // [group <= 16][n_ctx] scores per thread
}

void attention(ThreadPool& pool, const AttentionArgs& a) {
  const bool q8 = a.kv_type == quant::Type::Q8_0;
  MAGNETAR_CHECK(a.kv_type == quant::Type::F16 || a.kv_type == quant::Type::F32 || q8);
  MAGNETAR_CHECK(!q8 || (a.head_dim % 32 == 0 && a.head_dim <= kMaxQ8HeadDim));
  MAGNETAR_CHECK(a.n_head % a.n_head_kv == 0);
  const VectorKernels& vk = vector_kernels();
  const int64_t group = a.n_head / a.n_head_kv;
  MAGNETAR_CHECK(group <= 16);
  const int64_t kv_row = a.n_head_kv * a.head_dim;  // elements per cached position
  const int64_t stride = a.pos0 + a.n_tok + 64;     // scores row length in the scratch
  const bool f16 = a.kv_type == quant::Type::F16;
  const uint16_t* k16 = static_cast<const uint16_t*>(a.k_cache);
  const uint16_t* v16 = static_cast<const uint16_t*>(a.v_cache);
  const float* k32 = static_cast<const float*>(a.k_cache);
  const float* v32 = static_cast<const float*>(a.v_cache);
  // Q8_0: a row's bytes, a head's bytes within it, and the dequantizer.
  const size_t q8_row = q8 ? quant::row_size(quant::Type::Q8_0, kv_row) : 0;
  const size_t q8_head = q8 ? quant::row_size(quant::Type::Q8_0, a.head_dim) : 0;
  const quant::ToFloatFn q8_float = q8 ? kernels(quant::Type::Q8_0).dequantize : nullptr;
  const uint8_t* k8 = static_cast<const uint8_t*>(a.k_cache);
  const uint8_t* v8 = static_cast<const uint8_t*>(a.v_cache);
  pool.parallel_for(a.n_tok * a.n_head_kv, [&](int64_t b, int64_t e, int ith) {
    float* scores = a.scratch + size_t(ith) * size_t(stride) * 16;  // [group][stride]
    float dots[16], max_score[16], weight[16];
    float deq[kMaxQ8HeadDim];  // a Q8_0 head row, dequantized
    float sum[16];
    for (int64_t job = b; job < e; ++job) {
      const int64_t t = job / a.n_head_kv, hk = job % a.n_head_kv;
      const int64_t p = a.pos0 + t;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
      const float* q = a.q + (t * a.n_head + hk * group) * a.head_dim;  // [group, head_dim]
      for (int64_t g = 0; g < group; ++g) max_score[g] = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        const size_t off = size_t(j * kv_row + hk * a.head_dim);
        if (q8) {
          q8_float(k8 + size_t(j) * q8_row + size_t(hk) * q8_head, deq, a.head_dim);
          vk.dot_f32_multi(a.head_dim, deq, q, a.head_dim, group, dots);
        } else if (f16) {
          vk.dot_f16_multi(a.head_dim, k16 + off, q, a.head_dim, group, dots);
        } else {
          vk.dot_f32_multi(a.head_dim, k32 + off, q, a.head_dim, group, dots);
        }
        for (int64_t g = 0; g < group; ++g) {
          const float s = dots[g] * a.scale;
          scores[g * stride + (j - lo)] = s;
          max_score[g] = std::max(max_score[g], s);
        }
      }
      for (int64_t g = 0; g < group; ++g) sum[g] = vk.exp_sum(p - lo + 1, scores + g * stride, max_score[g]);
      float* out = a.out + (t * a.n_head + hk * group) * a.head_dim;  // [group, head_dim]
      std::fill(out, out + group * a.head_dim, 0.0f);
      for (int64_t j = lo; j <= p; ++j) {
        const size_t off = size_t(j * kv_row + hk * a.head_dim);
        for (int64_t g = 0; g < group; ++g) weight[g] = scores[g * stride + (j - lo)];
        if (q8) {
          q8_float(v8 + size_t(j) * q8_row + size_t(hk) * q8_head, deq, a.head_dim);
          vk.axpy_f32_multi(a.head_dim, weight, deq, out, a.head_dim, group);
        } else if (f16) {
          vk.axpy_f16_multi(a.head_dim, weight, v16 + off, out, a.head_dim, group);
        } else {
          vk.axpy_f32_multi(a.head_dim, weight, v32 + off, out, a.head_dim, group);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        const float inv = float(1.0 / sum[g]);
        for (int64_t i = 0; i < a.head_dim; ++i) out[g * a.head_dim + i] *= inv;
      }
    }
  });
}

void store_kv(const float* x, int64_t n_tok, int64_t n, quant::Type kv_type, void* cache, int64_t row0) {
  MAGNETAR_CHECK(kv_type == quant::Type::F32 || kv_type == quant::Type::F16 ||
                 (kv_type == quant::Type::Q8_0 && n % 32 == 0));
  uint8_t* dst = static_cast<uint8_t*>(cache) + size_t(row0) * quant::row_size(kv_type, n);
  if (kv_type == quant::Type::F32) {
    std::memcpy(dst, x, size_t(n_tok * n) * sizeof(float));
  } else {
    kernels(kv_type).quantize(x, dst, n_tok * n);
  }
}

}  // namespace magnetar::cpu
