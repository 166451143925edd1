// The verifiers and gamma controllers, without any model: exact distributions and synthetic costs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "runtime/base/check.h"
#include "runtime/sampling/sampler.h"
#include "tests/verify_testing.h"
#include "verify/verifier.h"

namespace specrun {
namespace {

// One row with fixed distributions: q_1..q_g for the drafts, p_0..p_g from the target.
struct FixedStep {
  std::vector<std::vector<float>> q;  // [g][vocab]
  std::vector<std::vector<float>> p;  // [g + 1][vocab]
};

Proposals draw_proposals(const FixedStep& step, Rng& rng) {
  const int64_t gamma = static_cast<int64_t>(step.q.size());
  const int64_t vocab = static_cast<int64_t>(step.p[0].size());
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = gamma;
  proposals.vocab = vocab;
  proposals.counts = {static_cast<int32_t>(gamma)};
  for (int64_t i = 0; i < gamma; ++i) {
    proposals.tokens.push_back(sample_from(step.q[static_cast<size_t>(i)], rng));
    proposals.probs.insert(proposals.probs.end(), step.q[static_cast<size_t>(i)].begin(),
                           step.q[static_cast<size_t>(i)].end());
  }
  return proposals;
}

Scores make_scores(const FixedStep& step) {
  Scores scores;
  scores.vocab = static_cast<int64_t>(step.p[0].size());
  scores.row_begin = {0, static_cast<int64_t>(step.p.size())};
  for (const auto& p : step.p) scores.probs.insert(scores.probs.end(), p.begin(), p.end());
  return scores;
}

// The first emitted token over many draws; with fixed distributions its law must be p_0 exactly,
// and the second token, when the first draft was accepted, must follow p_1.
testing::ChiSquare first_token_check(const Verifier& verifier, const FixedStep& step,
                                     int64_t draws) {
  Rng draft_rng(1), verify_rng(2);
  const Scores scores = make_scores(step);
  std::map<int64_t, int64_t> counts;
  for (int64_t i = 0; i < draws; ++i) {
    const Proposals proposals = draw_proposals(step, draft_rng);
    const Verdict verdict = verifier.verify(proposals, scores, std::span<Rng>(&verify_rng, 1));
    ++counts[verdict.row(0)[0]];
  }
  std::map<int64_t, double> expected;
  for (size_t x = 0; x < step.p[0].size(); ++x) expected[static_cast<int64_t>(x)] = step.p[0][x];
  return testing::chi_square(counts, expected, draws);
}

const FixedStep kStep = {
    {{0.50f, 0.30f, 0.15f, 0.05f}, {0.10f, 0.20f, 0.30f, 0.40f}},
    {{0.10f, 0.20f, 0.30f, 0.40f}, {0.25f, 0.25f, 0.25f, 0.25f}, {0.70f, 0.10f, 0.10f, 0.10f}}};

TEST(RejectionSampler, FirstTokenFollowsTheTarget) {
  const auto check = first_token_check(RejectionSampler(), kStep, 200000);
  EXPECT_LT(check.statistic, check.critical()) << "df " << check.degrees;
}

TEST(RejectionSampler, BrokenVerifiersAreCaught) {
  const auto residual =
      first_token_check(testing::ResidualWithoutSubtractionVerifier(), kStep, 200000);
  EXPECT_GT(residual.statistic, residual.critical());
  const auto shifted = first_token_check(testing::ShiftedPositionVerifier(), kStep, 200000);
  EXPECT_GT(shifted.statistic, shifted.critical());
}

TEST(RejectionSampler, AcceptanceIsTheOverlapOfTheDistributions) {
  // P(accept d_1) = sum_x min(p_0(x), q_1(x)) = 0.1 + 0.2 + 0.15 + 0.05 = 0.5.
  Rng draft_rng(3), verify_rng(4);
  const Scores scores = make_scores(kStep);
  int64_t accepted = 0;
  const int64_t draws = 200000;
  for (int64_t i = 0; i < draws; ++i) {
    const Verdict verdict = RejectionSampler().verify(draw_proposals(kStep, draft_rng), scores,
                                                      std::span<Rng>(&verify_rng, 1));
    accepted += verdict.accepted[0] >= 1;
  }
  // Binomial standard deviation: sqrt(0.25 / 200000) = 0.0011; five of them.
  EXPECT_NEAR(static_cast<double>(accepted) / draws, 0.5, 0.0056);
}

TEST(RejectionSampler, IdenticalDistributionsAcceptEverything) {
  const FixedStep same = {{{0.2f, 0.8f}, {0.6f, 0.4f}}, {{0.2f, 0.8f}, {0.6f, 0.4f}, {0.5f, 0.5f}}};
  Rng draft_rng(5), verify_rng(6);
  const Scores scores = make_scores(same);
  for (int i = 0; i < 1000; ++i) {
    const Verdict verdict = RejectionSampler().verify(draw_proposals(same, draft_rng), scores,
                                                      std::span<Rng>(&verify_rng, 1));
    ASSERT_EQ(verdict.accepted[0], 2);
    ASSERT_EQ(verdict.row(0).size(), 3u);  // two drafts and the bonus
  }
}

TEST(RejectionSampler, PointMassDraftsAreExact) {
  // Prompt lookup proposes with q a point mass: accept with probability p(d), recover from p
  // without d. The first token must still follow p_0.
  const std::vector<float> p0 = {0.1f, 0.6f, 0.3f};
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = 1;
  proposals.tokens = {1};
  proposals.counts = {1};
  Scores scores;
  scores.vocab = 3;
  scores.row_begin = {0, 2};
  scores.probs = {0.1f, 0.6f, 0.3f, 0.3f, 0.3f, 0.4f};
  Rng rng(7);
  std::map<int64_t, int64_t> counts;
  const int64_t draws = 100000;
  for (int64_t i = 0; i < draws; ++i) {
    ++counts[RejectionSampler().verify(proposals, scores, std::span<Rng>(&rng, 1)).row(0)[0]];
  }
  const auto check = testing::chi_square(counts, {{0, 0.1}, {1, 0.6}, {2, 0.3}}, draws);
  EXPECT_LT(check.statistic, check.critical());
}

TEST(RejectionSampler, DraftVocabularyWiderThanTheTarget) {
  // A draft token beyond the target's vocabulary has p = 0: always rejected.
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = 1;
  proposals.vocab = 4;
  proposals.tokens = {3};
  proposals.counts = {1};
  proposals.probs = {0.0f, 0.0f, 0.0f, 1.0f};
  Scores scores;
  scores.vocab = 3;
  scores.row_begin = {0, 2};
  scores.probs = {0.5f, 0.5f, 0.0f, 0.2f, 0.2f, 0.6f};
  Rng rng(8);
  for (int i = 0; i < 100; ++i) {
    const Verdict verdict = RejectionSampler().verify(proposals, scores, std::span<Rng>(&rng, 1));
    ASSERT_EQ(verdict.accepted[0], 0);
    ASSERT_LT(verdict.row(0)[0], 2);
  }
}

TEST(GreedyVerifier, AcceptsWhileDraftsAreTheArgmax) {
  Proposals proposals;
  proposals.batch = 2;
  proposals.gamma = 3;
  proposals.tokens = {1, 0, 1, 2, -1, -1};
  proposals.counts = {3, 1};
  Scores scores;
  scores.vocab = 3;
  scores.row_begin = {0, 4, 6};
  scores.probs = {0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0,  // row 0: argmax 1, 0, 2, 0
                  0, 0, 1, 0, 1, 0};                   // row 1: argmax 2, 1
  const Verdict verdict = GreedyVerifier().verify(proposals, scores, {});
  EXPECT_EQ(verdict.accepted, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(std::vector<int32_t>(verdict.row(0).begin(), verdict.row(0).end()),
            (std::vector<int32_t>{1, 0, 2}));  // d1, d2 accepted, then the recovered argmax
  EXPECT_EQ(std::vector<int32_t>(verdict.row(1).begin(), verdict.row(1).end()),
            (std::vector<int32_t>{2, 1}));  // all accepted, then the bonus
  EXPECT_EQ(verdict.tokens[3], -1);         // padding past each row's tokens
}

TEST(Verifier, RejectsScoresThatDoNotMatchTheProposals) {
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = 2;
  proposals.tokens = {0, 1};
  proposals.counts = {2};
  Scores scores;
  scores.vocab = 2;
  scores.row_begin = {0, 2};  // needs 3 distributions
  scores.probs = {1, 0, 0, 1};
  Rng rng(1);
  EXPECT_THROW(GreedyVerifier().verify(proposals, scores, {}), Error);
  EXPECT_THROW(RejectionSampler().verify(proposals, scores, std::span<Rng>(&rng, 1)), Error);
}

}  // namespace
}  // namespace specrun
