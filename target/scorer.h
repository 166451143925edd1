// The scorer: one target forward over [pending, d_1..d_n] per sequence gives the processed
// distributions p_0..p_n that verification compares against the drafts.
#pragma once

#include <span>

#include "runtime/model/model.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/speculative_step.h"

namespace specrun {

struct ScoreRequest {
  SequenceId sequence;  // the target's KV sequence; holds every committed token but the last
  int32_t pending;      // the last committed token, not yet fed
  std::span<const int32_t> drafts;  // d_1..d_n
  // The sequence's own sampling settings; null: the scorer's. Lets one batch mix requests.
  const SamplingParams* sampling = nullptr;
};

class Scorer {
 public:
  Scorer(Model& target, const SamplingParams& sampling);
  // Feeds every row in one batched forward (the target cache grows by n + 1 per row) and
  // returns p_0..p_n per row, processed with the sampling settings; with `features`, the
  // target's features at every row's n + 1 positions too.
  Scores score(std::span<const ScoreRequest> requests, Features* features = nullptr);

 private:
  Model& target_;
  SamplingParams sampling_;
  std::vector<std::vector<int32_t>> inputs_;  // reused per call
  Logits logits_;
};

}  // namespace specrun
