// The tokenizer against the reference (Hugging Face tokenizers, Rust) on real tokenizer.json files:
// every line of tests/data/tokenizer/corpus.txt must encode to the reference's ids, with and
// without special tokens, and every id sequence must decode to the reference's text, for seven
// model families. The golden files come from tools/tokenizer/gen_golden.py; the tokenizer.json
// files from ../shared/tokenizers/<family>/ (the tests skip when it is absent). When the project's
// venv has the reference package (tools/setup-python.sh tokenizers), a live comparison on freshly
// generated random text runs as well.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path tokenizer_json(const std::string& family) {
  return testing::shared_path("tokenizers/" + family + "/tokenizer.json");
}

// The project venv's Python (testing::venv_python) when it can import the reference; empty
// otherwise.
std::string reference_python() {
  return testing::venv_python_with("tokenizers");
}

std::vector<std::string> corpus_lines() {
  const std::string bytes =
      testing::read_file(testing::source_path("tests/data/tokenizer/corpus.txt"));
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == '\n') {
      lines.push_back(bytes.substr(start, i - start));
      start = i + 1;
    }
  }
  if (start < bytes.size()) lines.push_back(bytes.substr(start));
  return lines;
}

std::vector<int32_t> ids_of(const json& array) {
  return array.get<std::vector<int32_t>>();
}

std::string show(const std::vector<int32_t>& ids) {
  return json(ids).dump();
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const fs::path path = tokenizer_json(GetParam());
    if (!fs::exists(path)) {
      GTEST_SKIP() << path << " is absent (the tokenizer files come from ../shared)";
    }
    tokenizer_ = text::Tokenizer::load(path);
    golden_ = json::parse(testing::read_file(
        testing::source_path("tests/data/tokenizer/golden_" + GetParam() + ".json")));
    lines_ = corpus_lines();
    ASSERT_EQ(golden_["lines"].size(), lines_.size()) << "golden file and corpus disagree";
  }

  // The text the reference saw for a line: the generator decodes its bytes with U+FFFD
  // substitution.
  static std::string as_reference_text(const std::string& line) { return text::repair_utf8(line); }

  // The checks against the golden files, run by one test per family (MatchesTheGoldenFiles):
  // each test is a process of its own under ctest, and loading a tokenizer of 262,144 tokens is
  // most of a check's time (several seconds under the sanitizers).
  void EncodeEveryLine();
  void EncodeWithSpecialTokens();
  // Multi-line blocks of the corpus encode as the reference encoded them.
  void EncodeMultiLineBlocks();
  void DecodeEveryLine();
  void DecodeProbes();
  // Streaming the reference's ids one at a time gives the same text as decoding them at once, and
  // no piece ever ends inside a UTF-8 character.
  void StreamingMatchesDecode();

  std::unique_ptr<text::Tokenizer> tokenizer_;
  json golden_;
  std::vector<std::string> lines_;
};

void Conformance::EncodeEveryLine() {
  size_t mismatches = 0;
  for (size_t i = 0; i < lines_.size(); ++i) {
    const std::vector<int32_t> expected = ids_of(golden_["lines"][i]);
    const std::vector<int32_t> actual = tokenizer_->encode(lines_[i], false);
    if (actual != expected && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " line " << i + 1 << ": " << json(as_reference_text(lines_[i]))
                    << "\n  reference " << show(expected) << "\n  specrun   " << show(actual);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << lines_.size() << " lines";
}

void Conformance::EncodeWithSpecialTokens() {
  const std::vector<int32_t> before = ids_of(golden_["special"]["before"]);
  const std::vector<int32_t> after = ids_of(golden_["special"]["after"]);
  const json& exceptions = golden_["special"]["exceptions"];
  size_t mismatches = 0;
  for (size_t i = 0; i < lines_.size(); ++i) {
    std::vector<int32_t> expected;
    if (exceptions.contains(std::to_string(i))) {
      expected = ids_of(exceptions[std::to_string(i)]);
    } else {
      expected = before;
      const std::vector<int32_t> plain = ids_of(golden_["lines"][i]);
      expected.insert(expected.end(), plain.begin(), plain.end());
      expected.insert(expected.end(), after.begin(), after.end());
    }
    const std::vector<int32_t> actual = tokenizer_->encode(lines_[i], true);
    if (actual != expected && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " line " << i + 1 << "\n  reference " << show(expected)
                    << "\n  specrun   " << show(actual);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

void Conformance::EncodeMultiLineBlocks() {
  const size_t block_lines = golden_["block_lines"].get<size_t>();
  const size_t source_lines = golden_["block_source_lines"].get<size_t>();
  size_t block = 0;
  for (size_t i = 0; i < std::min(source_lines, lines_.size()); i += block_lines, ++block) {
    std::string text;
    for (size_t k = i; k < std::min({i + block_lines, source_lines, lines_.size()}); ++k) {
      if (k > i) text += '\n';
      text += lines_[k];
    }
    ASSERT_LT(block, golden_["blocks"].size());
    EXPECT_EQ(show(tokenizer_->encode(text, false)), show(ids_of(golden_["blocks"][block])))
        << GetParam() << " block starting at line " << i + 1;
  }
  EXPECT_EQ(block, golden_["blocks"].size());
}

void Conformance::DecodeEveryLine() {
  size_t mismatches = 0;
  for (size_t i = 0; i < lines_.size(); ++i) {
    const std::vector<int32_t> ids = ids_of(golden_["lines"][i]);
    const std::string key = std::to_string(i);
    const std::string expected = golden_["decoded"].contains(key)
                                     ? golden_["decoded"][key].get<std::string>()
                                     : as_reference_text(lines_[i]);
    const std::string expected_skip = golden_["decoded_skip"].contains(key)
                                          ? golden_["decoded_skip"][key].get<std::string>()
                                          : expected;
    const std::string actual = tokenizer_->decode(ids, false);
    const std::string actual_skip = tokenizer_->decode(ids, true);
    if ((actual != expected || actual_skip != expected_skip) && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " line " << i + 1 << "\n  reference " << json(expected)
                    << " / " << json(expected_skip) << "\n  specrun   " << json(actual) << " / "
                    << json(actual_skip);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

void Conformance::DecodeProbes() {
  size_t mismatches = 0;
  for (const json& probe : golden_["probes"]) {
    const std::vector<int32_t> ids = ids_of(probe["ids"]);
    const std::string actual = tokenizer_->decode(ids, false);
    const std::string actual_skip = tokenizer_->decode(ids, true);
    if ((actual != probe["text"] || actual_skip != probe["skip"]) && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " ids " << show(ids) << "\n  reference " << probe["text"]
                    << " / " << probe["skip"] << "\n  specrun   " << json(actual) << " / "
                    << json(actual_skip);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << golden_["probes"].size() << " probes";
}

void Conformance::StreamingMatchesDecode() {
  for (const bool skip : {false, true}) {
    size_t mismatches = 0;
    for (size_t i = 0; i < lines_.size(); ++i) {
      const std::vector<int32_t> ids = ids_of(golden_["lines"][i]);
      text::StreamingDecoder stream(*tokenizer_, skip);
      std::string streamed;
      bool split_character = false;
      for (const int32_t id : ids) {
        const std::string piece = stream.step(id);
        split_character = split_character || !text::is_valid_utf8(piece);
        streamed += piece;
      }
      streamed += stream.flush();
      const std::string expected = tokenizer_->decode(ids, skip);
      if ((streamed != expected || split_character) && ++mismatches <= 5) {
        ADD_FAILURE() << GetParam() << " line " << i + 1 << " skip=" << skip << "\n  decode "
                      << json(expected) << "\n  stream " << json(streamed)
                      << (split_character ? " (a piece split a character)" : "");
      }
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST_P(Conformance, MatchesTheGoldenFiles) {
  {
    SCOPED_TRACE("EncodeEveryLine");
    EncodeEveryLine();
  }
  {
    SCOPED_TRACE("EncodeWithSpecialTokens");
    EncodeWithSpecialTokens();
  }
  {
    SCOPED_TRACE("EncodeMultiLineBlocks");
    EncodeMultiLineBlocks();
  }
  {
    SCOPED_TRACE("DecodeEveryLine");
    DecodeEveryLine();
  }
  {
    SCOPED_TRACE("DecodeProbes");
    DecodeProbes();
  }
  {
    SCOPED_TRACE("StreamingMatchesDecode");
    StreamingMatchesDecode();
  }
}

// Random text generated now, tokenized by the reference now: catches what a fixed corpus misses.
TEST_P(Conformance, LiveRandomText) {
  const std::string python = reference_python();
  if (python.empty()) {
    GTEST_SKIP() << "no reference: the project venv cannot import tokenizers (run bash "
                    "tools/setup-python.sh tokenizers)";
  }
  const testing::CommandResult result = testing::run_command(
      "'" + python + "' -B '" + testing::source_path("tools/tokenizer/live_sample.py").string() +
      "' '" + tokenizer_json(GetParam()).string() + "' 400 " + std::to_string(GetParam().size()));
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  std::istringstream samples(result.stdout_text);
  std::string line;
  size_t count = 0;
  size_t mismatches = 0;
  while (std::getline(samples, line)) {
    const json sample = json::parse(line);
    const std::string textual = sample["text"].get<std::string>();
    const std::vector<int32_t> ids = tokenizer_->encode(textual, false);
    const std::string decoded = tokenizer_->decode(ids, false);
    ++count;
    if ((ids != ids_of(sample["ids"]) || decoded != sample["decoded"]) && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " " << json(textual) << "\n  reference " << sample["ids"]
                    << " " << sample["decoded"] << "\n  specrun   " << show(ids) << " "
                    << json(decoded);
    }
  }
  EXPECT_GT(count, 0u);
  EXPECT_EQ(mismatches, 0u) << "of " << count << " samples";
}

INSTANTIATE_TEST_SUITE_P(Families, Conformance,
                         ::testing::Values("llama3", "llama2", "qwen3", "llama3_1", "gemma3",
                                           "deepseek_v3", "gptoss"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace specrun
