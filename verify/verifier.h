// Acceptance of drafted tokens. The rejection sampler keeps the output distributed exactly as the
// target's processed distribution (Leviathan et al. 2023; Chen et al. 2023); the shared-noise
// verifier does too, and makes the output the same token for token whatever was drafted (Daliri et
// al. 2024, "drafter-invariant" decoding); the greedy verifier reproduces greedy target-only
// decoding token for token.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/backend.h"
#include "runtime/base/device_buffer.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/speculative_step.h"

namespace specrun {

// The random numbers of one row: its request's stream, and the output position of the token that
// p_0 decides (the row's drafts d_1.. are proposals for that position and the ones after it).
struct RowDraws {
  RandomStream stream{};
  int64_t position = 0;
};

// Which of row b's alternates for draft i (from 0) is `token` (k of Proposals::alternates_of), or
// -1.
int64_t alternate_index(const Proposals& proposals, int64_t b, int64_t i, int32_t token);

// Which alternate row b's verdict accepted (its last accepted token, an alternate for draft
// accepted - 1), or -1 when every accepted token was a draft.
int64_t accepted_alternate(const Proposals& proposals, const Verdict& verdict, int64_t b);

// A verdict of the step's shape, nothing decided yet: every token -1, every count 0. Throws Error
// when the scores do not hold at least one distribution more than the drafts for every row.
Verdict empty_verdict(const Proposals& proposals, const Scores& scores);

// The rule a row with these sampling settings is verified by: greedy at temperature 0, else shared
// noise where the settings ask for it, else rejection sampling.
kernels::VerifyRule verify_rule(const SamplingParams& sampling);

class Verifier {
 public:
  virtual ~Verifier() = default;
  // Decides row b: writes d_1..d_k and the new token into out[0..k] (out has gamma + 1 slots, -1
  // on entry) and returns k, the number of drafts accepted. Reads only the row's own numbers.
  virtual int32_t verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                             const RowDraws& draws, std::span<int32_t> out) const = 0;
  // Whether the rule takes alternates (Proposals::alternates): a token is accepted for being the
  // target's own, so any guess may stand beside a draft.
  virtual bool takes_alternates() const { return false; }
  // Whether the rule reads q, the draft's distribution at each draft (Proposals::probs). Where no
  // row's rule does, the proposals carry no such vocabulary-wide rows: the drafts are point
  // masses to the verifier.
  virtual bool reads_draft_distributions() const { return true; }
  // Every row by this rule; draws[b] is row b's.
  Verdict verify(const Proposals& proposals, const Scores& scores,
                 std::span<const RowDraws> draws) const;
};

// The rules below decide on the host, through the backends' reference (kernels/cpu/verify.h), and
// read the scores there: for tests and for scores in host memory. The engine's step verifies on
// the scores' backend instead (BackendVerification).

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

// The host rule each row's settings choose (verify_rule), or a replacement for every row: tests
// pass deliberately broken rules to show that the distribution checks catch them.
class Verifiers {
 public:
  explicit Verifiers(const Verifier* replacement = nullptr) : replacement_(replacement) {}
  const Verifier& for_row(const SamplingParams& sampling) const;

 private:
  const Verifier* replacement_;
  GreedyVerifier greedy_;
  RejectionSampler rejection_;
  SharedNoiseVerifier shared_noise_;
};

// Verification on the backend that scored the rows (Backend::verify): the step's drafts, their q
// where a row's rule reads it, and the rows' rules and random numbers go to the backend; the
// verdict (tokens, accepted counts, accepted alternates) is the one thing that comes back, in one
// copy. Reuses its buffers from step to step.
class BackendVerification {
 public:
  explicit BackendVerification(kernels::Backend& backend) : backend_(backend) {}
  // rules[b] and draws[b] are row b's. With alternates, alternate_input[b] receives where the
  // target's forward fed the alternate row b accepted (Scores::alternate_inputs), -1 where none.
  // Throws Error naming the row and why when one cannot be decided (its logits were corrupt).
  // enqueue() then collect().
  Verdict verify(const Proposals& proposals, const Scores& scores,
                 std::span<const kernels::VerifyRule> rules, std::span<const RowDraws> draws,
                 std::vector<int64_t>* alternate_input);
  // The verification enqueued on the backend's stream, nothing waited for: the host may do other
  // work (the draft's, on its own stream) before collect().
  void enqueue(const Proposals& proposals, const Scores& scores,
               std::span<const kernels::VerifyRule> rules, std::span<const RowDraws> draws);
  // The verdict of the last enqueue(), of these proposals and scores: the one wait for it.
  Verdict collect(const Proposals& proposals, const Scores& scores,
                  std::vector<int64_t>* alternate_input);
  // [batch, gamma + 1] the tokens the last enqueue() has the backend write, in its memory: what
  // ops enqueued after it may read before the host does.
  const int32_t* tokens() const { return outputs_.as<int32_t>(); }

 private:
  kernels::Backend& backend_;
  std::vector<kernels::VerifyRow> rows_;  // host staging, reused
  std::vector<int64_t> alternate_rows_;   // [batch, gamma, width]
  std::vector<int32_t> results_;          // tokens [batch, gamma + 1], accepted, taken [batch]
  DeviceBuffer inputs_;                   // the uploaded inputs, one allocation
  DeviceBuffer outputs_;                  // results_ on the backend
};

}  // namespace specrun
