#include "verify/verifier.h"

#include <algorithm>
#include <vector>

#include "runtime/base/check.h"
#include "runtime/sampling/sampler.h"

namespace specrun {
namespace {

float probability(std::span<const float> distribution, int32_t token) {
  return token >= 0 && static_cast<size_t>(token) < distribution.size()
             ? distribution[static_cast<size_t>(token)]
             : 0.0f;
}

}  // namespace

int64_t alternate_index(const Proposals& proposals, int64_t b, int64_t i, int32_t token) {
  if (!proposals.has_alternates()) return -1;
  const std::span<const int32_t> alternates = proposals.alternates_of(b, i);
  const auto found = std::find(alternates.begin(), alternates.end(), token);
  if (token < 0 || found == alternates.end()) return -1;
  return found - alternates.begin();
}

int64_t accepted_alternate(const Proposals& proposals, const Verdict& verdict, int64_t b) {
  const int64_t accepted = verdict.accepted[static_cast<size_t>(b)];
  if (accepted == 0 || !proposals.has_alternates()) return -1;
  const int32_t token = verdict.row(b)[static_cast<size_t>(accepted - 1)];
  if (token == proposals.tokens[static_cast<size_t>(b * proposals.gamma + accepted - 1)]) return -1;
  return alternate_index(proposals, b, accepted - 1, token);
}

namespace {

// After the target's token `token` disagreed with draft i (from 0) of row b: when it is one of
// that position's alternates, accepts it and writes the target's token after it (`next` of the
// distribution scored after the alternate) into out[i + 1], returning i + 1; else returns i.
template <typename Next>
int32_t take_alternate(const Proposals& proposals, const Scores& scores, int64_t b, int64_t i,
                       int32_t token, std::span<int32_t> out, const Next& next) {
  const int64_t k = alternate_index(proposals, b, i, token);
  if (k < 0) return static_cast<int32_t>(i);
  SPECRUN_CHECK(scores.alternates_width == proposals.alternates_width &&
                scores.alternate_rows.size() > scores.alternate_entry(b, i, k) &&
                scores.alternate_rows[scores.alternate_entry(b, i, k)] >= 0)
      << "row " << b << "'s alternate for draft " << i + 1 << " was not scored";
  out[static_cast<size_t>(i + 1)] = next(scores.p_after_alternate(scores.alternate_entry(b, i, k)));
  return static_cast<int32_t>(i + 1);
}

}  // namespace

Verdict empty_verdict(const Proposals& proposals, const Scores& scores) {
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

Verdict Verifier::verify(const Proposals& proposals, const Scores& scores,
                         std::span<const RowDraws> draws) const {
  Verdict verdict = empty_verdict(proposals, scores);
  SPECRUN_CHECK(static_cast<int64_t>(draws.size()) >= proposals.batch)
      << draws.size() << " rows of random numbers for " << proposals.batch << " rows";
  for (int64_t b = 0; b < proposals.batch; ++b) {
    verdict.accepted[static_cast<size_t>(b)] =
        verify_row(proposals, scores, b, draws[static_cast<size_t>(b)], verdict.slots(b));
  }
  return verdict;
}

int32_t RejectionSampler::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                     const RowDraws& draws, std::span<int32_t> out) const {
  const std::span<const int32_t> drafts = proposals.row_tokens(b);
  const int64_t n = static_cast<int64_t>(drafts.size());
  for (int64_t k = 0; k < n; ++k) {
    const int32_t draft = drafts[static_cast<size_t>(k)];
    const std::span<const float> p = scores.p(b, k);
    const int64_t position = draws.position + k;
    const float p_draft = probability(p, draft);
    const float q_draft = proposals.point_masses() ? 1.0f : probability(proposals.q(b, k), draft);
    // Accept with probability min(1, p/q), written without the division.
    if (draws.stream.uniform(position, Draw::kAcceptance) * q_draft < p_draft) {
      out[static_cast<size_t>(k)] = draft;
      continue;
    }
    // Recover from the residual max(0, p - q), renormalised by sample_from.
    std::vector<float> residual(p.size());
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
    const double uniform = draws.stream.uniform(position, Draw::kToken);
    out[static_cast<size_t>(k)] =
        mass > 0.0 ? sample_from(residual, uniform) : sample_from(p, uniform);
    return static_cast<int32_t>(k);
  }
  // Every draft accepted: the bonus token.
  out[static_cast<size_t>(n)] =
      sample_from(scores.p(b, n), draws.stream.uniform(draws.position + n, Draw::kToken));
  return static_cast<int32_t>(n);
}

int32_t SharedNoiseVerifier::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                        const RowDraws& draws, std::span<int32_t> out) const {
  const std::span<const int32_t> drafts = proposals.row_tokens(b);
  for (int64_t k = 0;; ++k) {
    const int32_t token = sample_with_noise(scores.p(b, k), draws.stream, draws.position + k);
    out[static_cast<size_t>(k)] = token;
    if (k == static_cast<int64_t>(drafts.size())) return static_cast<int32_t>(k);
    if (drafts[static_cast<size_t>(k)] != token) {
      return take_alternate(proposals, scores, b, k, token, out, [&](std::span<const float> p) {
        return sample_with_noise(p, draws.stream, draws.position + k + 1);
      });
    }
  }
}

int32_t GreedyVerifier::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                   const RowDraws& /*draws*/, std::span<int32_t> out) const {
  const std::span<const int32_t> drafts = proposals.row_tokens(b);
  for (int64_t k = 0;; ++k) {
    const int32_t best = argmax(scores.p(b, k));
    out[static_cast<size_t>(k)] = best;
    if (k == static_cast<int64_t>(drafts.size())) return static_cast<int32_t>(k);
    if (drafts[static_cast<size_t>(k)] != best) {
      return take_alternate(proposals, scores, b, k, best, out,
                            [](std::span<const float> p) { return argmax(p); });
    }
  }
}

}  // namespace specrun
