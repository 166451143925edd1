// Log-probabilities of generated tokens, as OpenAI's logprobs report them: the target model's own,
// from its logits after the request's penalties and logit bias and before temperature and the
// top-k, top-p and min-p filters (vLLM's default), at the position each token was generated,
// whether a draft proposed it or not. Value types only.
#pragma once

#include <cstdint>
#include <string>
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

// What a token is in text (Engine::token_piece): the bytes it adds to detokenized text, a
// byte-level token's raw bytes possibly part of a UTF-8 character; a special token, which
// detokenized text skips, by its content ("<|eot_id|>") with `special` set.
struct TokenPiece {
  std::string bytes;     // the token's bytes ("" for an id the tokenizer does not know)
  bool special = false;  // a special token: `bytes` is its content, absent from the text
};

}  // namespace specrun
