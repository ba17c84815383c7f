// A fixed set of worker threads that run one parallel region at a time (fork-join), used by every CPU op.
//
// run(fn) calls fn(ith, nth) on nth = size() threads (the caller is thread 0) and returns when all are done.
// Workers spin briefly on an atomic generation counter before sleeping, because decode runs hundreds of short
// regions per token and a condition-variable wake-up per region costs more than the region itself.
// Not re-entrant: run() must not be called from inside a region, and only one thread may call run().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace magnetar::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1 (1: everything runs on the caller)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(ith, nth) on every thread, the caller's part ith 0. An exception any part throws reaches the caller once every
  // part has returned (the first of them: the caller's own, else a worker's); fn and what it captured stay alive
  // until then.
  template <typename F>
  void run(F&& fn) {
    run_impl([](void* ctx, int ith, int nth) { (*static_cast<F*>(ctx))(ith, nth); }, &fn);
  }

  // Splits [0, n) into size() contiguous ranges: fn(begin, end, ith).
  template <typename F>
  void parallel_for(int64_t n, F&& fn) {
    run([&](int ith, int nth) {
      const int64_t begin = n * ith / nth, end = n * (ith + 1) / nth;
      if (begin < end) fn(begin, end, ith);
    });
  }

 private:
  using Trampoline = void (*)(void* ctx, int ith, int nth);
  void run_impl(Trampoline fn, void* ctx);
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  Trampoline fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::exception_ptr worker_error_;  // the first exception a worker's part threw in this run (under mutex_)
};

}  // namespace magnetar::cpu
