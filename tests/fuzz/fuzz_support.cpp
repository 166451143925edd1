#include "tests/fuzz/fuzz_support.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <typeinfo>

#include "specrun/error.hpp"

namespace specrun::fuzz {
namespace {

// The scratch directory, made once per process and removed when the process exits normally.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "specrun-fuzz-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "fuzz: cannot make a scratch directory under %s\n",
                   std::filesystem::temp_directory_path().c_str());
      std::abort();
    }
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace

const std::filesystem::path& scratch_directory() {
  static const ScratchDirectory directory;
  return directory.path();
}

std::filesystem::path write_scratch_file(std::string_view name, std::span<const uint8_t> bytes) {
  const std::filesystem::path path = scratch_directory() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

void expect_clean_refusal(const std::function<void()>& body) {
  try {
    body();
  } catch (const specrun::Error& error) {
    // The reader refused the input with one clear error: the contract. SPECRUN_FUZZ_VERBOSE shows
    // which inputs are refused and why (to check that a seed reaches as deep as it was meant to).
    if (std::getenv("SPECRUN_FUZZ_VERBOSE") != nullptr) {
      std::fprintf(stderr, "  refused: %s\n", error.what());
    }
  } catch (const std::exception& other) {
    std::fprintf(stderr, "fuzz: an exception other than specrun::Error escaped: %s: %s\n",
                 typeid(other).name(), other.what());
    std::abort();
  }
}

}  // namespace specrun::fuzz
