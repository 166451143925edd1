// What a request measured: one structure from the engine's step to every front end. The decode
// loop records into it as the request runs, the C++ API hands it over with the result (its times
// taken from the API's submit()), the server's metrics and the command line's --stats-json read
// it, and the C ABI converts it once (specrun_request_stats).
#pragma once

#include <cstdint>
#include <map>

namespace specrun {

// The figures of one request. Times are from submit(), in milliseconds. While the request runs
// (the engine's updates) the counts and rates are those so far; the timeline (ttft, inter-token
// latency, tokens per second, total) is complete with its last update.
struct RequestStats {
  int64_t prompt_tokens = 0;          // the prompt's tokens
  int64_t cached_prompt_tokens = 0;   // of those, taken from the prefix cache, not computed
  int64_t tokens_generated = 0;       // tokens emitted (end-of-sequence excluded)
  double queue_ms = 0.0;              // waiting for room in the batch or the KV cache
  double ttft_ms = 0.0;               // time to the first token
  double itl_ms_mean = 0.0;           // inter-token latency: mean
  double itl_ms_p50 = 0.0;            // median
  double itl_ms_p99 = 0.0;            // 99th percentile
  double tokens_per_second = 0.0;     // tokens_generated over the time from submit to the end
  double total_ms = 0.0;              // from submit to the end
  int64_t steps = 0;                  // engine steps the request took part in
  int64_t drafted = 0;                // drafts verified
  int64_t accepted = 0;               // drafts accepted
  int64_t rejections = 0;             // steps that rejected a draft (accepted < drafted)
  int64_t looked_up = 0;              // drafts prompt lookup proposed in the draft model's place
                                      // (speculative.draft_lookup_ngram), where they differed
  int64_t looked_up_accepted = 0;     // of those, accepted
  int64_t alternates = 0;             // alternates the target scored beside the drafts
  int64_t alternates_accepted = 0;    // of those, accepted (each brings one token more)
  double acceptance_rate = 0.0;       // accepted / drafted
  double mean_accepted_length = 0.0;  // tokens committed per step
  std::map<int64_t, int64_t> gamma_histogram;  // drafts in a step -> steps
  double draft_ms = 0.0;   // time in the steps' drafting (shared with the batch)
  double target_ms = 0.0;  // time in the target: its prefill, the steps' scoring (shared)
  // What the steps waited for and copied back from the device (shared with the batch): each wait
  // drains the device's queue and each byte crosses the bus. A step waits once for its verdict,
  // once more for a draft model's drafts (once a draft position where prompt lookup joins them).
  int64_t host_waits = 0;
  uint64_t bytes_to_host = 0;
};

}  // namespace specrun
