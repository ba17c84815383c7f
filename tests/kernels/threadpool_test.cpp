// ThreadPool::run with a part that throws: the exception reaches the caller only after every part has returned (the
// parts use the caller's stack: unwinding before them was a use after free, and their late completions ended the next
// run early), a worker's exception too (it terminated the process), and the pool runs on afterwards; parallel_for's
// chunks.
#include "backends/cpu/threadpool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace magnetar::cpu {
namespace {

TEST(ThreadPool, ACallerPartsExceptionWaitsForTheWorkers) {
  ThreadPool pool(4);
  std::atomic<int> finished{0};
  EXPECT_THROW(pool.run([&](int ith, int) {
    if (ith == 0) throw std::runtime_error("caller's part");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    finished.fetch_add(1);
  }),
               std::runtime_error);
  EXPECT_EQ(finished.load(), 3);  // every worker's part was done before the throw reached here
  std::vector<int> ran(4, 0);
  pool.run([&](int ith, int) { ++ran[size_t(ith)]; });
  EXPECT_EQ(ran, std::vector<int>(4, 1));
}

TEST(ThreadPool, AWorkersExceptionReachesTheCaller) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  try {
    pool.run([&](int ith, int) {
      if (ith == 2) throw std::runtime_error("worker 2");
      finished.fetch_add(1);
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 2");
  }
  EXPECT_EQ(finished.load(), 2);
  std::atomic<int> sum{0};
  pool.parallel_for(100, [&](int64_t begin, int64_t end, int) { sum.fetch_add(int(end - begin)); });
  EXPECT_EQ(sum.load(), 100);
}

// parallel_for's chunks, claimed by whichever thread comes: every index once, for short and long ranges and any thread
// count, ith within size(), and no two ranges on one ith at the same time (its per-thread scratch), in runs back to
// back (a late thread must not take a chunk of the next run with the last one's body).
TEST(ThreadPool, ChunksCoverEveryIndexOnceWithOneRangePerThreadAtATime) {
  for (const int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n = 1; n <= 70; ++n) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));
      std::atomic<int> bad{0};
      pool.parallel_for(n, [&](int64_t begin, int64_t end, int ith) {
        if (begin >= end || ith < 0 || ith >= threads || busy[size_t(ith)].fetch_add(1) != 0) bad.fetch_add(1);
        for (int64_t i = begin; i < end; ++i) hits[size_t(i)].fetch_add(1);
        busy[size_t(ith)].fetch_sub(1);
      });
      EXPECT_EQ(bad.load(), 0) << threads << " threads, n " << n;
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(hits[size_t(i)].load(), 1) << threads << " threads, n " << n << ", " << i;
    }
    std::vector<int> parts(size_t(threads), 0);
    pool.run([&](int part, int n_parts) {
      EXPECT_EQ(n_parts, threads);
      ++parts[size_t(part)];  // each part once: no two threads write one element
    });
    EXPECT_EQ(parts, std::vector<int>(size_t(threads), 1));
  }
}

}  // namespace
}  // namespace magnetar::cpu
