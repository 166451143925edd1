#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// out[i] = low + (high - low) * uniform_at(seed, i), rounded to the dtype (nearest even).
Status fill_uniform(const FillParams& params,
                    void* out,  // [count] params.dtype
                    ThreadPool& pool);

}  // namespace specrun::kernels::cpu
