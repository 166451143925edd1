#include "runtime/engine/settings.h"

#include <cmath>

#include "runtime/base/check.h"
#include "specrun/settings.hpp"

namespace specrun {
namespace {

constexpr SpeculationMethod kMethods[] = {
    SpeculationMethod::kDraftModel, SpeculationMethod::kPromptLookup, SpeculationMethod::kNone};
constexpr GammaControl kControls[] = {GammaControl::kGoodput, GammaControl::kHeuristic,
                                      GammaControl::kFixed};
constexpr Verification kVerifications[] = {Verification::kSharedNoise, Verification::kRejection};
constexpr Quantization kQuantizations[] = {Quantization::kNone, Quantization::kFP8,
                                           Quantization::kINT8};
constexpr KvCacheDtype kKvCacheDtypes[] = {KvCacheDtype::kBF16, KvCacheDtype::kF32};
constexpr OverlapDrafting kOverlaps[] = {OverlapDrafting::kAuto, OverlapDrafting::kOn,
                                         OverlapDrafting::kOff};
constexpr ActivationPrecision kActivationPrecisions[] = {
    ActivationPrecision::kAuto, ActivationPrecision::kF32, ActivationPrecision::kBF16,
    ActivationPrecision::kInt8};

}  // namespace

const char* to_string(SpeculationMethod method) {
  switch (method) {
    case SpeculationMethod::kDraftModel:
      return "draft";
    case SpeculationMethod::kPromptLookup:
      return "prompt_lookup";
    case SpeculationMethod::kNone:
      return "none";
  }
  return "unknown";
}

const char* to_string(GammaControl control) {
  switch (control) {
    case GammaControl::kGoodput:
      return "goodput";
    case GammaControl::kHeuristic:
      return "heuristic";
    case GammaControl::kFixed:
      return "fixed";
  }
  return "unknown";
}

const char* to_string(Verification verification) {
  switch (verification) {
    case Verification::kRejection:
      return "rejection";
    case Verification::kSharedNoise:
      return "shared_noise";
  }
  return "unknown";
}

const char* to_string(Quantization quantization) {
  switch (quantization) {
    case Quantization::kNone:
      return "none";
    case Quantization::kFP8:
      return "fp8";
    case Quantization::kINT8:
      return "int8";
  }
  return "unknown";
}

const char* to_string(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kBF16:
      return "bf16";
    case KvCacheDtype::kF32:
      return "f32";
  }
  return "unknown";
}

const char* to_string(OverlapDrafting overlap) {
  switch (overlap) {
    case OverlapDrafting::kAuto:
      return "auto";
    case OverlapDrafting::kOn:
      return "on";
    case OverlapDrafting::kOff:
      return "off";
  }
  return "unknown";
}

const char* to_string(ActivationPrecision precision) {
  switch (precision) {
    case ActivationPrecision::kAuto:
      return "auto";
    case ActivationPrecision::kF32:
      return "f32";
    case ActivationPrecision::kBF16:
      return "bf16";
    case ActivationPrecision::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEndOfSequence:
      return "end_of_sequence";
    case FinishReason::kMaxTokens:
      return "max_tokens";
    case FinishReason::kContextLimit:
      return "context_limit";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kShutdown:
      return "shutdown";
    case FinishReason::kFailed:
      return "failed";
  }
  return "unknown";
}

std::optional<SpeculationMethod> parse_speculation_method(std::string_view name) {
  for (const SpeculationMethod method : kMethods) {
    if (name == to_string(method)) return method;
  }
  return std::nullopt;
}

std::optional<GammaControl> parse_gamma_control(std::string_view name) {
  for (const GammaControl control : kControls) {
    if (name == to_string(control)) return control;
  }
  return std::nullopt;
}

std::optional<Verification> parse_verification(std::string_view name) {
  for (const Verification verification : kVerifications) {
    if (name == to_string(verification)) return verification;
  }
  return std::nullopt;
}

std::optional<Quantization> parse_quantization(std::string_view name) {
  for (const Quantization quantization : kQuantizations) {
    if (name == to_string(quantization)) return quantization;
  }
  return std::nullopt;
}

std::span<const Quantization> quantizations() {
  return kQuantizations;
}

std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view name) {
  for (const KvCacheDtype dtype : kKvCacheDtypes) {
    if (name == to_string(dtype)) return dtype;
  }
  return std::nullopt;
}

std::span<const KvCacheDtype> kv_cache_dtypes() {
  return kKvCacheDtypes;
}

std::optional<OverlapDrafting> parse_overlap_drafting(std::string_view name) {
  for (const OverlapDrafting overlap : kOverlaps) {
    if (name == to_string(overlap)) return overlap;
  }
  return std::nullopt;
}

std::span<const OverlapDrafting> overlap_draftings() {
  return kOverlaps;
}

std::optional<ActivationPrecision> parse_activation_precision(std::string_view name) {
  for (const ActivationPrecision precision : kActivationPrecisions) {
    if (name == to_string(precision)) return precision;
  }
  return std::nullopt;
}

std::span<const ActivationPrecision> activation_precisions() {
  return kActivationPrecisions;
}

DType kernel_dtype(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kF32 ? DType::kF32 : DType::kBF16;
}

std::span<const SpeculationMethod> speculation_methods() {
  return kMethods;
}

std::span<const GammaControl> gamma_controls() {
  return kControls;
}

std::span<const Verification> verifications() {
  return kVerifications;
}

void validate(const SamplingSettings& sampling) {
  validate_sampling(sampling_params(sampling, Verification::kRejection));
  if (sampling.max_tokens < 0) {
    throw Error("max_tokens must be >= 0, got " + std::to_string(sampling.max_tokens));
  }
}

void validate(const SpeculationSettings& s) {
  // Each setting alone, by its row (specrun/settings.hpp), then the relations between them.
  for (const Setting<SpeculationSettings>& row : speculation_settings()) {
    if (const std::optional<std::string> problem = setting_problem(row.range, row.get(s))) {
      throw Error(std::string(row.key) + " " + *problem);
    }
  }
  if (s.gamma_min < 0 || s.gamma_max < s.gamma_min || s.gamma < s.gamma_min ||
      s.gamma > s.gamma_max) {
    throw Error("gamma settings must satisfy 0 <= gamma_min <= gamma <= gamma_max, got gamma_min " +
                std::to_string(s.gamma_min) + ", gamma " + std::to_string(s.gamma) +
                ", gamma_max " + std::to_string(s.gamma_max));
  }
  if (s.lookup_max_ngram < s.lookup_min_ngram) {
    throw Error("prompt lookup n-gram sizes must satisfy 1 <= lookup_min_ngram <= " +
                std::string("lookup_max_ngram, got ") + std::to_string(s.lookup_min_ngram) +
                " and " + std::to_string(s.lookup_max_ngram));
  }
  if (s.draft_lookup_ngram > s.lookup_max_ngram) {
    throw Error("draft_lookup_ngram must be 0 (off) or within [1, lookup_max_ngram " +
                std::to_string(s.lookup_max_ngram) + "], got " +
                std::to_string(s.draft_lookup_ngram) +
                ": lower it, set it to 0, or raise lookup_max_ngram");
  }
}

void validate_prompt(const Model& model, std::span<const int32_t> prompt) {
  if (prompt.empty()) throw Error("the prompt is empty: give at least one token");
  for (const int32_t token : prompt) {
    if (token < 0 || token >= model.config().vocab_size) {
      throw Error("prompt token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                  std::to_string(model.config().vocab_size) + ")");
    }
  }
  if (static_cast<int64_t>(prompt.size()) > model.context_limit()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens, more than the context limit of " + std::to_string(model.context_limit()));
  }
}

SamplingParams sampling_params(const SamplingSettings& sampling, Verification verification) {
  SamplingParams params;
  params.temperature = sampling.temperature;
  params.top_k = sampling.top_k;
  params.top_p = sampling.top_p;
  params.min_p = sampling.min_p;
  params.seed = sampling.seed;
  params.shared_noise = verification == Verification::kSharedNoise;
  return params;
}

}  // namespace specrun
