// TOML settings, read straight into EngineConfig: configs/default.toml is complete and matches the
// built-in defaults; every bad file is one error naming the file, the line and the key; flags
// override the file.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "runtime/api/config.h"
#include "runtime/base/check.h"
#include "runtime/engine/device.h"
#include "specrun/specrun.hpp"
#include "tests/test_support.h"

namespace specrun {
namespace {

void expect_config_error(const std::string& toml, const std::vector<std::string>& fragments) {
  testing::TempDir dir;
  const auto path = dir / "bad.toml";
  testing::write_file(path, toml);
  try {
    EngineConfig::from_toml(path.string());
    ADD_FAILURE() << "accepted:\n" << toml;
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << message << "\nmissing: " << fragment;
    }
  }
}

TEST(EngineConfigFile, DefaultFileDocumentsTheBuiltInDefaults) {
  const EngineConfig built_in;
  const EngineConfig loaded =
      EngineConfig::from_toml((testing::source_path("configs/default.toml")).string());
  EXPECT_EQ(loaded.sampling.temperature, built_in.sampling.temperature);
  EXPECT_EQ(loaded.sampling.top_k, built_in.sampling.top_k);
  EXPECT_EQ(loaded.sampling.top_p, built_in.sampling.top_p);
  EXPECT_EQ(loaded.sampling.min_p, built_in.sampling.min_p);
  EXPECT_EQ(loaded.sampling.seed, built_in.sampling.seed);
  EXPECT_EQ(loaded.sampling.max_tokens, built_in.sampling.max_tokens);
  EXPECT_EQ(loaded.threads, built_in.threads);
  EXPECT_EQ(loaded.kv_cache_tokens, built_in.kv_cache_tokens);
  EXPECT_EQ(loaded.kv_block_size, built_in.kv_block_size);
  EXPECT_EQ(loaded.kv_cache_dtype, built_in.kv_cache_dtype);
  EXPECT_EQ(loaded.device, built_in.device);
  EXPECT_EQ(loaded.max_batch, built_in.max_batch);
  EXPECT_EQ(loaded.deterministic, built_in.deterministic);
  EXPECT_EQ(loaded.activations, built_in.activations);
  EXPECT_EQ(loaded.prefix_cache, built_in.prefix_cache);
  EXPECT_EQ(loaded.overlap_drafting, built_in.overlap_drafting);
  EXPECT_EQ(loaded.target, built_in.target);
  EXPECT_EQ(loaded.draft, built_in.draft);
  EXPECT_EQ(loaded.quantize, built_in.quantize);
  EXPECT_EQ(loaded.draft_quantize, built_in.draft_quantize);
  EXPECT_EQ(loaded.quantize_lm_head, built_in.quantize_lm_head);
  EXPECT_EQ(loaded.speculation.method, built_in.speculation.method);
  EXPECT_EQ(loaded.speculation.gamma, built_in.speculation.gamma);
  EXPECT_EQ(loaded.speculation.gamma_min, built_in.speculation.gamma_min);
  EXPECT_EQ(loaded.speculation.gamma_max, built_in.speculation.gamma_max);
  EXPECT_EQ(loaded.speculation.controller, built_in.speculation.controller);
  EXPECT_EQ(loaded.speculation.verification, built_in.speculation.verification);
  EXPECT_EQ(loaded.speculation.draft_p_min, built_in.speculation.draft_p_min);
  EXPECT_EQ(loaded.speculation.lookup_min_ngram, built_in.speculation.lookup_min_ngram);
  EXPECT_EQ(loaded.speculation.lookup_max_ngram, built_in.speculation.lookup_max_ngram);
}

TEST(EngineConfigFile, ReadsTheQuantizationKeysAndNamesABadOne) {
  testing::TempDir dir;
  testing::write_file(dir / "q.toml",
                      "[model]\nquantize = \"int8\"\ndraft_quantize = \"fp8\"\n"
                      "quantize_lm_head = true\n");
  const EngineConfig config = EngineConfig::from_toml((dir / "q.toml").string());
  EXPECT_EQ(config.quantize, Quantization::kINT8);
  EXPECT_EQ(config.draft_quantize, Quantization::kFP8);
  EXPECT_TRUE(config.quantize_lm_head);
  expect_config_error("[model]\nquantize = \"int4\"\n",
                      {":2:", "model.quantize", "int4", "fp8", "int8"});
}

TEST(EngineConfigFile, ReadsTheKvCacheDtypeAndNamesABadOne) {
  EXPECT_EQ(EngineConfig{}.kv_cache_dtype, KvCacheDtype::kBF16);
  testing::TempDir dir;
  testing::write_file(dir / "kv.toml", "[runtime]\nkv_cache_dtype = \"f32\"\n");
  EXPECT_EQ(EngineConfig::from_toml((dir / "kv.toml").string()).kv_cache_dtype, KvCacheDtype::kF32);
  expect_config_error("[runtime]\nkv_cache_dtype = \"fp8\"\n",
                      {":2:", "runtime.kv_cache_dtype", "fp8", "bf16", "f32"});
}

TEST(EngineConfigFile, ReadsActivationsWhichDefaultToAuto) {
  EXPECT_EQ(EngineConfig{}.activations, ActivationPrecision::kAuto);
  testing::TempDir dir;
  for (const ActivationPrecision precision :
       {ActivationPrecision::kAuto, ActivationPrecision::kF32, ActivationPrecision::kBF16,
        ActivationPrecision::kInt8}) {
    testing::write_file(dir / "a.toml",
                        std::string("[runtime]\nactivations = \"") + to_string(precision) + "\"\n");
    EXPECT_EQ(EngineConfig::from_toml((dir / "a.toml").string()).activations, precision);
  }
}

TEST(EngineConfigFile, AutoActivationsAreBf16ExactlyWhereTheMatmulMultipliesBf16Pairs) {
  using kernels::cpu::Activations;
  for (const kernels::cpu::MatmulVariant& variant : kernels::cpu::matmul_variants()) {
    SCOPED_TRACE(std::string(variant.name));
    // Copies named for their instruction set say so of themselves; native is the build machine's.
    if (variant.name == "amx" || variant.name == "x86-64-v4+bf16") {
      EXPECT_TRUE(variant.multiplies_bf16_pairs());
    } else if (variant.name == "x86-64-v3" || variant.name == "portable") {
      EXPECT_FALSE(variant.multiplies_bf16_pairs());
    }
    EXPECT_EQ(cpu_activations(ActivationPrecision::kAuto, variant),
              variant.multiplies_bf16_pairs() ? Activations::kBF16 : Activations::kF32Int8Blocks);
    EXPECT_EQ(cpu_activations(ActivationPrecision::kF32, variant), Activations::kF32);
    EXPECT_EQ(cpu_activations(ActivationPrecision::kBF16, variant), Activations::kBF16);
    EXPECT_EQ(cpu_activations(ActivationPrecision::kInt8, variant), Activations::kInt8);
  }
}

TEST(EngineConfigFile, ReadsOverlapDraftingAndNamesABadValue) {
  EXPECT_EQ(EngineConfig{}.overlap_drafting, OverlapDrafting::kAuto);
  testing::TempDir dir;
  for (const OverlapDrafting overlap : {OverlapDrafting::kOn, OverlapDrafting::kOff}) {
    testing::write_file(dir / "o.toml", std::string("[runtime]\noverlap_drafting = \"") +
                                            to_string(overlap) + "\"\n");
    EXPECT_EQ(EngineConfig::from_toml((dir / "o.toml").string()).overlap_drafting, overlap);
  }
  expect_config_error("[runtime]\noverlap_drafting = true\n",
                      {":2:", "runtime.overlap_drafting", "must be a string"});
  expect_config_error("[runtime]\noverlap_drafting = \"sometimes\"\n",
                      {":2:", "runtime.overlap_drafting", "sometimes", "auto", "on", "off"});
}

TEST(EngineConfigFile, ReadsEveryKeyAndKeepsDefaultsForAbsentOnes) {
  testing::TempDir dir;
  testing::write_file(dir / "c.toml",
                      "[sampling]\ntemperature = 0.7\ntop_k = 40\ntop_p = 0.9\nmin_p = 0.05\n"
                      "seed = 12345\nmax_tokens = 99\n[runtime]\nthreads = 3\n"
                      "kv_cache_tokens = 4096\nkv_block_size = 32\ndevice = \"cpu\"\n"
                      "deterministic = true\nprefix_cache = false\nactivations = \"bf16\"\n");
  const EngineConfig config = EngineConfig::from_toml((dir / "c.toml").string());
  EXPECT_TRUE(config.deterministic);
  EXPECT_EQ(config.activations, ActivationPrecision::kBF16);
  EXPECT_FALSE(config.prefix_cache);
  EXPECT_FLOAT_EQ(config.sampling.temperature, 0.7f);
  EXPECT_EQ(config.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(config.sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(config.sampling.min_p, 0.05f);
  EXPECT_EQ(config.sampling.seed, 12345u);
  EXPECT_EQ(config.sampling.max_tokens, 99);
  EXPECT_EQ(config.threads, 3);
  EXPECT_EQ(config.kv_cache_tokens, 4096);
  EXPECT_EQ(config.kv_block_size, 32);

  testing::write_file(dir / "partial.toml", "[sampling]\ntemperature = 1\n");
  const EngineConfig partial = EngineConfig::from_toml((dir / "partial.toml").string());
  EXPECT_EQ(partial.sampling.temperature, 1.0f);  // an integer where a float is fine
  EXPECT_EQ(partial.threads, EngineConfig{}.threads);
  EXPECT_EQ(partial.sampling.max_tokens, EngineConfig{}.sampling.max_tokens);
}

// An embedder taking settings from others confines model paths to a root: "..", absolute paths
// and symbolic links that lead out of it are refused with the file, line and key.
TEST(EngineConfigFile, ModelRootConfinesModelPaths) {
  testing::TempDir dir;
  const std::filesystem::path root = dir / "models";
  std::filesystem::create_directories(root / "pair" / "target");
  std::filesystem::create_directories(dir / "elsewhere");
  std::filesystem::create_directory_symlink(dir / "elsewhere", root / "escape");
  testing::write_file(root / "inside.toml",
                      "[model]\ntarget = \"pair/target\"\ndraft = \"pair/./draft\"\n");
  const EngineConfig inside =
      EngineConfig::from_toml((root / "inside.toml").string(), root.string());
  EXPECT_EQ(inside.target, (root / "pair" / "target").string());
  EXPECT_EQ(inside.draft, (root / "pair" / "draft").string());  // need not exist yet

  const std::pair<std::string, std::string> escapes[] = {
      {"[model]\ntarget = \"../elsewhere\"\n", "model.target"},
      {"[model]\ntarget = \"pair/target\"\ndraft = \"/etc\"\n", "model.draft"},
      {"[model]\ntarget = \"escape/target\"\n", "model.target"},
      {"[model]\ntarget = \"pair/../../elsewhere\"\n", "model.target"},
  };
  for (const auto& [text, key] : escapes) {
    SCOPED_TRACE(text);
    testing::write_file(root / "escape.toml", text);
    testing::expect_error(
        [&] { EngineConfig::from_toml((root / "escape.toml").string(), root.string()); },
        {"escape.toml:", key, "outside " + root.string()});
    // Without a root the same file reads (settings files are trusted by default).
    EXPECT_NO_THROW(EngineConfig::from_toml((root / "escape.toml").string()));
  }
}

TEST(EngineConfigFile, RejectsUnknownTablesAndKeysWithTheirLine) {
  expect_config_error("[sampling]\ntemperature = 1.0\n\n[speculatve]\ngamma = 4\n",
                      {":4:", "'speculatve' is not a known table"});
  expect_config_error("[sampling]\ntemperature = 1.0\ntopp = 0.9\n",
                      {":3:", "key 'sampling.topp' is not a known key"});
  expect_config_error("[runtime]\nthread = 2\n", {":2:", "runtime.thread"});
  expect_config_error("sampling = 3\n", {":1:", "'sampling' must be a table"});
}

TEST(EngineConfigFile, RejectsWrongTypes) {
  expect_config_error("[sampling]\ntemperature = \"hot\"\n",
                      {":2:", "sampling.temperature", "must be a number"});
  expect_config_error("[sampling]\ntop_k = 2.5\n", {":2:", "sampling.top_k", "must be an integer"});
  expect_config_error("[runtime]\nthreads = true\n", {":2:", "runtime.threads", "integer"});
  expect_config_error("[runtime]\ndevice = 1\n", {":2:", "runtime.device", "must be a string"});
}

TEST(EngineConfigFile, RejectsOutOfRangeValues) {
  expect_config_error("[sampling]\ntemperature = -1\n", {":2:", "sampling.temperature", ">= 0"});
  expect_config_error("[sampling]\ntemperature = inf\n", {":2:", "sampling.temperature"});
  expect_config_error("[sampling]\ntop_p = 0\n", {":2:", "sampling.top_p", "(0, 1]"});
  expect_config_error("[sampling]\ntop_p = 1.5\n", {"sampling.top_p", "got 1.5"});
  // Above 0 as written but 0 as the float that holds it: refused here, with file and line.
  expect_config_error("[sampling]\ntop_p = 1e-50\n",
                      {":2:", "sampling.top_p", "(0, 1]", "got 1e-50", "as a 32-bit float"});
  expect_config_error("[sampling]\ntemperature = 1e300\n", {":2:", "sampling.temperature"});
  expect_config_error("[sampling]\nmin_p = -0.1\n", {"sampling.min_p"});
  expect_config_error("[sampling]\ntop_k = -5\n", {"sampling.top_k", "got -5"});
  expect_config_error("[sampling]\nseed = -1\n", {"sampling.seed"});
  expect_config_error("[sampling]\nmax_tokens = -1\n", {"sampling.max_tokens"});
  expect_config_error("[runtime]\nkv_block_size = 0\n", {"runtime.kv_block_size"});
  expect_config_error("[runtime]\ndevice = \"tpu\"\n", {"runtime.device", "'tpu'"});
  expect_config_error("[runtime]\ndeterministic = 1\n",
                      {":2:", "runtime.deterministic", "true or false"});
  expect_config_error("[runtime]\nprefix_cache = \"on\"\n",
                      {":2:", "runtime.prefix_cache", "true or false"});
  expect_config_error("[runtime]\nactivations = true\n",
                      {":2:", "runtime.activations", "must be a string"});
  expect_config_error("[runtime]\nactivations = \"fp8\"\n",
                      {":2:", "runtime.activations", "fp8", "auto", "f32", "bf16", "int8"});
  // The boolean this setting replaced is an unknown key, not silently ignored.
  expect_config_error("[runtime]\nbf16_activations = true\n",
                      {":2:", "runtime.bf16_activations", "not a known key"});
  expect_config_error("[runtime]\ndevice = \"cuda:x\"\n", {":2:", "runtime.device", "cuda:N"});
  expect_config_error("[runtime]\ndevice = \"cuda:-1\"\n", {"runtime.device", "'cuda:-1'"});
}

TEST(EngineConfigFile, NamesCudaDevices) {
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
  EXPECT_EQ(EngineConfig::from_toml((dir / "c.toml").string()).device, "cuda:1");
}

TEST(EngineConfigFile, ReadsTheSpeculativeTable) {
  testing::TempDir dir;
  testing::write_file(dir / "c.toml",
                      "[speculative]\nmethod = \"prompt_lookup\"\ngamma = 3\ngamma_min = 1\n"
                      "gamma_max = 6\ncontroller = \"heuristic\"\ndraft_p_min = 0.25\n"
                      "lookup_min_ngram = 2\nlookup_max_ngram = 4\nverification = \"rejection\"\n"
                      "draft_lookup_ngram = 3\ndraft_lookup_below = 0.5\ndraft_alternates = 2\n");
  const EngineConfig config = EngineConfig::from_toml((dir / "c.toml").string());
  EXPECT_EQ(config.speculation.method, SpeculationMethod::kPromptLookup);
  EXPECT_EQ(config.speculation.gamma, 3);
  EXPECT_EQ(config.speculation.gamma_min, 1);
  EXPECT_EQ(config.speculation.gamma_max, 6);
  EXPECT_EQ(config.speculation.controller, GammaControl::kHeuristic);
  EXPECT_EQ(config.speculation.verification, Verification::kRejection);
  EXPECT_FLOAT_EQ(config.speculation.draft_p_min, 0.25f);
  EXPECT_EQ(config.speculation.lookup_min_ngram, 2);
  EXPECT_EQ(config.speculation.lookup_max_ngram, 4);
  EXPECT_EQ(config.speculation.draft_lookup_ngram, 3);
  EXPECT_FLOAT_EQ(config.speculation.draft_lookup_below, 0.5f);
  EXPECT_EQ(config.speculation.draft_alternates, 2);
}

// Every row of the setting tables is a key of its TOML table: read, and refused out of range
// naming the key, by the same row the command line and the server read it by.
TEST(EngineConfigFile, TakesEveryKeyOfTheSettingTables) {
  const EngineConfig defaults;
  const auto toml_text = [](const SettingValue& value) {
    return std::holds_alternative<std::string>(value) ? "\"" + std::get<std::string>(value) + "\""
                                                      : setting_text(value);
  };
  const auto walk = [&](const char* table, auto rows, const auto& default_settings,
                        const auto& read) {
    for (const auto& row : rows) {
      SCOPED_TRACE(std::string(table) + "." + row.key);
      const SettingValue value = testing::other_setting_value(row, default_settings);
      testing::TempDir dir;
      testing::write_file(dir / "c.toml", "[" + std::string(table) + "]\n" + row.key + " = " +
                                              toml_text(value) + "\n");
      const EngineConfig config = EngineConfig::from_toml((dir / "c.toml").string());
      const SettingValue read_back = row.get(read(config));
      if (std::holds_alternative<double>(value)) {
        EXPECT_FLOAT_EQ(static_cast<float>(std::get<double>(read_back)),
                        static_cast<float>(std::get<double>(value)));
      } else {
        EXPECT_EQ(read_back, value);
      }
      expect_config_error("[" + std::string(table) + "]\n" + row.key + " = " +
                              toml_text(testing::bad_setting_value(row)) + "\n",
                          {row.key, "must be"});
    }
  };
  walk("speculative", speculation_settings(), defaults.speculation,
       [](const EngineConfig& config) -> const SpeculationSettings& { return config.speculation; });
  walk("sampling", sampling_settings(), defaults.sampling,
       [](const EngineConfig& config) -> const SamplingSettings& { return config.sampling; });
}

TEST(EngineConfigFile, RejectsBadSpeculativeSettings) {
  expect_config_error("[speculative]\nmethod = \"medusa\"\n",
                      {":2:", "speculative.method", "'medusa'"});
  expect_config_error("[speculative]\ncontroller = \"pid\"\n", {":2:", "speculative.controller"});
  expect_config_error("[speculative]\nverification = \"gumbel\"\n",
                      {":2:", "speculative.verification", "'gumbel'", "shared_noise", "rejection"});
  expect_config_error("[speculative]\ngamma = -1\n", {":2:", "speculative.gamma"});
  expect_config_error("[speculative]\ngamma = 100\n", {":2:", "speculative.gamma", "got 100"});
  expect_config_error("[speculative]\ndraft_p_min = 1.5\n", {":2:", "speculative.draft_p_min"});
  expect_config_error("[speculative]\ngama = 4\n", {":2:", "speculative.gama", "not a known key"});
  // Keys valid alone but not together: the table is located by its line.
  expect_config_error("\n[speculative]\ngamma = 9\ngamma_max = 8\n",
                      {":2:", "[speculative]", "gamma_min <= gamma <= gamma_max"});
  expect_config_error("[speculative]\nlookup_min_ngram = 3\nlookup_max_ngram = 2\n",
                      {"[speculative]", "n-gram"});
  expect_config_error("[speculative]\ndraft_lookup_below = 0\n",
                      {":2:", "speculative.draft_lookup_below", "(0, 1]"});
  expect_config_error("[speculative]\ndraft_alternates = 9\n",
                      {":2:", "speculative.draft_alternates", "got 9"});
  expect_config_error("[speculative]\ndraft_lookup_ngram = -1\n",
                      {":2:", "speculative.draft_lookup_ngram"});
  expect_config_error("[speculative]\ndraft_lookup_ngram = 4\nlookup_max_ngram = 3\n",
                      {"[speculative]", "draft_lookup_ngram", "lookup_max_ngram 3", "got 4"});
}

TEST(EngineConfigFile, ReadsTheModelTableRelativeToTheFile) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "configs");
  testing::write_file(dir / "configs" / "c.toml",
                      "[model]\ntarget = \"../models/target\"\ndraft = \"/abs/draft\"\n"
                      "[runtime]\nmax_batch = 8\n");
  const EngineConfig config = EngineConfig::from_toml((dir / "configs" / "c.toml").string());
  // Relative to the file's directory, whatever the working directory is.
  EXPECT_EQ(config.target, (dir / "models" / "target").string());
  EXPECT_EQ(config.draft, "/abs/draft");
  EXPECT_EQ(config.max_batch, 8);

  testing::write_file(dir / "none.toml", "[model]\ntarget = \"t\"\ndraft = \"\"\n");
  const EngineConfig no_draft = EngineConfig::from_toml((dir / "none.toml").string());
  EXPECT_EQ(no_draft.target, (dir / "t").string());
  EXPECT_EQ(no_draft.draft, "");  // "" names no draft and stays so
}

TEST(EngineConfigFile, RejectsBadModelAndBatchKeys) {
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

TEST(EngineConfigFile, ValidatesSettingsFromElsewhere) {
  EngineConfig config;
  config.target = "t";
  config.max_batch = 0;
  testing::expect_error([&] { validate(config); }, {"max_batch", "got 0"});
  config.max_batch = 1;
  config.threads = -2;
  testing::expect_error([&] { validate(config); }, {"threads", "got -2"});
  config.threads = 0;
  config.speculation.gamma_max = kMaxGamma + 1;
  testing::expect_error([&] { validate(config); }, {"gamma_max must be in [0, 64], got 65"});
  config.speculation.gamma_max = 8;
  config.rope_style = "sideways";
  testing::expect_error([&] { validate(config); }, {"rope_style", "sideways"});
}

TEST(EngineConfigFile, CommandLineTakesTheModelFromTheFile) {
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

TEST(EngineConfigFile, ReportsSyntaxErrorsWithTheirLine) {
  expect_config_error("[sampling]\ntemperature = = 1\n", {":2:"});
  expect_config_error("[sampling\n", {":1:"});
}

TEST(EngineConfigFile, MissingFileIsAnErrorNamingIt) {
  testing::expect_error([] { EngineConfig::from_toml("/nonexistent/specrun.toml"); },
                        {"/nonexistent/specrun.toml", "no such"});
}

TEST(EngineConfigFile, OnlyARegularFileIsRead) {
  // A directory or a device would read as an empty file; a FIFO would block forever.
  testing::TempDir dir;
  testing::expect_error([&] { EngineConfig::from_toml(dir.path().string()); },
                        {dir.path().string(), "not a regular file"});
  testing::expect_error([] { EngineConfig::from_toml("/dev/null"); }, {"not a regular file"});
  const std::filesystem::path fifo = dir / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  testing::expect_error([&] { EngineConfig::from_toml(fifo.string()); },
                        {"fifo.toml", "not a regular file"});
}

TEST(EngineConfigFile, FlagsOverrideTheFile) {
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

namespace specrun {
namespace {

TEST(ServerConfigFile, ReadsTheServerTableAndIgnoresTheOthers) {
  testing::TempDir dir;
  testing::write_file(dir / "c.toml",
                      "[sampling]\ntemperature = 0.5\n[server]\nhost = \"0.0.0.0\"\nport = 9000\n"
                      "model_name = \"m\"\nchat_template = \"t.jinja\"\nmax_requests = 8\n"
                      "max_body_bytes = 65536\nshutdown_grace_seconds = 2.5\n");
  const ServerConfig config = ServerConfig::from_toml((dir / "c.toml").string());
  EXPECT_EQ(config.host, "0.0.0.0");
  EXPECT_EQ(config.port, 9000);
  EXPECT_EQ(config.model_name, "m");
  EXPECT_EQ(config.chat_template, (dir / "t.jinja").string());  // relative to the file
  EXPECT_EQ(config.max_requests, 8);
  EXPECT_EQ(config.max_body_bytes, 65536);
  EXPECT_DOUBLE_EQ(config.shutdown_grace_seconds, 2.5);
  // The engine reads the same file and leaves [server] alone.
  EXPECT_FLOAT_EQ(EngineConfig::from_toml((dir / "c.toml").string()).sampling.temperature, 0.5f);
  // Without a [server] table: the defaults.
  testing::write_file(dir / "d.toml", "[sampling]\ntemperature = 0.5\n");
  EXPECT_EQ(ServerConfig::from_toml((dir / "d.toml").string()).port, 8000);
  // The shipped defaults file reads as the built-in defaults.
  const ServerConfig shipped =
      ServerConfig::from_toml(testing::source_path("configs/default.toml").string());
  const ServerConfig built_in;
  EXPECT_EQ(shipped.host, built_in.host);
  EXPECT_EQ(shipped.port, built_in.port);
  EXPECT_EQ(shipped.max_requests, built_in.max_requests);
  EXPECT_EQ(shipped.max_body_bytes, built_in.max_body_bytes);
  EXPECT_DOUBLE_EQ(shipped.shutdown_grace_seconds, built_in.shutdown_grace_seconds);
}

TEST(ServerConfigFile, RefusesUnknownKeysWrongTypesAndRanges) {
  testing::TempDir dir;
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"[server]\nprot = 1\n", {":2:", "server.prot", "not a known key"}},
      {"[server]\nport = \"80\"\n", {":2:", "server.port", "integer"}},
      {"[server]\nport = 70000\n", {":2:", "server.port", "70000"}},
      {"[server]\nmax_requests = 0\n", {":2:", "server.max_requests"}},
      {"[server]\nmax_body_bytes = 10\n", {":2:", "server.max_body_bytes"}},
      {"[server]\nshutdown_grace_seconds = -1\n", {":2:", "server.shutdown_grace_seconds"}},
      {"server = 3\n", {":1:", "'server' must be a table"}},
  };
  for (const auto& [text, fragments] : cases) {
    testing::write_file(dir / "c.toml", text);
    std::vector<std::string> expected = fragments;
    expected.push_back((dir / "c.toml").string());
    testing::expect_error([&] { ServerConfig::from_toml((dir / "c.toml").string()); }, expected);
  }
}

}  // namespace
}  // namespace specrun
