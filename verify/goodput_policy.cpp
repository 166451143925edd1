#include "verify/goodput_policy.h"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>

#include "runtime/base/check.h"

namespace specrun {
namespace {

// Evidence at a position a step did not reach ages at this fraction of the rate at which a new
// observation ages the evidence it joins (1 - acceptance_memory).
constexpr double kStaleAging = 0.25;

}  // namespace

GoodputPolicy::GoodputPolicy(int64_t gamma_limit, const Tuning& tuning)
    : gamma_limit_(gamma_limit),
      tuning_(tuning),
      costs_(StepCostModel::Tuning{tuning.ema, tuning.cost_window}),
      interval_(tuning.probe_interval),
      next_probe_(tuning.probe_interval),
      pooled_(static_cast<size_t>(gamma_limit) + 1) {
  SPECRUN_CHECK(gamma_limit >= 0) << "gamma limit " << gamma_limit;
  SPECRUN_CHECK(tuning.probe_interval > 0 && tuning.max_probe_interval >= tuning.probe_interval);
  SPECRUN_CHECK(tuning.acceptance_memory > 0.0 && tuning.acceptance_memory < 1.0 &&
                tuning.prior_weight > 0.0 && tuning.depth_prior_weight > 0.0 &&
                tuning.optimism >= 0.0);
}

std::vector<GoodputPolicy::Estimate> GoodputPolicy::chain(
    std::span<const Evidence> evidence, double first_prior,
    const std::vector<Estimate>* pooled) const {
  // Each estimate is the evidence's count of acceptances with a prior counted as drafts of its
  // own. A deeper position's prior is the position before it (for a sequence, scaled by how the
  // pooled figure changes from that position to this one): a draft that follows accepted drafts
  // is accepted about as often, and more often where acceptance comes in runs. At a fixed prior,
  // a deep position measured a few times (a probe, a start at the configured gamma) kept its few
  // rejections for as long as gamma stayed short, since only probes reach past it: at T 0.7 the
  // demo's second position was estimated at 0.15 where fixed gamma 2 measured about 0.7, and
  // gamma held at 1.
  std::vector<Estimate> result(evidence.size(), Estimate{first_prior, 0.0});
  for (size_t j = 1; j < evidence.size(); ++j) {
    double prior = first_prior, weight = tuning_.prior_weight;
    if (j > 1) {
      prior = result[j - 1].mean;
      if (pooled != nullptr && (*pooled)[j - 1].mean > 0.0) {
        prior = std::min(1.0, prior * (*pooled)[j].mean / (*pooled)[j - 1].mean);
      }
      weight = tuning_.depth_prior_weight;
    }
    const double counted = weight + evidence[j].drafted;
    const double mean = (weight * prior + evidence[j].accepted) / counted;
    result[j] = {mean, std::sqrt(mean * (1.0 - mean) / counted)};
  }
  return result;
}

std::vector<GoodputPolicy::Estimate> GoodputPolicy::estimates(
    int64_t sequence, const std::vector<Estimate>& pooled) const {
  // Position 1's prior is the pooled figure, unless that holds nothing but the sequence's own
  // evidence (one stream): counted twice, its first few rejections would take alpha to near zero
  // and drafting with it, at acceptances where drafting pays.
  const auto it = own_.find(sequence);
  if (it == own_.end()) return pooled;
  if (pooled_sole_ == sequence) return chain(it->second, tuning_.prior_acceptance, nullptr);
  return chain(it->second, pooled[1].mean, &pooled);
}

void GoodputPolicy::believe(std::span<const GammaRow> rows) {
  const std::vector<Estimate> pooled = chain(pooled_, tuning_.prior_acceptance, nullptr);
  beliefs_.clear();
  for (const GammaRow& row : rows) beliefs_.push_back(estimates(row.sequence, pooled));
}

double GoodputPolicy::alpha(size_t row, int64_t position, int64_t rows) const {
  const Estimate& e = beliefs_[row][static_cast<size_t>(position)];
  // Only the first position is chosen optimistically: it alone decides between drafting and plain
  // decoding, which observes nothing. Deeper positions are observed while drafting goes on, and
  // probes reach past the chosen depth; optimism there would draft deep on thin evidence. The
  // step's expected tokens sum the rows' estimates, whose independent errors partly cancel (the
  // sum's standard error is sqrt(rows) times a row's), so each row's share is 1 / sqrt(rows).
  if (position != 1) return e.mean;
  return std::min(1.0, e.mean + tuning_.optimism * e.error / std::sqrt(static_cast<double>(rows)));
}

double GoodputPolicy::continuation(int64_t position) const {
  const Evidence& evidence = pooled_[static_cast<size_t>(position)];
  return (tuning_.prior_weight + evidence.continued) / (tuning_.prior_weight + evidence.accepted);
}

double GoodputPolicy::acceptance(int64_t sequence, int64_t position) const {
  SPECRUN_CHECK(position >= 1 && position <= gamma_limit_) << "position " << position;
  const std::vector<Estimate> pooled = chain(pooled_, tuning_.prior_acceptance, nullptr);
  return estimates(sequence, pooled)[static_cast<size_t>(position)].mean;
}

double GoodputPolicy::goodput(std::span<const GammaRow> rows, std::span<const int64_t> gammas,
                              bool optimistic) const {
  double tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    // A step reaches position j when every draft before it was accepted as itself; there a
    // token is accepted (the draft or an alternate) with alpha_j.
    double expected = 1.0, reach = 1.0;
    for (int64_t j = 1; j <= gammas[i]; ++j) {
      double a = alpha(i, j, static_cast<int64_t>(rows.size()));
      if (optimistic) a = std::max(a, tuning_.optimistic_acceptance);
      expected += reach * a;
      reach *= a * continuation(j);
    }
    tokens += expected;
  }
  // Each draft brings its alternates to the verification, as many as drafts have lately.
  const double alternates = drafts_scored_ > 0.0 ? alternates_scored_ / drafts_scored_ : 0.0;
  return tokens / costs_.step_ms(gammas, 1.0 + alternates);
}

bool GoodputPolicy::ahead_pays(std::span<const int64_t> gammas, size_t i) const {
  const int64_t gamma = gammas[i];
  if (gamma == 0 || !costs_.draft_known() || !costs_.verify_known()) return false;
  double kept = 1.0;
  for (int64_t j = 1; j <= gamma + 1; ++j) {
    const int64_t position = std::min(j, gamma_limit_);
    kept *= beliefs_[i][static_cast<size_t>(position)].mean * continuation(position);
  }
  int64_t tokens = 0, drafting = 0;
  for (const int64_t g : gammas) {
    tokens += g + 1;
    drafting += g > 0 ? 1 : 0;
  }
  const double round_ms = costs_.draft_round_ms(drafting);
  const double unhidden =
      std::max(0.0, static_cast<double>(gamma + 1) * round_ms - costs_.verify_ms(tokens));
  return kept * static_cast<double>(gamma) * round_ms > unhidden;
}

std::vector<int64_t> GoodputPolicy::best_gammas(std::span<const GammaRow> rows,
                                                std::vector<int64_t> start, bool optimistic) const {
  // Greedy: add the draft (one row's, or one more for every row at once) that raises expected
  // tokens per millisecond the most, until none does.
  std::vector<int64_t> best = std::move(start);
  double best_goodput = goodput(rows, best, optimistic);
  for (;;) {
    std::vector<int64_t> candidate_best;
    double candidate_goodput = best_goodput;
    std::vector<int64_t> candidate = best;
    for (size_t i = 0; i < rows.size(); ++i) {
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
    for (size_t i = 0; i < rows.size(); ++i) {
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

std::vector<int64_t> GoodputPolicy::choose(std::span<const GammaRow> rows) {
  calibrating_ = false;
  probing_model_ = false;
  remember_ = false;
  const size_t n = rows.size();
  std::vector<int64_t> gammas(n);
  for (size_t i = 0; i < n; ++i) {
    SPECRUN_DCHECK(rows[i].cap <= gamma_limit_)
        << "cap " << rows[i].cap << " above " << gamma_limit_;
    gammas[i] = std::clamp<int64_t>(rows[i].min, 0, rows[i].cap);
  }
  auto previous_or = [&](size_t i, int64_t fallback) {
    const auto it = previous_.find(rows[i].sequence);
    const int64_t value = it == previous_.end() ? fallback : it->second;
    return std::clamp(value, std::min(rows[i].min, rows[i].cap), rows[i].cap);
  };
  if (n == 0) return gammas;
  const int64_t batch = static_cast<int64_t>(n);
  if (regime_batch_ == 0 || batch >= 2 * regime_batch_ || 2 * batch <= regime_batch_) {
    // The load changed by half or more: costs measured at the old batch size would mislead the
    // fit for as long as they last, so measure afresh, and probe often again.
    regime_batch_ = batch;
    costs_.reset();
    interval_ = tuning_.probe_interval;
    next_probe_ = steps_ + interval_;
    next_calibration_ = steps_;
    regime_calibrations_ = 0;
    regime_plain_steps_ = 0;
    probing_ = false;
  }
  // A calibration step: `depth` free drafts per row, within its limits.
  auto calibrate = [&](auto depth) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      gammas[i] = std::min(std::max(depth(i), rows[i].min), rows[i].cap);
      any = any || gammas[i] > 0;
    }
    calibrating_ = any;
    calibration_steps_ += any ? 1 : 0;
    // Rows held at their minima may score the plain step's T again; then the line stays flat
    // until the next attempt rather than calibrating every step. A regime's first calibration
    // pays the larger step's one-time costs, so the next step calibrates again (the cost model
    // keeps the lower sample).
    if (any) {
      regime_calibrations_ += 1;
      next_calibration_ = steps_ + (regime_calibrations_ == 1 ? 0 : interval_);
    }
    return gammas;
  };
  if (!costs_.verify_known() || regime_plain_steps_ < 2) {
    // The first two steps of a regime decode plainly (at the rows' minima): the cost of
    // T = rows, measured twice. With the calibration's point, also measured twice, the line has
    // two points that keep the first (cold) step at any other T out of it (see
    // StepCostModel::fit) while they stay within its window, whatever T the policy settles on. The
    // previous choice is kept for after calibration.
    regime_plain_steps_ += 1;
    return gammas;
  }
  if ((costs_.verify_points() < 2 || regime_calibrations_ == 1) && steps_ >= next_calibration_) {
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
    for (size_t i = 0; i < n; ++i) {
      before[i] = previous_or(i, 0);
      last_choice_[rows[i].sequence] = before[i];
      plain = plain && before[i] == std::min(rows[i].min, rows[i].cap);
    }
    if (plain && best_gammas(rows, before, true) == before) {
      return calibrate([&](size_t i) { return before[i] + 1; });
    }
    for (size_t i = 0; i < n; ++i) gammas[i] = std::min(before[i] + 1, rows[i].cap);
    probing_model_ = true;
    return gammas;  // the probe is not remembered as the choice
  }

  std::vector<int64_t> best = best_gammas(rows, gammas, false);
  // Hysteresis against the previous choice (as far as this step's caps allow it).
  std::vector<int64_t> previous = gammas;
  for (size_t i = 0; i < n; ++i) previous[i] = previous_or(i, best[i]);
  if (goodput(rows, previous, false) * (1 + tuning_.hysteresis) >= goodput(rows, best, false)) {
    best = previous;
  }

  if (probing_) {
    // The first choice after a probe: did the probe teach anything?
    probing_ = false;
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      const auto it = last_choice_.find(rows[i].sequence);
      if (it != last_choice_.end() && it->second != best[i]) changed = true;
    }
    interval_ =
        changed ? tuning_.probe_interval : std::min(interval_ * 2, tuning_.max_probe_interval);
    next_probe_ = steps_ + interval_;
  }
  remember_ = true;
  return best;
}

void GoodputPolicy::plan(std::span<const GammaRow> rows, std::span<DraftPlan> plans) {
  believe(rows);
  std::vector<int64_t> gammas = choose(rows);
  planned_.clear();
  // An alternate is worth a token scored: the verify line's slope, in the tokens a millisecond
  // of this step commits.
  float floor = 0.0f;
  if (costs_.verify_known() && !calibrating_) {
    const double rate = goodput(rows, gammas, false);
    if (std::isfinite(rate)) floor = static_cast<float>(costs_.verify_ms_per_token() * rate);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const GammaRow& row = rows[i];
    planned_.insert(row.sequence);
    // A sequence that never drafted starts where its configured gamma says.
    if (!calibrating_ && gammas[i] > 0 && row.first > 0 && own_.count(row.sequence) == 0) {
      gammas[i] = std::clamp(row.first, std::min(row.min, row.cap), row.cap);
    }
    plans[i] = {gammas[i], calibrating_ && gammas[i] > 0,
                probing_model_ ? kProbeCatchUp : int64_t{0}};
    plans[i].draft_ahead = row.ahead_hidden && !plans[i].filler && ahead_pays(gammas, i);
    plans[i].alternate_floor = floor;
    if (remember_) previous_[row.sequence] = gammas[i];
  }
  if (spdlog::should_log(spdlog::level::debug) && !rows.empty()) {
    // What the choice rests on, for tuning (--log-level debug): the first row's estimates.
    std::string alphas;
    for (int64_t j = 1; j <= std::min<int64_t>(gamma_limit_, 4); ++j) {
      alphas +=
          fmt::format("{}{:.2f}", j == 1 ? "" : " ", beliefs_[0][static_cast<size_t>(j)].mean);
    }
    spdlog::debug(
        "goodput step {}: gamma {}{} for sequence {} (alpha by position {}); verify {:.2f} + "
        "{:.2f} ms a token, draft round {:.2f} ms",
        steps_, gammas[0],
        calibrating_     ? " (calibration)"
        : probing_model_ ? " (probe)"
                         : "",
        rows[0].sequence, alphas, costs_.verify_ms(0), costs_.verify_ms(1) - costs_.verify_ms(0),
        costs_.draft_round_ms(1));
  }
}

void GoodputPolicy::observe(std::span<const DraftOutcome> step, double draft_ms, double verify_ms) {
  steps_ += 1;
  // The draft's batched rounds: those proposing the drafts verified (less those kept from drafting
  // ahead), then those drafting ahead; the draft time covers both.
  int64_t tokens = 0, proposing_rounds = 0, ahead_rounds = 0, drafts = 0;
  bool steady = true;           // no drafting row read a backlog first
  int64_t deepest_reached = 0;  // by this policy's rows
  const double kept = 1.0 - kStaleAging * (1.0 - tuning_.acceptance_memory);
  const auto age = [kept](Evidence& evidence) {
    evidence.accepted *= kept;
    evidence.drafted *= kept;
    evidence.continued *= kept;
  };
  for (const DraftOutcome& outcome : step) {
    SPECRUN_CHECK(outcome.accepted >= 0 && outcome.accepted <= outcome.drafted &&
                  outcome.drafted <= gamma_limit_ && outcome.kept >= 0 &&
                  outcome.kept <= outcome.drafted && outcome.ahead >= 0)
        << "outcome " << outcome.accepted << " of " << outcome.drafted << ", " << outcome.kept
        << " kept, " << outcome.ahead << " ahead";
    tokens += outcome.drafted + 1 + outcome.alternates;
    if (outcome.drafted == 0 || outcome.filler) continue;
    alternates_scored_ =
        tuning_.acceptance_memory * alternates_scored_ + static_cast<double>(outcome.alternates);
    drafts_scored_ =
        tuning_.acceptance_memory * drafts_scored_ + static_cast<double>(outcome.drafted);
    proposing_rounds = std::max(proposing_rounds, outcome.drafted - outcome.kept);
    ahead_rounds = std::max(ahead_rounds, outcome.ahead);
    drafts += outcome.drafted - outcome.kept + outcome.ahead;
    steady = steady && outcome.catch_up <= kSteadyCatchUp;
    // Another policy's rows are load on the step's costs; their acceptance is theirs.
    if (planned_.count(outcome.sequence) == 0) continue;
    pooled_sole_ = pooled_sole_ == kNoSequence || pooled_sole_ == outcome.sequence
                       ? outcome.sequence
                       : kSeveralSequences;
    std::vector<Evidence>& own = own_[outcome.sequence];
    if (own.empty()) own.resize(static_cast<size_t>(gamma_limit_) + 1);
    // Positions 1..accepted were accepted; accepted + 1 (if drafted) was rejected, unless the
    // last accepted token was an alternate: the drafts past it followed the one it replaced.
    const double memory = tuning_.acceptance_memory;
    const int64_t reached = outcome.alternate_taken
                                ? outcome.accepted
                                : std::min(outcome.drafted, outcome.accepted + 1);
    for (int64_t j = 1; j <= reached; ++j) {
      const double x = j <= outcome.accepted ? 1.0 : 0.0;
      const double itself =
          j < outcome.accepted || (j == outcome.accepted && !outcome.alternate_taken) ? 1.0 : 0.0;
      for (Evidence* evidence : {&own[static_cast<size_t>(j)], &pooled_[static_cast<size_t>(j)]}) {
        evidence->accepted = memory * evidence->accepted + x;
        evidence->drafted = memory * evidence->drafted + 1.0;
        evidence->continued = memory * evidence->continued + itself;
      }
    }
    // Positions past the one reached go unobserved for as long as gamma stays short, and only
    // probes reach them: their evidence ages, so that their estimates return toward the
    // shallower positions' rather than keep a few unlucky probes' rejections.
    deepest_reached = std::max(deepest_reached, reached);
    for (int64_t j = reached + 1; j <= gamma_limit_; ++j) age(own[static_cast<size_t>(j)]);
  }
  if (deepest_reached > 0) {
    for (int64_t j = deepest_reached + 1; j <= gamma_limit_; ++j) {
      age(pooled_[static_cast<size_t>(j)]);
    }
  }
  spdlog::debug("goodput step {}: scored {} tokens in {:.2f} ms, drafted in {:.2f} ms", steps_,
                tokens, verify_ms, draft_ms);
  costs_.observe(steps_, tokens, verify_ms, proposing_rounds + ahead_rounds, drafts, steady,
                 draft_ms);
}

void GoodputPolicy::forget(int64_t sequence) {
  own_.erase(sequence);
  previous_.erase(sequence);
  last_choice_.erase(sequence);
}

}  // namespace specrun
