#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

void register_avx2_k_quants(KernelTable& /*table*/) {}

}  // namespace magnetar::cpu
