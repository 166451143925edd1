// Log-probabilities of a row of logits, as a client reads them (OpenAI's logprobs): the reference
// for every backend's token_logprobs (kernels/backend.h).
#pragma once

#include <cstdint>
#include <span>

namespace specrun::kernels::cpu {

// log sum_j exp(logits[j]): the largest logit plus the log of the sum, in double, of exp(x - max)
// over the row in index order. -infinity when every logit is -infinity; NaN where one is NaN.
double log_sum_exp(std::span<const float> logits);

// The log-softmax at `token` (0 where token is outside the row) into *chosen, and at the row's
// top_tokens.size() most likely tokens, highest first and the lower id among equals, into
// top_tokens and top_logprobs (as long as it). Each log-probability is x - log_sum_exp in double,
// rounded once to float.
void token_logprobs(std::span<const float> logits, int32_t token, float* chosen,
                    std::span<int32_t> top_tokens, std::span<float> top_logprobs);

}  // namespace specrun::kernels::cpu
