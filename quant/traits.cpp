#include <algorithm>
#include <cctype>

#include "base/check.h"
#include "quant/quant.h"
#include "quant/ref/ref.h"

namespace magnetar::quant {
namespace {

#define ROW(T, NAME, BS, SIZE, Q, fn, DOT_TYPE, dot, FTYPE)                                \
  TypeTraits {                                                                              \
    .type = Type::T, .name = NAME, .block_size = BS, .type_size = SIZE, .is_quantized = Q, \
    .to_float = ref::dequantize_##fn, .from_float = ref::quantize_##fn, .vec_dot = dot,   \
    .vec_dot_type = Type::DOT_TYPE, .file_type = FTYPE                                    \
  }

// The last column is llama.cpp's enum llama_ftype: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q4_1 3, Q8_0 7, Q5_0 8,
// Q5_1 9, Q2_K 10, Q3_K_S 11, Q4_K_S 14, Q5_K_S 16, Q6_K 18, IQ4_NL 25, IQ4_XS 30, BF16 32, MXFP4_MOE 38.
constexpr TypeTraits kTypes[] = {
    ROW(F32, "F32", 1, 4, false, f32, F32, ref::vec_dot_f32, 0),
    ROW(F16, "F16", 1, 2, false, f16, F16, ref::vec_dot_f16, 1),
    ROW(Q4_0, "Q4_0", kQK32, sizeof(BlockQ4_0), true, q4_0, Q8_0, ref::vec_dot_q4_0, 2),
    ROW(Q4_1, "Q4_1", kQK32, sizeof(BlockQ4_1), true, q4_1, Q8_1, ref::vec_dot_q4_1, 3),
    ROW(Q5_0, "Q5_0", kQK32, sizeof(BlockQ5_0), true, q5_0, Q8_0, ref::vec_dot_q5_0, 8),
    ROW(Q5_1, "Q5_1", kQK32, sizeof(BlockQ5_1), true, q5_1, Q8_1, ref::vec_dot_q5_1, 9),
    ROW(Q8_0, "Q8_0", kQK32, sizeof(BlockQ8_0), true, q8_0, Q8_0, ref::vec_dot_q8_0, 7),
    ROW(Q8_1, "Q8_1", kQK32, sizeof(BlockQ8_1), true, q8_1, Q8_1, nullptr, -1),
    ROW(Q2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K), true, q2_k, Q8_K, ref::vec_dot_q2_k, 10),
    ROW(Q3_K, "Q3_K", kQK_K, sizeof(BlockQ3_K), true, q3_k, Q8_K, ref::vec_dot_q3_k, 11),
    ROW(Q4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true, q4_k, Q8_K, ref::vec_dot_q4_k, 14),
    ROW(Q5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K), true, q5_k, Q8_K, ref::vec_dot_q5_k, 16),
    ROW(Q6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true, q6_k, Q8_K, ref::vec_dot_q6_k, 18),
    ROW(Q8_K, "Q8_K", kQK_K, sizeof(BlockQ8_K), true, q8_k, Q8_K, nullptr, -1),
    ROW(IQ4_NL, "IQ4_NL", kQK32, sizeof(BlockIQ4_NL), true, iq4_nl, Q8_0, ref::vec_dot_iq4_nl, 25),
    ROW(IQ4_XS, "IQ4_XS", kQK_K, sizeof(BlockIQ4_XS), true, iq4_xs, Q8_K, ref::vec_dot_iq4_xs, 30),
    ROW(BF16, "BF16", 1, 2, false, bf16, BF16, ref::vec_dot_bf16, 32),
    ROW(MXFP4, "MXFP4", kQK32, sizeof(BlockMXFP4), true, mxfp4, Q8_0, ref::vec_dot_mxfp4, 38),
};
#undef ROW

}  // namespace

std::span<const TypeTraits> all_types() { return kTypes; }

const TypeTraits* find_traits(uint32_t type_id) {
  for (const TypeTraits& t : kTypes) {
    if (uint32_t(t.type) == type_id) return &t;
  }
  return nullptr;
}

const TypeTraits& traits(Type type) {
  const TypeTraits* t = find_traits(uint32_t(type));
  MAGNETAR_CHECK(t != nullptr);
  return *t;
}

std::optional<Type> type_from_name(std::string_view name) {
  for (const TypeTraits& t : kTypes) {
    if (std::equal(name.begin(), name.end(), t.name.begin(), t.name.end(),
                   [](char a, char b) { return std::toupper(uint8_t(a)) == b; })) {
      return t.type;
    }
  }
  return std::nullopt;
}

size_t row_size(Type type, int64_t n) {
  if (type == Type::F8_E4M3) return size_t(n);
  const TypeTraits& t = traits(type);
  MAGNETAR_CHECK(n % t.block_size == 0);
  return size_t(n / t.block_size) * t.type_size;
}

}  // namespace magnetar::quant
