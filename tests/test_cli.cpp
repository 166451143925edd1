// The command-line tools as a user runs them: token ids alone on stdout, stats on stderr, and for
// every malformed input a non-zero exit with exactly one "specrun: error: " line naming the
// culprit, nothing on stdout, and no crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/model/safetensors.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::TempDir;

// Single-quoted for the shell.
std::string quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

CommandResult run_tool(const std::string& tool, const std::string& arguments) {
  return testing::run_command(quote(testing::tool_path(tool).string()) + " " + arguments);
}

std::vector<int64_t> parse_ids(const std::string& text) {
  std::istringstream stream(text);
  std::vector<int64_t> ids;
  int64_t id = 0;
  while (stream >> id) ids.push_back(id);
  return ids;
}

// The failure contract: exit code non-zero, stdout empty, stderr one line
// "<program>: error: ..." that holds, for each group, at least one of its spellings.
void expect_one_error_line(const CommandResult& result,
                           std::initializer_list<std::vector<std::string>> groups,
                           const std::string& program = "specrun") {
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.exit_code, -1) << "did not exit normally (crash?)";
  EXPECT_EQ(result.stdout_text, "");
  const std::string& err = result.stderr_text;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "stderr:\n" << err;
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.back(), '\n') << err;
  const std::string prefix = program + ": error: ";
  EXPECT_EQ(err.rfind(prefix, 0), 0u) << "stderr does not start with '" << prefix << "': " << err;
  for (const std::vector<std::string>& spellings : groups) {
    EXPECT_TRUE(std::any_of(spellings.begin(), spellings.end(),
                            [&](const std::string& s) { return err.find(s) != std::string::npos; }))
        << "stderr names none of '" << spellings.front() << "'...: " << err;
  }
}

// One good checkpoint for the whole suite; cases that damage it work on a copy.
class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = std::make_unique<TempDir>();
    fixtures::GeneratorOptions options;
    options.eos_token_id = 2;
    fixtures::write_random_checkpoint(options, good_model());
  }
  static void TearDownTestSuite() { root_.reset(); }

  static fs::path good_model() { return root_->path() / "good"; }

  // A copy of the good checkpoint in this test's own directory.
  fs::path copy_of_good_model() {
    const fs::path copy = dir_ / "model";
    fs::copy(good_model(), copy, fs::copy_options::recursive);
    return copy;
  }

  // Runs specrun on `target` with the given extra arguments, on one thread.
  static CommandResult specrun(const fs::path& target, const std::string& arguments) {
    return run_tool("specrun", "--threads 1 --target " + quote(target.string()) + " " + arguments);
  }

  static std::unique_ptr<TempDir> root_;
  TempDir dir_;
};

std::unique_ptr<TempDir> CliTest::root_;

TEST_F(CliTest, HelpDocumentsEveryFlag) {
  const CommandResult result = run_tool("specrun", "--help");
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* flag : {"--target", "--prompt-ids", "--max-tokens", "--temperature", "--top-k",
                           "--top-p", "--min-p", "--seed", "--ignore-eos", "--threads",
                           "--kv-cache-tokens", "--rope-style", "--log-level", "--quiet"}) {
    EXPECT_NE(result.stdout_text.find(flag), std::string::npos) << flag;
  }
}

// Every row of the setting tables is a flag (--key, dashes for underscores): taken, and refused
// out of range in one line naming the flag, by the same row the TOML file and the server read.
TEST_F(CliTest, TakesAFlagForEveryRowOfTheSettingTables) {
  const EngineConfig defaults;
  const auto walk = [&](auto rows, const auto& default_settings) {
    for (const auto& row : rows) {
      std::string flag = std::string("--") + row.key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      SCOPED_TRACE(flag);
      const std::string value = setting_text(testing::other_setting_value(row, default_settings));
      const std::string max_tokens = std::string(row.key) == "max_tokens" ? "" : " --max-tokens 2";
      const CommandResult taken =
          specrun(good_model(), "--prompt-ids 1 --quiet" + max_tokens + " " + flag + " " + value);
      EXPECT_EQ(taken.exit_code, 0) << taken.stderr_text;
      const CommandResult refused =
          specrun(good_model(), "--prompt-ids 1 --quiet " + flag + "=" +
                                    setting_text(testing::bad_setting_value(row)));
      expect_one_error_line(refused, {{flag}, {"must be"}});
    }
  };
  walk(speculation_settings(), defaults.speculation);
  walk(sampling_settings(), defaults.sampling);
}

TEST_F(CliTest, GoodRunPrintsIdsOnStdoutAndStatsOnStderr) {
  const CommandResult result =
      specrun(good_model(), "--prompt-ids 1,17,200 --max-tokens 12 --ignore-eos --temperature 0");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  // Only ids, single spaces, one newline.
  EXPECT_EQ(result.stdout_text.find_first_not_of("0123456789 \n"), std::string::npos)
      << result.stdout_text;
  EXPECT_EQ(result.stdout_text.back(), '\n');
  EXPECT_EQ(result.stdout_text.find("  "), std::string::npos);
  const std::vector<int64_t> ids = parse_ids(result.stdout_text);
  EXPECT_EQ(ids.size(), 12u) << result.stdout_text;
  for (const int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 256);
  }
  EXPECT_NE(result.stderr_text.find("generated"), std::string::npos) << result.stderr_text;
  EXPECT_EQ(result.stderr_text.find("error"), std::string::npos) << result.stderr_text;
}

TEST_F(CliTest, DefaultPromptIsBos) {
  const CommandResult result = specrun(good_model(), "--max-tokens 4 --ignore-eos --quiet");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(parse_ids(result.stdout_text).size(), 4u);
}

TEST_F(CliTest, QuietSuppressesStats) {
  const CommandResult result =
      specrun(good_model(), "--prompt-ids 5 --max-tokens 5 --ignore-eos --quiet");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stderr_text, "");
  EXPECT_EQ(parse_ids(result.stdout_text).size(), 5u);
}

TEST_F(CliTest, GreedyIsDeterministic) {
  const std::string arguments = "--prompt-ids 3,4 --max-tokens 16 --ignore-eos --temperature 0";
  const CommandResult first = specrun(good_model(), arguments + " --seed 1");
  const CommandResult second = specrun(good_model(), arguments + " --seed 2");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  // At temperature 0 the seed does not matter.
  EXPECT_EQ(first.stdout_text, second.stdout_text);
}

TEST_F(CliTest, SeedDeterminesSampledOutput) {
  const std::string arguments = "--prompt-ids 3,4 --max-tokens 24 --ignore-eos --temperature 1.5";
  const CommandResult first = specrun(good_model(), arguments + " --seed 7");
  const CommandResult again = specrun(good_model(), arguments + " --seed 7");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  EXPECT_EQ(first.stdout_text, again.stdout_text);
  EXPECT_EQ(parse_ids(first.stdout_text).size(), 24u);
  // 24 tokens drawn from a 256-token vocabulary: other seeds coinciding on all of them would
  // point at an ignored seed.
  int differing = 0;
  for (const int seed : {8, 9, 10}) {
    const CommandResult other =
        specrun(good_model(), arguments + " --seed " + std::to_string(seed));
    ASSERT_EQ(other.exit_code, 0) << other.stderr_text;
    differing += other.stdout_text != first.stdout_text ? 1 : 0;
  }
  EXPECT_GE(differing, 2);
}

// Output that cannot be written (a full device) fails the run with one line; it never exits 0.
TEST_F(CliTest, UnwritableOutputFails) {
  const CommandResult result =
      specrun(good_model(), "--prompt-ids 1,17 --max-tokens 8 --ignore-eos --quiet >/dev/full");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.exit_code, -1) << "did not exit normally";
  EXPECT_EQ(result.stderr_text.rfind("specrun: error: ", 0), 0u) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("writing the output failed"), std::string::npos)
      << result.stderr_text;
  EXPECT_EQ(std::count(result.stderr_text.begin(), result.stderr_text.end(), '\n'), 1)
      << result.stderr_text;
}

// `specrun template` prints the prompt a chat request renders to, exactly (no newline added), from
// a file or stdin, a bare list of messages or an object like a chat request's body; bad input is
// one line and a non-zero exit. (tests/test_chat_request_conformance.cpp compares it with
// transformers on the real templates.)
TEST_F(CliTest, TemplatePrintsThePromptAChatRequestRendersTo) {
  testing::write_file(dir_ / "t.jinja",
                      "{# <tool_call> #}{{ bos_token }}{% for m in messages %}[{{ m.role }}] "
                      "{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments "
                      "| tojson }}{% endif %};{% endfor %}{% if tools %}{{ tools | length }} "
                      "tools{% endif %}{% if flag is defined %}({{ flag }}){% endif %}"
                      "{% if add_generation_prompt %}[assistant]{% endif %}");
  testing::write_file(dir_ / "list.json", R"([{"role": "user", "content": "Hi"}])");
  const std::string with = "template --chat-template " + quote((dir_ / "t.jinja").string());
  CommandResult result = run_tool("specrun", with + " " + quote((dir_ / "list.json").string()));
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stdout_text, "[user] Hi;[assistant]");
  testing::write_file(dir_ / "body.json", R"({"messages": [{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
      "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "3"}],
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "add_generation_prompt": false, "chat_template_kwargs": {"flag": "on"}})");
  result = run_tool("specrun", with + " < " + quote((dir_ / "body.json").string()));
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stdout_text, R"([user] Hi;[assistant] {"b": 1, "a": 2};[tool] 3;1 tools(on))");
  // A checkpoint (loaded as a run loads it) with the file's template over its own.
  result = run_tool("specrun", with + " --target " + quote(good_model().string()) + " " +
                                   quote((dir_ / "list.json").string()));
  EXPECT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stdout_text.find("[user] Hi;[assistant]"), std::string::npos);

  const std::string list = quote((dir_ / "list.json").string());
  expect_one_error_line(run_tool("specrun", with + " " + quote((dir_ / "none.json").string())),
                        {{"none.json"}, {"no such file"}});
  testing::write_file(dir_ / "bad.json", R"([{"role": "user", "content": )");
  expect_one_error_line(run_tool("specrun", with + " " + quote((dir_ / "bad.json").string())),
                        {{"bad.json"}, {"not valid JSON"}});
  testing::write_file(dir_ / "unknown.json", R"({"messages": [], "max_tokens": 3})");
  expect_one_error_line(run_tool("specrun", with + " " + quote((dir_ / "unknown.json").string())),
                        {{"'max_tokens' is not a key that shapes the prompt"}});
  testing::write_file(dir_ / "role.json", R"([{"role": "narrator", "content": "x"}])");
  expect_one_error_line(run_tool("specrun", with + " " + quote((dir_ / "role.json").string())),
                        {{"messages[0].role"}});
  expect_one_error_line(run_tool("specrun", "template " + list),
                        {{"--target", "--tokenizer", "--chat-template"}});
  expect_one_error_line(run_tool("specrun", with + " --ids " + list), {{"--ids needs"}});
  expect_one_error_line(run_tool("specrun", "template --chat-template " +
                                                quote((dir_ / "no.jinja").string()) + " " + list),
                        {{"no.jinja"}, {"no such chat template file"}});
  // Tools for a template that teaches no call format this server reads: the server's 400.
  testing::write_file(dir_ / "plain.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  expect_one_error_line(
      run_tool("specrun", "template --chat-template " + quote((dir_ / "plain.jinja").string()) +
                              " " + quote((dir_ / "body.json").string())),
      {{"'tools' needs a chat template with a tool-call format"}});
}

// --- Malformed checkpoints ---

TEST_F(CliTest, NonexistentTarget) {
  const fs::path target = dir_ / "no-such-model";
  expect_one_error_line(specrun(target, "--max-tokens 4"),
                        {{target.string()}, {"no such file or directory"}});
}

TEST_F(CliTest, TruncatedSafetensors) {
  const fs::path model = copy_of_good_model();
  const fs::path weights = model / "model.safetensors";
  testing::write_file(weights, testing::read_file(weights).substr(0, 100));
  expect_one_error_line(specrun(model, "--max-tokens 4"), {{weights.string()}});
}

TEST_F(CliTest, GarbageConfig) {
  const fs::path model = copy_of_good_model();
  testing::write_file(model / "config.json", "<html>\n<body>404 Not Found</body>\n</html>\n");
  expect_one_error_line(specrun(model, "--max-tokens 4"),
                        {{(model / "config.json").string()}, {"not valid JSON"}});
}

TEST_F(CliTest, UnknownArchitecture) {
  const fs::path model = copy_of_good_model();
  nlohmann::json config = nlohmann::json::parse(testing::read_file(model / "config.json"));
  config["architectures"] = {"GPT2LMHeadModel"};
  testing::write_file(model / "config.json", config.dump(2));
  expect_one_error_line(specrun(model, "--max-tokens 4"),
                        {{(model / "config.json").string()}, {"GPT2LMHeadModel"}});
}

TEST_F(CliTest, MissingTensor) {
  const fs::path model = copy_of_good_model();
  const fs::path weights = model / "model.safetensors";
  const std::string dropped = "model.layers.1.mlp.gate_proj.weight";
  {
    // Copy every tensor but one out of the mapping, then rewrite the file.
    struct Owned {
      std::string name;
      DType dtype;
      std::vector<int64_t> shape;
      std::vector<std::byte> bytes;
    };
    std::vector<Owned> kept;
    {
      const TensorStore store = TensorStore::open_file(weights);
      for (const TensorInfo* info : store.all()) {
        if (info->name == dropped) continue;
        const auto* begin = static_cast<const std::byte*>(info->data);
        kept.push_back({info->name, info->dtype, info->shape,
                        std::vector<std::byte>(begin, begin + info->size_bytes())});
      }
    }
    std::vector<TensorToWrite> views;
    for (const Owned& t : kept) views.push_back({t.name, t.dtype, t.shape, t.bytes});
    write_safetensors(weights, views);
  }
  expect_one_error_line(specrun(model, "--max-tokens 4"),
                        {{weights.string()}, {"'" + dropped + "'"}});
}

// --- Malformed flags ---

TEST_F(CliTest, BadPromptIds) {
  for (const auto& [value, culprit] : {std::pair<std::string, std::string>{"1,x", "'x'"},
                                       {"", "''"},
                                       {"1,,2", "''"},
                                       {"-3", "'-3'"},
                                       {"1;2", "'1;2'"},
                                       {"99999999999", "'99999999999'"}}) {
    SCOPED_TRACE("--prompt-ids " + value);
    expect_one_error_line(specrun(good_model(), "--max-tokens 4 --prompt-ids " + quote(value)),
                          {{"--prompt-ids"}, {culprit}});
  }
}

TEST_F(CliTest, TokenIdOutsideVocabulary) {
  expect_one_error_line(specrun(good_model(), "--max-tokens 4 --prompt-ids 1,256"),
                        {{"256"}, {"vocabulary"}});
}

TEST_F(CliTest, BadSamplingParameters) {
  for (const auto& [flags, names] :
       {std::pair<std::string, std::vector<std::string>>{"--temperature=-1", {"temperature"}},
        {"--temperature nan", {"temperature"}},
        {"--top-p 0", {"top_p", "top-p"}},
        {"--top-p 1.5", {"top_p", "top-p"}},
        {"--min-p 2", {"min_p", "min-p"}},
        {"--top-k=-1", {"top_k", "top-k"}}}) {
    SCOPED_TRACE(flags);
    expect_one_error_line(specrun(good_model(), "--max-tokens 4 " + flags), {names});
  }
}

TEST_F(CliTest, BadKvCacheTokens) {
  expect_one_error_line(specrun(good_model(), "--max-tokens 4 --kv-cache-tokens=-1"),
                        {{"KV cache", "kv_cache_tokens", "kv-cache-tokens"}});
}

TEST_F(CliTest, BadThreads) {
  // Not through specrun(), which sets --threads itself.
  expect_one_error_line(
      run_tool("specrun", "--max-tokens 4 --threads=-1 --target " + quote(good_model().string())),
      {{"threads"}, {"-1"}});
}

TEST_F(CliTest, MissingSettingsFile) {
  const fs::path settings = dir_ / "absent.toml";
  expect_one_error_line(
      specrun(good_model(), "--max-tokens 4 --config " + quote(settings.string())),
      {{settings.string()}});
}

TEST_F(CliTest, BadRopeStyle) {
  expect_one_error_line(specrun(good_model(), "--max-tokens 4 --rope-style bogus"),
                        {{"--rope-style", "rope_style"}, {"'bogus'"}});
}

TEST_F(CliTest, BadLogLevel) {
  expect_one_error_line(specrun(good_model(), "--max-tokens 4 --log-level bogus"),
                        {{"--log-level"}, {"'bogus'"}});
}

TEST_F(CliTest, DraftWithoutTarget) {
  expect_one_error_line(
      run_tool("specrun", "--max-tokens 4 --draft " + quote(good_model().string())),
      {{"--draft needs --target"}});
}

TEST_F(CliTest, NoTargetAndNoBundledPair) {
  const fs::path empty = dir_ / "no-models";
  fs::create_directories(empty);
  expect_one_error_line(testing::run_command("SPECRUN_MODELS_DIR=" + quote(empty.string()) + " " +
                                             quote(testing::tool_path("specrun").string()) +
                                             " --max-tokens 4 </dev/null"),
                        {{"no --target"}, {"pycode-target"}, {empty.string()}});
}

TEST_F(CliTest, SpecbenchMeasuresSyntheticShapes) {
  const CommandResult result =
      run_tool("specbench",
               "--synthetic tiny --synthetic-draft tiny --device cpu --threads 1 "
               "--context 16 --prompt-tokens 32 --decode-tokens 8 --repeats 1 "
               "--max-verify-tokens 4");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* line : {"device: cpu", "of the floor", "verification / decode step",
                           "prefill: 32 tokens", "draft tiny", "target alone"}) {
    EXPECT_NE(result.stdout_text.find(line), std::string::npos) << line << "\n"
                                                                << result.stdout_text;
  }
  expect_one_error_line(run_tool("specbench", "--synthetic llama-9"), {{"'llama-9'"}}, "specbench");
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --synthetic-draft llama-0"),
                        {{"'llama-0'"}}, "specbench");
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --device tpu"), {{"device 'tpu'"}},
                        "specbench");
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --device cpu --context 0"),
                        {{"--context", "positive"}}, "specbench");
  expect_one_error_line(
      run_tool("specbench", "--synthetic tiny --device cpu --max-verify-tokens 1"),
      {{"--max-verify-tokens", "at least 2"}}, "specbench");
  // Checked before any model is read.
  expect_one_error_line(run_tool("specbench", "--model unused --cpu-kernels avx9"),
                        {{"--cpu-kernels", "'avx9'", "this CPU runs"}}, "specbench");
}

TEST_F(CliTest, SpecbenchMeasuresDecodeBesideBusyCores) {
  const CommandResult result =
      run_tool("specbench", "--model " + quote(good_model().string()) +
                                " --threads 2 --prompt-tokens 8 --decode-tokens 2 --repeats 1 "
                                "--busy-cores 1");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* line : {"as stored", "1 busy"}) {
    EXPECT_NE(result.stdout_text.find(line), std::string::npos) << line << "\n"
                                                                << result.stdout_text;
  }
  // Checked before any model is read.
  expect_one_error_line(run_tool("specbench", "--model unused --busy-cores -1"),
                        {{"--busy-cores", "negative"}}, "specbench");
}

TEST_F(CliTest, SpecbenchMeasuresSamplingPerRow) {
  const CommandResult result = run_tool("specbench", "--sampling 1000 --repeats 1");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* line :
       {"a row of 1000 logits", "greedy", "T 0.7, top-p 0.9", "T 0.7, top-k 40"}) {
    EXPECT_NE(result.stdout_text.find(line), std::string::npos) << line << "\n"
                                                                << result.stdout_text;
  }
  expect_one_error_line(run_tool("specbench", "--sampling 1"), {{"--sampling", "at least 2"}},
                        "specbench");
  expect_one_error_line(run_tool("specbench", "--sampling 100 --repeats 0"), {{"--repeats"}},
                        "specbench");
}

TEST_F(CliTest, SpecbenchMeasuresOneMatmulPerWeightFormatAndActivations) {
  const fs::path json_path = dir_ / "matmul.json";
  const CommandResult result =
      run_tool("specbench",
               "--matmul 3x70x9 --quantize fp8,int8 --activations bf16,int8 "
               "--threads 1 --repeats 1 --json " +
                   quote(json_path.string()));
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stdout_text.find("matmul: [3, 70] x [9, 70]^T"), std::string::npos)
      << result.stdout_text;
  const nlohmann::json report = nlohmann::json::parse(testing::read_file(json_path));
  // bf16, FP8 and INT8 weights with f32 and bf16 activations; bf16 and INT8 ones with int8 (FP8
  // weights meet int8's bf16 activations, measured already).
  std::set<std::pair<std::string, std::string>> measured;
  for (const nlohmann::json& row : report["results"]) {
    EXPECT_GT(row["us_per_call"].get<double>(), 0.0);
    measured.emplace(row["weights"], row["activations"]);
    if (row["weights"] == "bf16") {
      EXPECT_EQ(row["speedup_vs_bf16_weights"].get<double>(), 1.0);
    }
  }
  const std::set<std::pair<std::string, std::string>> expected = {
      {"bf16", "f32"}, {"fp8", "f32"},   {"int8", "f32"},  {"bf16", "bf16"},
      {"fp8", "bf16"}, {"int8", "bf16"}, {"bf16", "int8"}, {"int8", "int8"}};
  EXPECT_EQ(measured, expected);
  for (const char* shape : {"1x40x", "0x4x4", "1x4x4x4", "axbxc"}) {
    expect_one_error_line(run_tool("specbench", std::string("--matmul ") + shape),
                          {{"--matmul", "ROWSxINxOUT", shape}}, "specbench");
  }
  expect_one_error_line(run_tool("specbench", "--matmul 1x8x8 --quantize nf4"),
                        {{"--quantize", "'nf4'"}}, "specbench");
  // Copies of the weights taken in turn, as a model's layers are.
  const CommandResult copied =
      run_tool("specbench", "--matmul 2x64x8 --matmul-copies 3 --threads 1 --repeats 1 --json " +
                                quote(json_path.string()));
  ASSERT_EQ(copied.exit_code, 0) << copied.stderr_text;
  EXPECT_NE(copied.stdout_text.find("3 copies of the weights"), std::string::npos)
      << copied.stdout_text;
  const nlohmann::json copied_report = nlohmann::json::parse(testing::read_file(json_path));
  EXPECT_EQ(copied_report["weight_copies"], 3);
  EXPECT_EQ(copied_report["results"][0]["weight_bytes"], 2 * 64 * 8);  // one copy's
  expect_one_error_line(run_tool("specbench", "--matmul 1x8x8 --matmul-copies 0"),
                        {{"--matmul-copies", "0"}}, "specbench");
}

TEST_F(CliTest, SpecbenchMeasuresQuantizedSyntheticTargetsAgainstBf16) {
  const CommandResult result =
      run_tool("specbench",
               "--synthetic tiny --synthetic-draft \"\" --device cpu --threads 1 --quantize int8 "
               "--context 16 --prompt-tokens 32 --decode-tokens 8 --repeats 1 "
               "--max-verify-tokens 5 --kv-cache-tokens 512");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* line : {"baseline tiny bf16: decode", "int8; decode at batch 1",
                           "int8 against bf16, same run: decode",
                           "int8 against bf16, same run: verification of 5 tokens"}) {
    EXPECT_NE(result.stdout_text.find(line), std::string::npos) << line << "\n"
                                                                << result.stdout_text;
  }
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --device cpu --quantize fp8,int8"),
                        {{"--quantize with --synthetic", "one of"}}, "specbench");
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --device cpu --quantize fp4"),
                        {{"--quantize", "'fp4'"}}, "specbench");
  // The CPU measurement's activations: a known name, and int8 only beside the INT8 weights it
  // measures (refused before any model is generated).
  expect_one_error_line(run_tool("specbench", "--activations int8 --quantize fp8"),
                        {{"--activations int8", "--quantize int8"}}, "specbench");
  const CommandResult bad_activations = run_tool("specbench", "--activations fp16");
  EXPECT_NE(bad_activations.exit_code, 0);
  EXPECT_NE(bad_activations.stderr_text.find("--activations"), std::string::npos)
      << bad_activations.stderr_text;
  const CommandResult bad_cache = run_tool("specbench", "--synthetic tiny --kv-cache-dtype f16");
  EXPECT_NE(bad_cache.exit_code, 0);
  EXPECT_NE(bad_cache.stderr_text.find("--kv-cache-dtype"), std::string::npos)
      << bad_cache.stderr_text;
  EXPECT_NE(bad_cache.stderr_text.find("bf16, f32"), std::string::npos) << bad_cache.stderr_text;
  expect_one_error_line(run_tool("specbench", "--synthetic tiny --device cpu --kv-cache-tokens 10"),
                        {{"--kv-cache-tokens 10", "below"}}, "specbench");
}

TEST_F(CliTest, GenmodelBadDtype) {
  const fs::path out = dir_ / "generated";
  const CommandResult result =
      run_tool("specrun-genmodel", "--out " + quote(out.string()) + " --dtype bogus");
  expect_one_error_line(result, {{"--dtype"}, {"'bogus'"}}, "specrun-genmodel");
  EXPECT_FALSE(fs::exists(out / "config.json"));
}

TEST_F(CliTest, GenmodelWritesLoadableModel) {
  const fs::path out = dir_ / "generated";
  const CommandResult made =
      run_tool("specrun-genmodel", "--out " + quote(out.string()) + " --dtype f16 --layers 1");
  ASSERT_EQ(made.exit_code, 0) << made.stderr_text;
  EXPECT_EQ(made.stderr_text, "");
  const CommandResult result = specrun(out, "--max-tokens 3 --ignore-eos --quiet");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(parse_ids(result.stdout_text).size(), 3u);
}

// ---- speculative decoding from the command line ------------------------------------------------

// A layer-skip pair: a target whose deep layers change little, and its first layer as the draft.
class CliSpeculativeTest : public CliTest {
 protected:
  void SetUp() override {
    fixtures::GeneratorOptions options;
    options.shallow_layers = 1;
    options.deep_layer_scale = 0.3f;
    fixtures::write_random_checkpoint(options, dir_ / "target");
    fixtures::write_truncated_checkpoint(dir_ / "target", 1, dir_ / "draft");
  }
  // Greedy unless `arguments` name a temperature.
  CommandResult run(const std::string& arguments) {
    const bool sampled = arguments.find("--temperature") != std::string::npos;
    return specrun(dir_ / "target",
                   std::string("--prompt-ids 1,17,200 --max-tokens 30 --ignore-eos ") +
                       (sampled ? "" : "--temperature 0 ") + arguments);
  }
};

TEST_F(CliSpeculativeTest, HelpDocumentsTheSpeculativeFlags) {
  const CommandResult result = run_tool("specrun", "--help");
  for (const char* flag :
       {"--draft", "--gamma", "--no-draft", "--stats-json", "--prompt ", "--config", "--method",
        "--controller", "--verification", "--quantize", "--draft-quantize", "--quantize-lm-head",
        "--kv-cache-dtype", "--overlap-drafting", "--activations"}) {
    EXPECT_NE(result.stdout_text.find(flag), std::string::npos) << flag;
  }
}

TEST_F(CliSpeculativeTest, SpeculativeOutputEqualsTargetAlone) {
  const CommandResult alone = run("--no-draft --quiet");
  ASSERT_EQ(alone.exit_code, 0) << alone.stderr_text;
  EXPECT_EQ(parse_ids(alone.stdout_text).size(), 30u);
  for (const std::string flags :
       {"--controller goodput", "--controller heuristic --gamma 6", "--controller fixed --gamma 3",
        "--method prompt_lookup", "--no-prefix-cache", "--overlap-drafting on --gamma 3",
        "--overlap-drafting off"}) {
    const CommandResult speculative =
        run("--draft " + quote((dir_ / "draft").string()) + " --quiet " + flags);
    ASSERT_EQ(speculative.exit_code, 0) << flags << ": " << speculative.stderr_text;
    EXPECT_EQ(speculative.stdout_text, alone.stdout_text) << flags;
  }
}

TEST_F(CliSpeculativeTest, AnF32KvCacheSpeculatesLosslesslyAndABadDtypeIsRefused) {
  // The default bf16 cache and an f32 one: each run's speculative output equals its target-only
  // output.
  for (const std::string cache : {"--kv-cache-dtype f32", "--kv-cache-dtype bf16"}) {
    const CommandResult alone = run("--no-draft --quiet " + cache);
    ASSERT_EQ(alone.exit_code, 0) << cache << ": " << alone.stderr_text;
    EXPECT_EQ(parse_ids(alone.stdout_text).size(), 30u);
    const CommandResult speculative =
        run("--draft " + quote((dir_ / "draft").string()) + " --quiet --gamma 5 " + cache);
    ASSERT_EQ(speculative.exit_code, 0) << cache << ": " << speculative.stderr_text;
    EXPECT_EQ(speculative.stdout_text, alone.stdout_text) << cache;
  }
  const CommandResult unknown = run("--kv-cache-dtype f16");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.stderr_text.find("--kv-cache-dtype"), std::string::npos) << unknown.stderr_text;
  const CommandResult overlap = run("--overlap-drafting sometimes");
  EXPECT_NE(overlap.exit_code, 0);
  EXPECT_NE(overlap.stderr_text.find("--overlap-drafting"), std::string::npos)
      << overlap.stderr_text;
}

TEST_F(CliSpeculativeTest, EitherActivationPrecisionSpeculatesLosslesslyAndABadOneIsRefused) {
  // bf16 weights met by f32 and by bf16 activations (and auto, one of them): each run's
  // speculative output equals its own target-only output.
  for (const std::string activations :
       {"--activations f32", "--activations bf16", "--activations auto"}) {
    const CommandResult alone = run("--no-draft --quiet " + activations);
    ASSERT_EQ(alone.exit_code, 0) << activations << ": " << alone.stderr_text;
    EXPECT_EQ(parse_ids(alone.stdout_text).size(), 30u);
    const CommandResult speculative =
        run("--draft " + quote((dir_ / "draft").string()) + " --quiet --gamma 4 " + activations);
    ASSERT_EQ(speculative.exit_code, 0) << activations << ": " << speculative.stderr_text;
    EXPECT_EQ(speculative.stdout_text, alone.stdout_text) << activations;
  }
  const CommandResult unknown = run("--activations f16");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.stderr_text.find("--activations"), std::string::npos) << unknown.stderr_text;
}

TEST_F(CliSpeculativeTest, QuantizedTargetSpeculatesLosslessly) {
  // With the same quantized target, greedy speculation (with a bf16 or a quantized draft) gives
  // what the quantized target gives alone, INT8 weights meeting int8 activations too; an unknown
  // quantization is refused.
  for (const std::string target :
       {"--quantize int8", "--quantize fp8", "--quantize int8 --quantize-lm-head",
        "--quantize int8 --activations int8"}) {
    const CommandResult alone = run("--no-draft --quiet " + target);
    ASSERT_EQ(alone.exit_code, 0) << target << ": " << alone.stderr_text;
    EXPECT_EQ(parse_ids(alone.stdout_text).size(), 30u);
    for (const std::string draft : {"", " --draft-quantize fp8 --gamma 5"}) {
      const CommandResult speculative = run("--draft " + quote((dir_ / "draft").string()) +
                                            " --quiet --controller fixed " + target + draft);
      ASSERT_EQ(speculative.exit_code, 0) << target << draft << ": " << speculative.stderr_text;
      EXPECT_EQ(speculative.stdout_text, alone.stdout_text) << target << draft;
    }
  }
  const CommandResult unknown = run("--quantize int4");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.stderr_text.find("--quantize"), std::string::npos) << unknown.stderr_text;
}

TEST_F(CliSpeculativeTest, SeededSampledOutputEqualsTargetAloneUnderSharedNoise) {
  // The default verification: a seed gives the target-alone output whatever the drafting.
  const std::string sampled = " --temperature 0.9 --top-p 0.95 --seed 11 --quiet";
  const CommandResult alone = run("--no-draft" + sampled);
  ASSERT_EQ(alone.exit_code, 0) << alone.stderr_text;
  for (const std::string flags :
       {"--controller goodput", "--controller heuristic --gamma 6", "--controller fixed --gamma 3",
        "--method prompt_lookup", "--verification shared_noise --gamma 1"}) {
    const CommandResult speculative =
        run("--draft " + quote((dir_ / "draft").string()) + sampled + " " + flags);
    ASSERT_EQ(speculative.exit_code, 0) << flags << ": " << speculative.stderr_text;
    EXPECT_EQ(speculative.stdout_text, alone.stdout_text) << flags;
  }
  // Rejection sampling draws otherwise; an unknown verification is refused.
  const CommandResult rejection =
      run("--draft " + quote((dir_ / "draft").string()) + sampled + " --verification rejection");
  ASSERT_EQ(rejection.exit_code, 0) << rejection.stderr_text;
  EXPECT_NE(rejection.stdout_text, alone.stdout_text);
  const CommandResult unknown = run("--verification gumbel");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.stderr_text.find("--verification"), std::string::npos) << unknown.stderr_text;
}

TEST_F(CliSpeculativeTest, StatsOnStderrAndAsJson) {
  const fs::path json_path = dir_ / "stats.json";
  const CommandResult result =
      run("--draft " + quote((dir_ / "draft").string()) +
          " --controller fixed --gamma 4 --stats-json " + quote(json_path.string()));
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  for (const char* figure : {"time to first token", "inter-token latency", "tokens/s", "acceptance",
                             "gamma histogram", "draft", "target"}) {
    EXPECT_NE(result.stderr_text.find(figure), std::string::npos) << figure;
  }
  const nlohmann::json stats = nlohmann::json::parse(testing::read_file(json_path));
  for (const char* key : {"tokens_generated", "ttft_ms", "itl_ms_mean", "itl_ms_p50", "itl_ms_p99",
                          "tokens_per_second", "acceptance_rate", "mean_accepted_length",
                          "gamma_histogram", "draft_ms", "target_ms", "cached_prompt_tokens"}) {
    EXPECT_TRUE(stats.contains(key)) << key;
  }
  EXPECT_EQ(stats["tokens_generated"], 30);
  // What the steps waited for and read back: once a step for its verdict, and for the draft's
  // draws (a SampledRow each, never a row of logits) once more, or once a draft position where
  // prompt lookup joins them (the default).
  EXPECT_GE(stats["host_waits"].get<int64_t>(), stats["steps"].get<int64_t>());
  EXPECT_LE(stats["host_waits"].get<int64_t>(), stats["steps"].get<int64_t>() * 5);
  EXPECT_GT(stats["bytes_to_host"].get<uint64_t>(), 0u);
  EXPECT_EQ(stats["method"], "draft");
  EXPECT_EQ(stats["verification"], "shared_noise");
  // What the CPU multiplied with, in the JSON and on stderr.
  const std::string activations = stats["activations"].get<std::string>();
  EXPECT_TRUE(activations == "bf16" || activations == "f32 (int8 for GGUF blocks)") << activations;
  EXPECT_FALSE(stats["cpu_kernels"].get<std::string>().empty());
  EXPECT_NE(result.stderr_text.find("on cpu (" + stats["cpu_kernels"].get<std::string>() +
                                    " kernels, " + activations + " activations) with"),
            std::string::npos)
      << result.stderr_text;
  // The memory plan: both models counted, on stderr and in the JSON.
  EXPECT_NE(result.stderr_text.find("specrun: memory plan on cpu: target"), std::string::npos)
      << result.stderr_text;
  EXPECT_GT(stats["memory"]["draft"]["weight_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(stats["memory"]["total_bytes"].get<uint64_t>(),
            stats["memory"]["target"]["weight_bytes"].get<uint64_t>());
  int64_t steps = 0;
  for (const auto& [gamma, count] : stats["gamma_histogram"].items()) {
    EXPECT_LE(std::stoi(gamma), 4);
    steps += count.get<int64_t>();
  }
  EXPECT_EQ(steps, stats["steps"].get<int64_t>());
}

TEST_F(CliSpeculativeTest, CompareRerunsOnTheTargetAloneAndReportsTheSpeedup) {
  const fs::path json_path = dir_ / "stats.json";
  const CommandResult result = run("--draft " + quote((dir_ / "draft").string()) +
                                   " --compare --stats-json " + quote(json_path.string()));
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(parse_ids(result.stdout_text).size(), 30u);  // the text is shown once
  EXPECT_NE(result.stderr_text.find("the target alone on the same request"), std::string::npos)
      << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("(same output)"), std::string::npos) << result.stderr_text;
  EXPECT_NE(result.stderr_text.find("(median of 3 alternating rounds, range "), std::string::npos)
      << result.stderr_text;
  const nlohmann::json stats = nlohmann::json::parse(testing::read_file(json_path));
  EXPECT_GT(stats["baseline_tokens_per_second"].get<double>(), 0.0);
  // Three rounds by default: the median ratio between the extremes.
  ASSERT_EQ(stats["speedups"].size(), 3u);
  std::vector<double> speedups = stats["speedups"].get<std::vector<double>>();
  std::sort(speedups.begin(), speedups.end());
  EXPECT_GT(speedups[0], 0.0);
  EXPECT_EQ(stats["speedup"].get<double>(), speedups[1]);
  EXPECT_EQ(stats["speedup_min"].get<double>(), speedups[0]);
  EXPECT_EQ(stats["speedup_max"].get<double>(), speedups[2]);
  EXPECT_EQ(stats["baseline_same_output"], true);  // greedy: the target's own tokens

  // One round: the ratio of this run's speed to the target alone's.
  const CommandResult once =
      run("--draft " + quote((dir_ / "draft").string()) +
          " --compare --compare-rounds 1 --stats-json " + quote(json_path.string()));
  ASSERT_EQ(once.exit_code, 0) << once.stderr_text;
  EXPECT_EQ(once.stderr_text.find("alternating rounds"), std::string::npos) << once.stderr_text;
  const nlohmann::json single = nlohmann::json::parse(testing::read_file(json_path));
  EXPECT_NEAR(single["speedup"].get<double>(),
              single["tokens_per_second"].get<double>() /
                  single["baseline_tokens_per_second"].get<double>(),
              1e-9);
  expect_one_error_line(
      run("--draft " + quote((dir_ / "draft").string()) + " --compare --compare-rounds 0"),
      {{"--compare-rounds"}, {"at least 1"}, {"0"}});

  // Without speculation there is nothing to compare.
  const CommandResult plain = run("--no-draft --compare --stats-json " + quote(json_path.string()));
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  EXPECT_EQ(plain.stderr_text.find("the target alone"), std::string::npos) << plain.stderr_text;
  EXPECT_FALSE(nlohmann::json::parse(testing::read_file(json_path)).contains("speedup"));
}

TEST_F(CliSpeculativeTest, BadSpeculativeInputIsOneLine) {
  fixtures::GeneratorOptions other;
  other.vocab_size = 300;
  fixtures::write_random_checkpoint(other, dir_ / "other");
  expect_one_error_line(run("--draft " + quote((dir_ / "other").string())),
                        {{"vocab_size"}, {"draft"}});
  expect_one_error_line(run("--draft " + quote((dir_ / "missing").string())), {{"missing"}});
  expect_one_error_line(run("--draft " + quote((dir_ / "draft").string()) + " --gamma 100"),
                        {{"gamma"}});
  expect_one_error_line(run("--gamma -1"), {{"gamma"}});
  expect_one_error_line(specrun(dir_ / "target", "--prompt hello"),
                        {{"tokenizer.json"}, {"--prompt-ids"}});
  expect_one_error_line(specrun(dir_ / "target", "--prompt hello --prompt-ids 1"), {{"--prompt"}});
  expect_one_error_line(run("--stats-json " + quote((dir_ / "no" / "such" / "x.json").string())),
                        {{"x.json"}});
  const CommandResult bad_method = run("--method medusa");
  EXPECT_NE(bad_method.exit_code, 0);
  EXPECT_TRUE(bad_method.stdout_text.empty());
}

// The draft's recipe at its quick size writes no demo's draft: it wants a work folder, and says so
// before it builds or installs anything.
TEST(DistillScript, QuickWithoutAWorkFolderIsRefused) {
  const testing::CommandResult result = testing::run_command(
      "bash '" + testing::source_path("tools/pair/distill.sh").string() + "' --quick");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.stderr_text.find("--quick needs a WORK_DIR"), std::string::npos)
      << result.stderr_text;
}

// --from continues an exported feature draft: it wants one that exists, and not with --plain.
TEST(DistillScript, FromWithoutADraftOrWithPlainIsRefused) {
  const std::string script =
      "bash '" + testing::source_path("tools/pair/distill.sh").string() + "'";
  const testing::CommandResult missing =
      testing::run_command(script + " --quick --from /nonexistent/draft.gguf /tmp/unused");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.stderr_text.find("--from needs an exported feature draft's GGUF file, got "
                                     "'/nonexistent/draft.gguf'"),
            std::string::npos)
      << missing.stderr_text;
  const std::string shipped = testing::source_path("models/smollm2-draft/draft.gguf").string();
  const testing::CommandResult plain =
      testing::run_command(script + " --plain --from '" + shipped + "' /tmp/unused");
  EXPECT_EQ(plain.exit_code, 2);
  EXPECT_NE(plain.stderr_text.find("--from continues a feature draft, not the --plain one"),
            std::string::npos)
      << plain.stderr_text;
}

// --questions takes a positive count of questions, refused otherwise before anything runs.
TEST(DistillScript, QuestionsWantAPositiveCount) {
  const std::string script =
      "bash '" + testing::source_path("tools/pair/distill.sh").string() + "'";
  for (const std::string count : {"0", "-3", "many", ""}) {
    const testing::CommandResult result =
        testing::run_command(script + " --questions '" + count + "' /tmp/unused");
    EXPECT_EQ(result.exit_code, 2) << count;
    EXPECT_NE(result.stderr_text.find("--questions needs a positive count, got '" + count + "'"),
              std::string::npos)
        << result.stderr_text;
  }
}

// tools/pair/measure-tokens-per-step.py refuses a shape that is not GAMMA:ALTERNATES with a
// positive gamma, and a draft that is not a file, in one line each, before running anything.
TEST(MeasureTokensPerStep, BadShapesAndMissingDraftsAreRefused) {
  const std::string script =
      "python3 '" + testing::source_path("tools/pair/measure-tokens-per-step.py").string() + "'";
  const std::string draft = testing::source_path("models/smollm2-draft/draft.gguf").string();
  for (const std::string shape : {"2", "0:1", "two:1", "2:-1"}) {
    const testing::CommandResult result = testing::run_command(
        script + " --draft '" + draft + "' --shape '" + shape + "' --out /tmp/unused.json");
    EXPECT_EQ(result.exit_code, 2) << shape;
    EXPECT_NE(
        result.stderr_text.find("--shape takes GAMMA:ALTERNATES (e.g. 2:1), got '" + shape + "'"),
        std::string::npos)
        << result.stderr_text;
  }
  const testing::CommandResult missing = testing::run_command(
      script + " --draft /nonexistent/draft.gguf --shape 2:1 --out /tmp/unused.json");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.stderr_text.find("--draft /nonexistent/draft.gguf: no such file"),
            std::string::npos)
      << missing.stderr_text;
}

}  // namespace

// --chat: the prompt becomes the one user message of the checkpoint's chat template, tokenized
// without added special tokens (the template writes them), exactly as the server's chat endpoint.
TEST(CliChatTest, ChatFormatsThePromptWithTheCheckpointsTemplate) {
  TempDir dir;
  const fs::path plain = dir.path() / "plain";
  const fs::path chat = dir.path() / "chat";
  for (const fs::path& copy : {plain, chat}) {
    fs::copy(testing::source_path("models/pycode-target"), copy, fs::copy_options::recursive);
  }
  const std::string jinja =
      "{% for m in messages %}{{ bos_token }}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
      "{% if add_generation_prompt %} [assistant]{% endif %}";
  nlohmann::json tokenizer_config =
      nlohmann::json::parse(testing::read_file(chat / "tokenizer_config.json"));
  tokenizer_config["chat_template"] = jinja;
  std::ofstream(chat / "tokenizer_config.json") << tokenizer_config.dump();
  const fs::path template_file = dir.path() / "template.jinja";
  std::ofstream(template_file) << jinja;

  const std::string question = "def add(a, b):";
  const CommandResult ids = testing::run_command(
      "printf '%s\\n' " + quote("<|begin_of_text|>[user] " + question + " [assistant]") + " | " +
      quote(testing::tool_path("specrun").string()) + " tokenize --tokenizer " +
      quote(chat.string()));
  ASSERT_EQ(ids.exit_code, 0) << ids.stderr_text;
  const std::vector<int64_t> rendered =
      nlohmann::json::parse(ids.stdout_text).get<std::vector<int64_t>>();
  std::string id_list;
  for (const int64_t id : rendered) id_list += (id_list.empty() ? "" : ",") + std::to_string(id);

  const std::string common = " --threads 1 --temperature 0 --max-tokens 12 --stats-json ";
  const CommandResult chatted =
      run_tool("specrun", "--target " + quote(chat.string()) + " --chat --prompt " +
                              quote(question) + common + quote((dir.path() / "a.json").string()));
  ASSERT_EQ(chatted.exit_code, 0) << chatted.stderr_text;
  const CommandResult by_ids =
      run_tool("specrun", "--target " + quote(chat.string()) + " --prompt-ids " + id_list + common +
                              quote((dir.path() / "b.json").string()));
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.stderr_text;
  EXPECT_EQ(chatted.stdout_text, by_ids.stdout_text);
  const nlohmann::json a = nlohmann::json::parse(testing::read_file(dir.path() / "a.json"));
  EXPECT_EQ(a["prompt_tokens"].get<size_t>(), rendered.size());
  // A checkpoint without a template takes one from a file, as specrun serve does.
  const CommandResult from_file =
      run_tool("specrun", "--target " + quote(plain.string()) + " --chat --chat-template " +
                              quote(template_file.string()) + " --prompt " + quote(question) +
                              common + quote((dir.path() / "c.json").string()));
  ASSERT_EQ(from_file.exit_code, 0) << from_file.stderr_text;
  EXPECT_EQ(from_file.stdout_text, chatted.stdout_text);

  // Without a template, or with a prompt that is not text, --chat is one clear error; so are a
  // template file that is not there and a template without --chat.
  expect_one_error_line(run_tool("specrun", "--target " + quote(plain.string()) +
                                                " --chat --prompt " + quote(question)),
                        {{"no chat template"}, {"--chat-template"}, {plain.string()}});
  const std::string missing = (dir.path() / "missing.jinja").string();
  expect_one_error_line(
      run_tool("specrun", "--target " + quote(plain.string()) + " --chat --chat-template " +
                              quote(missing) + " --prompt " + quote(question)),
      {{missing}});
  expect_one_error_line(
      run_tool("specrun", "--target " + quote(plain.string()) + " --chat-template " +
                              quote(template_file.string()) + " --prompt " + quote(question)),
      {{"--chat-template"}, {"--chat"}});
  expect_one_error_line(
      run_tool("specrun", "--target " + quote(chat.string()) + " --chat --prompt-ids 1,2"),
      {{"--chat"}, {"--prompt-ids"}});
}

}  // namespace specrun
