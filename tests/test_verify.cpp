// The verifiers and gamma controllers, without any model: exact distributions and synthetic costs.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/base/check.h"
#include "runtime/sampling/rng.h"
#include "tests/host_sampling.h"
#include "tests/host_verifiers.h"
#include "tests/test_support.h"
#include "tests/verify_testing.h"
#include "verify/commit.h"
#include "verify/verifier.h"

namespace specrun {
namespace {

// One row with fixed distributions: q_1..q_g for the drafts, p_0..p_g from the target.
struct FixedStep {
  std::vector<std::vector<float>> q;  // [g][vocab]
  std::vector<std::vector<float>> p;  // [g + 1][vocab]
};

// Drafts for draw `draw`: d_i from q_i with the uniform of (position i - 1, Draw::kDraft), or,
// for the shared-noise verifier, with the shared noise of that position.
Proposals draw_proposals(const FixedStep& step, const RandomStream& stream, bool shared_noise) {
  const int64_t gamma = static_cast<int64_t>(step.q.size());
  const int64_t vocab = static_cast<int64_t>(step.p[0].size());
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = gamma;
  proposals.vocab = vocab;
  proposals.counts = {static_cast<int32_t>(gamma)};
  for (int64_t i = 0; i < gamma; ++i) {
    const std::vector<float>& q = step.q[static_cast<size_t>(i)];
    proposals.tokens.push_back(shared_noise ? sample_with_noise(q, stream, i)
                                            : sample_from(q, stream.uniform(i, Draw::kDraft)));
    proposals.probs.insert(proposals.probs.end(), q.begin(), q.end());
  }
  return proposals;
}

Scores make_scores(const FixedStep& step) {
  Scores scores;
  scores.vocab = static_cast<int64_t>(step.p[0].size());
  scores.row_begin = {0, static_cast<int64_t>(step.p.size())};
  std::vector<float> rows;
  for (const auto& p : step.p) rows.insert(rows.end(), p.begin(), p.end());
  scores.hold(std::move(rows));
  return scores;
}

// One row's numbers for draw i: a stream of its own, position 0.
RowDraws row_draws(int64_t i) {
  return {RandomStream(static_cast<uint64_t>(i) * 7919 + 1), 0};
}

// The first emitted token over many draws; with fixed distributions its law must be p_0 exactly.
testing::ChiSquare first_token_check(const Verifier& verifier, const FixedStep& step, int64_t draws,
                                     bool shared_noise = false) {
  const Scores scores = make_scores(step);
  std::map<int64_t, int64_t> counts;
  for (int64_t i = 0; i < draws; ++i) {
    const RowDraws row[] = {row_draws(i)};
    const Proposals proposals = draw_proposals(step, row[0].stream, shared_noise);
    const Verdict verdict = verifier.verify(proposals, scores, row);
    ++counts[verdict.row(0)[0]];
  }
  std::map<int64_t, double> expected;
  for (size_t x = 0; x < step.p[0].size(); ++x) expected[static_cast<int64_t>(x)] = step.p[0][x];
  return testing::chi_square(counts, expected, draws);
}

// The fraction of draws whose first draft was accepted.
double first_acceptance(const Verifier& verifier, const FixedStep& step, int64_t draws,
                        bool shared_noise) {
  const Scores scores = make_scores(step);
  int64_t accepted = 0;
  for (int64_t i = 0; i < draws; ++i) {
    const RowDraws row[] = {row_draws(i)};
    accepted += verifier.verify(draw_proposals(step, row[0].stream, shared_noise), scores, row)
                    .accepted[0] >= 1;
  }
  return static_cast<double>(accepted) / static_cast<double>(draws);
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
  // Binomial standard deviation: sqrt(0.25 / 200000) = 0.0011; five of them.
  EXPECT_NEAR(first_acceptance(RejectionSampler(), kStep, 200000, false), 0.5, 0.0056);
}

TEST(RejectionSampler, IdenticalDistributionsAcceptEverything) {
  const FixedStep same = {{{0.2f, 0.8f}, {0.6f, 0.4f}}, {{0.2f, 0.8f}, {0.6f, 0.4f}, {0.5f, 0.5f}}};
  const Scores scores = make_scores(same);
  for (int i = 0; i < 1000; ++i) {
    const RowDraws row[] = {row_draws(i)};
    const Verdict verdict =
        RejectionSampler().verify(draw_proposals(same, row[0].stream, false), scores, row);
    ASSERT_EQ(verdict.accepted[0], 2);
    ASSERT_EQ(verdict.row(0).size(), 3u);  // two drafts and the bonus
  }
}

TEST(RejectionSampler, PointMassDraftsAreExact) {
  // Prompt lookup proposes with q a point mass: accept with probability p(d), recover from p
  // without d. The first token must still follow p_0.
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = 1;
  proposals.tokens = {1};
  proposals.counts = {1};
  Scores scores;
  scores.vocab = 3;
  scores.row_begin = {0, 2};
  scores.hold({0.1f, 0.6f, 0.3f, 0.3f, 0.3f, 0.4f});
  std::map<int64_t, int64_t> counts;
  const int64_t draws = 100000;
  for (int64_t i = 0; i < draws; ++i) {
    const RowDraws row[] = {row_draws(i)};
    ++counts[RejectionSampler().verify(proposals, scores, row).row(0)[0]];
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
  scores.hold({0.5f, 0.5f, 0.0f, 0.2f, 0.2f, 0.6f});
  const RejectionSampler rejection;
  const SharedNoiseVerifier shared_noise;
  for (int i = 0; i < 100; ++i) {
    const RowDraws row[] = {row_draws(i)};
    for (const Verifier* verifier :
         {static_cast<const Verifier*>(&rejection), static_cast<const Verifier*>(&shared_noise)}) {
      const Verdict verdict = verifier->verify(proposals, scores, row);
      ASSERT_EQ(verdict.accepted[0], 0);
      ASSERT_LT(verdict.row(0)[0], 2);
    }
  }
}

TEST(RejectionSampler, ATokensNumbersAreThoseOfItsPosition) {
  // The bonus token of a row whose drafts start at position 10 with two drafts is drawn with the
  // token uniform of position 12: the same token plain sampling draws there.
  const FixedStep same = {{{0.2f, 0.8f}, {0.6f, 0.4f}}, {{0.2f, 0.8f}, {0.6f, 0.4f}, {0.5f, 0.5f}}};
  const Scores scores = make_scores(same);
  for (int64_t i = 0; i < 200; ++i) {
    const RowDraws row[] = {{RandomStream(static_cast<uint64_t>(i)), 10}};
    Proposals proposals = draw_proposals(same, row[0].stream, false);
    const Verdict verdict = RejectionSampler().verify(proposals, scores, row);
    ASSERT_EQ(verdict.accepted[0], 2);
    EXPECT_EQ(
        verdict.row(0)[2],
        sample_from(same.p[2], RandomStream(static_cast<uint64_t>(i)).uniform(12, Draw::kToken)));
  }
}

TEST(SharedNoiseVerifier, EmitsThePlainSampleWhateverWasDrafted) {
  // The target's token at each position is its Gumbel-max sample with that position's noise,
  // whatever the drafts: those of q, or any tokens at all.
  const Scores scores = make_scores(kStep);
  for (int64_t i = 0; i < 2000; ++i) {
    const RowDraws row[] = {{RandomStream(static_cast<uint64_t>(i)), 3}};
    Proposals proposals = draw_proposals(kStep, RandomStream(static_cast<uint64_t>(i) + 1), false);
    proposals.tokens = {static_cast<int32_t>(i % 4), static_cast<int32_t>((i / 4) % 4)};
    const Verdict verdict = SharedNoiseVerifier().verify(proposals, scores, row);
    const int32_t k = verdict.accepted[0];
    for (int32_t j = 0; j <= k; ++j) {
      ASSERT_EQ(verdict.row(0)[static_cast<size_t>(j)],
                sample_with_noise(kStep.p[static_cast<size_t>(j)], row[0].stream, 3 + j))
          << "draw " << i << " position " << j;
    }
    for (int32_t j = 0; j < k; ++j) {
      ASSERT_EQ(verdict.row(0)[static_cast<size_t>(j)], proposals.tokens[static_cast<size_t>(j)]);
    }
  }
}

TEST(SharedNoiseVerifier, FirstTokenFollowsTheTarget) {
  const auto check = first_token_check(SharedNoiseVerifier(), kStep, 200000, true);
  EXPECT_LT(check.statistic, check.critical()) << "df " << check.degrees;
  const auto plausible = first_token_check(testing::PlausibleDraftVerifier(), kStep, 200000, true);
  EXPECT_GT(plausible.statistic, plausible.critical());
}

TEST(SharedNoiseVerifier, AcceptsAsTheGumbelCouplingAllows) {
  // Total variation 0.5 between p_0 and q_1: rejection sampling accepts 1 - tv = 0.5; the Gumbel
  // coupling at least (1 - tv) / (1 + tv) = 1/3, and never more than the optimum.
  const double acceptance = first_acceptance(SharedNoiseVerifier(), kStep, 200000, true);
  EXPECT_GT(acceptance, 1.0 / 3.0);
  EXPECT_LT(acceptance, 0.5);
  // The draft must draw with the same noise for that: with independent draws it is the product of
  // the marginals, sum_x p(x) q(x) = 0.05 + 0.06 + 0.045 + 0.02 = 0.175.
  EXPECT_NEAR(first_acceptance(SharedNoiseVerifier(), kStep, 200000, false), 0.175, 0.0045);
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
  scores.hold({0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0,  // row 0: argmax 1, 0, 2, 0
               0, 0, 1, 0, 1, 0});                  // row 1: argmax 2, 1
  const RowDraws unused[2];
  const Verdict verdict = GreedyVerifier().verify(proposals, scores, unused);
  EXPECT_EQ(verdict.accepted, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(std::vector<int32_t>(verdict.row(0).begin(), verdict.row(0).end()),
            (std::vector<int32_t>{1, 0, 2}));  // d1, d2 accepted, then the recovered argmax
  EXPECT_EQ(std::vector<int32_t>(verdict.row(1).begin(), verdict.row(1).end()),
            (std::vector<int32_t>{2, 1}));  // all accepted, then the bonus
  EXPECT_EQ(verdict.tokens[3], -1);         // padding past each row's tokens
}

// A greedy step with alternates: drafts d1 = 2, d2 = 0 with alternates {1, 3} beside d1 and {3}
// beside d2; the target's argmax is 1 at p_0. Scores hold p_0..p_2, then the distributions after
// the alternates (entries [2 drafts, width 2]).
struct AlternatesStep {
  Proposals proposals;
  Scores scores;
};

AlternatesStep greedy_alternates_step(std::vector<float> p0, std::vector<float> p1,
                                      std::vector<float> after_1, std::vector<float> after_3) {
  AlternatesStep step;
  Proposals& proposals = step.proposals;
  proposals.batch = 1;
  proposals.gamma = 2;
  proposals.tokens = {2, 0};
  proposals.counts = {2};
  proposals.alternates_width = 2;
  proposals.alternates = {1, 3, 3, -1};
  Scores& scores = step.scores;
  scores.vocab = 4;
  scores.row_begin = {0, 3};
  std::vector<float> p2 = {0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> rows;
  for (const std::vector<float>* p : {&p0, &p1, &p2, &after_1, &after_3}) {
    rows.insert(rows.end(), p->begin(), p->end());
  }
  scores.hold(std::move(rows));
  scores.alternates_width = 2;
  scores.alternate_begin = {0, 4};
  scores.alternate_rows = {3, -1, 4, -1};  // after alternate 1 of d1; after alternate 3 of d2
  scores.alternate_inputs = {3, -1, 4, -1};
  return step;
}

TEST(GreedyVerifier, AcceptsTheAlternateThatIsTheTargetsTokenAndTheTokenAfterIt) {
  const RowDraws row[] = {row_draws(0)};
  // p_0's argmax is 1, an alternate of d1: accepted, then the argmax after it (2).
  AlternatesStep step =
      greedy_alternates_step({0, 1, 0, 0}, {1, 0, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1});
  Verdict verdict = GreedyVerifier().verify(step.proposals, step.scores, row);
  EXPECT_EQ(verdict.accepted[0], 1);
  EXPECT_EQ(std::vector<int32_t>(verdict.row(0).begin(), verdict.row(0).end()),
            (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(accepted_alternate(step.proposals, verdict, 0), 0);
  // d1 accepted (argmax 2), d2 = 0 rejected for 3, d2's alternate: accepted, then after it 1.
  step = greedy_alternates_step({0, 0, 1, 0}, {0, 0, 0, 1}, {0, 0, 1, 0}, {0, 1, 0, 0});
  verdict = GreedyVerifier().verify(step.proposals, step.scores, row);
  EXPECT_EQ(verdict.accepted[0], 2);
  EXPECT_EQ(std::vector<int32_t>(verdict.row(0).begin(), verdict.row(0).end()),
            (std::vector<int32_t>{2, 3, 1}));
  EXPECT_EQ(accepted_alternate(step.proposals, verdict, 0), 0);
  // The target's token is neither draft nor alternate: its own, as without alternates.
  step = greedy_alternates_step({1, 0, 0, 0}, {1, 0, 0, 0}, {0, 0, 1, 0}, {0, 1, 0, 0});
  verdict = GreedyVerifier().verify(step.proposals, step.scores, row);
  EXPECT_EQ(verdict.accepted[0], 0);
  EXPECT_EQ(verdict.row(0)[0], 0);
  EXPECT_EQ(accepted_alternate(step.proposals, verdict, 0), -1);
  // Drafts accepted as drafts are not alternates.
  step = greedy_alternates_step({0, 0, 1, 0}, {1, 0, 0, 0}, {0, 0, 1, 0}, {0, 1, 0, 0});
  verdict = GreedyVerifier().verify(step.proposals, step.scores, row);
  EXPECT_EQ(verdict.accepted[0], 2);
  EXPECT_EQ(accepted_alternate(step.proposals, verdict, 0), -1);
}

TEST(SharedNoiseVerifier, AlternatesChangeNoTokenOnlyHowManyAStepCommits) {
  // Whatever the alternates, the emitted tokens are the target's own draws with each position's
  // noise: the same as without them, one more of them where an alternate was the target's.
  int64_t taken = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    const RowDraws row[] = {row_draws(i)};
    const Proposals plain = draw_proposals(kStep, row[0].stream, true);
    Proposals with = plain;
    with.alternates_width = 3;
    with.alternates.assign(6, -1);
    for (int64_t d = 0; d < 2; ++d) {  // every token but the draft: any target token is covered
      int64_t k = 0;
      for (int32_t x = 0; x < 4; ++x) {
        if (x != plain.tokens[static_cast<size_t>(d)]) with.alternates[d * 3 + k++] = x;
      }
    }
    // After any alternate the target's distribution is p_2's (the step's last).
    Scores scores = make_scores(kStep);
    scores.alternates_width = 3;
    scores.alternate_begin = {0, 6};
    scores.alternate_rows.assign(6, 2);
    scores.alternate_inputs = {3, 4, 5, 6, 7, 8};
    const Verdict without = SharedNoiseVerifier().verify(plain, make_scores(kStep), row);
    const Verdict verdict = SharedNoiseVerifier().verify(with, scores, row);
    const int64_t k = without.accepted[0];
    ASSERT_EQ(verdict.row(0)[static_cast<size_t>(k)], without.row(0)[static_cast<size_t>(k)]);
    if (k < 2) {
      // The rejected draft's position went to an alternate, and the token after it is p_2's
      // draw with the next position's noise.
      ASSERT_EQ(verdict.accepted[0], k + 1);
      ASSERT_EQ(verdict.row(0)[static_cast<size_t>(k + 1)],
                sample_with_noise(kStep.p[2], row[0].stream, k + 1));
      taken += 1;
    } else {
      ASSERT_EQ(verdict.accepted[0], 2);
    }
  }
  EXPECT_GT(taken, 0);
}

TEST(RejectionSampler, TakesNoAlternates) {
  EXPECT_FALSE(RejectionSampler().takes_alternates());
  EXPECT_TRUE(SharedNoiseVerifier().takes_alternates());
  EXPECT_TRUE(GreedyVerifier().takes_alternates());
}

TEST(CommitRule, CommitsUntilAnEndOfSequenceTokenOrTheTokenLimit) {
  const std::vector<int32_t> eos = {2};
  // A sequence of 10 committed tokens (its pending token at position 9) accepted two drafts.
  const auto decide = [&](std::vector<int32_t> decided, bool stop_at_eos, int64_t tokens_left) {
    return decide_commit(decided, 10, 2, -1, {eos, stop_at_eos, tokens_left});
  };
  const RowCommit all = decide({5, 6, 7}, true, 100);
  EXPECT_EQ(all.tokens, 3);
  EXPECT_FALSE(all.stop.has_value());
  EXPECT_EQ(all.keep, 12);  // the new token is the next step's pending one
  EXPECT_EQ(all.draft_keep, 12);
  EXPECT_EQ(all.alternate_from, -1);
  EXPECT_EQ(all.alternate_to, -1);
  const RowCommit at_eos = decide({5, 2, 7}, true, 100);
  EXPECT_EQ(at_eos.tokens, 1);
  EXPECT_EQ(at_eos.stop, FinishReason::kEndOfSequence);
  EXPECT_EQ(at_eos.keep, 10);
  EXPECT_EQ(decide({2, 6, 7}, true, 100).tokens, 0);
  EXPECT_EQ(decide({2, 6, 7}, true, 100).keep, 9);
  EXPECT_EQ(decide({5, 2, 7}, false, 100).tokens, 3);  // EOS is text when it does not stop
  const RowCommit at_limit = decide({5, 6, 7}, true, 2);
  EXPECT_EQ(at_limit.tokens, 2);
  EXPECT_EQ(at_limit.stop, FinishReason::kMaxTokens);
  EXPECT_EQ(at_limit.keep, 11);
  EXPECT_EQ(decide({5, 6, 7}, true, 3).stop, FinishReason::kMaxTokens);
}

TEST(CommitRule, AnAcceptedAlternateMovesToItsPositionAndTheDraftReadsItAgain) {
  // Pending token at position 9, drafts fed at 10..12, alternates after them: the row accepted
  // draft 1 and then an alternate for draft 2, fed as the forward's input 4 (position 13).
  const RowCommit commit = decide_commit(std::vector<int32_t>{5, 8, 7}, 10, 2, 4, {{}, true, 100});
  EXPECT_EQ(commit.tokens, 3);
  EXPECT_EQ(commit.keep, 12);
  EXPECT_EQ(commit.alternate_from, 13);
  EXPECT_EQ(commit.alternate_to, 11);
  EXPECT_EQ(commit.draft_keep, 11);  // the draft's cache holds draft 2 at position 11
  // Stopped by the token limit at the alternate: it is the new pending token, kept by neither.
  const RowCommit stopped = decide_commit(std::vector<int32_t>{5, 8, 7}, 10, 2, 4, {{}, true, 2});
  EXPECT_EQ(stopped.keep, 11);
  EXPECT_EQ(stopped.alternate_to, -1);
  EXPECT_EQ(stopped.draft_keep, 11);
}

TEST(VerifyRule, EachRowsSettingsChooseItsRuleAndWhatItReads) {
  SamplingParams greedy, sampled, shared;
  greedy.temperature = 0.0f;
  sampled.temperature = 0.8f;
  shared.temperature = 0.8f;
  shared.shared_noise = true;
  EXPECT_EQ(verify_rule(greedy), kernels::VerifyRule::kGreedy);
  EXPECT_EQ(verify_rule(sampled), kernels::VerifyRule::kRejection);
  EXPECT_EQ(verify_rule(shared), kernels::VerifyRule::kSharedNoise);
  // The host rules say what they read as the rule functions do.
  const GreedyVerifier greedy_rule;
  const RejectionSampler rejection_rule;
  const SharedNoiseVerifier shared_noise_rule;
  const std::pair<kernels::VerifyRule, const Verifier*> rules[] = {
      {kernels::VerifyRule::kGreedy, &greedy_rule},
      {kernels::VerifyRule::kRejection, &rejection_rule},
      {kernels::VerifyRule::kSharedNoise, &shared_noise_rule}};
  for (const auto& [rule, verifier] : rules) {
    EXPECT_EQ(takes_alternates(rule), verifier->takes_alternates());
    EXPECT_EQ(reads_draft_distributions(rule), verifier->reads_draft_distributions());
  }
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
  scores.hold({1, 0, 0, 1});
  const RowDraws row[1];
  EXPECT_THROW(GreedyVerifier().verify(proposals, scores, row), Error);
  EXPECT_THROW(RejectionSampler().verify(proposals, scores, row), Error);
  EXPECT_THROW(SharedNoiseVerifier().verify(proposals, scores, row), Error);
}

TEST(BackendOps, ProcessLogitsMarksTheRowsItCannotProcessAndMatchesTheRowFunction) {
  // Backend::process_logits on the CPU: each row exactly what process_logits() gives with its own
  // settings; a row with NaN, one with every token banned and one with settings out of range are
  // all zeros and marked, and the others are unaffected.
  const auto backend = testing::make_cpu_backend(2);
  const int64_t vocab = 37;
  Rng rng(5);
  std::vector<float> logits;
  for (int64_t i = 0; i < 6 * vocab; ++i) logits.push_back(static_cast<float>(rng.uniform() * 6));
  logits[1 * vocab + 3] = std::nanf("");
  for (int64_t x = 0; x < vocab; ++x) logits[static_cast<size_t>(2 * vocab + x)] = -INFINITY;
  std::vector<kernels::LogitsSettings> settings = {{0.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.0f},
                                                   {0.7f, 5, 1.0f, 0.0f}, {0.7f, 0, 0.0f, 0.0f},
                                                   {0.9f, 0, 0.8f, 0.0f}, {1.3f, 10, 0.9f, 0.05f}};
  std::vector<float> probs(logits.size(), -1.0f);
  std::vector<int32_t> status(6, -1);
  ASSERT_TRUE(
      backend
          ->process_logits({6, vocab}, logits.data(), settings.data(), probs.data(), status.data())
          .is_ok());
  using kernels::RowStatus;
  const std::vector<RowStatus> expected = {RowStatus::kOk,        RowStatus::kCorruptLogits,
                                           RowStatus::kAllBanned, RowStatus::kBadSettings,
                                           RowStatus::kOk,        RowStatus::kOk};
  for (size_t r = 0; r < 6; ++r) {
    EXPECT_EQ(static_cast<RowStatus>(status[r]), expected[r]) << "row " << r;
    const std::span<const float> row(probs.data() + r * vocab, static_cast<size_t>(vocab));
    if (expected[r] != RowStatus::kOk) {
      EXPECT_TRUE(std::all_of(row.begin(), row.end(), [](float p) { return p == 0.0f; }));
      continue;
    }
    SamplingParams params;
    params.temperature = settings[r].temperature;
    params.top_k = settings[r].top_k;
    params.top_p = settings[r].top_p;
    params.min_p = settings[r].min_p;
    std::vector<float> reference(static_cast<size_t>(vocab));
    process_logits(params, std::span<const float>(logits.data() + r * vocab, vocab), reference);
    EXPECT_EQ(std::vector<float>(row.begin(), row.end()), reference) << "row " << r;
  }
  std::vector<int32_t> best(6, -2);
  ASSERT_TRUE(backend->argmax({6, vocab}, probs.data(), best.data()).is_ok());
  EXPECT_EQ(best[0], argmax(std::span<const float>(logits.data(), vocab)));
  EXPECT_FALSE(
      backend->process_logits({1, 0}, logits.data(), settings.data(), probs.data(), status.data())
          .is_ok());
}

TEST(BackendOps, VerifyDecidesEachRowAsItsRuleDoesAlone) {
  // Backend::verify on the CPU over a batch mixing the three rules, point masses and q, against
  // each row verified alone on the host; then the rows it must refuse: a count past gamma, a row
  // of p marked as not processed.
  const auto backend = testing::make_cpu_backend(2);
  const int64_t batch = 9, gamma = 3, vocab = 11;
  Rng rng(7);
  Proposals proposals;
  proposals.batch = batch;
  proposals.gamma = gamma;
  proposals.vocab = vocab;
  Scores scores;
  scores.vocab = vocab;
  std::vector<float> p;
  const auto random_distribution = [&](std::vector<float>& out) {
    double total = 0.0;
    std::vector<float> row(static_cast<size_t>(vocab));
    for (float& value : row)
      total += (value = static_cast<float>(rng.uniform() < 0.3 ? 0.0 : rng.uniform()));
    for (float& value : row) value = static_cast<float>(value / total);
    out.insert(out.end(), row.begin(), row.end());
  };
  std::vector<kernels::VerifyRule> rules;
  std::vector<RowDraws> draws;
  scores.row_begin = {0};
  for (int64_t b = 0; b < batch; ++b) {
    const auto count = static_cast<int32_t>(b % (gamma + 1));
    proposals.counts.push_back(count);
    for (int64_t i = 0; i < gamma; ++i) {
      random_distribution(proposals.probs);
      const std::span<const float> q(proposals.probs.data() + (b * gamma + i) * vocab, vocab);
      proposals.tokens.push_back(i < count ? sample_from(q, rng.uniform()) : -1);
    }
    for (int64_t i = 0; i <= count; ++i) random_distribution(p);
    scores.row_begin.push_back(scores.row_begin.back() + count + 1);
    rules.push_back(static_cast<kernels::VerifyRule>(b % 3));
    draws.push_back({RandomStream(100 + static_cast<uint64_t>(b)), 3 * b});
  }
  scores.hold(p);
  std::vector<int64_t> alternate_input;
  BackendVerification verification(*backend);
  const Verdict verdict = verification.verify(proposals, scores, rules, draws, &alternate_input);
  const GreedyVerifier greedy;
  const RejectionSampler rejection;
  const SharedNoiseVerifier shared_noise;
  for (int64_t b = 0; b < batch; ++b) {
    const Verifier* rule = rules[static_cast<size_t>(b)] == kernels::VerifyRule::kGreedy
                               ? static_cast<const Verifier*>(&greedy)
                           : rules[static_cast<size_t>(b)] == kernels::VerifyRule::kRejection
                               ? static_cast<const Verifier*>(&rejection)
                               : static_cast<const Verifier*>(&shared_noise);
    std::vector<int32_t> alone(static_cast<size_t>(gamma + 1), -1);
    const int32_t k = rule->verify_row(proposals, scores, b, draws[static_cast<size_t>(b)], alone);
    EXPECT_EQ(verdict.accepted[static_cast<size_t>(b)], k) << "row " << b;
    EXPECT_EQ(std::vector<int32_t>(verdict.tokens.begin() + b * (gamma + 1),
                                   verdict.tokens.begin() + (b + 1) * (gamma + 1)),
              alone)
        << "row " << b;
    EXPECT_EQ(alternate_input[static_cast<size_t>(b)], -1);
  }

  // The op itself: a count past gamma and a row of p marked are refused, the others decided.
  std::vector<kernels::VerifyRow> rows = {{1, 0, 0, 1, kernels::VerifyRule::kGreedy},
                                          {1, 0, 0, 4, kernels::VerifyRule::kGreedy},
                                          {1, 0, 2, 1, kernels::VerifyRule::kSharedNoise}};
  std::vector<int32_t> status(static_cast<size_t>(scores.rows),
                              static_cast<int32_t>(kernels::RowStatus::kOk));
  status[2] = static_cast<int32_t>(kernels::RowStatus::kCorruptLogits);
  std::vector<int32_t> drafts(3 * gamma, 0), tokens(3 * (gamma + 1), 7), accepted(3, 7),
      taken(3, 7);
  ASSERT_TRUE(backend
                  ->verify({3, gamma, scores.rows, vocab, 0, 0}, rows.data(), scores.probs,
                           status.data(), nullptr, drafts.data(), nullptr, nullptr, tokens.data(),
                           accepted.data(), taken.data())
                  .is_ok());
  EXPECT_GE(accepted[0], 0);
  EXPECT_EQ(accepted[1], -1);
  EXPECT_EQ(accepted[2], -1);  // its p_0 is row 2
  EXPECT_EQ(std::count(tokens.begin() + gamma + 1, tokens.end(), -1), 2 * (gamma + 1));
  EXPECT_FALSE(backend
                   ->verify({3, gamma, scores.rows, vocab, 0, 2}, rows.data(), scores.probs,
                            nullptr, nullptr, drafts.data(), nullptr, nullptr, tokens.data(),
                            accepted.data(), taken.data())
                   .is_ok());  // alternates' width without alternates
}

}  // namespace
}  // namespace specrun
