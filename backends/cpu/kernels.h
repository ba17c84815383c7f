// CPU kernel selection: per tensor type, the fastest vec_dot / quantize / dequantize this CPU can run.
//
// Each ISA folder (avx2/, avx512/) has one file per kernel family that fills the entries it implements
// into a KernelTable through a register_* function; entries an ISA leaves null fall back to the next
// narrower ISA and finally to the scalar reference in quant/ref (the oracle the kernels are tested against).
// Tables are built once, on first use, and are immutable afterwards (safe to read from any thread).
#pragma once

#include <array>
#include <string_view>

#include "quant/quant.h"

namespace magnetar::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr int kIsaCount = 3;
std::string_view isa_name(Isa isa);

// What the running CPU (and OS, for AVX-512 state) supports. AVX2 means AVX2+FMA+F16C;
// AVX-512 means F+BW+VL+DQ.
bool isa_supported(Isa isa);
// The widest supported ISA.
Isa best_isa();

// Four dot products of two weight rows x0, x1 (this type) with two activation rows y0, y1 (vec_dot_type),
// n elements each: out = {x0.y0, x0.y1, x1.y0, x1.y1}. Prefill multiplies every weight row with many
// tokens; a 2x2 tile unpacks each weight block and loads each activation block once for two products.
// Contract: out[2 * r + c] is bit-identical to vec_dot(n, x_r, y_c) of the same table entry, so prefill
// (tiles) and decode (single dots) compute the same logits. Same input contract as vec_dot.
using VecDot2x2Fn = void (*)(int64_t n, const void* x0, const void* x1, const void* y0, const void* y1, float* out);

struct TypeKernels {
  quant::VecDotFn vec_dot = nullptr;       // x of this type, y of traits(type).vec_dot_type
  quant::FromFloatFn quantize = nullptr;   // float -> this type (used for activations on the hot path)
  quant::ToFloatFn dequantize = nullptr;   // this type -> float
  // Non-null exactly when vec_dot is. Where an ISA has no tile kernel of its own this is four calls of
  // the entry's vec_dot (so the contract above holds for any mix of ISAs).
  VecDot2x2Fn vec_dot_2x2 = nullptr;
};
inline constexpr int kMaxTypeId = 40;
using KernelTable = std::array<TypeKernels, kMaxTypeId>;  // indexed by the ggml type id

// Kernels for `type` as provided by `isa` (with fallback to narrower ISAs and the reference).
// `isa` must be supported by this CPU (CHECKed). Every field of the result is non-null except vec_dot
// and vec_dot_2x2 for activation-only types (Q8_1, Q8_K).
const TypeKernels& kernels(quant::Type type, Isa isa);
inline const TypeKernels& kernels(quant::Type type) { return kernels(type, best_isa()); }

// Float-vector primitives of attention and the elementwise ops (not tied to a tensor type).
struct VectorKernels {
  float (*dot_f32)(int64_t n, const float* a, const float* b) = nullptr;
  float (*dot_f16_f32)(int64_t n, const uint16_t* a, const float* b) = nullptr;
  void (*axpy_f32)(int64_t n, float alpha, const float* x, float* y) = nullptr;     // y += alpha * x
  void (*axpy_f16)(int64_t n, float alpha, const uint16_t* x, float* y) = nullptr;  // y += alpha * x
  // Attention over one block of cached rows (cpu::attention's inner products), row-major float matrices:
  //   attn_scores:     s[r * lds + j] = scale * dot(q + r * ldq, k + j * ldk)  (d elements)  for r < m, j < n
  //   attn_accumulate: o[r * ldo + i] += p[r * ldp + j] * v[j * ldv + i], j = 0, 1, ...  for r < m, i < d
  // Register tiles only group independent outputs: an output's arithmetic (its dot's order, its chain of
  // multiply-adds over j) is the same whatever m, n and the output's place in the call, so a query row gets the same
  // bits alone or beside others.
  void (*attn_scores)(int64_t m, int64_t n, int64_t d, const float* q, int64_t ldq, const float* k, int64_t ldk,
                      float scale, float* s, int64_t lds) = nullptr;
  void (*attn_accumulate)(int64_t m, int64_t n, int64_t d, const float* p, int64_t ldp, const float* v, int64_t ldv,
                          float* o, int64_t ldo) = nullptr;
  // max(x[0..n)) (-inf when n == 0).
  float (*max)(int64_t n, const float* x) = nullptr;
  // x[i] = exp(x[i] - max) in place; returns the sum (softmax numerators). Relative error <= 2e-7 per element.
  float (*exp_sum)(int64_t n, float* x, float max) = nullptr;
  // n halfs (src) to floats (dst): cpu::attention's F16 rows. The hardware conversion: quant's F16 dequantize's values
  // except that a signalling NaN comes out quiet (float bit 22 set; the dequantize keeps the payload as it is, at
  // ~4 instructions per 16 values that attention has no use for).
  void (*widen_f16)(const void* src, float* dst, int64_t n) = nullptr;
  // n FP8 E4M3 bytes (src) to floats (dst): cpu::attention's F8_E4M3 rows, quant::fp8_e4m3_to_float's values (exact;
  // the NaN codes as NaN).
  void (*widen_f8)(const void* src, float* dst, int64_t n) = nullptr;
};
const VectorKernels& vector_kernels(Isa isa);
inline const VectorKernels& vector_kernels() { return vector_kernels(best_isa()); }
void register_avx2_vector(VectorKernels& kernels);
void register_avx512_vector(VectorKernels& kernels);  // attn_scores, attn_accumulate and widen_f16

// Registration hooks, one per kernel file (defined in avx2/*.cpp and avx512/*.cpp).
void register_avx2_float(KernelTable& table);     // F32, F16, BF16
void register_avx2_legacy(KernelTable& table);    // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 IQ4_NL MXFP4
void register_avx2_k_quants(KernelTable& table);  // Q4_K Q5_K Q6_K Q8_K
void register_avx2_k_low(KernelTable& table);     // Q2_K Q3_K IQ4_XS
void register_avx512_float(KernelTable& table);
void register_avx512_legacy(KernelTable& table);
void register_avx512_k_quants(KernelTable& table);
void register_avx512_k_quants_vnni(KernelTable& table);  // before register_avx512_k_quants (its Q6_K dot wins)
void register_avx512_k_low(KernelTable& table);

}  // namespace magnetar::cpu
