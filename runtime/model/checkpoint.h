// A Hugging Face checkpoint on disk: config.json, the safetensors weights (single or sharded) and,
// when present, tokenizer.json.
#pragma once

#include <filesystem>
#include <optional>

#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

namespace specrun {

struct CheckpointPaths {
  std::filesystem::path directory;  // the folder holding everything
  std::filesystem::path config;     // config.json
  std::filesystem::path weights;    // a .safetensors file or model.safetensors.index.json
  bool sharded = false;             // weights is an index
  std::optional<std::filesystem::path> tokenizer;  // tokenizer.json when present
};

// `path` is a checkpoint directory, a .safetensors file or an index file (config.json beside it).
// Throws Error naming what is missing.
CheckpointPaths resolve_checkpoint(const std::filesystem::path& path);

struct Checkpoint {
  CheckpointPaths paths;  // where it came from
  ModelConfig config;     // parsed config.json
  TensorStore tensors;    // every tensor, headers validated, bytes mapped
};

// Reads the config and validates every safetensors header; no weights are bound yet.
Checkpoint open_checkpoint(const std::filesystem::path& path);

}  // namespace specrun
