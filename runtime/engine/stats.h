// The engine measures each request straight into the public RequestStats (specrun/stats.hpp): the
// same structure reaches the C++ API, the server, the benchmarks and, converted once, the C ABI.
#pragma once

#include <cstdint>
#include <span>

#include "specrun/stats.hpp"

namespace specrun {

// Adds one step: `drafted` drafts verified, `accepted` of them taken, and its two costs; the
// acceptance rate and the mean accepted length follow.
void record_step(RequestStats& stats, int64_t drafted, int64_t accepted, double draft_ms,
                 double target_ms);

// The request's timeline from each token's arrival (`token_ms`, from submit, in order) and its
// total time: tokens_generated, ttft, the inter-token latency over consecutive arrivals (mean,
// and p50 and p99 by nearest rank; zeros below two tokens), tokens per second, total_ms.
void record_timeline(RequestStats& stats, std::span<const double> token_ms, double total_ms);

}  // namespace specrun
