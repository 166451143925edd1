#include "runtime/sampling/sampling_params.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "runtime/base/check.h"

namespace specrun {

void validate_sampling(const SamplingParams& params) {
  auto fail = [](const std::string& name, const std::string& rule, double value) {
    throw Error("sampling parameter " + name + " must be " + rule + ", got " +
                std::to_string(value));
  };
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    fail("temperature", "finite and >= 0", params.temperature);
  }
  if (params.top_k < 0) fail("top_k", ">= 0 (0 turns it off)", static_cast<double>(params.top_k));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) fail("top_p", "in (0, 1]", params.top_p);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) fail("min_p", "in [0, 1]", params.min_p);
}

kernels::LogitsSettings logits_settings(const SamplingParams& params) {
  const int64_t top_k = std::clamp<int64_t>(params.top_k, -1, INT32_MAX);
  return {params.temperature, static_cast<int32_t>(top_k), params.top_p, params.min_p};
}

void throw_row_status(kernels::RowStatus status, const std::string& what) {
  throw Error(what + ": " + kernels::row_status_message(status));
}

}  // namespace specrun
