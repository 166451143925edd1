#include "runtime/model/checkpoint.h"

#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "runtime/base/allocation.h"
#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/base/mapped_file.h"
#include "runtime/model/gguf.h"

namespace specrun {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

CheckpointPaths resolve_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  CheckpointPaths paths;
  if (fs::is_directory(path, error)) {
    paths.directory = path;
    if (fs::exists(path / kIndexName)) {
      paths.weights = path / kIndexName;
      paths.sharded = true;
    } else if (fs::exists(path / "model.safetensors")) {
      paths.weights = path / "model.safetensors";
    } else {
      std::vector<fs::path> candidates;
      for (const auto& entry : fs::directory_iterator(path, error)) {
        if (entry.path().extension() == ".safetensors") candidates.push_back(entry.path());
      }
      if (candidates.empty()) {
        // llama.cpp users keep a model as one .gguf file, which may sit alone in a folder.
        std::vector<fs::path> gguf;
        for (const auto& entry : fs::directory_iterator(path, error)) {
          if (entry.path().extension() == ".gguf") gguf.push_back(entry.path());
        }
        if (gguf.size() == 1) return resolve_checkpoint(gguf.front());
      }
      if (candidates.size() != 1) {
        throw Error(path.string() + ": no model.safetensors or " + kIndexName +
                    (candidates.empty() ? " and no other .safetensors file"
                                        : ", and several .safetensors files without an index"));
      }
      paths.weights = candidates.front();
    }
  } else if (fs::is_regular_file(path, error)) {
    const std::string name = path.filename().string();
    if (ends_with(name, ".gguf")) {
      paths.format = CheckpointFormat::kGguf;
      paths.directory = path.parent_path().empty() ? fs::path(".") : path.parent_path();
      paths.config = path;
      paths.weights = path;
      return paths;  // the tokenizer is known once the metadata is read
    }
    if (ends_with(name, ".safetensors")) {
      paths.weights = path;
    } else if (ends_with(name, ".safetensors.index.json")) {
      paths.weights = path;
      paths.sharded = true;
    } else {
      throw Error(path.string() +
                  ": expected a checkpoint directory, a .safetensors file, a "
                  ".safetensors.index.json file or a .gguf file");
    }
    paths.directory = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  } else {
    throw Error(path.string() + ": no such file or directory");
  }
  paths.config = paths.directory / "config.json";
  if (!fs::exists(paths.config, error)) {
    throw Error(paths.config.string() +
                ": missing (a checkpoint needs its config.json beside the "
                "weights)");
  }
  if (!fs::is_regular_file(paths.config, error)) {
    throw Error(paths.config.string() + ": not a regular file");
  }
  // A tokenizer.json that exists but cannot be read as a file (a directory, a FIFO, a device) is
  // an error, not a checkpoint without a tokenizer: the user meant it to be there.
  const fs::path tokenizer = paths.directory / "tokenizer.json";
  if (fs::exists(tokenizer, error)) {
    if (!fs::is_regular_file(tokenizer, error)) {
      throw Error(tokenizer.string() + ": not a regular file");
    }
    paths.tokenizer = tokenizer;
  }
  return paths;
}

namespace {

Checkpoint open_checkpoint_unguarded(const std::filesystem::path& path) {
  CheckpointPaths paths = resolve_checkpoint(path);
  if (paths.format == CheckpointFormat::kGguf) {
    TensorStore tensors = TensorStore::open_gguf(paths.weights);
    ModelConfig config = gguf_model_config(*tensors.gguf());
    if (tensors.gguf()->find("tokenizer.ggml.model") != nullptr) paths.tokenizer = paths.weights;
    return Checkpoint{std::move(paths), std::move(config), std::move(tensors)};
  }
  ModelConfig config = load_model_config(paths.config);
  TensorStore tensors = paths.sharded ? TensorStore::open_index(paths.weights)
                                      : TensorStore::open_file(paths.weights);
  if (config.text_of_multimodal) {
    const int64_t dropped = tensors.keep_text_model();
    spdlog::debug("{}: the text model of a {}; {} tensors of its vision tower and projector unread",
                  paths.weights.string(), config.architecture_name, dropped);
  }
  return Checkpoint{std::move(paths), std::move(config), std::move(tensors)};
}

}  // namespace

Checkpoint open_checkpoint(const std::filesystem::path& path) {
  return naming_allocation_failure(path, [&] { return open_checkpoint_unguarded(path); });
}

nlohmann::json read_tokenizer_document(const std::filesystem::path& tokenizer) {
  return naming_allocation_failure(tokenizer, [&] {
    if (ends_with(tokenizer.filename().string(), ".gguf")) {
      const GgufFile file(tokenizer);
      std::optional<nlohmann::json> document = gguf_tokenizer_json(file);
      if (!document) throw Error(tokenizer.string() + ": no tokenizer (no tokenizer.ggml.model)");
      return std::move(*document);
    }
    const MappedFile file(tokenizer);
    return parse_json(file.text(), tokenizer.string());
  });
}

}  // namespace specrun
