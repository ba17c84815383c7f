#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <utility>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/fp16.h"
#include "quant/fp8.h"

namespace magnetar::cpu {
namespace {

float dot_f32_scalar(int64_t n, const float* a, const float* b) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
float dot_f16_f32_scalar(int64_t n, const uint16_t* a, const float* b) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += quant::fp16_to_float(a[i]) * b[i];
  return sum;
}
void axpy_f32_scalar(int64_t n, float alpha, const float* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void axpy_f16_scalar(int64_t n, float alpha, const uint16_t* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * quant::fp16_to_float(x[i]);
}

void attn_scores_scalar(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const float* k, int64_t ldk,
                        float scale, float* s, int64_t lds) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) s[r * lds + j] = scale * dot_f32_scalar(d, q + r * ldq, k + j * ldk);
  }
}
void attn_accumulate_scalar(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp, const float* v, int64_t ldv,
                            float* o, int64_t ldo) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) axpy_f32_scalar(d, p[r * ldp + j], v + j * ldv, o + r * ldo);
  }
}

float max_scalar(int64_t n, const float* x) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

void widen_f16_scalar(const void* src, float* dst, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = quant::fp16_to_float(h[i]);
    if (std::isnan(dst[i])) dst[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(dst[i]) | 0x00400000u);
  }
}

void widen_f8_scalar(const void* src, float* dst, int64_t n) {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = quant::fp8_e4m3_to_float(uint8_t(c));
    return t;
  }();
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = table[s[i]];
}

float exp_sum_scalar(int64_t n, float* x, float max) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
  return float(sum);
}

// The tile of entries with no tile kernel of their own: four calls of the vec_dot of (kIsa, type id kId),
// bit-identical to it by construction. Defined below, once tables() is.
template <int kIsa, size_t kId>
void vec_dot_2x2_by_single(int64_t n, const void* x0, const void* x1, const void* y0, const void* y1, float* out);

using TileFns = std::array<VecDot2x2Fn, kMaxTypeId>;
template <int kIsa, size_t... kIds>
constexpr TileFns by_single_fns(std::index_sequence<kIds...>) {
  return {&vec_dot_2x2_by_single<kIsa, kIds>...};
}
template <Isa kIsa>
constexpr TileFns kBySingle = by_single_fns<int(kIsa)>(std::make_index_sequence<kMaxTypeId>());

struct Tables {
  std::array<KernelTable, kIsaCount> by_isa;
  std::array<VectorKernels, kIsaCount> vectors;

  Tables() {
    KernelTable& scalar = by_isa[int(Isa::kScalar)];
    for (const quant::TypeTraits& t : quant::all_types()) {
      scalar[uint32_t(t.type)] = {.vec_dot = t.vec_dot, .quantize = t.from_float, .dequantize = t.to_float};
    }
    fill_from(scalar, KernelTable{}, kBySingle<Isa::kScalar>);
    KernelTable& avx2 = by_isa[int(Isa::kAvx2)];
    register_avx2_float(avx2);
    register_avx2_legacy(avx2);
    register_avx2_k_quants(avx2);
    register_avx2_k_low(avx2);
    fill_from(avx2, scalar, kBySingle<Isa::kAvx2>);
    KernelTable& avx512 = by_isa[int(Isa::kAvx512)];
    register_avx512_float(avx512);
    register_avx512_legacy(avx512);
    register_avx512_k_quants_vnni(avx512);
    register_avx512_k_quants(avx512);  // after the VNNI build: its Q6_K dot replaces that one's
    register_avx512_k_low(avx512);
    fill_from(avx512, avx2, kBySingle<Isa::kAvx512>);

    vectors[int(Isa::kScalar)] = {.dot_f32 = dot_f32_scalar, .dot_f16_f32 = dot_f16_f32_scalar,
                                  .axpy_f32 = axpy_f32_scalar, .axpy_f16 = axpy_f16_scalar,
                                  .attn_scores = attn_scores_scalar, .attn_accumulate = attn_accumulate_scalar,
                                  .max = max_scalar, .exp_sum = exp_sum_scalar};
    vectors[int(Isa::kScalar)].widen_f16 = widen_f16_scalar;
    vectors[int(Isa::kScalar)].widen_f8 = widen_f8_scalar;
    vectors[int(Isa::kAvx2)] = vectors[int(Isa::kScalar)];
    register_avx2_vector(vectors[int(Isa::kAvx2)]);
    vectors[int(Isa::kAvx512)] = vectors[int(Isa::kAvx2)];
    register_avx512_vector(vectors[int(Isa::kAvx512)]);
  }

  // by_single: this ISA's four-call tiles. A tile must match its entry's vec_dot bit for bit, so an entry
  // inherits the narrower tile only together with the narrower vec_dot; an entry with a vec_dot of its own
  // and no tile kernel gets four calls of that vec_dot.
  static void fill_from(KernelTable& table, const KernelTable& narrower, const TileFns& by_single) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (!table[i].vec_dot_2x2) table[i].vec_dot_2x2 = table[i].vec_dot ? by_single[i] : narrower[i].vec_dot_2x2;
      if (!table[i].vec_dot) table[i].vec_dot = narrower[i].vec_dot;
      if (!table[i].quantize) table[i].quantize = narrower[i].quantize;
      if (!table[i].dequantize) table[i].dequantize = narrower[i].dequantize;
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

template <int kIsa, size_t kId>
void vec_dot_2x2_by_single(int64_t n, const void* x0, const void* x1, const void* y0, const void* y1, float* out) {
  const quant::VecDotFn dot = tables().by_isa[kIsa][kId].vec_dot;
  out[0] = dot(n, x0, y0);
  out[1] = dot(n, x0, y1);
  out[2] = dot(n, x1, y0);
  out[3] = dot(n, x1, y1);
}

}  // namespace

const VectorKernels& vector_kernels(Isa isa) {
  MAGNETAR_CHECK(isa_supported(isa));
  return tables().vectors[int(isa)];
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

const TypeKernels& kernels(quant::Type type, Isa isa) {
  MAGNETAR_CHECK(isa_supported(isa));
  MAGNETAR_CHECK(uint32_t(type) < uint32_t(kMaxTypeId));
  return tables().by_isa[int(isa)][uint32_t(type)];
}

}  // namespace magnetar::cpu
