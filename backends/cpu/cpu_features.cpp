// Runtime ISA detection. __builtin_cpu_supports reads CPUID and, for AVX/AVX-512, checks that the OS
// saves the wider register state (XGETBV), so a kernel chosen here never faults on an old kernel/VM.
#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Isa best_isa() {
  static const Isa kBest = isa_supported(Isa::kAvx512) ? Isa::kAvx512
                           : isa_supported(Isa::kAvx2) ? Isa::kAvx2
                                                       : Isa::kScalar;
  return kBest;
}

}  // namespace magnetar::cpu
