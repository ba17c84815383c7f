// Every CPU kernel against the scalar reference (STYLE.md rule 7), table-driven: one test instance per
// (type in quant::all_types(), SIMD ISA this CPU supports), so a type added to the trait table or a kernel
// registered for a new ISA is covered without touching this file.
//
// What is asserted, per type and ISA (cpu::kernels(type, isa), which falls back to narrower kernels and
// finally to the reference; a fallback passes trivially and the report printed at start-up says which
// entries are real SIMD kernels):
//   vec_dot    within a derived float-rounding bound of the reference (see dot_tolerance)
//   quantize   byte-identical to the reference quantizer
//   dequantize bit-identical to the reference dequantizer
// on random Gaussian data quantized by the reference quantizers, on odd and model-sized rows, on
// edge inputs (zeros, constants, saturating and maximal values, one huge outlier, tiny values), with
// input buffers that are only 4-byte aligned and again with inputs that end at an unmapped page (over-reads
// fault), and with outputs followed by poisoned guard bytes (over-writes fail).
// ISAs the CPU lacks cannot be tested; IsaCoverage.* records them as SKIPPED, never as passed.
#include "backends/cpu/kernels.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

using cpu::Isa;
using quant::Type;
using quant::TypeTraits;

constexpr Isa kSimdIsas[] = {Isa::kAvx2, Isa::kAvx512};
constexpr uint64_t kSeed = 20261130;

// ---- data: deterministic random inputs and buffers ----------------------------------------------------------

// Box-Muller over mt19937_64, so the data does not depend on the standard library's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  uint64_t bits() { return gen_(); }
  double uniform() { return double(gen_() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float gaussian() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  std::mt19937_64 gen_;
};

std::vector<float> gaussian(Rng& rng, int64_t n, float sigma = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = sigma * rng.gaussian();
  return v;
}

// Bytes whose data() lies 4 bytes past a 64-byte boundary. No block struct needs more than 4-byte
// alignment and rows in a GGUF file are only block-aligned, so a kernel that assumes 16- or 32-byte
// alignment (an aligned load) faults or misreads here.
class Misaligned {
 public:
  explicit Misaligned(size_t bytes) : storage_(bytes + 128) {
    const auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    offset_ = (64 - addr % 64) % 64 + 4;
  }
  Misaligned(const void* src, size_t bytes) : Misaligned(bytes) {
    if (bytes != 0) std::memcpy(data(), src, bytes);
  }
  uint8_t* data() { return storage_.data() + offset_; }
  float* floats() { return reinterpret_cast<float*>(data()); }

 private:
  std::vector<uint8_t> storage_;
  size_t offset_ = 0;
};

// Input bytes that end exactly where an inaccessible (PROT_NONE) page begins: a kernel that reads past
// the end of its row, e.g. a full-width load over the last partial block, faults here instead of passing
// silently (a row at the end of a mapped GGUF file is in the same position). The start is aligned only to
// the data's size, which is a whole number of blocks.
class PageEndBuffer {
 public:
  PageEndBuffer(const void* src, size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t data_pages = (bytes + page - 1) / page;
    map_bytes_ = (data_pages + 1) * page;
    void* base = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MAGNETAR_CHECK(base != MAP_FAILED);
    base_ = static_cast<uint8_t*>(base);
    MAGNETAR_CHECK(mprotect(base_ + data_pages * page, page, PROT_NONE) == 0);
    data_ = base_ + data_pages * page - bytes;
    if (bytes != 0) std::memcpy(data_, src, bytes);
  }
  ~PageEndBuffer() { munmap(base_, map_bytes_); }
  PageEndBuffer(const PageEndBuffer&) = delete;
  PageEndBuffer& operator=(const PageEndBuffer&) = delete;
  const uint8_t* data() const { return data_; }
  const float* floats() const { return reinterpret_cast<const float*>(data_); }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t map_bytes_ = 0;
};

std::vector<uint8_t> quantize_ref(Type type, const std::vector<float>& x) {
  std::vector<uint8_t> q(quant::row_size(type, int64_t(x.size())));
  quant::traits(type).from_float(x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize_ref(Type type, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  quant::traits(type).to_float(q.data(), x.data(), n);
  return x;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Row lengths to test, in blocks of the type: 1, 2, 3, 7, 16 and 33 blocks (odd counts catch unrolled
// loops that drop a remainder), the 4096 and 11008 rows of 7B-class models, and for element types
// (block size 1) lengths that are not multiples of any vector width.
std::vector<int64_t> row_lengths(const TypeTraits& t) {
  std::vector<int64_t> n;
  for (int64_t blocks : {1, 2, 3, 7, 16, 33}) n.push_back(blocks * t.block_size);
  if (t.block_size == 1) {
    for (int64_t odd : {15, 31, 63, 65, 127, 129, 4099}) n.push_back(odd);
  }
  n.push_back(4096);
  n.push_back(11008);
  return n;
}

// ---- the dot-product tolerance ------------------------------------------------------------------------------

// Both the reference and a SIMD kernel evaluate the dot product as a float sum of terms t_k: per block or
// sub-block an exact integer dot product times float scales (for element types, the products x_i * y_i).
// With u = 2^-24 (float unit roundoff):
//  - each t_k is rounded at most ~3 times (scale products, int -> float of a sum that may exceed 2^24),
//    a relative error <= 3u;
//  - a sum of m terms evaluated in ANY order and grouping (one accumulator, several lanes, a final tree)
//    is within gamma_(m-1) * sum|t_k| of the exact sum, gamma_j = j u / (1 - j u) (Higham, "Accuracy and
//    Stability of Numerical Algorithms", 2nd ed., section 4.2), because each term passes through at most
//    m - 1 additions.
// So each result is within (m + 3) u sum|t_k| of the exact value (first order), and the two differ by at
// most 2 (m + 3) u sum|t_k|. m: element types have one term per element (m = n); every quantized format
// has sub-blocks of at least 16 elements, each contributing at most one scale-multiplied term per part
// (m = n / 16).
// sum|t_k| is not sum|x_i y_i| for formats that split a block into a scaled-quant part and a min/offset
// part (Q4_1, Q5_1, Q2_K..Q5_K, and y's Q8_1 sums / Q8_K bsums): each part of block b is bounded by
// amax_b * sum_{i in b}|y_i|, amax_b the largest |x_i| of x's block, because the quantizers keep
// |d * q| within the block's range (<= 2 amax_b) and the min within [-amax_b, 0]: sum|t_k| <= 3 M with
// M = sum_i amax_b(i) |y_i| (for element types amax_b = |x_i| and M = sum|x_i y_i|).
// Tolerance = 1e-5 |ref| + 2 (m + 3) u * 3 M. It is tight for short rows (a wrong element or scale in
// one block of a 1..7-block row fails it by orders of magnitude) and loose for long ones (worst case, not
// typical, rounding), which is why the short rows are tested.
struct DotCheck {
  double magnitude = 0;  // M above
  double tolerance = 0;
};

DotCheck dot_tolerance(const TypeTraits& t, const std::vector<float>& x, const std::vector<float>& y, float ref) {
  const int64_t n = int64_t(x.size());
  double magnitude = 0;
  for (int64_t b = 0; b < n; b += t.block_size) {
    double amax = 0;
    for (int64_t i = b; i < b + t.block_size; ++i) amax = std::max(amax, std::fabs(double(x[size_t(i)])));
    for (int64_t i = b; i < b + t.block_size; ++i) magnitude += amax * std::fabs(double(y[size_t(i)]));
  }
  const double m = t.block_size == 1 ? double(n) : std::max(1.0, double(n) / 16.0);
  const double u = std::ldexp(1.0, -24);
  return {.magnitude = magnitude, .tolerance = 1e-5 * std::fabs(double(ref)) + 2.0 * (m + 3.0) * u * 3.0 * magnitude};
}

// ---- the parameterization ---------------------------------------------------------------------------------

struct KernelCase {
  Type type;
  Isa isa;
};

// gtest prints the parameter of a failed test with this (instead of the struct's bytes).
// NOLINTNEXTLINE(readability-identifier-naming): the name is gtest's hook
void PrintTo(const KernelCase& c, std::ostream* os) { *os << quant::type_name(c.type) << "/" << cpu::isa_name(c.isa); }

std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> cases;
  for (const TypeTraits& t : quant::all_types()) {
    for (Isa isa : kSimdIsas) {
      if (cpu::isa_supported(isa)) cases.push_back({t.type, isa});
    }
  }
  return cases;
}

std::string case_name(const testing::TestParamInfo<KernelCase>& info) {
  return std::string(quant::type_name(info.param.type)) + "_" + std::string(cpu::isa_name(info.param.isa));
}

enum class Slot { Dot, Quantize, Dequantize };

const void* slot_fn(const cpu::TypeKernels& k, Slot slot) {
  switch (slot) {
    case Slot::Dot: return reinterpret_cast<const void*>(k.vec_dot);
    case Slot::Quantize: return reinterpret_cast<const void*>(k.quantize);
    case Slot::Dequantize: return reinterpret_cast<const void*>(k.dequantize);
  }
  return nullptr;
}

// Who provides a table entry: "simd" when `isa` registered its own kernel, else what it falls back to.
const char* provider(Type type, Isa isa, Slot slot) {
  const void* fn = slot_fn(cpu::kernels(type, isa), slot);
  if (fn == nullptr) return "none";
  if (fn == slot_fn(cpu::kernels(type, Isa::kScalar), slot)) return "ref";
  if (isa == Isa::kAvx512 && fn == slot_fn(cpu::kernels(type, Isa::kAvx2), slot)) return "avx2";
  return "simd";
}

// Printed once before the tests: which ISAs are tested and which kernels are real SIMD code, so that a
// run on a machine without AVX-512, or a type still on the reference, is visible in the log.
class IsaReport : public testing::Environment {
 public:
  void SetUp() override {
    std::printf("[ kernels  ] ISAs tested:");
    for (Isa isa : kSimdIsas) {
      if (cpu::isa_supported(isa)) std::printf(" %s", std::string(cpu::isa_name(isa)).c_str());
    }
    std::printf("; NOT tested (this CPU lacks them):");
    for (Isa isa : kSimdIsas) {
      if (!cpu::isa_supported(isa)) std::printf(" %s", std::string(cpu::isa_name(isa)).c_str());
    }
    std::printf("\n");
    for (Isa isa : kSimdIsas) {
      if (!cpu::isa_supported(isa)) continue;
      std::printf("[ kernels  ] %-6s (dot/quantize/dequantize; ref = falls back to the reference):",
                  std::string(cpu::isa_name(isa)).c_str());
      for (const TypeTraits& t : quant::all_types()) {
        std::printf(" %s=%s/%s/%s", std::string(t.name).c_str(), provider(t.type, isa, Slot::Dot),
                    provider(t.type, isa, Slot::Quantize), provider(t.type, isa, Slot::Dequantize));
      }
      std::printf("\n");
    }
  }
};
[[maybe_unused]] const testing::Environment* const kIsaReport = testing::AddGlobalTestEnvironment(new IsaReport);

// ---- comparisons -------------------------------------------------------------------------------------------

constexpr size_t kGuardBytes = 32;  // checked after each kernel call: no write past the output
constexpr uint8_t kPoison = 0xa5;   // output bytes are pre-filled with this: unwritten bytes show up

class KernelTest : public testing::TestWithParam<KernelCase> {
 protected:
  const TypeTraits& traits() const { return quant::traits(GetParam().type); }
  const cpu::TypeKernels& kernels() const { return cpu::kernels(GetParam().type, GetParam().isa); }
  Rng rng_{kSeed ^ uint64_t(GetParam().type)};

  // The kernel's dot of reference-quantized x (this type) and y (its vec_dot_type) vs the reference.
  void expect_dot_close(const std::vector<uint8_t>& qx, const std::vector<uint8_t>& qy, int64_t n,
                        const std::string& what) {
    const TypeTraits& t = traits();
    const float ref = t.vec_dot(n, qx.data(), qy.data());
    Misaligned mx(qx.data(), qx.size());
    Misaligned my(qy.data(), qy.size());
    const PageEndBuffer ex(qx.data(), qx.size());
    const PageEndBuffer ey(qy.data(), qy.size());
    const float got[2] = {kernels().vec_dot(n, mx.data(), my.data()), kernels().vec_dot(n, ex.data(), ey.data())};
    const char* where[2] = {"4-byte-aligned inputs", "inputs ending at a page boundary"};
    for (int k = 0; k < 2; ++k) {
      if (!std::isfinite(ref)) {
        EXPECT_FALSE(std::isfinite(got[k]))
            << what << " n=" << n << " (" << where[k] << "): reference " << ref << ", kernel " << got[k];
        continue;
      }
      const DotCheck c = dot_tolerance(t, dequantize_ref(t.type, qx, n), dequantize_ref(t.vec_dot_type, qy, n), ref);
      EXPECT_LE(std::fabs(double(got[k]) - double(ref)), c.tolerance)
          << what << " n=" << n << " (" << where[k] << "): reference " << ref << ", kernel " << got[k]
          << ", M=" << c.magnitude;
    }
  }

  // Quantize x with the kernel and the reference: the bytes must be identical.
  void expect_quantize_identical(const std::vector<float>& x, const std::string& what) {
    const TypeTraits& t = traits();
    const int64_t n = int64_t(x.size());
    const std::vector<uint8_t> want = quantize_ref(t.type, x);
    Misaligned src(x.data(), x.size() * sizeof(float));
    Misaligned dst(want.size() + kGuardBytes);
    std::memset(dst.data(), kPoison, want.size() + kGuardBytes);
    kernels().quantize(src.floats(), dst.data(), n);
    expect_guard_intact(dst.data() + want.size(), what);
    // Same input again, ending at a page boundary (over-reads fault); the output must not change.
    const PageEndBuffer end_src(x.data(), x.size() * sizeof(float));
    std::vector<uint8_t> again(want.size());
    kernels().quantize(end_src.floats(), again.data(), n);
    EXPECT_TRUE(std::equal(again.begin(), again.end(), dst.data()))
        << what << ": output depends on the input's address";
    const auto mismatch = std::mismatch(want.begin(), want.end(), dst.data());
    if (mismatch.first == want.end()) return;
    const size_t byte = size_t(mismatch.first - want.begin());
    const size_t block = byte / t.type_size;
    ADD_FAILURE() << what << " n=" << n << ": quantized bytes differ first in block " << block << " byte "
                  << byte % t.type_size << ": reference 0x" << std::hex << int(*mismatch.first) << ", kernel 0x"
                  << int(*mismatch.second) << std::dec << "; block's first input " << x[block * size_t(t.block_size)]
                  << " (bits 0x" << std::hex << bits_of(x[block * size_t(t.block_size)]) << ")";
  }

  // Dequantize q with the kernel and the reference: the floats must be bit-identical. For random bytes,
  // NaN against NaN is accepted whatever the payload: the payload records which operand the hardware
  // propagated (an operand order the format does not define), not a value.
  void expect_dequantize_identical(const std::vector<uint8_t>& q, int64_t n, bool any_nan_matches,
                                   const std::string& what) {
    const std::vector<float> want = dequantize_ref(traits().type, q, n);
    Misaligned src(q.data(), q.size());
    Misaligned dst(size_t(n) * sizeof(float) + kGuardBytes);
    std::memset(dst.data(), kPoison, size_t(n) * sizeof(float) + kGuardBytes);
    kernels().dequantize(src.data(), dst.floats(), n);
    expect_guard_intact(dst.data() + size_t(n) * sizeof(float), what);
    // Same input again, ending at a page boundary (over-reads fault); the output must not change.
    const PageEndBuffer end_src(q.data(), q.size());
    std::vector<float> again(static_cast<size_t>(n));
    kernels().dequantize(end_src.data(), again.data(), n);
    EXPECT_EQ(std::memcmp(again.data(), dst.data(), size_t(n) * sizeof(float)), 0)
        << what << ": output depends on the input's address";
    int64_t bad = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < n; ++i) {
      float got;
      std::memcpy(&got, dst.data() + size_t(i) * sizeof(float), sizeof(float));
      const float ref = want[size_t(i)];
      if (bits_of(got) == bits_of(ref) || (any_nan_matches && std::isnan(got) && std::isnan(ref))) continue;
      if (first < 0) first = i;
      ++bad;
    }
    if (bad == 0) return;
    float got;
    std::memcpy(&got, dst.data() + size_t(first) * sizeof(float), sizeof(float));
    ADD_FAILURE() << what << " n=" << n << ": " << bad << " dequantized values differ; first at element " << first
                  << " (block " << first / traits().block_size << "): reference " << want[size_t(first)] << " (0x"
                  << std::hex << bits_of(want[size_t(first)]) << "), kernel " << got << " (0x" << bits_of(got) << ")";
  }

  static void expect_guard_intact(const uint8_t* guard, const std::string& what) {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (guard[i] != kPoison) {
        ADD_FAILURE() << what << ": the kernel wrote " << i << " bytes past the end of its output";
        return;
      }
    }
  }
};

// ---- edge inputs -----------------------------------------------------------------------------------------

enum class Pattern { Zeros, Constant, Saturated, MaxMagnitude, Outlier, Tiny, BlockScales };
constexpr Pattern kPatterns[] = {Pattern::Zeros,   Pattern::Constant, Pattern::Saturated,  Pattern::MaxMagnitude,
                                 Pattern::Outlier, Pattern::Tiny,     Pattern::BlockScales};
constexpr float kLargestHalf = 65504.0f;  // every format's scale must still be finite for these inputs

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::Zeros: return "all-zero blocks";
    case Pattern::Constant: return "constant +1000 (min == max in every block)";
    case Pattern::Saturated: return "+-1000, random signs (every quant at an extreme)";
    case Pattern::MaxMagnitude: return "+-65504, random signs (largest half)";
    case Pattern::Outlier: return "Gaussian with one 30000 outlier in one block";
    case Pattern::Tiny: return "Gaussian * 1e-7 (scales in the fp16 subnormal range)";
    case Pattern::BlockScales: return "Gaussian with a different power-of-ten scale per block";
  }
  return "?";
}

std::vector<float> make_pattern(Pattern p, Rng& rng, int64_t n, int64_t block_size) {
  std::vector<float> x(static_cast<size_t>(n), 0.0f);
  auto sign = [&] { return (rng.bits() & 1) ? 1.0f : -1.0f; };
  switch (p) {
    case Pattern::Zeros: break;
    case Pattern::Constant: std::fill(x.begin(), x.end(), 1000.0f); break;
    case Pattern::Saturated:
      for (float& f : x) f = 1000.0f * sign();
      break;
    case Pattern::MaxMagnitude:
      for (float& f : x) f = kLargestHalf * sign();
      break;
    case Pattern::Outlier: {
      x = gaussian(rng, n);
      const int64_t block = (n / block_size) / 2;
      x[size_t(block * block_size + block_size / 3)] = 30000.0f;
      break;
    }
    case Pattern::Tiny: x = gaussian(rng, n, 1e-7f); break;
    case Pattern::BlockScales:
      x = gaussian(rng, n);
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= std::pow(10.0f, float((i / block_size) % 7) - 3.0f);
      break;
  }
  return x;
}

// ---- the tests -------------------------------------------------------------------------------------------

TEST_P(KernelTest, TableEntriesFollowTheContract) {
  EXPECT_NE(kernels().quantize, nullptr);
  EXPECT_NE(kernels().dequantize, nullptr);
  // Activation-only types (Q8_1, Q8_K) have no dot of their own, at any ISA.
  EXPECT_EQ(kernels().vec_dot == nullptr, traits().vec_dot == nullptr);
}

TEST_P(KernelTest, VecDotMatchesReference) {
  const TypeTraits& t = traits();
  if (t.vec_dot == nullptr) return;  // activation-only type: TableEntriesFollowTheContract covers it
  for (int64_t n : row_lengths(t)) {
    for (int trial = 0; trial < 2; ++trial) {
      const std::vector<uint8_t> qx = quantize_ref(t.type, gaussian(rng_, n));
      const std::vector<uint8_t> qy = quantize_ref(t.vec_dot_type, gaussian(rng_, n));
      expect_dot_close(qx, qy, n, "Gaussian trial " + std::to_string(trial));
    }
  }
}

TEST_P(KernelTest, QuantizeIsByteIdentical) {
  for (int64_t n : row_lengths(traits())) {
    for (float sigma : {1e-3f, 1.0f, 300.0f}) {
      expect_quantize_identical(gaussian(rng_, n, sigma), "Gaussian sigma " + std::to_string(sigma));
    }
  }
}

TEST_P(KernelTest, DequantizeIsBitIdentical) {
  const TypeTraits& t = traits();
  for (int64_t n : row_lengths(t)) {
    expect_dequantize_identical(quantize_ref(t.type, gaussian(rng_, n)), n, false, "quantized Gaussian");
    // Random bytes reach encodings the quantizers never emit (every scale bit pattern, inf/NaN scales).
    std::vector<uint8_t> q(quant::row_size(t.type, n));
    for (uint8_t& b : q) b = uint8_t(rng_.bits());
    expect_dequantize_identical(q, n, true, "random bytes");
  }
}

TEST_P(KernelTest, EdgeInputs) {
  const TypeTraits& t = traits();
  for (int64_t blocks : {1, 3, 16}) {
    const int64_t n = blocks * (t.block_size == 1 ? 37 : t.block_size);
    for (Pattern p : kPatterns) {
      const std::string what = pattern_name(p);
      const std::vector<float> x = make_pattern(p, rng_, n, t.block_size);
      expect_quantize_identical(x, what);
      const std::vector<uint8_t> qx = quantize_ref(t.type, x);
      expect_dequantize_identical(qx, n, false, what);
      if (t.vec_dot == nullptr) continue;
      const std::vector<uint8_t> qy_edge = quantize_ref(t.vec_dot_type, make_pattern(p, rng_, n, t.block_size));
      expect_dot_close(qx, quantize_ref(t.vec_dot_type, gaussian(rng_, n)), n, what + " as x");
      expect_dot_close(quantize_ref(t.type, gaussian(rng_, n)), qy_edge, n, what + " as y");
      expect_dot_close(qx, qy_edge, n, what + " as x and y");
    }
  }
}

// The Q8_K activation quantizer over a block with NaNs (a hidden state gone NaN): as the reference, the scale comes
// from the largest number (NaNs skipped) and each NaN quantizes to 0; the AVX2 kernel's max took a NaN's lane from
// the NaN onward (5, NaN, 1 in one lane gave the scale of 1) and wrote -128 for NaNs, outside the dot kernels'
// -127..127.
TEST_P(KernelTest, Q8KQuantizeSkipsNaNs) {
  if (traits().type != quant::Type::Q8_K) return;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> lane(256, 0.0f);  // elements 0, 32 and 64 share a lane of the 8-wide max
  lane[0] = 5.0f;
  lane[32] = nan;
  lane[64] = 1.0f;
  expect_quantize_identical(lane, "5, NaN, 1 in one lane");
  std::vector<float> x = gaussian(rng_, 3 * 256);
  for (size_t i : {size_t(7), size_t(255), size_t(256 + 100), size_t(2 * 256 + 248)}) x[i] = (i % 2 ? -nan : nan);
  expect_quantize_identical(x, "Gaussian with NaNs, one the last of its lane");
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KernelTest);  // a CPU without AVX2 has no cases
INSTANTIATE_TEST_SUITE_P(AllTypes, KernelTest, testing::ValuesIn(all_cases()), case_name);

// ---- 16-bit element types: every bit pattern ---------------------------------------------------------------

// F16 and BF16 (block size 1, 2 bytes) are small enough to test exhaustively: all 65536 encodings
// dequantize bit-identically (signalling NaNs, subnormals, infinities included), and quantization
// rounds like the reference on every rounding boundary of the format.
class HalfTest : public KernelTest {};

std::vector<KernelCase> half_cases() {
  std::vector<KernelCase> cases;
  for (const KernelCase& c : all_cases()) {
    const TypeTraits& t = quant::traits(c.type);
    if (t.block_size == 1 && t.type_size == 2) cases.push_back(c);
  }
  return cases;
}

TEST_P(HalfTest, DequantizeEveryBitPattern) {
  std::vector<uint8_t> q(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = uint16_t(h);
    std::memcpy(q.data() + 2 * h, &v, 2);
  }
  expect_dequantize_identical(q, 65536, false, "all 65536 encodings");
}

TEST_P(HalfTest, QuantizeEveryRoundingBoundary) {
  std::vector<float> x;
  // Each 16-bit high half with low halves around the bf16 and fp16 rounding points (ties with even and
  // odd kept bits, one below and above), zero and all-ones: all exponents, both signs, infinities and
  // NaNs with assorted payloads.
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo :
         {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x2fffu, 0x3000u, 0x3001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      uint32_t u = (hi << 16) | lo;
      float f;
      std::memcpy(&f, &u, 4);
      x.push_back(f);
    }
  }
  // Exact midpoints between adjacent representable values of this type (a tie at every exponent,
  // including the type's subnormals, which the patterns above miss for fp16) and their float neighbours.
  const TypeTraits& t = traits();
  std::vector<uint8_t> all(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = uint16_t(h);
    std::memcpy(all.data() + 2 * h, &v, 2);
  }
  const std::vector<float> values = dequantize_ref(t.type, all, 65536);
  for (uint32_t h = 0; h + 1 < 65536; ++h) {
    const float a = values[h];
    const float b = values[h + 1];
    if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) continue;
    const float mid = float((double(a) + double(b)) / 2.0);  // exact: one bit more than the type holds
    x.push_back(mid);
    x.push_back(std::nextafter(mid, -std::numeric_limits<float>::infinity()));
    x.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  for (int i = 0; i < (1 << 20); ++i) {
    const uint32_t u = uint32_t(rng_.bits());
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  expect_quantize_identical(x, "rounding boundaries and random bit patterns");
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HalfTest);
INSTANTIATE_TEST_SUITE_P(ElementTypes, HalfTest, testing::ValuesIn(half_cases()), case_name);

// ---- ISA coverage ------------------------------------------------------------------------------------------

// One test per SIMD ISA. When the CPU lacks the ISA none of its kernels ran: the test is SKIPPED (listed
// as such in the summary) so a run on such a machine is never mistaken for a pass of those kernels.
void expect_isa_tested(Isa isa) {
  if (!cpu::isa_supported(isa)) {
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << ": its kernels were NOT tested";
  }
  // Every type of the table has test cases for this ISA.
  const auto cases = all_cases();
  const auto tested = std::count_if(cases.begin(), cases.end(), [&](const KernelCase& c) { return c.isa == isa; });
  EXPECT_EQ(size_t(tested), quant::all_types().size());
}

TEST(IsaCoverage, Avx2KernelsTested) { expect_isa_tested(Isa::kAvx2); }
TEST(IsaCoverage, Avx512KernelsTested) { expect_isa_tested(Isa::kAvx512); }

}  // namespace
}  // namespace magnetar
