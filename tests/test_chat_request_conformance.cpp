// OpenAI chat requests rendered to prompts against Hugging Face transformers, on the real chat
// templates in ../shared/tokenizers: tests/reference/chat_request_reference.py renders request
// bodies (tools, a history of assistant tool calls and tool results, chat_template_kwargs,
// continue_final_message) as vLLM serves them, through apply_chat_template. The server's path
// (parse_chat_prompt, then render_chat_prompt: the one renderer of the server and `specrun
// template`) must give the same text byte for byte, or raise where transformers raised; tools for
// a template without a tool-call format specrun reads are refused instead. `specrun template`
// prints the same text, and with --ids the same token ids. Skipped without the venv's
// transformers or ../shared/tokenizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/server/openai.h"
#include "tests/test_support.h"

namespace specrun::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr size_t kMinimumCases = 80;
constexpr int kMismatchesShown = 5;

class ChatRequestConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string python = testing::venv_python_with("transformers, jinja2");
    if (python.empty()) {
      skip_ =
          "no transformers and jinja2 in the project venv (bash tools/setup-python.sh "
          "transformers)";
      return;
    }
    const fs::path tokenizers = testing::shared_path("tokenizers");
    if (!fs::is_directory(tokenizers)) {
      skip_ = tokenizers.string() + " is absent (the tokenizer files come from ../shared)";
      return;
    }
    out_ = new testing::TempDir();
    const std::string command =
        "'" + python + "' -B '" +
        testing::source_path("tests/reference/chat_request_reference.py").string() + "' --out '" +
        (out_->path() / "requests.json").string() + "' --tokenizers '" + tokenizers.string() +
        "' 2>&1";
    const testing::CommandResult reference = testing::run_command(command);
    if (reference.exit_code != 0) {
      skip_ = "";
      failure_ = command + "\n" + reference.stdout_text;
      return;
    }
    reference_ = new json(json::parse(testing::read_file(out_->path() / "requests.json")));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete out_;
    reference_ = nullptr;
    out_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failure_.empty()) << failure_;
  }

  // The model's template as the server loads it: its text, with its BOS and EOS texts.
  static ChatTemplate load(const json& model) {
    EngineInfo info;
    info.chat_template = model["source"].get<std::string>();
    info.chat_template_origin = model["directory"].get<std::string>() + "/tokenizer_config.json";
    info.bos_token = model["bos_token"].get<std::string>();
    info.eos_token = model["eos_token"].get<std::string>();
    return *ChatTemplate::load(info);
  }

  static inline std::string skip_;     // why the suite is skipped; "" where it runs
  static inline std::string failure_;  // the reference's failure
  static inline testing::TempDir* out_ = nullptr;
  static inline json* reference_ = nullptr;
};

bool has_tools(const json& body) {
  return body.contains("tools") && !body["tools"].empty();
}

TEST_F(ChatRequestConformance, TheServersPromptsAreTransformers) {
  std::map<std::string, ChatTemplate> templates;
  for (const auto& [name, model] : (*reference_)["models"].items()) {
    templates.emplace(name, load(model));
  }
  size_t equal = 0, raised = 0, refused = 0, mismatches = 0;
  const json& cases = (*reference_)["cases"];
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& expected = cases[i];
    const std::string name = expected["model"].get<std::string>();
    const ChatTemplate& chat_template = templates.at(name);
    std::string rendered, error, param;
    try {
      rendered = render_chat_prompt(chat_template, parse_chat_prompt(expected["body"].dump()));
    } catch (const ApiException& thrown) {
      error = thrown.what();
      param = thrown.error().param;
    }
    bool matched = false;
    const bool readable = tool_call_format(chat_template.source()) != ToolCallFormat::kNone;
    if (has_tools(expected["body"]) && !readable) {
      // A template teaching no tool-call format specrun reads: tools are refused, naming them.
      matched = param == "tools";
      refused += matched;
    } else if (expected.contains("output")) {
      matched = error.empty() && rendered == expected["output"].get<std::string>();
      equal += matched;
    } else {
      matched = !error.empty() && param == "messages";
      raised += matched;
    }
    if (!matched && ++mismatches <= kMismatchesShown) {
      ADD_FAILURE() << name << " request " << i << ": " << expected["body"].dump()
                    << "\n  transformers: "
                    << (expected.contains("output") ? json(expected["output"]).dump()
                                                    : expected["error"].get<std::string>() + ": " +
                                                          expected["message"].get<std::string>())
                    << "\n  specrun:      " << (error.empty() ? json(rendered).dump() : error);
    }
  }
  std::cout << "[ chat requests ] " << cases.size() << " requests: " << equal << " rendered equal, "
            << raised << " raised as transformers did, " << refused
            << " tools refused for a template without a tool-call format, " << mismatches
            << " mismatches\n";
  EXPECT_GE(cases.size(), kMinimumCases);
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(mismatches, 0u);
}

// `specrun template --tokenizer DIR FILE` prints what transformers rendered (for every rendered
// request on the templates that read tools, and one request of each other template), and with
// --ids the ids transformers encodes it to (once a template).
TEST_F(ChatRequestConformance, SpecrunTemplatePrintsTransformersPrompt) {
  const std::string specrun = testing::tool_path("specrun").string();
  std::map<std::string, int> shown;
  std::map<std::string, int> with_ids;
  size_t checked = 0;
  const json& cases = (*reference_)["cases"];
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& expected = cases[i];
    const std::string name = expected["model"].get<std::string>();
    const json& model = (*reference_)["models"][name];
    const bool readable =
        tool_call_format(model["source"].get<std::string>()) != ToolCallFormat::kNone;
    if (!expected.contains("output") || (has_tools(expected["body"]) && !readable)) continue;
    if (!readable && shown[name]++ > 0) continue;
    SCOPED_TRACE(name + " request " + std::to_string(i));
    const fs::path body = out_->path() / ("body" + std::to_string(i) + ".json");
    testing::write_file(body, expected["body"].dump());
    const std::string tokenizer = model["directory"].get<std::string>();
    const testing::CommandResult text = testing::run_command(
        "'" + specrun + "' template --tokenizer '" + tokenizer + "' '" + body.string() + "'");
    ASSERT_EQ(text.exit_code, 0) << text.stdout_text;
    EXPECT_EQ(text.stdout_text, expected["output"].get<std::string>());
    ++checked;
    if (with_ids[name]++ > 0) continue;  // the ids once a template: encoding is tested elsewhere
    const testing::CommandResult ids =
        testing::run_command("'" + specrun + "' template --ids --tokenizer '" + tokenizer +
                             "' < '" + body.string() + "'");
    ASSERT_EQ(ids.exit_code, 0) << ids.stdout_text;
    const json printed = json::parse(ids.stdout_text);
    EXPECT_EQ(printed["prompt"], expected["output"]);
    EXPECT_EQ(printed["token_ids"], expected["token_ids"]);
  }
  EXPECT_GE(checked, 15u);
}

}  // namespace
}  // namespace specrun::server
