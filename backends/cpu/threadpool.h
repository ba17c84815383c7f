// A fixed set of worker threads that run one parallel region at a time (fork-join), used by every CPU op.
//
// A region is cut into chunks that the threads claim one at a time from a shared counter, the caller among them, and
// run() returns when every chunk is done. A thread that is slow to start (asleep, or its core taken by another
// process) leaves its chunks to the others instead of holding the region up: with one part per thread, a region waited
// for its slowest thread's next time slice, and a test that decoded in 4.7 s alone took 20 s beside two busy loops.
// Workers spin briefly on an atomic generation counter before sleeping, because decode runs hundreds of short
// regions per token and a condition-variable wake-up per region costs more than the region itself.
// Not re-entrant: run() must not be called from inside a region, and only one thread may call run().
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace magnetar::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (1: everything runs on the caller)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(part, n_parts) for every part 0 .. n_parts - 1 (n_parts = size()), each once, on whichever threads claim them.
  // An exception a part throws reaches the caller once every part has returned (the first one thrown); fn and what
  // it captured stay alive until then.
  template <typename F>
  void run(F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_chunks([](void* ctx, int64_t part, int64_t n_parts, int) { (*static_cast<Fn*>(ctx))(int(part), int(n_parts)); },
               &fn, n_threads_);
  }

  // Splits [0, n) into contiguous ranges, up to kChunksPerThread per thread: fn(begin, end, ith), ith the thread that
  // runs the range (0 .. size() - 1, for per-thread scratch: no two ranges run on one ith at once).
  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    if (n <= 0) return;
    struct Ctx {
      std::remove_reference_t<F>* fn;
      int64_t n;
    } ctx{&fn, n};
    run_chunks(
        [](void* p, int64_t chunk, int64_t n_chunks, int ith) {
          const Ctx& c = *static_cast<Ctx*>(p);
          (*c.fn)(c.n * chunk / n_chunks, c.n * (chunk + 1) / n_chunks, ith);
        },
        &ctx, n_threads_ == 1 ? 1 : std::min<int64_t>(n, int64_t(n_threads_) * kChunksPerThread));
  }

 private:
  static constexpr int kChunksPerThread = 4;
  using Body = void (*)(void* ctx, int64_t chunk, int64_t n_chunks, int ith);
  void run_chunks(Body body, void* ctx, int64_t n_chunks);
  void claim_chunks(int ith);  // runs chunks of the current region until none is left to claim
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  Body body_ = nullptr;
  void* ctx_ = nullptr;
  // The current region's chunks: (region << 32) | (next chunk << 16) | chunk count. A claim is a compare-exchange, so
  // a thread late for a region either takes one of its chunks (and the region cannot end before that chunk does) or
  // finds none left, never a chunk of another region with this one's body.
  std::atomic<uint64_t> chunks_{0};
  std::atomic<int64_t> done_{0};  // chunks of the current region finished
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::exception_ptr error_;  // the first exception a chunk threw in this run (under mutex_)
};

}  // namespace magnetar::cpu
