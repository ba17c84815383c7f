#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

void register_avx512_legacy(KernelTable& /*table*/) {}

}  // namespace magnetar::cpu
