#include "kernels/cuda/verify.h"

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"

namespace specrun::kernels::cuda {
namespace {

constexpr int kSampleThreads = 512;  // one block draws over a whole vocabulary
constexpr int kSampleItems = 4;
constexpr int kArgmaxThreads = 256;  // one block per (row, position): many blocks
constexpr int kAcceptThreads = 128;

__device__ __forceinline__ bool count_valid(int32_t count, int64_t gamma) {
  return count >= 0 && count <= gamma;
}

struct Distribution {
  const float* values;  // [vocab]
  __device__ __forceinline__ float operator()(int64_t x) const { return values[x]; }
};

// max(0, p(x) - q(x)) in f32, as the CPU forms it: std::max(0.0f, v) keeps v only when 0 < v.
struct Residual {
  const float* p;  // [vocab_p]
  const float* q;  // [vocab_q], or null for a point mass on `draft`
  int64_t vocab_q;
  int32_t draft;
  __device__ __forceinline__ float operator()(int64_t x) const {
    const float q_x = q == nullptr ? (x == draft ? 1.0f : 0.0f) : (x < vocab_q ? q[x] : 0.0f);
    const float difference = __fsub_rn(p[x], q_x);
    return difference > 0.0f ? difference : 0.0f;
  }
};

__global__ void __launch_bounds__(kSampleThreads)
    rejection_kernel(VerifyParams params,
                     const float* p,                     // [batch, gamma + 1, vocab_p]
                     const float* q,                     // [batch, gamma, vocab_q] or null
                     const int32_t* drafts,              // [batch, gamma]
                     const int32_t* counts,              // [batch]
                     const double* acceptance_uniforms,  // [batch, gamma]
                     const double* token_uniforms,       // [batch, gamma + 1]
                     int32_t* tokens,                    // [batch, gamma + 1]
                     int32_t* accepted) {                // [batch]
  __shared__ SampleStorage<kSampleThreads> storage;
  __shared__ int32_t decided_k;
  __shared__ int32_t decided_rejected;
  const int64_t b = blockIdx.x;
  const int64_t width = params.gamma + 1;
  int32_t* out = tokens + b * width;                                      // [gamma + 1]
  const int32_t* row_drafts = drafts + b * params.gamma;                  // [gamma]
  const double* row_acceptance = acceptance_uniforms + b * params.gamma;  // [gamma]
  const double* row_token_uniforms = token_uniforms + b * width;          // [gamma + 1]
  const int32_t n = counts[b];
  if (!count_valid(n, params.gamma)) {
    for (int64_t j = threadIdx.x; j < width; j += kSampleThreads) out[j] = -1;
    if (threadIdx.x == 0) accepted[b] = -1;
    return;
  }

  // The acceptance tests are sequential and cheap (two loads each): one thread runs them.
  if (threadIdx.x == 0) {
    int32_t k = 0;
    bool rejected = false;
    for (; k < n; ++k) {
      const int32_t d = row_drafts[k];
      const float* p_k = p + (b * width + k) * params.vocab_p;  // [vocab_p]
      const float p_d = d >= 0 && d < params.vocab_p ? p_k[d] : 0.0f;
      float q_d = 1.0f;
      if (q != nullptr) {
        const float* q_k = q + (b * params.gamma + k) * params.vocab_q;  // [vocab_q]
        q_d = d >= 0 && d < params.vocab_q ? q_k[d] : 0.0f;
      }
      if (__dmul_rn(row_acceptance[k], static_cast<double>(q_d)) < static_cast<double>(p_d)) {
        continue;
      }
      rejected = true;
      break;
    }
    decided_k = k;
    decided_rejected = rejected ? 1 : 0;
  }
  __syncthreads();
  const int32_t k = decided_k;
  const bool rejected = decided_rejected != 0;
  for (int64_t j = threadIdx.x; j < width; j += kSampleThreads) {
    if (j < k) out[j] = row_drafts[j];
    if (j > k) out[j] = -1;
  }

  const float* p_k = p + (b * width + k) * params.vocab_p;  // [vocab_p]
  // The recovered token after a rejection of draft k + 1, or the bonus token (k = n): the token
  // uniform of that position either way.
  const double u = row_token_uniforms[k];
  int32_t token;
  if (rejected) {
    const float* q_k = q == nullptr ? nullptr : q + (b * params.gamma + k) * params.vocab_q;
    token = block_sample_from<kSampleThreads, kSampleItems>(
        Residual{p_k, q_k, params.vocab_q, row_drafts[k]}, params.vocab_p, u, storage);
    // A residual without mass means p and q agree to rounding; p itself is then exact.
    if (token < 0) {
      token = block_sample_from<kSampleThreads, kSampleItems>(Distribution{p_k}, params.vocab_p, u,
                                                              storage);
    }
  } else {
    token = block_sample_from<kSampleThreads, kSampleItems>(Distribution{p_k}, params.vocab_p, u,
                                                            storage);
  }
  if (threadIdx.x == 0) {
    out[k] = token;
    accepted[b] = k;
  }
}

__global__ void __launch_bounds__(kArgmaxThreads)
    greedy_argmax_kernel(VerifyParams params,
                         const float* p,         // [batch, gamma + 1, vocab_p]
                         const int32_t* counts,  // [batch]
                         int32_t* tokens) {      // [batch, gamma + 1]
  __shared__ ArgmaxStorage<kArgmaxThreads> storage;
  const int64_t width = params.gamma + 1;
  const int64_t b = blockIdx.x / width;
  const int64_t position = blockIdx.x % width;
  const int32_t n = counts[b];
  // Uniform over the block: whole blocks leave, none waits at a barrier alone.
  if (!count_valid(n, params.gamma) || position > n) return;
  const int32_t best = block_argmax<kArgmaxThreads>(
      Distribution{p + (b * width + position) * params.vocab_p}, params.vocab_p, storage);
  if (threadIdx.x == 0) tokens[b * width + position] = best;
}

__global__ void __launch_bounds__(kAcceptThreads)
    greedy_accept_kernel(VerifyParams params,
                         const int32_t* drafts,  // [batch, gamma]
                         const int32_t* counts,  // [batch]
                         int32_t* tokens,        // [batch, gamma + 1], argmaxes in [0, n]
                         int32_t* accepted) {    // [batch]
  const int64_t b = int64_t{blockIdx.x} * kAcceptThreads + threadIdx.x;
  if (b >= params.batch) return;
  const int64_t width = params.gamma + 1;
  int32_t* out = tokens + b * width;  // [gamma + 1]
  const int32_t n = counts[b];
  if (!count_valid(n, params.gamma)) {
    for (int64_t j = 0; j < width; ++j) out[j] = -1;
    accepted[b] = -1;
    return;
  }
  const int32_t* row_drafts = drafts + b * params.gamma;  // [gamma]
  int32_t k = 0;
  while (k < n && row_drafts[k] == out[k]) ++k;
  for (int64_t j = k + 1; j < width; ++j) out[j] = -1;
  accepted[b] = k;
}

Status check_verify(const char* name, const VerifyParams& params, const float* p,
                    const int32_t* drafts, const int32_t* counts, const int32_t* tokens,
                    const int32_t* accepted) {
  const std::string prefix = std::string(name) + ": ";
  if (params.batch < 0 || params.gamma < 0 || params.vocab_p <= 0) {
    return Status::invalid_argument(prefix + "batch and gamma must be >= 0 and vocab_p > 0");
  }
  if (params.vocab_p > INT32_MAX || params.gamma >= INT32_MAX ||
      params.batch > INT32_MAX / (params.gamma + 1)) {
    return Status::unsupported(prefix + "vocab_p and batch * (gamma + 1) must fit in an int32");
  }
  if (p == nullptr || counts == nullptr || tokens == nullptr || accepted == nullptr ||
      (drafts == nullptr && params.gamma > 0)) {
    return Status::invalid_argument(prefix + "null pointer");
  }
  return Status::ok();
}

}  // namespace

Status launch_rejection_verify(const VerifyParams& params, const float* p, const float* q,
                               const int32_t* drafts, const int32_t* counts,
                               const double* acceptance_uniforms, const double* token_uniforms,
                               int32_t* tokens, int32_t* accepted, CUstream_st* stream) {
  const Status checked =
      check_verify("rejection verify", params, p, drafts, counts, tokens, accepted);
  if (!checked.is_ok()) return checked;
  if (token_uniforms == nullptr || (params.gamma > 0 && acceptance_uniforms == nullptr)) {
    return Status::invalid_argument("rejection verify: null uniforms");
  }
  if (q != nullptr && params.vocab_q <= 0) {
    return Status::invalid_argument("rejection verify: vocab_q must be > 0 with a q");
  }
  if (params.batch == 0) return Status::ok();
  rejection_kernel<<<static_cast<unsigned>(params.batch), kSampleThreads, 0, stream>>>(
      params, p, q, drafts, counts, acceptance_uniforms, token_uniforms, tokens, accepted);
  return launch_status("rejection verify kernel");
}

Status launch_greedy_verify(const VerifyParams& params, const float* p, const int32_t* drafts,
                            const int32_t* counts, int32_t* tokens, int32_t* accepted,
                            CUstream_st* stream) {
  const Status checked = check_verify("greedy verify", params, p, drafts, counts, tokens, accepted);
  if (!checked.is_ok()) return checked;
  if (params.batch == 0) return Status::ok();
  const auto blocks = static_cast<unsigned>(params.batch * (params.gamma + 1));
  greedy_argmax_kernel<<<blocks, kArgmaxThreads, 0, stream>>>(params, p, counts, tokens);
  Status status = launch_status("greedy verify argmax kernel");
  if (!status.is_ok()) return status;
  const auto accept_blocks =
      static_cast<unsigned>((params.batch + kAcceptThreads - 1) / kAcceptThreads);
  greedy_accept_kernel<<<accept_blocks, kAcceptThreads, 0, stream>>>(params, drafts, counts, tokens,
                                                                     accepted);
  return launch_status("greedy verify accept kernel");
}

}  // namespace specrun::kernels::cuda
