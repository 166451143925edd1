#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

Status embedding(const EmbeddingParams& params,
                 const int32_t* token_ids,  // [num_tokens]
                 const void* table,         // [vocab_size, dim] table_dtype
                 float* out,                // [num_tokens, dim]
                 ThreadPool& pool);

}  // namespace specrun::kernels::cpu
