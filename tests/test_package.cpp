// The installed library as a program built elsewhere sees it: `cmake --install --component
// library` into a temporary prefix, then examples/c_embed (C99, through the C ABI) and
// tests/data/downstream (C++) configured with find_package(specrun) alone, built and run on a
// generated checkpoint, and the same C program compiled with nothing but `pkg-config --cflags
// --libs specrun`.
#include <gtest/gtest.h>

#include <sstream>

#include "runtime/model/model.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;

std::string quote(const std::string& text) {
  return "'" + text + "'";
}

// A library built with sanitizers loads only into a program built with them (their runtime must
// come first), so downstream code is compiled the same way.
std::string sanitize_flags() {
  const std::string sanitizers = SPECRUN_SANITIZE;
  return sanitizers.empty() ? "" : "-fsanitize=" + sanitizers + " -fno-omit-frame-pointer";
}

// How a C program links a sanitized C++ library: with the sanitizer runtime's C++ part too (the
// library's virtual calls are checked by UBSan's C++ handlers), which a Clang C link leaves out
// unless asked (with the C++ library that part needs). The program is built by the library's own
// compiler family.
std::string c_link_flags() {
  const std::string compiler_id = SPECRUN_CXX_COMPILER_ID;
  const bool clang = compiler_id == "Clang";
  return sanitize_flags() + (clang && !std::string(SPECRUN_SANITIZE).empty()
                                 ? " -fsanitize-link-c++-runtime -lstdc++"
                                 : "");
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::istringstream stream(text);
  std::vector<int32_t> ids;
  int32_t id;
  while (stream >> id) ids.push_back(id);
  return ids;
}

class PackageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefix_dir_ = new testing::TempDir;
    install_ = run_command(quote(SPECRUN_CMAKE_COMMAND) + " --install " + quote(SPECRUN_BUILD_DIR) +
                           " --component library --prefix " + quote(prefix().string()));
  }
  static void TearDownTestSuite() {
    delete prefix_dir_;
    prefix_dir_ = nullptr;
  }
  static fs::path prefix() { return prefix_dir_->path() / "prefix"; }

  void SetUp() override {
    ASSERT_EQ(install_.exit_code, 0) << install_.stdout_text << install_.stderr_text;
    testing::write_layer_skip_pair(dir_.path());
  }

  // Configures and builds the CMake project in `source` against the installation.
  CommandResult build(const fs::path& source, const fs::path& binary) const {
    const std::string cmake = quote(SPECRUN_CMAKE_COMMAND);
    return run_command(cmake + " -S " + quote(source.string()) + " -B " + quote(binary.string()) +
                       " -G " + quote(SPECRUN_CMAKE_GENERATOR) + " -DCMAKE_BUILD_TYPE=Release" +
                       " -DCMAKE_PREFIX_PATH=" + quote(prefix().string()) + " -DCMAKE_C_COMPILER=" +
                       quote(SPECRUN_C_COMPILER) + " -DCMAKE_C_FLAGS=" + quote(sanitize_flags()) +
                       " -DCMAKE_EXE_LINKER_FLAGS=" + quote(c_link_flags()) +
                       " -DCMAKE_CXX_FLAGS=" + quote(sanitize_flags()) + " && " + cmake +
                       " --build " + quote(binary.string()));
  }

  std::vector<int32_t> greedy_alone(int64_t max_tokens) const {
    auto backend = testing::make_engine_cpu_backend(1);
    auto model = Model::load(dir_ / "target", *backend);
    SamplingSettings sampling = testing::greedy(max_tokens);
    sampling.stop_at_eos = true;
    const std::vector<int32_t> prompt = {1, 17, 200};
    return testing::reference_decode(*model, prompt, sampling).tokens;
  }

  static testing::TempDir* prefix_dir_;  // the installation, shared by the suite's tests
  static CommandResult install_;         // how `cmake --install` went
  testing::TempDir dir_;
};

testing::TempDir* PackageTest::prefix_dir_ = nullptr;
CommandResult PackageTest::install_;

TEST_F(PackageTest, InstallsHeadersLibraryAndPackageFiles) {
  for (const char* file :
       {"include/specrun/specrun.h", "include/specrun/specrun.hpp", "include/specrun/error.hpp",
        "include/specrun/settings.hpp", "include/specrun/stats.hpp", "include/specrun/chat.hpp",
        "include/specrun/logprobs.hpp", "lib/libspecrun.so",
        "lib/cmake/specrun/specrunConfig.cmake", "lib/cmake/specrun/specrunConfigVersion.cmake",
        "lib/cmake/specrun/specrunTargets.cmake", "lib/pkgconfig/specrun.pc"}) {
    EXPECT_TRUE(fs::exists(prefix() / file)) << file;
  }
  // The library component alone: no command-line tools, no models.
  EXPECT_FALSE(fs::exists(prefix() / "bin"));
}

TEST_F(PackageTest, CExampleBuildsWithFindPackageAndStreams) {
  const fs::path binary = dir_ / "c_embed";
  const CommandResult built = build(testing::source_path("examples/c_embed"), binary);
  ASSERT_EQ(built.exit_code, 0) << built.stdout_text << built.stderr_text;
  const CommandResult ran = run_command(quote((binary / "c_embed").string()) + " --target " +
                                        quote((dir_ / "target").string()) + " --draft " +
                                        quote((dir_ / "draft").string()) +
                                        " --prompt-ids 1,17,200 --max-tokens 12 --temperature 0");
  ASSERT_EQ(ran.exit_code, 0) << ran.stderr_text;
  EXPECT_EQ(parse_ids(ran.stdout_text), greedy_alone(12));
  for (const char* figure : {"12 generated", "time to first token", "acceptance", "KV"}) {
    EXPECT_NE(ran.stderr_text.find(figure), std::string::npos) << figure << "\n" << ran.stderr_text;
  }
  // Errors come back through the C ABI as one line.
  const CommandResult missing = run_command(quote((binary / "c_embed").string()) + " --target " +
                                            quote((dir_ / "missing").string()));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.stderr_text.find("specrun_engine_create: "), std::string::npos)
      << missing.stderr_text;
}

TEST_F(PackageTest, CppProjectBuildsWithFindPackage) {
  const fs::path binary = dir_ / "downstream";
  const CommandResult built = build(testing::source_path("tests/data/downstream"), binary);
  ASSERT_EQ(built.exit_code, 0) << built.stdout_text << built.stderr_text;
  const CommandResult ran = run_command(quote((binary / "downstream").string()) + " " +
                                        quote((dir_ / "target").string()));
  ASSERT_EQ(ran.exit_code, 0) << ran.stderr_text;
  std::istringstream lines(ran.stdout_text);
  std::string error_line, result_line;
  std::getline(lines, error_line);
  std::getline(lines, result_line);
  EXPECT_EQ(error_line.rfind("error: ", 0), 0u) << error_line;
  EXPECT_NE(error_line.find("missing"), std::string::npos) << error_line;
  EXPECT_EQ(result_line.rfind("max_tokens:", 0), 0u) << result_line;
  std::vector<int32_t> expected = greedy_alone(8);
  EXPECT_EQ(parse_ids(result_line.substr(result_line.find(':') + 1)), expected);
}

TEST_F(PackageTest, PkgConfigGivesWhatACompilerNeeds) {
  const std::string environment =
      "PKG_CONFIG_PATH=" + quote((prefix() / "lib" / "pkgconfig").string()) + " ";
  const CommandResult flags = run_command(environment + "pkg-config --cflags --libs specrun");
  ASSERT_EQ(flags.exit_code, 0) << flags.stderr_text;
  // Relocatable: the prefix comes from where the file lies.
  EXPECT_NE(flags.stdout_text.find("-lspecrun"), std::string::npos) << flags.stdout_text;
  EXPECT_NE(flags.stdout_text.find("include"), std::string::npos) << flags.stdout_text;
  const CommandResult version = run_command(environment + "pkg-config --modversion specrun");
  EXPECT_EQ(version.stdout_text, "0.1.0\n");

  const fs::path program = dir_ / "c_embed_pc";
  const CommandResult compiled =
      run_command(quote(SPECRUN_C_COMPILER) + " -std=c99 -Wall -Wextra -Wpedantic -Werror " +
                  c_link_flags() + " -o " + quote(program.string()) + " " +
                  quote(testing::source_path("examples/c_embed/main.c").string()) + " $(" +
                  environment + "pkg-config --cflags --libs specrun)");
  ASSERT_EQ(compiled.exit_code, 0) << compiled.stdout_text << compiled.stderr_text;
  const CommandResult ran =
      run_command("LD_LIBRARY_PATH=" + quote((prefix() / "lib").string()) + " " +
                  quote(program.string()) + " --target " + quote((dir_ / "target").string()) +
                  " --prompt-ids 1,17,200 --max-tokens 5 --temperature 0");
  ASSERT_EQ(ran.exit_code, 0) << ran.stderr_text;
  EXPECT_EQ(parse_ids(ran.stdout_text), greedy_alone(5));
}

}  // namespace
}  // namespace specrun
