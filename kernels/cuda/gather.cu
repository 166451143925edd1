#include "kernels/cuda/gather.h"

#include <algorithm>

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    gather_kernel(const int32_t* source,  // [source_count]
                  const int32_t* index,   // [count]
                  int32_t* out,           // [count]
                  int64_t count, int64_t source_count, DeviceErrorRecord* errors) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t from = index[i];
    if (from >= 0 && from < source_count) {
      out[i] = source[from];
    } else if (from != -1) {
      report_device_error(errors, DeviceCheck::kGatherIndex, i, from, source_count);
    }
  }
}

}  // namespace

Status launch_gather(const GatherParams& params, const int32_t* source, const int32_t* index,
                     int32_t* out, DeviceErrorRecord* errors, cudaStream_t stream) {
  if (Status status = check_gather(params); !status.is_ok()) return status;
  if (params.count == 0) return Status::ok();
  // A step gathers a few hundred ids: one block covers them, and a long call strides.
  const int64_t blocks = std::min<int64_t>((params.count + kThreads - 1) / kThreads, 1024);
  gather_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      source, index, out, params.count, params.source_count, errors);
  return launch_status("gather kernel");
}

}  // namespace specrun::kernels::cuda
