// A test backend that makes a missing wait visible on the CPU. It behaves as a device does: each
// stream queues its ops instead of running them, and queued work runs only when something forces
// it, on a CPU backend underneath:
// - a copy to the host or synchronize() runs the stream's queue to its end;
// - a wait() in a queue runs the recording stream up to the event's point first;
// - deallocate() runs every queue first (as cudaFree waits for the device).
// Other streams' work runs as late as that allows, and with a seed some of it early, in a random
// interleaving of the streams. So an op that reads another stream's output without an event wait
// reads what was there before the producer ran, and a host that reads device memory without a
// copy to the host reads it before the op that writes it has run.
//
// What a CUDA stream also does, this does: copy_to_device takes the host's bytes when called (the
// source may be reused at once), an op's failure is reported by the stream's next copy to the host
// or synchronize(), and its memory is not the host's (uses_host_memory() is false), so the runtime
// treats it as a device's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace specrun::testing {

class DeferredBackend final : public kernels::Backend {
 public:
  // The first stream of a device whose ops run on `cpu`. seed 0: no early interleaving, every
  // stream's work as late as possible.
  DeferredBackend(std::unique_ptr<kernels::cpu::CpuBackend> cpu, uint64_t seed);
  ~DeferredBackend() override;
  DeferredBackend(const DeferredBackend&) = delete;
  DeferredBackend& operator=(const DeferredBackend&) = delete;

  // Ops queued on this stream and not yet run.
  int64_t pending() const;

  std::string_view name() const override { return "deferred"; }
  bool uses_host_memory() const override { return false; }
  std::string_view matmul_kernels() const override;
  std::string_view matmul_activations() const override;
  // As a GPU's streams: drafting ahead is planned as it would be there.
  bool runs_models_concurrently() const override { return true; }
  bool attends_with_key_gaps() const override;
  // Weights stay in rows (kernels::WeightLayout::kRows), as a device's do: the runtime lays weights
  // out from where they are only on a backend in host memory.

  std::unique_ptr<kernels::Backend> create_stream() override;
  std::unique_ptr<kernels::Event> create_event() override;
  Status record(kernels::Event& event) override;
  Status wait(const kernels::Event& event) override;

  void* allocate(size_t bytes) override;
  void deallocate(void* pointer) noexcept override;
  Status copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  Status copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  Status copy_on_device(void* device_dst, const void* device_src, size_t bytes) override;
  Status synchronize() override;
  Status time_ms(const std::function<Status()>& work, double* milliseconds) override;
  void for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) override;
  Status available_memory(uint64_t* bytes) override;
  uint64_t scratch_bytes_bound(const std::vector<kernels::ForwardShape>& shapes) const override;

  Status run_embedding(const kernels::EmbeddingParams& params, const int32_t* token_ids,
                       const void* table, float* out) override;
  Status run_rmsnorm(const kernels::RmsNormParams& params, const float* x, const void* weight,
                     float* out) override;
  Status run_matmul(const kernels::MatmulParams& params, const float* x, const void* weight,
                    const float* weight_scales, const void* bias, float* out) override;
  Status run_matmul_group(const float* x, const kernels::MatmulTarget* targets,
                          size_t count) override;
  Status run_rope(const kernels::RopeParams& params, const int32_t* positions,
                  const float* inv_freq, float* q, float* k) override;
  Status run_rope_kv_write(const kernels::RopeParams& rope, const kernels::KvWriteParams& cache,
                           const int32_t* positions, const float* inv_freq, const int32_t* slots,
                           float* q, float* k, const float* v, void* k_cache,
                           void* v_cache) override;
  Status run_kv_write(const kernels::KvWriteParams& params, const float* k, const float* v,
                      const int32_t* slots, void* k_cache, void* v_cache) override;
  Status run_attention(const kernels::AttentionParams& params, const float* q, const void* k_cache,
                       const void* v_cache, const int32_t* query_start,
                       const int32_t* context_lengths, const int32_t* block_tables,
                       const int32_t* key_gaps, float* out) override;
  Status run_gated_activation(const kernels::GatedActivationParams& params, const float* gate,
                              const float* up, float* out) override;
  Status run_fill_uniform(const kernels::FillParams& params, void* out) override;
  Status run_gather(const kernels::GatherParams& params, const int32_t* source,
                    const int32_t* index, int32_t* out) override;
  Status run_gather_rows(const kernels::RowGatherParams& params, const float* source,
                         const int32_t* index, const int32_t* columns, float* out) override;
  Status run_process_logits(const kernels::LogitsParams& params, const float* logits,
                            const kernels::LogitsSettings* settings, float* probs,
                            int32_t* row_status) override;
  Status run_argmax(const kernels::LogitsParams& params, const float* values,
                    int32_t* out) override;
  Status run_edit_logits(const kernels::LogitEditParams& params, const int64_t* edit_begin,
                         const kernels::LogitEdit* edits, const uint32_t* masks,
                         float* logits) override;
  Status run_token_logprobs(const kernels::LogprobParams& params, const float* logits,
                            const int32_t* token_slots, const int32_t* tokens, float* chosen,
                            int32_t* top_tokens, float* top_logprobs) override;
  Status run_sample(const kernels::SampleParams& params, const kernels::SampleRow* rows,
                    const float* logits, const int32_t* tokens, float* q, kernels::SampledRow* out,
                    int32_t* drawn) override;
  Status run_verify(const kernels::VerifyParams& params, const kernels::VerifyRow* rows,
                    const float* p, const int32_t* p_status, const float* q, const int32_t* drafts,
                    const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                    int32_t* accepted, int32_t* alternate_taken) override;
  Status run_add(int64_t count, const float* addend, float* accumulator) override;
  Status run_add_rmsnorm(const kernels::RmsNormParams& params, const float* addend,
                         float* accumulator, const void* weight, float* out) override;

  struct Device;  // what a device's streams share
  struct Queue;   // one stream's ops

 private:
  DeferredBackend(std::shared_ptr<Device> device);
  // Queues `op` on this stream (it runs on the CPU backend when forced).
  Status enqueue(std::function<Status(kernels::cpu::CpuBackend&)> op);
  // Runs this stream's queue to its end; the first failure of its ops since the last drain.
  Status drain();

  std::shared_ptr<Device> device_;
  std::shared_ptr<Queue> queue_;
};

// The backend the engine's suites run their models on: the CPU backend, or with the environment's
// SPECRUN_TEST_BACKEND=deferred (their second registration, label `deferred`) a DeferredBackend
// over it with a fixed seed. The draft takes a stream of it (create_stream), as Engine::create
// gives it one.
std::unique_ptr<kernels::Backend> make_suite_backend(int threads);
// Whether the suites run on the DeferredBackend.
bool suite_backend_is_deferred();

}  // namespace specrun::testing
