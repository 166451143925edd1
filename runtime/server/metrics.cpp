#include "runtime/server/metrics.h"

#include <algorithm>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace specrun::server {
namespace {

// Latency buckets from 1 ms to a minute, about three per decade.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0};

prometheus::Gauge* gauge(prometheus::Registry& registry, const std::string& name,
                         const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter* counter(prometheus::Registry& registry, const std::string& name,
                             const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  requests_ = &prometheus::BuildCounter()
                   .Name("specrun_requests_total")
                   .Help("Requests by outcome: stop, length, cancelled, failed, rejected, shutdown")
                   .Register(r);
  steps_by_gamma_ = &prometheus::BuildCounter()
                         .Name("specrun_speculative_steps_total")
                         .Help("Engine steps of finished requests by the drafts they verified")
                         .Register(r);
  prompt_tokens_ = counter(r, "specrun_prompt_tokens_total", "Prompt tokens of requests that ran");
  cached_prompt_tokens_ =
      counter(r, "specrun_prompt_tokens_cached_total", "Prompt tokens taken from the prefix cache");
  generated_tokens_ = counter(r, "specrun_generation_tokens_total", "Tokens generated");
  ttft_ = &prometheus::BuildHistogram()
               .Name("specrun_time_to_first_token_seconds")
               .Help("From a request's arrival to its first text")
               .Register(r)
               .Add({}, kLatencyBuckets);
  inter_token_ = &prometheus::BuildHistogram()
                      .Name("specrun_inter_token_latency_seconds")
                      .Help("Between consecutive texts of a request")
                      .Register(r)
                      .Add({}, kLatencyBuckets);
  waiting_ = gauge(r, "specrun_requests_waiting", "Requests queued for room in the batch");
  running_ = gauge(r, "specrun_requests_running", "Requests in the batch");
  kv_tokens_used_ = gauge(r, "specrun_kv_cache_tokens_used",
                          "Target KV-cache positions held by running requests");
  kv_tokens_capacity_ = gauge(r, "specrun_kv_cache_tokens_capacity", "Target KV-cache positions");
  kv_tokens_cached_ = gauge(r, "specrun_kv_cache_tokens_cached",
                            "Target KV-cache positions in reusable prefix blocks");
  acceptance_rate_ = gauge(r, "specrun_acceptance_rate", "Drafts accepted over drafts verified");
  accepted_length_ =
      gauge(r, "specrun_mean_accepted_length", "Tokens committed per sequence per engine step");
  drafts_per_step_ = gauge(r, "specrun_gamma_mean",
                           "Drafts verified per sequence per engine step (the gamma chosen)");
  prefix_hit_rate_ = gauge(r, "specrun_prefix_cache_hit_rate",
                           "Prompt tokens taken from the prefix cache over prompt tokens");
  draft_seconds_ = counter(r, "specrun_draft_seconds_total", "Time spent drafting");
  target_seconds_ = counter(r, "specrun_target_seconds_total",
                            "Time spent in target passes (prefill and verification)");
  host_waits_ = counter(r, "specrun_device_waits_total",
                        "Times the engine's steps waited for the device (once per step for the "
                        "verdict; once more where the host reads a draft model's drafts, or once "
                        "per draft position where prompt lookup joins the draft)");
  bytes_to_host_ = counter(r, "specrun_device_to_host_bytes_total",
                           "Bytes the engine's steps copied back from the device");
  drafted_at_ = &prometheus::BuildCounter()
                     .Name("specrun_drafts_per_position_total")
                     .Help("Drafts verified, by their position among their step's drafts (from 1)")
                     .Register(r);
  accepted_at_ = &prometheus::BuildCounter()
                      .Name("specrun_accepted_drafts_per_position_total")
                      .Help("Drafts accepted, by their position among their step's drafts (from 1)")
                      .Register(r);
}

Metrics::~Metrics() = default;

void Metrics::request_finished(const std::string& outcome) {
  requests_->Add({{"outcome", outcome}}).Increment();
}

void Metrics::request_stats(const RequestStats& stats) {
  prompt_tokens_->Increment(static_cast<double>(stats.prompt_tokens));
  cached_prompt_tokens_->Increment(static_cast<double>(stats.cached_prompt_tokens));
  generated_tokens_->Increment(static_cast<double>(stats.tokens_generated));
  for (const auto& [gamma, steps] : stats.gamma_histogram) {
    steps_by_gamma_->Add({{"drafts", std::to_string(gamma)}}).Increment(static_cast<double>(steps));
  }
}

void Metrics::time_to_first_token(double seconds) {
  ttft_->Observe(seconds);
}

void Metrics::inter_token_latency(double seconds) {
  inter_token_->Observe(seconds);
}

std::string Metrics::scrape(const EngineStats& engine) {
  waiting_->Set(static_cast<double>(engine.waiting));
  running_->Set(static_cast<double>(engine.running));
  kv_tokens_capacity_->Set(static_cast<double>(engine.kv_tokens_capacity));
  kv_tokens_used_->Set(static_cast<double>(engine.kv_tokens_capacity - engine.kv_tokens_free));
  kv_tokens_cached_->Set(static_cast<double>(engine.kv_tokens_cached));
  acceptance_rate_->Set(engine.acceptance_rate);
  const double sequence_steps = engine.mean_batch * static_cast<double>(engine.steps);
  accepted_length_->Set(
      sequence_steps > 0 ? static_cast<double>(engine.tokens_generated) / sequence_steps : 0.0);
  drafts_per_step_->Set(sequence_steps > 0 ? static_cast<double>(engine.drafted) / sequence_steps
                                           : 0.0);
  prefix_hit_rate_->Set(engine.prefix_cache_hit_rate);
  {
    // The engine reports running totals; the counters take what is new since the last scrape.
    std::lock_guard lock(mutex_);
    draft_seconds_->Increment(std::max(0.0, engine.draft_ms - draft_ms_seen_) / 1e3);
    target_seconds_->Increment(std::max(0.0, engine.target_ms - target_ms_seen_) / 1e3);
    draft_ms_seen_ = std::max(draft_ms_seen_, engine.draft_ms);
    target_ms_seen_ = std::max(target_ms_seen_, engine.target_ms);
    host_waits_->Increment(
        static_cast<double>(std::max<int64_t>(0, engine.host_waits - host_waits_seen_)));
    bytes_to_host_->Increment(static_cast<double>(engine.bytes_to_host > bytes_to_host_seen_
                                                      ? engine.bytes_to_host - bytes_to_host_seen_
                                                      : 0));
    host_waits_seen_ = std::max(host_waits_seen_, engine.host_waits);
    bytes_to_host_seen_ = std::max(bytes_to_host_seen_, engine.bytes_to_host);
    const auto by_position = [](prometheus::Family<prometheus::Counter>& family,
                                const std::vector<int64_t>& totals, std::vector<int64_t>& seen) {
      if (seen.size() < totals.size()) seen.resize(totals.size(), 0);
      for (size_t i = 0; i < totals.size(); ++i) {
        family.Add({{"position", std::to_string(i + 1)}})
            .Increment(static_cast<double>(std::max<int64_t>(0, totals[i] - seen[i])));
        seen[i] = std::max(seen[i], totals[i]);
      }
    };
    by_position(*drafted_at_, engine.drafted_at, drafted_at_seen_);
    by_position(*accepted_at_, engine.accepted_at, accepted_at_seen_);
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace specrun::server
