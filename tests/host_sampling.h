// Logits processing and sampling of single rows on the host, for the tests' references and
// expectations: the row functions of kernels/cpu/sampling.h (the backends' reference), which say
// what each computes, with a failed row turned into an Error, and a one-sequence sampler drawing
// as plain decoding does. The runtime itself processes and samples rows through the backend's ops.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/sampling/sampling_params.h"

namespace specrun {

// These throw Error where the kernel reports a failed row: logits with NaN or +infinity, or every
// token banned (process_logits, top_probability); a distribution with no mass (sample_from,
// sample_with_noise); an empty row, a `tokens` list not one id per entry, or more than 16 tokens
// asked of best_with_noise or highest.
int32_t argmax(std::span<const float> logits);
void process_logits(const SamplingParams& params, std::span<const float> logits,
                    std::span<float> probs);
double top_probability(std::span<const float> logits, std::span<float> scratch);
int32_t sample_from(std::span<const float> probs, double uniform);
int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position, std::span<const int32_t> tokens = {});
void best_with_noise(std::span<const float> probs, const RandomStream& stream, int64_t position,
                     std::span<int32_t> out, std::span<const int32_t> tokens = {});
void highest(std::span<const float> values, std::span<int32_t> out);

// The token for output `position` from the processed distribution `probs`: with the shared noise
// when params.shared_noise, else by inverse CDF with the uniform of (position, draw). `tokens` as
// sample_with_noise's: the token the full row would draw.
int32_t draw_token(const SamplingParams& params, std::span<const float> probs,
                   const RandomStream& stream, int64_t position, Draw draw,
                   std::span<const int32_t> tokens = {});

// A sampler for one sequence: its n-th sample is the token of output position n, drawn as the
// engine's plain step draws it (Draw::kToken, or the shared noise).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  const SamplingParams& params() const { return params_; }
  // Samples the next token; its processed distribution stays available in probs().
  int32_t sample(std::span<const float> logits);
  std::span<const float> probs() const { return probs_; }

 private:
  SamplingParams params_;
  RandomStream stream_;
  int64_t position_ = 0;  // output position of the next sample
  std::vector<float> probs_;
};

}  // namespace specrun
