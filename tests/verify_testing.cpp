#include "tests/verify_testing.h"

#include <algorithm>

#include "tests/host_sampling.h"

namespace specrun::testing {
namespace {

// The rejection sampler with its formula exposed to three deliberate mistakes.
enum class Mistake { kResidualWithoutSubtraction, kShiftedPosition, kUnprocessedDraft };

int32_t broken_verify(const Proposals& proposals, const Scores& scores, int64_t b,
                      const RowDraws& draws, std::span<int32_t> out, Mistake mistake,
                      float temperature) {
  const auto drafts = proposals.row_tokens(b);
  const int64_t n = static_cast<int64_t>(drafts.size());
  for (int64_t k = 0; k < n; ++k) {
    const int32_t d = drafts[static_cast<size_t>(k)];
    const int64_t position = draws.position + k;
    const auto p = scores.p(b, mistake == Mistake::kShiftedPosition ? std::min(k + 1, n) : k);
    std::vector<float> q(proposals.q(b, k).begin(), proposals.q(b, k).end());
    if (mistake == Mistake::kUnprocessedDraft) {
      double total = 0.0;
      for (float& value : q) total += (value = std::pow(value, temperature));
      for (float& value : q) value = static_cast<float>(value / total);
    }
    if (draws.stream.uniform(position, Draw::kAcceptance) * q[static_cast<size_t>(d)] <
        p[static_cast<size_t>(d)]) {
      out[static_cast<size_t>(k)] = d;
      continue;
    }
    std::vector<float> residual(p.size());
    double mass = 0.0;
    for (size_t x = 0; x < p.size(); ++x) {
      residual[x] =
          mistake == Mistake::kResidualWithoutSubtraction ? p[x] : std::max(0.0f, p[x] - q[x]);
      mass += residual[x];
    }
    const double uniform = draws.stream.uniform(position, Draw::kToken);
    out[static_cast<size_t>(k)] =
        mass > 0 ? sample_from(residual, uniform) : sample_from(p, uniform);
    return static_cast<int32_t>(k);
  }
  out[static_cast<size_t>(n)] =
      sample_from(scores.p(b, n), draws.stream.uniform(draws.position + n, Draw::kToken));
  return static_cast<int32_t>(n);
}

// The shared-noise verifier with two deliberate mistakes.
int32_t broken_shared_noise(const Proposals& proposals, const Scores& scores, int64_t b,
                            const RowDraws& draws, std::span<int32_t> out, bool plausible,
                            bool stuck) {
  const auto drafts = proposals.row_tokens(b);
  for (int64_t k = 0;; ++k) {
    const std::span<const float> p = scores.p(b, k);
    const int64_t n = static_cast<int64_t>(drafts.size());
    if (plausible && k < n) {
      const int32_t d = drafts[static_cast<size_t>(k)];
      if (d >= 0 && static_cast<size_t>(d) < p.size() && p[static_cast<size_t>(d)] > 0.0f) {
        out[static_cast<size_t>(k)] = d;
        continue;
      }
    }
    const int32_t token = sample_with_noise(p, draws.stream, draws.position + (stuck ? 0 : k));
    out[static_cast<size_t>(k)] = token;
    if (k == n || drafts[static_cast<size_t>(k)] != token) return static_cast<int32_t>(k);
  }
}

}  // namespace

int32_t ResidualWithoutSubtractionVerifier::verify_row(const Proposals& proposals,
                                                       const Scores& scores, int64_t b,
                                                       const RowDraws& draws,
                                                       std::span<int32_t> out) const {
  return broken_verify(proposals, scores, b, draws, out, Mistake::kResidualWithoutSubtraction,
                       1.0f);
}

int32_t ShiftedPositionVerifier::verify_row(const Proposals& proposals, const Scores& scores,
                                            int64_t b, const RowDraws& draws,
                                            std::span<int32_t> out) const {
  return broken_verify(proposals, scores, b, draws, out, Mistake::kShiftedPosition, 1.0f);
}

int32_t UnprocessedDraftVerifier::verify_row(const Proposals& proposals, const Scores& scores,
                                             int64_t b, const RowDraws& draws,
                                             std::span<int32_t> out) const {
  return broken_verify(proposals, scores, b, draws, out, Mistake::kUnprocessedDraft, temperature_);
}

int32_t PlausibleDraftVerifier::verify_row(const Proposals& proposals, const Scores& scores,
                                           int64_t b, const RowDraws& draws,
                                           std::span<int32_t> out) const {
  return broken_shared_noise(proposals, scores, b, draws, out, /*plausible=*/true,
                             /*stuck=*/false);
}

int32_t StuckNoiseVerifier::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                       const RowDraws& draws, std::span<int32_t> out) const {
  return broken_shared_noise(proposals, scores, b, draws, out, /*plausible=*/false,
                             /*stuck=*/true);
}

}  // namespace specrun::testing
