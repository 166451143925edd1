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

// blockIdx.x: row of out.
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const float* source,     // [source_rows, width]
                       const int32_t* index,    // [rows]
                       const int32_t* columns,  // [width], or null
                       float* out,              // [rows, out_width]
                       int64_t width, int64_t source_rows, int64_t out_width,
                       DeviceErrorRecord* errors) {
  const int64_t r = blockIdx.x;
  float* row = out + r * out_width;
  for (int64_t c = threadIdx.x; c < out_width; c += kThreads) row[c] = 0.0f;
  const int64_t from = index[r];
  if (from == -1) return;
  if (from < 0 || from >= source_rows) {
    if (threadIdx.x == 0)
      report_device_error(errors, DeviceCheck::kGatherIndex, r, from, source_rows);
    return;
  }
  __syncthreads();  // the zeros land before the values scattered over them
  const float* values = source + from * width;
  for (int64_t c = threadIdx.x; c < width; c += kThreads) {
    const int64_t column = columns == nullptr ? c : columns[c];
    if (column < 0 || column >= out_width) {
      report_device_error(errors, DeviceCheck::kGatherColumn, c, column, out_width);
      continue;
    }
    row[column] = values[c];
  }
}

}  // namespace

Status launch_gather_rows(const RowGatherParams& params, const float* source, const int32_t* index,
                          const int32_t* columns, float* out, DeviceErrorRecord* errors,
                          cudaStream_t stream) {
  if (Status status = check_gather_rows(params); !status.is_ok()) return status;
  if (params.rows == 0) return Status::ok();
  if (params.rows > INT32_MAX) {
    return Status::unsupported("gather_rows: more than 2^31 - 1 rows in one call");
  }
  gather_rows_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(
      source, index, columns, out, params.width, params.source_rows, params.out_width, errors);
  return launch_status("gather_rows kernel");
}

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
