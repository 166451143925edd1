// Gamma controllers: how many tokens to draft next, from what the last steps showed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace specrun {

enum class ControllerKind {
  kFixed,      // always the configured gamma
  kHeuristic,  // +2 after a step that accepted every draft, -1 otherwise
  kGoodput,    // maximise expected committed tokens per second from measured acceptance and costs
};

// "fixed", "heuristic", "goodput"; throws Error otherwise.
ControllerKind parse_controller(const std::string& name);
const char* controller_name(ControllerKind kind);

struct GammaLimits {
  int64_t initial = 4;  // gamma of the first step (and of every step for the fixed controller)
  int64_t min = 0;      // never below (0 allows plain decoding)
  int64_t max = 8;      // never above
};

// What one speculative step showed.
struct StepObservation {
  int64_t gamma = 0;       // drafts verified this step (after early stop and limits)
  int64_t accepted = 0;    // drafts accepted, <= gamma
  double draft_ms = 0.0;   // time spent proposing
  double verify_ms = 0.0;  // time spent scoring and verifying (the target's step)
};

class GammaController {
 public:
  virtual ~GammaController() = default;
  virtual int64_t next_gamma() = 0;
  virtual void observe(const StepObservation& step) = 0;
};

std::unique_ptr<GammaController> make_gamma_controller(ControllerKind kind,
                                                       const GammaLimits& limits);

// The goodput controller, exposed for tests and reports.
//
// Acceptance: alpha_j, the probability that draft j is accepted given drafts 1..j-1 were, is an
// exponential moving average per position over the steps that reached j. Costs: the draft's cost
// per drafted token, and the verify cost as a function of gamma, fitted by least squares to a
// line a + b * gamma through the per-gamma moving averages measured recently (one measured gamma:
// flat until a second is seen); costs change with load, so old measurements age out. Positions a
// step did not reach drift toward the deepest one it measured, so estimates from another regime go
// stale gracefully. Expected tokens per step E(g) = 1 + sum_{k=1..g} prod_{j<=k} alpha_j; the
// controller picks the g maximising E(g) / (g * t_draft + t_verify(g)), switching only when the
// gain beats the current choice by the hysteresis margin. Every `probe_interval` steps (backing off
// while probes change nothing) it tries a
// neighbouring gamma (gamma 1 when at 0, the cheapest step that measures acceptance) to keep
// untried choices measured, so it leaves plain decoding again when speculation starts to pay, at a
// cost of a few percent when it does not.
class GoodputController : public GammaController {
 public:
  struct Tuning {
    double ema = 0.2;             // weight of a new observation in every moving average
    double hysteresis = 0.05;     // switch only for a predicted gain above 5%
    int64_t probe_interval = 32;  // steps between probes of a neighbouring gamma, at first
    // The interval doubles up to this while probes change nothing: a probe from gamma 0 also makes
    // the draft catch up on every token since its last step, so it must stay rare when
    // speculation does not pay.
    int64_t max_probe_interval = 512;
    double prior_acceptance = 0.6;  // alpha_j before position j was ever observed
  };

  GoodputController(const GammaLimits& limits, const Tuning& tuning);
  explicit GoodputController(const GammaLimits& limits) : GoodputController(limits, Tuning{}) {}

  int64_t next_gamma() override;
  void observe(const StepObservation& step) override;

  // The model behind the choice, for reports and tests.
  double acceptance(int64_t position) const;  // alpha_position, position from 1
  double expected_tokens(int64_t gamma) const;
  double predicted_step_ms(int64_t gamma) const;  // NaN until a cost was measured
  double predicted_goodput(int64_t gamma) const;  // tokens per ms; NaN until costs are known
  int64_t current() const { return current_; }

 private:
  void choose();

  GammaLimits limits_;
  Tuning tuning_;
  int64_t current_;                      // the gamma chosen for ordinary steps
  int64_t steps_ = 0;                    // observations so far
  int64_t interval_;                     // steps between probes now
  int64_t next_probe_ = 0;               // the step of the next probe
  bool probing_ = false;                 // the last gamma handed out was a probe
  int64_t chosen_before_probe_ = 0;      // the choice the probe tested against
  std::vector<double> alpha_;            // [max + 1]: alpha_j at index j
  std::vector<bool> alpha_seen_;         // [max + 1]
  double draft_ms_per_token_ = -1;       // EMA; negative until measured
  std::vector<double> verify_ms_;        // [max + 1]: EMA per gamma; negative until measured
  std::vector<int64_t> verify_updated_;  // [max + 1]: the step that last measured each gamma
};

}  // namespace specrun
