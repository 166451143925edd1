#include "kernels/cpu/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace specrun::kernels::cpu {

double log_sum_exp(std::span<const float> logits) {
  float highest = -std::numeric_limits<float>::infinity();
  for (const float x : logits) {
    if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
    highest = std::max(highest, x);
  }
  if (highest == -std::numeric_limits<float>::infinity() || std::isinf(highest)) return highest;
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - highest);
  return highest + std::log(sum);
}

void token_logprobs(std::span<const float> logits, int32_t token, float* chosen,
                    std::span<int32_t> top_tokens, std::span<float> top_logprobs) {
  const double total = log_sum_exp(logits);
  const auto vocab = static_cast<int64_t>(logits.size());
  const auto logprob = [&](int64_t t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(t)]) - total);
  };
  *chosen = token >= 0 && token < vocab ? logprob(token) : 0.0f;
  // Higher value first, then lower id; a NaN ranks as -infinity (its row's log-probabilities are
  // NaN anyway), so that the order is a strict one.
  const auto key = [&](int64_t t) {
    const float x = logits[static_cast<size_t>(t)];
    return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x;
  };
  const auto before = [&](int64_t a, int64_t b) {
    const float x = key(a), y = key(b);
    return x > y || (x == y && a < b);
  };
  const auto count = std::min<int64_t>(static_cast<int64_t>(top_tokens.size()), vocab);
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  for (int64_t t = 0; t < vocab; ++t) order[static_cast<size_t>(t)] = t;
  std::partial_sort(order.begin(), order.begin() + count, order.end(), before);
  for (size_t k = 0; k < top_tokens.size(); ++k) {
    const bool present = static_cast<int64_t>(k) < count;
    top_tokens[k] = present ? static_cast<int32_t>(order[k]) : -1;
    top_logprobs[k] = present ? logprob(order[k]) : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace specrun::kernels::cpu
