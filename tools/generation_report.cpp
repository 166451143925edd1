#include "tools/generation_report.h"

#include <algorithm>
#include <fstream>
#include <vector>

#include "runtime/base/check.h"

namespace specrun::tools {
namespace {

std::string format_ratio(double ratio) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2fx", ratio);
  return text;
}

void print_baseline(std::FILE* stream, const RunDescription& run) {
  if (!run.baseline) return;
  const Baseline& baseline = *run.baseline;
  const auto [low, high] = std::minmax_element(baseline.speedups.begin(), baseline.speedups.end());
  const std::string rounds = baseline.speedups.size() > 1
                                 ? " (median of " + std::to_string(baseline.speedups.size()) +
                                       " alternating rounds, range " + format_ratio(*low) + "-" +
                                       format_ratio(*high) + ")"
                                 : "";
  std::fprintf(stream,
               "specrun: the target alone on the same request: %.1f tokens/s; speedup %s%s%s\n",
               baseline.tokens_per_second, format_ratio(median(baseline.speedups)).c_str(),
               rounds.c_str(), baseline.same_output ? " (same output)" : " (different output)");
}

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

nlohmann::json stats_to_json(const RequestStats& stats, const RunDescription& run) {
  nlohmann::json histogram = nlohmann::json::object();
  for (const auto& [gamma, steps] : stats.gamma_histogram) histogram[std::to_string(gamma)] = steps;
  nlohmann::json json = {{"tokens_generated", stats.tokens_generated},
                         {"ttft_ms", stats.ttft_ms},
                         {"itl_ms_mean", stats.itl_ms_mean},
                         {"itl_ms_p50", stats.itl_ms_p50},
                         {"itl_ms_p99", stats.itl_ms_p99},
                         {"tokens_per_second", stats.tokens_per_second},
                         {"acceptance_rate", stats.acceptance_rate},
                         {"mean_accepted_length", stats.mean_accepted_length},
                         {"gamma_histogram", histogram},
                         {"draft_ms", stats.draft_ms},
                         {"target_ms", stats.target_ms},
                         {"prompt_tokens", stats.prompt_tokens},
                         {"cached_prompt_tokens", stats.cached_prompt_tokens},
                         {"finish_reason", to_string(run.reason)},
                         {"steps", stats.steps},
                         {"drafted", stats.drafted},
                         {"accepted", stats.accepted},
                         {"rejections", stats.rejections},
                         {"looked_up", stats.looked_up},
                         {"looked_up_accepted", stats.looked_up_accepted},
                         {"alternates", stats.alternates},
                         {"alternates_accepted", stats.alternates_accepted},
                         {"host_waits", stats.host_waits},
                         {"bytes_to_host", stats.bytes_to_host},
                         {"total_ms", stats.total_ms},
                         {"method", to_string(run.method)},
                         {"controller", to_string(run.controller)},
                         {"verification", to_string(run.verification)},
                         {"backend", run.backend},
                         {"threads", run.threads}};
  if (!run.cpu_kernels.empty()) json["cpu_kernels"] = run.cpu_kernels;
  if (!run.activations.empty()) json["activations"] = run.activations;
  if (run.memory) {
    const auto model = [](const ModelMemory& m) {
      return nlohmann::json{{"weight_bytes", m.weight_bytes},
                            {"weight_types", m.weight_types},
                            {"kv_bytes_per_token", m.kv_bytes_per_token},
                            {"kv_tokens", m.kv_tokens},
                            {"kv_bytes", m.kv_bytes},
                            {"workspace_bytes", m.workspace_bytes}};
    };
    json["memory"] = {
        {"device", run.memory->device},           {"target", model(run.memory->target)},
        {"draft", model(run.memory->draft)},      {"scratch_bytes", run.memory->scratch_bytes},
        {"total_bytes", run.memory->total_bytes}, {"available_bytes", run.memory->available_bytes}};
  }
  if (run.baseline && !run.baseline->speedups.empty()) {
    const std::vector<double>& speedups = run.baseline->speedups;
    json["baseline_tokens_per_second"] = run.baseline->tokens_per_second;
    json["speedup"] = median(speedups);
    json["speedup_min"] = *std::min_element(speedups.begin(), speedups.end());
    json["speedup_max"] = *std::max_element(speedups.begin(), speedups.end());
    json["speedups"] = speedups;
    json["baseline_same_output"] = run.baseline->same_output;
  }
  return json;
}

void print_stats(std::FILE* stream, const RequestStats& stats, const RunDescription& run) {
  const std::string cached =
      stats.cached_prompt_tokens > 0
          ? " (" + std::to_string(stats.cached_prompt_tokens) + " from the prefix cache)"
          : "";
  // "cpu (native kernels, bf16 activations)": what a CPU figure was measured with.
  const std::string backend =
      run.cpu_kernels.empty()
          ? run.backend
          : run.backend + " (" + run.cpu_kernels + " kernels, " + run.activations + " activations)";
  std::fprintf(stream,
               "specrun: %lld prompt tokens%s, %lld generated (finished: %s) in %.1f ms on %s with "
               "%d threads: %.1f tokens/s\n",
               static_cast<long long>(stats.prompt_tokens), cached.c_str(),
               static_cast<long long>(stats.tokens_generated), to_string(run.reason),
               stats.total_ms, backend.c_str(), run.threads, stats.tokens_per_second);
  std::fprintf(stream,
               "specrun: time to first token %.1f ms; inter-token latency mean %.2f ms, p50 "
               "%.2f ms, p99 %.2f ms\n",
               stats.ttft_ms, stats.itl_ms_mean, stats.itl_ms_p50, stats.itl_ms_p99);
  std::string histogram;
  for (const auto& [gamma, steps] : stats.gamma_histogram) {
    histogram +=
        (histogram.empty() ? "" : " ") + std::to_string(gamma) + ":" + std::to_string(steps);
  }
  if (run.memory) std::fprintf(stream, "specrun: %s\n", to_string(*run.memory).c_str());
  if (run.method == SpeculationMethod::kNone) {
    std::fprintf(stream, "specrun: plain decoding, %lld target steps, target %.1f ms\n",
                 static_cast<long long>(stats.steps), stats.target_ms);
    return;
  }
  std::fprintf(stream,
               "specrun: speculative (%s, %s controller, %s verification): acceptance %.3f, %.2f "
               "tokens per target step over %lld steps; gamma histogram (drafts:steps) %s\n",
               to_string(run.method), to_string(run.controller), to_string(run.verification),
               stats.acceptance_rate, stats.mean_accepted_length,
               static_cast<long long>(stats.steps), histogram.c_str());
  if (stats.looked_up > 0) {
    std::fprintf(stream,
                 "specrun: prompt lookup proposed %lld drafts in the draft model's place, %lld "
                 "accepted\n",
                 static_cast<long long>(stats.looked_up),
                 static_cast<long long>(stats.looked_up_accepted));
  }
  if (stats.alternates > 0) {
    std::fprintf(stream,
                 "specrun: the target scored %lld alternates beside the drafts, %lld accepted\n",
                 static_cast<long long>(stats.alternates),
                 static_cast<long long>(stats.alternates_accepted));
  }
  const double busy = stats.draft_ms + stats.target_ms;
  std::fprintf(stream, "specrun: time split: draft %.1f ms (%.0f%%), target %.1f ms (%.0f%%)\n",
               stats.draft_ms, busy > 0 ? 100.0 * stats.draft_ms / busy : 0.0, stats.target_ms,
               busy > 0 ? 100.0 * stats.target_ms / busy : 0.0);
  print_baseline(stream, run);
}

void write_stats_json(const std::filesystem::path& path, const RequestStats& stats,
                      const RunDescription& run) {
  std::ofstream stream(path, std::ios::trunc);
  stream << stats_to_json(stats, run).dump(2) << "\n";
  stream.flush();
  if (!stream) throw Error(path.string() + ": cannot write the stats");
}

}  // namespace specrun::tools
