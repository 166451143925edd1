#include "kernels/cuda/verify.h"

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/core/random_stream.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 512;  // one block draws over a whole vocabulary
constexpr int kItems = 4;

struct Distribution {
  const float* values;  // [vocab]
  __device__ __forceinline__ float operator()(int64_t x) const { return values[x]; }
};

// max(0, p(x) - q(x)) in f32, as the CPU forms it: std::max(0.0f, v) keeps v only when 0 < v.
struct Residual {
  const float* p;  // [vocab]
  const float* q;  // [vocab_q], or null for a point mass on `draft`
  int64_t vocab_q;
  int32_t draft;
  __device__ __forceinline__ float operator()(int64_t x) const {
    const float q_x = q == nullptr ? (x == draft ? 1.0f : 0.0f) : (x < vocab_q ? q[x] : 0.0f);
    const float difference = __fsub_rn(p[x], q_x);
    return difference > 0.0f ? difference : 0.0f;
  }
};

struct Storage {
  union {
    SampleStorage<kThreads> sample;
    ArgmaxStorage<kThreads> argmax;
    NoiseStorage<kThreads> noise;
  };
  int32_t result;
  int32_t k;
  int32_t rejected;
  int32_t alternate_entry;
  int64_t alternate_row;
};

__device__ bool row_ok(const int32_t* p_status, int64_t row) {
  return p_status == nullptr || p_status[row] == static_cast<int32_t>(RowStatus::kOk);
}

// The target's own token from p row `row` for output position `position`: the argmax, or the
// shared-noise draw; -1 where the row could not be processed.
__device__ int32_t own_token(VerifyRule rule, const float* p, const int32_t* p_status, int64_t row,
                             int64_t vocab, const RandomStream& stream, int64_t position,
                             Storage& storage) {
  if (!row_ok(p_status, row)) return -1;
  const float* values = p + row * vocab;
  if (rule == VerifyRule::kGreedy) {
    return block_argmax<kThreads>(Distribution{values}, vocab, storage.argmax);
  }
  return block_noise_draw<kThreads>(values, vocab, nullptr, stream, position, nullptr, 0,
                                    storage.noise);
}

__global__ void __launch_bounds__(kThreads)
    verify_kernel(VerifyParams params, const VerifyRow* rows, const float* p,
                  const int32_t* p_status, const float* q, const int32_t* drafts,
                  const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                  int32_t* accepted, int32_t* alternate_taken) {
  __shared__ Storage storage;
  const int64_t b = blockIdx.x;
  const int64_t width = params.gamma + 1;
  int32_t* out = tokens + b * width;  // [gamma + 1]
  const VerifyRow row = rows[b];
  const int32_t* row_drafts = drafts + b * params.gamma;  // [gamma]
  for (int64_t j = threadIdx.x; j < width; j += kThreads) out[j] = -1;
  if (threadIdx.x == 0) {
    accepted[b] = -1;
    alternate_taken[b] = -1;
  }
  __syncthreads();
  if (row.count < 0 || row.count > params.gamma || row.p_row < 0 ||
      row.p_row + row.count >= params.p_rows) {
    return;
  }
  const RandomStream stream(row.seed);
  const int32_t n = row.count;
  int32_t k = 0;
  int32_t final_token = -1;
  int32_t taken = -1;

  if (row.rule == VerifyRule::kRejection) {
    // The acceptance tests are sequential and cheap (two loads each): one thread runs them.
    if (threadIdx.x == 0) {
      int32_t i = 0;
      bool rejected = false;
      for (; i < n; ++i) {
        const int32_t d = row_drafts[i];
        const int64_t p_index = row.p_row + i;
        const float p_d = row_ok(p_status, p_index) && d >= 0 && d < params.vocab
                              ? p[p_index * params.vocab + d]
                              : 0.0f;
        float q_d = 1.0f;
        if (q != nullptr) {
          const float* q_i = q + (b * params.gamma + i) * params.vocab_q;
          q_d = d >= 0 && d < params.vocab_q ? q_i[d] : 0.0f;
        }
        const double u = stream.uniform(row.position + i, Draw::kAcceptance);
        if (__dmul_rn(u, static_cast<double>(q_d)) < static_cast<double>(p_d)) continue;
        rejected = true;
        break;
      }
      storage.k = i;
      storage.rejected = rejected ? 1 : 0;
    }
    __syncthreads();
    k = storage.k;
    const bool rejected = storage.rejected != 0;
    const int64_t p_index = row.p_row + k;
    if (row_ok(p_status, p_index)) {
      const float* p_k = p + p_index * params.vocab;
      const double u = stream.uniform(row.position + k, Draw::kToken);
      if (rejected) {
        const float* q_k = q == nullptr ? nullptr : q + (b * params.gamma + k) * params.vocab_q;
        final_token = block_sample_from<kThreads, kItems>(
            Residual{p_k, q_k, params.vocab_q, row_drafts[k]}, params.vocab, u, storage.sample);
      }
      // A residual without mass means p and q agree to rounding; p itself is then exact.
      if (final_token < 0) {
        final_token =
            block_sample_from<kThreads, kItems>(Distribution{p_k}, params.vocab, u, storage.sample);
      }
    }
  } else {
    for (k = 0;; ++k) {
      const int32_t token = own_token(row.rule, p, p_status, row.p_row + k, params.vocab, stream,
                                      row.position + k, storage);
      final_token = token;
      if (token < 0 || k == n || row_drafts[k] != token) break;
    }
    if (final_token >= 0 && k < n && alternates != nullptr) {
      if (threadIdx.x == 0) {
        storage.alternate_entry = -1;
        storage.alternate_row = -1;
        for (int64_t a = 0; a < params.alternates_width; ++a) {
          const int64_t entry = k * params.alternates_width + a;
          const int64_t at = b * params.gamma * params.alternates_width + entry;
          if (alternates[at] != final_token) continue;
          const int64_t scored = alternate_rows[at];
          if (scored >= 0 && scored < params.p_rows) {
            storage.alternate_entry = static_cast<int32_t>(entry);
            storage.alternate_row = scored;
          }
          break;
        }
      }
      __syncthreads();
      if (storage.alternate_entry >= 0) {
        const int32_t next = own_token(row.rule, p, p_status, storage.alternate_row, params.vocab,
                                       stream, row.position + k + 1, storage);
        if (threadIdx.x == 0) out[k] = final_token;
        final_token = next;
        taken = storage.alternate_entry;
        k += 1;
      }
    }
  }
  if (threadIdx.x != 0) return;
  if (final_token < 0) return;  // undecidable: the row stays -1
  for (int32_t j = 0; j < k; ++j) {
    if (out[j] < 0) out[j] = row_drafts[j];
  }
  out[k] = final_token;
  accepted[b] = k;
  alternate_taken[b] = taken;
}

}  // namespace

Status launch_verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                     const int32_t* p_status, const float* q, const int32_t* drafts,
                     const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                     int32_t* accepted, int32_t* alternate_taken, CUstream_st* stream) {
  if (Status status = check_verify(params, q, alternates, alternate_rows); !status.is_ok()) {
    return status;
  }
  if (params.batch > INT32_MAX) return Status::unsupported("verify: more than 2^31 - 1 rows");
  if (params.batch == 0) return Status::ok();
  if (rows == nullptr || p == nullptr || tokens == nullptr || accepted == nullptr ||
      alternate_taken == nullptr || (drafts == nullptr && params.gamma > 0)) {
    return Status::invalid_argument("verify: null pointer");
  }
  verify_kernel<<<static_cast<unsigned>(params.batch), kThreads, 0, stream>>>(
      params, rows, p, p_status, q, drafts, alternates, alternate_rows, tokens, accepted,
      alternate_taken);
  return launch_status("verify kernel");
}

}  // namespace specrun::kernels::cuda
