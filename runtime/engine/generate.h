// Plain (non-speculative) generation: prefill the prompt, then decode one token per step until
// an end-of-sequence token, the token limit or the context limit.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/sampling/sampler.h"

namespace specrun {

struct GenerationOptions {
  SamplingParams sampling;   // how each token is chosen
  int64_t max_tokens = 256;  // new tokens at most
  bool stop_at_eos = true;   // end at any of the model's eos_token_ids (the EOS is not emitted)
};

enum class StopReason {
  kEndOfSequence,  // the model produced an EOS token
  kMaxTokens,      // max_tokens were produced
  kContextLimit,   // the sequence filled the model's context or its KV cache
  kStopped,        // the callback asked to stop
};

const char* stop_reason_name(StopReason reason);

struct GenerationResult {
  std::vector<int32_t> tokens;                      // generated tokens, EOS excluded
  StopReason stop_reason = StopReason::kMaxTokens;  // why generation ended
  int64_t prompt_tokens = 0;                        // tokens prefilled
  double prefill_ms = 0.0;                          // prompt forward and first sample
  double decode_ms = 0.0;                           // every later step
};

// Throws Error when a prompt cannot start a generation on `model`: empty, a token id outside the
// vocabulary, longer than the context limit; or when max_tokens is negative.
void validate_request(const Model& model, std::span<const int32_t> prompt, int64_t max_tokens);

// Called with each new token as soon as it is chosen; returning false stops generation.
using TokenCallback = std::function<bool(int32_t token)>;

// Runs on a fresh sequence of the model's KV cache, freed on return. Throws Error for an empty
// prompt, a prompt that does not fit the context, or bad sampling parameters.
GenerationResult generate(Model& model, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const TokenCallback& on_token = {});

}  // namespace specrun
