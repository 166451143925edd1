#include "runtime/model/checkpoint.h"

#include <vector>

#include "runtime/base/check.h"

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
      if (candidates.size() != 1) {
        throw Error(path.string() + ": no model.safetensors or " + kIndexName +
                    (candidates.empty() ? " and no other .safetensors file"
                                        : ", and several .safetensors files without an index"));
      }
      paths.weights = candidates.front();
    }
  } else if (fs::is_regular_file(path, error)) {
    const std::string name = path.filename().string();
    if (ends_with(name, ".safetensors")) {
      paths.weights = path;
    } else if (ends_with(name, ".safetensors.index.json")) {
      paths.weights = path;
      paths.sharded = true;
    } else {
      throw Error(path.string() +
                  ": expected a checkpoint directory, a .safetensors file or a "
                  ".safetensors.index.json file");
    }
    paths.directory = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  } else {
    throw Error(path.string() + ": no such file or directory");
  }
  paths.config = paths.directory / "config.json";
  if (!fs::is_regular_file(paths.config, error)) {
    throw Error(paths.config.string() +
                ": missing (a checkpoint needs its config.json beside the "
                "weights)");
  }
  if (fs::is_regular_file(paths.directory / "tokenizer.json", error)) {
    paths.tokenizer = paths.directory / "tokenizer.json";
  }
  return paths;
}

Checkpoint open_checkpoint(const std::filesystem::path& path) {
  CheckpointPaths paths = resolve_checkpoint(path);
  ModelConfig config = load_model_config(paths.config);
  TensorStore tensors = paths.sharded ? TensorStore::open_index(paths.weights)
                                      : TensorStore::open_file(paths.weights);
  return Checkpoint{std::move(paths), std::move(config), std::move(tensors)};
}

}  // namespace specrun
