// F32, F16 and BF16: plain element conversions, and the dot products llama.cpp uses for them
// (y has the same type as x; accumulation in double to make the reference independent of order).
#include <cstring>

#include "quant/fp16.h"
#include "quant/ref/ref.h"

namespace magnetar::quant::ref {

void dequantize_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void quantize_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
float vec_dot_f32(int64_t n, const void* x, const void* y) {
  const float* a = static_cast<const float*>(x);
  const float* b = static_cast<const float*>(y);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(a[i]) * double(b[i]);
  return float(sum);
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
}
void quantize_f16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_fp16(src[i]);
}
float vec_dot_f16(int64_t n, const void* x, const void* y) {
  const uint16_t* a = static_cast<const uint16_t*>(x);
  const uint16_t* b = static_cast<const uint16_t*>(y);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(fp16_to_float(a[i])) * double(fp16_to_float(b[i]));
  return float(sum);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
}
float vec_dot_bf16(int64_t n, const void* x, const void* y) {
  const uint16_t* a = static_cast<const uint16_t*>(x);
  const uint16_t* b = static_cast<const uint16_t*>(y);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_float(a[i])) * double(bf16_to_float(b[i]));
  return float(sum);
}

}  // namespace magnetar::quant::ref
