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
      std::vector<BatchGoodputController::Outcome> outcomes;
      int64_t tokens = 0, rounds = 0, drafts = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t gamma = gammas[static_cast<size_t>(b)];
        EXPECT_GE(gamma, 0);
        EXPECT_LE(gamma, 8);
        int64_t accepted = 0;
        while (accepted < gamma && rng.uniform() < alpha) ++accepted;
        outcomes.push_back({first_id + b, gamma, accepted, true});
        tokens += gamma + 1;
        rounds = std::max(rounds, gamma);
        drafts += gamma;
        if (step >= steps * 3 / 4) {
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
      outcomes.push_back({rows[i].sequence, gammas[i], gammas[i] / 2, rows[i].fixed < 0});
    }
    controller.observe(outcomes, 1.0 + double(gammas[1]), 10.0 + double(gammas[0] + gammas[1]));
  }
}

TEST(BatchGoodputController, LearnsEachSequencesOwnAcceptance) {
  BatchGoodputController controller(8);
  for (int step = 0; step < 100; ++step) {
    const std::vector<BatchGoodputController::Row> rows = {{1, 4, 4, 4, -1}, {2, 4, 4, 4, -1}};
    const std::vector<int64_t> gammas = controller.choose(rows);
    // Sequence 1 has every draft accepted, sequence 2 none.
    controller.observe(std::vector<BatchGoodputController::Outcome>{{1, gammas[0], gammas[0], true},
                                                                    {2, gammas[1], 0, true}},
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

}  // namespace
}  // namespace specrun
