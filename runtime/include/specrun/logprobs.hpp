// Log-probabilities of generated tokens, as OpenAI's logprobs report them: the target model's own,
// from its logits after the request's penalties and logit bias and before temperature and the
// top-k, top-p and min-p filters (vLLM's default), at the position each token was generated,
// whether a draft proposed it or not. Value types only.
#pragma once

#include <cstdint>
#include <vector>

namespace specrun {

// The most alternatives a request may ask for at each token (OpenAI's bound).
inline constexpr int64_t kMaxTopLogprobs = 20;

struct TopLogprob {
  int32_t token = -1;    // a token id
  float logprob = 0.0f;  // its natural log-probability
};

struct TokenLogprob {
  int32_t token = -1;           // the generated token
  float logprob = 0.0f;         // its natural log-probability
  std::vector<TopLogprob> top;  // the most likely tokens at its position, highest first (the
                                // lower id among equals), as many as the request asked
};

}  // namespace specrun
