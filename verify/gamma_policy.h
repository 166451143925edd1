// Gamma policies: how many tokens each sequence drafts in the next step, from what earlier steps
// showed. Fixed, heuristic and goodput (verify/goodput_policy.h) sit behind one interface: each
// step the engine asks every policy in use to plan the sequences that chose it, then tells every
// policy the whole step's outcome. The loop knows no policy by name.
//
// What the user's gamma means is the same under every policy: the depth of a sequence's first
// drafting step (within gamma_max and the room left). Fixed drafts gamma at every step; heuristic
// starts there and moves within [gamma_min, gamma_max]; goodput may decode plainly while it
// measures the target's costs, drafts gamma the first time it runs the proposer for a sequence,
// and from then on chooses within [gamma_min, gamma_max] from measured acceptance and costs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "specrun/settings.hpp"

namespace specrun {

// One sequence's part of a step, as its policy sees it.
struct GammaRow {
  int64_t sequence = 0;  // the engine's id
  int64_t cap = 0;       // most drafts allowed this step: gamma_max, tokens still to come, context
  int64_t min = 0;       // fewest wanted: its gamma_min, clipped to cap
  int64_t max = 0;       // its gamma_max, whatever this step's cap
  int64_t first = 0;     // its gamma: the depth of its first drafting step
  // Overlapped drafting is the policy's call (OverlapDrafting::kAuto) and the backend would run
  // the drafts ahead beside the verification: only then may a plan draft ahead.
  bool ahead_hidden = false;
};

// What a sequence drafts in the step.
struct DraftPlan {
  int64_t gamma = 0;  // drafts to verify, in [0, cap]
  // Free point-mass proposals (prompt lookup padded with filler) instead of the proposer's: a
  // calibration step that measures the target's cost of scoring gamma + 1 tokens without paying
  // for a draft model. Any point-mass proposal keeps verification exact.
  bool filler = false;
  // Bound on the committed tokens the draft model reads before drafting (DraftRequest's
  // max_catch_up); 0 reads all of them.
  int64_t max_catch_up = 0;
  // Draft past this step's drafts while they are verified (overlapped drafting, where the row's
  // ahead_hidden allows it).
  bool draft_ahead = false;
  // Offer an alternate beside a draft only where the draft puts its chance of being the target's
  // token at least this high (DraftRequest::alternate_floor): a token scored costs this many
  // tokens committed. 0 offers every alternate the settings allow.
  float alternate_floor = 0.0f;
};

// What a sequence did in the step.
struct DraftOutcome {
  int64_t sequence = 0;  // the engine's id
  int64_t drafted = 0;   // drafts verified
  int64_t accepted = 0;  // of them accepted, <= drafted
  bool filler = false;   // its drafts were a calibration step's filler (see DraftPlan)
  // Committed tokens the draft model read before its first draft (normally 1 or 2; more after
  // plain steps). Reading a backlog is not part of a draft round's steady cost.
  int64_t catch_up = 0;
  // Overlapped drafting: of `drafted`, those the step before proposed ahead (no draft round of this
  // step made them), and the drafts this step proposed ahead for the next (rounds it did run).
  int64_t kept = 0;
  int64_t ahead = 0;
  // Alternates the target scored beside the drafts (a token tree): rows of the verification that
  // are not drafts. An accepted alternate counts in `accepted`, at its draft's position, and then
  // `alternate_taken`: the drafts past it were not decided.
  int64_t alternates = 0;
  bool alternate_taken = false;
};

class GammaPolicy {
 public:
  virtual ~GammaPolicy() = default;
  // Plans the step for `rows`, the sequences that chose this policy (plans[i] for rows[i]).
  virtual void plan(std::span<const GammaRow> rows, std::span<DraftPlan> plans) = 0;
  // The whole step: every row's outcome, this policy's rows and the others' (which are load on
  // the same target pass), the time spent proposing and the time scoring and verifying.
  virtual void observe(std::span<const DraftOutcome> step, double draft_ms, double verify_ms) = 0;
  // A sequence finished.
  virtual void forget(int64_t sequence) = 0;
};

// A new policy of the kind, for gammas up to `gamma_limit`. Policies persist across requests:
// acceptance and costs are properties of the model pair and the machine.
std::unique_ptr<GammaPolicy> make_gamma_policy(GammaControl kind, int64_t gamma_limit);

}  // namespace specrun
