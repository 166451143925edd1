// Logits processing and sampling on the host, one row at a time: the reference for every
// backend's process_logits, argmax, sample and verify ops (kernels/backend.h), which the CPU
// backend runs (tests/host_sampling.h wraps these for the tests, throwing where a row
// fails). Nothing here throws or allocates per token beyond process_logits' filter scratch.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/backend.h"
#include "kernels/core/random_stream.h"

namespace specrun::kernels::cpu {

// Whether every setting is in range: temperature finite and >= 0, top_k >= 0, top_p in (0, 1],
// min_p in [0, 1].
bool valid_settings(const LogitsSettings& settings);

// The highest value; the lowest id among equals (a NaN at index 0 wins, a NaN elsewhere never
// does). -1 for an empty row.
int32_t argmax(std::span<const float> logits);

// Writes the processed distribution into `probs` (as long as `logits`): zero for every token the
// filters drop, summing to one. The filters apply in order temperature, top-k, top-p, min-p; ties
// are ranked by lower token id, so top-k keeps exactly k tokens. At temperature 0 the result is a
// point mass on argmax(logits). A row that cannot be processed (bad settings, NaN or +infinity
// among the logits, every logit -infinity: a banned token's is fine) is all zeros, and the status
// says why.
RowStatus process_logits(const LogitsSettings& settings, std::span<const float> logits,
                         std::span<float> probs);

// The largest probability of softmax(logits) as they are (no temperature, no filters) into
// `probability`: a model's confidence in its own top token. `scratch` (as long as `logits`)
// receives the row's weights.
RowStatus top_probability(std::span<const float> logits, std::span<float> scratch,
                          double* probability);

// Draws a token from a distribution (need not be normalised) by inverse CDF with `uniform`, in
// [0, 1): the first index at which the running sum of positive values, in index order in double,
// passes uniform * total. -1 when the total is not positive.
int32_t sample_from(std::span<const float> probs, double uniform);

// Draws a token by Gumbel-max with the noise of `position`: argmax over tokens of log p(x) + g(x),
// where g(x) = -log(-log u(x)) and u(x) is the stream's uniform for (position, Draw::kNoise, token
// x). Written as the equivalent exponential race, argmax p(x) / E(x) with E(x) = -log u(x), in
// double; ties go to the lower id. Exactly distributed as p (for independent noise); two
// distributions drawn with the same noise agree as often as the Gumbel coupling makes them.
// Tokens beyond the row, or of probability zero, never win; -1 when none has mass.
//
// `tokens`, where given, names the token each entry of `probs` stands for (strictly increasing
// ids): a distribution over part of the vocabulary, as a reduced head scores it. The draw is the
// one the full row would make, token for token; the result is a token id.
int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position, std::span<const int32_t> tokens = {});

// The tokens that win the shared-noise draw of `position` (sample_with_noise) and would win it in
// turn were the ones before them removed, best first, as many as `out` holds (at most 16); -1 past
// the tokens of probability above zero, and everywhere when `tokens` is given but not one id per
// entry.
void best_with_noise(std::span<const float> probs, const RandomStream& stream, int64_t position,
                     std::span<int32_t> out, std::span<const int32_t> tokens = {});

// The tokens of the highest values, highest first (the lower id among equals), as many as `out`
// holds (at most 16); -1 past the values above -infinity.
void highest(std::span<const float> values, std::span<int32_t> out);

// One row of Backend::sample (kernels/backend.h says what it computes): the processed
// distribution into `q`, the token by the row's rule, the ranking, and with row.weigh the model's
// confidence and the weights of the tokens reported. `tokens` as sample_with_noise's (empty: entry
// i is token i). q must be as long as `logits`.
void sample_row(const SampleRow& row, std::span<const float> logits,
                std::span<const int32_t> tokens, std::span<float> q, SampledRow* out);

}  // namespace specrun::kernels::cpu
