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
#include "runtime/sampling/sampling_params.h"
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

// What a rule reads besides the drafts. Greedy and shared noise take alternates (a token is
// accepted for being the target's own, so any guess may stand beside a draft); rejection sampling
// reads q, the draft's distribution at each draft (Proposals::probs). Where no row's rule reads
// q, the proposals carry no such vocabulary-wide rows: the drafts are point masses to the verifier.
bool takes_alternates(kernels::VerifyRule rule);
bool reads_draft_distributions(kernels::VerifyRule rule);

// The verify op's shape for these proposals and scores, `batch` rows of them.
kernels::VerifyParams verify_params(const Proposals& proposals, const Scores& scores,
                                    int64_t batch);

// Row b's alternates' scored rows as the verify op reads them: out is [gamma, width], -1 where
// none.
void alternate_rows_of(const Proposals& proposals, const Scores& scores, int64_t b, int64_t* out);

// A rule decided on the host, row by row, reading the scores there. The engine verifies on the
// scores' backend (BackendVerification); tests give it a replacement rule of this kind
// (BatchEngineOptions::verifier), deliberately broken ones among them, to show that the
// distribution checks catch them, and the tests' references are rules of this kind
// (tests/host_verifiers.h).
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
  // Where the last enqueue()'s drafts were on the backend (Proposals::on_device): the RowStatus
  // of the draft's row that drew row b's drafts, the first that is not kOk (a draw whose logits
  // were corrupt proposes 0; the verdict is exact whatever was proposed, and the caller decides
  // what the draft's failure means). kOk otherwise. After collect().
  kernels::RowStatus draft_status(int64_t b) const;
  // [batch, gamma + 1] the tokens the last enqueue() has the backend write, in its memory: what
  // ops enqueued after it may read before the host does.
  const int32_t* tokens() const { return outputs_.as<int32_t>(); }

 private:
  kernels::Backend& backend_;
  std::vector<kernels::VerifyRow> rows_;  // host staging, reused
  std::vector<int64_t> alternate_rows_;   // [batch, gamma, width]
  // tokens [batch, gamma + 1], accepted, taken [batch], then with drafts on the backend their
  // rows' statuses [batch, gamma]
  std::vector<int32_t> results_;
  int64_t draft_gamma_ = 0;       // the last enqueue()'s gamma where its drafts were on the backend
  size_t draft_statuses_at_ = 0;  // where in results_ their statuses begin
  std::vector<int32_t> staged_;   // drafts on the backend: -1 x [batch, gamma], then where each
                                  // draft and its status lie
  DeviceBuffer inputs_;           // the uploaded inputs, one allocation
  DeviceBuffer gathered_;         // staged_ on the backend, the drafts gathered into its first part
  DeviceBuffer q_;                // [batch, gamma, vocab_q] their q gathered, where rows keep it
  DeviceBuffer outputs_;          // results_ on the backend
};

}  // namespace specrun
