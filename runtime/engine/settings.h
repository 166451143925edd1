// The engine's side of the public settings vocabulary (specrun/specrun.hpp): the names the TOML
// file, the command line and the stats use for each choice, the checks every request's settings
// pass, and the one place the sampler's parameters are derived from them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "runtime/model/model.h"
#include "runtime/sampling/sampler.h"
#include "specrun/specrun.hpp"

namespace specrun {

// The names of the choices, as every setting spells them ("draft", "goodput", ...).
std::optional<SpeculationMethod> parse_speculation_method(std::string_view name);
std::optional<GammaControl> parse_gamma_control(std::string_view name);
std::optional<Verification> parse_verification(std::string_view name);
std::optional<Quantization> parse_quantization(std::string_view name);
std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);
std::optional<OverlapDrafting> parse_overlap_drafting(std::string_view name);
std::optional<ActivationPrecision> parse_activation_precision(std::string_view name);
// Every method, controller and verification, for lists of choices.
std::span<const SpeculationMethod> speculation_methods();
std::span<const GammaControl> gamma_controls();
std::span<const Verification> verifications();
std::span<const Quantization> quantizations();
std::span<const KvCacheDtype> kv_cache_dtypes();
std::span<const OverlapDrafting> overlap_draftings();
std::span<const ActivationPrecision> activation_precisions();
// The kernels' dtype for a KV cache stored as `dtype`.
DType kernel_dtype(KvCacheDtype dtype);

// Throw Error naming the setting and its value when it is out of range or inconsistent.
void validate(const SamplingSettings& sampling);
void validate(const SpeculationSettings& speculation);
// Throws Error when a prompt cannot start on `model`: empty, an id outside its vocabulary, or
// longer than its context limit.
void validate_prompt(const Model& model, std::span<const int32_t> prompt);

// What the sampler, the proposers, the scorer and the verifiers read of a request's sampling
// settings, drawn by the rule of its verification.
SamplingParams sampling_params(const SamplingSettings& sampling, Verification verification);

}  // namespace specrun
