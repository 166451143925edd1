// A request's sampling settings as the runtime reads them, and what the backends' logits ops take
// of them. process_logits (kernels/backend.h) turns logits into the *processed* distribution
// (temperature, top-k, top-p, min-p applied, renormalised) as a full row, because speculative
// verification compares these distributions token by token; sampling then draws from it, by
// inverse CDF with one uniform number or by Gumbel-max with noise shared between the draft and the
// target (kernels/core/random_stream.h holds the numbers of both). The step's rows, the target's
// and the draft's, are processed and drawn from on their backend (target/scorer.h,
// draft/proposer.h), where they stay.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/core/random_stream.h"

namespace specrun {

using kernels::Draw;
using kernels::RandomStream;

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax); otherwise logits are divided by it
  int64_t top_k = 0;         // keep the k most probable tokens; 0: off
  float top_p = 1.0f;  // keep the fewest most probable tokens whose mass reaches top_p; 1: off
  float min_p = 0.0f;  // drop tokens below min_p times the most probable; 0: off
  uint64_t seed = 0;   // keys the request's random numbers (RandomStream)
  // Draw tokens by Gumbel-max with the noise of their output position (sample_with_noise), which
  // the draft and the target share, instead of by inverse CDF with independent uniforms: the
  // shared-noise verification's way of sampling, plain decoding included.
  bool shared_noise = false;
};

// Throws Error naming the parameter and value when one is out of range:
// temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1].
void validate_sampling(const SamplingParams& params);

// What the backend's process_logits reads of the settings.
kernels::LogitsSettings logits_settings(const SamplingParams& params);

// Throws Error saying why a row of logits could not be processed (`what`: "the target's row 3").
[[noreturn]] void throw_row_status(kernels::RowStatus status, const std::string& what);

}  // namespace specrun
