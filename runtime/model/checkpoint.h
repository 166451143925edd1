// A checkpoint on disk: a Hugging Face one (config.json, the safetensors weights, single or
// sharded, and, when present, tokenizer.json) or a GGUF file holding all three.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json_fwd.hpp>

#include "runtime/model/config.h"
#include "runtime/model/safetensors.h"

namespace specrun {

enum class CheckpointFormat {
  kSafetensors,  // config.json + safetensors (+ tokenizer.json)
  kGguf,         // one .gguf file: metadata, tokenizer and tensors
};

struct CheckpointPaths {
  CheckpointFormat format = CheckpointFormat::kSafetensors;  // how the files are read
  std::filesystem::path directory;                           // the folder holding everything
  std::filesystem::path config;                              // config.json; the .gguf file for GGUF
  std::filesystem::path weights;  // a .safetensors file, model.safetensors.index.json or a .gguf
  bool sharded = false;           // weights is an index
  // tokenizer.json when present; for GGUF the .gguf file, when its metadata has a tokenizer.
  std::optional<std::filesystem::path> tokenizer;
};

// `path` is a checkpoint directory, a .safetensors file, an index file (config.json beside it) or
// a .gguf file; a directory without safetensors may hold one .gguf file. Throws Error naming what
// is missing.
CheckpointPaths resolve_checkpoint(const std::filesystem::path& path);

struct Checkpoint {
  CheckpointPaths paths;  // where it came from
  ModelConfig config;     // parsed config.json, or the GGUF metadata
  TensorStore tensors;    // every tensor, headers validated, bytes mapped
};

// Reads the config and validates every safetensors (or GGUF) header; no weights are bound yet.
// A GGUF checkpoint's quantized tensors are dequantised here.
Checkpoint open_checkpoint(const std::filesystem::path& path);

// The tokenizer.json document of `tokenizer` (CheckpointPaths::tokenizer): the file itself, or the
// one a .gguf file's metadata describes (gguf_tokenizer_json). Throws Error naming the file.
nlohmann::json read_tokenizer_document(const std::filesystem::path& tokenizer);

}  // namespace specrun
