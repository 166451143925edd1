// The batch goodput controller against synthetic step costs and acceptance: it finds long drafts
// where verification is nearly free, falls to plain decoding when a large batch makes the target
// compute-bound, rises again when the load drops, and keeps each sequence's gamma within its
// limits.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "runtime/sampling/rng.h"
#include "verify/batch_gamma.h"

namespace specrun {
namespace {

// A synthetic machine: a step's verify cost is a + b * T for T tokens scored; each draft round
// costs c + e * rows.
struct Costs {
  double verify_fixed;      // a, ms
  double verify_per_token;  // b, ms
  double round_fixed;       // c, ms
  double round_per_row;     // e, ms
};

struct Simulation {
  BatchGoodputController controller{8};
  Rng rng{11};

  // Runs `steps` steps for `batch` sequences (ids first_id..) with acceptance `alpha` each;
  // returns the mean gamma over the last quarter of the steps.
  double run(int64_t steps, int64_t batch, double alpha, const Costs& costs, int64_t first_id = 0) {
    double late_gamma_sum = 0;
    int64_t late_count = 0;
    for (int64_t step = 0; step < steps; ++step) {
      std::vector<BatchGoodputController::Row> rows(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        rows[static_cast<size_t>(b)] = {first_id + b, 8, 0, 4, -1};
      }
      const std::vector<int64_t> gammas = controller.choose(rows);
      const bool calibration = controller.calibrating();
      std::vector<BatchGoodputController::Outcome> outcomes;
      int64_t tokens = 0, rounds = 0, drafts = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t gamma = gammas[static_cast<size_t>(b)];
        EXPECT_GE(gamma, 0);
        EXPECT_LE(gamma, 8);
        int64_t accepted = 0;
        // Calibration filler is scored but (here) never accepted, and costs no draft round.
        while (!calibration && accepted < gamma && rng.uniform() < alpha) ++accepted;
        outcomes.push_back({first_id + b, gamma, accepted, true, calibration});
        tokens += gamma + 1;
        if (calibration) continue;
        rounds = std::max(rounds, gamma);
        drafts += gamma;
      }
      for (int64_t b = 0; b < batch; ++b) {
        if (step >= steps * 3 / 4) {
          const int64_t gamma = gammas[static_cast<size_t>(b)];
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

TEST(BatchGoodputController, DraftsDeepWhenVerificationIsNearlyFree) {
  Simulation simulation;
  // Goodput E(g) / (g c + a + b (g + 1)) peaks at g = 8 (25% above g = 4, the initial gamma).
  const double gamma = simulation.run(400, 1, 0.9, kMemoryBound);
  EXPECT_GE(gamma, 6.0);
  EXPECT_NEAR(simulation.controller.acceptance(0, 1), 0.9, 0.15);
}

TEST(BatchGoodputController, FallsToPlainDecodingWhenTheBatchIsComputeBound) {
  Simulation simulation;
  const double gamma = simulation.run(600, 32, 0.6, kComputeBound, 100);
  // Probes (rarer and rarer) are the only drafting left.
  EXPECT_LT(gamma, 0.2);
}

TEST(BatchGoodputController, RisesAgainWhenLoadDrops) {
  Simulation simulation;
  EXPECT_LT(simulation.run(600, 32, 0.8, kComputeBound, 100), 0.2);
  // The big batch leaves; one sequence on a memory-bound target remains, where g = 5..8 are
  // within a few percent of each other and far above g = 0.
  EXPECT_GE(simulation.run(400, 1, 0.8, kMemoryBound, 1000), 4.0);
}

TEST(BatchGoodputController, ShortDraftsForPoorAcceptance) {
  Simulation good, poor;
  const double good_gamma = good.run(400, 4, 0.9, kMemoryBound);
  const double poor_gamma = poor.run(400, 4, 0.2, kMemoryBound);
  EXPECT_GT(good_gamma, poor_gamma + 2.0);
}

TEST(BatchGoodputController, RespectsCapsMinimaAndFixedRows) {
  BatchGoodputController controller(8);
  for (int step = 0; step < 200; ++step) {
    const std::vector<BatchGoodputController::Row> rows = {
        {1, 2, 0, 4, -1},  // capped at 2
        {2, 8, 3, 4, -1},  // at least 3
        {3, 8, 0, 4, 5},   // fixed by its own controller
        {4, 0, 0, 4, -1},  // no room to draft
    };
    const std::vector<int64_t> gammas = controller.choose(rows);
    ASSERT_EQ(gammas.size(), 4u);
    EXPECT_LE(gammas[0], 2);
    EXPECT_GE(gammas[1], 3);
    EXPECT_EQ(gammas[2], 5);
    EXPECT_EQ(gammas[3], 0);
    std::vector<BatchGoodputController::Outcome> outcomes;
    for (size_t i = 0; i < rows.size(); ++i) {
      outcomes.push_back({rows[i].sequence, gammas[i], gammas[i] / 2, rows[i].fixed < 0,
                          controller.calibrating() && rows[i].fixed < 0});
    }
    controller.observe(outcomes, 1.0 + double(gammas[1]), 10.0 + double(gammas[0] + gammas[1]));
  }
}

TEST(BatchGoodputController, LearnsEachSequencesOwnAcceptance) {
  BatchGoodputController controller(8);
  for (int step = 0; step < 100; ++step) {
    const std::vector<BatchGoodputController::Row> rows = {{1, 4, 4, 4, -1}, {2, 4, 4, 4, -1}};
    const std::vector<int64_t> gammas = controller.choose(rows);
    const bool calibration = controller.calibrating();
    // Sequence 1 has every draft accepted, sequence 2 none.
    controller.observe(
        std::vector<BatchGoodputController::Outcome>{{1, gammas[0], gammas[0], true, calibration},
                                                     {2, gammas[1], 0, true, calibration}},
        2.0, 10.0);
  }
  EXPECT_GT(controller.acceptance(1, 1), 0.95);
  EXPECT_LT(controller.acceptance(2, 1), 0.05);
  // A new sequence starts from the pooled figure, between the two.
  const double fresh = controller.acceptance(3, 1);
  EXPECT_GT(fresh, 0.2);
  EXPECT_LT(fresh, 0.8);
  controller.remove_sequence(1);
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

OneSequenceRun run_one(BatchGoodputController& controller, const OneSequence& system, int64_t steps,
                       Rng& rng, int64_t measured_from, int64_t* lag) {
  OneSequenceRun run;
  double tokens = 0, time = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const BatchGoodputController::Row row[] = {{0, 8, 0, 4, -1}};
    const int64_t g = controller.choose(row)[0];
    const bool calibration = controller.calibrating();
    const bool model = g > 0 && !calibration;
    int64_t accepted = 0;
    while (model && accepted < g && rng.uniform() < system.alpha) ++accepted;
    // A probe's draft reads only the latest kProbeCatchUp of the tokens it skipped.
    EXPECT_TRUE(!controller.probing() || model) << "a probe with the draft drafts";
    const int64_t catch_up = !model ? 0
                             : controller.probing()
                                 ? std::min(*lag, BatchGoodputController::kProbeCatchUp)
                                 : *lag;
    const double draft =
        model ? double(g) * system.draft_ms + double(catch_up) * system.catch_up_ms : 0.0;
    const double verify = system.verify_ms(g);
    const BatchGoodputController::Outcome outcome[] = {
        {0, g, accepted, true, calibration, catch_up}};
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

TEST(BatchGoodputController, FindsTheBestGammaForOneSequence) {
  // Memory-bound target: verifying more tokens costs little.
  const OneSequence system{0.8, 1.0, 20.0, 0.5, 0.3};
  const int64_t best = system.best(8);
  ASSERT_GE(best, 4);
  BatchGoodputController controller(8);
  Rng rng(11);
  int64_t lag = 100;  // the prompt
  const OneSequenceRun run = run_one(controller, system, 600, rng, 200, &lag);
  // Near the top of a flat curve (the hysteresis keeps a choice within 5% of the best, by its
  // estimates), and
  // within a few percent of the best fixed gamma, probes included.
  EXPECT_GT(system.goodput(run.last_gamma), 0.93 * system.goodput(best)) << run.last_gamma;
  EXPECT_GT(run.tokens_per_ms, 0.95 * system.goodput(best)) << "best gamma " << best;
}

TEST(BatchGoodputController, FallingBackCostsAtMostAFewPercent) {
  // Compute-bound target: verifying g + 1 tokens costs g + 1 decode steps. Even at the prior
  // acceptance speculation cannot pay, which the first two steps measure without the draft.
  const OneSequence system{0.6, 3.0, 10.0, 10.0, 1.0};
  ASSERT_EQ(system.best(8), 0);
  BatchGoodputController controller(8);
  Rng rng(12);
  int64_t lag = 100;
  // Counted from the first step: calibration and probes included.
  const OneSequenceRun run = run_one(controller, system, 600, rng, 0, &lag);
  EXPECT_EQ(run.last_gamma, 0);
  EXPECT_EQ(run.model_steps, 0) << "the draft (and its catch-up) never had to run";
  EXPECT_GT(run.tokens_per_ms, 0.98 * system.goodput(0));
  EXPECT_GE(controller.calibration_steps(), 1);
}

TEST(BatchGoodputController, PoorAcceptanceOnACheapTargetFallsBackToo) {
  // Verification is cheap, so the draft is tried; its acceptance is poor, so plain decoding wins
  // and the probes that keep trying it back off. Were a probe's draft to read every token since
  // its last step, probing would cost catch_up_ms / (plain step) of the time whatever the
  // interval, 5% here; the bounded catch-up makes it a few probes' worth.
  const OneSequence system{0.05, 3.0, 20.0, 0.5, 1.0};
  ASSERT_EQ(system.best(8), 0);
  BatchGoodputController controller(8);
  Rng rng(14);
  int64_t lag = 100;
  const OneSequenceRun run = run_one(controller, system, 1000, rng, 0, &lag);
  EXPECT_EQ(run.last_gamma, 0);
  EXPECT_LT(run.model_steps, 15);
  EXPECT_GT(run.tokens_per_ms, 0.97 * system.goodput(0));
}

TEST(BatchGoodputController, ComesBackWhenSpeculationStartsToPay) {
  BatchGoodputController controller(8);
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

TEST(BatchGoodputController, CatchUpIsNotADraftCost) {
  BatchGoodputController controller(8);
  const BatchGoodputController::Row row[] = {{0, 4, 4, 4, -1}};  // gamma_min 4: always drafts
  for (int step = 0; step < 6; ++step) {
    controller.choose(row);
    const bool calibration = controller.calibrating();
    // Steady rounds cost 1 ms each; a step that first read 300 tokens took 100 ms more.
    const int64_t catch_up = step == 4 ? 300 : 1;
    const BatchGoodputController::Outcome outcome[] = {{0, 4, 2, true, calibration, catch_up}};
    controller.observe(outcome, calibration ? 0.0 : 4.0 + (catch_up > 1 ? 100.0 : 0.0), 10.0);
  }
  EXPECT_NEAR(controller.predicted_draft_round_ms(1), 1.0, 1e-9);
}

TEST(BatchGoodputController, APreemptedStepDoesNotFlattenTheVerifyLine) {
  // Compute-bound: T tokens cost T ms. Plain steps, then one plain step that took 60 ms (the OS
  // preempted it): the line must stay steep enough that drafting still does not pay.
  BatchGoodputController controller(8);
  const BatchGoodputController::Row row[] = {{0, 8, 0, 4, -1}};
  for (int step = 0; step < 200; ++step) {
    const int64_t gamma = controller.choose(row)[0];
    const bool calibration = controller.calibrating();
    int64_t accepted = 0;
    if (!calibration) accepted = gamma / 2;  // acceptance about 0.5
    const BatchGoodputController::Outcome outcome[] = {{0, gamma, accepted, true, calibration}};
    const double verify = step == 100 ? 60.0 : double(gamma + 1);
    controller.observe(outcome, calibration ? 0.0 : 0.3 * double(gamma), verify);
    if (step > 100) {
      EXPECT_GT(controller.predicted_verify_ms(2) - controller.predicted_verify_ms(1), 0.5)
          << "step " << step;
    }
  }
}

TEST(BatchGoodputController, EstimatesAcceptancePerPosition) {
  BatchGoodputController controller(3);
  // Position 1 always accepted, position 2 never.
  for (int i = 0; i < 100; ++i) {
    const BatchGoodputController::Outcome outcome[] = {{0, 3, 1, true}};
    controller.observe(outcome, 3.0, 10.0);
  }
  EXPECT_NEAR(controller.acceptance(0, 1), 1.0, 1e-6);
  EXPECT_NEAR(controller.acceptance(0, 2), 0.0, 1e-6);
}

}  // namespace
}  // namespace specrun
