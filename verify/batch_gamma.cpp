#include "verify/batch_gamma.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/core/check.h"

namespace specrun {
namespace {

constexpr double kNotSeen = -1.0;
constexpr double kMinimumMs = 1e-6;  // keeps a fitted cost positive
constexpr double kDeepDrift = 0.25;
constexpr double kOutlierFactor = 2.0;  // a cost sample counts as at most this times the average //
                                        // an unobserved position moves at this fraction of the ema

}  // namespace

BatchGoodputController::BatchGoodputController(int64_t gamma_limit, const Tuning& tuning)
    : gamma_limit_(gamma_limit),
      tuning_(tuning),
      interval_(tuning.probe_interval),
      next_probe_(tuning.probe_interval),
      pooled_alpha_(static_cast<size_t>(gamma_limit) + 1, tuning.prior_acceptance),
      pooled_seen_(static_cast<size_t>(gamma_limit) + 1, false) {
  SPECRUN_CHECK(gamma_limit >= 0) << "gamma limit " << gamma_limit;
  SPECRUN_CHECK(tuning.probe_interval > 0 && tuning.max_probe_interval >= tuning.probe_interval);
}

double BatchGoodputController::alpha(int64_t sequence, int64_t position) const {
  const auto it = alpha_.find(sequence);
  if (it != alpha_.end()) {
    const double own = it->second[static_cast<size_t>(position)];
    if (own != kNotSeen) return own;
  }
  return pooled_alpha_[static_cast<size_t>(position)];
}

double BatchGoodputController::acceptance(int64_t sequence, int64_t position) const {
  SPECRUN_CHECK(position >= 1 && position <= gamma_limit_) << "position " << position;
  return alpha(sequence, position);
}

BatchGoodputController::Line BatchGoodputController::fit(
    const std::map<int64_t, Point>& points) const {
  // Least squares over the points measured within the window; one point (or one x) is flat.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, point] : points) {
    if (steps_ - point.updated > tuning_.cost_window) continue;
    const double xd = static_cast<double>(x);
    n += 1;
    sx += xd;
    sy += point.ms;
    sxx += xd * xd;
    sxy += xd * point.ms;
  }
  Line line;
  if (n == 0) return line;
  line.known = true;
  line.distinct = static_cast<int64_t>(n);
  const double variance = sxx - sx * sx / n;
  if (n < 2 || variance <= 0) {
    line.intercept = sy / n;
    return line;
  }
  line.slope = (sxy - sx * sy / n) / variance;
  line.intercept = (sy - line.slope * sx) / n;
  if (line.slope < 0) {  // noise: costs do not fall with more work
    line.slope = 0;
    line.intercept = sy / n;
  }
  return line;
}

void BatchGoodputController::update_point(std::map<int64_t, Point>& points, int64_t x, double ms) {
  const auto [it, inserted] = points.try_emplace(x, Point{ms, steps_});
  if (!inserted) {
    // A point not refreshed within the window starts over rather than blending a stale regime.
    const bool stale = steps_ - it->second.updated > tuning_.cost_window;
    // A step the OS preempted can take ten times its cost; one such sample would otherwise move
    // the average (and the line's slope, which decides everything) for dozens of steps.
    const double sample = std::min(ms, kOutlierFactor * it->second.ms);
    it->second.ms = stale ? ms : (1 - tuning_.ema) * it->second.ms + tuning_.ema * sample;
    it->second.updated = steps_;
  }
  // Drop what aged out, so the maps stay small.
  for (auto p = points.begin(); p != points.end();) {
    p = steps_ - p->second.updated > tuning_.cost_window ? points.erase(p) : std::next(p);
  }
}

double BatchGoodputController::predicted_verify_ms(int64_t tokens) const {
  if (!verify_line_.known) return std::numeric_limits<double>::quiet_NaN();
  return std::max(kMinimumMs,
                  verify_line_.intercept + verify_line_.slope * static_cast<double>(tokens));
}

double BatchGoodputController::predicted_draft_round_ms(int64_t rows) const {
  if (!draft_line_.known) return std::numeric_limits<double>::quiet_NaN();
  return std::max(kMinimumMs,
                  draft_line_.intercept + draft_line_.slope * static_cast<double>(rows));
}

double BatchGoodputController::step_ms(std::span<const int64_t> gammas) const {
  int64_t tokens = 0, rounds = 0, drafts = 0;
  for (const int64_t gamma : gammas) {
    tokens += gamma + 1;
    rounds = std::max(rounds, gamma);
    drafts += gamma;
  }
  double ms = predicted_verify_ms(tokens);
  if (rounds > 0 && draft_line_.known) {
    // Round r feeds the rows still drafting at depth r: sum_r (c + e * rows_r) = c R + e D.
    ms += std::max(kMinimumMs, draft_line_.intercept * static_cast<double>(rounds) +
                                   draft_line_.slope * static_cast<double>(drafts));
  }
  return ms;
}

double BatchGoodputController::goodput(std::span<const Row> rows, std::span<const int64_t> gammas,
                                       bool optimistic) const {
  double tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    double expected = 1.0, run = 1.0;
    for (int64_t j = 1; j <= gammas[i]; ++j) {
      double a = alpha(rows[i].sequence, j);
      if (optimistic) a = std::max(a, tuning_.optimistic_acceptance);
      run *= a;
      expected += run;
    }
    tokens += expected;
  }
  return tokens / step_ms(gammas);
}

std::vector<int64_t> BatchGoodputController::best_gammas(std::span<const Row> rows,
                                                         std::span<const size_t> chosen,
                                                         std::vector<int64_t> start,
                                                         bool optimistic) const {
  // Greedy: add the draft (one row's, or one more for every row at once) that raises expected
  // tokens per millisecond the most, until none does.
  std::vector<int64_t> best = std::move(start);
  double best_goodput = goodput(rows, best, optimistic);
  for (;;) {
    std::vector<int64_t> candidate_best;
    double candidate_goodput = best_goodput;
    std::vector<int64_t> candidate = best;
    for (const size_t i : chosen) {
      if (best[i] >= rows[i].cap) continue;
      candidate[i] += 1;
      const double value = goodput(rows, candidate, optimistic);
      if (value > candidate_goodput) {
        candidate_goodput = value;
        candidate_best = candidate;
      }
      candidate[i] -= 1;
    }
    bool any = false;
    for (const size_t i : chosen) {
      if (best[i] < rows[i].cap) {
        candidate[i] += 1;
        any = true;
      }
    }
    if (any) {
      const double value = goodput(rows, candidate, optimistic);
      if (value > candidate_goodput) {
        candidate_goodput = value;
        candidate_best = candidate;
      }
    }
    if (candidate_best.empty()) break;
    best = std::move(candidate_best);
    best_goodput = candidate_goodput;
  }
  return best;
}

std::vector<int64_t> BatchGoodputController::choose(std::span<const Row> rows) {
  calibrating_ = false;
  model_probe_ = false;
  const size_t n = rows.size();
  std::vector<int64_t> gammas(n);
  std::vector<size_t> chosen;  // rows this controller decides
  for (size_t i = 0; i < n; ++i) {
    const Row& row = rows[i];
    SPECRUN_DCHECK(row.cap <= gamma_limit_) << "cap " << row.cap << " above " << gamma_limit_;
    if (row.fixed >= 0) {
      gammas[i] = row.fixed;
    } else {
      gammas[i] = std::clamp<int64_t>(row.min, 0, row.cap);
      chosen.push_back(i);
    }
  }
  auto keep_choice = [&] {
    for (const size_t i : chosen) previous_[rows[i].sequence] = gammas[i];
    return gammas;
  };
  auto previous_or = [&](size_t i, int64_t fallback) {
    const auto it = previous_.find(rows[i].sequence);
    const int64_t value = it == previous_.end() ? fallback : it->second;
    return std::clamp(value, std::min(rows[i].min, rows[i].cap), rows[i].cap);
  };
  if (chosen.empty()) return gammas;
  const int64_t batch = static_cast<int64_t>(n);
  if (regime_batch_ == 0 || batch >= 2 * regime_batch_ || 2 * batch <= regime_batch_) {
    // The load changed by half or more: costs measured at the old batch size would mislead the
    // fit for as long as they last, so measure afresh, and probe often again.
    regime_batch_ = batch;
    verify_points_.clear();
    draft_points_.clear();
    verify_line_ = Line{};
    draft_line_ = Line{};
    interval_ = tuning_.probe_interval;
    next_probe_ = steps_ + interval_;
    next_calibration_ = steps_;
    probing_ = false;
  }
  // A calibration step for the chosen rows: `depth` free drafts each, within their caps.
  auto calibrate = [&](auto depth) {
    bool any = false;
    for (const size_t i : chosen) {
      gammas[i] = std::min(std::max(depth(i), rows[i].min), rows[i].cap);
      any = any || gammas[i] > 0;
    }
    calibrating_ = any;
    calibration_steps_ += any ? 1 : 0;
    // Rows held at their minima may score the plain step's T again; then the line stays flat
    // until the next attempt rather than calibrating every step.
    if (any) next_calibration_ = steps_ + interval_;
    return gammas;
  };
  if (!verify_line_.known) {
    // The first step of a regime decodes plainly (at the rows' minima): the cost of T = rows.
    // The previous choice is kept for after calibration.
    return gammas;
  }
  if (verify_line_.distinct < 2 && steps_ >= next_calibration_) {
    // The second scores gamma + 1 tokens per row with free proposals, for the line's slope.
    return calibrate([](size_t) { return kCalibrationDepth; });
  }
  if (steps_ >= next_probe_ && !probing_) {
    // One step a draft deeper for every row: measures the next position's acceptance and the
    // cost of a larger step. From plain decoding, when even optimistic acceptance would not make
    // speculation pay at the measured costs, only the cost is worth measuring, and for free.
    probing_ = true;
    last_choice_.clear();
    std::vector<int64_t> before = gammas;
    bool plain = true;
    for (const size_t i : chosen) {
      before[i] = previous_or(i, 0);
      last_choice_[rows[i].sequence] = before[i];
      plain = plain && before[i] == std::min(rows[i].min, rows[i].cap);
    }
    if (plain && best_gammas(rows, chosen, before, true) == before) {
      return calibrate([&](size_t i) { return before[i] + 1; });
    }
    for (const size_t i : chosen) gammas[i] = std::min(before[i] + 1, rows[i].cap);
    model_probe_ = true;
    return gammas;  // the probe is not remembered as the choice
  }

  std::vector<int64_t> best = best_gammas(rows, chosen, gammas, false);
  // Hysteresis against the previous choice (as far as this step's caps allow it).
  std::vector<int64_t> previous = gammas;
  for (const size_t i : chosen) previous[i] = previous_or(i, best[i]);
  if (goodput(rows, previous, false) * (1 + tuning_.hysteresis) >= goodput(rows, best, false)) {
    best = previous;
  }

  if (probing_) {
    // The first choice after a probe: did the probe teach anything?
    probing_ = false;
    bool changed = false;
    for (const size_t i : chosen) {
      const auto it = last_choice_.find(rows[i].sequence);
      if (it != last_choice_.end() && it->second != best[i]) changed = true;
    }
    interval_ =
        changed ? tuning_.probe_interval : std::min(interval_ * 2, tuning_.max_probe_interval);
    next_probe_ = steps_ + interval_;
  }
  gammas = std::move(best);
  return keep_choice();
}

void BatchGoodputController::observe(std::span<const Outcome> outcomes, double draft_ms,
                                     double verify_ms) {
  steps_ += 1;
  int64_t tokens = 0, rounds = 0, drafts = 0;
  bool steady = true;  // no drafting row read a backlog first
  for (const Outcome& outcome : outcomes) {
    SPECRUN_CHECK(outcome.accepted >= 0 && outcome.accepted <= outcome.drafted &&
                  outcome.drafted <= gamma_limit_)
        << "outcome " << outcome.accepted << " of " << outcome.drafted;
    tokens += outcome.drafted + 1;
    if (outcome.drafted == 0 || outcome.calibration) continue;
    rounds = std::max(rounds, outcome.drafted);
    drafts += outcome.drafted;
    steady = steady && outcome.catch_up <= kSteadyCatchUp;
    std::vector<double>& own = alpha_[outcome.sequence];
    if (own.empty()) own.assign(static_cast<size_t>(gamma_limit_) + 1, kNotSeen);
    // Positions 1..accepted were accepted; accepted + 1 (if drafted) was rejected.
    const int64_t reached = std::min(outcome.drafted, outcome.accepted + 1);
    for (int64_t j = 1; j <= reached; ++j) {
      const double x = j <= outcome.accepted ? 1.0 : 0.0;
      const size_t index = static_cast<size_t>(j);
      double& mine = own[index];
      mine = (1 - tuning_.ema) * (mine == kNotSeen ? pooled_alpha_[index] : mine) + tuning_.ema * x;
      double& pooled = pooled_alpha_[index];
      pooled = pooled_seen_[index] ? (1 - tuning_.ema) * pooled + tuning_.ema * x
                                   : (1 - tuning_.ema) * tuning_.prior_acceptance + tuning_.ema * x;
      pooled_seen_[index] = true;
    }
    // Positions past the one reached go unobserved for as long as gamma stays short, and only
    // probes reach them; a few unlucky probes would pin gamma down. So they drift slowly toward
    // the deepest estimate just measured.
    const double deepest = own[static_cast<size_t>(reached)];
    for (int64_t j = reached + 1; j <= gamma_limit_; ++j) {
      double& mine = own[static_cast<size_t>(j)];
      if (mine != kNotSeen) mine += kDeepDrift * tuning_.ema * (deepest - mine);
    }
  }
  update_point(verify_points_, tokens, verify_ms);
  verify_line_ = fit(verify_points_);
  if (rounds > 0 && steady) {
    const int64_t rows_per_round =
        std::max<int64_t>(1, (drafts + rounds / 2) / rounds);  // nearest whole row count
    update_point(draft_points_, rows_per_round, draft_ms / static_cast<double>(rounds));
    draft_line_ = fit(draft_points_);
  }
}

void BatchGoodputController::remove_sequence(int64_t sequence) {
  alpha_.erase(sequence);
  previous_.erase(sequence);
  last_choice_.erase(sequence);
}

}  // namespace specrun
