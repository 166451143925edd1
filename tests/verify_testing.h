// Helpers for verification tests: a batch in the verify op's dense layout, a chi-square statistic
// with sparse cells pooled, its critical value, and deliberately broken verifiers that the
// distribution checks must reject.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "verify/verifier.h"

namespace specrun::testing {

// A verification batch in Backend::verify's (and the CUDA launcher's) dense layout.
struct VerifyBatch {
  int64_t batch = 0;
  int64_t gamma = 0;
  int64_t vocab_p = 0;
  int64_t vocab_q = 0;
  bool point_masses = false;
  std::vector<float> p;         // [batch, gamma + 1, vocab_p]
  std::vector<float> q;         // [batch, gamma, vocab_q]; empty for point masses
  std::vector<int32_t> drafts;  // [batch, gamma], -1 past a row's count
  std::vector<int32_t> counts;  // [batch]

  std::span<const float> p_row(int64_t b, int64_t i) const {
    return {p.data() + (b * (gamma + 1) + i) * vocab_p, static_cast<size_t>(vocab_p)};
  }

  // The distribution row b's new token is drawn from by rejection sampling when it accepted k
  // drafts: p_k for the bonus token, else the residual max(0, p_k - q_k) (p_k where it has no
  // mass).
  std::vector<float> final_distribution(int64_t b, int32_t k) const {
    const auto p_k = p_row(b, k);
    std::vector<float> result(p_k.begin(), p_k.end());
    if (k == counts[static_cast<size_t>(b)]) return result;
    const int32_t draft = drafts[static_cast<size_t>(b * gamma + k)];
    double mass = 0.0;
    for (int64_t x = 0; x < vocab_p; ++x) {
      float q_x = 0.0f;
      if (point_masses) {
        q_x = x == draft ? 1.0f : 0.0f;
      } else if (x < vocab_q) {
        q_x = q[static_cast<size_t>((b * gamma + k) * vocab_q + x)];
      }
      result[static_cast<size_t>(x)] = std::max(0.0f, p_k[static_cast<size_t>(x)] - q_x);
      mass += result[static_cast<size_t>(x)];
    }
    if (mass > 0.0) return result;
    return {p_k.begin(), p_k.end()};
  }
};

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
