// A fixed pool of worker threads for data-parallel loops. One pool is shared by every CPU
// backend in a process (draft and target alike), so two models never oversubscribe the cores.
//
// A decode step issues about a hundred short loops, so handing work over must cost far less than
// a sleep and a wake-up: idle workers spin for a short while before they block, and the caller
// spins briefly for the last chunk before it blocks.
//
// A loop is cut into a few chunks per thread, which the threads claim in turn, and the caller
// waits for the chunks, not for the workers: where the cores are shared with other work, a worker
// the OS has taken off its core holds up a loop by the chunk it was running at most, while the
// threads still running take the rest (one busy core elsewhere halved decode on a 2-core machine
// when each thread owned a fixed half of every loop).
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
  // worker that cannot be started (the process is out of threads) is one std::runtime_error
  // saying which, after the workers already started have been stopped and joined (the kernels
  // know nothing of the runtime's Error: the runtime's make_thread_pool turns it into one).
  explicit ThreadPool(int num_threads = 0, const ThreadStarter& start_thread = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Chunks a loop is cut into, per thread, where it has enough grains.
  static constexpr int kChunksPerThread = 4;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls body(begin, end) over disjoint chunks covering [0, count), at most kChunksPerThread
  // per thread, chunk sizes multiples of `grain` (except the last). Returns when all chunks are
  // done. Which thread runs a chunk, and where chunks begin, must not change any result: callers
  // compute each output element with the same instructions wherever it lands. Calls from
  // different threads are serialised; a nested call from inside a body runs inline. The body
  // must not throw (kernels report through Status).
  void parallel_for(int64_t count, int64_t grain,
                    const std::function<void(int64_t begin, int64_t end)>& body);

 private:
  void worker_loop();
  // Stops and joins every worker (the destructor, and a constructor that fails part way).
  void stop_workers();
  // Claims and runs chunks of the current job until none is left to claim.
  void run_chunks();
  // True on a worker, or on the thread whose parallel_for is running: a nested call runs inline.
  bool is_running_a_chunk() const;

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;                         // one parallel_for at a time
  std::atomic<std::thread::id> active_caller_{};  // the thread inside parallel_for, if any
  std::mutex mutex_;                              // guards sleeping and waking
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  // The job's generation (high 32 bits), chunk count (next 16) and next chunk to claim (low 16),
  // in one word so that a claim (compare-and-swap) can only take a chunk of the job it read.
  // Stored (release) after the job's fields to publish each job.
  std::atomic<uint64_t> job_{0};
  std::atomic<int64_t> chunks_done_{0};  // chunks of the current job finished
  std::atomic<bool> stopping_{false};

  // The current job's fields, published by job_; unchanged while any of its chunks is unfinished.
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_size_ = 0;
};

}  // namespace specrun::kernels::cpu
