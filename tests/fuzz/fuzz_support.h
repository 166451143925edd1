// What the fuzz harnesses share: a scratch file for the loaders that read from a path, and the
// rule that decides what counts as a finding.
//
// A harness feeds its input to one of specrun's readers of untrusted files. The reader may refuse
// the input with specrun::Error (that is the contract); anything else is a finding: a crash or a
// sanitizer report, a hang (libFuzzer's -timeout), or another exception type escaping, which the
// harness turns into an abort so that libFuzzer keeps the reproducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>

namespace specrun::fuzz {

// This process's own scratch directory: made on first use, removed at exit.
const std::filesystem::path& scratch_directory();

// Writes `bytes` to a file named `name` in the scratch directory and returns its path. Loaders
// that map files read the input from there.
std::filesystem::path write_scratch_file(std::string_view name, std::span<const uint8_t> bytes);

// Runs `body`; returns normally when it succeeds or throws specrun::Error, aborts with the
// exception's type and message on anything else.
void expect_clean_refusal(const std::function<void()>& body);

// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace specrun::fuzz

// libFuzzer's entry point, defined by each harness.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
