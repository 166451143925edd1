#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// Each target's out = x @ weight^T + bias (Backend::matmul_group; a single matmul is a group of
// one). Threads split the group's output features in one parallel region; every element is one
// dot_block reduction, so the result is bitwise independent of rows, thread count and the group it
// is computed in. A quantized weight is scaled lane group by lane group inside that reduction
// (MatmulParams has the layout).
Status matmul_group(const float* x,               // [rows, in_features]
                    const MatmulTarget* targets,  // [count], sharing rows and in_features
                    size_t count, ThreadPool& pool);

// A group of one.
Status matmul(const MatmulParams& params,
              const float* x,              // [rows, in_features]
              const void* weight,          // [out_features, in_features] weight_dtype
              const float* weight_scales,  // the scale grid of a quantized weight, or null
              const void* bias,            // [out_features] bias_dtype, or null
              float* out,                  // [rows, out_features]
              ThreadPool& pool);

}  // namespace specrun::kernels::cpu
