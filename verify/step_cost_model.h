// The measured cost of a speculative step, as the goodput policy predicts it: a step costs
// t_draft + t_verify. The target scores T = sum(gamma_i + 1) tokens in one forward (and the
// alternates beside the drafts, where there are any), t_verify(T) = a + b * T; the draft runs one
// batched forward per draft position, each costing c + e * rows (rows = sequences still drafting
// at that depth). Both lines are fitted by least
// squares to moving averages of the measured costs, kept per T and per row count, that age out
// after `window` steps (costs change with load); a single measured point is flat, and a line that
// would fall loses its stalest points (see refit). A point's first sample pays the one-time costs
// of a step of that size (buffers grown and paged in: on the 2-core EPYC the demo target's first
// 3-token verification took 16.6 ms, later ones 13.9, by specrun --log-level debug), so a lower
// second sample replaces it, and points measured once are left out of a line that has two
// measured more often.
#pragma once

#include <cstdint>
#include <map>
#include <span>

namespace specrun {

class StepCostModel {
 public:
  struct Tuning {
    double ema = 0.2;      // weight of a new sample in a point's moving average
    int64_t window = 256;  // steps after which an unrefreshed point is dropped
    double outlier = 2.0;  // a sample counts as at most this times its point's average
  };

  explicit StepCostModel(const Tuning& tuning) : tuning_(tuning) {}

  // One step at `step` (a running count): `tokens` scored at `verify_ms`; and, when the draft ran
  // steadily (no backlog read first), `rounds` draft rounds for `drafts` drafts at `draft_ms`.
  void observe(int64_t step, int64_t tokens, double verify_ms, int64_t rounds, int64_t drafts,
               bool steady, double draft_ms);
  // Forgets every point (the load changed).
  void reset();

  bool verify_known() const { return verify_line_.known; }
  // Distinct token counts behind the verify line: its slope needs two.
  int64_t verify_points() const { return verify_line_.distinct; }
  bool draft_known() const { return draft_line_.known; }
  double verify_ms(double tokens) const;  // NaN until measured
  double verify_ms_per_token() const { return verify_line_.known ? verify_line_.slope : 0.0; }
  double draft_round_ms(int64_t rows) const;  // NaN until measured
  // The predicted cost of a step with these gammas (verify line only until the draft line is
  // measured), where the target scores `scored_per_draft` tokens a draft (1 + its alternates).
  double step_ms(std::span<const int64_t> gammas, double scored_per_draft = 1.0) const;

 private:
  struct Point {
    double ms = 0.0;      // moving average
    int64_t updated = 0;  // the step that last measured it
    int64_t samples = 0;  // measurements behind it (since it last started over)
  };
  struct Line {
    double intercept = 0.0;
    double slope = 0.0;
    bool known = false;
    int64_t distinct = 0;  // distinct x values behind the fit
    bool falling = false;  // least squares gave a negative slope (flattened)
  };
  Line fit(const std::map<int64_t, Point>& points) const;
  // fit(), after dropping the stalest points (never `keep`) while the line falls.
  Line refit(std::map<int64_t, Point>& points, int64_t keep);
  void update(std::map<int64_t, Point>& points, int64_t x, double ms);

  Tuning tuning_;
  int64_t step_ = 0;                        // the latest step observed
  std::map<int64_t, Point> verify_points_;  // T -> ms
  std::map<int64_t, Point> draft_points_;   // rows per draft round -> ms per round
  Line verify_line_;
  Line draft_line_;
};

}  // namespace specrun
