// The cached forms' pieces of attention.cu's decode kernel (attention_decode_mma over Q8_0 and FP8 caches): the
// copies of a Q8_0 ring stage and the conversions of Q8_0 codes and FP8 bytes to the f16 the tensor cores take.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backends/cuda/attention.cuh"
#include "backends/cuda/ops_common.cuh"

namespace magnetar::cuda::attn {

// Copies of one Q8_0 ring stage (the F16 and FP8 kernels' are in the kernel): kStep rows of K and of V, the head row of
// kHeadBytes at k/v + key * row_bytes + head_off for keys base, base + 1, ..., each staged as the kRowPieces 16-byte
// pieces of the 16-byte-aligned window around it (q8_piece_bytes: the head `skew` = (key * row_bytes +
// head_off) % 16 bytes in, nothing past the head row read), kPitchBytes apart; lane takes pieces lane, lane + 32, ...
// (a warp's instruction covers consecutive pieces: coalesced). Rows in [from, to) only; rows past j_end zero-filled
// (blocks of scale 0: zeros) when zero_tail, others left alone.
template <int kStep, int kRowPieces, int kPitchBytes, int kHeadBytes>
__device__ __forceinline__ void copy_stage_q8(uint32_t stage, const uint8_t* k, const uint8_t* v, size_t row_bytes,
                                              size_t head_off, int64_t base, int64_t j_end, int64_t from, int64_t to,
                                              bool zero_tail, int lane) {
  constexpr int kAll = kStep * kRowPieces;  // per matrix
#pragma unroll
  for (int i = 0; i < (kAll + ops::kWarpSize - 1) / ops::kWarpSize; ++i) {
    const int piece = lane + ops::kWarpSize * i;
    const int row = piece / kRowPieces, col = piece % kRowPieces;
    const int64_t key = base + row;
    const bool valid = key < j_end;
    if ((kAll % ops::kWarpSize == 0 || piece < kAll) && (valid ? key >= from && key < to : zero_tail)) {
      const size_t at = size_t(valid ? key : base) * row_bytes + head_off;  // the head row's first byte
      const size_t src = (at & ~size_t(15)) + size_t(16 * col);
      const int bytes = valid ? q8_piece_bytes(int64_t(at), kHeadBytes, col) : 0;
      const uint32_t dst = stage + uint32_t(row * kPitchBytes + col * 16);
      cp_async16_part(dst, k + src, bytes);
      cp_async16_part(dst + uint32_t(kStep * kPitchBytes), v + src, bytes);
    }
  }
}

// Four int8 (a word of a Q8_0 block's codes) times the block's scale d, as four f16 (two words, element 0 in the low
// half): each code c becomes the f16 1024 + (c + 128) by placing c ^ 0x80 under the exponent byte 0x64, minus 1152
// gives c exactly, times d rounds once: f16(d * c), the value an F16 cache of the dequantized row would hold
// (quant::float_to_fp16(fp16_to_float(d) * c): the product is exact in float).
__device__ __forceinline__ uint2 q8x4_to_f16(uint32_t codes, __half2 d2) {
  const uint32_t u = codes ^ 0x80808080u;
  const uint32_t lo = __byte_perm(u, 0x64646464u, 0x4140), hi = __byte_perm(u, 0x64646464u, 0x4342);
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // f16 1152
  const __half2 a = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&lo), bias), d2);
  const __half2 b = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&hi), bias), d2);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// Two e4m3 (the low 16 bits of x, element 0 in the low byte) as two f16 (element 0 in the low half): exact.
__device__ __forceinline__ uint32_t f8x2_to_f16x2(uint32_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(x & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | uint32_t(h.y) << 16;
}

}  // namespace magnetar::cuda::attn
