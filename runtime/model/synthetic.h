// Synthetic models: the shapes of well-known checkpoints with random weights written on the
// backend, so that large shapes can be measured (specbench --synthetic) where no checkpoint is at
// hand and uploading one would take longer than the measurement. Weights are bf16, uniform with a
// variance that keeps activations of order one through every layer; they say nothing about
// acceptance, only about costs.
#pragma once

#include <string>
#include <vector>

#include "runtime/model/config.h"
#include "runtime/model/weights.h"

namespace specrun {

// "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b": the published configs' shapes; "tiny": the
// same structure at 2 layers of width 256 (for smoke tests). Throws Error naming the known shapes
// for anything else.
ModelConfig synthetic_config(const std::string& shape);
std::vector<std::string> synthetic_shapes();

// Every weight the config needs, with its shape and `dtype` and no data yet.
ModelWeights synthetic_layout(const ModelConfig& config, DType dtype);

}  // namespace specrun
