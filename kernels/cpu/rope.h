#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

Status rope(const RopeParams& params,
            const int32_t* positions,  // [num_tokens]
            const float* inv_freq,     // [head_dim / 2]
            float* q,                  // [num_tokens, num_heads, head_dim], rotated in place
            float* k,                  // [num_tokens, num_kv_heads, head_dim], rotated in place
            ThreadPool& pool);

}  // namespace specrun::kernels::cpu
