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
               // (verify/batch_gamma.h)
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

// The per-sequence controllers: fixed and heuristic. The goodput controller chooses every
// sequence's gamma of a step together (BatchGoodputController, verify/batch_gamma.h), also for a
// single sequence.
std::unique_ptr<GammaController> make_gamma_controller(ControllerKind kind,
                                                       const GammaLimits& limits);

}  // namespace specrun
