// Scalar reference implementations: the oracle for every SIMD and CUDA kernel (STYLE.md rule 7).
// Correctness over speed; each must reproduce llama.cpp's dequantized values bit-exactly.
// Signatures follow the contracts in quant/quant.h. Callers normally go through traits(type).
#pragma once

#include <cstdint>

namespace magnetar::quant::ref {

#define MAGNETAR_DECLARE_REF(suffix)                                    \
  void dequantize_##suffix(const void* src, float* dst, int64_t n);    \
  void quantize_##suffix(const float* src, void* dst, int64_t n);      \
  float vec_dot_##suffix(int64_t n, const void* x, const void* y);

MAGNETAR_DECLARE_REF(f32)
MAGNETAR_DECLARE_REF(f16)
MAGNETAR_DECLARE_REF(bf16)
MAGNETAR_DECLARE_REF(q4_0)   // y: Q8_0
MAGNETAR_DECLARE_REF(q4_1)   // y: Q8_1
MAGNETAR_DECLARE_REF(q5_0)   // y: Q8_0
MAGNETAR_DECLARE_REF(q5_1)   // y: Q8_1
MAGNETAR_DECLARE_REF(q8_0)   // y: Q8_0
MAGNETAR_DECLARE_REF(iq4_nl) // y: Q8_0
MAGNETAR_DECLARE_REF(mxfp4)  // y: Q8_0
MAGNETAR_DECLARE_REF(q2_k)   // y: Q8_K
MAGNETAR_DECLARE_REF(q3_k)   // y: Q8_K
MAGNETAR_DECLARE_REF(q4_k)   // y: Q8_K
MAGNETAR_DECLARE_REF(q5_k)   // y: Q8_K
MAGNETAR_DECLARE_REF(q6_k)   // y: Q8_K
MAGNETAR_DECLARE_REF(iq4_xs) // y: Q8_K
#undef MAGNETAR_DECLARE_REF

// Activation-only types: no vec_dot of their own.
void dequantize_q8_1(const void* src, float* dst, int64_t n);
void quantize_q8_1(const float* src, void* dst, int64_t n);
void dequantize_q8_k(const void* src, float* dst, int64_t n);
void quantize_q8_k(const float* src, void* dst, int64_t n);

}  // namespace magnetar::quant::ref
