// Paged attention: storing new keys and values into the block-paged cache, and causal attention
// of several new tokens per sequence over it.
#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

Status kv_write(const KvWriteParams& params,
                const float* k,        // [num_tokens, num_kv_heads, head_dim]
                const float* v,        // [num_tokens, num_kv_heads, head_dim]
                const int32_t* slots,  // [num_tokens]
                void* k_cache,         // [num_slots, num_kv_heads, head_dim] cache_dtype
                void* v_cache,         // [num_slots, num_kv_heads, head_dim] cache_dtype
                ThreadPool& pool);

// Two passes per (token, head): scores and their maximum, then exponentials summed and the values
// accumulated in position order, each key and value widened exactly from the cache's dtype. The
// reference for the CUDA flash-style kernels.
Status attention(const AttentionParams& params,
                 const float* q,                  // [num_tokens, num_heads, head_dim]
                 const void* k_cache,             // [slots, num_kv_heads, head_dim] cache_dtype
                 const void* v_cache,             // [slots, num_kv_heads, head_dim] cache_dtype
                 const int32_t* query_start,      // [num_seqs + 1]
                 const int32_t* context_lengths,  // [num_seqs]
                 const int32_t* block_tables,     // [num_seqs, max_blocks_per_seq]
                 const int32_t* key_gaps,         // [num_tokens, 2] or null (Backend::attention)
                 float* out,                      // [num_tokens, num_heads, head_dim]
                 ThreadPool& pool);

}  // namespace specrun::kernels::cpu
