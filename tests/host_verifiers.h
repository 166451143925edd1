// The verification rules decided on the host, row by row, through the backends' reference
// (kernels/cpu/verify.h): the tests' references for the verify op and the engine's step, which
// verify on the scores' backend (BackendVerification). Each rule says what it decides.
#pragma once

#include <span>

#include "verify/verifier.h"

namespace specrun {

// For i = 1..n: accept d_i with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the first
// rejection draw the recovered token from norm(max(0, p_{i-1} - q_i)) and stop; if all n are
// accepted draw the bonus token from p_n. The test of d_i reads the uniform of (its position,
// Draw::kAcceptance), the recovered or bonus token that of (its position, Draw::kToken).
// Distributions of different widths (a draft vocabulary padded differently from the target's) are
// compared with zeros beyond either width.
class RejectionSampler : public Verifier {
 public:
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

// Shared noise: the target's token at each position is sample_with_noise(p_i) with that position's
// noise, exactly what plain decoding with the shared noise draws; d_i is accepted while it equals
// that token, and the first disagreeing (or the bonus) token is the target's own. So the output is
// the target's Gumbel-max sample token for token, whatever the proposer, gamma, controller or
// batch, and is distributed exactly as p. A draft drawn with the same noise from q agrees as often
// as the Gumbel coupling of p and q allows, somewhat less often than rejection sampling accepts.
// Where the first disagreeing token is one of that position's alternates (a token tree), it is
// accepted too, and the target's token after it (from the distribution the target scored after
// that alternate) is the new one: the same tokens, one more of them in the step.
// The greedy verifier takes alternates the same way.
class SharedNoiseVerifier : public Verifier {
 public:
  bool takes_alternates() const override { return true; }
  bool reads_draft_distributions() const override { return false; }
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

// Accepts d_i while it is the argmax of p_{i-1} (lowest id on ties); the new token is the argmax
// of the first disagreeing or the last distribution. Uses no randomness.
class GreedyVerifier : public Verifier {
 public:
  bool takes_alternates() const override { return true; }
  bool reads_draft_distributions() const override { return false; }
  int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                     const RowDraws& draws, std::span<int32_t> out) const override;
};

}  // namespace specrun
