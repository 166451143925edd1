#include "verify/gamma_policy.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "runtime/base/check.h"
#include "verify/goodput_policy.h"

namespace specrun {
namespace {

// Always the row's gamma, within this step's cap.
class FixedPolicy : public GammaPolicy {
 public:
  void plan(std::span<const GammaRow> rows, std::span<DraftPlan> plans) override {
    // Drafting ahead that the verification hides costs the step nothing.
    for (size_t i = 0; i < rows.size(); ++i) {
      plans[i] = {std::min(rows[i].first, rows[i].cap)};
      plans[i].draft_ahead = rows[i].ahead_hidden;
    }
  }
  void observe(std::span<const DraftOutcome>, double, double) override {}
  void forget(int64_t) override {}
};

// +2 after a step that accepted every draft, -1 otherwise, within [gamma_min, gamma_max]; a
// sequence starts at its gamma.
class HeuristicPolicy : public GammaPolicy {
 public:
  void plan(std::span<const GammaRow> rows, std::span<DraftPlan> plans) override {
    planned_.clear();
    for (size_t i = 0; i < rows.size(); ++i) {
      const GammaRow& row = rows[i];
      const auto [it, fresh] = state_.try_emplace(row.sequence, State{row.first, row.min, row.max});
      it->second.chosen = it->second.gamma;
      plans[i] = {std::min(it->second.gamma, row.cap)};
      plans[i].draft_ahead = row.ahead_hidden;
      planned_.insert(row.sequence);
    }
  }

  void observe(std::span<const DraftOutcome> step, double, double) override {
    for (const DraftOutcome& outcome : step) {
      if (planned_.count(outcome.sequence) == 0) continue;
      State& s = state_.at(outcome.sequence);
      // A step cut below the chosen gamma (end of budget or context) that accepted all it drafted
      // says nothing about the choice.
      if (outcome.drafted < s.chosen && outcome.accepted == outcome.drafted) continue;
      const bool all = outcome.drafted > 0 && outcome.accepted == outcome.drafted;
      s.gamma = all ? s.gamma + 2 : s.gamma - 1;
      // At 0 nothing is drafted, so nothing is learnt: step back up to 1 after a plain step.
      if (outcome.drafted == 0) s.gamma = 1;
      s.gamma = std::clamp(s.gamma, s.min, s.max);
    }
  }

  void forget(int64_t sequence) override { state_.erase(sequence); }

 private:
  struct State {
    int64_t gamma = 0;   // the next step's
    int64_t min = 0;     // gamma_min
    int64_t max = 0;     // gamma_max
    int64_t chosen = 0;  // the gamma planned for the current step
  };
  std::unordered_map<int64_t, State> state_;  // sequence -> its state
  std::unordered_set<int64_t> planned_;       // this policy's rows of the current step
};

}  // namespace

std::unique_ptr<GammaPolicy> make_gamma_policy(GammaControl kind, int64_t gamma_limit) {
  switch (kind) {
    case GammaControl::kFixed:
      return std::make_unique<FixedPolicy>();
    case GammaControl::kHeuristic:
      return std::make_unique<HeuristicPolicy>();
    case GammaControl::kGoodput:
      return std::make_unique<GoodputPolicy>(gamma_limit);
  }
  throw Error("gamma controller " + std::to_string(static_cast<int>(kind)) +
              " is not one of goodput, heuristic, fixed");
}

}  // namespace specrun
