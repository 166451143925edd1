#include "runtime/engine/stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specrun {

void record_step(RequestStats& stats, int64_t drafted, int64_t accepted, double draft_ms,
                 double target_ms) {
  stats.steps += 1;
  stats.drafted += drafted;
  stats.accepted += accepted;
  stats.rejections += accepted < drafted ? 1 : 0;
  stats.gamma_histogram[drafted] += 1;
  stats.draft_ms += draft_ms;
  stats.target_ms += target_ms;
  stats.acceptance_rate =
      stats.drafted ? static_cast<double>(stats.accepted) / static_cast<double>(stats.drafted)
                    : 0.0;
  // Each step commits its accepted drafts and one token more (the recovered or bonus token).
  stats.mean_accepted_length =
      static_cast<double>(stats.accepted + stats.steps) / static_cast<double>(stats.steps);
}

void record_timeline(RequestStats& stats, std::span<const double> token_ms, double total_ms) {
  stats.tokens_generated = static_cast<int64_t>(token_ms.size());
  stats.total_ms = total_ms;
  stats.ttft_ms = token_ms.empty() ? 0.0 : token_ms.front();
  stats.tokens_per_second =
      total_ms > 0 ? 1e3 * static_cast<double>(token_ms.size()) / total_ms : 0.0;
  stats.itl_ms_mean = stats.itl_ms_p50 = stats.itl_ms_p99 = 0.0;
  if (token_ms.size() < 2) return;
  std::vector<double> gaps;
  gaps.reserve(token_ms.size() - 1);
  for (size_t i = 1; i < token_ms.size(); ++i) gaps.push_back(token_ms[i] - token_ms[i - 1]);
  double total = 0;
  for (const double gap : gaps) total += gap;
  stats.itl_ms_mean = total / static_cast<double>(gaps.size());
  std::sort(gaps.begin(), gaps.end());
  const auto nearest_rank = [&](double q) {
    const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(gaps.size())));
    return gaps[std::min(gaps.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  stats.itl_ms_p50 = nearest_rank(0.50);
  stats.itl_ms_p99 = nearest_rank(0.99);
}

}  // namespace specrun
