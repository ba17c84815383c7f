// AVX2 kernels for the 32-element block family: backends/cpu/legacy_kernels.h (register_avx2_legacy).
#include "backends/cpu/legacy_kernels.h"
