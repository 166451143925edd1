#include "kernels/cuda/sampling.h"

#include <cuda_runtime.h>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kItems = 4;  // consecutive values per thread in a scan tile
constexpr int64_t kTile = int64_t{kThreads} * kItems;
constexpr size_t kWorkspaceAlignment = 256;

// What the first launch learns about a row and the last one needs.
struct RowStats {
  float max_logit;  // the largest logit (kOk rows)
  int32_t argmax;   // its lowest index
  int32_t status;   // a RowStatus
  int32_t sorted;   // 1 when the sort ranked this row
};

// ---- Settings -----------------------------------------------------------------------------------

// validate_sampling's rules; NaN fails every comparison, as there.
__device__ bool settings_valid(const LogitsSettings& s) {
  return isfinite(s.temperature) && s.temperature >= 0.0f && s.top_k >= 0 && s.top_p > 0.0f &&
         s.top_p <= 1.0f && s.min_p >= 0.0f && s.min_p <= 1.0f;
}

__device__ bool top_k_cuts(const LogitsSettings& s, int64_t vocab) {
  return s.top_k > 0 && s.top_k < vocab;
}

// The CPU orders tokens only for top-k (nth_element) and top-p (sort); min-p needs no order.
__device__ bool ranks_tokens(const LogitsSettings& s, int64_t vocab) {
  return s.temperature != 0.0f && (top_k_cuts(s, vocab) || s.top_p < 1.0f);
}

// exp((logit - max_logit) / temperature) in double, as the CPU computes it: the difference of two
// f32 values is exact in double, then one rounded product and the device's exp (within 1 ulp).
struct Weight {
  double max_logit;
  double inverse_temperature;
  __device__ __forceinline__ double operator()(float logit) const {
    return exp(__dmul_rn(__dsub_rn(static_cast<double>(logit), max_logit), inverse_temperature));
  }
};

// ---- Launch 1: row checks, maximum, argmax, sort input ------------------------------------------

__global__ void __launch_bounds__(kThreads)
    prepare_rows_kernel(const float* logits,             // [rows, vocab]
                        const LogitsSettings* settings,  // [rows]
                        int64_t vocab,                   //
                        float* keys,                     // [rows, vocab] sort input
                        int32_t* ids,                    // [rows, vocab] sort input
                        int32_t* segment_begin,          // [rows]
                        int32_t* segment_end,            // [rows]
                        RowStats* stats,                 // [rows]
                        int32_t* row_status) {           // [rows]
  __shared__ ArgmaxStorage<kThreads> argmax_storage;
  const int64_t row = blockIdx.x;
  const float* source = logits + row * vocab;  // [vocab]
  const LogitsSettings s = settings[row];

  ArgmaxCandidate best = no_argmax_candidate();
  bool corrupt = false;
  bool allowed = false;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float logit = source[i];
    corrupt = corrupt || isnan(logit) || logit == INFINITY;
    allowed = allowed || logit != -INFINITY;
    const ArgmaxCandidate candidate = argmax_candidate(logit, i);
    if (ranks_before(candidate, best)) best = candidate;
  }
  corrupt = __syncthreads_or(corrupt);
  allowed = __syncthreads_or(allowed);
  const int32_t argmax = block_reduce_argmax<kThreads>(best, argmax_storage);

  RowStatus status = RowStatus::kOk;
  if (!settings_valid(s)) {
    status = RowStatus::kBadSettings;
  } else if (corrupt) {
    status = RowStatus::kCorruptLogits;
  } else if (!allowed) {
    status = RowStatus::kAllBanned;
  }
  const bool sort = status == RowStatus::kOk && ranks_tokens(s, vocab);
  if (threadIdx.x == 0) {
    stats[row] = RowStats{status == RowStatus::kOk ? source[argmax] : 0.0f, argmax,
                          static_cast<int32_t>(status), sort ? 1 : 0};
    // rows * vocab fits in an int32 (checked on the host). An empty segment is left untouched.
    const int32_t begin = static_cast<int32_t>(row * vocab);
    segment_begin[row] = begin;
    segment_end[row] = sort ? begin + static_cast<int32_t>(vocab) : begin;
    row_status[row] = static_cast<int32_t>(status);
  }
  if (sort) {
    float* row_keys = keys + row * vocab;  // [vocab]
    int32_t* row_ids = ids + row * vocab;  // [vocab]
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      row_keys[i] = source[i];
      row_ids[i] = static_cast<int32_t>(i);
    }
  }
}

// ---- Launch 3: weights, filters, output ---------------------------------------------------------

struct FinalizeStorage {
  union {
    cub::BlockScan<double, kThreads>::TempStorage scan;
    cub::BlockReduce<double, kThreads>::TempStorage sum;
    cub::BlockReduce<int32_t, kThreads>::TempStorage count;
    double chunk[kThreads];
  };
  double total;
  int32_t kept;
  int32_t stop;
};

// The block-wide sum of `mine`, in a fixed tree: the same bits in every thread.
__device__ double block_sum(double mine, FinalizeStorage& storage) {
  const double total = cub::BlockReduce<double, kThreads>(storage.sum).Sum(mine);
  if (threadIdx.x == 0) storage.total = total;
  __syncthreads();
  const double result = storage.total;
  __syncthreads();
  return result;
}

// Inclusive sums of the weights of sorted positions [0, count), tile by tile in a fixed order;
// visit(position, inclusive sum) sees every position once. Returns the total of every tile.
template <typename Visit>
__device__ double scan_sorted_weights(const float* sorted_logits,  // [count]
                                      const Weight& weight, int64_t count, FinalizeStorage& storage,
                                      Visit visit) {
  const int64_t first = int64_t{threadIdx.x} * kItems;
  RunningSum running{0.0};
  for (int64_t base = 0; base < count; base += kTile) {
    double sums[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t position = base + first + i;
      // Zeros past the end leave every sum unchanged.
      sums[i] = position < count ? weight(sorted_logits[position]) : 0.0;
    }
    cub::BlockScan<double, kThreads>(storage.scan).InclusiveSum(sums, sums, running);
    __syncthreads();  // the next tile reuses the scan storage
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t position = base + first + i;
      if (position < count) visit(position, sums[i]);
    }
  }
  if (threadIdx.x == 0) storage.total = running.total;
  __syncthreads();
  const double total = storage.total;
  __syncthreads();
  return total;
}

// The top-p cut by sequential sums: total = sum of the kept weights in rank order, one at a time;
// then the fewest leading weights whose running sum reaches top_p * total. (The CPU sums the total
// in id order, and its exp may differ from the device's by an ulp: the two cuts can disagree only
// where a partial sum lies within rounding of the target; the process_logits cases of
// tests/test_backend_ops.cpp expect no such row.)
// The block computes a chunk of weights at a time and thread 0 accumulates them in order. Slow
// for a long row, and needed only when the parallel sums lie within rounding of the cut.
__device__ int64_t sequential_top_p(const float* sorted_logits,  // [kept]
                                    const Weight& weight, int64_t kept, float top_p,
                                    FinalizeStorage& storage) {
  double total = 0.0;  // meaningful in thread 0
  for (int64_t base = 0; base < kept; base += kThreads) {
    const int64_t position = base + threadIdx.x;
    storage.chunk[threadIdx.x] = position < kept ? weight(sorted_logits[position]) : 0.0;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t n = kept - base < kThreads ? kept - base : kThreads;
      for (int64_t j = 0; j < n; ++j) total = __dadd_rn(total, storage.chunk[j]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) storage.total = total;
  __syncthreads();
  const double target = __dmul_rn(static_cast<double>(top_p), storage.total);

  int64_t count = 0;  // meaningful in thread 0
  double cumulative = 0.0;
  for (int64_t base = 0; base < kept; base += kThreads) {
    const int64_t position = base + threadIdx.x;
    storage.chunk[threadIdx.x] = position < kept ? weight(sorted_logits[position]) : 0.0;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t n = kept - base < kThreads ? kept - base : kThreads;
      int64_t j = 0;
      for (; j < n && cumulative < target; ++j) {
        cumulative = __dadd_rn(cumulative, storage.chunk[j]);
        ++count;
      }
      storage.stop = j < n ? 1 : 0;
    }
    __syncthreads();
    if (storage.stop != 0) break;
  }
  if (threadIdx.x == 0) storage.kept = static_cast<int32_t>(count > 1 ? count : 1);
  __syncthreads();
  const int64_t result = storage.kept;
  __syncthreads();
  return result;
}

// How many of the `kept` ranked tokens top-p keeps: 1 + the number of partial sums S_c,
// c in [1, kept), below top_p * S_kept (the CPU's loop stops at the first S_c >= the target).
__device__ int64_t top_p_kept(const float* sorted_logits,  // [kept]
                              const Weight& weight, int64_t kept, float top_p,
                              FinalizeStorage& storage) {
  const double total =
      scan_sorted_weights(sorted_logits, weight, kept, storage, [](int64_t, double) {});
  const double target = __dmul_rn(static_cast<double>(top_p), total);
  // Both the CPU's sums and these are within kept * 2^-53 of the exact ones (relative to the
  // total), and the weights within 2 ulps of each other; 2^-49 per term leaves a factor of 4.
  const double margin = static_cast<double>(kept + 8) * 0x1.0p-49 * total;
  int32_t below = 0;
  bool close = false;
  scan_sorted_weights(sorted_logits, weight, kept, storage,
                      [&](int64_t position, double inclusive) {
                        if (position + 1 >= kept) return;  // S_kept is not compared
                        below += inclusive < target ? 1 : 0;
                        close = close || fabs(inclusive - target) <= margin;
                      });
  const int32_t below_total = cub::BlockReduce<int32_t, kThreads>(storage.count).Sum(below);
  if (threadIdx.x == 0) storage.kept = 1 + below_total;
  // Also publishes storage.kept.
  if (__syncthreads_or(close)) return sequential_top_p(sorted_logits, weight, kept, top_p, storage);
  const int64_t result = storage.kept;
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kThreads)
    finalize_rows_kernel(const float* logits,             // [rows, vocab]
                         const LogitsSettings* settings,  // [rows]
                         const RowStats* stats,           // [rows]
                         const float* sorted_logits,      // [rows, vocab], ranking rows only
                         const int32_t* sorted_ids,       // [rows, vocab], ranking rows only
                         int64_t vocab,                   //
                         float* probs) {                  // [rows, vocab]
  __shared__ FinalizeStorage storage;
  const int64_t row = blockIdx.x;
  const float* source = logits + row * vocab;  // [vocab]
  float* out = probs + row * vocab;            // [vocab]
  const RowStats row_stats = stats[row];
  const LogitsSettings s = settings[row];

  if (row_stats.status != static_cast<int32_t>(RowStatus::kOk)) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) out[i] = 0.0f;
    return;
  }
  if (s.temperature == 0.0f) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      out[i] = i == row_stats.argmax ? 1.0f : 0.0f;
    }
    return;
  }
  const Weight weight{static_cast<double>(row_stats.max_logit),
                      __ddiv_rn(1.0, static_cast<double>(s.temperature))};

  if (s.top_k == 0 && s.top_p >= 1.0f && s.min_p == 0.0f) {
    // The CPU's unfiltered path rounds each weight to f32 and scales by the f32 reciprocal of the
    // total; the filtered paths below round the double quotient instead. Each is mirrored.
    double local = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      local = __dadd_rn(local, weight(source[i]));
    }
    const double total = block_sum(local, storage);
    const float scale = __double2float_rn(__ddiv_rn(1.0, total));
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      out[i] = __fmul_rn(__double2float_rn(weight(source[i])), scale);
    }
    return;
  }

  const bool min_p_on = s.min_p > 0.0f;
  if (row_stats.sorted == 0) {
    // Min-p alone (a top-k at or above vocab keeps every token). The largest weight is the
    // maximum's, exp(0) = 1.
    const double threshold = __dmul_rn(static_cast<double>(s.min_p), weight(row_stats.max_logit));
    double local = 0.0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const double w = weight(source[i]);
      if (!min_p_on || w >= threshold) local = __dadd_rn(local, w);
    }
    const double total = block_sum(local, storage);
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const double w = weight(source[i]);
      out[i] = !min_p_on || w >= threshold ? __double2float_rn(__ddiv_rn(w, total)) : 0.0f;
    }
    return;
  }

  const float* ranked = sorted_logits + row * vocab;     // [vocab] descending
  const int32_t* ranked_ids = sorted_ids + row * vocab;  // [vocab]
  int64_t kept = top_k_cuts(s, vocab) ? s.top_k : vocab;
  if (s.top_p < 1.0f) kept = top_p_kept(ranked, weight, kept, s.top_p, storage);
  // The largest kept weight is the first ranked one, the maximum's: exp(0) = 1.
  const double threshold = __dmul_rn(static_cast<double>(s.min_p), weight(ranked[0]));
  double local = 0.0;
  for (int64_t j = threadIdx.x; j < kept; j += kThreads) {
    const double w = weight(ranked[j]);
    if (!min_p_on || w >= threshold) local = __dadd_rn(local, w);
  }
  const double total = block_sum(local, storage);
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) out[i] = 0.0f;
  // Orders the zeros before the scattered writes below (same block, so the barrier suffices).
  __syncthreads();
  for (int64_t j = threadIdx.x; j < kept; j += kThreads) {
    const double w = weight(ranked[j]);
    if (!min_p_on || w >= threshold) out[ranked_ids[j]] = __double2float_rn(__ddiv_rn(w, total));
  }
}

// ---- Argmax and sampling ------------------------------------------------------------------------

struct RowValue {
  const float* row;  // [vocab]
  __device__ __forceinline__ float operator()(int64_t i) const { return row[i]; }
};

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* values,  // [rows, vocab]
                                                          int64_t vocab,        //
                                                          int32_t* out) {       // [rows]
  __shared__ ArgmaxStorage<kThreads> storage;
  const int64_t row = blockIdx.x;
  const int32_t best = block_argmax<kThreads>(RowValue{values + row * vocab}, vocab, storage);
  if (threadIdx.x == 0) out[row] = best;
}

// ---- Backend::sample ----------------------------------------------------------------------------

__global__ void gather_settings_kernel(const SampleRow* rows, int64_t count,
                                       LogitsSettings* settings) {  // [count]
  const int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (r < count) settings[r] = rows[r].settings;
}

// A ranking pass's values: -infinity (highest() never ranks it) and the tokens ranked already
// read as -infinity, so that block_argmax passes over them.
struct RankedValue {
  const float* row;         // [width]
  const int32_t* tokens;    // [width] or null
  const int32_t* excluded;  // [count] token ids
  int32_t count;
  __device__ __forceinline__ float operator()(int64_t i) const {
    const int32_t token = tokens == nullptr ? static_cast<int32_t>(i) : tokens[i];
    for (int32_t e = 0; e < count; ++e) {
      if (excluded[e] == token) return -INFINITY;
    }
    return row[i];
  }
};

// The entry of the highest value not left out, the lowest among equals; -1 when none is left
// (the argmax is then a value of -infinity).
__device__ int32_t block_ranked_argmax(const RankedValue& value, int64_t width,
                                       ArgmaxStorage<kThreads>& storage) {
  const int32_t best = block_argmax<kThreads>(value, width, storage);
  return value(best) > -INFINITY ? best : -1;
}

struct SampleRowStorage {
  union {
    ArgmaxStorage<kThreads> argmax;
    SampleStorage<kThreads> sample;
    NoiseStorage<kThreads> noise;
    typename cub::BlockReduce<float, kThreads>::TempStorage max;
    typename cub::BlockReduce<double, kThreads>::TempStorage sum;
  };
  SampledRow result;
  float max_logit;
  double total;
};

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(const SampleRow* rows,      // [rows]
                       const float* logits,        // [rows, width]
                       const int32_t* tokens,      // [width] or null
                       int64_t width,              //
                       const int32_t* row_status,  // [rows] process_logits'
                       float* q,                   // [rows, width]
                       SampledRow* out,            // [rows]
                       int32_t* drawn) {           // [rows] or null
  __shared__ SampleRowStorage storage;
  const int64_t r = blockIdx.x;
  const SampleRow row = rows[r];
  const float* row_logits = logits + r * width;
  float* row_q = q + r * width;
  SampledRow& result = storage.result;
  if (threadIdx.x == 0) {
    result = SampledRow{};
    result.token = -1;
    for (int i = 0; i < kMaxRanked; ++i) result.ranked[i] = -1;
    result.status = row_status[r];
  }
  __syncthreads();
  const bool known_rule = row.rule == SampleRule::kArgmax || row.rule == SampleRule::kInverseCdf ||
                          row.rule == SampleRule::kSharedNoise;
  const auto token_of = [&](int32_t entry) {
    return entry < 0 || tokens == nullptr ? entry : tokens[entry];
  };
  int32_t status = result.status;
  if (!known_rule || row.ranked < 0 || row.ranked > kMaxRanked) {
    for (int64_t i = threadIdx.x; i < width; i += kThreads) row_q[i] = 0.0f;
    status = static_cast<int32_t>(RowStatus::kBadSettings);
  }
  if (status == static_cast<int32_t>(RowStatus::kOk)) {
    const RandomStream stream(row.seed);
    int32_t token = -1;
    if (row.rule == SampleRule::kArgmax) {
      token = token_of(block_argmax<kThreads>(RowValue{row_logits}, width, storage.argmax));
    } else if (row.rule == SampleRule::kInverseCdf) {
      token = token_of(block_sample_from<kThreads, kItems>(
          RowValue{row_q}, width, stream.uniform(row.position, row.draw), storage.sample));
    } else {
      token = block_noise_draw<kThreads>(row_q, width, tokens, stream, row.position, nullptr, 0,
                                         storage.noise);
    }
    // The ranking, one block-wide selection a place; every thread reads the places so far from
    // shared memory.
    const float* ranked_by = row.rule == SampleRule::kArgmax ? row_logits : row_q;
    for (int32_t k = 0; k < row.ranked; ++k) {
      int32_t next;
      if (row.rule == SampleRule::kSharedNoise) {
        next = block_noise_draw<kThreads>(row_q, width, tokens, stream, row.position, result.ranked,
                                          k, storage.noise);
      } else {
        next = token_of(block_ranked_argmax(RankedValue{ranked_by, tokens, result.ranked, k}, width,
                                            storage.argmax));
      }
      if (next < 0) break;
      if (threadIdx.x == 0) result.ranked[k] = next;
      __syncthreads();
    }
    if (row.weigh != 0) {
      // top_probability's weights: exp(logit - max), their total in double.
      float mine = -INFINITY;
      for (int64_t i = threadIdx.x; i < width; i += kThreads) mine = fmaxf(mine, row_logits[i]);
      const float max_logit =
          cub::BlockReduce<float, kThreads>(storage.max).Reduce(mine, ::cuda::maximum<>{});
      if (threadIdx.x == 0) storage.max_logit = max_logit;
      __syncthreads();
      const double top = storage.max_logit;
      double sum = 0.0;
      for (int64_t i = threadIdx.x; i < width; i += kThreads) {
        sum = __dadd_rn(sum, exp(__dsub_rn(static_cast<double>(row_logits[i]), top)));
      }
      const double total = cub::BlockReduce<double, kThreads>(storage.sum).Sum(sum);
      if (threadIdx.x == 0) storage.total = total;
      __syncthreads();
      if (threadIdx.x == 0) {
        const auto weight_of = [&](int32_t id) {
          int64_t entry = id;
          if (tokens != nullptr && id >= 0) {
            // The map is strictly increasing: a binary search.
            int64_t low = 0, high = width;
            while (low < high) {
              const int64_t mid = (low + high) / 2;
              if (tokens[mid] < id) {
                low = mid + 1;
              } else {
                high = mid;
              }
            }
            entry = low < width && tokens[low] == id ? low : -1;
          }
          if (entry < 0 || entry >= width) return 0.0f;
          return __double2float_rn(exp(__dsub_rn(static_cast<double>(row_logits[entry]), top)));
        };
        result.top_probability = 1.0 / storage.total;
        result.token_weight = weight_of(token);
        result.probe_weight = row.probe >= 0 ? weight_of(row.probe) : 0.0f;
        for (int32_t k = 0; k < row.ranked; ++k) {
          if (result.ranked[k] >= 0) result.ranked_weight[k] = weight_of(result.ranked[k]);
        }
      }
    }
    if (threadIdx.x == 0) result.token = token;
  } else if (threadIdx.x == 0) {
    result.status = status;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    out[r] = result;
    if (drawn != nullptr) drawn[r] = max(result.token, 0);
  }
}

// ---- Host side ----------------------------------------------------------------------------------

size_t align_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Byte offsets into the workspace.
struct WorkspaceLayout {
  size_t keys[2];
  size_t ids[2];
  size_t segment_begin;
  size_t segment_end;
  size_t stats;
  size_t sort_storage;
  size_t sort_storage_bytes;
  size_t total;
};

Status check_shape(const ProcessLogitsParams& params) {
  if (Status status = check_logits({params.rows, params.vocab}); !status.is_ok()) return status;
  if (params.rows > INT32_MAX / params.vocab) {
    return Status::unsupported("process_logits: rows * vocab must fit in an int32");
  }
  return Status::ok();
}

Status layout_workspace(const ProcessLogitsParams& params, WorkspaceLayout* layout) {
  const size_t items = static_cast<size_t>(params.rows * params.vocab);
  const size_t rows = static_cast<size_t>(params.rows);
  size_t offset = 0;
  const auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset = align_up(offset + bytes);
    return at;
  };
  layout->keys[0] = take(items * sizeof(float));
  layout->keys[1] = take(items * sizeof(float));
  layout->ids[0] = take(items * sizeof(int32_t));
  layout->ids[1] = take(items * sizeof(int32_t));
  layout->segment_begin = take(rows * sizeof(int32_t));
  layout->segment_end = take(rows * sizeof(int32_t));
  layout->stats = take(rows * sizeof(RowStats));
  // The size query reads no data; it asks the device which sort configuration it will run.
  cub::DoubleBuffer<float> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> ids(nullptr, nullptr);
  size_t sort_bytes = 0;
  const cudaError_t error = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, sort_bytes, keys, ids, static_cast<int>(items), static_cast<int>(rows),
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr), 0,
      static_cast<int>(sizeof(float) * 8));
  if (error != cudaSuccess) {
    cudaGetLastError();  // the query's failure is reported here, not by the next launch
    return cuda_error_status(error, "process_logits: sort storage query");
  }
  layout->sort_storage_bytes = sort_bytes;
  layout->sort_storage = take(sort_bytes);
  layout->total = offset;
  return Status::ok();
}

template <typename T>
T* at(void* workspace, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

// sample's workspace: process_logits' (`process_bytes`), then the rows' settings and statuses.
size_t sample_workspace_layout_bytes(size_t process_bytes, size_t rows) {
  return align_up(process_bytes) + align_up(rows * sizeof(LogitsSettings)) +
         align_up(rows * sizeof(int32_t));
}

}  // namespace

Status process_logits_workspace_bytes(const ProcessLogitsParams& params, size_t* bytes) {
  if (bytes == nullptr) return Status::invalid_argument("process_logits: null bytes");
  const Status shape = check_shape(params);
  if (!shape.is_ok()) return shape;
  WorkspaceLayout layout{};
  const Status laid = layout_workspace(params, &layout);
  if (!laid.is_ok()) return laid;
  *bytes = layout.total;
  return Status::ok();
}

Status launch_process_logits(const ProcessLogitsParams& params, const float* logits,
                             const LogitsSettings* settings, void* workspace,
                             size_t workspace_bytes, float* probs, int32_t* row_status,
                             CUstream_st* stream) {
  const Status shape = check_shape(params);
  if (!shape.is_ok()) return shape;
  if (params.rows == 0) return Status::ok();
  if (logits == nullptr || settings == nullptr || workspace == nullptr || probs == nullptr ||
      row_status == nullptr) {
    return Status::invalid_argument("process_logits: null pointer");
  }
  if (!is_aligned(workspace, kWorkspaceAlignment)) {
    return Status::invalid_argument("process_logits: workspace must be 256-byte aligned");
  }
  WorkspaceLayout layout{};
  const Status laid = layout_workspace(params, &layout);
  if (!laid.is_ok()) return laid;
  if (workspace_bytes < layout.total) {
    return Status::invalid_argument("process_logits: workspace of " +
                                    std::to_string(workspace_bytes) + " bytes, needs " +
                                    std::to_string(layout.total));
  }
  float* keys[2] = {at<float>(workspace, layout.keys[0]), at<float>(workspace, layout.keys[1])};
  int32_t* ids[2] = {at<int32_t>(workspace, layout.ids[0]), at<int32_t>(workspace, layout.ids[1])};
  int32_t* segment_begin = at<int32_t>(workspace, layout.segment_begin);  // [rows]
  int32_t* segment_end = at<int32_t>(workspace, layout.segment_end);      // [rows]
  RowStats* stats = at<RowStats>(workspace, layout.stats);                // [rows]
  const unsigned grid = static_cast<unsigned>(params.rows);

  prepare_rows_kernel<<<grid, kThreads, 0, stream>>>(logits, settings, params.vocab, keys[0],
                                                     ids[0], segment_begin, segment_end, stats,
                                                     row_status);
  const Status prepared = launch_status("process_logits: prepare kernel");
  if (!prepared.is_ok()) return prepared;

  // The double-buffer form needs no third copy of the data; it reports which buffer holds the
  // result, fixed on the host by the number of radix passes.
  cub::DoubleBuffer<float> sort_keys(keys[0], keys[1]);
  cub::DoubleBuffer<int32_t> sort_ids(ids[0], ids[1]);
  size_t sort_bytes = layout.sort_storage_bytes;
  const cudaError_t sort_error = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      at<void>(workspace, layout.sort_storage), sort_bytes, sort_keys, sort_ids,
      static_cast<int>(params.rows * params.vocab), static_cast<int>(params.rows),
      static_cast<const int32_t*>(segment_begin), static_cast<const int32_t*>(segment_end), 0,
      static_cast<int>(sizeof(float) * 8), stream);
  if (sort_error != cudaSuccess) {
    cudaGetLastError();
    return cuda_error_status(sort_error, "process_logits: segmented sort");
  }
  const Status sorted = launch_status("process_logits: segmented sort");
  if (!sorted.is_ok()) return sorted;

  finalize_rows_kernel<<<grid, kThreads, 0, stream>>>(logits, settings, stats, sort_keys.Current(),
                                                      sort_ids.Current(), params.vocab, probs);
  return launch_status("process_logits: finalize kernel");
}

Status launch_argmax(const RowsParams& params, const float* values, int32_t* out,
                     CUstream_st* stream) {
  if (Status status = check_logits({params.rows, params.vocab}); !status.is_ok()) return status;
  if (params.rows > INT32_MAX) return Status::unsupported("argmax: more than 2^31 - 1 rows");
  if (params.rows == 0) return Status::ok();
  if (values == nullptr || out == nullptr) return Status::invalid_argument("argmax: null pointer");
  argmax_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(values, params.vocab,
                                                                             out);
  return launch_status("argmax kernel");
}

Status sample_workspace_bytes(const SampleParams& params, size_t* bytes) {
  if (bytes == nullptr) return Status::invalid_argument("sample: null bytes");
  if (Status status = check_logits({params.rows, params.width}); !status.is_ok()) return status;
  size_t process_bytes = 0;
  if (Status status = process_logits_workspace_bytes({params.rows, params.width}, &process_bytes);
      !status.is_ok()) {
    return status;
  }
  *bytes = sample_workspace_layout_bytes(process_bytes, static_cast<size_t>(params.rows));
  return Status::ok();
}

Status launch_sample_rows(const SampleParams& params, const SampleRow* rows, const float* logits,
                          const int32_t* tokens, void* workspace, size_t workspace_bytes, float* q,
                          SampledRow* out, int32_t* drawn, CUstream_st* stream) {
  if (Status status = check_sample(params, tokens); !status.is_ok()) return status;
  if (params.rows > INT32_MAX) return Status::unsupported("sample: more than 2^31 - 1 rows");
  if (params.rows == 0) return Status::ok();
  if (rows == nullptr || logits == nullptr || q == nullptr || out == nullptr ||
      workspace == nullptr) {
    return Status::invalid_argument("sample: null pointer");
  }
  const ProcessLogitsParams shape{params.rows, params.width};
  size_t process_bytes = 0;
  if (Status status = process_logits_workspace_bytes(shape, &process_bytes); !status.is_ok()) {
    return status;
  }
  const auto count = static_cast<size_t>(params.rows);
  const size_t needed = sample_workspace_layout_bytes(process_bytes, count);
  if (workspace_bytes < needed) {
    return Status::invalid_argument("sample: workspace of " + std::to_string(workspace_bytes) +
                                    " bytes, needs " + std::to_string(needed));
  }
  auto* settings = at<LogitsSettings>(workspace, align_up(process_bytes));  // [rows]
  auto* statuses = at<int32_t>(
      workspace, align_up(process_bytes) + align_up(count * sizeof(LogitsSettings)));  // [rows]
  constexpr int kGatherThreads = 256;
  gather_settings_kernel<<<static_cast<unsigned>((params.rows + kGatherThreads - 1) /
                                                 kGatherThreads),
                           kGatherThreads, 0, stream>>>(rows, params.rows, settings);
  if (Status status = launch_status("sample: settings gather kernel"); !status.is_ok()) {
    return status;
  }
  if (Status status = launch_process_logits(shape, logits, settings, workspace, process_bytes, q,
                                            statuses, stream);
      !status.is_ok()) {
    return status;
  }
  sample_rows_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(
      rows, logits, tokens, params.width, statuses, q, out, drawn);
  return launch_status("sample kernel");
}

}  // namespace specrun::kernels::cuda
