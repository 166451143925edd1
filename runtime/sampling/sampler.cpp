#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/base/check.h"

namespace specrun {

void validate_sampling(const SamplingParams& params) {
  auto fail = [](const std::string& name, const std::string& rule, double value) {
    throw Error("sampling parameter " + name + " must be " + rule + ", got " +
                std::to_string(value));
  };
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    fail("temperature", "finite and >= 0", params.temperature);
  }
  if (params.top_k < 0) fail("top_k", ">= 0 (0 turns it off)", static_cast<double>(params.top_k));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) fail("top_p", "in (0, 1]", params.top_p);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) fail("min_p", "in [0, 1]", params.min_p);
}

int32_t argmax(std::span<const float> logits) {
  SPECRUN_CHECK(!logits.empty());
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

void process_logits(const SamplingParams& params, std::span<const float> logits,
                    std::span<float> probs) {
  SPECRUN_CHECK(probs.size() == logits.size() && !logits.empty());
  const size_t vocab = logits.size();
  // NaN or +infinity means the forward pass went wrong: never sample from it. -infinity bans a
  // token, but not every token.
  bool any_allowed = false;
  for (const float logit : logits) {
    if (std::isnan(logit) || logit == INFINITY) {
      throw Error("logits hold NaN or +infinity: the model's output is corrupt");
    }
    any_allowed = any_allowed || logit != -INFINITY;
  }
  if (!any_allowed) throw Error("every token's logit is -infinity: nothing can be sampled");
  if (params.temperature == 0.0f) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[static_cast<size_t>(argmax(logits))] = 1.0f;
    return;
  }
  const double inverse_temperature = 1.0 / static_cast<double>(params.temperature);
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  if (params.top_k == 0 && params.top_p >= 1.0f && params.min_p == 0.0f) {
    // No filter: a plain softmax, written straight into probs (the common case, once per drafted
    // and verified token, so no vocabulary-sized scratch is allocated).
    double total = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      const double weight =
          std::exp((static_cast<double>(logits[i]) - max_logit) * inverse_temperature);
      probs[i] = static_cast<float>(weight);
      total += weight;
    }
    const float scale = static_cast<float>(1.0 / total);
    for (float& p : probs) p *= scale;
    return;
  }
  // Softmax of logits / temperature in double: the filters compare and accumulate these masses.
  std::vector<double> weights(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    weights[i] = std::exp((static_cast<double>(logits[i]) - max_logit) * inverse_temperature);
  }

  // Candidates ranked by weight, ties by lower id; only as much of the order as needed.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const auto ranks_before = [&](int32_t a, int32_t b) {
    return weights[static_cast<size_t>(a)] != weights[static_cast<size_t>(b)]
               ? weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)]
               : a < b;
  };
  size_t kept = vocab;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab) {
    kept = static_cast<size_t>(params.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept) - 1,
                     order.end(), ranks_before);
  }
  if (params.top_p < 1.0f) {
    double total = 0.0;
    for (size_t i = 0; i < kept; ++i) total += weights[static_cast<size_t>(order[i])];
    const double target = static_cast<double>(params.top_p) * total;
    // Only the nucleus needs ranking, and it is usually a few dozen tokens of a vocabulary of tens
    // of thousands (sorting all of them took milliseconds a token): rank the best `ranked`
    // candidates exactly (a selection, then a sort of those alone), growing them fourfold until
    // their mass reaches the target. The prefix is the full order's, so the set is the same.
    size_t ranked = std::min<size_t>(kept, 64);
    double cumulative = 0.0;
    size_t count = 0;
    for (;;) {
      if (ranked < kept) {
        std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(ranked) - 1,
                         order.begin() + static_cast<std::ptrdiff_t>(kept), ranks_before);
      }
      std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(ranked), ranks_before);
      cumulative = 0.0;
      count = 0;
      while (count < ranked && cumulative < target) {
        cumulative += weights[static_cast<size_t>(order[count])];
        ++count;
      }
      if (cumulative >= target || ranked == kept) break;
      ranked = std::min(kept, ranked * 4);
    }
    kept = std::max<size_t>(count, 1);
  }
  if (params.min_p > 0.0f) {
    double top = 0.0;
    for (size_t i = 0; i < kept; ++i) top = std::max(top, weights[static_cast<size_t>(order[i])]);
    const double threshold = static_cast<double>(params.min_p) * top;
    // Keep the survivors in place; `order[0..kept)` need not be sorted here.
    size_t write = 0;
    for (size_t i = 0; i < kept; ++i) {
      if (weights[static_cast<size_t>(order[i])] >= threshold) order[write++] = order[i];
    }
    kept = write;
  }

  double total = 0.0;
  for (size_t i = 0; i < kept; ++i) total += weights[static_cast<size_t>(order[i])];
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (size_t i = 0; i < kept; ++i) {
    const size_t token = static_cast<size_t>(order[i]);
    probs[token] = static_cast<float>(weights[token] / total);
  }
}

int32_t sample_from(std::span<const float> probs, double uniform) {
  SPECRUN_CHECK(!probs.empty());
  double total = 0.0;
  for (const float p : probs) total += p;
  SPECRUN_CHECK(total > 0.0) << "cannot sample from a distribution with no mass";
  const double target = uniform * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (target < cumulative) return last_nonzero;
  }
  return last_nonzero;  // rounding left the target at the very end
}

int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position) {
  SPECRUN_CHECK(!probs.empty());
  // -log u >= 1 - u on (0, 1], so p / (1 - u) bounds a token's score p / -log(u) from above: a
  // token whose bound stays below the best score so far cannot win, and its logarithm is skipped
  // (the test is written as p * margin < best * (1 - u), without a division). The margin covers
  // the rounding of the logarithm, the products and the division (a few units in 2^-52), so the
  // winner is exactly the one scoring every token would find. A token of probability zero never
  // wins.
  constexpr double kBoundMargin = 1.0 + 0x1.0p-40;
  int64_t best = -1;
  double best_score = 0.0;
  const size_t vocab = probs.size();
  for (size_t first = 0; first < vocab; first += 4) {
    const size_t end = std::min(vocab, first + 4);
    // A block of tokens a filter removed cannot win: its noise (a pure function of the position
    // and the block) is not drawn. Top-p leaves a few dozen of tens of thousands.
    bool any_mass = false;
    for (size_t x = first; x < end; ++x) any_mass = any_mass || probs[x] > 0.0f;
    if (!any_mass) continue;
    const kernels::PhiloxWords noise =
        stream.block(position, Draw::kNoise, static_cast<uint32_t>(first / 4));
    for (size_t x = first; x < end; ++x) {
      const double p = probs[x];
      const double u = (static_cast<double>(noise.v[x - first]) + 0.5) * 0x1.0p-32;  // in (0, 1)
      if (!(p * kBoundMargin >= best_score * (1.0 - u)) || !(p > 0.0)) continue;
      const double score = p / -std::log(u);
      if (best < 0 || score > best_score) {
        best = static_cast<int64_t>(x);
        best_score = score;
      }
    }
  }
  SPECRUN_CHECK(best >= 0) << "cannot sample from a distribution with no mass";
  return static_cast<int32_t>(best);
}

int32_t draw_token(const SamplingParams& params, std::span<const float> probs,
                   const RandomStream& stream, int64_t position, Draw draw) {
  return params.shared_noise ? sample_with_noise(probs, stream, position)
                             : sample_from(probs, stream.uniform(position, draw));
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
