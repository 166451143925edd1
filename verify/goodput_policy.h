// The goodput policy: chooses the gamma of every sequence it plans so that the batch commits the
// most tokens per second.
//
// Each sequence has its own acceptance alpha_ij (probability that draft j is accepted given drafts
// 1..j-1 were), counted per position over its recent drafts, starting from the pooled figures of
// every sequence at the first position and from the position before at deeper ones, so E_i(g) = 1 +
// sum_{k<=g} prod_{j<=k} alpha_ij (with alternates, an accepted one ends the step: each factor
// before the last is alpha_ij times the pooled share of the acceptances at j that were the draft
// itself); gamma is chosen with the first position's alpha raised by a standard error of its
// estimate (Tuning::optimism). With the step's predicted cost (verify/step_cost_model.h) the choice
// maximises sum_i E_i(gamma_i) / (t_draft + t_verify) by adding one draft at a time to the sequence
// whose next draft raises that ratio most, until none does; it keeps the previous choice unless the
// new one is predicted better by the hysteresis margin. On a memory-bound target b is small and
// gamma grows; as the batch grows the target turns compute-bound, b * T dominates, and gamma falls
// to 0.
//
// Probes (every `probe_interval` steps, backed off while they change nothing) run one step at
// gamma + 1 for every sequence, so untried costs and acceptance at deeper positions stay measured
// and gamma rises again when load drops. When the batch size halves or doubles, the cost points
// are dropped and probing starts over, since costs from the old load would mislead the fit.
//
// Falling back must cost little where speculation cannot pay, and the draft model is what costs:
// its first proposal for a sequence (and any after a run of plain steps) reads every committed
// token it has not seen. So the verify line is measured before the draft runs: a new regime's
// first two steps decode plainly (T = rows), its third and fourth are calibration steps that score
// kCalibrationDepth + 1 tokens per row whose proposals cost nothing (DraftPlan::filler): the
// first of them pays the larger step's one-time costs, the second measures it. The
// draft runs only when the line says it could pay with optimistic acceptance (each alpha at least
// optimistic_acceptance) and the draft cost known so far (zero before it was measured). While
// every row decodes plainly and that optimistic choice is still plain decoding, probes are
// calibration steps too: they refresh the verify line, which is what would have to change for
// speculation to pay, without the draft's catch-up. A probe that does run the draft lets it read
// only the latest kProbeCatchUp of the tokens it skipped. A step whose draft read more than the
// usual lag before drafting is not a draft-cost point.
//
// A sequence's first drafting step drafts its configured gamma (GammaRow::first; 0 leaves the
// depth to the policy): the user's gamma is where drafting starts, and what is measured from
// there moves it.
//
// Overlapped drafting, where the backend would hide it (GammaRow::ahead_hidden): drafting ahead
// runs gamma + 1 more draft rounds beside the verification and, when its drafts are kept (every
// draft accepted and the draft's next token the target's new one, taken to be as likely as an
// acceptance at depth gamma + 1), spares the next step gamma rounds. A row drafts ahead when the
// rounds spared, weighed by that chance, outweigh the part of the rounds ahead that the
// verification's own time does not hide. (Where the rounds run after the verification instead,
// nothing is hidden and the rounds spared never outweigh the gamma + 1 run: the engine does not
// ask.)
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "verify/gamma_policy.h"
#include "verify/step_cost_model.h"

namespace specrun {

class GoodputPolicy : public GammaPolicy {
 public:
  struct Tuning {
    double ema = 0.2;             // weight of a new observation in the costs' moving averages
    double hysteresis = 0.05;     // keep the previous choice unless the gain is above 5%
    int64_t probe_interval = 32;  // steps between probes, at first
    int64_t max_probe_interval =
        512;                        // the interval doubles up to this while probes change nothing
    int64_t cost_window = 256;      // steps after which an unrefreshed cost point is dropped
    double prior_acceptance = 0.6;  // alpha before anything was observed
    // Acceptance is counted, not averaged: each position keeps its drafts and acceptances, both
    // multiplied by this at every new observation (a memory of about 1 / (1 - memory) drafts),
    // plus the first position's prior (the pooled figure, for a sequence) as prior_weight drafts.
    double acceptance_memory = 0.95;
    double prior_weight = 1.0;
    // A deeper position's prior, the position before it (see chain()), counts as this many
    // drafts: a few rejections move it, and some twenty drafts measured make it the evidence's.
    double depth_prior_weight = 4.0;
    // Gamma is chosen with the first position's alpha raised by this many standard errors of its
    // estimate (sqrt(alpha (1 - alpha) / drafts counted)), divided by sqrt(rows) in a step of
    // several rows (their errors partly cancel in the step's total): a run of rejections must not
    // shut the draft out where it pays on average, since plain decoding observes nothing that
    // would correct it. Drafting a little below break-even costs little; not drafting above it,
    // the speedup.
    double optimism = 1.0;
    // The acceptance the probe gate assumes: from plain decoding, probes run the draft unless even
    // this acceptance (at the measured costs) would not make speculation pay. High, because a few
    // unlucky draws must not shut the draft out for good.
    double optimistic_acceptance = 0.9;
  };

  GoodputPolicy(int64_t gamma_limit, const Tuning& tuning);
  explicit GoodputPolicy(int64_t gamma_limit) : GoodputPolicy(gamma_limit, Tuning{}) {}

  void plan(std::span<const GammaRow> rows, std::span<DraftPlan> plans) override;
  void observe(std::span<const DraftOutcome> step, double draft_ms, double verify_ms) override;
  void forget(int64_t sequence) override;

  // The model behind the choice, for tests and reports.
  double acceptance(int64_t sequence, int64_t position) const;  // alpha, position from 1
  const StepCostModel& costs() const { return costs_; }
  int64_t calibration_steps() const { return calibration_steps_; }  // so far

  // Largest draft catch-up that still counts as a steady draft round.
  static constexpr int64_t kSteadyCatchUp = 2;
  // Free drafts per row in a regime's calibration step: T = 3 * rows against the plain step's
  // T = rows is a slope that timing noise does not swamp, for little wasted compute.
  static constexpr int64_t kCalibrationDepth = 2;
  // Committed tokens a probe's draft reads at most before drafting.
  static constexpr int64_t kProbeCatchUp = 32;

 private:
  // Discounted counts of one position's drafts (see Tuning::acceptance_memory).
  struct Evidence {
    double accepted = 0.0;
    double drafted = 0.0;
    double continued = 0.0;  // of those accepted, the drafts themselves (not an alternate)
  };
  // Of the tokens accepted at `position`, the share that were the draft itself, so that the step
  // goes on past it (an accepted alternate ends it): pooled over sequences, 1 without alternates.
  double continuation(int64_t position) const;
  // An estimate of alpha and its standard error.
  struct Estimate {
    double mean;
    double error;
  };
  // Estimates by position from evidence by position ([0] unused): position 1's prior is
  // `first_prior`, each deeper one's the position before it, scaled by `pooled`'s change there
  // where given.
  std::vector<Estimate> chain(std::span<const Evidence> evidence, double first_prior,
                              const std::vector<Estimate>* pooled) const;
  // The sequence's estimates by position, [gamma_limit + 1] ([0] unused), given the pooled ones.
  std::vector<Estimate> estimates(int64_t sequence, const std::vector<Estimate>& pooled) const;
  // Computes beliefs_ for the step's rows.
  void believe(std::span<const GammaRow> rows);
  // What gamma is chosen with for row `row` of a step of `rows` sequences: the estimate, at the
  // first position raised by Tuning::optimism standard errors of the step's expected tokens,
  // shared among its rows.
  double alpha(size_t row, int64_t position, int64_t rows) const;
  // The goodput-maximising gammas for the rows, starting from `start`; with `optimistic` every
  // alpha counts as at least optimistic_acceptance.
  std::vector<int64_t> best_gammas(std::span<const GammaRow> rows, std::vector<int64_t> start,
                                   bool optimistic) const;
  double goodput(std::span<const GammaRow> rows, std::span<const int64_t> gammas,
                 bool optimistic) const;
  // Whether drafting ahead pays for row `i` of a step with these gammas (see plan()).
  bool ahead_pays(std::span<const int64_t> gammas, size_t i) const;
  // The gammas of the step; sets calibrating_, probing_model_ and remember_.
  std::vector<int64_t> choose(std::span<const GammaRow> rows);

  int64_t gamma_limit_;
  Tuning tuning_;
  StepCostModel costs_;
  int64_t steps_ = 0;
  int64_t interval_;
  int64_t next_probe_;
  bool probing_ = false;        // the last choice was a probe
  bool calibrating_ = false;    // the current step is a calibration step
  bool probing_model_ = false;  // the current step is a probe that runs the draft model
  // The current step's gammas are a choice to keep (not a regime's first plain step, a
  // calibration step or a probe): hysteresis and probes start from them.
  bool remember_ = false;
  int64_t next_calibration_ = 0;  // no calibration step before this step
  int64_t calibration_steps_ = 0;
  int64_t regime_calibrations_ = 0;  // calibration steps since the regime started
  int64_t regime_plain_steps_ = 0;   // plain steps the regime started with
  int64_t regime_batch_ = 0;         // batch size when the cost points were started
  std::vector<Evidence> pooled_;     // [gamma_limit + 1] by position, every sequence
  // The one sequence whose outcomes pooled_ holds (engine ids are not negative), or one of these.
  static constexpr int64_t kNoSequence = -1;
  static constexpr int64_t kSeveralSequences = -2;
  int64_t pooled_sole_ = kNoSequence;
  std::unordered_map<int64_t, std::vector<Evidence>> own_;  // sequence -> [gamma_limit + 1]
  std::unordered_map<int64_t, int64_t> previous_;           // sequence -> last chosen gamma
  std::unordered_map<int64_t, int64_t> last_choice_;        // the choice before a probe
  std::unordered_set<int64_t> planned_;                     // this policy's rows of the step
  std::vector<std::vector<Estimate>> beliefs_;  // the step's estimates: [rows][gamma_limit + 1]
  // Alternates and drafts the target scored lately, discounted as acceptance is (each step's
  // drafting rows, every policy's): a draft's share of the verification is 1 + their ratio.
  double alternates_scored_ = 0.0;
  double drafts_scored_ = 0.0;
};

}  // namespace specrun
