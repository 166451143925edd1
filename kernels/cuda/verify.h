// Speculative verification on the device: the rejection sampler and the greedy verifier of
// verify/verifier.h over dense device arrays, so that the distributions stay on the device and only
// the verdict (accepted counts and tokens) crosses to the host. Plain C++ can include this header:
// it names the stream type only by forward declaration.
#pragma once

#include <cstdint>

#include "kernels/core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace specrun::kernels::cuda {

struct VerifyParams {
  int64_t batch;    // rows (sequences)
  int64_t gamma;    // the most drafts a row may hold: the row stride of drafts, q and uniforms
  int64_t vocab_p;  // width of the target distributions, at most 2^31 - 1
  int64_t vocab_q;  // width of the draft distributions; ignored when q is null
};

// The rejection sampler's uniforms come in two arrays, as the CPU's RejectionSampler reads them
// from the row's RandomStream (runtime/sampling/random_stream.h) at the output position each
// decides: acceptance_uniforms[b, i] = uniform(position_b + i, Draw::kAcceptance) tests draft
// d_{i+1}, and token_uniforms[b, i] = uniform(position_b + i, Draw::kToken) draws the recovered
// token after a rejection of d_{i+1}, or the bonus token when i = n. Given the same numbers the
// device decides exactly as the CPU; a row with n drafts reads acceptance 0..n-1 and one token
// uniform.
// For each row b with n = counts[b] drafts: accept d_i (i = 1..n) while
// acceptance_uniforms[b, i-1] * q_i(d_i) < p_{i-1}(d_i) in double, as the CPU writes min(1, p/q)
// without the division; at the first rejection draw the recovered token from norm(max(0, p_{i-1} -
// q_i)) (p_{i-1} itself when that residual has no mass); after n acceptances draw the bonus token
// from p_n. q is zero beyond vocab_q and p beyond vocab_p; a null q is a point mass on each draft
// (prompt lookup).
//
// Output: tokens[b] = d_1..d_k, the new token, then -1; accepted[b] = k. A count outside
// [0, gamma] gives accepted[b] = -1 and a row of -1; a final draw from a distribution with no
// positive mass (the CPU throws) leaves tokens[b, k] = -1.
//
// One block per row: thread 0 runs the acceptance tests (at most gamma reads of p and q), then the
// block draws the final token with the inverse CDF of launch_sample (kernels/cuda/sampling.h),
// computing the residual on the fly from p and q without storing it. The draw rounds its sums in a
// different order than the CPU's sample_from, so it can differ only when the uniform falls within
// about vocab_p * 2^-52 of a boundary of the CDF; the acceptance decisions are exact.
Status launch_rejection_verify(
    const VerifyParams& params,
    const float* p,                     // [batch, gamma + 1, vocab_p]
    const float* q,                     // [batch, gamma, vocab_q] or null
    const int32_t* drafts,              // [batch, gamma]; null when gamma == 0
    const int32_t* counts,              // [batch]
    const double* acceptance_uniforms,  // [batch, gamma]; null when gamma == 0
    const double* token_uniforms,       // [batch, gamma + 1]
    int32_t* tokens,                    // [batch, gamma + 1]
    int32_t* accepted,                  // [batch]
    CUstream_st* stream);

// For each row: accept d_i while it is the argmax of p_{i-1} (lowest id on ties, exactly as the
// CPU's argmax); the new token is the argmax of the first disagreeing distribution, or of p_n.
// Same output and count checks as launch_rejection_verify; exact.
//
// Two launches: one block per (row, position) finds the argmax of each of the row's n + 1
// distributions in parallel, writing it into tokens; then one thread per row finds the first
// disagreement and pads the rest of its row with -1.
Status launch_greedy_verify(const VerifyParams& params,
                            const float* p,         // [batch, gamma + 1, vocab_p]
                            const int32_t* drafts,  // [batch, gamma]; null when gamma == 0
                            const int32_t* counts,  // [batch]
                            int32_t* tokens,        // [batch, gamma + 1]
                            int32_t* accepted,      // [batch]
                            CUstream_st* stream);

}  // namespace specrun::kernels::cuda
