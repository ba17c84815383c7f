// Device-call checking (STYLE.md rule 11, tier 3): every CUDA runtime call goes through CUDA_CHECK, which
// aborts with the call, file:line and CUDA's error string. A failing device call mid-computation is not a
// recoverable input error; callers that can meet an expected failure (no device) test for it first.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "magnetar: CUDA error at %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(err_));                                                     \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)
