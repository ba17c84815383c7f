#include "backends/cpu/threadpool.h"

#include "base/check.h"

namespace magnetar::cpu {
namespace {
// Spin iterations before a worker sleeps. ~50 us on current x86: longer than the gap between the ops of one
// decode step, far shorter than the gap between tokens of an idle session.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() { __builtin_ia32_pause(); }

constexpr int64_t kMaxChunks = 0xFFFF;
inline int64_t next_of(uint64_t c) { return int64_t((c >> 16) & 0xFFFF); }
inline int64_t count_of(uint64_t c) { return int64_t(c & 0xFFFF); }
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  MAGNETAR_CHECK(n_threads >= 1 && int64_t(n_threads) * kChunksPerThread <= kMaxChunks);
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

void ThreadPool::claim_chunks(int ith) {
  uint64_t c = chunks_.load(std::memory_order_acquire);
  while (next_of(c) < count_of(c)) {
    if (!chunks_.compare_exchange_weak(c, c + (uint64_t(1) << 16), std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      continue;  // c was reloaded
    }
    try {
      body_(ctx_, next_of(c), count_of(c), ith);
    } catch (...) {  // an exception leaving a worker would terminate the process; the caller rethrows it
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
    c = chunks_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run_chunks(Body body, void* ctx, int64_t n_chunks) {
  MAGNETAR_CHECK(n_chunks >= 1 && n_chunks <= kMaxChunks);
  body_ = body;
  ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t region = (chunks_.load(std::memory_order_relaxed) >> 32) + 1;
  chunks_.store((region << 32) | uint64_t(n_chunks), std::memory_order_release);
  if (n_threads_ > 1) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
  }
  claim_chunks(0);
  // Spin for the common case (the workers' last chunks end within microseconds of the caller's); yield after that, so
  // a worker that lost its core to another process in the middle of a chunk gets it back sooner.
  for (int spins = 0; done_.load(std::memory_order_acquire) != n_chunks; ++spins) {
    if (spins < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::swap(error, error_);
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
    claim_chunks(ith);
  }
}

}  // namespace magnetar::cpu
