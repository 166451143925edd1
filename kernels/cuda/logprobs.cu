#include "kernels/cuda/logprobs.h"

#include <cub/block/block_reduce.cuh>

#include <cmath>

#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// A token as the ranking sees it: a NaN logit ranks as -infinity (its row's log-probabilities are
// NaN anyway), so that the order is strict.
struct Ranked {
  float key;   // the logit
  int32_t id;  // -1: none
};

__device__ __forceinline__ bool ranks_before(const Ranked& a, const Ranked& b) {
  if (a.id < 0) return false;
  if (b.id < 0) return true;
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

struct Highest {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct BetterRanked {
  __device__ __forceinline__ Ranked operator()(const Ranked& a, const Ranked& b) const {
    return ranks_before(a, b) ? a : b;
  }
};

__device__ __forceinline__ float rank_key(float x) {
  return isnan(x) ? -INFINITY : x;
}

__global__ void __launch_bounds__(kThreads)
    token_logprobs_kernel(const float* logits,         // [rows, vocab]
                          const int32_t* token_slots,  // [rows]
                          const int32_t* tokens, int64_t vocab, int64_t top,
                          float* chosen,          // [rows]
                          int32_t* top_tokens,    // [rows, top]
                          float* top_logprobs) {  // [rows, top]
  using FloatReduce = cub::BlockReduce<float, kThreads>;
  using DoubleReduce = cub::BlockReduce<double, kThreads>;
  using RankedReduce = cub::BlockReduce<Ranked, kThreads>;
  __shared__ union {
    typename FloatReduce::TempStorage floats;
    typename DoubleReduce::TempStorage doubles;
    typename RankedReduce::TempStorage ranked;
  } storage;
  __shared__ double total_shared;
  __shared__ Ranked pick_shared;

  const int64_t r = blockIdx.x;
  const float* row = logits + r * vocab;
  float local_max = -INFINITY;
  int any_nan = 0;
  for (int64_t t = threadIdx.x; t < vocab; t += kThreads) {
    const float x = row[t];
    any_nan |= isnan(x) ? 1 : 0;
    local_max = fmaxf(local_max, x);
  }
  const float highest = FloatReduce(storage.floats).Reduce(local_max, Highest());
  __syncthreads();
  const int nan_seen = __syncthreads_or(any_nan);
  if (threadIdx.x == 0) total_shared = highest;
  __syncthreads();
  const double max_shared = total_shared;
  __syncthreads();
  double total;
  if (nan_seen) {
    total = NAN;
  } else if (isinf(max_shared)) {
    total = max_shared;
  } else {
    double local = 0.0;
    for (int64_t t = threadIdx.x; t < vocab; t += kThreads) {
      local += exp(static_cast<double>(row[t]) - max_shared);
    }
    const double sum = DoubleReduce(storage.doubles).Sum(local);
    if (threadIdx.x == 0) total_shared = max_shared + log(sum);
    __syncthreads();
    total = total_shared;
    __syncthreads();
  }
  const auto logprob = [&](int64_t t) {
    return __double2float_rn(static_cast<double>(row[t]) - total);
  };
  if (threadIdx.x == 0) {
    const int32_t slot = token_slots[r];
    const int32_t token = slot >= 0 ? tokens[slot] : -1;
    chosen[r] = token >= 0 && token < vocab ? logprob(token) : 0.0f;
  }
  Ranked previous{INFINITY, -1};  // nothing picked yet: every token ranks below it
  for (int64_t k = 0; k < top; ++k) {
    Ranked best{0.0f, -1};
    for (int64_t t = threadIdx.x; t < vocab; t += kThreads) {
      const Ranked candidate{rank_key(row[t]), static_cast<int32_t>(t)};
      const bool below = previous.id < 0 || ranks_before(previous, candidate);
      if (below && ranks_before(candidate, best)) best = candidate;
    }
    const Ranked pick = RankedReduce(storage.ranked).Reduce(best, BetterRanked());
    if (threadIdx.x == 0) {
      pick_shared = pick;
      top_tokens[r * top + k] = pick.id;
      top_logprobs[r * top + k] = pick.id >= 0 ? logprob(pick.id) : -INFINITY;
    }
    __syncthreads();
    previous = pick_shared;
    __syncthreads();
  }
}

}  // namespace

Status launch_token_logprobs(const LogprobParams& params, const float* logits,
                             const int32_t* token_slots, const int32_t* tokens, float* chosen,
                             int32_t* top_tokens, float* top_logprobs, CUstream_st* stream) {
  if (Status status = check_logprobs(params); !status.is_ok()) return status;
  if (params.rows > INT32_MAX)
    return Status::unsupported("token_logprobs: more than 2^31 - 1 rows");
  if (params.rows == 0) return Status::ok();
  if (logits == nullptr || token_slots == nullptr || chosen == nullptr ||
      (params.top > 0 && (top_tokens == nullptr || top_logprobs == nullptr))) {
    return Status::invalid_argument("token_logprobs: null pointer");
  }
  token_logprobs_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(
      logits, token_slots, tokens, params.vocab, params.top, chosen, top_tokens, top_logprobs);
  return launch_status("token_logprobs kernel");
}

}  // namespace specrun::kernels::cuda
