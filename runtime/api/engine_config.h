// Settings in the engine's terms and the public API's: a RunConfig (a TOML file, the command
// line's flags) as an EngineConfig. Internal to specrun: the CLI builds its engine through it.
#pragma once

#include "runtime/engine/run_config.h"
#include "specrun/specrun.hpp"

namespace specrun {

// Every field of `run` that EngineConfig has, converted as it is (validation is create()'s).
EngineConfig to_engine_config(const RunConfig& run);

}  // namespace specrun
