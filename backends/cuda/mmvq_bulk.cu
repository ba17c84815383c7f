// The experts' products of decode with the weights streamed into shared memory by bulk copies
// (GroupedMatvecArgs::bulk; sm_90's cp.async.bulk, completed on mbarriers): one token's gate/up, and several tokens'
// gate/up and down.
//
// Why: the stationary kernel's SwiGLU launch (mmvq.cu) is 1,536 CTAs of 4 rows on the 30B-A3B geometry (8 experts x
// 768 rows of gate and up, 2,048 Q4_K columns: 14.2 MB), two waves of them. A CTA learns its expert only after
// waiting for the router's product and ranking its logits; then its weights' HBM latency follows, and the second
// wave's CTAs pay both again. The launch took 12.5 us per layer (9.4 of the step's span) for 14.2 MB: ~1.5 TB/s.
// Here a CTA takes many rows, one wave of CTAs covers the launch (two CTAs of 8 warps per SM: 24 rows of gate and of
// up each on the 30B-A3B geometry), and thread 0 asks for all of the CTA's gate and up rows at once right after the
// routing (a bulk copy per matrix and chunk: no registers held, every byte in flight); the warps compute each chunk as
// its barrier completes.
//
// Measured (H200, 2026-12-02, docs/benchmarks/2026-12-02-cuda-decode-bulk-experts.md): tg128 +1.8% with the first
// Q4_K part dot (534.8 / 535.7 against 525.0 / 526.6), +4% with the present one (570.6 / 570.2 / 571.2 against
// 547.2 / 543.9 / 549.2). One CTA per SM (48 rows each) was slower (491), three or four per SM (16 or 12 rows, one
// unit per warp at 64-67 registers) alike or slower (557-564 against 564-569). ncu (first dot): 11.65 us in isolation,
// issue slots 31% busy at 21% occupancy, 1.22 TB/s: after the copies land the warps' arithmetic sets the time, hence
// the part dot's instruction count matters here (mmvq.cuh).
//
// The batched decode of several sessions (one item per token and slot) has more rows than one wave of CTAs stages at
// once: staged all at once, its CTAs were too long (697 t/s for 4 sessions against 739 on the stationary kernel). The
// ring kernel below streams them through a ring of stages, for gate/up and for the down projection of the SwiGLU's
// float rows (H200, 2026-12-03, docs/benchmarks/2026-12-03-cuda-batched-bulk-ring.md): gate/up 1,008 instead of
// 1,122 us of a 4-session step, down 389 instead of 620; 1,050 / 1,307 t/s in all for 4 / 8 sessions against
// 976 / 1,180 on the stationary kernel.
//
// Each row's sum is the stationary kernel's (its kGlu launch's shape: the same parts per lane, the same products in
// the same order, the same warp tree over the same kQ kR rows of gate and up): the same bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/grouping.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/mmvq.cuh"
#include "backends/cuda/ops_common.cuh"
#include "backends/cuda/quantize_q8.cuh"
#include "backends/cuda/route_topk.cuh"

namespace magnetar::cuda::detail {
namespace {

using ops::kWarpSize;
using quant::Type;

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxChunks = 16;  // barriers per CTA (the kernel that stages all of a CTA's rows at once)
constexpr int kMaxStages = 4;   // the ring kernel's stages (a full and an empty barrier each)
constexpr int kLogitsPerLane = kMaxRoutedExperts / kWarpSize;
constexpr size_t kMaxSmem = 200 * 1024;
// The ring kernel's shared memory: two CTAs per SM (228 KB on sm_90, 1 KB of it reserved per CTA).
constexpr size_t kRingSmem = 110 * 1024;
constexpr int kCtasPerSm = 2;  // the wave aimed at (the kernel's launch bounds: at most 128 registers)

// A warp's row units per chunk (a unit: kQ kR rows of gate and of up, the stationary kernel's warp of a SwiGLU launch):
// 2 where their weight parts (2 kR kJ a unit) are at most 4, so that a lane loads up to 8 parts from shared memory
// before it uses any; else 1.
__host__ __device__ constexpr int bulk_units(int kJ, int kQ) {
  return 2 * mmvq::stationary_groups(kJ, kQ, true) * kJ <= 4 ? 2 : 1;
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}
// One arrival on bar, announcing the bytes its copies will bring (0: none).
__device__ __forceinline__ void barrier_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// One arrival on bar (release: the thread's shared-memory reads before it are done).
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}
// bytes (a multiple of 16, both ends 16-byte aligned) from global src to this CTA's shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_address(dst)), "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
// Until the barrier's phase of this parity has completed (for a full barrier: its copies have landed and are visible
// to the waiting thread).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
#endif

// A warp's units over staged rows (a unit: kQ kR rows, the stationary kernel's warp; kGlu: of gate and of up, a
// SwiGLU launch): load() takes its weight parts from shared memory (rows of matrix m at mat[m], row_bytes apart; the
// warp's first row base; rows past n_rows - 1 read the last one), compute() writes each of its rows below n_rows at
// out[row]: silu(gate) * up, or the plain sum.
template <Type T, int kJ, int kQ, bool kGlu>
struct Units {
  using Ops = mmvq::MmvqType<T>;
  static constexpr int kM = kGlu ? 2 : 1;  // matrices
  static constexpr int kR = mmvq::stationary_groups(kJ, kQ, kGlu);
  static constexpr int kUnits = kGlu ? bulk_units(kJ, kQ) : 1;
  static constexpr int kUnitRows = kQ * kR;
  static constexpr int kSums = kM * kUnitRows;
  static constexpr int kChunkRows = kWarps * kUnits * kUnitRows;  // a chunk: every warp's units
  using Parts = typename Ops::WeightPart[kUnits][kM][kR][kJ];

  static __device__ __forceinline__ void load(Parts& w, const uint8_t* const (&mat)[kM], size_t row_bytes, int base,
                                              int n_rows, const mmvq::LaneParts<kJ>& lp) {
    using Block = typename Ops::Block;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const int row = min(base + u * kUnitRows + r * kQ + lp.row_of[j], n_rows - 1);
            const Block* blocks = reinterpret_cast<const Block*>(mat[m] + size_t(row) * row_bytes);
            w[u][m][r][j] = Ops::load_part(blocks[lp.block[j]], lp.part[j]);
          }
        }
      }
    }
  }

  static __device__ __forceinline__ void compute(const Parts& w, const typename Ops::ActPart (&x)[kJ],
                                                 const mmvq::LaneParts<kJ>& lp, int base, int n_rows, int lane,
                                                 float* out) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int first = base + u * kUnitRows;
      if (first >= n_rows) break;  // uniform over the warp
      float acc[kSums];
#pragma unroll
      for (int i = 0; i < kSums; ++i) acc[i] = 0.0f;
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const float v = Ops::dot_loaded(w[u][m][r][j], x[j], lp.part[j]);
            if constexpr (kQ == 1) {
              acc[m * kUnitRows + r] += v;
            } else {
#pragma unroll
              for (int q = 0; q < kQ; ++q) acc[m * kUnitRows + r * kQ + q] += lp.row_of[j] == q ? v : 0.0f;
            }
          }
        }
      }
      const float sum = ops::warp_sums(acc, lane);
      const int row = first + ops::warp_sums_index<kSums>(lane) % kUnitRows;
      if constexpr (kGlu) {
        const float up = __shfl_xor_sync(0xffffffffu, sum, kWarpSize / 2);  // the first stage split gate from up
        if (lane < kWarpSize / 2 && (lane & (kWarpSize / kSums - 1)) == 0 && row < n_rows) {
          out[row] = ops::silu_mul(sum, up);
        }
      } else if ((lane & (kWarpSize / kSums - 1)) == 0 && row < n_rows) {
        out[row] = sum;
      }
    }
  }
};

// The routed launch (GroupedMatvecArgs::route: one token's k slots), all of a CTA's rows staged at once. Grid
// (ceil(rows / rows_per_cta), k). CTA (x, y) computes rows [x rows_per_cta, + rows_per_cta) of slot k - 1 - y's gate
// and up and writes silu(gate) * up there. Shared memory: the CTA's gate rows, then its up rows, in chunks of
// kWarps kUnits units (bulk_units); warp w takes units w kUnits .. of each chunk.
template <Type T, int kJ, int kQ>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    mmvq_bulk_glu_kernel(int rows, int items, size_t row_bytes, int rows_per_cta, const uint8_t* __restrict__ act,
                         size_t act_row_bytes, float* __restrict__ y, Grouping g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Ops = mmvq::MmvqType<T>;
  using Act = typename Ops::Act;
  using U = Units<T, kJ, kQ, true>;
  constexpr int kUnits = U::kUnits;
  constexpr int kUnitRows = U::kUnitRows;
  constexpr int kChunkRows = U::kChunkRows;
  extern __shared__ __align__(128) uint8_t staged[];
  __shared__ uint64_t full[kMaxChunks];
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int r0 = int(blockIdx.x) * rows_per_cta;
  const int n_rows = min(rows_per_cta, rows - r0);
  const int n_chunks = (n_rows + kChunkRows - 1) / kChunkRows;
  if (threadIdx.x == 0) {
    for (int c = 0; c < n_chunks; ++c) barrier_init(&full[c], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  ops::pdl_wait();
  ops::pdl_trigger();

  // The slot's expert: warp 0 ranks the logits as the stationary kernel does (slots in reverse over blockIdx.y), and
  // only its thread 0 needs the expert.
  const uint8_t* mat[2] = {nullptr, nullptr};
  const int row0 = g.route.k - 1 - int(blockIdx.y);
  int route_lane_id = 0;
  const bool route_writer = g.route.ids != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && warp == 0;
  if (warp == 0) {
    const auto logits = route::warp_logits<kLogitsPerLane>(g.route.logits, g.route.n_expert, lane);
    const int e = route::warp_top(logits, g.route.n_expert, row0 + 1, lane, &route_lane_id);
    const uint8_t* expert = static_cast<const uint8_t*>(g.route.base) + size_t(e) * g.route.stride;
    mat[0] = expert + g.route.offset[g.part];
    mat[1] = expert + g.route.offset[g.part + 1];
  }
  uint8_t* const up_rows = staged + size_t(rows_per_cta) * row_bytes;
  if (threadIdx.x == 0) {
    for (int c = 0; c < n_chunks; ++c) {
      const int first = c * kChunkRows;
      const uint32_t bytes = uint32_t(size_t(min(kChunkRows, n_rows - first)) * row_bytes);
      const size_t from = size_t(r0 + first) * row_bytes;
      barrier_expect(&full[c], 2 * bytes);
      bulk_copy(staged + size_t(first) * row_bytes, mat[0] + from, bytes, &full[c]);
      bulk_copy(up_rows + size_t(first) * row_bytes, mat[1] + from, bytes, &full[c]);
    }
  }
  if (route_writer) {  // after its copies are asked for (mmvq.cu's stationary kernel writes the same)
    route::write_routes<kLogitsPerLane>(g.route, lane, route_lane_id);
  }

  // The lane's activation parts (the stationary kernel's: part f = lane + 32 j of a row group).
  const Act* a = reinterpret_cast<const Act*>(act + group_act_row(g, row0) * act_row_bytes);
  const auto lp = mmvq::lane_parts<kJ, Ops::kParts>(lane, items);
  typename Ops::ActPart x[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) x[j] = Ops::act_part(a[lp.block[j]], lp.part[j]);
  y += size_t(row0) * size_t(rows);
  for (int c = 0; c < n_chunks; ++c) {
    const int base = c * kChunkRows + warp * kUnits * kUnitRows;  // the warp's first row in the chunk (CTA-local)
    if (base >= n_rows) break;  // whole warps; every copy has a waiter in warp 0 (base 0 of each chunk)
    barrier_wait(&full[c], 0);
    typename U::Parts w;
    U::load(w, {staged, up_rows}, row_bytes, base, n_rows, lp);
    U::compute(w, x, lp, base, n_rows, lane, y + r0);
  }
#endif
}

// The rows of a ring kernel's CTA, one after another in the space of every item's rows (item i's row r at i rows + r),
// taken in chunks of at most kChunkRows rows of one item: the chunk at f has count(f) rows.
struct Span {
  int f0, f1;  // [f0, f1)
  int rows;    // an item's rows
  __device__ int count(int f, int chunk) const { return min(chunk, min(f1 - f, rows - f % rows)); }
};

// The items' launches (GroupedMatvecArgs::items, not routed) of decode where their rows exceed what one wave of CTAs
// stages at once (the batched decode of several sessions: one item per token and slot; 4 tokens' 32 items on the
// 30B-A3B geometry are ~3.4 times the SMs' shared memory): a SwiGLU launch of gate and up (kGlu) or a plain one whose
// activations are float rows (the down projection of the SwiGLU rows, MatvecLaunch::act_float). Grid
// (ceil(n_items rows / rows_per_cta)): CTA x takes rows [x rows_per_cta, + rows_per_cta) of all items' rows one after
// another (it may straddle items) and writes each row's result at y[row0 rows + r] for its item's output row row0 (a
// null item's rows: nothing). The weights stream through a ring of n_stages stages, each one chunk's rows of each
// matrix (kM kChunkRows rows): thread 0 asks for the first n_stages chunks at once (before waiting for the kernel
// before this one where the items are settled: GroupedMatvecArgs::items_settled) and for chunk c + n_stages once
// every thread has read chunk c from its stage (the stage's empty barrier); the warps compute each chunk when its
// full barrier completes, with the units of the kernel above (Units: every row's sum the stationary kernel's bits).
// Float activations are quantized into shared memory per item as the stationary kernel does (a warp per Q8_K block).
template <Type T, int kJ, int kQ, bool kGlu>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    mmvq_bulk_ring_kernel(int rows, int items, size_t row_bytes, int rows_per_cta, int n_stages,
                          const uint8_t* __restrict__ act, size_t act_row_bytes, float* __restrict__ y, Grouping g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using U = Units<T, kJ, kQ, kGlu>;
  using Ops = mmvq::MmvqType<T>;
  using Act = typename Ops::Act;
  constexpr int kM = U::kM;
  constexpr int kChunkRows = U::kChunkRows;
  static_assert(kGlu || std::is_same_v<Act, quant::BlockQ8_K>, "float activations quantize to Q8_K");
  extern __shared__ __align__(128) uint8_t staged[];
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ int f_ask;  // thread 0: the next chunk to ask for (here, not in a register through the loop)
  const int warp = int(threadIdx.x) / kWarpSize;
  const int lane = int(threadIdx.x) % kWarpSize;
  Span span{.f0 = int(blockIdx.x) * rows_per_cta, .f1 = 0, .rows = rows};
  span.f1 = min(span.f0 + rows_per_cta, g.n_items * rows);
  int n_chunks = 0;
  for (int f = span.f0; f < span.f1; f += span.count(f, kChunkRows)) ++n_chunks;
  const size_t stage_bytes = size_t(kM) * size_t(kChunkRows) * row_bytes;
  // Thread 0: the copies of the chunk at f_ask into stage s (an arrival without bytes for a null item's chunk).
  const auto ask = [&](int s) {
    const int f = f_ask;
    const int n = span.count(f, kChunkRows);
    f_ask = f + n;
    const GroupItem& item = g.items[f / rows];
    if (item.w[g.part] == nullptr) {
      barrier_expect(&full[s], 0);
      return;
    }
    const uint32_t bytes = uint32_t(size_t(n) * row_bytes);
    const size_t from = size_t(f % rows) * row_bytes;
    uint8_t* const dst = staged + size_t(s) * stage_bytes;
    barrier_expect(&full[s], kM * bytes);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      bulk_copy(dst + size_t(m) * kChunkRows * row_bytes, static_cast<const uint8_t*>(item.w[g.part + m]) + from,
                bytes, &full[s]);
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < n_stages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    f_ask = span.f0;
    if (g.items_settled) {
      for (int s = 0; s < min(n_stages, n_chunks); ++s) ask(s);
    }
  }
  __syncthreads();
  ops::pdl_wait();
  ops::pdl_trigger();
  if (threadIdx.x == 0 && !g.items_settled) {
    for (int s = 0; s < min(n_stages, n_chunks); ++s) ask(s);
  }

  // Float activations: the item's row quantized here, after the ring's stages.
  Act* const act_q = reinterpret_cast<Act*>(staged + size_t(n_stages) * stage_bytes);
  const auto lp = mmvq::lane_parts<kJ, Ops::kParts>(lane, items);
  typename Ops::ActPart x[kJ];
  int x_item = -1;  // the item whose activation parts x holds
  int f = span.f0;
  for (int c = 0; c < n_chunks; ++c) {
    const int s = c % n_stages;
    const uint32_t parity = uint32_t(c / n_stages) & 1u;
    const int item = f / rows, n_rows = span.count(f, kChunkRows);
    const GroupItem& it = g.items[item];
    const int row0 = it.row0;
    const bool present = it.w[g.part] != nullptr;  // uniform over the CTA
    const int base = warp * U::kUnits * U::kUnitRows;  // the warp's first row in the chunk
    const bool busy = present && base < n_rows;        // uniform over the warp
    // The lane's activation parts (the stationary kernel's: part lane + 32 j of a row).
    if (present && x_item != item) {
      const uint8_t* row = act + group_act_row(g, row0) * act_row_bytes;
      const Act* a = reinterpret_cast<const Act*>(row);
      if constexpr (!kGlu) {  // uniform over the CTA: every thread has read the previous item's parts
        __syncthreads();
        q8::row_q8_k_warps(reinterpret_cast<const float*>(row), act_q, items / Ops::kParts, warp, kWarps, lane);
        __syncthreads();
        a = act_q;
      }
#pragma unroll
      for (int j = 0; j < kJ; ++j) x[j] = Ops::act_part(a[lp.block[j]], lp.part[j]);
      x_item = item;
    }
    barrier_wait(&full[s], parity);
    const uint8_t* const first = staged + size_t(s) * stage_bytes;
    typename U::Parts w;
    if (busy) {
      const uint8_t* mat[kM];
#pragma unroll
      for (int m = 0; m < kM; ++m) mat[m] = first + size_t(m) * kChunkRows * row_bytes;
      U::load(w, mat, row_bytes, base, n_rows, lp);
    }
    if (c + n_stages < n_chunks) {  // the stage's next chunk, once every thread has read this one (uniform)
      barrier_arrive(&empty[s]);
      if (threadIdx.x == 0) {
        barrier_wait(&empty[s], parity);
        ask(s);
      }
    }
    if (busy) U::compute(w, x, lp, base, n_rows, lane, y + size_t(row0) * size_t(rows) + f % rows);
    f += n_rows;
  }
#endif
}

// Whether this binary's bulk kernel has a body: compiled for sm_90 or newer (a build for older GPUs only, run on a
// newer one through its PTX, has the empty kernel; code for sm_90 loads on sm_90 devices and newer only). As
// rms_norm.cu's cluster_kernel_built.
bool bulk_kernel_built() {
  static const bool built = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, mmvq_bulk_glu_kernel<Type::Q4_K, 2, 1>) == cudaSuccess &&
           attr.ptxVersion >= 90;
  }();
  return built;
}

// The SMs of the current device, once kKernel may take smem bytes of dynamic shared memory there (set once per device
// and thread).
template <auto kKernel>
int prepare(size_t smem) {
  thread_local int configured_device = -1;
  thread_local int sms = 1;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (configured_device != device) {
    CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    configured_device = device;
  }
  return std::max(sms, 1);
}

template <Type T, int kJ, int kQ>
bool launch_bulk(const MatvecLaunch& a, int items, cudaStream_t stream) {
  using U = Units<T, kJ, kQ, true>;
  constexpr int kUnitRows = U::kUnitRows;
  constexpr auto kernel = mmvq_bulk_glu_kernel<T, kJ, kQ>;
  const int sms = prepare<kernel>(kMaxSmem);
  // One wave of about kCtasPerSm CTAs per SM: the rows of every item shared out, in whole units, at most an item's.
  const auto units = [](int64_t r) { return (r + kUnitRows - 1) / kUnitRows * kUnitRows; };
  const int64_t items_rows = a.rows * int64_t(a.group.n_items);
  const int64_t target = int64_t(sms) * kCtasPerSm;
  const int64_t by_smem = int64_t(kMaxSmem / (2 * a.row_bytes)) / kUnitRows * kUnitRows;
  const int64_t per_cta = std::min({units((items_rows + target - 1) / target), units(a.rows), by_smem,
                                    int64_t(kMaxChunks) * U::kChunkRows});
  if (per_cta < kUnitRows) return false;
  const dim3 grid(unsigned((a.rows + per_cta - 1) / per_cta), unsigned(a.group.n_items));
  CUDA_CHECK(ops::launch(kernel, grid, kThreads, size_t(2 * per_cta) * a.row_bytes, stream, int(a.rows), items,
                         a.row_bytes, int(per_cta), static_cast<const uint8_t*>(a.act), a.act_row_bytes, a.y, a.group));
  return true;
}

template <Type T, int kJ, int kQ, bool kGlu>
bool launch_ring(const MatvecLaunch& a, int items, cudaStream_t stream) {
  using U = Units<T, kJ, kQ, kGlu>;
  constexpr auto kernel = mmvq_bulk_ring_kernel<T, kJ, kQ, kGlu>;
  const int sms = prepare<kernel>(kRingSmem);
  // One wave of about kCtasPerSm CTAs per SM, the rows of all items shared out in whole units; as many stages as fit
  // next to the float activations' quantized row (at most the chunks a CTA walks: its rows in chunks, one more where
  // it straddles two items).
  const int64_t items_rows = a.rows * int64_t(a.group.n_items);
  const size_t stage_bytes = size_t(U::kM) * size_t(U::kChunkRows) * a.row_bytes;
  const size_t act_bytes = kGlu ? 0 : size_t(items / mmvq::MmvqType<T>::kParts) * sizeof(quant::BlockQ8_K);
  const int64_t target = int64_t(sms) * kCtasPerSm;
  const int64_t per_cta = (items_rows + target - 1) / target;
  const int64_t rows_per_cta = (per_cta + U::kUnitRows - 1) / U::kUnitRows * U::kUnitRows;
  const int64_t stages = std::min({int64_t(kMaxStages), int64_t((kRingSmem - act_bytes) / stage_bytes),
                                   (rows_per_cta + U::kChunkRows - 1) / U::kChunkRows + 1});
  if (act_bytes >= kRingSmem || stages < 1 || items_rows > INT32_MAX / 2) return false;
  const dim3 grid(unsigned((items_rows + rows_per_cta - 1) / rows_per_cta));
  CUDA_CHECK(ops::launch(kernel, grid, kThreads, size_t(stages) * stage_bytes + act_bytes, stream, int(a.rows), items,
                         a.row_bytes, int(rows_per_cta), int(stages), static_cast<const uint8_t*>(a.act),
                         a.act_row_bytes, a.y, a.group));
  return true;
}

// A routed SwiGLU launch: the kernel that stages all of a CTA's rows at once; items: the ring kernel.
template <Type T, int kJ, int kQ>
bool launch_shape(const MatvecLaunch& a, int items, cudaStream_t stream) {
  if (!a.swiglu) return launch_ring<T, kJ, kQ, false>(a, items, stream);
  return a.group.route.logits != nullptr ? launch_bulk<T, kJ, kQ>(a, items, stream)
                                         : launch_ring<T, kJ, kQ, true>(a, items, stream);
}

}  // namespace

bool launch_mmvq_bulk(Type type, const MatvecLaunch& a, CUstream_st* stream) {
  // A SwiGLU launch of gate and up (quantized activations), or a plain one of float activations over items.
  const bool glu = a.swiglu && !a.act_float && a.group.n_parts == 2;
  const bool plain = !a.swiglu && a.act_float && a.group.n_parts == 1 && a.group.items != nullptr;
  // The kernels take up to kMaxSmem of shared memory a CTA: not on GPUs of 99 KB (the RTX 50 series: sm_120).
  if (type != Type::Q4_K || !(glu || plain) || a.n_vectors != 1 || !grouped(a.group) || a.row_bytes % 16 != 0 ||
      !bulk_kernel_built() || ops::smem_optin() < kMaxSmem) {
    return false;
  }
  const int items = int(a.row_bytes / sizeof(quant::BlockQ4_K)) * mmvq::MmvqType<Type::Q4_K>::kParts;
  const mmvq::StationaryShape s = mmvq::stationary_shape(items);
  // Rows of at most 3 parts per lane (up to 3,072 columns): with more, a warp's weight and activation parts exceed the
  // 128 registers of two CTAs per SM (ptxas spills from kJ = 4 on).
  switch (s.kQ * 16 + s.kJ) {
    case 16 + 1: return launch_shape<Type::Q4_K, 1, 1>(a, items, stream);
    case 16 + 2: return launch_shape<Type::Q4_K, 2, 1>(a, items, stream);
    case 16 + 3: return launch_shape<Type::Q4_K, 3, 1>(a, items, stream);
    case 32 + 1: return launch_shape<Type::Q4_K, 1, 2>(a, items, stream);
    case 32 + 3: return launch_shape<Type::Q4_K, 3, 2>(a, items, stream);
    case 64 + 1: return launch_shape<Type::Q4_K, 1, 4>(a, items, stream);
    case 64 + 3: return launch_shape<Type::Q4_K, 3, 4>(a, items, stream);
    default: return false;
  }
}

}  // namespace magnetar::cuda::detail
