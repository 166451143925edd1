// A fixed pool of worker threads for data-parallel loops. One pool is shared by every CPU
// backend in a process (draft and target alike), so two models never oversubscribe the cores.
//
// A decode step issues about a hundred short loops, so handing work over must cost far less than
// a sleep and a wake-up: idle workers spin for a short while before they block, and the caller
// spins briefly for the last chunk before it blocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specrun::kernels::cpu {

class ThreadPool {
 public:
  // Starts a thread running its argument; the pool's default is std::thread's constructor. Tests
  // pass one that fails, to see the pool refuse cleanly.
  using ThreadStarter = std::function<std::thread(std::function<void()>)>;

  // `num_threads` counts the calling thread, which always takes part; 0 means one per core. A
  // worker that cannot be started (the process is out of threads) is one specrun::Error, after
  // the workers already started have been stopped and joined.
  explicit ThreadPool(int num_threads = 0, const ThreadStarter& start_thread = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over disjoint chunks covering [0, count), at most one chunk per
  // thread, chunk sizes multiples of `grain` (except the last). Returns when all chunks are done.
  // Which thread runs a chunk must not change any result: callers compute each output element
  // with the same instructions wherever it lands. Calls from different threads are serialised;
  // a nested call from inside a body runs inline. The body must not throw (kernels report
  // through Status).
  void parallel_for(int64_t count, int64_t grain,
                    const std::function<void(int64_t begin, int64_t end)>& body);

 private:
  void worker_loop(int worker_index);
  // Stops and joins every worker (the destructor, and a constructor that fails part way).
  void stop_workers();
  void run_chunk(int chunk_index);
  // True on a worker, or on the thread whose parallel_for is running: a nested call runs inline.
  bool is_running_a_chunk() const;

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;                         // one parallel_for at a time
  std::atomic<std::thread::id> active_caller_{};  // the thread inside parallel_for, if any
  std::mutex mutex_;                              // guards sleeping and waking
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::atomic<uint64_t> generation_{0};  // bumped (release) to publish each job
  std::atomic<int> pending_workers_{0};  // workers still running the current job
  std::atomic<bool> stopping_{false};

  // The current job, published by generation_.
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_size_ = 0;
};

}  // namespace specrun::kernels::cpu
