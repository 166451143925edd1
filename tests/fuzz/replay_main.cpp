// The fuzz harnesses' main() where libFuzzer is not linked (GCC builds, the sanitizer passes):
// runs every file named, or found under a directory named, through the harness once. ctest uses
// it to replay the seed corpus in tests/fuzz/corpus/ in every build, so that what a fuzzer once
// found stays fixed.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.h"

namespace {

int replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  if (!in.eof() && in.fail()) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return 1;
  }
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path argument(argv[i]);
    if (std::filesystem::is_directory(argument)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(argument)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(argument);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY... (no inputs found)\n", argv[0]);
    return 2;
  }
  std::sort(files.begin(), files.end());
  int failures = 0;
  for (const auto& file : files) {
    std::fprintf(stderr, "replay: %s\n", file.c_str());
    failures += replay(file);
  }
  std::fprintf(stderr, "replay: %zu inputs, none crashed\n", files.size());
  return failures == 0 ? 0 : 1;
}
