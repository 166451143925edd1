// The checks an EngineConfig passes before anything loads (EngineConfig::from_toml, the reader of
// the TOML file, is beside them in config.cpp).
#pragma once

#include <optional>
#include <string>

#include "kernels/backend.h"
#include "specrun/specrun.hpp"

namespace specrun {

// Throws Error naming the setting and its value when one is out of range or inconsistent.
void validate(const EngineConfig& config);

// "auto" (the checkpoint's own layout: nullopt), "rotate-half" or "interleaved"; Error otherwise.
std::optional<kernels::RopeStyle> parse_rope_style(const std::string& style);

}  // namespace specrun
