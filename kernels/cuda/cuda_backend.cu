#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/logit_edits.h"
#include "kernels/cuda/logprobs.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/verify.h"

namespace specrun::kernels::cuda {
namespace {

// Scratch grows in steps of this, so that slowly growing batches do not reallocate every call.
constexpr size_t kScratchGranule = size_t{2} << 20;
// Pageable uploads from this size on go through the pinned staging buffers, of this size each.
constexpr size_t kStagedCopyMinBytes = size_t{8} << 20;
constexpr size_t kStagingBytes = size_t{32} << 20;

// Makes `device` current for the scope, restoring the caller's device after: a process may drive
// several devices from one thread.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_) error_ = cudaSetDevice(device_);
  }
  ~DeviceScope() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  Status status() const {
    return error_ == cudaSuccess ? Status::ok() : cuda_error_status(error_, "cudaSetDevice");
  }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t error_ = cudaSuccess;
};

// An empty kernel: asking for its attributes tells whether this build has code the device can run.
__global__ void probe_kernel() {}

Status cublas_error(cublasStatus_t status, const char* what) {
  return Status::error(StatusCode::kDeviceError,
                       std::string(what) + ": " + cublasGetStatusString(status));
}

// The failure a kernel recorded, in the words the CPU backend uses for it.
Status status_from_record(const DeviceErrorRecord& record) {
  switch (static_cast<DeviceCheck>(record.check)) {
    case DeviceCheck::kTokenId:
      return Status::out_of_range("token id " + std::to_string(record.value) +
                                  " is outside the vocabulary [0, " + std::to_string(record.bound) +
                                  ")");
    case DeviceCheck::kSlot:
      return Status::out_of_range("kv_write: slot " + std::to_string(record.value) +
                                  " outside the cache of " + std::to_string(record.bound));
    case DeviceCheck::kQueryStart:
      return Status::invalid_argument("attention: query_start does not cover the tokens");
    case DeviceCheck::kContextLength:
      return Status::invalid_argument("attention: sequence " + std::to_string(record.index) +
                                      " has an impossible context length");
    case DeviceCheck::kGatherIndex:
      return Status::out_of_range("gather: index " + std::to_string(record.value) + " at entry " +
                                  std::to_string(record.index) + " is outside [-1, " +
                                  std::to_string(record.bound) + ")");
    case DeviceCheck::kGatherColumn:
      return Status::out_of_range("gather_rows: column " + std::to_string(record.value) +
                                  " of entry " + std::to_string(record.index) + " is outside [0, " +
                                  std::to_string(record.bound) + ")");
    case DeviceCheck::kNone:
      break;
  }
  return Status::error(StatusCode::kDeviceError,
                       "unknown device check " + std::to_string(record.check));
}

}  // namespace

CudaBackend::CudaBackend(int device_index)
    : device_(device_index), name_("cuda:" + std::to_string(device_index)) {}

namespace {

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }
  bool recorded = false;  // a wait on an event never recorded passes at once

 private:
  cudaEvent_t event_;
};

}  // namespace

std::unique_ptr<Backend> CudaBackend::create_stream() {
  std::unique_ptr<CudaBackend> stream;
  if (!create(device_, &stream).is_ok()) return nullptr;
  stream->set_batch_invariant(batch_invariant_);
  stream->set_eager_checks(eager_checks_);
  stream->set_notice_handler(notice_handler());
  return stream;
}

std::unique_ptr<Event> CudaBackend::create_event() {
  DeviceScope scope(device_);
  if (!scope.status().is_ok()) return nullptr;
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaEvent>(event);
}

Status CudaBackend::record(Event& event) {
  auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
  if (cuda_event == nullptr) return Status::invalid_argument("record: an event of another backend");
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  const cudaError_t error = cudaEventRecord(cuda_event->get(), stream_);
  if (error != cudaSuccess) return cuda_error_status(error, "record");
  cuda_event->recorded = true;
  return Status::ok();
}

Status CudaBackend::wait(const Event& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  if (cuda_event == nullptr) return Status::invalid_argument("wait: an event of another backend");
  if (!cuda_event->recorded) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  const cudaError_t error = cudaStreamWaitEvent(stream_, cuda_event->get(), 0);
  if (error != cudaSuccess) return cuda_error_status(error, "wait");
  return Status::ok();
}

Status CudaBackend::create(int device_index, std::unique_ptr<CudaBackend>* out) {
  out->reset();
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
      (error == cudaSuccess && count == 0)) {
    cudaGetLastError();
    return Status::error(
        StatusCode::kDeviceError,
        "no CUDA device is visible (" +
            std::string(error == cudaSuccess ? "none found" : cudaGetErrorString(error)) + ")");
  }
  if (error != cudaSuccess) {
    cudaGetLastError();
    return cuda_error_status(error, "cudaGetDeviceCount");
  }
  if (device_index < 0 || device_index >= count) {
    return Status::invalid_argument("CUDA device " + std::to_string(device_index) +
                                    " does not exist (" + std::to_string(count) + " visible)");
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device_index));
  if (Status status = backend->initialise(); !status.is_ok()) return status;
  *out = std::move(backend);
  return Status::ok();
}

Status CudaBackend::initialise() {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  cudaDeviceProp properties{};
  cudaError_t error = cudaGetDeviceProperties(&properties, device_);
  if (error != cudaSuccess) return cuda_error_status(error, "cudaGetDeviceProperties");
  multiprocessor_count_ = std::max(properties.multiProcessorCount, 1);

  cudaFuncAttributes attributes{};
  error = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported(name_ + " (" + properties.name + ", compute capability " +
                               std::to_string(properties.major) + "." +
                               std::to_string(properties.minor) +
                               ") cannot run this build's kernels: " + cudaGetErrorString(error) +
                               "; rebuild with its architecture in SPECRUN_CUDA_ARCHITECTURES");
  }

  error = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (error != cudaSuccess) {
    stream_ = nullptr;
    return cuda_error_status(error, "cudaStreamCreateWithFlags");
  }
  cublasHandle_t handle = nullptr;
  const cublasStatus_t cublas_status = cublasCreate(&handle);
  if (cublas_status != CUBLAS_STATUS_SUCCESS) return cublas_error(cublas_status, "cublasCreate");
  cublas_ = handle;
  const cublasStatus_t bound = cublasSetStream(cublas_, stream_);
  if (bound != CUBLAS_STATUS_SUCCESS) return cublas_error(bound, "cublasSetStream");

  void* record = nullptr;
  error = cudaMalloc(&record, sizeof(DeviceErrorRecord));
  if (error != cudaSuccess) return cuda_error_status(error, "allocating the error record");
  device_errors_ = static_cast<DeviceErrorRecord*>(record);
  void* host_record = nullptr;
  error = cudaMallocHost(&host_record, sizeof(DeviceErrorRecord));
  if (error != cudaSuccess) return cuda_error_status(error, "allocating the host error record");
  host_errors_ = static_cast<DeviceErrorRecord*>(host_record);
  *host_errors_ = DeviceErrorRecord{};
  error = cudaMemsetAsync(device_errors_, 0, sizeof(DeviceErrorRecord), stream_);
  if (error != cudaSuccess) return cuda_error_status(error, "clearing the error record");
  error = cudaStreamSynchronize(stream_);
  if (error != cudaSuccess) return cuda_error_status(error, ("initialising " + name_).c_str());
  return Status::ok();
}

CudaBackend::~CudaBackend() {
  DeviceScope scope(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (device_errors_ != nullptr) cudaFree(device_errors_);
  if (host_errors_ != nullptr) cudaFreeHost(host_errors_);
  for (int i = 0; i < 2; ++i) {
    if (staging_[i] != nullptr) cudaFreeHost(staging_[i]);
    if (staging_free_[i] != nullptr) cudaEventDestroy(staging_free_[i]);
  }
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  cudaGetLastError();  // leave no error of ours behind for the caller's next call
}

void* CudaBackend::allocate(size_t bytes) {
  DeviceScope scope(device_);
  if (!scope.status().is_ok()) return nullptr;
  void* pointer = nullptr;
  // At least one byte: a zero-byte request still gets a distinct, freeable allocation.
  if (cudaMalloc(&pointer, std::max<size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    return nullptr;
  }
  return pointer;
}

void CudaBackend::deallocate(void* pointer) noexcept {
  if (pointer == nullptr) return;
  DeviceScope scope(device_);
  cudaStreamSynchronize(stream_);
  cudaFree(pointer);
  cudaGetLastError();
}

Status CudaBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  cudaPointerAttributes attributes{};
  const bool pageable = cudaPointerGetAttributes(&attributes, host_src) == cudaSuccess &&
                        attributes.type == cudaMemoryTypeUnregistered;
  cudaGetLastError();  // a failed cudaPointerGetAttributes only means "wait" below
  if (pageable && bytes >= kStagedCopyMinBytes) {
    if (std::optional<Status> staged = staged_copy_to_device(device_dst, host_src, bytes)) {
      return *staged;
    }
  }
  cudaError_t error = cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_);
  if (error != cudaSuccess) return cuda_error_status(error, "copy_to_device");
  // From pageable memory the call returns once the source is staged, so the caller may reuse it
  // at once. Pinned (or otherwise registered) memory is read by the DMA engine later: wait for it,
  // so that the contract is the same for every kind of host memory.
  if (pageable) return Status::ok();
  error = cudaStreamSynchronize(stream_);
  return error == cudaSuccess ? Status::ok() : cuda_error_status(error, "copy_to_device");
}

std::optional<Status> CudaBackend::staged_copy_to_device(void* device_dst, const void* host_src,
                                                         size_t bytes) {
  for (int i = 0; i < 2; ++i) {
    if (staging_[i] == nullptr && cudaMallocHost(&staging_[i], kStagingBytes) != cudaSuccess) {
      staging_[i] = nullptr;
      cudaGetLastError();
      return std::nullopt;  // no pinned memory to spare: the direct copy still works
    }
    if (staging_free_[i] == nullptr &&
        cudaEventCreateWithFlags(&staging_free_[i], cudaEventDisableTiming) != cudaSuccess) {
      staging_free_[i] = nullptr;
      cudaGetLastError();
      return std::nullopt;
    }
  }
  const auto* source = static_cast<const std::byte*>(host_src);
  auto* destination = static_cast<std::byte*>(device_dst);
  for (size_t offset = 0, chunk = 0; offset < bytes; offset += kStagingBytes, ++chunk) {
    const size_t buffer = chunk % 2;
    const size_t count = std::min(kStagingBytes, bytes - offset);
    // The copy engine must be done reading this buffer's previous chunk (an event never recorded
    // counts as done).
    cudaError_t error = cudaEventSynchronize(staging_free_[buffer]);
    if (error == cudaSuccess) {
      std::memcpy(staging_[buffer], source + offset, count);
      error = cudaMemcpyAsync(destination + offset, staging_[buffer], count, cudaMemcpyHostToDevice,
                              stream_);
    }
    if (error == cudaSuccess) error = cudaEventRecord(staging_free_[buffer], stream_);
    if (error != cudaSuccess) {
      return cuda_error_status(error, "copy_to_device (staged)");
    }
  }
  // The source has been read into the staging buffers; each buffer is guarded by its event, so
  // nothing needs to wait here.
  return Status::ok();
}

Status CudaBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  count_copy_to_host(bytes);
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  if (bytes != 0) {
    const cudaError_t error =
        cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_);
    if (error != cudaSuccess) return cuda_error_status(error, "copy_to_host");
  }
  return wait_and_take_device_error("copy_to_host");
}

Status CudaBackend::copy_on_device(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes == 0 || device_dst == device_src) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  const auto* dst = static_cast<const char*>(device_dst);
  const auto* src = static_cast<const char*>(device_src);
  const bool overlap = dst < src + bytes && src < dst + bytes;
  cudaError_t error = cudaSuccess;
  if (overlap) {
    // cudaMemcpy leaves overlapping copies undefined: go through scratch, in stream order.
    if (Status status = ensure_scratch(bytes); !status.is_ok()) return status;
    error = cudaMemcpyAsync(scratch_, device_src, bytes, cudaMemcpyDeviceToDevice, stream_);
    if (error == cudaSuccess) {
      error = cudaMemcpyAsync(device_dst, scratch_, bytes, cudaMemcpyDeviceToDevice, stream_);
    }
  } else {
    error = cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream_);
  }
  return error == cudaSuccess ? Status::ok() : cuda_error_status(error, "copy_on_device");
}

Status CudaBackend::synchronize() {
  count_synchronize();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return wait_and_take_device_error("synchronize");
}

Status CudaBackend::available_memory(uint64_t* bytes) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (error != cudaSuccess) return cuda_error_status(error, "available memory");
  *bytes = free_bytes;
  return Status::ok();
}

Status CudaBackend::time_ms(const std::function<Status()>& work, double* milliseconds) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  auto timed = [&]() -> Status {
    cudaError_t error = cudaEventCreate(&start);
    if (error == cudaSuccess) error = cudaEventCreate(&stop);
    if (error == cudaSuccess) error = cudaEventRecord(start, stream_);
    if (error != cudaSuccess) return cuda_error_status(error, "timing: start event");
    if (Status status = work(); !status.is_ok()) return status;
    error = cudaEventRecord(stop, stream_);
    if (error == cudaSuccess) error = cudaEventSynchronize(stop);
    float elapsed = 0.0f;
    if (error == cudaSuccess) error = cudaEventElapsedTime(&elapsed, start, stop);
    if (error != cudaSuccess) return cuda_error_status(error, "timing: stop event");
    *milliseconds = elapsed;
    return Status::ok();
  };
  const Status status = timed();
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (!status.is_ok()) return status;
  return wait_and_take_device_error("timing");
}

uint64_t planned_scratch_bytes(const std::vector<ForwardShape>& shapes, int multiprocessor_count,
                               bool batch_invariant, uint64_t logits_workspace_bytes) {
  uint64_t most = logits_workspace_bytes;  // the one buffer grows to the largest single need
  for (const ForwardShape& shape : shapes) {
    for (const MatmulParams& params : shape.matmuls) {
      most = std::max<uint64_t>(most, matmul_scratch_bytes(params, batch_invariant));
    }
    most = std::max<uint64_t>(
        most, attention_scratch_bytes_at_most(shape.attention, multiprocessor_count));
  }
  const uint64_t granules = (most + kScratchGranule - 1) / kScratchGranule;
  return granules * kScratchGranule + kCublasWorkspaceBytes;
}

uint64_t CudaBackend::scratch_bytes_bound(const std::vector<ForwardShape>& shapes) const {
  uint64_t logits_workspace = 0;
  for (const ForwardShape& shape : shapes) {
    if (shape.logits.rows <= 0) continue;
    size_t bytes = 0;
    DeviceScope scope(device_);
    if (scope.status().is_ok() &&
        sample_workspace_bytes({shape.logits.rows, shape.logits.vocab, shape.logits.vocab}, &bytes)
            .is_ok()) {
      logits_workspace = std::max<uint64_t>(logits_workspace, bytes);
    }
  }
  return planned_scratch_bytes(shapes, multiprocessor_count_, batch_invariant_, logits_workspace);
}

Status CudaBackend::ensure_scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return Status::ok();
  // Ops already enqueued may still use the old buffer.
  cudaError_t error = cudaStreamSynchronize(stream_);
  if (error != cudaSuccess) return cuda_error_status(error, "growing scratch");
  if (scratch_ != nullptr) cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  const size_t rounded = (bytes + kScratchGranule - 1) / kScratchGranule * kScratchGranule;
  error = cudaMalloc(&scratch_, rounded);
  if (error != cudaSuccess) {
    cudaGetLastError();
    scratch_ = nullptr;
    return Status::error(StatusCode::kOutOfMemory, "cannot allocate " + std::to_string(rounded) +
                                                       " bytes of scratch on " + name_);
  }
  scratch_bytes_ = rounded;
  return Status::ok();
}

Status CudaBackend::wait_and_take_device_error(const char* what) {
  cudaError_t error = cudaMemcpyAsync(host_errors_, device_errors_, sizeof(DeviceErrorRecord),
                                      cudaMemcpyDeviceToHost, stream_);
  if (error != cudaSuccess) return cuda_error_status(error, what);
  error = cudaStreamSynchronize(stream_);
  if (error != cudaSuccess) return cuda_error_status(error, what);
  if (host_errors_->check == static_cast<int>(DeviceCheck::kNone)) return Status::ok();
  const DeviceErrorRecord record = *host_errors_;
  *host_errors_ = DeviceErrorRecord{};
  error = cudaMemsetAsync(device_errors_, 0, sizeof(DeviceErrorRecord), stream_);
  if (error != cudaSuccess) return cuda_error_status(error, what);
  return status_from_record(record);
}

Status CudaBackend::after_checked_op(Status launched, const char* what) {
  if (!launched.is_ok() || !eager_checks_) return launched;
  return wait_and_take_device_error(what);
}

Status CudaBackend::run_embedding(const EmbeddingParams& params, const int32_t* token_ids,
                                  const void* table, float* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return after_checked_op(launch_embedding(params, token_ids, table, out, device_errors_, stream_),
                          "embedding");
}

Status CudaBackend::run_rmsnorm(const RmsNormParams& params, const float* x, const void* weight,
                                float* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_rmsnorm(params, x, weight, out, stream_);
}

Status CudaBackend::run_add_rmsnorm(const RmsNormParams& params, const float* addend,
                                    float* accumulator, const void* weight, float* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_add_rmsnorm(params, addend, accumulator, weight, out, stream_);
}

Status CudaBackend::run_matmul(const MatmulParams& params, const float* x, const void* weight,
                               const float* weight_scales, const void* bias, float* out) {
  const MatmulTarget target{params, weight, weight_scales, bias, out};
  return matmul_group(x, &target, 1);
}

Status CudaBackend::run_matmul_group(const float* x, const MatmulTarget* targets, size_t count) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  size_t scratch = 0;
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    scratch = std::max(scratch, matmul_scratch_bytes(t.params, batch_invariant_));
  }
  if (Status status = ensure_scratch(scratch); !status.is_ok()) return status;
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    const MatmulParams& params = t.params;
    if (noted_scalar_matmul_ || !runs_skinny(params, batch_invariant_) ||
        skinny_loads_vectors(params, x, t.weight)) {
      continue;
    }
    noted_scalar_matmul_ = true;
    const int64_t multiple = skinny_vector_multiple(params.weight_dtype);
    notice("matmul: in_features " + std::to_string(params.in_features) +
           (params.in_features % multiple != 0
                ? " is not a multiple of " + std::to_string(multiple)
                : std::string(" with an operand not 16-byte aligned")) +
           ": the skinny kernel reads one element at a time, slower than its 16-byte loads "
           "(noted once)");
  }
  const MatmulContext context{cublas_, scratch_, scratch_bytes_, batch_invariant_};
  return launch_matmul_group(x, targets, count, context, stream_);
}

Status CudaBackend::run_rope(const RopeParams& params, const int32_t* positions,
                             const float* inv_freq, float* q, float* k) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_rope(params, positions, inv_freq, q, k, stream_);
}

Status CudaBackend::run_rope_kv_write(const RopeParams& rope, const KvWriteParams& cache,
                                      const int32_t* positions, const float* inv_freq,
                                      const int32_t* slots, float* q, float* k, const float* v,
                                      void* k_cache, void* v_cache) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return after_checked_op(
      launch_rope_kv_write({rope, cache.num_slots, cache.cache_dtype}, positions, inv_freq, slots,
                           q, k, v, k_cache, v_cache, device_errors_, stream_),
      "rope_kv_write");
}

Status CudaBackend::run_kv_write(const KvWriteParams& params, const float* k, const float* v,
                                 const int32_t* slots, void* k_cache, void* v_cache) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return after_checked_op(
      launch_kv_write(params, k, v, slots, k_cache, v_cache, device_errors_, stream_), "kv_write");
}

Status CudaBackend::run_attention(const AttentionParams& params, const float* q,
                                  const void* k_cache, const void* v_cache,
                                  const int32_t* query_start, const int32_t* context_lengths,
                                  const int32_t* block_tables, const int32_t* key_gaps,
                                  float* out) {
  if (key_gaps != nullptr) {
    return Status::unsupported("attention: key gaps (token trees) are not implemented on CUDA");
  }
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  if (Status status = ensure_scratch(attention_scratch_bytes(params, multiprocessor_count_));
      !status.is_ok()) {
    return status;
  }
  const AttentionWorkspace workspace{static_cast<float*>(scratch_), scratch_bytes_,
                                     multiprocessor_count_, device_errors_};
  return after_checked_op(launch_attention(params, q, k_cache, v_cache, query_start,
                                           context_lengths, block_tables, out, workspace, stream_),
                          "attention");
}

Status CudaBackend::run_gated_activation(const GatedActivationParams& params, const float* gate,
                                         const float* up, float* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_gated_activation(params, gate, up, out, stream_);
}

Status CudaBackend::run_add(int64_t count, const float* addend, float* accumulator) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_add(count, addend, accumulator, stream_);
}

Status CudaBackend::run_fill_uniform(const FillParams& params, void* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_fill_uniform(params.count, params.dtype, params.seed, params.low, params.high, out,
                             stream_);
}

Status CudaBackend::run_gather(const GatherParams& params, const int32_t* source,
                               const int32_t* index, int32_t* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return after_checked_op(launch_gather(params, source, index, out, device_errors_, stream_),
                          "gather");
}

Status CudaBackend::run_gather_rows(const RowGatherParams& params, const float* source,
                                    const int32_t* index, const int32_t* columns, float* out) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return after_checked_op(
      launch_gather_rows(params, source, index, columns, out, device_errors_, stream_),
      "gather_rows");
}

Status CudaBackend::run_process_logits(const LogitsParams& params, const float* logits,
                                       const LogitsSettings* settings, float* probs,
                                       int32_t* row_status) {
  if (params.rows == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  const ProcessLogitsParams shape{params.rows, params.vocab};
  size_t workspace_bytes = 0;
  if (Status status = process_logits_workspace_bytes(shape, &workspace_bytes); !status.is_ok()) {
    return status;
  }
  if (Status status = ensure_scratch(workspace_bytes); !status.is_ok()) return status;
  return launch_process_logits(shape, logits, settings, scratch_, workspace_bytes, probs,
                               row_status, stream_);
}

Status CudaBackend::run_argmax(const LogitsParams& params, const float* values, int32_t* out) {
  if (params.rows == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_argmax({params.rows, params.vocab}, values, out, stream_);
}

Status CudaBackend::run_edit_logits(const LogitEditParams& params, const int64_t* edit_begin,
                                    const LogitEdit* edits, const uint32_t* masks, float* logits) {
  if (params.rows == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_edit_logits(params, edit_begin, edits, masks, logits, stream_);
}

Status CudaBackend::run_token_logprobs(const LogprobParams& params, const float* logits,
                                       const int32_t* token_slots, const int32_t* tokens,
                                       float* chosen, int32_t* top_tokens, float* top_logprobs) {
  if (params.rows == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_token_logprobs(params, logits, token_slots, tokens, chosen, top_tokens,
                               top_logprobs, stream_);
}

Status CudaBackend::run_sample(const SampleParams& params, const SampleRow* rows,
                               const float* logits, const int32_t* tokens, float* q,
                               SampledRow* out, int32_t* drawn) {
  if (params.rows == 0) return Status::ok();
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  size_t workspace_bytes = 0;
  if (Status status = sample_workspace_bytes(params, &workspace_bytes); !status.is_ok()) {
    return status;
  }
  if (Status status = ensure_scratch(workspace_bytes); !status.is_ok()) return status;
  return launch_sample_rows(params, rows, logits, tokens, scratch_, workspace_bytes, q, out, drawn,
                            stream_);
}

Status CudaBackend::run_verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                               const int32_t* p_status, const float* q, const int32_t* drafts,
                               const int32_t* alternates, const int64_t* alternate_rows,
                               int32_t* tokens, int32_t* accepted, int32_t* alternate_taken) {
  DeviceScope scope(device_);
  if (Status status = scope.status(); !status.is_ok()) return status;
  return launch_verify(params, rows, p, p_status, q, drafts, alternates, alternate_rows, tokens,
                       accepted, alternate_taken, stream_);
}

}  // namespace specrun::kernels::cuda
