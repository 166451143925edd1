// Helpers for distribution tests: a chi-square statistic with sparse cells pooled, its critical
// value, and deliberately broken verifiers that the distribution checks must reject.
#pragma once

#include <cmath>
#include <map>
#include <vector>

#include "verify/verifier.h"

namespace specrun::testing {

struct ChiSquare {
  double statistic = 0.0;  // Pearson's statistic
  int64_t degrees = 0;     // cells after pooling, minus one
  // The value a correct sampler exceeds with probability 1e-6 (Wilson-Hilferty approximation):
  // with fixed seeds the test is deterministic, and the bound leaves no room for flakiness while
  // the broken verifiers land orders of magnitude above it.
  double critical() const {
    const double z = 4.753;  // standard normal quantile of 1 - 1e-6
    const double k = static_cast<double>(degrees);
    return k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
  }
};

// Observed counts against expected probabilities (summing to one). Cells expecting fewer than five
// draws are pooled into one; a draw in a cell of probability zero is a failure by itself
// (statistic infinite).
inline ChiSquare chi_square(const std::map<int64_t, int64_t>& counts,
                            const std::map<int64_t, double>& expected, int64_t draws) {
  ChiSquare result;
  double pooled_expected = 0.0, pooled_observed = 0.0;
  int64_t cells = 0;
  for (const auto& [cell, count] : counts) {
    const auto it = expected.find(cell);
    if (it == expected.end() || it->second <= 0.0) {
      result.statistic = INFINITY;
      result.degrees = 1;
      return result;
    }
  }
  for (const auto& [cell, probability] : expected) {
    if (probability <= 0.0) continue;
    const double e = probability * static_cast<double>(draws);
    const auto it = counts.find(cell);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    if (e < 5.0) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    result.statistic += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    result.statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  result.degrees = std::max<int64_t>(1, cells - 1);
  return result;
}

// Wrong residual: recovers from p itself instead of max(0, p - q).
class ResidualWithoutSubtractionVerifier : public Verifier {
 public:
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

// Off by one position: compares d_i against p_i instead of p_{i-1}.
class ShiftedPositionVerifier : public Verifier {
 public:
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

// An unprocessed q: treats the draft's distribution as if temperature had not been applied,
// q_raw proportional to q^temperature.
class UnprocessedDraftVerifier : public Verifier {
 public:
  explicit UnprocessedDraftVerifier(float temperature) : temperature_(temperature) {}
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;

 private:
  float temperature_;
};

// Shared noise, accepting too much: a draft the target gives any probability is accepted, rather
// than only the target's own Gumbel-max token.
class PlausibleDraftVerifier : public Verifier {
 public:
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

// Shared noise that does not advance: every position of a step reads the noise of the step's
// first position, so tokens decided in one step are correlated.
class StuckNoiseVerifier : public Verifier {
 public:
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

}  // namespace specrun::testing
