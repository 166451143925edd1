// TOML run settings: configs/default.toml is complete and matches the built-in defaults; every bad
// file is one error naming the file, the line and the key; flags override the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "kernels/core/check.h"
#include "runtime/engine/device.h"
#include "runtime/engine/run_config.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

void expect_config_error(const std::string& toml, const std::vector<std::string>& fragments) {
  testing::TempDir dir;
  const auto path = dir / "bad.toml";
  testing::write_file(path, toml);
  try {
    load_run_config(path);
    ADD_FAILURE() << "accepted:\n" << toml;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << message << "\nmissing: " << fragment;
    }
  }
}

TEST(RunConfig, DefaultFileDocumentsTheBuiltInDefaults) {
  const RunConfig built_in;
  const RunConfig loaded = load_run_config(testing::source_path("configs/default.toml"));
  EXPECT_EQ(loaded.generation.sampling.temperature, built_in.generation.sampling.temperature);
  EXPECT_EQ(loaded.generation.sampling.top_k, built_in.generation.sampling.top_k);
  EXPECT_EQ(loaded.generation.sampling.top_p, built_in.generation.sampling.top_p);
  EXPECT_EQ(loaded.generation.sampling.min_p, built_in.generation.sampling.min_p);
  EXPECT_EQ(loaded.generation.sampling.seed, built_in.generation.sampling.seed);
  EXPECT_EQ(loaded.generation.max_tokens, built_in.generation.max_tokens);
  EXPECT_EQ(loaded.threads, built_in.threads);
  EXPECT_EQ(loaded.kv_cache_tokens, built_in.kv_cache_tokens);
  EXPECT_EQ(loaded.kv_block_size, built_in.kv_block_size);
  EXPECT_EQ(loaded.device, built_in.device);
  EXPECT_EQ(loaded.max_batch, built_in.max_batch);
  EXPECT_EQ(loaded.deterministic, built_in.deterministic);
  EXPECT_EQ(loaded.target, built_in.target);
  EXPECT_EQ(loaded.draft, built_in.draft);
  EXPECT_EQ(loaded.speculative.method, built_in.speculative.method);
  EXPECT_EQ(loaded.speculative.gamma.initial, built_in.speculative.gamma.initial);
  EXPECT_EQ(loaded.speculative.gamma.min, built_in.speculative.gamma.min);
  EXPECT_EQ(loaded.speculative.gamma.max, built_in.speculative.gamma.max);
  EXPECT_EQ(loaded.speculative.controller, built_in.speculative.controller);
  EXPECT_EQ(loaded.speculative.draft_p_min, built_in.speculative.draft_p_min);
  EXPECT_EQ(loaded.speculative.lookup_min_ngram, built_in.speculative.lookup_min_ngram);
  EXPECT_EQ(loaded.speculative.lookup_max_ngram, built_in.speculative.lookup_max_ngram);
}

TEST(RunConfig, ReadsEveryKeyAndKeepsDefaultsForAbsentOnes) {
  testing::TempDir dir;
  testing::write_file(dir / "c.toml",
                      "[sampling]\ntemperature = 0.7\ntop_k = 40\ntop_p = 0.9\nmin_p = 0.05\n"
                      "seed = 12345\nmax_tokens = 99\n[runtime]\nthreads = 3\n"
                      "kv_cache_tokens = 4096\nkv_block_size = 32\ndevice = \"cpu\"\n"
                      "deterministic = true\n");
  const RunConfig config = load_run_config(dir / "c.toml");
  EXPECT_TRUE(config.deterministic);
  EXPECT_FLOAT_EQ(config.generation.sampling.temperature, 0.7f);
  EXPECT_EQ(config.generation.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(config.generation.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(config.generation.sampling.min_p, 0.05f);
  EXPECT_EQ(config.generation.sampling.seed, 12345u);
  EXPECT_EQ(config.generation.max_tokens, 99);
  EXPECT_EQ(config.threads, 3);
  EXPECT_EQ(config.kv_cache_tokens, 4096);
  EXPECT_EQ(config.kv_block_size, 32);

  testing::write_file(dir / "partial.toml", "[sampling]\ntemperature = 1\n");
  RunConfig defaults;
  defaults.threads = 7;
  const RunConfig partial = load_run_config(dir / "partial.toml", defaults);
  EXPECT_EQ(partial.generation.sampling.temperature, 1.0f);  // an integer where a float is fine
  EXPECT_EQ(partial.threads, 7);
}

TEST(RunConfig, RejectsUnknownTablesAndKeysWithTheirLine) {
  expect_config_error("[sampling]\ntemperature = 1.0\n\n[speculatve]\ngamma = 4\n",
                      {":4:", "'speculatve' is not a known table"});
  expect_config_error("[sampling]\ntemperature = 1.0\ntopp = 0.9\n",
                      {":3:", "key 'sampling.topp' is not a known key"});
  expect_config_error("[runtime]\nthread = 2\n", {":2:", "runtime.thread"});
  expect_config_error("sampling = 3\n", {":1:", "'sampling' must be a table"});
}

TEST(RunConfig, RejectsWrongTypes) {
  expect_config_error("[sampling]\ntemperature = \"hot\"\n",
                      {":2:", "sampling.temperature", "must be a number"});
  expect_config_error("[sampling]\ntop_k = 2.5\n", {":2:", "sampling.top_k", "must be an integer"});
  expect_config_error("[runtime]\nthreads = true\n", {":2:", "runtime.threads", "integer"});
  expect_config_error("[runtime]\ndevice = 1\n", {":2:", "runtime.device", "must be a string"});
}

TEST(RunConfig, RejectsOutOfRangeValues) {
  expect_config_error("[sampling]\ntemperature = -1\n", {":2:", "sampling.temperature", ">= 0"});
  expect_config_error("[sampling]\ntemperature = inf\n", {":2:", "sampling.temperature"});
  expect_config_error("[sampling]\ntop_p = 0\n", {":2:", "sampling.top_p", "(0, 1]"});
  expect_config_error("[sampling]\ntop_p = 1.5\n", {"sampling.top_p", "got 1.5"});
  expect_config_error("[sampling]\nmin_p = -0.1\n", {"sampling.min_p"});
  expect_config_error("[sampling]\ntop_k = -5\n", {"sampling.top_k", "got -5"});
  expect_config_error("[sampling]\nseed = -1\n", {"sampling.seed"});
  expect_config_error("[sampling]\nmax_tokens = -1\n", {"sampling.max_tokens"});
  expect_config_error("[runtime]\nkv_block_size = 0\n", {"runtime.kv_block_size"});
  expect_config_error("[runtime]\ndevice = \"tpu\"\n", {"runtime.device", "'tpu'"});
  expect_config_error("[runtime]\ndeterministic = 1\n",
                      {":2:", "runtime.deterministic", "true or false"});
  expect_config_error("[runtime]\ndevice = \"cuda:x\"\n", {":2:", "runtime.device", "cuda:N"});
  expect_config_error("[runtime]\ndevice = \"cuda:-1\"\n", {"runtime.device", "'cuda:-1'"});
}

TEST(RunConfig, NamesCudaDevices) {
  EXPECT_EQ(parse_device("cpu").kind, DeviceSpec::Kind::kCpu);
  const DeviceSpec first = parse_device("cuda");
  EXPECT_EQ(first.kind, DeviceSpec::Kind::kCuda);
  EXPECT_EQ(first.index, 0);
  EXPECT_EQ(parse_device("cuda:3").index, 3);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:1x", "cuda: 1", "CUDA", "cpu:0"}) {
    testing::expect_error([&] { parse_device(bad); }, {"device '" + std::string(bad) + "'"});
  }
  // Whether this build and machine have the device is a question for load time, not parsing.
  testing::TempDir dir;
  testing::write_file(dir / "c.toml", "[runtime]\ndevice = \"cuda:1\"\n");
  EXPECT_EQ(load_run_config(dir / "c.toml", RunConfig{}).device, "cuda:1");
}

TEST(RunConfig, ReadsTheSpeculativeTable) {
  testing::TempDir dir;
  testing::write_file(dir / "c.toml",
                      "[speculative]\nmethod = \"prompt_lookup\"\ngamma = 3\ngamma_min = 1\n"
                      "gamma_max = 6\ncontroller = \"heuristic\"\ndraft_p_min = 0.25\n"
                      "lookup_min_ngram = 2\nlookup_max_ngram = 4\n");
  const RunConfig config = load_run_config(dir / "c.toml");
  EXPECT_EQ(config.speculative.method, SpeculativeMethod::kPromptLookup);
  EXPECT_EQ(config.speculative.gamma.initial, 3);
  EXPECT_EQ(config.speculative.gamma.min, 1);
  EXPECT_EQ(config.speculative.gamma.max, 6);
  EXPECT_EQ(config.speculative.controller, ControllerKind::kHeuristic);
  EXPECT_FLOAT_EQ(config.speculative.draft_p_min, 0.25f);
  EXPECT_EQ(config.speculative.lookup_min_ngram, 2);
  EXPECT_EQ(config.speculative.lookup_max_ngram, 4);
}

TEST(RunConfig, RejectsBadSpeculativeSettings) {
  expect_config_error("[speculative]\nmethod = \"medusa\"\n",
                      {":2:", "speculative.method", "'medusa'"});
  expect_config_error("[speculative]\ncontroller = \"pid\"\n", {":2:", "speculative.controller"});
  expect_config_error("[speculative]\ngamma = -1\n", {":2:", "speculative.gamma"});
  expect_config_error("[speculative]\ngamma = 100\n", {":2:", "speculative.gamma", "got 100"});
  expect_config_error("[speculative]\ndraft_p_min = 1.5\n", {":2:", "speculative.draft_p_min"});
  expect_config_error("[speculative]\ngama = 4\n", {":2:", "speculative.gama", "not a known key"});
  // Keys valid alone but not together: the table is located by its line.
  expect_config_error("\n[speculative]\ngamma = 9\ngamma_max = 8\n",
                      {":2:", "[speculative]", "gamma_min <= gamma <= gamma_max"});
  expect_config_error("[speculative]\nlookup_min_ngram = 3\nlookup_max_ngram = 2\n",
                      {"[speculative]", "n-gram"});
}

TEST(RunConfig, ReadsTheModelTableRelativeToTheFile) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "configs");
  testing::write_file(dir / "configs" / "c.toml",
                      "[model]\ntarget = \"../models/target\"\ndraft = \"/abs/draft\"\n"
                      "[runtime]\nmax_batch = 8\n");
  const RunConfig config = load_run_config(dir / "configs" / "c.toml");
  // Relative to the file's directory, whatever the working directory is.
  EXPECT_EQ(config.target, (dir / "models" / "target").string());
  EXPECT_EQ(config.draft, "/abs/draft");
  EXPECT_EQ(config.max_batch, 8);

  testing::write_file(dir / "none.toml", "[model]\ntarget = \"t\"\ndraft = \"\"\n");
  const RunConfig no_draft = load_run_config(dir / "none.toml");
  EXPECT_EQ(no_draft.target, (dir / "t").string());
  EXPECT_EQ(no_draft.draft, "");  // "" names no draft and stays so
}

TEST(RunConfig, RejectsBadModelAndBatchKeys) {
  expect_config_error("[model]\ntarget = 3\n", {":2:", "key 'model.target'", "must be a string"});
  expect_config_error("[model]\ntarget = \"t\"\ndraft = [\"d\"]\n",
                      {":3:", "key 'model.draft'", "must be a string"});
  expect_config_error("[model]\ntokenizer = \"t\"\n",
                      {":2:", "key 'model.tokenizer'", "is not a known key"});
  expect_config_error("model = \"t\"\n", {":1:", "'model' must be a table"});
  expect_config_error("[models]\ntarget = \"t\"\n",
                      {":1:", "'models' is not a known table", "model, speculative"});
  expect_config_error("[runtime]\nmax_batch = 0\n",
                      {":2:", "key 'runtime.max_batch'", "must be in [1, 4096], got 0"});
  expect_config_error("[runtime]\nmax_batch = \"many\"\n",
                      {":2:", "key 'runtime.max_batch'", "must be an integer"});
  expect_config_error("[runtime]\nmax_batch = 5000\n", {"runtime.max_batch", "got 5000"});
}

TEST(RunConfig, ValidatesSettingsFromElsewhere) {
  RunConfig config;
  config.max_batch = 0;
  testing::expect_error([&] { validate_run_config(config); }, {"max_batch", "got 0"});
  config = RunConfig{};
  config.threads = -2;
  testing::expect_error([&] { validate_run_config(config); }, {"threads", "got -2"});
}

TEST(RunConfig, CommandLineTakesTheModelFromTheFile) {
  testing::TempDir dir;
  fixtures::GeneratorOptions model;
  model.vocab_size = 64;
  fixtures::write_random_checkpoint(model, dir / "model");
  std::filesystem::create_directories(dir / "configs");
  testing::write_file(dir / "configs" / "c.toml",
                      "[model]\ntarget = \"../model\"\n[sampling]\nmax_tokens = 3\n");
  const std::string command = testing::tool_path("specrun").string() + " --config " +
                              (dir / "configs" / "c.toml").string() +
                              " --prompt-ids 1,2 --ignore-eos --quiet";
  // From another working directory: the path is the file's, not the caller's.
  const testing::CommandResult ran = testing::run_command("cd / && " + command);
  ASSERT_EQ(ran.exit_code, 0) << ran.stderr_text;
  EXPECT_EQ(std::count(ran.stdout_text.begin(), ran.stdout_text.end(), ' '), 2) << ran.stdout_text;
  const testing::CommandResult missing =
      testing::run_command(command + " --target " + (dir / "absent").string());
  EXPECT_NE(missing.exit_code, 0);  // the flag wins over the file
  EXPECT_NE(missing.stderr_text.find("absent"), std::string::npos) << missing.stderr_text;
}

TEST(RunConfig, ReportsSyntaxErrorsWithTheirLine) {
  expect_config_error("[sampling]\ntemperature = = 1\n", {":2:"});
  expect_config_error("[sampling\n", {":1:"});
}

TEST(RunConfig, MissingFileIsAnErrorNamingIt) {
  EXPECT_THROW(load_run_config("/nonexistent/specrun.toml"), Error);
}

TEST(RunConfig, FlagsOverrideTheFile) {
  testing::TempDir dir;
  fixtures::GeneratorOptions model;
  model.vocab_size = 64;
  fixtures::write_random_checkpoint(model, dir / "model");
  testing::write_file(dir / "c.toml", "[sampling]\ntemperature = 0\nmax_tokens = 6\n");
  const std::string base = testing::tool_path("specrun").string() + " --target " +
                           (dir / "model").string() + " --config " + (dir / "c.toml").string() +
                           " --prompt-ids 1,2 --ignore-eos --quiet";
  const testing::CommandResult from_file = testing::run_command(base);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.stderr_text;
  EXPECT_EQ(std::count(from_file.stdout_text.begin(), from_file.stdout_text.end(), ' '), 5);
  const testing::CommandResult overridden = testing::run_command(base + " --max-tokens 2");
  ASSERT_EQ(overridden.exit_code, 0) << overridden.stderr_text;
  EXPECT_EQ(std::count(overridden.stdout_text.begin(), overridden.stdout_text.end(), ' '), 1);
  // Greedy from the file: the first two tokens agree.
  EXPECT_EQ(from_file.stdout_text.substr(0, overridden.stdout_text.size() - 1),
            overridden.stdout_text.substr(0, overridden.stdout_text.size() - 1));

  testing::write_file(dir / "bad.toml", "[sampling]\ntop_p = 7\n");
  const testing::CommandResult bad =
      testing::run_command(testing::tool_path("specrun").string() + " --target " +
                           (dir / "model").string() + " --config " + (dir / "bad.toml").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_EQ(bad.stderr_text.rfind("specrun: error: ", 0), 0u) << bad.stderr_text;
  EXPECT_NE(bad.stderr_text.find("bad.toml:2: key 'sampling.top_p'"), std::string::npos)
      << bad.stderr_text;
  EXPECT_TRUE(bad.stdout_text.empty());
}

}  // namespace
}  // namespace specrun
