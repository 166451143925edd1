// Logits processing and sampling on the host, for the runtime: a request's sampling settings, and
// the row functions of kernels/cpu/sampling.h (the backends' reference) with a failed row turned
// into an Error. process_logits() turns logits into the *processed* distribution (temperature,
// top-k, top-p, min-p applied, renormalised) as a full vector, because speculative verification
// compares these distributions token by token; sampling then draws from it, by inverse CDF with
// one uniform number or by Gumbel-max with noise shared between the draft and the target
// (kernels/core/random_stream.h holds the numbers of both). The step's rows, the target's and the
// draft's, are processed and drawn from by the backend's ops instead (target/scorer.h,
// draft/proposer.h), where they stay.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/core/random_stream.h"

namespace specrun {

using kernels::Draw;
using kernels::RandomStream;

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax); otherwise logits are divided by it
  int64_t top_k = 0;         // keep the k most probable tokens; 0: off
  float top_p = 1.0f;  // keep the fewest most probable tokens whose mass reaches top_p; 1: off
  float min_p = 0.0f;  // drop tokens below min_p times the most probable; 0: off
  uint64_t seed = 0;   // keys the request's random numbers (RandomStream)
  // Draw tokens by Gumbel-max with the noise of their output position (sample_with_noise), which
  // the draft and the target share, instead of by inverse CDF with independent uniforms: the
  // shared-noise verification's way of sampling, plain decoding included.
  bool shared_noise = false;
};

// Throws Error naming the parameter and value when one is out of range:
// temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1].
void validate_sampling(const SamplingParams& params);

// What the backend's process_logits reads of the settings.
kernels::LogitsSettings logits_settings(const SamplingParams& params);

// Throws Error saying why a row of logits could not be processed (`what`: "the target's row 3").
[[noreturn]] void throw_row_status(kernels::RowStatus status, const std::string& what);

// The row functions of kernels/cpu/sampling.h, which say what each computes, for rows on the host
// (the references of tests, and tools' measurements). These throw Error where the
// kernel reports a failed row: logits with NaN or +infinity, or every token banned
// (process_logits, top_probability); a distribution with no mass (sample_from,
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
