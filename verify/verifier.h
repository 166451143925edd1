// Acceptance of drafted tokens. The rejection sampler keeps the output distributed exactly as the
// target's processed distribution (Leviathan et al. 2023; Chen et al. 2023); the greedy verifier
// reproduces greedy target-only decoding token for token.
#pragma once

#include <span>

#include "runtime/sampling/rng.h"
#include "runtime/sampling/speculative_step.h"

namespace specrun {

class Verifier {
 public:
  virtual ~Verifier() = default;
  // Decides every row; rngs[b] is row b's generator (one per sequence, so a row's randomness does
  // not depend on its batch mates).
  virtual Verdict verify(const Proposals& proposals, const Scores& scores,
                         std::span<Rng> rngs) const = 0;
};

// For i = 1..n: accept d_i with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the first
// rejection draw the recovered token from norm(max(0, p_{i-1} - q_i)) and stop; if all n are
// accepted draw the bonus token from p_n. Distributions of different widths (a draft vocabulary
// padded differently from the target's) are compared with zeros beyond either width.
class RejectionSampler : public Verifier {
 public:
  Verdict verify(const Proposals& proposals, const Scores& scores,
                 std::span<Rng> rngs) const override;
};

// Accepts d_i while it is the argmax of p_{i-1} (lowest id on ties); the new token is the argmax
// of the first disagreeing or the last distribution. Uses no randomness.
class GreedyVerifier : public Verifier {
 public:
  Verdict verify(const Proposals& proposals, const Scores& scores,
                 std::span<Rng> rngs) const override;
};

}  // namespace specrun
