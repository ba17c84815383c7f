// ThreadPool::run with a part that throws: the exception reaches the caller only after every part has returned (the
// parts use the caller's stack: unwinding before them was a use after free, and their late completions ended the next
// run early), a worker's exception too (it terminated the process), and the pool runs on afterwards.
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

}  // namespace
}  // namespace magnetar::cpu
