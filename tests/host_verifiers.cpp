#include "tests/host_verifiers.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/verify.h"
#include "runtime/base/check.h"

namespace specrun {
namespace {

// Row b by `rule` on the host.
int32_t verify_on_host(kernels::VerifyRule rule, const Proposals& proposals, const Scores& scores,
                       int64_t b, const RowDraws& draws, std::span<int32_t> out) {
  const auto row = static_cast<size_t>(b);
  SPECRUN_CHECK(static_cast<int64_t>(out.size()) == proposals.gamma + 1)
      << out.size() << " slots for " << proposals.gamma << " drafts";
  kernels::VerifyParams params = verify_params(proposals, scores, 1);
  if (!takes_alternates(rule)) params.alternates_width = 0;
  std::vector<int64_t> alternate_rows(
      static_cast<size_t>(params.gamma * std::max<int64_t>(params.alternates_width, 0)));
  if (params.alternates_width > 0) alternate_rows_of(proposals, scores, b, alternate_rows.data());
  const kernels::VerifyRow verify_row{draws.stream.seed(), draws.position, scores.row_begin[row],
                                      proposals.counts[row], rule};
  int32_t accepted = -1, taken = -1;
  kernels::cpu::verify_row(
      params, verify_row, scores.probs, scores.status,
      params.vocab_q > 0 ? proposals.probs.data() + b * proposals.gamma * proposals.vocab : nullptr,
      proposals.tokens.data() + b * proposals.gamma,
      params.alternates_width > 0
          ? proposals.alternates.data() + b * proposals.gamma * proposals.alternates_width
          : nullptr,
      params.alternates_width > 0 ? alternate_rows.data() : nullptr, out.data(), &accepted, &taken);
  SPECRUN_CHECK(accepted >= 0) << "row " << b
                               << " could not be verified: a distribution it reads has no mass";
  return accepted;
}

}  // namespace

int32_t RejectionSampler::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                     const RowDraws& draws, std::span<int32_t> out) const {
  return verify_on_host(kernels::VerifyRule::kRejection, proposals, scores, b, draws, out);
}

int32_t SharedNoiseVerifier::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                        const RowDraws& draws, std::span<int32_t> out) const {
  return verify_on_host(kernels::VerifyRule::kSharedNoise, proposals, scores, b, draws, out);
}

int32_t GreedyVerifier::verify_row(const Proposals& proposals, const Scores& scores, int64_t b,
                                   const RowDraws& draws, std::span<int32_t> out) const {
  return verify_on_host(kernels::VerifyRule::kGreedy, proposals, scores, b, draws, out);
}

}  // namespace specrun
