#include "runtime/engine/stats.h"

#include <algorithm>
#include <cmath>

namespace specrun {

void SequenceStats::record_step(int64_t drafted_now, int64_t accepted_now, double step_draft_ms,
                                double step_target_ms) {
  steps += 1;
  drafted += drafted_now;
  accepted += accepted_now;
  rejections += accepted_now < drafted_now ? 1 : 0;
  committed_in_steps += accepted_now + 1;
  gamma_histogram[drafted_now] += 1;
  draft_ms += step_draft_ms;
  target_ms += step_target_ms;
}

SequenceStats::Latency SequenceStats::inter_token_latency() const {
  Latency latency;
  if (token_ms.size() < 2) return latency;
  std::vector<double> gaps;
  for (size_t i = 1; i < token_ms.size(); ++i) gaps.push_back(token_ms[i] - token_ms[i - 1]);
  double total = 0;
  for (const double gap : gaps) total += gap;
  latency.mean = total / static_cast<double>(gaps.size());
  std::sort(gaps.begin(), gaps.end());
  auto quantile = [&](double q) {
    // Nearest rank.
    const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(gaps.size())));
    return gaps[std::min(gaps.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  latency.p50 = quantile(0.50);
  latency.p99 = quantile(0.99);
  return latency;
}

}  // namespace specrun
