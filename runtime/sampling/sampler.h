// Logits processing and sampling. process_logits() turns logits into the *processed*
// distribution (temperature, top-k, top-p, min-p applied, renormalised) as a full vector, because
// speculative verification compares these distributions token by token; sampling then draws from
// it with one uniform number.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampling/rng.h"

namespace specrun {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax); otherwise logits are divided by it
  int64_t top_k = 0;         // keep the k most probable tokens; 0: off
  float top_p = 1.0f;  // keep the fewest most probable tokens whose mass reaches top_p; 1: off
  float min_p = 0.0f;  // drop tokens below min_p times the most probable; 0: off
  uint64_t seed = 0;   // seeds the sampler's generator
};

// Throws Error naming the parameter and value when one is out of range:
// temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1].
void validate_sampling(const SamplingParams& params);

// The highest logit; the lowest id among equals.
int32_t argmax(std::span<const float> logits);

// Writes the processed distribution into `probs` (same length as `logits`): zero for every token
// the filters drop, summing to one. The filters apply in order temperature, top-k, top-p, min-p;
// ties are ranked by lower token id, so top-k keeps exactly k tokens. At temperature 0 the result
// is a point mass on argmax(logits). Throws Error when the logits have no finite maximum (NaN
// or +infinity; -infinity marks a banned token and is fine).
void process_logits(const SamplingParams& params, std::span<const float> logits,
                    std::span<float> probs);

// Draws a token from a distribution (need not be normalised) by inverse CDF with one uniform.
int32_t sample_from(std::span<const float> probs, Rng& rng);

// A seeded sampler for one sequence.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }
  // Samples the next token; its processed distribution stays available in probs().
  int32_t sample(std::span<const float> logits);
  std::span<const float> probs() const { return probs_; }

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<float> probs_;
};

}  // namespace specrun
