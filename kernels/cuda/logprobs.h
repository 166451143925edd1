// Log-probabilities on the device (Backend::token_logprobs): each row's log-softmax at its chosen
// token and at its most likely ones, so that a request asking for logprobs copies back a few
// numbers a token, not its rows. kernels/cpu/logprobs.h is the reference: the log-sum-exp is
// summed in double as there (in another order: within a few double ulps), each result rounded to
// float once; the top tokens are the same, in the same order.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace specrun::kernels::cuda {

// One block per row: the row's maximum, its sum of exp(x - max) in double, then `top` passes each
// picking the best token ranked below the previous pick (higher logit, then lower id), so no list
// of picks is kept: top * vocab reads a row, at most 20 passes.
Status launch_token_logprobs(const LogprobParams& params,
                             const float* logits,         // [rows, vocab]
                             const int32_t* token_slots,  // [rows] index into tokens, or -1
                             const int32_t* tokens,       // what token_slots index
                             float* chosen,               // [rows]
                             int32_t* top_tokens,         // [rows, top]
                             float* top_logprobs,         // [rows, top]
                             CUstream_st* stream);

}  // namespace specrun::kernels::cuda
