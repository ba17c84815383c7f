// The 2x2 tile dot products (cpu::TypeKernels::vec_dot_2x2) of every type and ISA this CPU supports, scalar
// included, against single dot products (backends/cpu/kernels.h states the contract):
//   - out[2 r + c] is bit-identical to vec_dot(n, x_r, y_c) of the same table entry, for every type: this
//     is what keeps prefill (tiles) and decode (single dots) on the same logits;
//   - for the types whose single SIMD kernel is bit-exact with the reference (kExactTypes), the tile is
//     bit-identical to four reference vec_dot calls as well. For the other types the single kernel's
//     distance to the reference is tested in kernels_test.cpp, and the tile inherits it through the first
//     check.
// Rows of 1, 2, 7, 8 and 33 blocks (odd counts catch unrolled loops that drop a remainder), reference-
// quantized Gaussian data, extreme values, and weight rows of random bytes (every scale encoding); inputs
// are 4-byte aligned only, and again end at an unmapped page (over-reads fault).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "base/check.h"
#include "quant/quant.h"

namespace magnetar {
namespace tile_kernels_test {

using cpu::Isa;
using quant::Type;
using quant::TypeTraits;

constexpr Type kExactTypes[] = {Type::Q4_K, Type::Q5_K, Type::Q6_K};  // avx2/k_quants.cpp, avx512/k_quants.cpp
constexpr int64_t kBlockCounts[] = {1, 2, 7, 8, 33};

struct TileCase {
  Type type;
  Isa isa;
};

// NOLINTNEXTLINE(readability-identifier-naming): the name is gtest's hook
void PrintTo(const TileCase& c, std::ostream* os) { *os << quant::type_name(c.type) << "/" << cpu::isa_name(c.isa); }

std::vector<TileCase> tile_cases() {
  std::vector<TileCase> cases;
  for (const TypeTraits& t : quant::all_types()) {
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (cpu::isa_supported(isa)) cases.push_back({t.type, isa});
    }
  }
  return cases;
}

std::string case_name(const testing::TestParamInfo<TileCase>& info) {
  return std::string(quant::type_name(info.param.type)) + "_" + std::string(cpu::isa_name(info.param.isa));
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Equal bits, or both NaN (a NaN's payload records which operand the hardware propagated, not a value).
bool same_float(float a, float b) { return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b)); }

// Copies of the input: one 4 bytes past a 64-byte boundary (no block needs more alignment, and GGUF rows
// are only block-aligned), one ending where a PROT_NONE page begins.
class Placed {
 public:
  explicit Placed(const std::vector<uint8_t>& src) : misaligned_(src.size() + 128) {
    const auto addr = reinterpret_cast<uintptr_t>(misaligned_.data());
    misaligned_at_ = misaligned_.data() + (64 - addr % 64) % 64 + 4;
    if (!src.empty()) std::memcpy(misaligned_at_, src.data(), src.size());
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t data_pages = (src.size() + page - 1) / page;
    map_bytes_ = (data_pages + 1) * page;
    void* base = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MAGNETAR_CHECK(base != MAP_FAILED);
    map_ = static_cast<uint8_t*>(base);
    MAGNETAR_CHECK(mprotect(map_ + data_pages * page, page, PROT_NONE) == 0);
    page_end_at_ = map_ + data_pages * page - src.size();
    if (!src.empty()) std::memcpy(page_end_at_, src.data(), src.size());
  }
  ~Placed() { munmap(map_, map_bytes_); }
  Placed(const Placed&) = delete;
  Placed& operator=(const Placed&) = delete;
  const uint8_t* at(int placement) const { return placement == 0 ? misaligned_at_ : page_end_at_; }

 private:
  std::vector<uint8_t> misaligned_;
  uint8_t* misaligned_at_ = nullptr;
  uint8_t* map_ = nullptr;
  uint8_t* page_end_at_ = nullptr;
  size_t map_bytes_ = 0;
};

class TileTest : public testing::TestWithParam<TileCase> {
 protected:
  const TypeTraits& traits() const { return quant::traits(GetParam().type); }
  const cpu::TypeKernels& kernels() const { return cpu::kernels(GetParam().type, GetParam().isa); }
  std::mt19937_64 gen_{20261130u ^ uint64_t(GetParam().type) ^ (uint64_t(GetParam().isa) << 8)};

  std::vector<float> gaussian(int64_t n, float sigma) {
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = dist(gen_);
    return v;
  }
  std::vector<float> signs(int64_t n, float magnitude) {  // every quant at an extreme
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = (gen_() & 1) ? magnitude : -magnitude;
    return v;
  }
  static std::vector<uint8_t> quantize(Type type, const std::vector<float>& x) {
    std::vector<uint8_t> q(quant::row_size(type, int64_t(x.size())));
    quant::traits(type).from_float(x.data(), q.data(), int64_t(x.size()));
    return q;
  }
  std::vector<uint8_t> random_bytes(size_t n) {
    std::vector<uint8_t> q(n);
    for (uint8_t& b : q) b = uint8_t(gen_());
    return q;
  }

  // The tile of (x0, x1) x (y0, y1) against the single dots, at both placements of the inputs.
  void check(const std::vector<uint8_t>& x0, const std::vector<uint8_t>& x1, const std::vector<uint8_t>& y0,
             const std::vector<uint8_t>& y1, int64_t n, bool compare_with_reference, const std::string& what) {
    const TypeTraits& t = traits();
    const Placed px[2] = {Placed(x0), Placed(x1)};
    const Placed py[2] = {Placed(y0), Placed(y1)};
    const std::vector<uint8_t>* xs[2] = {&x0, &x1};
    const std::vector<uint8_t>* ys[2] = {&y0, &y1};
    for (int placement = 0; placement < 2; ++placement) {
      float out[4 + 1];
      out[4] = -12345.0f;  // guard: the tile writes exactly four floats
      kernels().vec_dot_2x2(n, px[0].at(placement), px[1].at(placement), py[0].at(placement), py[1].at(placement), out);
      EXPECT_EQ(out[4], -12345.0f) << what << ": wrote past out[3]";
      for (int r = 0; r < 2; ++r) {
        for (int c = 0; c < 2; ++c) {
          const float got = out[2 * r + c];
          const float single = kernels().vec_dot(n, px[r].at(placement), py[c].at(placement));
          EXPECT_TRUE(same_float(got, single))
              << what << " n=" << n << " placement " << placement << " out[" << 2 * r + c << "]: tile " << got << " (0x"
              << std::hex << bits_of(got) << "), vec_dot " << single << " (0x" << bits_of(single) << ")";
          if (!compare_with_reference) continue;
          const float ref = t.vec_dot(n, xs[r]->data(), ys[c]->data());
          EXPECT_TRUE(same_float(got, ref))
              << what << " n=" << n << " placement " << placement << " out[" << 2 * r + c << "]: tile " << got << " (0x"
              << std::hex << bits_of(got) << "), reference " << ref << " (0x" << bits_of(ref) << ")";
        }
      }
    }
  }
};

TEST_P(TileTest, PresentExactlyWithVecDot) {
  EXPECT_EQ(kernels().vec_dot_2x2 == nullptr, kernels().vec_dot == nullptr);
}

TEST_P(TileTest, MatchesSingleDots) {
  const TypeTraits& t = traits();
  if (t.vec_dot == nullptr) return;  // activation-only type (Q8_1, Q8_K)
  const bool exact = GetParam().isa == Isa::kScalar ||
                     std::find(std::begin(kExactTypes), std::end(kExactTypes), t.type) != std::end(kExactTypes);
  const Type act = t.vec_dot_type;
  for (int64_t blocks : kBlockCounts) {
    const int64_t n = blocks * t.block_size;
    check(quantize(t.type, gaussian(n, 1.0f)), quantize(t.type, gaussian(n, 0.01f)), quantize(act, gaussian(n, 1.0f)),
          quantize(act, gaussian(n, 30.0f)), n, exact, "Gaussian");
    check(quantize(t.type, signs(n, 1000.0f)), quantize(t.type, gaussian(n, 1.0f)), quantize(act, signs(n, 1000.0f)),
          quantize(act, signs(n, 1.0f)), n, exact, "+-1000 and Gaussian");
    // The same row twice on each side: a tile must not assume distinct inputs.
    const std::vector<uint8_t> x = quantize(t.type, gaussian(n, 1.0f));
    const std::vector<uint8_t> y = quantize(act, gaussian(n, 1.0f));
    check(x, x, y, y, n, exact, "aliased rows");
    // Weight rows of random bytes reach every scale encoding (and inf/NaN scales); activations stay
    // quantizer output, as the kernels' input contract requires. The reference may propagate another NaN
    // or order float specials differently, so only the single dot is the oracle here.
    const size_t row_bytes = quant::row_size(t.type, n);
    check(random_bytes(row_bytes), random_bytes(row_bytes), quantize(act, gaussian(n, 1.0f)),
          quantize(act, gaussian(n, 1.0f)), n, false, "random weight bytes");
  }
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TileTest);
INSTANTIATE_TEST_SUITE_P(AllTypes, TileTest, testing::ValuesIn(tile_cases()), case_name);

// The 32-element family's AVX-512 entries (backends/cpu/legacy_kernels.h built with VNNI where the CPU has it, else
// the AVX2 ones) against the AVX2 build: every single dot and tile output bit for bit, weight codes -128 included.
class LegacyIsaTest : public TileTest {
 protected:
  void same(const std::vector<uint8_t>& x0, const std::vector<uint8_t>& x1, const std::vector<uint8_t>& y0,
            const std::vector<uint8_t>& y1, int64_t n, const std::string& what) {
    const cpu::TypeKernels& wide = cpu::kernels(GetParam().type, Isa::kAvx512);
    const cpu::TypeKernels& avx2 = cpu::kernels(GetParam().type, Isa::kAvx2);
    const std::vector<uint8_t>* xs[2] = {&x0, &x1};
    const std::vector<uint8_t>* ys[2] = {&y0, &y1};
    float got[4], want[4];
    wide.vec_dot_2x2(n, x0.data(), x1.data(), y0.data(), y1.data(), got);
    avx2.vec_dot_2x2(n, x0.data(), x1.data(), y0.data(), y1.data(), want);
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(same_float(got[k], want[k]))
          << what << " n=" << n << " tile out[" << k << "]: " << got[k] << " vs " << want[k];
      const float dot = wide.vec_dot(n, xs[k / 2]->data(), ys[k % 2]->data());
      const float dot2 = avx2.vec_dot(n, xs[k / 2]->data(), ys[k % 2]->data());
      EXPECT_TRUE(same_float(dot, dot2)) << what << " n=" << n << " vec_dot " << k << ": " << dot << " vs " << dot2;
    }
  }
};

std::vector<TileCase> legacy_cases() {
  std::vector<TileCase> cases;
  if (!cpu::isa_supported(Isa::kAvx512)) return cases;
  for (Type t : {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::IQ4_NL, Type::MXFP4}) {
    cases.push_back({t, Isa::kAvx512});
  }
  return cases;
}

TEST_P(LegacyIsaTest, Avx512EqualsAvx2BitForBit) {
  const TypeTraits& t = traits();
  const Type act = t.vec_dot_type;
  for (int64_t blocks : kBlockCounts) {
    const int64_t n = blocks * t.block_size;
    same(quantize(t.type, gaussian(n, 1.0f)), quantize(t.type, signs(n, 1000.0f)), quantize(act, gaussian(n, 1.0f)),
         quantize(act, signs(n, 1.0f)), n, "Gaussian and +-1000");
    const size_t row_bytes = quant::row_size(t.type, n);  // every code, -128 included; every scale encoding
    same(random_bytes(row_bytes), random_bytes(row_bytes), quantize(act, gaussian(n, 1.0f)),
         quantize(act, gaussian(n, 30.0f)), n, "random weight bytes");
  }
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(LegacyIsaTest);  // a CPU without AVX-512 has no cases
INSTANTIATE_TEST_SUITE_P(Family, LegacyIsaTest, testing::ValuesIn(legacy_cases()), case_name);

}  // namespace tile_kernels_test
}  // namespace magnetar
