// The engine's side of the public settings vocabulary (specrun/settings.hpp): the checks every
// request's settings pass, and the one place the sampler's parameters are derived from them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "runtime/model/model.h"
#include "runtime/sampling/sampling_params.h"
#include "specrun/settings.hpp"

namespace specrun {

// The kernels' dtype for a KV cache stored as `dtype`.
DType kernel_dtype(KvCacheDtype dtype);

// Throws Error naming the setting and its value when it is out of range or inconsistent
// (validate(const SpeculationSettings&) is public: specrun/settings.hpp).
void validate(const SamplingSettings& sampling);
// Throws Error when a prompt cannot start on `model`: empty, an id outside its vocabulary, or
// longer than its context limit.
void validate_prompt(const Model& model, std::span<const int32_t> prompt);

// What the sampler, the proposers, the scorer and the verifiers read of a request's sampling
// settings, drawn by the rule of its verification.
SamplingParams sampling_params(const SamplingSettings& sampling, Verification verification);

}  // namespace specrun
