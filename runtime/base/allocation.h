// Allocation failures while loading a file, reported as errors that name the file.
#pragma once

#include <filesystem>
#include <new>

#include "specrun/error.hpp"

namespace specrun {

// Runs `load`, which reads `file`, and turns an allocation failure into one Error naming the file.
// A file whose sizes pass every check can still ask for more memory than the machine has, and a
// bare std::bad_alloc says neither what failed nor where.
template <typename Load>
decltype(auto) naming_allocation_failure(const std::filesystem::path& file, Load&& load) {
  try {
    return load();
  } catch (const std::bad_alloc&) {
    throw Error(file.string() + ": out of memory while loading it");
  }
}

}  // namespace specrun
