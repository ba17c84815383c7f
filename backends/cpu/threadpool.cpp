#include "backends/cpu/threadpool.h"

#include "base/check.h"

namespace magnetar::cpu {
namespace {
// Spin iterations before a worker sleeps. ~50 us on current x86: longer than the gap between the ops of one
// decode step, far shorter than the gap between tokens of an idle session.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() { __builtin_ia32_pause(); }
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  MAGNETAR_CHECK(n_threads >= 1);
  for (int i = 1; i < n_threads; ++i) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::run_impl(Trampoline fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  std::exception_ptr error;
  try {
    fn(ctx, 0, n_threads_);
  } catch (...) {
    error = std::current_exception();  // rethrown once the workers are done with ctx (it may live on our stack)
  }
  // Spin for the common case (workers finish within microseconds of the caller); yield after that, so a
  // worker that lost its core to another process gets it back instead of the caller burning the slice.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error) error = worker_error_;
    worker_error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker(int ith) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      cpu_relax();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    try {
      fn_(ctx_, ith, n_threads_);
    } catch (...) {  // an exception leaving the thread would terminate the process
      std::lock_guard<std::mutex> lock(mutex_);
      if (!worker_error_) worker_error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace magnetar::cpu
