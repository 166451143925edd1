#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (const int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (const int64_t count : {0, 1, 2, 7, 64, 1000}) {
      for (const int64_t grain : {1, 3, 16, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(count));
        std::atomic<int> chunks{0};
        pool.parallel_for(count, grain, [&](int64_t begin, int64_t end) {
          EXPECT_LT(begin, end);
          ++chunks;
          for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
        });
        for (const auto& hit : hits) ASSERT_EQ(hit.load(), 1);
        EXPECT_LE(chunks.load(), threads);
      }
    }
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallel_for(6, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
    }
  });
  EXPECT_EQ(total.load(), 60);
}

TEST(ThreadPool, CallsFromManyThreadsAreSerialisedSafely) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(total.load(), 4 * 50 * 100);
}

TEST(ThreadPool, DefaultUsesEveryCore) {
  ThreadPool pool;
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace specrun::kernels::cpu
