#include "backends/cpu/kernels.h"

namespace magnetar::cpu {

void register_avx512_float(KernelTable& /*table*/) {}

}  // namespace magnetar::cpu
