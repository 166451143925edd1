// The goodput controller of a batch: chooses every running sequence's gamma for the next step so
// that the batch commits the most tokens per second.
//
// One batched step costs t_draft + t_verify. The target scores T = sum(gamma_i + 1) tokens in one
// forward, t_verify(T) = a + b * T; the draft runs one batched forward per draft position, each
// costing c + e * rows (rows = sequences still drafting at that depth). Both lines are fitted by
// least squares to moving averages of the measured costs, kept per T and per row count, that age
// out after `cost_window` steps (costs change with load); a single measured point is flat. Each
// sequence has its own acceptance alpha_ij (probability that draft j is accepted given drafts
// 1..j-1 were), a moving average per position, starting from the engine's pooled figures, so
// E_i(g) = 1 + sum_{k<=g} prod_{j<=k} alpha_ij. The choice maximises
// sum_i E_i(gamma_i) / (t_draft + t_verify) by adding one draft at a time to the sequence whose
// next draft raises that ratio most, until none does; it keeps the previous choice unless the new
// one is predicted better by the hysteresis margin. On a memory-bound target b is small and gamma
// grows; as the batch grows the target turns compute-bound, b * T dominates, and gamma falls to 0.
// Probes (every `probe_interval` steps, backed off while they change nothing) run one step at
// gamma + 1 for every sequence, so untried costs and acceptance at deeper positions stay measured
// and gamma rises again when load drops. When the batch size halves or doubles, the cost points
// are dropped and probing starts over, since costs from the old load would mislead the fit.
//
// Falling back must cost little where speculation cannot pay, and the draft model is what costs:
// its first proposal for a sequence (and any after a run of plain steps) reads every committed
// token it has not seen. So the verify line is measured before the draft runs: a new regime's
// first step decodes plainly (T = rows), its second is a calibration step that scores
// kCalibrationDepth + 1 tokens per row whose proposals cost nothing (prompt lookup padded with
// filler; any point-mass proposal keeps verification exact). The draft runs only when the line says
// it could pay with optimistic acceptance (each alpha at least optimistic_acceptance) and the draft
// cost known so far (zero before it was measured). While every row decodes plainly and that
// optimistic choice is still plain decoding, probes are calibration steps too: they refresh the
// verify line, which is what would have to change for speculation to pay, without the draft's
// catch-up. A probe that does run the draft lets it read only the latest kProbeCatchUp of the
// tokens it skipped. A step whose draft read more than the usual lag before drafting is not a
// draft-cost point.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "verify/gamma_controller.h"

namespace specrun {

class BatchGoodputController {
 public:
  struct Tuning {
    double ema = 0.2;             // weight of a new observation in every moving average
    double hysteresis = 0.05;     // keep the previous choice unless the gain is above 5%
    int64_t probe_interval = 32;  // steps between probes, at first
    int64_t max_probe_interval =
        512;                        // the interval doubles up to this while probes change nothing
    int64_t cost_window = 256;      // steps after which an unrefreshed cost point is dropped
    double prior_acceptance = 0.6;  // alpha before anything was observed
    // The acceptance the probe gate assumes: from plain decoding, probes run the draft unless even
    // this acceptance (at the measured costs) would not make speculation pay. High, because a few
    // unlucky draws must not shut the draft out for good.
    double optimistic_acceptance = 0.9;
  };

  // One running sequence's part of a step.
  struct Row {
    int64_t sequence = 0;  // the engine's id
    int64_t cap = 0;       // most drafts allowed this step (limits, remaining tokens, context)
    int64_t min = 0;       // fewest drafts wanted (its gamma_min, clipped to cap)
    int64_t initial = 0;   // its gamma before any cost was measured (its configured gamma)
    // -1: the controller chooses; otherwise the row's gamma is fixed by another controller and
    // counts only as load.
    int64_t fixed = -1;
  };

  // What a row did in the step.
  struct Outcome {
    int64_t sequence = 0;  // the engine's id
    int64_t drafted = 0;   // drafts verified
    int64_t accepted = 0;  // drafts accepted, <= drafted
    bool chosen = true;    // whether this controller chose its gamma (else: counted as load only)
    // The row's proposals were a calibration step's free filler: they count as scored tokens,
    // not as draft rounds or acceptance.
    bool calibration = false;
    // Committed tokens the draft read before its first draft of the step (normally 1 or 2; more
    // after plain steps). Catch-up is not part of a draft round's steady cost.
    int64_t catch_up = 0;
  };

  explicit BatchGoodputController(int64_t gamma_limit, const Tuning& tuning);
  explicit BatchGoodputController(int64_t gamma_limit)
      : BatchGoodputController(gamma_limit, Tuning{}) {}

  // Gammas for the rows, in order, each within [min, cap] (or its fixed value).
  std::vector<int64_t> choose(std::span<const Row> rows);
  // Whether the last choose() asked for a calibration step: the rows it chose (not the fixed
  // ones) with a positive gamma get free point-mass proposals instead of the draft model's.
  bool calibrating() const { return calibrating_; }
  // Whether the last choose() was a probe with the draft model: its rows' drafts then read at most
  // kProbeCatchUp of the tokens they skipped (DraftRequest::max_catch_up), since reading them all
  // would cost as much as drafting all along, and a probe only measures acceptance.
  bool probing() const { return model_probe_; }
  // The step's outcome: every row, the time proposing and the time scoring and verifying.
  void observe(std::span<const Outcome> outcomes, double draft_ms, double verify_ms);
  // Forget a finished sequence.
  void remove_sequence(int64_t sequence);

  // The model behind the choice, for tests and reports.
  double acceptance(int64_t sequence, int64_t position) const;  // alpha, position from 1
  double predicted_verify_ms(int64_t tokens) const;             // NaN until measured
  double predicted_draft_round_ms(int64_t rows) const;          // NaN until measured
  int64_t probe_interval() const { return interval_; }
  int64_t calibration_steps() const { return calibration_steps_; }  // so far, for tests
  // Largest draft catch-up that still counts as a steady draft round.
  static constexpr int64_t kSteadyCatchUp = 2;
  // Free drafts per row in a regime's calibration step: T = 3 * rows against the plain step's
  // T = rows is a slope that timing noise does not swamp, for little wasted compute.
  static constexpr int64_t kCalibrationDepth = 2;
  static constexpr int64_t kProbeCatchUp = 32;

 private:
  struct Point {
    double ms = 0.0;      // moving average
    int64_t updated = 0;  // the step that last measured it
  };
  struct Line {
    double intercept = 0.0;
    double slope = 0.0;
    bool known = false;
    int64_t distinct = 0;  // distinct x values behind the fit; a slope needs two
  };
  Line fit(const std::map<int64_t, Point>& points) const;
  void update_point(std::map<int64_t, Point>& points, int64_t x, double ms);
  double step_ms(std::span<const int64_t> gammas) const;
  double alpha(int64_t sequence, int64_t position) const;
  // The goodput-maximising gammas for the chosen rows, starting from `start`; with `optimistic`
  // every alpha counts as at least optimistic_acceptance.
  std::vector<int64_t> best_gammas(std::span<const Row> rows, std::span<const size_t> chosen,
                                   std::vector<int64_t> start, bool optimistic) const;
  double goodput(std::span<const Row> rows, std::span<const int64_t> gammas, bool optimistic) const;

  int64_t gamma_limit_;
  Tuning tuning_;
  int64_t steps_ = 0;
  int64_t interval_;
  int64_t next_probe_;
  bool probing_ = false;
  bool calibrating_ = false;
  bool model_probe_ = false;
  int64_t next_calibration_ = 0;  // no calibration step before this step
  int64_t calibration_steps_ = 0;
  int64_t regime_batch_ = 0;                // batch size when the cost points were started
  std::map<int64_t, Point> verify_points_;  // T -> ms
  std::map<int64_t, Point> draft_points_;   // rows per draft round -> ms per round
  Line verify_line_;
  Line draft_line_;
  std::vector<double> pooled_alpha_;  // [gamma_limit + 1] by position, every sequence
  std::vector<bool> pooled_seen_;     // [gamma_limit + 1]
  std::unordered_map<int64_t, std::vector<double>> alpha_;  // sequence -> [gamma_limit + 1]
  std::unordered_map<int64_t, int64_t> previous_;           // sequence -> last chosen gamma
  std::unordered_map<int64_t, int64_t> last_choice_;        // the choice before a probe
};

}  // namespace specrun
