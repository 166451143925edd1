#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "specrun/error.hpp"

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

TEST(ThreadPool, AWorkerThatCannotStartIsOneError) {
  // The third worker fails to start as when the process is out of threads: the two started are
  // stopped and joined (no hang, no std::terminate on a joinable thread) and the error says so.
  int started = 0;
  const ThreadPool::ThreadStarter start = [&](std::function<void()> body) {
    if (started == 2) {
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    }
    ++started;
    return std::thread(std::move(body));
  };
  try {
    ThreadPool pool(5, start);
    FAIL() << "no error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cannot start worker thread 3 of 4"), std::string::npos) << message;
  }
  EXPECT_EQ(started, 2);
  // The starter is only a seam: a pool given one that works runs as usual.
  started = 0;
  ThreadPool pool(3, [&](std::function<void()> body) {
    ++started;
    return std::thread(std::move(body));
  });
  std::atomic<int64_t> total{0};
  pool.parallel_for(100, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
  EXPECT_EQ(total.load(), 100);
  EXPECT_EQ(started, 2);
}

TEST(ThreadPool, DefaultUsesEveryCore) {
  ThreadPool pool;
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace specrun::kernels::cpu
