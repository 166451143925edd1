// The server's figures in Prometheus' text format (GET /metrics), through prometheus-cpp: requests
// by outcome, tokens, time to first token and inter-token latency histograms, and the engine's
// own figures (queue, batch, KV cache, speculation, prefix cache) read at each scrape.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "specrun/specrun.hpp"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace specrun::server {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // A request that ended: `outcome` is "stop", "length", "cancelled", "failed", "rejected" (4xx
  // before it ran) or "shutdown".
  void request_finished(const std::string& outcome);
  // A request that ran: its prompt and generated tokens and its steps' gamma histogram.
  void request_stats(const RequestStats& stats);
  // Latencies as the client sees them, in seconds: to the first text, and between texts.
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);

  // Every metric in the text exposition format, the engine's read from `engine` now.
  std::string scrape(const EngineStats& engine);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* steps_by_gamma_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* cached_prompt_tokens_;
  prometheus::Counter* generated_tokens_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* running_;
  prometheus::Gauge* kv_tokens_used_;
  prometheus::Gauge* kv_tokens_capacity_;
  prometheus::Gauge* kv_tokens_cached_;
  prometheus::Gauge* acceptance_rate_;
  prometheus::Gauge* accepted_length_;
  prometheus::Gauge* drafts_per_step_;
  prometheus::Gauge* prefix_hit_rate_;
  prometheus::Counter* draft_seconds_;
  prometheus::Counter* target_seconds_;
  prometheus::Counter* host_waits_;
  prometheus::Counter* bytes_to_host_;
  prometheus::Family<prometheus::Counter>* drafted_at_;   // {position}, from 1
  prometheus::Family<prometheus::Counter>* accepted_at_;  // {position}, from 1
  std::mutex mutex_;                       // guards the engine's running totals below
  double draft_ms_seen_ = 0.0;             // engine draft time already added to draft_seconds_
  double target_ms_seen_ = 0.0;            // the same for target_seconds_
  int64_t host_waits_seen_ = 0;            // the same for host_waits_
  uint64_t bytes_to_host_seen_ = 0;        // the same for bytes_to_host_
  std::vector<int64_t> drafted_at_seen_;   // the same for drafted_at_, by position
  std::vector<int64_t> accepted_at_seen_;  // the same for accepted_at_
};

}  // namespace specrun::server
