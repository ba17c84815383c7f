// The rotation angle of NeoX RoPE, shared by the kernel (rope.cu) and the host test
// (tests/cuda/cuda_ops_host_test.cu). The formula is cpu::rope_neox's, step for step: inv_freq as
// transformers computes it (float32 values from a double power), the angle in double, cos and sin rounded to
// float. On the host this compiles to the CPU op's libm calls; on the device CUDA's double pow/sin/cos (at
// most 2 ulp of double from the correctly rounded value) round to the same float except within ~2^-28 of a
// float rounding boundary, where they differ by one ulp.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef MAGNETAR_HD
#define MAGNETAR_HD __host__ __device__ __forceinline__
#endif

namespace magnetar::cuda::rope {

// cos and sin of pair i (0 <= i < head_dim / 2) at position pos.
MAGNETAR_HD void cos_sin(int32_t pos, int i, int head_dim, float theta, float* c, float* s) {
  const float inv_freq = float(1.0 / pow(double(theta), double(2 * i) / double(head_dim)));
  const double angle = double(pos) * double(inv_freq);
  *c = float(cos(angle));
  *s = float(sin(angle));
}

}  // namespace magnetar::cuda::rope
