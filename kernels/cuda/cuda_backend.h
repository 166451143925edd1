// The CUDA backend: the op interface (kernels/backend.h) on one device and one stream. Plain C++
// can include this header: it names the CUDA types it holds only by forward declaration.
//
// Ordering: every op, and every copy, is enqueued on the backend's own non-blocking stream, in
// call order; allocate() and deallocate() synchronise as needed so that no enqueued op can touch
// freed memory.
//
// Checks: each op makes the CPU backend's shape checks on the host, before launching, and returns
// the same StatusCode for the same bad shape. The checks the CPU backend makes by reading index
// data (token ids, KV slots, attention metadata) need data that lives in device memory here; the
// kernels make them and skip the invalid items, and the backend reports the first failure (same
// StatusCode as the CPU) from its next synchronize() or copy_to_host(), the points where the host
// waits for the device anyway. With set_eager_checks(true) the op itself waits and returns that
// failure, exactly as the CPU backend would (at the cost of a stream synchronisation per op).
// Where the CPU backend accepts a shape that these kernels do not implement (attention with
// head_dim above 256, rope with head_dim above 12288), the op returns kUnsupported.
//
// Batch invariance: every op computes an output element with the same instructions in the same
// order however many rows share the call, except matmul over more than 16 rows, which uses cuBLAS
// on activations rounded to the weight dtype. set_batch_invariant(true) runs every matmul through
// the row-tiled skinny kernel instead (slower prefill, bitwise batch invariant).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/backend.h"

struct CUstream_st;    // cudaStream_t is CUstream_st*
struct CUevent_st;     // cudaEvent_t is CUevent_st*
struct cublasContext;  // cublasHandle_t is cublasContext*

namespace specrun::kernels::cuda {

struct DeviceErrorRecord;

// cuBLAS's own workspace: its documented size for Hopper (4 MiB before), which it allocates for
// itself and the memory plan counts.
inline constexpr uint64_t kCublasWorkspaceBytes = uint64_t{32} << 20;

// The memory CudaBackend's ops take for themselves running forwards of `shapes` on a device with
// `multiprocessor_count` multiprocessors: its one scratch buffer, which grows to the largest single
// need (activations rounded to bf16 for a GEMM, a quantized weight's dequantized tile, attention's
// per-split states, and `logits_workspace_bytes`: processing or sampling the shapes' rows of
// logits, whose sort's storage only the device can size) in whole 2 MiB granules, plus cuBLAS's
// workspace. A function of its arguments alone, so that it is tested without a device.
uint64_t planned_scratch_bytes(const std::vector<ForwardShape>& shapes, int multiprocessor_count,
                               bool batch_invariant, uint64_t logits_workspace_bytes = 0);

class CudaBackend final : public Backend {
 public:
  // A backend on CUDA device `device_index`: kDeviceError when no device is visible or the device
  // cannot be initialised, kInvalidArgument for an index outside the visible devices, kUnsupported
  // when the device cannot run the compiled kernels (another architecture).
  static Status create(int device_index, std::unique_ptr<CudaBackend>* out);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return name_; }  // "cuda:N"
  bool uses_host_memory() const override { return false; }
  int device_index() const { return device_; }
  // The stream every op runs on (a cudaStream_t), for callers that order their own work with it.
  CUstream_st* stream() const { return stream_; }

  // Streams of one device run at the same time.
  bool runs_models_concurrently() const override { return true; }
  // Another CudaBackend on the device: its own stream, cuBLAS handle, scratch and staging
  // buffers, the same batch invariance, checks and notice handler.
  std::unique_ptr<Backend> create_stream() override;
  // cudaEvent_t without timing; record is cudaEventRecord on this stream, wait is
  // cudaStreamWaitEvent.
  std::unique_ptr<Event> create_event() override;
  Status record(Event& event) override;
  Status wait(const Event& event) override;

  // Matmul through the skinny kernel for every row count (see above). Off by default.
  void set_batch_invariant(bool enabled) { batch_invariant_ = enabled; }
  bool batch_invariant() const { return batch_invariant_; }
  // Ops that check index data wait for the device and return the failure themselves.
  void set_eager_checks(bool enabled) { eager_checks_ = enabled; }
  bool eager_checks() const { return eager_checks_; }

  // cudaMalloc; null when it fails. bytes == 0 still returns a distinct allocation.
  void* allocate(size_t bytes) override;
  // Waits for the stream first: enqueued ops may still use the memory.
  void deallocate(void* pointer) noexcept override;
  // Asynchronous; the source may be reused as soon as this returns (it waits for the copy only
  // when the source is pinned memory). Large copies from pageable memory (weights from a mapped
  // checkpoint) go through two pinned staging buffers, so that the host fills one while the copy
  // engine reads the other at pinned speed.
  Status copy_to_device(void* device_dst, const void* host_src, size_t bytes) override;
  // Complete when it returns; reports a pending index-check failure.
  Status copy_to_host(void* host_dst, const void* device_src, size_t bytes) override;
  // Overlapping ranges are allowed (memmove semantics, as on the CPU).
  Status copy_on_device(void* device_dst, const void* device_src, size_t bytes) override;
  // cudaStreamSynchronize; reports a pending index-check failure.
  Status synchronize() override;
  // Two events on the stream around the work; waits for the second.
  Status time_ms(const std::function<Status()>& work, double* milliseconds) override;
  // cudaMemGetInfo's free memory.
  Status available_memory(uint64_t* bytes) override;
  // planned_scratch_bytes on this device, in this backend's batch-invariance mode, with the
  // workspace of sampling the largest of the shapes' rows of logits (sample_workspace_bytes, which
  // holds process_logits'); 0 where the device cannot say.
  uint64_t scratch_bytes_bound(const std::vector<ForwardShape>& shapes) const override;

 protected:
  // The ops, their shapes checked by Backend: each launches the kernels of kernels/cuda/.
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
  // One kernel each (kernels/cuda/rope.h, kernels/cuda/rmsnorm.h), bitwise the two ops.
  Status run_rope_kv_write(const RopeParams& rope, const KvWriteParams& cache,
                           const int32_t* positions, const float* inv_freq, const int32_t* slots,
                           float* q, float* k, const float* v, void* k_cache,
                           void* v_cache) override;
  Status run_add_rmsnorm(const RmsNormParams& params, const float* addend, float* accumulator,
                         const void* weight, float* out) override;
  // kernels/cuda/sampling.h (process_logits' and sample's sorts take their workspace from the
  // scratch buffer) and kernels/cuda/verify.h.
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
  explicit CudaBackend(int device_index);
  Status initialise();
  // Grows the scratch buffer to at least `bytes` (waiting for the stream before freeing the old).
  Status ensure_scratch(size_t bytes);
  // Enqueues a read of the device error record, waits for the stream, and turns a recorded
  // failure into a Status (clearing the record).
  Status wait_and_take_device_error(const char* what);
  // After an op that checks index data: in eager mode, wait and report.
  Status after_checked_op(Status launched, const char* what);
  // The staged path of copy_to_device; nullopt (and nothing copied) when the staging buffers
  // cannot be allocated, for the caller to copy directly.
  std::optional<Status> staged_copy_to_device(void* device_dst, const void* host_src, size_t bytes);

  int device_;
  std::string name_;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  DeviceErrorRecord* device_errors_ = nullptr;        // device memory
  DeviceErrorRecord* host_errors_ = nullptr;          // pinned host copy
  void* staging_[2] = {nullptr, nullptr};             // pinned host buffers, made on first use
  CUevent_st* staging_free_[2] = {nullptr, nullptr};  // recorded after each buffer's last read
  int multiprocessor_count_ = 1;
  bool batch_invariant_ = false;
  bool eager_checks_ = false;
  bool noted_scalar_matmul_ = false;  // the skinny kernel's element-wise path was noted once
};

}  // namespace specrun::kernels::cuda
