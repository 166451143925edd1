#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
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
        EXPECT_LE(chunks.load(), threads * ThreadPool::kChunksPerThread);
      }
    }
  }
}

// A worker stalled inside its chunk (as one the OS has taken off its core is) holds up only that
// chunk: the caller takes every other chunk meanwhile, rather than waiting on a fixed share.
TEST(ThreadPool, AStalledWorkerHoldsUpOnlyItsOwnChunk) {
  using namespace std::chrono_literals;
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  const int64_t count = 2 * ThreadPool::kChunksPerThread;
  std::atomic<bool> worker_stalled{false};
  std::atomic<int64_t> done_by_others{0};
  int64_t stalled_chunk = -1;  // elements in the worker's stalled chunk
  bool others_finished = false;
  pool.parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    if (std::this_thread::get_id() != caller && !worker_stalled.exchange(true)) {
      // Stalls until every other element is done (or, where they never are, ten seconds).
      while (done_by_others.load() < count - (end - begin) &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      stalled_chunk = end - begin;
      others_finished = done_by_others.load() == count - (end - begin);
      return;
    }
    // The caller's first chunk waits for the worker to take one, so that one stalls.
    while (!worker_stalled.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    done_by_others += end - begin;
  });
  ASSERT_TRUE(worker_stalled.load()) << "the worker never took a chunk";
  EXPECT_EQ(stalled_chunk, 1);
  EXPECT_TRUE(others_finished);
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
  } catch (const std::runtime_error& error) {
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

// Host work on the CPU backend's threads (a forward's rows of logits): every index once, on more
// than one thread where the pool has them, and an exception from any call reaches the caller
// after the others have run, leaving the pool ready for the next call.
TEST(ThreadPool, TheCpuBackendRunsHostWorkOnItsThreadsAndPassesAnErrorOn) {
  CpuBackend backend(std::make_shared<ThreadPool>(2));
  std::vector<std::atomic<int>> hits(64);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  backend.for_each_on_host(64, [&](int64_t i) {
    ++hits[static_cast<size_t>(i)];
    // Long enough that the second thread has time to take some of the work.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  for (const auto& hit : hits) EXPECT_EQ(hit.load(), 1);
  EXPECT_EQ(threads.size(), 2u);

  std::atomic<int> ran{0};
  EXPECT_THROW(backend.for_each_on_host(16,
                                        [&](int64_t i) {
                                          ++ran;
                                          if (i % 5 == 3) throw Error("row " + std::to_string(i));
                                        }),
               Error);
  EXPECT_EQ(ran.load(), 16);
  std::atomic<int> after{0};
  backend.for_each_on_host(10, [&](int64_t) { ++after; });
  EXPECT_EQ(after.load(), 10);
  backend.for_each_on_host(0, [&](int64_t) { ADD_FAILURE() << "no index to run"; });
}

TEST(ThreadPool, DefaultUsesEveryCore) {
  ThreadPool pool;
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace specrun::kernels::cpu
