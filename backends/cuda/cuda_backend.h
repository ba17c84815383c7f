// Host-side entry points of the CUDA backend. Plain C++ (no CUDA headers), so CPU-only code and tests can
// include it; the implementations live in the .cu files of this folder.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace magnetar::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error).
int device_count();

// Dequantizes n elements (a multiple of 32) of Q8_0 blocks on device 0: copies `src` up, runs the kernel,
// copies the float32 result back into `dst`. The first kernel of the backend: it keeps the CUDA build
// and its test harness exercised until the real ops land.
Status dequantize_q8_0(const void* src, float* dst, int64_t n);

}  // namespace magnetar::cuda
