#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace mere {
namespace {

// Many short parallel_for calls back to back, small ones (3 chunks) before
// large ones: a worker woken for one call and late to claim a chunk must not
// take a chunk of the next call (it would run twice, and the count of finished
// chunks could pass the total, leaving the caller waiting forever; the
// intermittent hang of the GPU tests' CPU references). Every index runs
// exactly once per call.
TEST(ThreadPool, BackToBackCallsRunEveryChunkExactlyOnce) {
  set_thread_count(16);  // takes effect if nothing used the pool yet (a filtered run)
  auto all_calls = std::async(std::launch::async, [] {
    std::vector<std::atomic<int>> runs(256);
    int wrong = 0;
    for (int call = 0; call < 20000; ++call) {
      const int64_t n = call % 2 ? 256 : 3;
      for (auto& r : runs) r.store(0);
      parallel_for(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) runs[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) wrong += runs[i].load() != 1;
    }
    return wrong;
  });
  // A hang ends the run with a message rather than leaving it stuck.
  if (all_calls.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "ThreadPool.BackToBackCallsRunEveryChunkExactlyOnce: parallel_for hung\n");
    std::abort();
  }
  EXPECT_EQ(all_calls.get(), 0) << "chunks that ran other than once";
}

// Waiting threads spin a while, then sleep: calls far apart (the workers asleep
// by then) and chunks slower than the spin (the caller asleep on the last ones)
// still run every chunk once and return.
TEST(ThreadPool, CallsAfterTheWorkersSleptAndSlowChunks) {
  auto all_calls = std::async(std::launch::async, [] {
    int wrong = 0;
    for (int call = 0; call < 40; ++call) {
      std::vector<std::atomic<int>> runs(8);
      const bool slow = call % 2 == 1;
      parallel_for(8, 1, [&](int64_t begin, int64_t end) {
        if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        for (int64_t i = begin; i < end; ++i) runs[size_t(i)].fetch_add(1);
      });
      for (auto& r : runs) wrong += r.load() != 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(call % 4 == 0 ? 5 : 0));
    }
    return wrong;
  });
  if (all_calls.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "ThreadPool.CallsAfterTheWorkersSleptAndSlowChunks: parallel_for hung\n");
    std::abort();
  }
  EXPECT_EQ(all_calls.get(), 0) << "chunks that ran other than once";
}

}  // namespace
}  // namespace mere
