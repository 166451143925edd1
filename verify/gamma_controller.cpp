#include "verify/gamma_controller.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/core/check.h"

namespace specrun {

ControllerKind parse_controller(const std::string& name) {
  if (name == "fixed") return ControllerKind::kFixed;
  if (name == "heuristic") return ControllerKind::kHeuristic;
  if (name == "goodput") return ControllerKind::kGoodput;
  throw Error("controller '" + name + "' is not one of fixed, heuristic, goodput");
}

const char* controller_name(ControllerKind kind) {
  switch (kind) {
    case ControllerKind::kFixed:
      return "fixed";
    case ControllerKind::kHeuristic:
      return "heuristic";
    case ControllerKind::kGoodput:
      return "goodput";
  }
  return "?";
}

namespace {

void check_limits(const GammaLimits& limits) {
  if (limits.min < 0 || limits.max < limits.min || limits.initial < limits.min ||
      limits.initial > limits.max) {
    throw Error("gamma limits must satisfy 0 <= gamma_min <= gamma <= gamma_max, got gamma_min " +
                std::to_string(limits.min) + ", gamma " + std::to_string(limits.initial) +
                ", gamma_max " + std::to_string(limits.max));
  }
}

class FixedController : public GammaController {
 public:
  explicit FixedController(int64_t gamma) : gamma_(gamma) {}
  int64_t next_gamma() override { return gamma_; }
  void observe(const StepObservation&) override {}

 private:
  int64_t gamma_;
};

class HeuristicController : public GammaController {
 public:
  explicit HeuristicController(const GammaLimits& limits)
      : limits_(limits), gamma_(limits.initial) {}
  int64_t next_gamma() override { return gamma_; }
  void observe(const StepObservation& step) override {
    // A step limited below the chosen gamma (end of budget) says nothing about the choice.
    if (step.gamma < gamma_ && step.accepted == step.gamma) return;
    gamma_ = step.accepted == step.gamma && step.gamma > 0 ? gamma_ + 2 : gamma_ - 1;
    // At 0 nothing is drafted, so nothing is learnt: step back up to 1 after a plain step.
    if (step.gamma == 0) gamma_ = 1;
    gamma_ = std::clamp(gamma_, limits_.min, limits_.max);
  }

 private:
  GammaLimits limits_;
  int64_t gamma_;
};

}  // namespace

std::unique_ptr<GammaController> make_gamma_controller(ControllerKind kind,
                                                       const GammaLimits& limits) {
  check_limits(limits);
  switch (kind) {
    case ControllerKind::kFixed:
      return std::make_unique<FixedController>(limits.initial);
    case ControllerKind::kHeuristic:
      return std::make_unique<HeuristicController>(limits);
    case ControllerKind::kGoodput:
      return std::make_unique<GoodputController>(limits);
  }
  return nullptr;
}

GoodputController::GoodputController(const GammaLimits& limits, const Tuning& tuning)
    : limits_(limits),
      tuning_(tuning),
      current_(limits.initial),
      interval_(tuning.probe_interval),
      alpha_(static_cast<size_t>(limits.max) + 1, tuning.prior_acceptance),
      alpha_seen_(static_cast<size_t>(limits.max) + 1, false),
      verify_ms_(static_cast<size_t>(limits.max) + 1, -1.0),
      verify_updated_(static_cast<size_t>(limits.max) + 1, -1) {
  check_limits(limits);
}

double GoodputController::acceptance(int64_t position) const {
  return alpha_[static_cast<size_t>(position)];
}

double GoodputController::expected_tokens(int64_t gamma) const {
  double expected = 1.0;
  double reach = 1.0;  // probability that drafts 1..k are all accepted
  for (int64_t k = 1; k <= gamma; ++k) {
    reach *= alpha_[static_cast<size_t>(k)];
    expected += reach;
  }
  return expected;
}

double GoodputController::predicted_step_ms(int64_t gamma) const {
  // Measurements older than a few probe intervals describe another load; use them only when
  // nothing fresher exists.
  const int64_t horizon = 4 * tuning_.probe_interval;
  auto fresh = [&](int64_t g) {
    return verify_ms_[static_cast<size_t>(g)] >= 0 &&
           steps_ - verify_updated_[static_cast<size_t>(g)] <= horizon;
  };
  bool any_fresh = false;
  for (int64_t g = 0; g <= limits_.max; ++g) any_fresh = any_fresh || fresh(g);
  // Least-squares line through the usable per-gamma averages.
  double n = 0, sum_g = 0, sum_t = 0, sum_gg = 0, sum_gt = 0;
  for (int64_t g = 0; g <= limits_.max; ++g) {
    const double t = verify_ms_[static_cast<size_t>(g)];
    if (t < 0 || (any_fresh && !fresh(g))) continue;
    n += 1;
    sum_g += static_cast<double>(g);
    sum_t += t;
    sum_gg += static_cast<double>(g * g);
    sum_gt += static_cast<double>(g) * t;
  }
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  double verify = sum_t / n;  // one measured gamma: flat
  const double denominator = n * sum_gg - sum_g * sum_g;
  if (n >= 2 && denominator > 0) {
    const double slope = std::max(0.0, (n * sum_gt - sum_g * sum_t) / denominator);
    const double intercept = (sum_t - slope * sum_g) / n;
    verify = intercept + slope * static_cast<double>(gamma);
  }
  // A usable direct measurement beats the fit.
  if (verify_ms_[static_cast<size_t>(gamma)] >= 0 && (!any_fresh || fresh(gamma))) {
    verify = verify_ms_[static_cast<size_t>(gamma)];
  }
  if (gamma == 0) return verify;
  if (draft_ms_per_token_ < 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(gamma) * draft_ms_per_token_ + verify;
}

double GoodputController::predicted_goodput(int64_t gamma) const {
  return expected_tokens(gamma) / predicted_step_ms(gamma);
}

void GoodputController::observe(const StepObservation& step) {
  ++steps_;
  const double w = tuning_.ema;
  auto blend = [w](double& average, double value) {
    average = average < 0 ? value : (1.0 - w) * average + w * value;
  };
  // Positions 1..k were accepted; position k+1 (if drafted) was rejected.
  const int64_t depth = std::min({step.gamma, step.accepted + 1, limits_.max});
  for (int64_t j = 1; j <= depth; ++j) {
    const double accepted = j <= step.accepted ? 1.0 : 0.0;
    double& alpha = alpha_[static_cast<size_t>(j)];
    alpha = alpha_seen_[static_cast<size_t>(j)] ? (1.0 - w) * alpha + w * accepted
                                                : 0.5 * (alpha + accepted);
    alpha_seen_[static_cast<size_t>(j)] = true;
  }
  // Positions past the depth reached were not observed: those never seen start from the deepest
  // one measured, and all of them drift slowly toward it, so that estimates left from another
  // regime (another prompt, another load) do not pin gamma down or up.
  if (depth > 0) {
    const double deepest = alpha_[static_cast<size_t>(depth)];
    for (int64_t j = depth + 1; j <= limits_.max; ++j) {
      double& alpha = alpha_[static_cast<size_t>(j)];
      alpha = alpha_seen_[static_cast<size_t>(j)] ? alpha + 0.25 * w * (deepest - alpha) : deepest;
    }
  }
  if (step.gamma > 0) blend(draft_ms_per_token_, step.draft_ms / static_cast<double>(step.gamma));
  if (step.gamma <= limits_.max) {
    blend(verify_ms_[static_cast<size_t>(step.gamma)], step.verify_ms);
    verify_updated_[static_cast<size_t>(step.gamma)] = steps_;
  }
  choose();
  if (probing_) {
    // A probe that changed nothing earns a longer wait before the next; one that moved the
    // choice starts the schedule over.
    interval_ = current_ == chosen_before_probe_
                    ? std::min(2 * interval_, tuning_.max_probe_interval)
                    : tuning_.probe_interval;
    next_probe_ = steps_ + interval_;
    probing_ = false;
  }
}

void GoodputController::choose() {
  int64_t best = current_;
  double best_goodput = predicted_goodput(current_);
  for (int64_t g = limits_.min; g <= limits_.max; ++g) {
    const double goodput = predicted_goodput(g);
    if (std::isnan(goodput)) continue;
    const double margin = g == current_ ? 1.0 : 1.0 + tuning_.hysteresis;
    if (std::isnan(best_goodput) || goodput > best_goodput * margin) {
      best = g;
      best_goodput = goodput;
    }
  }
  current_ = best;
}

int64_t GoodputController::next_gamma() {
  // Early steps probe every third step, to get a second cost point (and the plain-decoding cost)
  // quickly; later ones follow the backed-off schedule. A probe tries a neighbour of the current
  // choice, so the cost line and the acceptance of the next position stay measured.
  const bool early = steps_ < 8;
  if (steps_ == 0 || (early ? steps_ % 3 != 0 : steps_ < next_probe_)) return current_;
  int64_t probe;
  if (current_ == 0) {
    probe = 1;  // the cheapest step that measures acceptance
  } else if (verify_ms_[0] < 0 && limits_.min == 0) {
    probe = 0;  // plain decoding's cost is the baseline speculation must beat
  } else {
    probe = (steps_ / std::max<int64_t>(interval_, 3)) % 2 ? current_ + 1 : current_ - 1;
  }
  probe = std::clamp(probe, limits_.min, limits_.max);
  if (early) return probe;
  probing_ = true;
  chosen_before_probe_ = current_;
  if (probe == current_) {  // no neighbour to try: count it as a probe that changed nothing
    return current_;
  }
  return probe;
}

}  // namespace specrun
