#include "tools/bundled_pair.h"

#include <cstdlib>
#include <system_error>

namespace specrun::tools {
namespace {

constexpr const char* kTargetName = "pycode-target";
constexpr const char* kDraftName = "pycode-draft";

std::optional<std::filesystem::path> executable_directory() {
  std::error_code error;
  const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return std::nullopt;
  return executable.parent_path();
}

bool holds_checkpoint(const std::filesystem::path& directory) {
  std::error_code error;
  return std::filesystem::is_regular_file(directory / "config.json", error) &&
         std::filesystem::is_regular_file(directory / "model.safetensors", error);
}

}  // namespace

std::vector<std::filesystem::path> bundled_model_folders() {
  std::vector<std::filesystem::path> folders;
  if (const char* override_dir = std::getenv("SPECRUN_MODELS_DIR");
      override_dir != nullptr && *override_dir != '\0') {
    return {override_dir};
  }
  if (const auto bin = executable_directory()) {
    folders.push_back((*bin / SPECRUN_BIN_TO_MODELS_DIR).lexically_normal());
  }
  folders.emplace_back(SPECRUN_SOURCE_MODELS_DIR);
  return folders;
}

std::optional<BundledPair> find_bundled_pair() {
  for (const std::filesystem::path& folder : bundled_model_folders()) {
    if (holds_checkpoint(folder / kTargetName) && holds_checkpoint(folder / kDraftName)) {
      return BundledPair{folder / kTargetName, folder / kDraftName};
    }
  }
  return std::nullopt;
}

}  // namespace specrun::tools
