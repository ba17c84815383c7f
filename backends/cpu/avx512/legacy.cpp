// The 32-element block family's kernels with AVX-512 VNNI (register_avx512_legacy; CPUs without VNNI keep the AVX2
// ones): backends/cpu/legacy_kernels.h built with its u8 x s8 products as vpdpbusd, the same bits as the AVX2 build.
//
// It replaced a Q8_0-only dot product that widened both operands to int16 for vpmaddwd (exact for every int8 input,
// 4% faster than AVX2 on the H200 host's Xeon, 2026-11-30). On an AVX-512 EPYC (2026-12-06) that one was 3-9% slower
// than AVX2 and, having no 2x2 tile, made prefill run four single products per tile: 1.5x the AVX2 tile's time
// (docs/benchmarks/2026-12-06-cpu-vnni-legacy.md).
#define MAGNETAR_LEGACY_VNNI 1
#include "backends/cpu/legacy_kernels.h"
