// What a stage transition of the decode step costs on the GPU: a dependent launch (how the forward pass chains its
// kernels) against a barrier of every CTA inside one persistent launch (how a "megakernel" would chain them).
//   sync_launches/ctas:C      a graph of kStages launches of C CTAs, each waiting for the launch before it
//                             (programmatic dependent launch, ops::launch, as every kernel of the forward pass), reading
//                             a value it wrote and writing one of its own: time per launch.
//   sync_grid_barrier/ctas:C  one launch of C CTAs (all resident) running kStages such stages, separated by a barrier
//                             of all CTAs (one release arrival per CTA on a counter, polls until every CTA has, then
//                             an acquire): time per stage.
// Both read and write the same values (checked after the runs). A decode step of the 30B-A3B geometry is 48 layers of
// ~7 launches: kStages = 336.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "backends/cuda/cuda_check.cuh"
#include "backends/cuda/ops_common.cuh"
#include "bench/cuda/cuda_bench.h"

namespace magnetar::bench {
namespace {

constexpr int kStages = 336;
constexpr int kThreads = 256;

// Stage s of the chain: CTA i writes out[i] = in[(i + 1) % n] + 1 (in: stage s - 1's values).
__global__ void stage_kernel(const unsigned* in, unsigned* out, unsigned n) {
  cuda::ops::pdl_wait();
  cuda::ops::pdl_trigger();
  if (threadIdx.x == 0) out[blockIdx.x] = in[(blockIdx.x + 1) % n] + 1u;
}

// The same stages in one launch; buf holds two rows of n values, counter starts at 0.
__global__ void persistent_kernel(unsigned* buf, unsigned* counter, int stages) {
  const unsigned n = gridDim.x;
  for (int s = 0; s < stages; ++s) {
    const unsigned* in = buf + size_t(s % 2) * n;
    unsigned* out = buf + size_t((s + 1) % 2) * n;
    if (threadIdx.x == 0) out[blockIdx.x] = __ldcg(in + (blockIdx.x + 1) % n) + 1u;
    __syncthreads();  // the CTA's stores before its arrival
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
      const unsigned target = unsigned(s + 1) * n;
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < target);
    }
    __syncthreads();
  }
}

// Every value after kStages stages from zeros: kStages (each stage adds 1 to a value of the stage before).
void check(const cuda::DeviceBuffer& values, unsigned n, const char* what) {
  std::vector<unsigned> v(n);
  must_ok(values.download(v.data(), n * sizeof(unsigned)), "download");
  for (unsigned x : v) {
    if (x != unsigned(kStages)) {
      std::fprintf(stderr, "magnetar_bench_cuda_sync: %s: a value is %u, not %d\n", what, x, kStages);
      std::abort();
    }
  }
}

void bm_launches(benchmark::State& state) {
  const unsigned n = unsigned(state.range(0));
  cuda::Stream stream = must(cuda::Stream::create(), "stream");
  cuda::DeviceBuffer buf = must(cuda::DeviceBuffer::allocate(2 * n * sizeof(unsigned)), "buffer");
  unsigned* rows[2] = {buf.as<unsigned>(), buf.as<unsigned>() + n};
  cuda::Graph::begin_capture(stream);
  CUDA_CHECK(cudaMemsetAsync(rows[0], 0, n * sizeof(unsigned), stream.raw()));
  for (int s = 0; s < kStages; ++s) {
    CUDA_CHECK(cuda::ops::launch(stage_kernel, dim3(n), dim3(kThreads), 0, stream.raw(), rows[s % 2],
                                 rows[(s + 1) % 2], n));
  }
  cuda::Graph graph = must(cuda::Graph::end_capture(stream), "capture");
  GraphTimer timer;
  timer.seconds(graph, stream);  // the first launch uploads the graph
  for (auto _ : state) state.SetIterationTime(timer.seconds(graph, stream) / kStages);
  stream.synchronize();
  check(buf, n, "launches");  // kStages is even: the last stage wrote row 0
  state.SetLabel("us per launch");
}

void bm_grid_barrier(benchmark::State& state) {
  const unsigned n = unsigned(state.range(0));
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
  const cuda::DeviceInfo gpu = must(cuda::device_info(), "device");
  if (int64_t(per_sm) * gpu.sm_count < int64_t(n)) {
    state.SkipWithError("the GPU cannot hold every CTA at once");
    return;
  }
  cuda::Stream stream = must(cuda::Stream::create(), "stream");
  cuda::DeviceBuffer buf = must(cuda::DeviceBuffer::allocate((2 * n + 1) * sizeof(unsigned)), "buffer");
  unsigned* counter = buf.as<unsigned>() + 2 * n;
  cuda::Graph::begin_capture(stream);
  CUDA_CHECK(cudaMemsetAsync(buf.data(), 0, (2 * n + 1) * sizeof(unsigned), stream.raw()));
  persistent_kernel<<<n, kThreads, 0, stream.raw()>>>(buf.as<unsigned>(), counter, kStages);
  CUDA_CHECK(cudaGetLastError());
  cuda::Graph graph = must(cuda::Graph::end_capture(stream), "capture");
  GraphTimer timer;
  timer.seconds(graph, stream);
  for (auto _ : state) state.SetIterationTime(timer.seconds(graph, stream) / kStages);
  stream.synchronize();
  check(buf, n, "grid barrier");
  state.SetLabel("us per stage");
}

// A fixed count of graph launches per repetition: an iteration's time is per stage (1/kStages of a graph launch), so
// a minimum time would ask for kStages times the launches it needs.
void register_all() {
  constexpr int kIterations = 200;
  for (const int ctas : {132, 264, 528}) {
    benchmark::RegisterBenchmark(("sync_launches/ctas:" + std::to_string(ctas)).c_str(), bm_launches)
        ->Arg(ctas)
        ->UseManualTime()
        ->Iterations(kIterations)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("sync_grid_barrier/ctas:" + std::to_string(ctas)).c_str(), bm_grid_barrier)
        ->Arg(ctas)
        ->UseManualTime()
        ->Iterations(kIterations)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace magnetar::bench

int main(int argc, char** argv) {
  return magnetar::bench::cuda_main(argc, argv, "magnetar_bench_cuda_sync", magnetar::bench::register_all, "stages",
                                    "336 per graph launch");
}
