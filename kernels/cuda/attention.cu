#include "kernels/cuda/attention.h"

#include <algorithm>
#include <climits>
#include <string>

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kTileKeys = 32;  // one key per lane when scoring
constexpr int kPairsPerWarp = 4;
constexpr int kPairsPerPass = kWarps * kPairsPerWarp;
// Per-split states above this go through the in-register merge instead.
constexpr size_t kMaxScratchBytes = size_t{256} << 20;
// Blocks per multiprocessor the grid aims for.
constexpr int64_t kBlocksPerMultiprocessor = 4;
constexpr size_t kDefaultSharedLimit = 48 * 1024;

// Shared-memory layout for head_dim <= 32 * kChannels. Rows are padded with zeros up to
// 32 * kChannels channels. The K rows get 4 more floats: a row stride of 4 (mod 32) words puts the
// eight 16-byte reads of a quarter warp (one key per lane) in distinct banks.
template <int kChannels>
struct TileLayout {
  static constexpr int kWidth = kWarpSize * kChannels;
  static constexpr int kKStride = kWidth + 4;
  static constexpr int kVStride = kWidth;
  static constexpr int kQStride = kWidth;
  static constexpr int kKFloats = kTileKeys * kKStride;      // [kTileKeys, kKStride]
  static constexpr int kVFloats = kTileKeys * kVStride;      // [kTileKeys, kVStride]
  static constexpr int kQFloats = kPairsPerPass * kQStride;  // [kPairsPerPass, kQStride]
  static constexpr int kFloats = kKFloats + kVFloats + kQFloats;
  // Then the tile's slots: [kTileKeys] int64.
  static constexpr size_t kBytes = kFloats * sizeof(float) + kTileKeys * sizeof(int64_t);
};

struct AttentionArgs {
  const float* q;                  // [num_tokens, num_heads, head_dim]
  const void* k_cache;             // [slots, num_kv_heads, head_dim] f32 or bf16 (the Element)
  const void* v_cache;             // [slots, num_kv_heads, head_dim] f32 or bf16 (the Element)
  const int32_t* query_start;      // [num_seqs + 1]
  const int32_t* context_lengths;  // [num_seqs]
  const int32_t* block_tables;     // [num_seqs, max_blocks_per_seq]
  float* out;                      // [num_tokens, num_heads, head_dim]
  float* partial_out;              // [num_splits, num_tokens, num_heads, head_dim]
  float* partial_max;              // [num_splits, num_tokens, num_heads]
  float* partial_sum;              // [num_splits, num_tokens, num_heads]
  DeviceErrorRecord* errors;
  int64_t num_seqs;
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  int64_t sliding_window;
  int64_t num_splits;   // blocks per (sequence, kv head, pass group) in the per-split schedule
  int64_t pass_groups;  // blocks sharing one (sequence, kv head)'s passes, round robin
  float scale;
  bool vector_loads;  // head_dim % 4 == 0 and caches aligned to four elements
};

// Cache elements widened to f32, exactly: an f32 cache as it is, a bf16 one (uint16_t bits) by a
// shift. Four at a time from an address aligned to four elements.
__device__ __forceinline__ float load_cache(const float* element) {
  return __ldg(element);
}
__device__ __forceinline__ float load_cache(const uint16_t* element) {
  return __uint_as_float(static_cast<uint32_t>(__ldg(element)) << 16);
}
__device__ __forceinline__ float4 load_cache4(const float* elements) {
  return __ldg(reinterpret_cast<const float4*>(elements));
}
__device__ __forceinline__ float4 load_cache4(const uint16_t* elements) {
  const uint2 bits = __ldg(reinterpret_cast<const uint2*>(elements));
  return make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
                     __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u));
}

// The first position a query at `position` sees.
__device__ __forceinline__ int64_t window_start(int64_t position, int64_t window) {
  return window > 0 ? max(int64_t{0}, position - window + 1) : int64_t{0};
}

// Folds one split's state (max m, sum l, unnormalised output acc) into the running state. The one
// formula both schedules use: in registers, and in merge_splits_kernel from the scratch copies.
// The first fold (max = -inf) gives keep = 0 and take = 1, so it copies the split state exactly.
template <int kChannels>
__device__ __forceinline__ void merge_split(float& max_value, float& sum,
                                            float (&output)[kChannels], float m, float l,
                                            const float (&acc)[kChannels]) {
  const float new_max = fmaxf(max_value, m);
  const float keep = expf(max_value - new_max);
  const float take = expf(m - new_max);
  sum = __fmaf_rn(sum, keep, __fmul_rn(l, take));
#pragma unroll
  for (int j = 0; j < kChannels; ++j) {
    output[j] = __fmaf_rn(output[j], keep, __fmul_rn(acc[j], take));
  }
  max_value = new_max;
}

// blockIdx.x = ((sequence * num_kv_heads + kv_head) * pass_groups + pass_group) * num_splits
//              + split   (split is 0 and num_splits 1 unless kPerSplit).
// kPerSplit: this block handles split `split` only and writes per-split states; otherwise it
// handles every split of its passes and writes the normalised output. Element: the cache's
// storage, float (f32) or uint16_t (bf16 bits).
template <int kChannels, bool kPerSplit, typename Element>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const AttentionArgs a) {
  using Layout = TileLayout<kChannels>;
  extern __shared__ float4 shared_storage[];
  float* k_tile = reinterpret_cast<float*>(shared_storage);  // [kTileKeys, kKStride]
  float* v_tile = k_tile + Layout::kKFloats;                 // [kTileKeys, kVStride]
  float* q_pass = v_tile + Layout::kVFloats;                 // [kPairsPerPass, kQStride]
  int64_t* slot_tile = reinterpret_cast<int64_t*>(q_pass + Layout::kQFloats);  // [kTileKeys]

  int64_t block = blockIdx.x;
  int64_t split = 0;
  if constexpr (kPerSplit) {
    split = block % a.num_splits;
    block /= a.num_splits;
  }
  const int64_t pass_group = block % a.pass_groups;
  block /= a.pass_groups;
  const int64_t kv_head = block % a.num_kv_heads;
  const int64_t seq = block / a.num_kv_heads;

  // The checks the CPU backend makes, plus the bounds this sequence's rows must lie in (which
  // follow from the CPU's checks over all sequences, but this block sees only its own).
  const int64_t begin = a.query_start[seq];
  const int64_t end = a.query_start[seq + 1];
  const int64_t context = a.context_lengths[seq];
  const int64_t n = end - begin;  // new tokens: query rows of this sequence
  const bool covers = a.query_start[0] == 0 && a.query_start[a.num_seqs] == a.num_tokens;
  const bool possible = n >= 0 && context >= n && context <= a.max_blocks_per_seq * a.block_size;
  const bool inside = begin >= 0 && end <= a.num_tokens;
  if (!covers || !possible || !inside) {
    if (threadIdx.x == 0 && kv_head == 0 && pass_group == 0 && split == 0) {
      if (!covers) {
        report_device_error(a.errors, DeviceCheck::kQueryStart, a.num_seqs,
                            a.query_start[a.num_seqs], a.num_tokens);
      } else {
        report_device_error(a.errors, DeviceCheck::kContextLength, seq, context, n);
      }
    }
    return;  // uniform: every thread took the same branch
  }

  const int64_t group = a.num_heads / a.num_kv_heads;  // query heads per kv head
  const int64_t pairs = n * group;                     // (row, head) pairs, row-major
  if (pairs <= 0) return;
  const int64_t passes = (pairs + kPairsPerPass - 1) / kPairsPerPass;
  const int64_t head_dim = a.head_dim;
  const int64_t kv_row = a.num_kv_heads * head_dim;  // floats per cache slot
  const int64_t window = a.sliding_window;
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;  // [max_blocks_per_seq]
  // + slot * kv_row: [head_dim]
  const Element* k_head = static_cast<const Element*>(a.k_cache) + kv_head * head_dim;
  const Element* v_head = static_cast<const Element*>(a.v_cache) + kv_head * head_dim;
  const int64_t first_new_position = context - n;  // position of row 0
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;

  // Zero padding columns once; the loads below only ever write columns < head_dim.
  for (int i = threadIdx.x; i < Layout::kFloats; i += kThreads) k_tile[i] = 0.0f;

  for (int64_t pass = pass_group; pass < passes; pass += a.pass_groups) {
    const int64_t pair_begin = pass * kPairsPerPass;
    const int pair_count = static_cast<int>(min(int64_t{kPairsPerPass}, pairs - pair_begin));
    // Keys any pair of the pass can see: from the window start of its first row to the position
    // of its last row.
    const int64_t pass_last = first_new_position + (pair_begin + pair_count - 1) / group;
    const int64_t pass_first = window_start(first_new_position + pair_begin / group, window);
    int64_t split_first = pass_first / kAttentionSplitPositions;
    int64_t split_last = pass_last / kAttentionSplitPositions;
    if constexpr (kPerSplit) {
      if (split < split_first || split > split_last) continue;  // uniform
      split_first = split;
      split_last = split;
    }

    __syncthreads();  // the previous pass is done reading q_pass (and the zero fill is visible)
    for (int i = threadIdx.x; i < Layout::kQFloats; i += kThreads) {
      const int p = i / Layout::kQStride;
      const int c = i % Layout::kQStride;
      float value = 0.0f;
      if (p < pair_count && c < head_dim) {
        const int64_t pair = pair_begin + p;
        const int64_t token = begin + pair / group;
        const int64_t head = kv_head * group + pair % group;
        value = a.q[(token * a.num_heads + head) * head_dim + c];
      }
      q_pass[i] = value;
    }

    // This warp's pairs: pass pair warp + kWarps * i, so that a short pass spreads over the warps.
    bool live[kPairsPerWarp];
    int64_t key_first[kPairsPerWarp];  // first position the pair sees
    int64_t key_last[kPairsPerWarp];   // its own position
#pragma unroll
    for (int i = 0; i < kPairsPerWarp; ++i) {
      const int p = warp + kWarps * i;
      live[i] = p < pair_count;
      key_last[i] = first_new_position + (pair_begin + p) / group;
      key_first[i] = window_start(key_last[i], window);
    }
    // Where pair slot i's result goes: (token, head) -> token * num_heads + head.
    const auto output_row = [&](int i) {
      const int64_t pair = pair_begin + warp + kWarps * i;
      return (begin + pair / group) * a.num_heads + kv_head * group + pair % group;
    };
    // Running state over splits (the in-register schedule only).
    float run_max[kPairsPerWarp];
    float run_sum[kPairsPerWarp];
    float run_out[kPairsPerWarp][kChannels];
#pragma unroll
    for (int i = 0; i < kPairsPerWarp; ++i) {
      run_max[i] = -INFINITY;
      run_sum[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kChannels; ++j) run_out[i][j] = 0.0f;
    }

    for (int64_t s = split_first; s <= split_last; ++s) {
      const int64_t split_begin = s * kAttentionSplitPositions;
      const int64_t split_end = split_begin + kAttentionSplitPositions - 1;  // inclusive
      const int64_t lo = max(pass_first, split_begin);
      const int64_t hi = min(pass_last, split_end);
      float m[kPairsPerWarp];
      float l[kPairsPerWarp];
      float acc[kPairsPerWarp][kChannels];
#pragma unroll
      for (int i = 0; i < kPairsPerWarp; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < kChannels; ++j) acc[i][j] = 0.0f;
      }

      for (int64_t tile = lo - lo % kTileKeys; tile <= hi; tile += kTileKeys) {
        // The previous tile's gather finished before its compute barrier, so slot_tile is free.
        if (threadIdx.x < kTileKeys) {
          const int64_t position = tile + threadIdx.x;
          slot_tile[threadIdx.x] =
              position < context
                  ? static_cast<int64_t>(table[position / a.block_size]) * a.block_size +
                        position % a.block_size
                  : int64_t{-1};
        }
        __syncthreads();  // slots visible; every warp is done with the previous tile's K and V
        if (a.vector_loads) {
          const int quads = static_cast<int>(head_dim / 4);
          for (int i = threadIdx.x; i < kTileKeys * quads; i += kThreads) {
            const int key = i / quads;
            const int quad = i % quads;
            const int64_t slot = slot_tile[key];
            float4 k_value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 v_value = k_value;
            if (slot >= 0) {
              k_value = load_cache4(k_head + slot * kv_row + 4 * quad);
              v_value = load_cache4(v_head + slot * kv_row + 4 * quad);
            }
            *reinterpret_cast<float4*>(k_tile + key * Layout::kKStride + 4 * quad) = k_value;
            *reinterpret_cast<float4*>(v_tile + key * Layout::kVStride + 4 * quad) = v_value;
          }
        } else {
          const int width = static_cast<int>(head_dim);
          for (int i = threadIdx.x; i < kTileKeys * width; i += kThreads) {
            const int key = i / width;
            const int c = i % width;
            const int64_t slot = slot_tile[key];
            k_tile[key * Layout::kKStride + c] =
                slot >= 0 ? load_cache(k_head + slot * kv_row + c) : 0.0f;
            v_tile[key * Layout::kVStride + c] =
                slot >= 0 ? load_cache(v_head + slot * kv_row + c) : 0.0f;
          }
        }
        __syncthreads();  // the tile (and q_pass) is in shared memory

#pragma unroll
        for (int i = 0; i < kPairsPerWarp; ++i) {
          // Every condition below is the same for all lanes of the warp.
          if (!live[i]) continue;
          const int64_t first = max(key_first[i], split_begin);
          const int64_t last = min(key_last[i], split_end);
          if (first > last || tile > last || tile + kTileKeys - 1 < first) continue;
          const int64_t position = tile + lane;
          const bool valid = position >= first && position <= last;
          const float* query = q_pass + (warp + kWarps * i) * Layout::kQStride;
          const float* key = k_tile + lane * Layout::kKStride;
          float dot = 0.0f;
#pragma unroll
          for (int d = 0; d < Layout::kWidth; d += 4) {
            const float4 qv = *reinterpret_cast<const float4*>(query + d);
            const float4 kv = *reinterpret_cast<const float4*>(key + d);
            dot = __fmaf_rn(qv.x, kv.x, dot);
            dot = __fmaf_rn(qv.y, kv.y, dot);
            dot = __fmaf_rn(qv.z, kv.z, dot);
            dot = __fmaf_rn(qv.w, kv.w, dot);
          }
          const float score = valid ? __fmul_rn(dot, a.scale) : -INFINITY;
          const float tile_max = warp_max(score);
          if (tile_max == -INFINITY) continue;
          const float new_max = fmaxf(m[i], tile_max);
          const float correction = expf(m[i] - new_max);  // 0 on the pair's first tile
          const float weight = valid ? expf(score - new_max) : 0.0f;
          l[i] = __fmaf_rn(l[i], correction, warp_sum(weight));
#pragma unroll
          for (int j = 0; j < kChannels; ++j) acc[i][j] = __fmul_rn(acc[i][j], correction);
#pragma unroll 4
          for (int k = 0; k < kTileKeys; ++k) {
            const float weight_k = __shfl_sync(kFullWarp, weight, k);
            // Keys the pair cannot see weigh exactly 0: skipping them keeps the state bitwise
            // independent of which tiles the pass walks (and of stale values in those rows).
            if (weight_k != 0.0f) {
              const float* value = v_tile + k * Layout::kVStride + lane;
#pragma unroll
              for (int j = 0; j < kChannels; ++j) {
                acc[i][j] = __fmaf_rn(weight_k, value[kWarpSize * j], acc[i][j]);
              }
            }
          }
          m[i] = new_max;
        }
      }

      // Split s is complete for this pass. A pair sees split s iff its key range meets it.
#pragma unroll
      for (int i = 0; i < kPairsPerWarp; ++i) {
        if (!live[i]) continue;
        if (max(key_first[i], split_begin) > min(key_last[i], split_end)) continue;
        if constexpr (kPerSplit) {
          const int64_t index = s * a.num_tokens * a.num_heads + output_row(i);
#pragma unroll
          for (int j = 0; j < kChannels; ++j) {
            const int64_t c = lane + kWarpSize * j;
            if (c < head_dim) a.partial_out[index * head_dim + c] = acc[i][j];
          }
          if (lane == 0) {
            a.partial_max[index] = m[i];
            a.partial_sum[index] = l[i];
          }
        } else {
          merge_split<kChannels>(run_max[i], run_sum[i], run_out[i], m[i], l[i], acc[i]);
        }
      }
    }

    if constexpr (!kPerSplit) {
#pragma unroll
      for (int i = 0; i < kPairsPerWarp; ++i) {
        if (!live[i]) continue;
        const float inverse = __fdiv_rn(1.0f, run_sum[i]);
        float* destination = a.out + output_row(i) * head_dim;
#pragma unroll
        for (int j = 0; j < kChannels; ++j) {
          const int64_t c = lane + kWarpSize * j;
          if (c < head_dim) destination[c] = __fmul_rn(run_out[i][j], inverse);
        }
      }
    }
  }
}

// One warp per (token, head): merges the token's splits in increasing order, as the in-register
// schedule does, and writes the normalised output.
template <int kChannels>
__global__ void __launch_bounds__(kThreads) merge_splits_kernel(const AttentionArgs a) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.num_tokens * a.num_heads) return;
  const int64_t token = item / a.num_heads;
  const int64_t head = item % a.num_heads;

  // The token's sequence: the last s with query_start[s] <= token (an upper bound search over
  // [0, num_seqs], as on the CPU; sequences without new tokens are skipped by it).
  int64_t first = 0;
  int64_t count = a.num_seqs + 1;
  while (count > 0) {
    const int64_t step = count / 2;
    if (a.query_start[first + step] <= token) {
      first += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  const int64_t seq = first - 1;
  // Bad metadata: the attention kernel has recorded it; write nothing, read nothing.
  if (seq < 0 || seq >= a.num_seqs) return;
  const int64_t begin = a.query_start[seq];
  const int64_t n = a.query_start[seq + 1] - begin;
  const int64_t position = a.context_lengths[seq] - n + (token - begin);
  if (n <= 0 || position < 0 || position >= a.context_lengths[seq]) return;
  const int64_t split_first = window_start(position, a.sliding_window) / kAttentionSplitPositions;
  const int64_t split_last = min(position / kAttentionSplitPositions, a.num_splits - 1);

  float max_value = -INFINITY;
  float sum = 0.0f;
  float output[kChannels];
#pragma unroll
  for (int j = 0; j < kChannels; ++j) output[j] = 0.0f;
  for (int64_t s = split_first; s <= split_last; ++s) {
    const int64_t index = (s * a.num_tokens + token) * a.num_heads + head;
    float acc[kChannels];
#pragma unroll
    for (int j = 0; j < kChannels; ++j) {
      const int64_t c = lane + kWarpSize * j;
      acc[j] = c < a.head_dim ? a.partial_out[index * a.head_dim + c] : 0.0f;
    }
    merge_split<kChannels>(max_value, sum, output, a.partial_max[index], a.partial_sum[index], acc);
  }
  const float inverse = __fdiv_rn(1.0f, sum);
  float* destination = a.out + (token * a.num_heads + head) * a.head_dim;
#pragma unroll
  for (int j = 0; j < kChannels; ++j) {
    const int64_t c = lane + kWarpSize * j;
    if (c < a.head_dim) destination[c] = __fmul_rn(output[j], inverse);
  }
}

// How a launch is scheduled; depends only on shapes and the device, never on data.
struct Plan {
  int channels;        // per lane: 32 * channels >= head_dim
  bool per_split;      // one block per split plus the merge kernel
  int64_t num_splits;  // splits per (sequence, kv head, pass group) in the grid
  int64_t pass_groups;
  int64_t blocks;
  size_t shared_bytes;
  size_t scratch_bytes;
};

size_t shared_bytes_for(int channels) {
  switch (channels) {
    case 1:
      return TileLayout<1>::kBytes;
    case 2:
      return TileLayout<2>::kBytes;
    case 4:
      return TileLayout<4>::kBytes;
    default:
      return TileLayout<8>::kBytes;
  }
}

Plan make_plan(const AttentionParams& p, int multiprocessor_count) {
  Plan plan{};
  plan.channels = p.head_dim <= 32 ? 1 : p.head_dim <= 64 ? 2 : p.head_dim <= 128 ? 4 : 8;
  plan.shared_bytes = shared_bytes_for(plan.channels);
  const int64_t group = std::max<int64_t>(p.num_heads / p.num_kv_heads, 0);
  // Passes of the sequence with the most pairs: at most all tokens in one sequence.
  const int64_t most_passes =
      std::max<int64_t>(1, (p.num_tokens * group + kPairsPerPass - 1) / kPairsPerPass);
  const int64_t base = std::max<int64_t>(p.num_seqs, 1) * p.num_kv_heads;
  const int64_t target = kBlocksPerMultiprocessor * std::max(multiprocessor_count, 1);
  plan.pass_groups = std::clamp<int64_t>((target + base - 1) / base, 1, most_passes);
  // Splits of the longest possible context.
  const int64_t max_context = std::max<int64_t>(p.max_blocks_per_seq, 0) * p.block_size;
  const int64_t splits =
      std::max<int64_t>(1, (max_context + kAttentionSplitPositions - 1) / kAttentionSplitPositions);
  const size_t states = static_cast<size_t>(splits) * static_cast<size_t>(p.num_tokens) *
                        static_cast<size_t>(std::max<int64_t>(p.num_heads, 0));
  const size_t scratch = states * static_cast<size_t>(p.head_dim + 2) * sizeof(float);
  plan.per_split =
      splits > 1 && states > 0 && base * plan.pass_groups < target && scratch <= kMaxScratchBytes;
  plan.num_splits = plan.per_split ? splits : 1;
  plan.scratch_bytes = plan.per_split ? scratch : 0;
  plan.blocks = base * plan.pass_groups * plan.num_splits;
  return plan;
}

template <int kChannels, typename Element>
Status launch_planned(const Plan& plan, const AttentionArgs& args, cudaStream_t stream) {
  const size_t shared = TileLayout<kChannels>::kBytes;
  const auto kernel = plan.per_split ? paged_attention_kernel<kChannels, true, Element>
                                     : paged_attention_kernel<kChannels, false, Element>;
  if (shared > kDefaultSharedLimit) {
    const cudaError_t error = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (error != cudaSuccess) return cuda_error_status(error, "attention: shared memory limit");
  }
  kernel<<<static_cast<unsigned>(plan.blocks), kThreads, shared, stream>>>(args);
  if (Status status = launch_status("attention kernel"); !status.is_ok()) return status;
  if (plan.per_split) {
    const int64_t items = args.num_tokens * args.num_heads;
    const int64_t blocks = (items + kWarps - 1) / kWarps;
    merge_splits_kernel<kChannels><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
    return launch_status("attention merge kernel");
  }
  return Status::ok();
}

template <typename Element>
Status launch_for_channels(const Plan& plan, const AttentionArgs& args, cudaStream_t stream) {
  switch (plan.channels) {
    case 1:
      return launch_planned<1, Element>(plan, args, stream);
    case 2:
      return launch_planned<2, Element>(plan, args, stream);
    case 4:
      return launch_planned<4, Element>(plan, args, stream);
    default:
      return launch_planned<8, Element>(plan, args, stream);
  }
}

}  // namespace

size_t attention_scratch_bytes(const AttentionParams& params, int multiprocessor_count) {
  if (params.num_seqs <= 0 || params.num_tokens <= 0 || params.head_dim <= 0 ||
      params.head_dim > kAttentionMaxHeadDim || params.num_kv_heads <= 0 ||
      params.block_size <= 0) {
    return 0;
  }
  return make_plan(params, multiprocessor_count).scratch_bytes;
}

size_t attention_scratch_bytes_at_most(const AttentionParams& params, int multiprocessor_count) {
  // A count keeps per-split states only when its grid stays under the target of blocks: with at
  // least one pair per token and kPairsPerPass pairs a pass, no count from kPairsPerPass x target
  // on does, so the counts past it need not be tried (a cache of 2^31 tokens is planned too).
  const int64_t target = kBlocksPerMultiprocessor * std::max(multiprocessor_count, 1);
  const int64_t last = std::min<int64_t>(params.num_tokens, kPairsPerPass * target);
  AttentionParams at = params;
  size_t most = 0;
  for (int64_t tokens = 1; tokens <= last; ++tokens) {
    at.num_tokens = tokens;
    most = std::max(most, attention_scratch_bytes(at, multiprocessor_count));
  }
  return most;
}

Status launch_attention(const AttentionParams& params, const float* q, const void* k_cache,
                        const void* v_cache, const int32_t* query_start,
                        const int32_t* context_lengths, const int32_t* block_tables, float* out,
                        const AttentionWorkspace& workspace, cudaStream_t stream) {
  const AttentionParams& p = params;
  if (Status status = check_attention(p); !status.is_ok()) return status;
  if (p.num_seqs == 0) {
    // query_start = {0} must equal num_tokens.
    if (p.num_tokens != 0) {
      return Status::invalid_argument("attention: query_start does not cover the tokens");
    }
    return Status::ok();
  }
  if (p.head_dim > kAttentionMaxHeadDim) {
    return Status::unsupported("attention: head_dim above 256 is not implemented on CUDA");
  }
  const Plan plan = make_plan(p, workspace.multiprocessor_count);
  if (plan.blocks > INT_MAX) return Status::unsupported("attention: grid too large");
  if (plan.per_split && p.num_tokens * p.num_heads / kWarps + 1 > INT_MAX) {
    return Status::unsupported("attention: too many (token, head) pairs");
  }
  if (plan.scratch_bytes > 0 &&
      (workspace.scratch == nullptr || workspace.scratch_bytes < plan.scratch_bytes)) {
    return Status::invalid_argument("attention: scratch smaller than attention_scratch_bytes");
  }

  AttentionArgs args{};
  args.q = q;
  args.k_cache = k_cache;
  args.v_cache = v_cache;
  args.query_start = query_start;
  args.context_lengths = context_lengths;
  args.block_tables = block_tables;
  args.out = out;
  if (plan.per_split) {
    const size_t states = static_cast<size_t>(plan.num_splits) * static_cast<size_t>(p.num_tokens) *
                          static_cast<size_t>(p.num_heads);
    args.partial_out = workspace.scratch;
    args.partial_max = args.partial_out + states * static_cast<size_t>(p.head_dim);
    args.partial_sum = args.partial_max + states;
  }
  args.errors = workspace.errors;
  args.num_seqs = p.num_seqs;
  args.num_tokens = p.num_tokens;
  args.num_heads = p.num_heads;
  args.num_kv_heads = p.num_kv_heads;
  args.head_dim = p.head_dim;
  args.block_size = p.block_size;
  args.max_blocks_per_seq = p.max_blocks_per_seq;
  args.sliding_window = p.sliding_window;
  args.num_splits = plan.num_splits;
  args.pass_groups = plan.pass_groups;
  args.scale = p.scale;
  const bool bf16 = p.cache_dtype == DType::kBF16;
  const size_t quad_bytes = bf16 ? 8 : 16;
  args.vector_loads =
      p.head_dim % 4 == 0 && is_aligned(k_cache, quad_bytes) && is_aligned(v_cache, quad_bytes);
  return bf16 ? launch_for_channels<uint16_t>(plan, args, stream)
              : launch_for_channels<float>(plan, args, stream);
}

}  // namespace specrun::kernels::cuda
