// The gamma policies. Each one's reading of the user's gamma (the depth of a sequence's first
// drafting step) and its rules; then the goodput policy against synthetic step costs and
// acceptance: it finds long drafts where verification is nearly free, falls to plain decoding when
// a large batch makes the target compute-bound, rises again when the load drops, and keeps each
// sequence's gamma within its limits.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "runtime/engine/settings.h"
#include "runtime/sampling/rng.h"
#include "tests/test_support.h"
#include "verify/gamma_policy.h"
#include "verify/goodput_policy.h"

namespace specrun {
namespace {

// The plans for `rows`.
std::vector<DraftPlan> plan(GammaPolicy& policy, std::span<const GammaRow> rows) {
  std::vector<DraftPlan> plans(rows.size());
  policy.plan(rows, plans);
  return plans;
}

TEST(FixedPolicy, DraftsGammaEveryStepWithinTheCap) {
  const auto policy = make_gamma_policy(GammaControl::kFixed, 8);
  for (const int64_t gamma : {1, 3, 6}) {
    const GammaRow rows[] = {{1, 8, gamma, gamma, gamma}, {2, 2, 2, gamma, gamma}};
    for (int step = 0; step < 3; ++step) {
      const std::vector<DraftPlan> plans = plan(*policy, rows);
      EXPECT_EQ(plans[0].gamma, gamma);
      EXPECT_EQ(plans[1].gamma, std::min<int64_t>(gamma, 2));  // the cap wins
      EXPECT_FALSE(plans[0].filler);
      const DraftOutcome outcomes[] = {{1, gamma, 0}, {2, plans[1].gamma, 0}};
      policy->observe(outcomes, 1.0, 1.0);
    }
  }
}

TEST(HeuristicPolicy, StartsAtGammaThenAddsTwoOrTakesOne) {
  for (const int64_t first : {2, 5}) {
    const auto policy = make_gamma_policy(GammaControl::kHeuristic, 8);
    const GammaRow row[] = {{7, 8, 1, 8, first}};
    EXPECT_EQ(plan(*policy, row)[0].gamma, first);
    const DraftOutcome all[] = {{7, first, first}};
    policy->observe(all, 1.0, 1.0);
    EXPECT_EQ(plan(*policy, row)[0].gamma, std::min<int64_t>(first + 2, 8));
    const int64_t second = std::min<int64_t>(first + 2, 8);
    const DraftOutcome rejected[] = {{7, second, 0}};
    policy->observe(rejected, 1.0, 1.0);
    EXPECT_EQ(plan(*policy, row)[0].gamma, second - 1);
    // Clamped to [gamma_min, gamma_max].
    for (int i = 0; i < 10; ++i) {
      const int64_t gamma = plan(*policy, row)[0].gamma;
      const DraftOutcome none[] = {{7, gamma, 0}};
      policy->observe(none, 1.0, 1.0);
    }
    EXPECT_EQ(plan(*policy, row)[0].gamma, 1);
    // A step cut short by the budget that accepted all it drafted says nothing.
    const DraftOutcome cut[] = {{7, 0, 0}};
    const GammaRow capped[] = {{7, 0, 0, 8, first}};
    plan(*policy, capped);
    policy->observe(cut, 1.0, 1.0);
    EXPECT_EQ(plan(*policy, row)[0].gamma, 1);
    // A finished sequence is forgotten: the same id starts again at its gamma.
    policy->forget(7);
    EXPECT_EQ(plan(*policy, row)[0].gamma, first);
  }
}

TEST(HeuristicPolicy, FollowsItsRuleWithinTheLimits) {
  const auto heuristic = make_gamma_policy(GammaControl::kHeuristic, 8);
  const GammaRow row[] = {{1, 8, 1, 7, 4}};  // gamma 4 within [1, 7]
  auto step = [&](int64_t accepted) {
    const int64_t gamma = plan(*heuristic, row)[0].gamma;
    const DraftOutcome outcome[] = {{1, gamma, std::min(accepted, gamma)}};
    heuristic->observe(outcome, 1.0, 1.0);
    return plan(*heuristic, row)[0].gamma;
  };
  EXPECT_EQ(plan(*heuristic, row)[0].gamma, 4);
  EXPECT_EQ(step(4), 6);  // all accepted: +2
  EXPECT_EQ(step(6), 7);  // clamped at gamma_max 7
  EXPECT_EQ(step(2), 6);  // -1
  for (int i = 0; i < 10; ++i) step(0);
  EXPECT_EQ(plan(*heuristic, row)[0].gamma, 1);  // clamped at gamma_min
}

TEST(GammaSettings, AreCheckedAndNamed) {
  SpeculationSettings settings;
  settings.gamma = 9;  // above gamma_max 8
  testing::expect_error([&] { validate(settings); }, {"gamma_min <= gamma <= gamma_max"});
  settings.gamma = 1;
  settings.gamma_min = 2;
  testing::expect_error([&] { validate(settings); }, {"gamma_min 2", "gamma 1"});
  EXPECT_FALSE(parse_gamma_control("adaptive"));
  for (const GammaControl control : gamma_controls()) {
    EXPECT_EQ(parse_gamma_control(to_string(control)), control);
  }
}

TEST(GoodputPolicy, FirstDraftingStepDraftsGamma) {
  // A memory-bound target, where speculation pays: whatever the policy does before (a plain step,
  // a calibration step with filler), the first step that runs the proposer for a sequence drafts
  // that sequence's gamma.
  for (const int64_t first : {2, 5, 7}) {
    GoodputPolicy policy(8);
    int64_t drafted_first = -1;
    for (int step = 0; step < 20 && drafted_first < 0; ++step) {
      const GammaRow row[] = {{3, 8, 0, 8, first}};
      const DraftPlan p = plan(policy, row)[0];
      if (p.gamma > 0 && !p.filler) drafted_first = p.gamma;
      const DraftOutcome outcome[] = {{3, p.gamma, p.filler ? 0 : p.gamma, p.filler}};
      policy.observe(outcome, p.filler ? 0.0 : 0.5 * double(p.gamma),
                     20.0 + 0.2 * double(p.gamma + 1));
    }
    EXPECT_EQ(drafted_first, first) << "gamma " << first;
  }
}

TEST(GoodputPolicy, GammaMinAboveZeroDraftsGammaFromTheFirstStep) {
  GoodputPolicy policy(8);
  const GammaRow row[] = {{1, 8, 1, 8, 6}};
  const DraftPlan p = plan(policy, row)[0];
  EXPECT_EQ(p.gamma, 6);
  EXPECT_FALSE(p.filler);
}

// A synthetic machine: a step's verify cost is a + b * T for T tokens scored; each draft round
// costs c + e * rows.
struct Costs {
  double verify_fixed;      // a, ms
  double verify_per_token;  // b, ms
  double round_fixed;       // c, ms
  double round_per_row;     // e, ms
};

struct Simulation {
  GoodputPolicy controller{8};
  Rng rng{11};

  // Runs `steps` steps for `batch` sequences (ids first_id..) with acceptance `alpha` each;
  // returns the mean gamma over the last quarter of the steps.
  double run(int64_t steps, int64_t batch, double alpha, const Costs& costs, int64_t first_id = 0) {
    double late_gamma_sum = 0;
    int64_t late_count = 0;
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<GammaRow> rows(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        rows[static_cast<size_t>(b)] = {first_id + b, 8, 0, 8, 4};
      }
      const std::vector<DraftPlan> plans = plan(controller, rows);
      std::vector<DraftOutcome> outcomes;
      int64_t tokens = 0, rounds = 0, drafts = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t gamma = plans[static_cast<size_t>(b)].gamma;
        const bool calibration = plans[static_cast<size_t>(b)].filler;
        EXPECT_GE(gamma, 0);
        EXPECT_LE(gamma, 8);
        int64_t accepted = 0;
        // Calibration filler is scored but (here) never accepted, and costs no draft round.
        while (!calibration && accepted < gamma && rng.uniform() < alpha) ++accepted;
        outcomes.push_back({first_id + b, gamma, accepted, calibration});
        tokens += gamma + 1;
        if (calibration) continue;
        rounds = std::max(rounds, gamma);
        drafts += gamma;
      }
      for (int64_t b = 0; b < batch; ++b) {
        if (step >= steps * 3 / 4) {
          const int64_t gamma = plans[static_cast<size_t>(b)].gamma;
          late_gamma_sum += static_cast<double>(gamma);
          ++late_count;
        }
      }
      const double verify_ms = costs.verify_fixed + costs.verify_per_token * double(tokens);
      const double draft_ms =
          costs.round_fixed * double(rounds) + costs.round_per_row * double(drafts);
      controller.observe(outcomes, draft_ms, verify_ms);
    }
    return late_gamma_sum / double(late_count);
  }
};

// A large target, memory-bound: scoring 9 tokens costs little more than 1.
constexpr Costs kMemoryBound{20.0, 0.2, 1.0, 0.05};
// The same target with a big batch: every scored token costs real compute.
constexpr Costs kComputeBound{20.0, 6.0, 1.0, 0.05};

TEST(GoodputPolicy, DraftsDeepWhenVerificationIsNearlyFree) {
  Simulation simulation;
  // Goodput E(g) / (g c + a + b (g + 1)) peaks at g = 8 (25% above g = 4, the initial gamma).
  const double gamma = simulation.run(400, 1, 0.9, kMemoryBound);
  EXPECT_GE(gamma, 6.0);
  EXPECT_NEAR(simulation.controller.acceptance(0, 1), 0.9, 0.15);
}

TEST(GoodputPolicy, FallsToPlainDecodingWhenTheBatchIsComputeBound) {
  Simulation simulation;
  const double gamma = simulation.run(600, 32, 0.6, kComputeBound, 100);
  // Probes (rarer and rarer) are the only drafting left.
  EXPECT_LT(gamma, 0.2);
}

TEST(GoodputPolicy, RisesAgainWhenLoadDrops) {
  Simulation simulation;
  EXPECT_LT(simulation.run(600, 32, 0.8, kComputeBound, 100), 0.2);
  // The big batch leaves; one sequence on a memory-bound target remains, where g = 5..8 are
  // within a few percent of each other and far above g = 0.
  EXPECT_GE(simulation.run(400, 1, 0.8, kMemoryBound, 1000), 4.0);
}

TEST(GoodputPolicy, ShortDraftsForPoorAcceptance) {
  Simulation good, poor;
  const double good_gamma = good.run(400, 4, 0.9, kMemoryBound);
  const double poor_gamma = poor.run(400, 4, 0.2, kMemoryBound);
  EXPECT_GT(good_gamma, poor_gamma + 2.0);
}

TEST(GoodputPolicy, RespectsCapsAndMinimaBesideAnotherPolicysRows) {
  GoodputPolicy controller(8);
  for (int step = 0; step < 200; ++step) {
    const std::vector<GammaRow> rows = {
        {1, 2, 0, 8, 4},  // capped at 2
        {2, 8, 3, 8, 4},  // at least 3
        {4, 0, 0, 8, 4},  // no room to draft
    };
    const std::vector<DraftPlan> plans = plan(controller, rows);
    ASSERT_EQ(plans.size(), 3u);
    EXPECT_LE(plans[0].gamma, 2);
    EXPECT_GE(plans[1].gamma, 3);
    EXPECT_EQ(plans[2].gamma, 0);
    std::vector<DraftOutcome> outcomes;
    for (size_t i = 0; i < rows.size(); ++i) {
      outcomes.push_back({rows[i].sequence, plans[i].gamma, plans[i].gamma / 2, plans[i].filler});
    }
    // Sequence 3 drafts 5 under another policy: load on the step, not this policy's acceptance.
    outcomes.push_back({3, 5, 0});
    controller.observe(outcomes, 1.0 + double(plans[1].gamma),
                       10.0 + double(plans[0].gamma + plans[1].gamma));
  }
  EXPECT_NEAR(controller.acceptance(3, 1), controller.acceptance(99, 1), 1e-12)
      << "another policy's row taught this one nothing of its own";
}

TEST(GoodputPolicy, LearnsEachSequencesOwnAcceptance) {
  GoodputPolicy controller(8);
  for (int step = 0; step < 100; ++step) {
    const std::vector<GammaRow> rows = {{1, 4, 4, 4, 4}, {2, 4, 4, 4, 4}};
    const std::vector<DraftPlan> plans = plan(controller, rows);
    // Sequence 1 has every draft accepted, sequence 2 none.
    controller.observe(
        std::vector<DraftOutcome>{{1, plans[0].gamma, plans[0].gamma, plans[0].filler},
                                  {2, plans[1].gamma, 0, plans[1].filler}},
        2.0, 10.0);
  }
  EXPECT_GT(controller.acceptance(1, 1), 0.95);
  EXPECT_LT(controller.acceptance(2, 1), 0.05);
  // A new sequence starts from the pooled figure, between the two.
  const double fresh = controller.acceptance(3, 1);
  EXPECT_GT(fresh, 0.2);
  EXPECT_LT(fresh, 0.8);
  controller.forget(1);
  EXPECT_NEAR(controller.acceptance(1, 1), fresh, 1e-12);
}

// ---- one sequence: the speedup found, and the price of falling back ------------------------

// A synthetic single sequence: every draft accepted with probability alpha; a step of gamma g
// costs g * draft_ms + verify_ms(g), and the draft first reads what it has not seen (the prompt,
// and every token of plain or calibration steps) at catch_up_ms per token.
struct OneSequence {
  double alpha;
  double draft_ms;
  double verify_base_ms;
  double verify_per_token_ms;
  double catch_up_ms = 0.0;

  double verify_ms(int64_t g) const { return verify_base_ms + verify_per_token_ms * double(g); }
  double goodput(int64_t g) const {  // expected tokens per ms, steady state
    double expected = 1.0, reach = 1.0;
    for (int64_t k = 1; k <= g; ++k) expected += (reach *= alpha);
    return expected / (double(g) * draft_ms + verify_ms(g));
  }
  int64_t best(int64_t max) const {
    int64_t best = 0;
    for (int64_t g = 1; g <= max; ++g) {
      if (goodput(g) > goodput(best)) best = g;
    }
    return best;
  }
};

struct OneSequenceRun {
  double tokens_per_ms = 0;  // realised over the measured steps
  int64_t model_steps = 0;   // steps that ran the draft model
  int64_t last_gamma = 0;    // the choice of the last step
};

OneSequenceRun run_one(GoodputPolicy& controller, const OneSequence& system, int64_t steps,
                       Rng& rng, int64_t measured_from, int64_t* lag) {
  OneSequenceRun run;
  double tokens = 0, time = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const GammaRow row[] = {{0, 8, 0, 8, 4}};
    const DraftPlan p = plan(controller, row)[0];
    const int64_t g = p.gamma;
    const bool calibration = p.filler;
    const bool model = g > 0 && !calibration;
    int64_t accepted = 0;
    while (model && accepted < g && rng.uniform() < system.alpha) ++accepted;
    // A probe's draft reads only the latest kProbeCatchUp of the tokens it skipped.
    const bool probing = p.max_catch_up > 0;
    EXPECT_TRUE(!probing || model) << "a probe with the draft drafts";
    const int64_t catch_up = !model ? 0 : probing ? std::min(*lag, p.max_catch_up) : *lag;
    const double draft =
        model ? double(g) * system.draft_ms + double(catch_up) * system.catch_up_ms : 0.0;
    const double verify = system.verify_ms(g);
    const DraftOutcome outcome[] = {{0, g, accepted, calibration, catch_up}};
    controller.observe(outcome, draft, verify);
    // After drafting, the draft lacks the bonus token (and its last draft when all were taken).
    *lag = model ? (accepted == g ? 2 : 1) : *lag + accepted + 1;
    run.model_steps += model ? 1 : 0;
    run.last_gamma = g;
    if (s >= measured_from) {
      tokens += double(accepted + 1);
      time += draft + verify;
    }
  }
  run.tokens_per_ms = tokens / time;
  return run;
}

TEST(GoodputPolicy, FindsTheBestGammaForOneSequence) {
  // Memory-bound target: verifying more tokens costs little.
  const OneSequence system{0.8, 1.0, 20.0, 0.5, 0.3};
  const int64_t best = system.best(8);
  ASSERT_GE(best, 4);
  GoodputPolicy controller(8);
  Rng rng(11);
  int64_t lag = 100;  // the prompt
  const OneSequenceRun run = run_one(controller, system, 600, rng, 200, &lag);
  // Near the top of a flat curve (the hysteresis keeps a choice within 5% of the best, by its
  // estimates), and
  // within a few percent of the best fixed gamma, probes included.
  EXPECT_GT(system.goodput(run.last_gamma), 0.93 * system.goodput(best)) << run.last_gamma;
  EXPECT_GT(run.tokens_per_ms, 0.95 * system.goodput(best)) << "best gamma " << best;
}

TEST(GoodputPolicy, FallingBackCostsAtMostAFewPercent) {
  // Compute-bound target: verifying g + 1 tokens costs g + 1 decode steps. Even at the prior
  // acceptance speculation cannot pay, which the first two steps measure without the draft.
  const OneSequence system{0.6, 3.0, 10.0, 10.0, 1.0};
  ASSERT_EQ(system.best(8), 0);
  GoodputPolicy controller(8);
  Rng rng(12);
  int64_t lag = 100;
  // Counted from the first step: calibration and probes included.
  const OneSequenceRun run = run_one(controller, system, 600, rng, 0, &lag);
  EXPECT_EQ(run.last_gamma, 0);
  EXPECT_EQ(run.model_steps, 0) << "the draft (and its catch-up) never had to run";
  EXPECT_GT(run.tokens_per_ms, 0.98 * system.goodput(0));
  EXPECT_GE(controller.calibration_steps(), 1);
}

TEST(GoodputPolicy, PoorAcceptanceOnACheapTargetFallsBackToo) {
  // Verification is cheap, so the draft is tried; its acceptance is poor, so plain decoding wins
  // and the probes that keep trying it back off. Were a probe's draft to read every token since
  // its last step, probing would cost catch_up_ms / (plain step) of the time whatever the
  // interval, 5% here; the bounded catch-up makes it a few probes' worth.
  const OneSequence system{0.05, 3.0, 20.0, 0.5, 1.0};
  ASSERT_EQ(system.best(8), 0);
  GoodputPolicy controller(8);
  Rng rng(14);
  int64_t lag = 100;
  const OneSequenceRun run = run_one(controller, system, 1000, rng, 0, &lag);
  EXPECT_EQ(run.last_gamma, 0);
  // A lone sequence's rejections count once against the prior (not once more through the pooled
  // figure), so falling back takes a draft or two more than it did.
  EXPECT_LE(run.model_steps, 16);
  EXPECT_GT(run.tokens_per_ms, 0.97 * system.goodput(0));
}

TEST(GoodputPolicy, ComesBackWhenSpeculationStartsToPay) {
  GoodputPolicy controller(8);
  Rng rng(13);
  int64_t lag = 100;
  EXPECT_EQ(
      run_one(controller, OneSequence{0.3, 3.0, 10.0, 10.0, 1.0}, 300, rng, 0, &lag).model_steps,
      0);
  const OneSequence good{0.85, 0.5, 20.0, 0.2, 0.1};
  const OneSequenceRun run = run_one(controller, good, 800, rng, 400, &lag);
  EXPECT_GE(run.last_gamma, good.best(8) - 1);
  EXPECT_GT(run.tokens_per_ms, 0.9 * good.goodput(good.best(8)));
}

TEST(GoodputPolicy, ModestAcceptanceOnAMemoryBoundTargetStillDrafts) {
  // A small memory-bound target and a cheap draft accepted a third of the time (SmolLM2-135M and
  // its distilled draft on the CPU): gamma 1 to 2 gains 10% to 15% over plain decoding. Runs of
  // rejections are common at this acceptance; an estimate that follows them down must not settle
  // into plain decoding for good.
  for (const double alpha : {0.3, 0.4}) {
    const OneSequence system{alpha, 0.6, 6.2, 0.4, 0.0};
    const int64_t best = system.best(8);
    ASSERT_GE(best, 1);
    ASSERT_GT(system.goodput(best), 1.1 * system.goodput(0));
    for (const uint64_t seed : {21u, 22u, 23u, 24u}) {
      GoodputPolicy controller(8);
      Rng rng(seed);
      int64_t lag = 40;
      const OneSequenceRun run = run_one(controller, system, 1500, rng, 100, &lag);
      EXPECT_GT(run.tokens_per_ms, 0.95 * system.goodput(best))
          << "alpha " << alpha << ", seed " << seed << ", best gamma " << best << ": "
          << run.tokens_per_ms / system.goodput(0) << "x of plain decoding, best "
          << system.goodput(best) / system.goodput(0) << "x";
    }
  }
}

TEST(GoodputPolicy, AFewEarlyRejectionsDeepDoNotHoldGammaShort) {
  // Acceptance 0.7 at every position, but the first six drafting steps have their second draft
  // rejected, as the opening of an answer may. Gamma 2 is 17% above gamma 1, and 3 to 5 are 6%
  // above gamma 2, within 2% of each other. Over a short answer's 150 steps,
  // an estimate that kept those rejections against a fixed prior fell to gamma 1 and stayed
  // there (only probes reach past it) until the evidence drifted, on three seeds of these six
  // below 0.95 of the best; one whose prior is the position before recovers.
  const OneSequence system{0.7, 0.7, 10.0, 0.5, 0.1};
  const int64_t best = system.best(8);
  ASSERT_GE(best, 3);
  ASSERT_GT(system.goodput(2), 1.15 * system.goodput(1));
  for (const uint64_t seed : {31u, 32u, 33u, 34u, 35u, 36u}) {
    GoodputPolicy controller(8);
    Rng rng(seed);
    double tokens = 0, time = 0;
    int64_t drafting_steps = 0;
    for (int64_t s = 0; s < 150; ++s) {
      const GammaRow row[] = {{0, 8, 0, 8, 4}};
      const DraftPlan p = plan(controller, row)[0];
      const bool model = p.gamma > 0 && !p.filler;
      int64_t accepted = 0;
      if (model && drafting_steps++ < 6) {
        accepted = 1;
      } else {
        while (model && accepted < p.gamma && rng.uniform() < system.alpha) ++accepted;
      }
      const double draft = model ? double(p.gamma) * system.draft_ms : 0.0;
      const double verify = system.verify_ms(p.gamma);
      const DraftOutcome outcome[] = {{0, p.gamma, accepted, p.filler, model ? 1 : 0}};
      controller.observe(outcome, draft, verify);
      if (s >= 10) {
        tokens += double(accepted + 1);
        time += draft + verify;
      }
    }
    EXPECT_GT(tokens / time, 0.95 * system.goodput(best))
        << "seed " << seed << ": " << tokens / time / system.goodput(1) << "x of gamma 1, best "
        << system.goodput(best) / system.goodput(1) << "x";
  }
}

TEST(GoodputPolicy, CatchUpIsNotADraftCost) {
  GoodputPolicy controller(8);
  const GammaRow row[] = {{0, 4, 4, 4, 4}};  // gamma_min 4: always drafts
  for (int step = 0; step < 6; ++step) {
    const bool calibration = plan(controller, row)[0].filler;
    // Steady rounds cost 1 ms each; a step that first read 300 tokens took 100 ms more.
    const int64_t catch_up = step == 4 ? 300 : 1;
    const DraftOutcome outcome[] = {{0, 4, 2, calibration, catch_up}};
    controller.observe(outcome, calibration ? 0.0 : 4.0 + (catch_up > 1 ? 100.0 : 0.0), 10.0);
  }
  EXPECT_NEAR(controller.costs().draft_round_ms(1), 1.0, 1e-9);
}

TEST(GoodputPolicy, DraftsKeptAndDraftedAheadCountAsTheRoundsThatRan) {
  // Overlapped drafting: a step whose four drafts were all kept from the step before ran no round
  // for them, and its five drafts ahead ran five; one whose first two were kept ran two rounds
  // for the rest. At 1 ms a round, the line must say 1 ms, not 5/4 or 7/4.
  GoodputPolicy controller(8);
  const GammaRow row[] = {{0, 4, 4, 4, 4}};
  for (int step = 0; step < 8; ++step) {
    const bool calibration = plan(controller, row)[0].filler;
    const int64_t kept = calibration ? 0 : (step % 2 == 0 ? 4 : 2);
    DraftOutcome outcome[] = {{0, 4, 4, calibration, 1, kept, calibration ? 0 : 5}};
    const double rounds = calibration ? 0.0 : static_cast<double>(4 - kept + 5);
    controller.observe(outcome, rounds * 1.0, 10.0);
  }
  EXPECT_NEAR(controller.costs().draft_round_ms(1), 1.0, 1e-9);
  // Bad counts are refused.
  const DraftOutcome more_kept_than_drafted[] = {{0, 2, 1, false, 1, 3, 0}};
  EXPECT_THROW(controller.observe(more_kept_than_drafted, 1.0, 1.0), std::exception);
}

TEST(GammaPolicies, DraftAheadOnlyWhereTheBackendWouldHideIt) {
  // Fixed and heuristic have no costs to weigh: hidden drafting ahead costs the step nothing, so
  // they draft ahead exactly where it would be hidden.
  for (const GammaControl kind : {GammaControl::kFixed, GammaControl::kHeuristic}) {
    const auto policy = make_gamma_policy(kind, 8);
    for (const bool hidden : {false, true}) {
      GammaRow row[] = {{1, 8, 0, 8, 3}};
      row[0].ahead_hidden = hidden;
      EXPECT_EQ(plan(*policy, row)[0].draft_ahead, hidden) << to_string(kind);
    }
  }
}

// A goodput policy that has measured `accept_every` (1: every draft accepted, 0: none) with
// draft rounds of `round_ms` and verifications of `verify_ms`, then plans one row of gamma 4.
DraftPlan goodput_plan_after(double round_ms, double verify_ms, bool accept_every, bool hidden) {
  GoodputPolicy policy(8);
  const GammaRow row[] = {{1, 8, 4, 8, 4}};  // gamma_min 4: always drafts 4
  for (int step = 0; step < 12; ++step) {
    const DraftPlan p = plan(policy, row)[0];
    const int64_t accepted = p.filler || !accept_every ? 0 : p.gamma;
    const DraftOutcome outcome[] = {{1, p.gamma, accepted, p.filler, 1}};
    policy.observe(outcome, p.filler ? 0.0 : round_ms * static_cast<double>(p.gamma), verify_ms);
  }
  GammaRow asked[] = {{1, 8, 4, 8, 4}};
  asked[0].ahead_hidden = hidden;
  return plan(policy, asked)[0];
}

TEST(GoodputPolicy, DraftsAheadWhenTheRoundsItSparesOutweighWhatTheVerificationDoesNotHide) {
  // Rounds of 1 ms beside a 10 ms verification: the five rounds ahead hide entirely, and any
  // chance of keeping them pays.
  EXPECT_TRUE(goodput_plan_after(1.0, 10.0, true, true).draft_ahead);
  EXPECT_FALSE(goodput_plan_after(1.0, 10.0, true, false).draft_ahead);
  // Rounds of 2.5 ms beside a 10 ms verification: 2.5 ms of the 12.5 show. With every draft
  // accepted so far (the fifth depth unobserved, at its prior: the fourth's estimate), they are
  // kept most of the time and spare 10 ms then: they pay. With none accepted, they are never
  // kept.
  EXPECT_TRUE(goodput_plan_after(2.5, 10.0, true, true).draft_ahead);
  EXPECT_FALSE(goodput_plan_after(2.5, 10.0, false, true).draft_ahead);
  // Rounds of 10 ms: 40 of the 50 ms show, as much as the 40 ms they would spare were they always
  // kept.
  EXPECT_FALSE(goodput_plan_after(10.0, 10.0, true, true).draft_ahead);
}

TEST(GoodputPolicy, APreemptedStepDoesNotFlattenTheVerifyLine) {
  // Compute-bound: T tokens cost T ms. Plain steps, then one plain step that took 60 ms (the OS
  // preempted it): the line must stay steep enough that drafting still does not pay.
  GoodputPolicy controller(8);
  const GammaRow row[] = {{0, 8, 0, 8, 4}};
  for (int step = 0; step < 200; ++step) {
    const DraftPlan p = plan(controller, row)[0];
    const int64_t gamma = p.gamma;
    const bool calibration = p.filler;
    int64_t accepted = 0;
    if (!calibration) accepted = gamma / 2;  // acceptance about 0.5
    const DraftOutcome outcome[] = {{0, gamma, accepted, calibration}};
    const double verify = step == 100 ? 60.0 : double(gamma + 1);
    controller.observe(outcome, calibration ? 0.0 : 0.3 * double(gamma), verify);
    if (step > 100) {
      EXPECT_GT(controller.costs().verify_ms(2) - controller.costs().verify_ms(1), 0.5)
          << "step " << step;
    }
  }
}

TEST(GoodputPolicy, TheFirstRunOfALargerStepDoesNotSteepenTheVerifyLine) {
  // A memory-bound target whose verification costs 12 + 0.5 T ms, except that the first step of
  // each larger T pays 4 ms more (its buffers grown and paged in). Were those samples kept, the
  // line would be four times too steep for the rest of the regime, and gamma held down.
  GoodputPolicy controller(8);
  const GammaRow row[] = {{0, 8, 0, 8, 1}};
  std::set<int64_t> seen = {1};
  for (int step = 0; step < 40; ++step) {
    const DraftPlan p = plan(controller, row)[0];
    const int64_t tokens = p.gamma + 1;
    const double cold = seen.insert(tokens).second ? 4.0 : 0.0;
    const DraftOutcome outcome[] = {{0, p.gamma, p.filler ? 0 : p.gamma / 2, p.filler}};
    controller.observe(outcome, p.filler ? 0.0 : 0.3 * double(p.gamma),
                       12.0 + 0.5 * double(tokens) + cold);
    // Two plain steps, two calibrations (T = 3, the first cold): from then on the line is the
    // machine's, through the first drafting step (T = 2, cold) and a probe's (T = 4, cold).
    if (step >= 5) {
      EXPECT_NEAR(controller.costs().verify_ms(3) - controller.costs().verify_ms(2), 0.5, 0.1)
          << "step " << step;
    }
  }
  EXPECT_EQ(controller.calibration_steps(), 2) << "the regime's two calibration steps";
}

TEST(StepCostModel, ALineThatWouldFallDropsItsStalestPoints) {
  // An engine's first steps run cold: T = 1 and T = 3 measured at 3 and 5 ms, then only T = 9 at
  // its true 0.7 ms. Least squares would fall, and flattened it would call verification free;
  // the cold points go instead, and the next other T measured gives the true slope.
  StepCostModel costs(StepCostModel::Tuning{});
  costs.observe(0, 1, 3.0, 0, 0, true, 0.0);
  costs.observe(1, 3, 5.0, 0, 0, true, 0.0);
  EXPECT_EQ(costs.verify_points(), 2);
  for (int64_t step = 2; step < 10; ++step) costs.observe(step, 9, 0.7, 0, 0, true, 0.0);
  EXPECT_EQ(costs.verify_points(), 1) << "the cold points stay";
  costs.observe(10, 3, 0.3, 0, 0, true, 0.0);
  EXPECT_EQ(costs.verify_points(), 2);
  EXPECT_NEAR(costs.verify_ms(9) - costs.verify_ms(3), 0.4, 1e-9);
  // A rising line keeps every point, however old.
  costs.observe(11, 1, 0.2, 0, 0, true, 0.0);
  EXPECT_EQ(costs.verify_points(), 3);
}

TEST(StepCostModel, AStepsAlternatesAreTokensTheTargetScores) {
  // 10 ms + 1 ms a token scored: three rows of gamma 2 with one alternate a draft score 3 + 2 * 6.
  StepCostModel costs(StepCostModel::Tuning{});
  costs.observe(0, 3, 13.0, 0, 0, true, 0.0);
  costs.observe(1, 9, 19.0, 0, 0, true, 0.0);
  const int64_t gammas[] = {2, 2, 2};
  EXPECT_NEAR(costs.step_ms(gammas), 10.0 + 9.0, 1e-9);
  EXPECT_NEAR(costs.step_ms(gammas, 2.0), 10.0 + 15.0, 1e-9);
}

TEST(GoodputPolicy, CountsTheAlternatesAStepScoredAsItsTokens) {
  // Steps of gamma 2 with 2 alternates each cost 10 + 1 ms a token scored (5 tokens): the line
  // the policy fits is in tokens scored, alternates included.
  GoodputPolicy controller(4);
  for (int i = 0; i < 40; ++i) {
    const GammaRow row[] = {{0, 4, 0, 4, 2}};
    const std::vector<DraftPlan> plans = plan(controller, row);
    DraftOutcome outcome[] = {{0, plans[0].gamma, plans[0].gamma / 2, plans[0].filler}};
    if (!plans[0].filler) outcome[0].alternates = plans[0].gamma;
    const int64_t scored = plans[0].gamma + 1 + outcome[0].alternates;
    controller.observe(outcome, 0.5 * double(plans[0].gamma), 10.0 + double(scored));
  }
  EXPECT_NEAR(controller.costs().verify_ms(5) - controller.costs().verify_ms(3), 2.0, 0.05);
}

TEST(GoodputPolicy, PricesAnAlternateAtTheTokensATokenScoredCosts) {
  // Verification at 10 ms + 1 ms a token: once the line is known, a plan's alternate floor is
  // the slope times the tokens a millisecond the step is expected to commit.
  GoodputPolicy controller(4);
  float floor = 0.0f;
  for (int i = 0; i < 20; ++i) {
    const GammaRow row[] = {{0, 4, 0, 4, 2}};
    const std::vector<DraftPlan> plans = plan(controller, row);
    if (!plans[0].filler) floor = plans[0].alternate_floor;
    const DraftOutcome outcome[] = {{0, plans[0].gamma, plans[0].gamma / 2, plans[0].filler}};
    controller.observe(outcome, 0.2 * double(plans[0].gamma), 10.0 + double(plans[0].gamma + 1));
  }
  // A step of about 13 ms committing about two tokens: about 0.15.
  EXPECT_GT(floor, 0.05f);
  EXPECT_LT(floor, 0.3f);
}

TEST(GoodputPolicy, ADraftPastAnAcceptedAlternateIsNotCountedRejected) {
  // Every step drafts 3 and takes an alternate at position 1: position 1 is always accepted, the
  // positions past it were never decided (they followed the draft it replaced), and since no
  // draft was accepted as itself the step is not expected to go past position 1.
  GoodputPolicy controller(3);
  for (int i = 0; i < 100; ++i) {
    const GammaRow row[] = {{0, 3, 3, 3, 3}};
    plan(controller, row);
    DraftOutcome outcome[] = {{0, 3, 1}};
    outcome[0].alternates = 3;
    outcome[0].alternate_taken = true;
    controller.observe(outcome, 3.0, 10.0);
  }
  EXPECT_NEAR(controller.acceptance(0, 1), 20.6 / 21, 0.002);
  EXPECT_NEAR(controller.acceptance(0, 2), 20.6 / 21, 0.002)
      << "never observed: its prior, position 1's estimate";
}

TEST(GoodputPolicy, EstimatesAcceptancePerPosition) {
  GoodputPolicy controller(3);
  // Position 1 always accepted, position 2 never.
  for (int i = 0; i < 100; ++i) {
    const GammaRow row[] = {{0, 3, 3, 3, 3}};
    plan(controller, row);
    const DraftOutcome outcome[] = {{0, 3, 1}};
    controller.observe(outcome, 3.0, 10.0);
  }
  // Counts over the last ~20 drafts (acceptance_memory 0.95), with a prior: at position 1 0.6
  // (one sequence, so not the pooled figure, which is its own) weighing one draft, (0.6 + 20) /
  // 21; at position 2 position 1's estimate weighing four drafts.
  const double first = 20.6 / 21;
  EXPECT_NEAR(controller.acceptance(0, 1), first, 0.002);
  EXPECT_NEAR(controller.acceptance(0, 2), 4 * first / 24, 0.002);
  EXPECT_NEAR(controller.acceptance(0, 3), controller.acceptance(0, 2), 1e-12)
      << "never drafted: position 2's";
  EXPECT_NEAR(controller.acceptance(1, 3), controller.acceptance(0, 3), 1e-12)
      << "a new sequence's: the pooled figure, here the one sequence's";
}

}  // namespace
}  // namespace specrun
