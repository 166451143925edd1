#include "verify/step_cost_model.h"

#include <algorithm>
#include <limits>

namespace specrun {
namespace {

constexpr double kMinimumMs = 1e-6;  // keeps a fitted cost positive

}  // namespace

StepCostModel::Line StepCostModel::fit(const std::map<int64_t, Point>& points) const {
  // Least squares over the points measured within the window; one point (or one x) is flat.
  // Where two or more of them were measured more than once, only those: a point measured once
  // holds its step's one-time costs, and the steps that would measure it again may never come.
  int64_t confirmed = 0;
  for (const auto& [x, point] : points) {
    if (step_ - point.updated <= tuning_.window && point.samples >= 2) ++confirmed;
  }
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, point] : points) {
    if (step_ - point.updated > tuning_.window) continue;
    if (confirmed >= 2 && point.samples < 2) continue;
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
    line.falling = true;
    line.slope = 0;
    line.intercept = sy / n;
  }
  return line;
}

StepCostModel::Line StepCostModel::refit(std::map<int64_t, Point>& points, int64_t keep) {
  // Costs do not fall with more work, so a falling line has a wrong point, and the likeliest is
  // the stalest: a point measured once while the process was cold (the first steps of an engine
  // touch fresh memory and run many times slower) and never refreshed, because the choices it
  // led to scored other token counts. Drop such points, oldest first, but never the one just
  // measured; a line left with one point is flat, and its owner measures another.
  Line line = fit(points);
  while (line.falling && points.size() > 1) {
    auto stalest = points.end();
    for (auto p = points.begin(); p != points.end(); ++p) {
      if (p->first == keep) continue;
      if (stalest == points.end() || p->second.updated < stalest->second.updated) stalest = p;
    }
    if (stalest == points.end()) break;
    points.erase(stalest);
    line = fit(points);
  }
  return line;
}

void StepCostModel::update(std::map<int64_t, Point>& points, int64_t x, double ms) {
  const auto [it, inserted] = points.try_emplace(x, Point{ms, step_, 1});
  if (!inserted) {
    Point& point = it->second;
    // A point not refreshed within the window starts over rather than blending a stale regime;
    // a first sample, one-time costs included, gives way to a lower second one.
    const bool restart = step_ - point.updated > tuning_.window;
    if (restart || (point.samples == 1 && ms < point.ms)) {
      point.ms = ms;
      point.samples = restart ? 1 : 2;
    } else {
      // A step the OS preempted can take ten times its cost; one such sample would otherwise
      // move the average (and the line's slope, which decides everything) for dozens of steps.
      const double sample = std::min(ms, tuning_.outlier * point.ms);
      point.ms = (1 - tuning_.ema) * point.ms + tuning_.ema * sample;
      point.samples += 1;
    }
    point.updated = step_;
  }
  // Drop what aged out, so the maps stay small.
  for (auto p = points.begin(); p != points.end();) {
    p = step_ - p->second.updated > tuning_.window ? points.erase(p) : std::next(p);
  }
}

void StepCostModel::observe(int64_t step, int64_t tokens, double verify_ms, int64_t rounds,
                            int64_t drafts, bool steady, double draft_ms) {
  step_ = step;
  update(verify_points_, tokens, verify_ms);
  verify_line_ = refit(verify_points_, tokens);
  if (rounds > 0 && steady) {
    const int64_t rows_per_round =
        std::max<int64_t>(1, (drafts + rounds / 2) / rounds);  // nearest whole row count
    update(draft_points_, rows_per_round, draft_ms / static_cast<double>(rounds));
    draft_line_ = refit(draft_points_, rows_per_round);
  }
}

void StepCostModel::reset() {
  verify_points_.clear();
  draft_points_.clear();
  verify_line_ = Line{};
  draft_line_ = Line{};
}

double StepCostModel::verify_ms(double tokens) const {
  if (!verify_line_.known) return std::numeric_limits<double>::quiet_NaN();
  return std::max(kMinimumMs, verify_line_.intercept + verify_line_.slope * tokens);
}

double StepCostModel::draft_round_ms(int64_t rows) const {
  if (!draft_line_.known) return std::numeric_limits<double>::quiet_NaN();
  return std::max(kMinimumMs,
                  draft_line_.intercept + draft_line_.slope * static_cast<double>(rows));
}

double StepCostModel::step_ms(std::span<const int64_t> gammas, double scored_per_draft) const {
  int64_t rounds = 0, drafts = 0;
  for (const int64_t gamma : gammas) {
    rounds = std::max(rounds, gamma);
    drafts += gamma;
  }
  const double tokens =
      static_cast<double>(gammas.size()) + scored_per_draft * static_cast<double>(drafts);
  double ms = verify_ms(tokens);
  if (rounds > 0 && draft_line_.known) {
    // Round r feeds the rows still drafting at depth r: sum_r (c + e * rows_r) = c R + e D.
    ms += std::max(kMinimumMs, draft_line_.intercept * static_cast<double>(rounds) +
                                   draft_line_.slope * static_cast<double>(drafts));
  }
  return ms;
}

}  // namespace specrun
