#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

Status rmsnorm(const RmsNormParams& params,
               const float* x,      // [rows, dim]
               const void* weight,  // [dim] weight_dtype
               float* out,          // [rows, dim]; may alias x
               ThreadPool& pool);

}  // namespace specrun::kernels::cpu
