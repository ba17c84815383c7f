// One trait row per tensor type (STYLE.md rule 6): what a type is, how big its blocks are, and the scalar
// reference functions that every faster kernel is tested against.
//
// Contracts for the function pointers (n is always a multiple of block_size; block pointers
// must be 2-byte aligned, as GGUF tensor data always is):
//   to_float(src, dst, n)      dequantize n elements of this type into float32
//   from_float(src, dst, n)    reference quantizer: n float32 values into n/block_size blocks
//   vec_dot(n, x, y) -> float  dot product of n elements: x of this type, y of vec_dot_type
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "quant/formats.h"

namespace magnetar::quant {

using ToFloatFn = void (*)(const void* src, float* dst, int64_t n);
using FromFloatFn = void (*)(const float* src, void* dst, int64_t n);
using VecDotFn = float (*)(int64_t n, const void* x, const void* y);

struct TypeTraits {
  Type type;
  std::string_view name;    // as llama.cpp prints it: "Q4_K", "IQ4_NL", "BF16", ...
  int64_t block_size;       // elements per block (1 for F32/F16/BF16)
  size_t type_size;         // bytes per block
  bool is_quantized;
  ToFloatFn to_float;
  FromFloatFn from_float;
  VecDotFn vec_dot;         // scalar reference
  Type vec_dot_type;        // the activation format vec_dot expects for y
  // llama.cpp's general.file_type (enum llama_ftype) of a model whose weight matrices are of this type
  // (the K-quants map to their _S mix: Q4_K -> MOSTLY_Q4_K_S); -1 for activation-only types (Q8_1, Q8_K),
  // which no model stores.
  int32_t file_type;
};

// Every implemented type, in id order.
std::span<const TypeTraits> all_types();
// nullptr when the id is unknown or not implemented.
const TypeTraits* find_traits(uint32_t type_id);
// Must be an implemented type (a CHECK otherwise); Type values come only from validated input.
const TypeTraits& traits(Type type);
// Case-insensitive: "q4_k" and "Q4_K" both work.
std::optional<Type> type_from_name(std::string_view name);
inline std::string_view type_name(Type type) { return type == Type::F8_E4M3 ? "F8_E4M3" : traits(type).name; }
// A type model weights can be stored in (every implemented type except the activation formats Q8_1, Q8_K).
inline bool is_weight_type(Type type) { return traits(type).file_type >= 0; }

// Sizing facts of every ggml type id a GGUF file may carry, implemented or not, so that files with types
// Magnetar cannot compute with can still be read, sized and inspected. nullptr for ids ggml never used
// or retired.
struct TypeSizeInfo {
  uint32_t id;
  std::string_view name;
  int64_t block_size;
  size_t type_size;
};
const TypeSizeInfo* find_type_size(uint32_t type_id);
// Whether a file's type id is one Magnetar's kernels compute with (implemented, with a dot product).
inline bool computable(uint32_t type_id) {
  const TypeTraits* t = find_traits(type_id);
  return t != nullptr && t->vec_dot != nullptr;
}
// A file's type id for messages: its ggml name ("IQ3_S"), or "id N" for an id ggml never used.
std::string type_label(uint32_t type_id);
// ggml ids of the integer tensor types that files carry but no kernel computes with (sized above): the packed
// expert layout stores its records as I8 bytes and its extent table as I64 (experts/layout.h).
inline constexpr uint32_t kTypeIdI8 = 24;
inline constexpr uint32_t kTypeIdI64 = 27;

// Bytes of one row of n elements; n must be a multiple of the block size (CHECKed).
size_t row_size(Type type, int64_t n);

}  // namespace magnetar::quant
