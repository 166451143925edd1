#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace specrun::kernels::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0)
    num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 0; i < num_threads - 1; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i + 1); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& worker : workers_) worker.join();
}

bool ThreadPool::is_running_a_chunk() const {
  const std::thread::id self = std::this_thread::get_id();
  if (active_caller_.load() == self) return true;
  for (const auto& worker : workers_) {
    if (worker.get_id() == self) return true;
  }
  return false;
}

void ThreadPool::run_chunk(int chunk_index) {
  const int64_t begin = static_cast<int64_t>(chunk_index) * chunk_size_;
  const int64_t end = std::min(count_, begin + chunk_size_);
  if (begin >= end) return;
  (*body_)(begin, end);
}

void ThreadPool::worker_loop(int worker_index) {
  uint64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
    }
    run_chunk(worker_index);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_workers_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t count, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t grains = (count + grain - 1) / grain;
  const int64_t chunks = std::min<int64_t>(grains, num_threads());
  if (chunks <= 1 || is_running_a_chunk()) {
    body(0, count);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  active_caller_.store(std::this_thread::get_id());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    count_ = count;
    chunk_size_ = ((grains + chunks - 1) / chunks) * grain;
    pending_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_ready_.notify_all();
  run_chunk(0);
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return pending_workers_ == 0; });
  body_ = nullptr;
  active_caller_.store(std::thread::id());
}

}  // namespace specrun::kernels::cpu
