#include "specrun/settings.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "runtime/base/member_pointer.h"
#include "runtime/engine/settings.h"

namespace specrun {
namespace {

template <auto Member>
Setting<OwnerOf<Member>> integer(const char* key, int64_t minimum, int64_t maximum,
                                 const char* help) {
  Setting<OwnerOf<Member>> row{key, {SettingKind::kInteger}};
  row.range.integer_minimum = minimum;
  row.range.integer_maximum = maximum;
  row.get = [](const OwnerOf<Member>& settings) -> SettingValue {
    return static_cast<int64_t>(settings.*Member);
  };
  row.set = [](OwnerOf<Member>& settings, const SettingValue& value) {
    settings.*Member = static_cast<FieldOf<Member>>(std::get<int64_t>(value));
  };
  row.help = help;
  return row;
}

template <auto Member>
Setting<OwnerOf<Member>> number(const char* key, double minimum, double maximum,
                                bool exclusive_minimum, const char* help) {
  Setting<OwnerOf<Member>> row{key, {SettingKind::kNumber}};
  row.range.number_minimum = minimum;
  row.range.number_maximum = maximum;
  row.range.exclusive_minimum = exclusive_minimum;
  row.get = [](const OwnerOf<Member>& settings) -> SettingValue {
    return static_cast<double>(settings.*Member);
  };
  row.set = [](OwnerOf<Member>& settings, const SettingValue& value) {
    settings.*Member = static_cast<FieldOf<Member>>(std::get<double>(value));
  };
  row.help = help;
  return row;
}

// An enum field, named as to_string() spells it; All() lists every value.
template <auto Member, auto All>
Setting<OwnerOf<Member>> choice(const char* key, const char* help) {
  Setting<OwnerOf<Member>> row{key, {SettingKind::kChoice}};
  for (const FieldOf<Member> option : All()) row.range.choices.emplace_back(to_string(option));
  row.get = [](const OwnerOf<Member>& settings) -> SettingValue {
    // A value past the enum's (an embedder's cast) is named by its number.
    for (const FieldOf<Member> option : All()) {
      if (settings.*Member == option) return std::string(to_string(option));
    }
    return std::to_string(static_cast<int>(settings.*Member));
  };
  row.set = [](OwnerOf<Member>& settings, const SettingValue& value) {
    for (const FieldOf<Member> option : All()) {
      if (std::get<std::string>(value) == to_string(option)) settings.*Member = option;
    }
  };
  row.help = help;
  return row;
}

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

}  // namespace

std::span<const Setting<SamplingSettings>> sampling_settings() {
  static const std::vector<Setting<SamplingSettings>> table = {
      number<&SamplingSettings::temperature>("temperature", 0.0, kUnbounded, false,
                                             "Sampling temperature; 0 is greedy"),
      integer<&SamplingSettings::top_k>("top_k", 0, std::numeric_limits<int32_t>::max(),
                                        "Keep the k most probable tokens; 0 disables"),
      number<&SamplingSettings::top_p>(
          "top_p", 0.0, 1.0, true,
          "Keep the fewest most probable tokens whose probability reaches p; 1 disables"),
      number<&SamplingSettings::min_p>(
          "min_p", 0.0, 1.0, false,
          "Drop tokens less probable than min_p times the most probable; 0 disables"),
      integer<&SamplingSettings::seed>("seed", 0, std::numeric_limits<int64_t>::max(),
                                       "Seed of the request's random numbers"),
      integer<&SamplingSettings::max_tokens>("max_tokens", 0, std::numeric_limits<int32_t>::max(),
                                             "Most new tokens to generate"),
      number<&SamplingSettings::frequency_penalty>(
          "frequency_penalty", -2.0, 2.0, false,
          "Subtract this times a token's count in the output so far from its logit; 0 disables"),
      number<&SamplingSettings::presence_penalty>(
          "presence_penalty", -2.0, 2.0, false,
          "Subtract this from the logit of every token in the output so far; 0 disables"),
      number<&SamplingSettings::repetition_penalty>(
          "repetition_penalty", 0.0, kUnbounded, true,
          "Divide the positive logits of tokens in the prompt or output by this (multiply the "
          "negative ones); 1 disables"),
  };
  return table;
}

std::span<const Setting<SpeculationSettings>> speculation_settings() {
  static const std::vector<Setting<SpeculationSettings>> table = {
      choice<&SpeculationSettings::method, speculation_methods>(
          "method",
          "Who proposes: draft (the draft model), prompt_lookup (n-grams of the text so far), "
          "none"),
      choice<&SpeculationSettings::controller, gamma_controls>(
          "controller",
          "How gamma adapts: goodput (measured tokens per second), heuristic (+2 after a fully "
          "accepted step, -1 otherwise), fixed"),
      choice<&SpeculationSettings::verification, verifications>(
          "verification",
          "How sampled drafts are verified: shared_noise (draft and target share each "
          "position's Gumbel noise, so with a seed the output is the same with or without "
          "speculation, for any gamma and controller) or rejection (rejection sampling: slightly "
          "more drafts accepted, output reproducible only when the steps draft alike)"),
      integer<&SpeculationSettings::gamma>(
          "gamma", 0, kMaxGamma,
          "Drafts in the first drafting step: every step with the fixed controller, the starting "
          "point with heuristic and goodput (goodput may decode plainly first while it measures "
          "the target's costs; 0 leaves the depth to it)"),
      integer<&SpeculationSettings::gamma_min>(
          "gamma_min", 0, kMaxGamma,
          "Fewest drafts per step (0 lets the controller fall back to plain decoding)"),
      integer<&SpeculationSettings::gamma_max>("gamma_max", 0, kMaxGamma, "Most drafts per step"),
      number<&SpeculationSettings::draft_p_min>(
          "draft_p_min", 0.0, 1.0, false,
          "Stop a row's drafting where the draft's own top probability falls below this; 0 "
          "never"),
      integer<&SpeculationSettings::lookup_min_ngram>(
          "lookup_min_ngram", 1, 64, "Prompt lookup: the shortest suffix of the text matched"),
      integer<&SpeculationSettings::lookup_max_ngram>(
          "lookup_max_ngram", 1, 64, "Prompt lookup: the longest suffix of the text matched"),
      integer<&SpeculationSettings::draft_lookup_ngram>(
          "draft_lookup_ngram", 0, 64,
          "With the draft model: where the text so far ends in an n-gram of at least this many "
          "tokens seen before, prompt lookup offers what followed it, proposed in the draft's "
          "place while it wins their contests; 0 never"),
      number<&SpeculationSettings::draft_lookup_below>(
          "draft_lookup_below", 0.0, 1.0, true,
          "With the draft model: prompt lookup offers its token only where the draft's top "
          "probability is below this; 1 wherever the text repeats itself"),
      integer<&SpeculationSettings::draft_alternates>(
          "draft_alternates", 0, kMaxDraftAlternates,
          "With the draft model, greedy or shared-noise verification and a backend that takes "
          "token trees (the CPU): other guesses per draft (the draft's next most likely tokens) "
          "the target scores beside it as a token tree; 0 never"),
  };
  return table;
}

std::string describe_range(const SettingRange& range) {
  switch (range.kind) {
    case SettingKind::kInteger:
      return "in [" + std::to_string(range.integer_minimum) + ", " +
             std::to_string(range.integer_maximum) + "]";
    case SettingKind::kNumber:
      if (std::isinf(range.number_maximum)) {
        return std::string("finite and ") + (range.exclusive_minimum ? "> " : ">= ") +
               number_text(range.number_minimum);
      }
      return std::string("in ") + (range.exclusive_minimum ? "(" : "[") +
             number_text(range.number_minimum) + ", " + number_text(range.number_maximum) + "]";
    case SettingKind::kChoice: {
      std::string names;
      for (const std::string& name : range.choices) names += (names.empty() ? "" : ", ") + name;
      return "one of " + names;
    }
  }
  return "";
}

std::optional<std::string> setting_problem(const SettingRange& range, const SettingValue& value) {
  const std::string wanted = describe_range(range);
  switch (range.kind) {
    case SettingKind::kInteger: {
      const int64_t* integer = std::get_if<int64_t>(&value);
      if (integer == nullptr) return "must be an integer";
      if (*integer < range.integer_minimum || *integer > range.integer_maximum) {
        return "must be " + wanted + ", got " + std::to_string(*integer);
      }
      return std::nullopt;
    }
    case SettingKind::kNumber: {
      const double* number = std::get_if<double>(&value);
      if (number == nullptr) return "must be a number";
      const auto stored = static_cast<float>(*number);
      const auto checked = static_cast<double>(stored);
      const bool too_small = range.exclusive_minimum ? !(checked > range.number_minimum)
                                                     : !(checked >= range.number_minimum);
      if (too_small || !(checked <= range.number_maximum) || !std::isfinite(checked)) {
        std::string problem = "must be " + wanted + ", got " + number_text(*number);
        if (checked != *number && std::isfinite(*number)) {
          problem += " (" + number_text(checked) + " as a 32-bit float)";
        }
        return problem;
      }
      return std::nullopt;
    }
    case SettingKind::kChoice: {
      const std::string* name = std::get_if<std::string>(&value);
      if (name == nullptr) return "must be a string";
      for (const std::string& option : range.choices) {
        if (*name == option) return std::nullopt;
      }
      return "must be " + wanted + ", got '" + *name + "'";
    }
  }
  return std::nullopt;
}

std::optional<SettingValue> parse_setting_text(SettingKind kind, std::string_view text) {
  switch (kind) {
    case SettingKind::kInteger: {
      int64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size() || text.empty()) {
        return std::nullopt;
      }
      return value;
    }
    case SettingKind::kNumber: {
      const std::string copy(text);  // strtod reads a terminated string
      char* end = nullptr;
      const double value = std::strtod(copy.c_str(), &end);
      if (copy.empty() || end != copy.c_str() + copy.size()) return std::nullopt;
      return value;
    }
    case SettingKind::kChoice:
      return std::string(text);
  }
  return std::nullopt;
}

std::string setting_text(const SettingValue& value) {
  if (const int64_t* integer = std::get_if<int64_t>(&value)) return std::to_string(*integer);
  if (const double* number = std::get_if<double>(&value)) return number_text(*number);
  return std::get<std::string>(value);
}

void set_gamma_moving_range(SpeculationSettings& settings, int64_t gamma) {
  settings.gamma = gamma;
  settings.gamma_max = std::max(settings.gamma_max, gamma);
  settings.gamma_min = std::min(settings.gamma_min, gamma);
}

}  // namespace specrun
