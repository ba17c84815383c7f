// AVX2 kernels for Q4_K, Q5_K, Q6_K and the Q8_K quantizer: backends/cpu/k_quants_kernels.h (register_avx2_k_quants).
#include "backends/cpu/k_quants_kernels.h"
