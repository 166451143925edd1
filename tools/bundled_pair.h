// The draft/target pair that ships with specrun (models/pycode-target and models/pycode-draft,
// trained by tools/pair/train.sh), which `specrun` runs when no --target is given.
#pragma once

#include <filesystem>
#include <optional>
#include <vector>

namespace specrun::tools {

struct BundledPair {
  std::filesystem::path target;  // directory of the target checkpoint
  std::filesystem::path draft;   // directory of the draft checkpoint
};

// The folders that may hold the pair, in the order they are tried: $SPECRUN_MODELS_DIR alone when
// it is set; otherwise share/specrun/models of the installation this executable belongs to
// (bin/../share/specrun/models), then models/ of the source tree it was built from.
std::vector<std::filesystem::path> bundled_model_folders();

// The first folder of bundled_model_folders() holding both models, or nullopt.
std::optional<BundledPair> find_bundled_pair();

}  // namespace specrun::tools
