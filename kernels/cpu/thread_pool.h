// A fixed pool of worker threads for data-parallel loops. One pool is shared by every CPU
// backend in a process (draft and target alike), so two models never oversubscribe the cores.
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
  // `num_threads` counts the calling thread, which always takes part; 0 means one per core.
  explicit ThreadPool(int num_threads = 0);
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
  void run_chunk(int chunk_index);
  // True on a worker, or on the thread whose parallel_for is running: a nested call runs inline.
  bool is_running_a_chunk() const;

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;                         // one parallel_for at a time
  std::atomic<std::thread::id> active_caller_{};  // the thread inside parallel_for, if any
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;  // bumped for each parallel_for
  int pending_workers_ = 0;  // workers still running the current generation
  bool stopping_ = false;

  // The current job, valid while pending_workers_ > 0.
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_size_ = 0;
};

}  // namespace specrun::kernels::cpu
