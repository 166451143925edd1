#include "tests/deferred_backend.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

namespace specrun::testing {

using kernels::cpu::CpuBackend;
using Op = std::function<Status(CpuBackend&)>;

struct DeferredBackend::Queue {
  std::deque<Op> ops;             // queued, not yet run, in order
  uint64_t enqueued = 0;          // ops ever queued: the point record() marks
  uint64_t executed = 0;          // ops ever run
  bool running = false;           // an op of this queue is running (a wait inside it, say)
  Status failure = Status::ok();  // the first failure since the last drain
};

struct DeferredBackend::Device {
  std::unique_ptr<CpuBackend> cpu;
  std::mt19937_64 random;
  bool interleave;
  std::vector<std::shared_ptr<Queue>> queues;  // every stream's, for the interleaving
  std::recursive_mutex mutex;                  // the engine's thread and the test's share it

  void run_one(Queue& queue) {
    Op op = std::move(queue.ops.front());
    queue.ops.pop_front();
    queue.running = true;
    const Status status = op(*cpu);
    queue.running = false;
    ++queue.executed;
    if (!status.is_ok() && queue.failure.is_ok()) queue.failure = status;
  }

  // With a seed, before an op of a stream that is being forced, one op of another stream now and
  // then: work that may run early does, in a random order.
  void maybe_interleave(const Queue& forced) {
    if (!interleave || random() % 3 != 0) return;
    std::vector<Queue*> ready;
    for (const auto& queue : queues) {
      if (queue.get() != &forced && !queue->running && !queue->ops.empty()) {
        ready.push_back(queue.get());
      }
    }
    if (ready.empty()) return;
    run_one(*ready[random() % ready.size()]);
  }

  // Runs `queue` until `point` ops of it have run.
  void run_until(Queue& queue, uint64_t point) {
    while (queue.executed < point && !queue.ops.empty()) {
      maybe_interleave(queue);
      if (queue.executed < point && !queue.ops.empty()) run_one(queue);
    }
  }

  void run_all() {
    for (const auto& queue : queues) {
      if (!queue->running) run_until(*queue, queue->enqueued);
    }
  }
};

namespace {

class DeferredEvent final : public kernels::Event {
 public:
  explicit DeferredEvent(const DeferredBackend::Device* owner) : device(owner) {}
  const DeferredBackend::Device* device;
  std::shared_ptr<DeferredBackend::Queue> queue;  // the stream that recorded it; null: never
  uint64_t point = 0;                             // ops of that stream before it
};

}  // namespace

DeferredBackend::DeferredBackend(std::unique_ptr<CpuBackend> cpu, uint64_t seed)
    : device_(std::make_shared<Device>()), queue_(std::make_shared<Queue>()) {
  device_->cpu = std::move(cpu);
  device_->random.seed(seed);
  device_->interleave = seed != 0;
  device_->queues.push_back(queue_);
}

DeferredBackend::DeferredBackend(std::shared_ptr<Device> device)
    : device_(std::move(device)), queue_(std::make_shared<Queue>()) {
  std::lock_guard lock(device_->mutex);
  device_->queues.push_back(queue_);
}

DeferredBackend::~DeferredBackend() {
  std::lock_guard lock(device_->mutex);
  device_->run_until(*queue_, queue_->enqueued);
}

int64_t DeferredBackend::pending() const {
  std::lock_guard lock(device_->mutex);
  return static_cast<int64_t>(queue_->ops.size());
}

std::string_view DeferredBackend::matmul_kernels() const {
  return device_->cpu->matmul_kernels();
}

std::string_view DeferredBackend::matmul_activations() const {
  return device_->cpu->matmul_activations();
}

bool DeferredBackend::attends_with_key_gaps() const {
  return device_->cpu->attends_with_key_gaps();
}

std::unique_ptr<kernels::Backend> DeferredBackend::create_stream() {
  return std::unique_ptr<kernels::Backend>(new DeferredBackend(device_));
}

std::unique_ptr<kernels::Event> DeferredBackend::create_event() {
  return std::make_unique<DeferredEvent>(device_.get());
}

Status DeferredBackend::record(kernels::Event& event) {
  auto* deferred = dynamic_cast<DeferredEvent*>(&event);
  if (deferred == nullptr || deferred->device != device_.get()) {
    return Status::invalid_argument("record: an event of another backend");
  }
  std::lock_guard lock(device_->mutex);
  deferred->queue = queue_;
  deferred->point = queue_->enqueued;
  return Status::ok();
}

Status DeferredBackend::wait(const kernels::Event& event) {
  const auto* deferred = dynamic_cast<const DeferredEvent*>(&event);
  if (deferred == nullptr || deferred->device != device_.get()) {
    return Status::invalid_argument("wait: an event of another backend");
  }
  std::lock_guard lock(device_->mutex);
  if (deferred->queue == nullptr || deferred->queue == queue_) return Status::ok();
  // The point as recorded now: a later record() moves the event, not this wait.
  Device* device = device_.get();
  std::shared_ptr<Queue> queue = deferred->queue;
  const uint64_t point = deferred->point;
  return enqueue([device, queue, point](CpuBackend&) {
    device->run_until(*queue, point);
    return Status::ok();
  });
}

Status DeferredBackend::enqueue(Op op) {
  std::lock_guard lock(device_->mutex);
  queue_->ops.push_back(std::move(op));
  ++queue_->enqueued;
  return Status::ok();
}

Status DeferredBackend::drain() {
  std::lock_guard lock(device_->mutex);
  device_->run_until(*queue_, queue_->enqueued);
  return std::exchange(queue_->failure, Status::ok());
}

void* DeferredBackend::allocate(size_t bytes) {
  return device_->cpu->allocate(bytes);
}

void DeferredBackend::deallocate(void* pointer) noexcept {
  std::lock_guard lock(device_->mutex);
  device_->run_all();  // as cudaFree waits for the device
  device_->cpu->deallocate(pointer);
}

Status DeferredBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  // The host's bytes now: the source may be reused as soon as this returns.
  auto staged = std::make_shared<std::vector<unsigned char>>(
      static_cast<const unsigned char*>(host_src),
      static_cast<const unsigned char*>(host_src) + bytes);
  return enqueue([device_dst, staged](CpuBackend& cpu) {
    return cpu.copy_to_device(device_dst, staged->data(), staged->size());
  });
}

Status DeferredBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  count_copy_to_host(bytes);
  const Status failure = drain();
  if (bytes != 0) std::memcpy(host_dst, device_src, bytes);
  return failure;
}

Status DeferredBackend::copy_on_device(void* device_dst, const void* device_src, size_t bytes) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.copy_on_device(device_dst, device_src, bytes); });
}

Status DeferredBackend::synchronize() {
  count_synchronize();
  return drain();
}

Status DeferredBackend::time_ms(const std::function<Status()>& work, double* milliseconds) {
  const auto start = std::chrono::steady_clock::now();
  const Status enqueued = work();
  const Status ran = drain();
  *milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return enqueued.is_ok() ? ran : enqueued;
}

void DeferredBackend::for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) {
  device_->cpu->for_each_on_host(count, body);
}

Status DeferredBackend::available_memory(uint64_t* bytes) {
  return device_->cpu->available_memory(bytes);
}

uint64_t DeferredBackend::scratch_bytes_bound(
    const std::vector<kernels::ForwardShape>& shapes) const {
  return device_->cpu->scratch_bytes_bound(shapes);
}

// Every op below is queued with its parameters copied: the caller's structs may be gone when it
// runs, the device pointers it names are still the caller's to keep alive.

Status DeferredBackend::run_embedding(const kernels::EmbeddingParams& params,
                                      const int32_t* token_ids, const void* table, float* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.embedding(params, token_ids, table, out); });
}

Status DeferredBackend::run_rmsnorm(const kernels::RmsNormParams& params, const float* x,
                                    const void* weight, float* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.rmsnorm(params, x, weight, out); });
}

Status DeferredBackend::run_matmul(const kernels::MatmulParams& params, const float* x,
                                   const void* weight, const float* weight_scales, const void* bias,
                                   float* out) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.matmul(params, x, weight, weight_scales, bias, out); });
}

Status DeferredBackend::run_matmul_group(const float* x, const kernels::MatmulTarget* targets,
                                         size_t count) {
  // The targets are a host array of the caller's.
  std::vector<kernels::MatmulTarget> copied(targets, targets + count);
  return enqueue([x, copied = std::move(copied)](CpuBackend& cpu) {
    return cpu.matmul_group(x, copied.data(), copied.size());
  });
}

Status DeferredBackend::run_rope(const kernels::RopeParams& params, const int32_t* positions,
                                 const float* inv_freq, float* q, float* k) {
  return enqueue([=](CpuBackend& cpu) { return cpu.rope(params, positions, inv_freq, q, k); });
}

Status DeferredBackend::run_rope_kv_write(const kernels::RopeParams& rope,
                                          const kernels::KvWriteParams& cache,
                                          const int32_t* positions, const float* inv_freq,
                                          const int32_t* slots, float* q, float* k, const float* v,
                                          void* k_cache, void* v_cache) {
  return enqueue([=](CpuBackend& cpu) {
    return cpu.rope_kv_write(rope, cache, positions, inv_freq, slots, q, k, v, k_cache, v_cache);
  });
}

Status DeferredBackend::run_kv_write(const kernels::KvWriteParams& params, const float* k,
                                     const float* v, const int32_t* slots, void* k_cache,
                                     void* v_cache) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.kv_write(params, k, v, slots, k_cache, v_cache); });
}

Status DeferredBackend::run_attention(const kernels::AttentionParams& params, const float* q,
                                      const void* k_cache, const void* v_cache,
                                      const int32_t* query_start, const int32_t* context_lengths,
                                      const int32_t* block_tables, const int32_t* key_gaps,
                                      float* out) {
  return enqueue([=](CpuBackend& cpu) {
    return cpu.attention(params, q, k_cache, v_cache, query_start, context_lengths, block_tables,
                         key_gaps, out);
  });
}

Status DeferredBackend::run_gated_activation(const kernels::GatedActivationParams& params,
                                             const float* gate, const float* up, float* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.gated_activation(params, gate, up, out); });
}

Status DeferredBackend::run_fill_uniform(const kernels::FillParams& params, void* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.fill_uniform(params, out); });
}

Status DeferredBackend::run_gather(const kernels::GatherParams& params, const int32_t* source,
                                   const int32_t* index, int32_t* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.gather(params, source, index, out); });
}

Status DeferredBackend::run_gather_rows(const kernels::RowGatherParams& params, const float* source,
                                        const int32_t* index, const int32_t* columns, float* out) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.gather_rows(params, source, index, columns, out); });
}

Status DeferredBackend::run_process_logits(const kernels::LogitsParams& params, const float* logits,
                                           const kernels::LogitsSettings* settings, float* probs,
                                           int32_t* row_status) {
  return enqueue([=](CpuBackend& cpu) {
    return cpu.process_logits(params, logits, settings, probs, row_status);
  });
}

Status DeferredBackend::run_argmax(const kernels::LogitsParams& params, const float* values,
                                   int32_t* out) {
  return enqueue([=](CpuBackend& cpu) { return cpu.argmax(params, values, out); });
}

Status DeferredBackend::run_edit_logits(const kernels::LogitEditParams& params,
                                        const int64_t* edit_begin, const kernels::LogitEdit* edits,
                                        const uint32_t* masks, float* logits) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.edit_logits(params, edit_begin, edits, masks, logits); });
}

Status DeferredBackend::run_token_logprobs(const kernels::LogprobParams& params,
                                           const float* logits, const int32_t* token_slots,
                                           const int32_t* tokens, float* chosen,
                                           int32_t* top_tokens, float* top_logprobs) {
  return enqueue([=](CpuBackend& cpu) {
    return cpu.token_logprobs(params, logits, token_slots, tokens, chosen, top_tokens,
                              top_logprobs);
  });
}

Status DeferredBackend::run_sample(const kernels::SampleParams& params,
                                   const kernels::SampleRow* rows, const float* logits,
                                   const int32_t* tokens, float* q, kernels::SampledRow* out,
                                   int32_t* drawn) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.sample(params, rows, logits, tokens, q, out, drawn); });
}

Status DeferredBackend::run_verify(const kernels::VerifyParams& params,
                                   const kernels::VerifyRow* rows, const float* p,
                                   const int32_t* p_status, const float* q, const int32_t* drafts,
                                   const int32_t* alternates, const int64_t* alternate_rows,
                                   int32_t* tokens, int32_t* accepted, int32_t* alternate_taken) {
  return enqueue([=](CpuBackend& cpu) {
    return cpu.verify(params, rows, p, p_status, q, drafts, alternates, alternate_rows, tokens,
                      accepted, alternate_taken);
  });
}

Status DeferredBackend::run_add(int64_t count, const float* addend, float* accumulator) {
  return enqueue([=](CpuBackend& cpu) { return cpu.add(count, addend, accumulator); });
}

Status DeferredBackend::run_add_rmsnorm(const kernels::RmsNormParams& params, const float* addend,
                                        float* accumulator, const void* weight, float* out) {
  return enqueue(
      [=](CpuBackend& cpu) { return cpu.add_rmsnorm(params, addend, accumulator, weight, out); });
}

bool suite_backend_is_deferred() {
  const char* choice = std::getenv("SPECRUN_TEST_BACKEND");
  return choice != nullptr && std::string_view(choice) == "deferred";
}

std::unique_ptr<kernels::Backend> make_suite_backend(int threads) {
  auto cpu = std::make_unique<CpuBackend>(std::make_shared<kernels::cpu::ThreadPool>(threads));
  if (!suite_backend_is_deferred()) return cpu;
  return std::make_unique<DeferredBackend>(std::move(cpu), /*seed=*/20261207);
}

}  // namespace specrun::testing
