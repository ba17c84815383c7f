#include "backends/cpu/kernels.h"
#include "base/check.h"

namespace magnetar::cpu {
namespace {

struct Tables {
  std::array<KernelTable, kIsaCount> by_isa;

  Tables() {
    KernelTable& scalar = by_isa[int(Isa::kScalar)];
    for (const quant::TypeTraits& t : quant::all_types()) {
      scalar[uint32_t(t.type)] = {.vec_dot = t.vec_dot, .quantize = t.from_float, .dequantize = t.to_float};
    }
    KernelTable& avx2 = by_isa[int(Isa::kAvx2)];
    register_avx2_float(avx2);
    register_avx2_legacy(avx2);
    register_avx2_k_quants(avx2);
    register_avx2_k_low(avx2);
    fill_from(avx2, scalar);
    KernelTable& avx512 = by_isa[int(Isa::kAvx512)];
    register_avx512_float(avx512);
    register_avx512_legacy(avx512);
    register_avx512_k_quants(avx512);
    register_avx512_k_low(avx512);
    fill_from(avx512, avx2);
  }

  static void fill_from(KernelTable& table, const KernelTable& narrower) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (!table[i].vec_dot) table[i].vec_dot = narrower[i].vec_dot;
      if (!table[i].quantize) table[i].quantize = narrower[i].quantize;
      if (!table[i].dequantize) table[i].dequantize = narrower[i].dequantize;
    }
  }
};

const Tables& tables() {
  static const Tables kTables;
  return kTables;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

const TypeKernels& kernels(quant::Type type, Isa isa) {
  MAGNETAR_CHECK(isa_supported(isa));
  MAGNETAR_CHECK(uint32_t(type) < uint32_t(kMaxTypeId));
  return tables().by_isa[int(isa)][uint32_t(type)];
}

}  // namespace magnetar::cpu
