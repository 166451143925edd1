// RMSNorm on the device.
#pragma once

#include <cuda_runtime.h>

#include "kernels/backend.h"

namespace specrun::kernels::cuda {

// out = x / sqrt(mean(x^2) + eps) * weight, per row; out may alias x.
//
// One block of 256 threads per row. Each thread sums the squares of its strided elements in
// index order, the warps reduce by a fixed butterfly, and warp 0 folds the eight warp sums in
// order: the result of a row depends only on that row (batch invariant), and is deterministic.
// The 16-byte path needs dim % 4 == 0 and aligned x, out and weight; otherwise a scalar path with
// the same structure runs.
Status launch_rmsnorm(const RmsNormParams& params,
                      const float* x,      // [rows, dim]
                      const void* weight,  // [dim] weight_dtype
                      float* out,          // [rows, dim]
                      cudaStream_t stream);

// accumulator += addend, then out = rmsnorm(accumulator): the residual add and the norm after it
// in one kernel, bitwise what launch_add and launch_rmsnorm give. Each thread adds its elements
// (one rounded add each, as launch_add), stores the sums and squares them in the order
// launch_rmsnorm's thread would, so the path (16-byte or scalar) is the one launch_rmsnorm takes
// for (accumulator, weight, out); where that is the 16-byte path and addend is not 16-byte aligned,
// the two kernels run instead. out must not alias accumulator or addend.
Status launch_add_rmsnorm(const RmsNormParams& params,
                          const float* addend,  // [rows, dim]
                          float* accumulator,   // [rows, dim]
                          const void* weight,   // [dim] weight_dtype
                          float* out,           // [rows, dim]
                          cudaStream_t stream);

}  // namespace specrun::kernels::cuda
