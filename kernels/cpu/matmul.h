#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// out = x @ weight^T + bias. Threads split the output features; every element is one
// dot_block reduction, so the result is bitwise independent of rows and thread count. A quantized
// weight is scaled lane group by lane group inside that reduction (MatmulParams has the layout).
Status matmul(const MatmulParams& params,
              const float* x,              // [rows, in_features]
              const void* weight,          // [out_features, in_features] weight_dtype
              const float* weight_scales,  // the scale grid of a quantized weight, or null
              const void* bias,            // [out_features] bias_dtype, or null
              float* out,                  // [rows, out_features]
              ThreadPool& pool);

}  // namespace specrun::kernels::cpu
