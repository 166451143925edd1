#include "verify/verifier.h"

#include <algorithm>

#include "runtime/base/check.h"
#include "runtime/sampling/sampler.h"

namespace specrun {
namespace {

Verdict make_verdict(const Proposals& proposals, const Scores& scores) {
  SPECRUN_CHECK(static_cast<int64_t>(scores.row_begin.size()) == proposals.batch + 1)
      << "scores for " << scores.row_begin.size() - 1 << " rows, proposals for " << proposals.batch;
  for (int64_t b = 0; b < proposals.batch; ++b) {
    SPECRUN_CHECK(scores.row_begin[static_cast<size_t>(b) + 1] -
                      scores.row_begin[static_cast<size_t>(b)] ==
                  proposals.counts[static_cast<size_t>(b)] + 1)
        << "row " << b << " needs one distribution more than its drafts";
  }
  Verdict verdict;
  verdict.batch = proposals.batch;
  verdict.width = proposals.gamma + 1;
  verdict.tokens.assign(static_cast<size_t>(verdict.batch * verdict.width), -1);
  verdict.accepted.assign(static_cast<size_t>(verdict.batch), 0);
  return verdict;
}

float probability(std::span<const float> distribution, int32_t token) {
  return token >= 0 && static_cast<size_t>(token) < distribution.size()
             ? distribution[static_cast<size_t>(token)]
             : 0.0f;
}

}  // namespace

Verdict RejectionSampler::verify(const Proposals& proposals, const Scores& scores,
                                 std::span<Rng> rngs) const {
  Verdict verdict = make_verdict(proposals, scores);
  SPECRUN_CHECK(static_cast<int64_t>(rngs.size()) >= proposals.batch);
  std::vector<float> residual(static_cast<size_t>(scores.vocab));
  for (int64_t b = 0; b < proposals.batch; ++b) {
    Rng& rng = rngs[static_cast<size_t>(b)];
    const std::span<const int32_t> drafts = proposals.row_tokens(b);
    int32_t* out = verdict.tokens.data() + b * verdict.width;
    int64_t k = 0;
    bool rejected = false;
    for (; k < static_cast<int64_t>(drafts.size()); ++k) {
      const int32_t draft = drafts[static_cast<size_t>(k)];
      const std::span<const float> p = scores.p(b, k);
      const float p_draft = probability(p, draft);
      const float q_draft = proposals.point_masses() ? 1.0f : probability(proposals.q(b, k), draft);
      // Accept with probability min(1, p/q), written without the division.
      if (static_cast<double>(rng.uniform()) * q_draft < p_draft) {
        out[k] = draft;
        continue;
      }
      // Recover from the residual max(0, p - q), renormalised by sample_from.
      double mass = 0.0;
      for (size_t x = 0; x < residual.size(); ++x) {
        const float q_x = proposals.point_masses()
                              ? (static_cast<int32_t>(x) == draft ? 1.0f : 0.0f)
                              : probability(proposals.q(b, k), static_cast<int32_t>(x));
        residual[x] = std::max(0.0f, p[x] - q_x);
        mass += residual[x];
      }
      // A rejection implies p(d) < q(d), hence mass somewhere else; rounding can still leave none,
      // and then p itself is the exact answer (p and q agree to rounding).
      out[k] = mass > 0.0 ? sample_from(residual, rng) : sample_from(p, rng);
      rejected = true;
      break;
    }
    if (!rejected) out[k] = sample_from(scores.p(b, k), rng);  // the bonus token
    verdict.accepted[static_cast<size_t>(b)] = static_cast<int32_t>(k);
  }
  return verdict;
}

Verdict GreedyVerifier::verify(const Proposals& proposals, const Scores& scores,
                               std::span<Rng> /*rngs*/) const {
  Verdict verdict = make_verdict(proposals, scores);
  for (int64_t b = 0; b < proposals.batch; ++b) {
    const std::span<const int32_t> drafts = proposals.row_tokens(b);
    int32_t* out = verdict.tokens.data() + b * verdict.width;
    int64_t k = 0;
    for (;; ++k) {
      const int32_t best = argmax(scores.p(b, k));
      out[k] = best;
      if (k == static_cast<int64_t>(drafts.size()) || drafts[static_cast<size_t>(k)] != best) break;
    }
    verdict.accepted[static_cast<size_t>(b)] = static_cast<int32_t>(k);
  }
  return verdict;
}

}  // namespace specrun
