// Logits processing and sampling on the device: process_logits, argmax and sample_from of
// kernels/cpu/sampling.h for many rows per launch, each row with its own settings, so that the
// processed distributions never leave the device. Plain C++ can include this header: it names the
// stream type only by forward declaration. The block-level building blocks at the end are seen only
// by nvcc; the device verifier (verify.cu) ranks and draws tokens with them, so the two agree.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace specrun::kernels::cuda {

// Each row's settings are a LogitsSettings and its outcome a RowStatus (kernels/backend.h). A row
// that is not kOk is all zeros (no mass), which launch_sample_rows answers with token -1: where the
// CPU's runtime throws, the device marks the row instead.

struct ProcessLogitsParams {
  int64_t rows;   // independent rows (sequences, or verification positions)
  int64_t vocab;  // row width; rows * vocab must fit in an int32 (the sort's offsets)
};

// The workspace bytes launch_process_logits needs for this shape on the current device (the
// sort's temporary storage depends on the device). Allocate it once, 256-byte aligned (cudaMalloc
// is), and reuse it across launches: the launchers allocate nothing.
//
// Layout: two [rows, vocab] f32 key buffers and two [rows, vocab] i32 id buffers (the sort's double
// buffers: 16 bytes a logit), the per-row segment offsets and statistics, the sort's own storage.
Status process_logits_workspace_bytes(const ProcessLogitsParams& params, size_t* bytes);

// probs = process_logits(settings[r], logits[r]) for every row r, as kernels/cpu/sampling.cpp
// defines it: temperature, top-k, top-p, min-p in that order, ties ranked by lower token id, the
// kept weights renormalised; temperature 0 gives a point mass on the argmax.
//
// Three stages on `stream`:
// 1. One block per row checks the logits and settings, finds the maximum and the argmax, and for
//    the rows that rank tokens (top-k below vocab, or top-p below 1) copies (logit, id) pairs into
//    the workspace; the other rows get empty sort segments.
// 2. cub::DeviceSegmentedRadixSort::SortPairsDescending sorts each ranking row by logit. The radix
//    sort is stable and takes -0 and +0 as equal, so equal logits stay in id order: the CPU's tie
//    rule. The CPU ranks by weight exp((logit - max) / temperature), which equal logits share; two
//    different logits share a weight only when both underflow to 0 (a weight of 0 never reaches
//    the output) or at temperatures past about 1e9 (where exp's rounding merges neighbours), so
//    ranking by logit gives the same distribution.
// 3. One block per row computes the weights in double (as the CPU does), applies the filters and
//    writes the row. The top-p cut compares a block scan of the sorted weights with top_p times
//    their total. The CPU accumulates one weight at a time, so its sums round differently, by at
//    most about kept * 2^-52 of the total; when any partial sum lies that close to the cut, the
//    block redoes the cut in the CPU's order with one thread (weights computed by the block a
//    chunk at a time), so the kept count agrees. The one gap left: at such an exact tie the
//    device's exp (within 1 ulp) could differ from the host's in the last bit of a weight.
//
// Results: the CPU's up to the last bits of exp and of the double summation order, which after
// the rounding to f32 leave at most 1 f32 ulp on the filtered paths (one rounded quotient) and 3
// on the unfiltered one (the CPU rounds the weight and the reciprocal of the total to f32, then
// multiplies); the kept tokens are the same; point masses are exact.
Status launch_process_logits(const ProcessLogitsParams& params,
                             const float* logits,             // [rows, vocab]
                             const LogitsSettings* settings,  // [rows]
                             void* workspace,                 // process_logits_workspace_bytes
                             size_t workspace_bytes,          //
                             float* probs,                    // [rows, vocab]
                             int32_t* row_status,             // [rows] RowStatus
                             CUstream_st* stream);

struct RowsParams {
  int64_t rows;   // independent rows
  int64_t vocab;  // row width, at most 2^31 - 1
};

// out[r] = argmax(values[r]): the highest value, the lowest id among equals, exactly as argmax()
// in sampler.cpp (a NaN at index 0 wins, as there; a NaN elsewhere is never chosen). One block
// per row.
Status launch_argmax(const RowsParams& params,
                     const float* values,  // [rows, vocab]
                     int32_t* out,         // [rows]
                     CUstream_st* stream);

// The workspace bytes launch_sample_rows needs: process_logits' for the shape, the rows' settings
// and their statuses. Allocate it 256-byte aligned and reuse it, as process_logits' own.
Status sample_workspace_bytes(const SampleParams& params, size_t* bytes);

// Backend::sample (kernels/backend.h; kernels/cpu/sampling.h's sample_row is the reference), every
// pointer a device pointer: a small kernel gathers the rows' settings, launch_process_logits
// writes q, then one block per row draws the token, ranks by repeated block-wide selection (each
// pass over the row leaving out the tokens already ranked), and weighs. The drawn token and the
// ranking are the CPU's up to the draws' documented gaps (launch_verify's: the inverse CDF's order
// of summation, the device's log within one ulp for the shared noise); the confidence sums the
// weights in a blocked order and the device's exp may differ from the host's in the last bit, so
// it and the weights agree to a few ulps of f32.
Status launch_sample_rows(const SampleParams& params,
                          const SampleRow* rows,   // [rows]
                          const float* logits,     // [rows, width]
                          const int32_t* tokens,   // [width] or null
                          void* workspace,         // sample_workspace_bytes
                          size_t workspace_bytes,  //
                          float* q,                // [rows, width]
                          SampledRow* out,         // [rows]
                          int32_t* drawn,          // [rows] or null
                          CUstream_st* stream);

}  // namespace specrun::kernels::cuda

#if defined(__CUDACC__)
// ---- Block-level building blocks (nvcc only) ----------------------------------------------------
// Every thread of the block calls these with the same arguments; they return the same value in
// every thread and leave `storage` free for reuse.

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>

#include <climits>

#include "kernels/core/random_stream.h"

namespace specrun::kernels::cuda {

// The CPU's argmax keeps the first index whose value is strictly greater than the best so far: a
// NaN at index 0 is never replaced and a NaN elsewhere is never chosen. `rank` makes that a total
// order: 2 for a NaN at index 0, 1 for a number, 0 for another NaN, -1 for no element.
struct ArgmaxCandidate {
  float value;
  int32_t index;
  int32_t rank;
};

__device__ __forceinline__ ArgmaxCandidate no_argmax_candidate() {
  return ArgmaxCandidate{0.0f, INT32_MAX, -1};
}

__device__ __forceinline__ ArgmaxCandidate argmax_candidate(float value, int64_t index) {
  const int32_t rank = isnan(value) ? (index == 0 ? 2 : 0) : 1;
  return ArgmaxCandidate{value, static_cast<int32_t>(index), rank};
}

// `a` comes first: higher rank, then (numbers) the larger value, then the lower index. -0 and +0
// compare equal, as they do for the CPU.
__device__ __forceinline__ bool ranks_before(const ArgmaxCandidate& a, const ArgmaxCandidate& b) {
  if (a.rank != b.rank) return a.rank > b.rank;
  if (a.rank == 1 && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

struct ArgmaxFirst {
  __device__ __forceinline__ ArgmaxCandidate operator()(const ArgmaxCandidate& a,
                                                        const ArgmaxCandidate& b) const {
    return ranks_before(b, a) ? b : a;
  }
};

template <int kThreads>
struct ArgmaxStorage {
  typename cub::BlockReduce<ArgmaxCandidate, kThreads>::TempStorage reduce;
  int32_t result;
};

// The block's best candidate (each thread brings the best of its own elements). A selection under
// a total order, so the reduction tree cannot change the answer.
template <int kThreads>
__device__ int32_t block_reduce_argmax(const ArgmaxCandidate& mine,
                                       ArgmaxStorage<kThreads>& storage) {
  const ArgmaxCandidate best =
      cub::BlockReduce<ArgmaxCandidate, kThreads>(storage.reduce).Reduce(mine, ArgmaxFirst());
  if (threadIdx.x == 0) storage.result = best.index;
  __syncthreads();
  const int32_t result = storage.result;
  __syncthreads();  // a following call may overwrite `result`
  return result;
}

// argmax over value(0), ..., value(count - 1), count >= 1. `value(i)` returns a float.
template <int kThreads, typename Value>
__device__ int32_t block_argmax(const Value& value, int64_t count,
                                ArgmaxStorage<kThreads>& storage) {
  ArgmaxCandidate best = no_argmax_candidate();
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    const ArgmaxCandidate candidate = argmax_candidate(value(i), i);
    if (ranks_before(candidate, best)) best = candidate;
  }
  return block_reduce_argmax<kThreads>(best, storage);
}

// The block prefix of a tiled BlockScan: warp 0 calls it once per tile with the tile's total, and
// lane 0's copy ends holding the total of every tile.
struct RunningSum {
  double total;
  __device__ __forceinline__ double operator()(double tile_total) {
    const double before = total;
    total = __dadd_rn(total, tile_total);
    return before;
  }
};

template <int kThreads>
struct SampleStorage {
  union {
    typename cub::BlockScan<double, kThreads>::TempStorage scan;
    typename cub::BlockReduce<int32_t, kThreads>::TempStorage reduce;
  };
  double total;
  int32_t last_positive;
  int32_t found;
};

// sample_from() of sampler.cpp over value(0), ..., value(count - 1) with `uniform` as its draw:
// the total of every value (negative ones included, as the CPU sums them), then the first index
// with a positive value at which the running sum of positive values exceeds uniform * total; the
// last positive index when rounding leaves the target at the very end; -1 when the total is not
// positive. 1 <= count <= 2^31 - 1; `value(i)` returns a float.
//
// Order: thread t of a tile owns the kItems consecutive values from t * kItems, sums them one at a
// time, the block scans those sums, and tiles follow each other through RunningSum. Both passes
// scan in the same order, so for a non-negative row the running sums end exactly at the total.
template <int kThreads, int kItems, typename Value>
__device__ int32_t block_sample_from(const Value& value, int64_t count, double uniform,
                                     SampleStorage<kThreads>& storage) {
  using Scan = cub::BlockScan<double, kThreads>;
  constexpr int64_t kTile = int64_t{kThreads} * kItems;
  const int64_t first = int64_t{threadIdx.x} * kItems;

  // Pass 1: the total, and the last positive index.
  RunningSum all{0.0};
  int32_t last_positive = -1;
  for (int64_t base = 0; base < count; base += kTile) {
    double local = 0.0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t index = base + first + i;
      if (index < count) {
        const float v = value(index);
        local = __dadd_rn(local, static_cast<double>(v));
        if (v > 0.0f) last_positive = static_cast<int32_t>(index);
      }
    }
    double unused;
    Scan(storage.scan).ExclusiveSum(local, unused, all);
    __syncthreads();  // the next tile reuses the scan storage
  }
  const int32_t last = cub::BlockReduce<int32_t, kThreads>(storage.reduce)
                           .Reduce(last_positive, ::cuda::maximum<>{});
  if (threadIdx.x == 0) {
    storage.total = all.total;  // lane 0 of warp 0 holds the prefix the scans applied
    storage.last_positive = last;
    storage.found = INT32_MAX;
  }
  __syncthreads();
  const double total = storage.total;
  const int32_t last_index = storage.last_positive;
  if (!(total > 0.0)) {
    __syncthreads();  // a following call may overwrite `total`
    return -1;
  }
  const double target = __dmul_rn(uniform, total);

  // Pass 2: the running sums of positive values, until one tile holds the crossing. Rounding can
  // make a later thread's prefix start a hair below an earlier thread's end, so every thread
  // reports its own first crossing and the lowest index wins, as the CPU's first crossing would.
  RunningSum positive{0.0};
  for (int64_t base = 0; base < count; base += kTile) {
    float values[kItems];
    double local = 0.0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t index = base + first + i;
      values[i] = index < count ? value(index) : 0.0f;
      if (values[i] > 0.0f) local = __dadd_rn(local, static_cast<double>(values[i]));
    }
    double cumulative;
    Scan(storage.scan).ExclusiveSum(local, cumulative, positive);
    bool crossed = false;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (crossed || !(values[i] > 0.0f)) continue;
      cumulative = __dadd_rn(cumulative, static_cast<double>(values[i]));
      if (target < cumulative) {
        atomicMin(&storage.found, static_cast<int32_t>(base + first + i));
        crossed = true;
      }
    }
    // Also the barrier before the next tile reuses the scan storage.
    if (__syncthreads_or(crossed)) break;
  }
  const int32_t found = storage.found;
  __syncthreads();  // a following call may overwrite `found`
  return found != INT32_MAX ? found : last_index;
}

// A shared-noise candidate: p(x) / -log u(x), the lower id among equal scores; -1: none.
struct NoiseCandidate {
  double score;
  int32_t token;
};

struct NoiseFirst {
  __device__ __forceinline__ NoiseCandidate operator()(const NoiseCandidate& a,
                                                       const NoiseCandidate& b) const {
    if (a.token < 0) return b;
    if (b.token < 0) return a;
    if (a.score != b.score) return a.score > b.score ? a : b;
    return a.token < b.token ? a : b;
  }
};

template <int kThreads>
struct NoiseStorage {
  typename cub::BlockReduce<NoiseCandidate, kThreads>::TempStorage reduce;
  int32_t result;
};

// sample_with_noise() of sampling.cpp over `values` (`count` entries) at `position`: u = (word +
// 0.5) * 2^-32, word x % 4 of the Philox block (position, kNoise, x / 4) of token x; the largest
// p / -log u wins. With `tokens` (null: entry i is token i), entry i stands for token tokens[i].
// The first `excluded_count` ids of `excluded` never win (best_with_noise's later places).
template <int kThreads>
__device__ int32_t block_noise_draw(const float* values, int64_t count, const int32_t* tokens,
                                    const RandomStream& stream, int64_t position,
                                    const int32_t* excluded, int32_t excluded_count,
                                    NoiseStorage<kThreads>& storage) {
  NoiseCandidate best{0.0, -1};
  const NoiseFirst first;
  const auto offer = [&](double p, uint32_t word, int32_t token) {
    for (int32_t e = 0; e < excluded_count; ++e) {
      if (excluded[e] == token) return;
    }
    const double u = (static_cast<double>(word) + 0.5) * 0x1.0p-32;
    best = first(best, NoiseCandidate{p / -log(u), token});
  };
  if (tokens == nullptr) {
    // Four tokens share a Philox block: a block with no mass draws nothing.
    for (int64_t base = int64_t{threadIdx.x} * 4; base < count; base += int64_t{kThreads} * 4) {
      bool any = false;
      for (int i = 0; i < 4 && base + i < count; ++i) any = any || values[base + i] > 0.0f;
      if (!any) continue;
      const PhiloxWords noise =
          stream.block(position, Draw::kNoise, static_cast<uint32_t>(base / 4));
      for (int i = 0; i < 4 && base + i < count; ++i) {
        const double p = values[base + i];
        if (p > 0.0) offer(p, noise.v[i], static_cast<int32_t>(base + i));
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < count; i += kThreads) {
      const double p = values[i];
      if (!(p > 0.0)) continue;
      const auto token = static_cast<uint32_t>(tokens[i]);
      offer(p, stream.block(position, Draw::kNoise, token / 4).v[token % 4],
            static_cast<int32_t>(token));
    }
  }
  const NoiseCandidate winner =
      cub::BlockReduce<NoiseCandidate, kThreads>(storage.reduce).Reduce(best, first);
  if (threadIdx.x == 0) storage.result = winner.token;
  __syncthreads();
  const int32_t result = storage.result;
  __syncthreads();  // a following call may overwrite `result`
  return result;
}

}  // namespace specrun::kernels::cuda
#endif  // __CUDACC__
