#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

void register_avx512_k_low(KernelTable& /*table*/) {}

}  // namespace magnetar::cpu
