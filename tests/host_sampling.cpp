#include "tests/host_sampling.h"

#include "kernels/cpu/sampling.h"
#include "runtime/base/check.h"

namespace specrun {

double top_probability(std::span<const float> logits, std::span<float> scratch) {
  SPECRUN_CHECK(scratch.size() == logits.size() && !logits.empty());
  double probability = 0.0;
  const kernels::RowStatus status = kernels::cpu::top_probability(logits, scratch, &probability);
  if (status != kernels::RowStatus::kOk) throw_row_status(status, "the draft's logits");
  return probability;
}

int32_t argmax(std::span<const float> logits) {
  SPECRUN_CHECK(!logits.empty());
  return kernels::cpu::argmax(logits);
}

void process_logits(const SamplingParams& params, std::span<const float> logits,
                    std::span<float> probs) {
  SPECRUN_CHECK(probs.size() == logits.size() && !logits.empty());
  const kernels::RowStatus status =
      kernels::cpu::process_logits(logits_settings(params), logits, probs);
  if (status != kernels::RowStatus::kOk) throw_row_status(status, "processing logits");
}

int32_t sample_from(std::span<const float> probs, double uniform) {
  SPECRUN_CHECK(!probs.empty());
  const int32_t token = kernels::cpu::sample_from(probs, uniform);
  SPECRUN_CHECK(token >= 0) << "cannot sample from a distribution with no mass";
  return token;
}

int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position, std::span<const int32_t> tokens) {
  SPECRUN_CHECK(!probs.empty());
  SPECRUN_CHECK(tokens.empty() || tokens.size() == probs.size())
      << tokens.size() << " token ids for " << probs.size() << " probabilities";
  const int32_t token = kernels::cpu::sample_with_noise(probs, stream, position, tokens);
  SPECRUN_CHECK(token >= 0) << "cannot sample from a distribution with no mass";
  return token;
}

void best_with_noise(std::span<const float> probs, const RandomStream& stream, int64_t position,
                     std::span<int32_t> out, std::span<const int32_t> tokens) {
  SPECRUN_CHECK(out.size() <= 16) << "ranks 1 to 16 tokens, not " << out.size();
  SPECRUN_CHECK(tokens.empty() || tokens.size() == probs.size())
      << tokens.size() << " token ids for " << probs.size() << " probabilities";
  kernels::cpu::best_with_noise(probs, stream, position, out, tokens);
}

void highest(std::span<const float> values, std::span<int32_t> out) {
  SPECRUN_CHECK(out.size() <= 16) << "ranks 1 to 16 tokens, not " << out.size();
  kernels::cpu::highest(values, out);
}

int32_t draw_token(const SamplingParams& params, std::span<const float> probs,
                   const RandomStream& stream, int64_t position, Draw draw,
                   std::span<const int32_t> tokens) {
  if (params.shared_noise) return sample_with_noise(probs, stream, position, tokens);
  // Inverse CDF skips entries of probability zero: the full row's draw lands on the same token.
  SPECRUN_DCHECK(tokens.empty() || tokens.size() == probs.size());
  const int32_t entry = sample_from(probs, stream.uniform(position, draw));
  return tokens.empty() ? entry : tokens[static_cast<size_t>(entry)];
}

Sampler::Sampler(const SamplingParams& params) : params_(params), stream_(params.seed) {
  validate_sampling(params);
}

int32_t Sampler::sample(std::span<const float> logits) {
  probs_.resize(logits.size());
  process_logits(params_, logits, probs_);
  const int64_t position = position_++;
  if (params_.temperature == 0.0f) return argmax(logits);
  return draw_token(params_, probs_, stream_, position, Draw::kToken);
}

}  // namespace specrun
