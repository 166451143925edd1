// Rotary position embedding and the KV-cache write on the device, separately (what Backend::rope
// and Backend::kv_write call) and fused into one kernel for the runtime to adopt.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {

// Rotates q and k in place by position * inv_freq, pairing channels by params.style. One block
// per token: the block first computes the token's head_dim / 2 angles in double (positions reach
// 10^5 and more, where an f32 product loses the low bits of the phase), rounds cos and sin to f32,
// then rotates every head with the CPU reference's arithmetic (two rounded products and a rounded
// sum, no fused multiply-add), so results match the CPU to the last bit whenever the f32 cos/sin
// do.
Status launch_rope(const RopeParams& params,
                   const int32_t* positions,  // [num_tokens]
                   const float* inv_freq,     // [head_dim / 2]
                   float* q,                  // [num_tokens, num_heads, head_dim]
                   float* k,                  // [num_tokens, num_kv_heads, head_dim]
                   cudaStream_t stream);

// Stores each token's k and v rows at its cache slot, rounded to the cache's dtype as the CPU
// rounds them (bitwise the same cache). One block per token. Slots live in device memory, so they
// are checked by the kernel: a token whose slot is outside [0, num_slots) is not written, and the
// first one is recorded in `errors` (kOutOfRange at the backend's next host wait).
Status launch_kv_write(const KvWriteParams& params,
                       const float* k,        // [num_tokens, num_kv_heads, head_dim]
                       const float* v,        // [num_tokens, num_kv_heads, head_dim]
                       const int32_t* slots,  // [num_tokens]
                       void* k_cache,         // [num_slots, num_kv_heads, head_dim] cache_dtype
                       void* v_cache,         // [num_slots, num_kv_heads, head_dim] cache_dtype
                       DeviceErrorRecord* errors,  // may be null
                       cudaStream_t stream);

struct RopeKvWriteParams {
  RopeParams rope;    // shapes of q and k, and the channel pairing
  int64_t num_slots;  // capacity of the cache in tokens
  DType cache_dtype;  // storage dtype of the cache (is_kv_cache_dtype)
};

// rope, then kv_write, in one kernel: q and k are rotated in place, the rotated k and the
// unchanged v are stored at each token's slot. Bitwise the same results as the two launches, with
// one pass over k and v instead of two. Checks as launch_rope and launch_kv_write together.
Status launch_rope_kv_write(const RopeKvWriteParams& params,
                            const int32_t* positions,  // [num_tokens]
                            const float* inv_freq,     // [head_dim / 2]
                            const int32_t* slots,      // [num_tokens]
                            float* q,                  // [num_tokens, num_heads, head_dim]
                            float* k,                  // [num_tokens, num_kv_heads, head_dim]
                            const float* v,            // [num_tokens, num_kv_heads, head_dim]
                            void* k_cache,  // [num_slots, num_kv_heads, head_dim] cache_dtype
                            void* v_cache,  // [num_slots, num_kv_heads, head_dim] cache_dtype
                            DeviceErrorRecord* errors,  // may be null
                            cudaStream_t stream);

}  // namespace specrun::kernels::cuda
