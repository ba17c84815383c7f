// Quant kernel microbenchmarks (Google Benchmark), one per (operation, type, ISA the CPU supports):
//   dequant/<TYPE>/<isa>    dequantize a weight matrix row by row into one float row
//   dot/<TYPE>/<isa>        vec_dot of every row of the matrix with one activation vector (a decode-step
//                           matrix-vector product on one thread)
//   dot_l2/<TYPE>/<isa>     the same over the first kL2Bytes of the matrix, repeated: the rows stay in L2,
//                           so this is the kernel's compute ceiling; dot far below dot_l2 means DRAM-bound
//   dot_2tok/<TYPE>/<isa>   vec_dot of every row with two activation vectors, row by row (a prefill step of
//                           two tokens as single dots); dot_2tok_l2 the same over cache-resident rows
//   dot2x2/<TYPE>/<isa>     the same products through vec_dot_2x2, two rows x two tokens per call;
//                           dot2x2_l2 over cache-resident rows (prefill's case: matmul re-reads a row tile
//                           from cache for every token pair, so dot2x2_l2 / dot_2tok_l2 is the prefill gain)
//   quantize/<TYPE>/<isa>   quantize one activation vector of kCols floats into a vec_dot_type
// "scalar" is the reference in quant/ref, measured in the same run as the SIMD kernels it is the baseline
// of. The label says when an ISA has no kernel of its own and falls back to a narrower one.
//
// Throughput is bytes of WEIGHTS per second for dequant and the dots (so GB/s compares directly with memory
// bandwidth; the two-token dots count each row once, for both tokens), and bytes of float input per second
// for quantize. The weight matrix is at least kMinMatrixBytes so that, as with MoE expert weights during
// decode, every row streams from DRAM rather than from cache. Times are CPU time of the one benchmark thread.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "quant/quant.h"

namespace magnetar {
namespace {

using cpu::Isa;
using quant::Type;
using quant::TypeTraits;

constexpr int64_t kCols = 4096;                       // row length: the hidden size of 7B-class models
constexpr size_t kMinMatrixBytes = size_t(64) << 20;  // 2x the 32 MiB L3 of the CPU box (docs/benchmarks)
constexpr int64_t kMinRows = 4096;                    // at least a 4096 x 4096 matrix for every type
constexpr size_t kL2Bytes = size_t(256) << 10;        // half the box's 512 KiB L2 per core: dot_l2 stays cached
constexpr int64_t kDistinctRows = 16;                 // rows quantized by the reference, then tiled
constexpr Isa kIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

std::vector<float> gaussian(std::mt19937_64& gen, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(gen);
  return v;
}

// A [rows, kCols] weight matrix of one type and a [kCols] activation of its vec_dot_type, both quantized
// by the reference. Rows repeat every kDistinctRows (quantizing 64 MiB with the slower reference
// quantizers would take longer than the benchmarks); the cache hierarchy sees distinct addresses anyway.
struct Matrix {
  Type type;
  int64_t rows = 0;
  size_t row_bytes = 0;
  std::vector<uint8_t> weights;     // [rows, row_bytes]
  std::vector<uint8_t> activation;  // [row_size(vec_dot_type, kCols)]
  std::vector<uint8_t> activation2;  // a second token's, same size
};

std::unique_ptr<Matrix> build_matrix(Type type) {
  const TypeTraits& t = quant::traits(type);
  auto m = std::make_unique<Matrix>();
  m->type = type;
  m->row_bytes = quant::row_size(type, kCols);
  m->rows = std::max<int64_t>(kMinRows, int64_t((kMinMatrixBytes + m->row_bytes - 1) / m->row_bytes));
  m->rows = (m->rows + kDistinctRows - 1) / kDistinctRows * kDistinctRows;
  m->weights.resize(size_t(m->rows) * m->row_bytes);
  std::mt19937_64 gen(uint64_t(type) + 1);
  const std::vector<float> source = gaussian(gen, kDistinctRows * kCols);
  t.from_float(source.data(), m->weights.data(), kDistinctRows * kCols);
  const size_t tile = size_t(kDistinctRows) * m->row_bytes;
  for (size_t off = tile; off < m->weights.size(); off += tile) {
    std::memcpy(m->weights.data() + off, m->weights.data(), tile);
  }
  m->activation.resize(quant::row_size(t.vec_dot_type, kCols));
  const std::vector<float> act = gaussian(gen, kCols);
  quant::traits(t.vec_dot_type).from_float(act.data(), m->activation.data(), kCols);
  m->activation2.resize(m->activation.size());
  const std::vector<float> act2 = gaussian(gen, kCols);
  quant::traits(t.vec_dot_type).from_float(act2.data(), m->activation2.data(), kCols);
  return m;
}

// Benchmarks are registered grouped by type, so keeping only the latest matrix bounds memory to one
// matrix (about kMinMatrixBytes) and builds each one once per run.
const Matrix& matrix(Type type) {
  static std::unique_ptr<Matrix> cached;
  if (!cached || cached->type != type) {
    cached.reset();
    cached = build_matrix(type);
  }
  return *cached;
}

// Empty when `isa` has a kernel of its own for this entry; otherwise says where the entry comes from.
std::string fallback_label(const void* fn, const void* narrower_fn, const void* ref_fn, Isa isa) {
  if (isa == Isa::kScalar || fn != narrower_fn) return "";
  return fn == ref_fn ? "fallback: scalar reference" : "fallback: avx2";
}

template <typename Fn>
std::string label_for(Type type, Isa isa, Fn cpu::TypeKernels::*field) {
  if (isa == Isa::kScalar) return "";
  const Isa narrower = isa == Isa::kAvx512 ? Isa::kAvx2 : Isa::kScalar;
  return fallback_label(reinterpret_cast<const void*>(cpu::kernels(type, isa).*field),
                        reinterpret_cast<const void*>(cpu::kernels(type, narrower).*field),
                        reinterpret_cast<const void*>(cpu::kernels(type, Isa::kScalar).*field), isa);
}

// ---- the benchmarks ---------------------------------------------------------------------------------------

void bm_dequant(benchmark::State& state, Type type, Isa isa) {
  const Matrix& m = matrix(type);
  const quant::ToFloatFn dequantize = cpu::kernels(type, isa).dequantize;
  std::vector<float> row(static_cast<size_t>(kCols));  // [kCols], stays in L1
  for (auto _ : state) {
    for (int64_t r = 0; r < m.rows; ++r) {
      dequantize(m.weights.data() + size_t(r) * m.row_bytes, row.data(), kCols);
    }
    benchmark::DoNotOptimize(row.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * m.rows * int64_t(m.row_bytes));
  state.SetLabel(label_for(type, isa, &cpu::TypeKernels::dequantize));
}

// cache_resident: only as many leading rows as fit in kL2Bytes (at least one).
void bm_dot(benchmark::State& state, Type type, Isa isa, bool cache_resident) {
  const Matrix& m = matrix(type);
  const quant::VecDotFn dot = cpu::kernels(type, isa).vec_dot;
  const int64_t rows = cache_resident ? std::max<int64_t>(1, int64_t(kL2Bytes / m.row_bytes)) : m.rows;
  for (auto _ : state) {
    float sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += dot(kCols, m.weights.data() + size_t(r) * m.row_bytes, m.activation.data());
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * rows * int64_t(m.row_bytes));
  state.SetLabel(label_for(type, isa, &cpu::TypeKernels::vec_dot));
}

// Two tokens: every row (or, cache_resident, the rows of kL2Bytes, an even number) times both activations,
// through vec_dot_2x2 (tile) or two vec_dot calls per row.
void bm_dot_2tok(benchmark::State& state, Type type, Isa isa, bool cache_resident, bool tile) {
  const Matrix& m = matrix(type);
  const cpu::TypeKernels& k = cpu::kernels(type, isa);
  const int64_t rows = cache_resident ? std::max<int64_t>(2, int64_t(kL2Bytes / m.row_bytes) / 2 * 2) : m.rows;
  const uint8_t* w = m.weights.data();
  const void* y0 = m.activation.data();
  const void* y1 = m.activation2.data();
  for (auto _ : state) {
    float sum = 0;
    if (tile) {
      for (int64_t r = 0; r < rows; r += 2) {
        float out[4];
        k.vec_dot_2x2(kCols, w + size_t(r) * m.row_bytes, w + size_t(r + 1) * m.row_bytes, y0, y1, out);
        sum += out[0] + out[1] + out[2] + out[3];
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        sum += k.vec_dot(kCols, w + size_t(r) * m.row_bytes, y0) + k.vec_dot(kCols, w + size_t(r) * m.row_bytes, y1);
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * rows * int64_t(m.row_bytes));
  // A type without a tile kernel of its own runs four vec_dot calls per tile (and says nothing here).
  state.SetLabel(tile ? label_for(type, isa, &cpu::TypeKernels::vec_dot_2x2)
                      : label_for(type, isa, &cpu::TypeKernels::vec_dot));
}

void bm_quantize(benchmark::State& state, Type type, Isa isa) {
  std::mt19937_64 gen(7);
  const std::vector<float> x = gaussian(gen, kCols);  // [kCols]
  std::vector<uint8_t> out(quant::row_size(type, kCols));
  const quant::FromFloatFn quantize = cpu::kernels(type, isa).quantize;
  for (auto _ : state) {
    quantize(x.data(), out.data(), kCols);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * kCols * int64_t(sizeof(float)));
  state.SetItemsProcessed(int64_t(state.iterations()) * kCols);
  state.SetLabel(label_for(type, isa, &cpu::TypeKernels::quantize));
}

std::string bench_name(const char* op, Type type, Isa isa) {
  return std::string(op) + "/" + std::string(quant::type_name(type)) + "/" + std::string(cpu::isa_name(isa));
}

void register_all() {
  for (const TypeTraits& t : quant::all_types()) {
    for (Isa isa : kIsas) {
      if (!cpu::isa_supported(isa)) continue;
      benchmark::RegisterBenchmark(bench_name("dequant", t.type, isa).c_str(), bm_dequant, t.type, isa)
          ->Unit(benchmark::kMillisecond);
    }
    if (t.vec_dot == nullptr) continue;  // activation-only types (Q8_1, Q8_K)
    for (Isa isa : kIsas) {
      if (!cpu::isa_supported(isa)) continue;
      benchmark::RegisterBenchmark(bench_name("dot", t.type, isa).c_str(), bm_dot, t.type, isa, false)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(bench_name("dot_l2", t.type, isa).c_str(), bm_dot, t.type, isa, true)
          ->Unit(benchmark::kMicrosecond);
      for (bool tile : {false, true}) {
        const char* name = tile ? "dot2x2" : "dot_2tok";
        const std::string name_l2 = std::string(name) + "_l2";
        benchmark::RegisterBenchmark(bench_name(name, t.type, isa).c_str(), bm_dot_2tok, t.type, isa, false, tile)
            ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(bench_name(name_l2.c_str(), t.type, isa).c_str(), bm_dot_2tok, t.type, isa, true,
                                     tile)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // Activation formats: every vec_dot_type the table uses, each once.
  std::vector<Type> activation_types;
  for (const TypeTraits& t : quant::all_types()) {
    if (std::find(activation_types.begin(), activation_types.end(), t.vec_dot_type) == activation_types.end()) {
      activation_types.push_back(t.vec_dot_type);
    }
  }
  for (Type type : activation_types) {
    for (Isa isa : kIsas) {
      if (!cpu::isa_supported(isa)) continue;
      benchmark::RegisterBenchmark(bench_name("quantize", type, isa).c_str(), bm_quantize, type, isa)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace magnetar

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  magnetar::register_all();
  benchmark::AddCustomContext("matrix", "4096 columns, >= max(4096 rows, 64 MiB of weights), row by row");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
