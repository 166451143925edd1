#include "tests/verify_testing.h"

#include <algorithm>

#include "runtime/sampling/sampler.h"

namespace specrun::testing {
namespace {

// The rejection sampler with its formula exposed to three deliberate mistakes.
enum class Mistake { kResidualWithoutSubtraction, kShiftedPosition, kUnprocessedDraft };

Verdict broken_verify(const Proposals& proposals, const Scores& scores, std::span<Rng> rngs,
                      Mistake mistake, float temperature) {
  Verdict verdict;
  verdict.batch = proposals.batch;
  verdict.width = proposals.gamma + 1;
  verdict.tokens.assign(static_cast<size_t>(verdict.batch * verdict.width), -1);
  verdict.accepted.assign(static_cast<size_t>(verdict.batch), 0);
  for (int64_t b = 0; b < proposals.batch; ++b) {
    Rng& rng = rngs[static_cast<size_t>(b)];
    const auto drafts = proposals.row_tokens(b);
    int32_t* out = verdict.tokens.data() + b * verdict.width;
    const int64_t n = static_cast<int64_t>(drafts.size());
    int64_t k = 0;
    bool rejected = false;
    for (; k < n; ++k) {
      const int32_t d = drafts[static_cast<size_t>(k)];
      const auto p = scores.p(b, mistake == Mistake::kShiftedPosition ? std::min(k + 1, n) : k);
      std::vector<float> q(proposals.q(b, k).begin(), proposals.q(b, k).end());
      if (mistake == Mistake::kUnprocessedDraft) {
        double total = 0.0;
        for (float& value : q) total += (value = std::pow(value, temperature));
        for (float& value : q) value = static_cast<float>(value / total);
      }
      if (rng.uniform() * q[static_cast<size_t>(d)] < p[static_cast<size_t>(d)]) {
        out[k] = d;
        continue;
      }
      std::vector<float> residual(p.size());
      double mass = 0.0;
      for (size_t x = 0; x < p.size(); ++x) {
        residual[x] =
            mistake == Mistake::kResidualWithoutSubtraction ? p[x] : std::max(0.0f, p[x] - q[x]);
        mass += residual[x];
      }
      out[k] = mass > 0 ? sample_from(residual, rng) : sample_from(p, rng);
      rejected = true;
      break;
    }
    if (!rejected) out[k] = sample_from(scores.p(b, k), rng);
    verdict.accepted[static_cast<size_t>(b)] = static_cast<int32_t>(k);
  }
  return verdict;
}

}  // namespace

Verdict ResidualWithoutSubtractionVerifier::verify(const Proposals& proposals, const Scores& scores,
                                                   std::span<Rng> rngs) const {
  return broken_verify(proposals, scores, rngs, Mistake::kResidualWithoutSubtraction, 1.0f);
}

Verdict ShiftedPositionVerifier::verify(const Proposals& proposals, const Scores& scores,
                                        std::span<Rng> rngs) const {
  return broken_verify(proposals, scores, rngs, Mistake::kShiftedPosition, 1.0f);
}

Verdict UnprocessedDraftVerifier::verify(const Proposals& proposals, const Scores& scores,
                                         std::span<Rng> rngs) const {
  return broken_verify(proposals, scores, rngs, Mistake::kUnprocessedDraft, temperature_);
}

}  // namespace specrun::testing
