// Logits processing and sampling on the host, for the runtime: a request's sampling settings, and
// the row functions of kernels/cpu/sampling.h (the backends' reference) with a failed row turned
// into an Error. process_logits() turns logits into the *processed* distribution (temperature,
// top-k, top-p, min-p applied, renormalised) as a full vector, because speculative verification
// compares these distributions token by token; sampling then draws from it, by inverse CDF with
// one uniform number or by Gumbel-max with noise shared between the draft and the target
// (kernels/core/random_stream.h holds the numbers of both). The target's rows are processed and
// drawn from by the backend's ops instead (target/scorer.h), where they stay.
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

// The highest logit; the lowest id among equals.
int32_t argmax(std::span<const float> logits);

// Writes the processed distribution into `probs` (same length as `logits`): zero for every token
// the filters drop, summing to one. The filters apply in order temperature, top-k, top-p, min-p;
// ties are ranked by lower token id, so top-k keeps exactly k tokens. At temperature 0 the result
// is a point mass on argmax(logits). Throws Error when the logits have no finite maximum (NaN
// or +infinity; -infinity marks a banned token and is fine).
void process_logits(const SamplingParams& params, std::span<const float> logits,
                    std::span<float> probs);

// The largest probability of softmax(logits) as they are (no temperature, no filters): a model's
// confidence in its own top token. `scratch` (as long as `logits`) receives the row's weights.
// Throws Error, as process_logits does, when the logits have no finite maximum.
double top_probability(std::span<const float> logits, std::span<float> scratch);

// Draws a token from a distribution (need not be normalised) by inverse CDF with `uniform`, in
// [0, 1).
int32_t sample_from(std::span<const float> probs, double uniform);

// Draws a token from a distribution (need not be normalised) by Gumbel-max with the noise of
// `position`: argmax over tokens of log p(x) + g(x), where g(x) = -log(-log u(x)) and u(x) is the
// stream's uniform for (position, Draw::kNoise, token x). Written as the equivalent exponential
// race, argmax p(x) / E(x) with E(x) = -log u(x), in double; ties go to the lower id. The result
// is exactly distributed as p (for independent noise), and two distributions drawn with the same
// noise agree as often as the Gumbel coupling makes them (at least (1 - tv) / (1 + tv) for total
// variation tv). Tokens beyond the distribution's width, or of probability zero, never win.
//
// `tokens`, where given, names the token each entry of `probs` stands for (strictly increasing
// ids): a distribution over part of the vocabulary, every other token's probability zero, as a
// reduced head scores it. The draw is the one the full row would make, token for token; the
// result is a token id. Empty: entry i is token i.
int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position, std::span<const int32_t> tokens = {});

// The tokens that win the shared-noise draw of `position` from `probs` (sample_with_noise) and
// would win it in turn were the ones before them removed, best first, as many as `out` holds; -1
// past the tokens of probability above zero; at most 16. A draft's other guesses at a position
// its own draw chose: the next most likely to be the target's own draw with the same noise.
// `tokens` as sample_with_noise's.
void best_with_noise(std::span<const float> probs, const RandomStream& stream, int64_t position,
                     std::span<int32_t> out, std::span<const int32_t> tokens = {});

// The tokens of the highest values, highest first (the lower id among equals), as many as `out`
// holds (at most 16); -1 past the values above -infinity (a banned token, a token a reduced head
// never scores).
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
