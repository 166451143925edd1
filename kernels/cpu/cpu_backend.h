// The CPU backend: the reference for every other backend and the default where there is no GPU.
// Ops run synchronously on a thread pool shared with any other CPU backend of the process.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  // `activations`: how matmuls with bf16 weights treat their activations (cpu::Activations).
  // `variant`: one of cpu::matmul_variants() this CPU supports; null for the best.
  explicit CpuBackend(std::shared_ptr<ThreadPool> pool, Activations activations = Activations::kF32,
                      const MatmulVariant* variant = nullptr);
  Activations activations() const { return activations_; }

  std::string_view name() const override { return "cpu"; }
  std::string_view matmul_kernels() const override { return variant_->name; }
  std::string_view matmul_activations() const override;
  bool uses_host_memory() const override { return true; }
  // Tiles of four rows, one stream a micro-kernel (kernels/core/weight_layout.h); bf16 weights
  // met by bf16 activations in the layout the matmul copy in use asks for (AMX's pair tiles).
  WeightLayout matmul_weight_layout(DType weight_dtype) const override;
  ThreadPool& pool() { return *pool_; }
  // The copy of the matmul kernels in use (cpu::MatmulVariant): the best this CPU runs, unless
  // the constructor was given one.
  const MatmulVariant& matmul_variant() const { return *variant_; }

  void* allocate(size_t bytes) override;
  void deallocate(void* pointer) noexcept override;
  Status copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  Status copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  Status copy_on_device(void* device_dst, const void* device_src, size_t bytes) override;
  Status synchronize() override {
    count_synchronize();
    return Status::ok();
  }
  // Ops run inline, in the order the host calls them: a stream is another CpuBackend on the same
  // pool (its own transfer counts), and events order nothing the host's own order has not.
  std::unique_ptr<Backend> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  Status record(Event& event) override;
  Status wait(const Event& event) override;
  // Ops run inline: a host clock around the work is the device's clock.
  Status time_ms(const std::function<Status()>& work, double* milliseconds) override;
  // /proc/meminfo's MemAvailable.
  Status available_memory(uint64_t* bytes) override;
  // On the pool's threads, the indices shared out in chunks.
  void for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) override;

  bool attends_with_key_gaps() const override { return true; }

 protected:
  // The ops, their shapes checked by Backend: each runs the reference in kernels/cpu/ on the pool.
  Status run_embedding(const EmbeddingParams& params, const int32_t* token_ids, const void* table,
                       float* out) override;
  Status run_rmsnorm(const RmsNormParams& params, const float* x, const void* weight,
                     float* out) override;
  Status run_matmul(const MatmulParams& params, const float* x, const void* weight,
                    const float* weight_scales, const void* bias, float* out) override;
  Status run_matmul_group(const float* x, const MatmulTarget* targets, size_t count) override;
  Status run_rope(const RopeParams& params, const int32_t* positions, const float* inv_freq,
                  float* q, float* k) override;
  Status run_kv_write(const KvWriteParams& params, const float* k, const float* v,
                      const int32_t* slots, void* k_cache, void* v_cache) override;
  Status run_attention(const AttentionParams& params, const float* q, const void* k_cache,
                       const void* v_cache, const int32_t* query_start,
                       const int32_t* context_lengths, const int32_t* block_tables,
                       const int32_t* key_gaps, float* out) override;
  Status run_gated_activation(const GatedActivationParams& params, const float* gate,
                              const float* up, float* out) override;
  Status run_add(int64_t count, const float* addend, float* accumulator) override;
  Status run_fill_uniform(const FillParams& params, void* out) override;
  Status run_gather(const GatherParams& params, const int32_t* source, const int32_t* index,
                    int32_t* out) override;
  Status run_gather_rows(const RowGatherParams& params, const float* source, const int32_t* index,
                         const int32_t* columns, float* out) override;
  // The rows shared out over the pool (kernels/cpu/sampling.h and verify.h are the reference).
  Status run_process_logits(const LogitsParams& params, const float* logits,
                            const LogitsSettings* settings, float* probs,
                            int32_t* row_status) override;
  Status run_argmax(const LogitsParams& params, const float* values, int32_t* out) override;
  Status run_edit_logits(const LogitEditParams& params, const int64_t* edit_begin,
                         const LogitEdit* edits, const uint32_t* masks, float* logits) override;
  Status run_token_logprobs(const LogprobParams& params, const float* logits,
                            const int32_t* token_slots, const int32_t* tokens, float* chosen,
                            int32_t* top_tokens, float* top_logprobs) override;
  Status run_sample(const SampleParams& params, const SampleRow* rows, const float* logits,
                    const int32_t* tokens, float* q, SampledRow* out, int32_t* drawn) override;
  Status run_verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                    const int32_t* p_status, const float* q, const int32_t* drafts,
                    const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                    int32_t* accepted, int32_t* alternate_taken) override;

 private:
  std::shared_ptr<ThreadPool> pool_;
  Activations activations_;
  const MatmulVariant* variant_;
};

}  // namespace specrun::kernels::cpu
