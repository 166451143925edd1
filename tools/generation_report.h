// The closing report of a generation: a few lines on stderr and, on request, the same figures as
// JSON (the keys the issue tracker and users' dashboards rely on).
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specrun/specrun.hpp"

namespace specrun::tools {

// The same request run again on the target alone (`specrun --compare`).
struct Baseline {
  double tokens_per_second = 0.0;  // the target alone (median of its runs), prefill included
  bool same_output = false;        // whether every run produced the speculative run's tokens
  std::vector<double> speedups;    // speculative / target-alone tokens per second, per round
};

struct RunDescription {
  std::string backend;      // "cpu"
  int threads = 0;          // CPU threads
  std::string cpu_kernels;  // EngineInfo's: the CPU's matmul kernels ("" on a GPU)
  std::string activations;  // EngineInfo's: what activations meet the weights as ("" on a GPU)
  SpeculationMethod method = SpeculationMethod::kNone;     // who proposed
  GammaControl controller = GammaControl::kGoodput;        // how gamma adapted
  Verification verification = Verification::kSharedNoise;  // how sampled drafts were verified
  FinishReason reason = FinishReason::kMaxTokens;          // why generation ended
  std::optional<Baseline> baseline;                        // the target-alone rerun, if any
  std::optional<MemoryPlan> memory;                        // the engine's memory plan
};

// The median of `values` (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> values);

// Keys: tokens_generated, ttft_ms, itl_ms_mean, itl_ms_p50, itl_ms_p99, tokens_per_second,
// acceptance_rate, mean_accepted_length, gamma_histogram ({"gamma": steps}), draft_ms, target_ms,
// and for context prompt_tokens, cached_prompt_tokens, finish_reason, steps, drafted, accepted,
// rejections, looked_up, looked_up_accepted, alternates, alternates_accepted, host_waits,
// bytes_to_host (what the steps waited for and copied back from the device), method, controller,
// verification, backend, threads, on the CPU cpu_kernels and activations; with a memory plan
// "memory" (device, scratch_bytes, total_bytes, available_bytes, and per model weight_bytes,
// kv_bytes_per_token, kv_tokens, kv_bytes, workspace_bytes); with a baseline also
// baseline_tokens_per_second, speedup (the median of the rounds), speedup_min, speedup_max,
// speedups (per round) and baseline_same_output.
nlohmann::json stats_to_json(const RequestStats& stats, const RunDescription& run);

// Human-readable lines, each prefixed "specrun: ".
void print_stats(std::FILE* stream, const RequestStats& stats, const RunDescription& run);

// Writes stats_to_json to `path`; throws Error naming the path when it cannot.
void write_stats_json(const std::filesystem::path& path, const RequestStats& stats,
                      const RunDescription& run);

}  // namespace specrun::tools
