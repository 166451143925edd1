// The checks an EngineConfig passes before anything loads (EngineConfig::from_toml, the reader of
// the TOML file, is beside them in config.cpp).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "specrun/specrun.hpp"

namespace specrun {

// EngineConfig::from_toml after its file checks: `text` parsed as the contents of `path` (which
// names it in errors and anchors relative model paths). The fuzzer's entry point.
EngineConfig engine_config_from_toml_text(std::string_view text, const std::filesystem::path& path,
                                          const std::string& model_root);

// ServerConfig::from_toml after its file checks, `text` parsed as the contents of `path`.
ServerConfig server_config_from_toml_text(std::string_view text, const std::filesystem::path& path);

// Throws Error naming the setting and its value when one is out of range or inconsistent.
void validate(const EngineConfig& config);

// "auto" (the checkpoint's own layout: nullopt), "rotate-half" or "interleaved"; Error otherwise.
std::optional<kernels::RopeStyle> parse_rope_style(const std::string& style);

}  // namespace specrun
