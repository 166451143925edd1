#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specrun::kernels::cpu {
namespace {

// How long an idle thread polls before it sleeps: longer than the host work between two ops of a
// forward pass, much shorter than the pause between two requests.
constexpr auto kSpinTime = std::chrono::microseconds(200);

void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` until it holds or kSpinTime passes; true when it held. After a short busy phase
// it yields between polls, so that when the cores are shared with other work a spinning thread
// hands its core to whoever can use it instead of burning its time slice.
template <typename Predicate>
bool spin_until(const Predicate& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int round = 0;; ++round) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      relax();
    }
    if (round >= 16) std::this_thread::yield();
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

// The job word's fields (ThreadPool::job_).
uint32_t generation_of(uint64_t job) {
  return static_cast<uint32_t>(job >> 32);
}
int64_t chunks_of(uint64_t job) {
  return static_cast<int64_t>((job >> 16) & 0xffff);
}
int64_t next_chunk_of(uint64_t job) {
  return static_cast<int64_t>(job & 0xffff);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads, const ThreadStarter& start_thread) {
  if (num_threads <= 0) {
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 0; i < num_threads - 1; ++i) {
    std::function<void()> loop = [this] { worker_loop(); };
    try {
      workers_.push_back(start_thread ? start_thread(std::move(loop))
                                      : std::thread(std::move(loop)));
    } catch (const std::exception& error) {
      // The destructor does not run for a constructor that throws, and a joinable std::thread
      // left in workers_ would terminate the process: the started workers are stopped here.
      stop_workers();
      throw std::runtime_error("CPU thread pool: cannot start worker thread " +
                               std::to_string(i + 1) + " of " + std::to_string(num_threads - 1) +
                               ": " + error.what());
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true);
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

bool ThreadPool::is_running_a_chunk() const {
  const std::thread::id self = std::this_thread::get_id();
  if (active_caller_.load() == self) return true;
  for (const auto& worker : workers_) {
    if (worker.get_id() == self) return true;
  }
  return false;
}

void ThreadPool::run_chunks() {
  uint64_t job = job_.load(std::memory_order_acquire);
  for (;;) {
    const int64_t chunks = chunks_of(job), chunk = next_chunk_of(job);
    if (chunk >= chunks) return;
    // On failure `job` is reloaded: another thread claimed the chunk, or a new job began.
    if (!job_.compare_exchange_weak(job, job + 1, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      continue;
    }
    const int64_t begin = chunk * chunk_size_;
    const int64_t end = std::min(count_, begin + chunk_size_);
    if (begin < end) (*body_)(begin, end);
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      // The caller may be asleep: wake it under the mutex so the wake-up cannot slip between its
      // check and its wait.
      std::lock_guard<std::mutex> lock(mutex_);
      work_done_.notify_one();
    }
    job = job_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen_generation = 0;
  for (;;) {
    const auto has_work = [&] {
      return stopping_.load(std::memory_order_acquire) ||
             generation_of(job_.load(std::memory_order_acquire)) != seen_generation;
    };
    if (!spin_until(has_work)) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, has_work);
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    seen_generation = generation_of(job_.load(std::memory_order_acquire));
    run_chunks();
  }
}

void ThreadPool::parallel_for(int64_t count, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t grains = (count + grain - 1) / grain;
  const int64_t wanted_chunks =
      std::min<int64_t>({grains, int64_t{num_threads()} * kChunksPerThread, int64_t{0xffff}});
  if (wanted_chunks <= 1 || is_running_a_chunk()) {
    body(0, count);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  active_caller_.store(std::this_thread::get_id());
  body_ = &body;
  count_ = count;
  chunk_size_ = ((grains + wanted_chunks - 1) / wanted_chunks) * grain;
  // Whole grains a chunk can leave fewer chunks than wanted (10 grains in 8: 5 chunks of 2).
  const int64_t chunks = (count + chunk_size_ - 1) / chunk_size_;
  chunks_done_.store(0, std::memory_order_relaxed);
  {
    // Under the mutex, so that a worker between its check and its wait cannot miss the job.
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t generation = generation_of(job_.load(std::memory_order_relaxed)) + 1u;
    job_.store((generation << 32) | (static_cast<uint64_t>(chunks) << 16),
               std::memory_order_release);
  }
  work_ready_.notify_all();
  run_chunks();
  // Every chunk is claimed; those a worker still runs are waited for, the workers that claimed
  // none are not (one off its core would otherwise hold up the call until it runs again).
  const auto all_done = [&] { return chunks_done_.load(std::memory_order_acquire) == chunks; };
  if (!spin_until(all_done)) {
    std::unique_lock<std::mutex> lock(mutex_);
    work_done_.wait(lock, all_done);
  }
  body_ = nullptr;
  active_caller_.store(std::thread::id());
}

}  // namespace specrun::kernels::cpu
