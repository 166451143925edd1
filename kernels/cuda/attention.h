// Paged attention on the device, matching Backend::attention: each sequence's new tokens attend
// causally over its paged KV cache (which already holds them), with grouped-query heads, an
// optional sliding window and the softmax scale; softmax in f32 with an online (flash-style)
// maximum.
//
// Work decomposition. A block (128 threads, 4 warps) owns one (sequence, kv head) and walks that
// sequence's (query row, query head of the group) pairs in passes of 16 pairs, row-major (the heads
// of one row are adjacent). For a pass it stages the 16 query vectors in shared memory, then walks
// the keys the pass can see in tiles of 32 positions aligned to multiples of 32: the block gathers
// a tile's K and V rows through the block table into shared memory (16-byte loads when head_dim is
// a multiple of 4; 8-byte loads of four bf16 values from a bf16 cache, widened exactly as they are
// staged), and each warp scores the tile for its 4 pairs with one key per lane, takes the
// tile maximum and sum by warp butterflies, rescales its running state and accumulates P @ V with
// one channel (of 32) per lane.
//
// Splits. The context is cut at fixed multiples of kAttentionSplitPositions (64) positions. Each
// pair reduces each split it sees into (max, sum, unnormalised output) and merges the splits in
// increasing order with one fixed formula. Either one block walks all splits of its pairs and
// merges them in registers, or (when the grid would otherwise be small, as in decode and
// verification over long contexts) each split gets its own block, the per-split states go to the
// backend's scratch, and a second kernel merges them per (token, head), one warp each. Both
// schedules do the same arithmetic in the same order, and the split boundaries are absolute
// positions, so a row's output is bitwise independent of the schedule, of the other sequences in
// the batch and of how many of its own tokens share the call (batch invariance). Key tiles that a
// pair cannot see leave its state bitwise unchanged.
//
// Limits. head_dim <= 256 (kUnsupported above). Prefill runs through the same kernel: a pass
// scores 16 pairs against a key tile with CUDA-core FMAs, so long prefills run far below the
// tensor-core rate a dedicated prefill kernel would reach; passes are spread over extra blocks to
// fill the GPU. Sequence metadata lives in device memory, so the checks the CPU backend makes on
// query_start and context_lengths are made by the kernel: a block whose sequence fails them writes
// nothing and records the failure in `errors` (kInvalidArgument at the backend's next host wait;
// the message may name a different bad sequence than the CPU's). Block-table entries are trusted,
// as on the CPU. With num_seqs == 0 only num_tokens == 0 is accepted, and query_start is not read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {

inline constexpr int64_t kAttentionSplitPositions = 64;
inline constexpr int64_t kAttentionMaxHeadDim = 256;

// What the backend owns and lends to the launch.
struct AttentionWorkspace {
  float* scratch;             // device scratch for per-split states
  size_t scratch_bytes;       // its size, at least attention_scratch_bytes(...)
  int multiprocessor_count;   // of the device: sizes the grid
  DeviceErrorRecord* errors;  // first metadata failure; may be null
};

// Scratch the launch needs for its per-split states (zero when it merges in registers).
size_t attention_scratch_bytes(const AttentionParams& params, int multiprocessor_count);
// The most attention_scratch_bytes asks for at any token count from 1 to params.num_tokens (the
// other fields as given): per-split states are kept only while the grid is small, so the most can
// come below the largest count.
size_t attention_scratch_bytes_at_most(const AttentionParams& params, int multiprocessor_count);

Status launch_attention(const AttentionParams& params,
                        const float* q,              // [num_tokens, num_heads, head_dim]
                        const void* k_cache,         // [slots, num_kv_heads, head_dim] cache_dtype
                        const void* v_cache,         // [slots, num_kv_heads, head_dim] cache_dtype
                        const int32_t* query_start,  // [num_seqs + 1]
                        const int32_t* context_lengths,  // [num_seqs]
                        const int32_t* block_tables,     // [num_seqs, max_blocks_per_seq]
                        float* out,                      // [num_tokens, num_heads, head_dim]
                        const AttentionWorkspace& workspace, cudaStream_t stream);

}  // namespace specrun::kernels::cuda
