#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

void register_avx2_float(KernelTable& /*table*/) {}

}  // namespace magnetar::cpu
