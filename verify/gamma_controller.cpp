#include "verify/gamma_controller.h"

#include <algorithm>

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
      break;
  }
  // The goodput controller chooses for a whole batch at once: verify/batch_gamma.h.
  SPECRUN_CHECK(false) << "no per-sequence controller for '" << controller_name(kind) << "'";
  return nullptr;
}

}  // namespace specrun
