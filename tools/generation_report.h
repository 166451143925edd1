// The closing report of a generation: a few lines on stderr and, on request, the same figures as
// JSON (the keys the issue tracker and users' dashboards rely on).
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/engine/speculative.h"

namespace specrun::tools {

struct RunDescription {
  std::string backend;                                   // "cpu"
  int threads = 0;                                       // CPU threads
  SpeculativeMethod method = SpeculativeMethod::kNone;   // who proposed
  ControllerKind controller = ControllerKind::kGoodput;  // how gamma adapted
  int64_t prompt_tokens = 0;                             // tokens prefilled
  StopReason stop_reason = StopReason::kMaxTokens;       // why generation ended
};

// Keys: tokens_generated, ttft_ms, itl_ms_mean, itl_ms_p50, itl_ms_p99, tokens_per_second,
// acceptance_rate, mean_accepted_length, gamma_histogram ({"gamma": steps}), draft_ms, target_ms,
// and for context prompt_tokens, stop_reason, steps, drafted, accepted, method, controller,
// backend, threads.
nlohmann::json stats_to_json(const SpeculativeStats& stats, const RunDescription& run);

// Human-readable lines, each prefixed "specrun: ".
void print_stats(std::FILE* stream, const SpeculativeStats& stats, const RunDescription& run);

// Writes stats_to_json to `path`; throws Error naming the path when it cannot.
void write_stats_json(const std::filesystem::path& path, const SpeculativeStats& stats,
                      const RunDescription& run);

}  // namespace specrun::tools
