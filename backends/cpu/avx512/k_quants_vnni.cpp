// Q4_K, Q5_K and Q6_K's kernels with AVX-512 VNNI (register_avx512_k_quants_vnni; CPUs without VNNI keep the AVX2
// ones): backends/cpu/k_quants_kernels.h with each scaled sub-block sum added by vpdpwssd, the reference's bits as the
// AVX2 build (docs/benchmarks/2026-12-06-cpu-vnni-legacy.md).
#define MAGNETAR_K_QUANTS_VNNI 1
#include "backends/cpu/k_quants_kernels.h"
