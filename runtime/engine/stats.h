// What the engine measured of one request; the public RequestStats are derived from it in one
// place (runtime/api/engine.cpp), and the benchmarks read it directly.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace specrun {

struct SequenceStats {
  int64_t tokens_generated = 0;      // tokens emitted (EOS excluded)
  double total_ms = 0.0;             // from submit to the last update
  double ttft_ms = 0.0;              // time to the first token
  int64_t cached_prompt_tokens = 0;  // prompt positions taken from the prefix cache
  std::vector<double> token_ms;      // each token's arrival, from submit
  int64_t steps = 0;                 // target forwards after the prefill
  int64_t drafted = 0;               // drafts verified (calibration filler included)
  int64_t accepted = 0;              // drafts accepted
  int64_t rejections = 0;            // steps that rejected a draft (accepted < drafted)
  int64_t looked_up = 0;             // drafts lookup proposed where the draft offered another token
  int64_t looked_up_accepted = 0;    // of those, accepted
  int64_t alternates = 0;            // alternates the target scored beside the drafts
  int64_t alternates_accepted = 0;   // of those, accepted (each brings one token more)
  int64_t committed_in_steps = 0;    // tokens committed by the steps (accepted + 1 each)
  std::map<int64_t, int64_t> gamma_histogram;  // drafts per step -> steps
  double draft_ms = 0.0;                       // time proposing (shared with the batch)
  double target_ms = 0.0;  // time in the target: prefill, scoring, verification (shared)
  // What the steps it took part in waited for and copied back from the models' backends
  // (Backend::transfer_counts; shared with the batch).
  int64_t host_waits = 0;
  uint64_t bytes_to_host = 0;

  // Adds one step: `drafted` drafts verified, `accepted` of them taken, and its two costs.
  void record_step(int64_t drafted, int64_t accepted, double step_draft_ms, double step_target_ms);

  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  // Tokens committed per target step: accepted drafts plus the recovered or bonus token.
  double mean_accepted_length() const {
    return steps ? double(committed_in_steps) / double(steps) : 0.0;
  }
  // Inter-token latency over consecutive arrivals: {mean, p50, p99}; zeros below two tokens.
  struct Latency {
    double mean = 0, p50 = 0, p99 = 0;
  };
  Latency inter_token_latency() const;
};

}  // namespace specrun
