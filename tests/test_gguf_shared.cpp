// GGUF files from the wild (../shared): Karpathy's stories260K as llama.cpp users have it
// (stories260K.gguf: f32, llama architecture, interleaved q/k rows, SentencePiece tokenizer in the
// metadata) against the same model converted from llama2.c to safetensors by
// tools/convert_llama2c.py, and the Llama 3 tokenizer carried in GGUF metadata against its
// tokenizer.json. Skipped when ../shared is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/engine/pairing.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "tests/gguf_writer.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr char kExpectedStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";

fs::path stories_gguf() {
  return testing::shared_path("models/stories260K/stories260K.gguf");
}

std::vector<std::string> corpus_lines() {
  std::istringstream stream(
      testing::read_file(testing::source_path("tests/data/tokenizer/corpus.txt")));
  std::vector<std::string> lines;
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Greedy tokens of the reference decode (tests/test_support), stopping at EOS when asked.
std::vector<int32_t> greedy_tokens(Model& model, const std::vector<int32_t>& prompt,
                                   int64_t max_tokens, bool stop_at_eos) {
  SamplingSettings sampling = testing::greedy(max_tokens);
  sampling.stop_at_eos = stop_at_eos;
  return testing::reference_decode(model, prompt, sampling).tokens;
}

class StoriesGgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(stories_gguf()) ||
        !fs::exists(testing::shared_path("models/stories260K/stories260K.bin"))) {
      GTEST_SKIP() << "stories260K is not in ../shared/models";
    }
    if (testing::reference_python().empty()) {
      GTEST_SKIP() << "no Python with NumPy was found at configure time (for convert_llama2c.py)";
    }
    const std::string command =
        "'" + testing::reference_python() + "' '" +
        testing::source_path("tools/convert_llama2c.py").string() + "' '" +
        testing::shared_path("models/stories260K/stories260K.bin").string() + "' '" +
        (dir_ / "hf").string() + "' --tokenizer '" +
        testing::shared_path("models/stories260K/tok512.bin").string() + "'";
    const auto result = testing::run_command(command);
    ASSERT_EQ(result.exit_code, 0) << command << "\n" << result.stderr_text;
  }

  std::vector<float> prefill_logits(Model& model, const std::vector<int32_t>& tokens) {
    const SequenceInput input{model.kv_cache().add_sequence(), tokens, /*all_logits=*/true};
    Logits logits;
    model.forward(std::span<const SequenceInput>(&input, 1), &logits);
    return logits.values;
  }

  TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
};

TEST_F(StoriesGgufTest, LoadsWithItsConfigAndTellsTheStory) {
  auto model = Model::load(stories_gguf(), *backend_);
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.rope_style, kernels::RopeStyle::kInterleaved);  // no flag needed
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});

  const std::vector<int32_t> tokens = greedy_tokens(*model, {1}, 60, true);
  const auto tokenizer = load_tokenizer(model->paths());
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = tokenizer->decode(tokens, /*skip_special_tokens=*/true);
  std::cout << "[ stories260K.gguf ] greedy: \"" << text << "\"\n";
  EXPECT_TRUE(text.starts_with(kExpectedStory)) << text;
}

// The GGUF path (interleaved RoPE on Meta's rows) and the converted safetensors path (rotate-half
// RoPE on permuted rows) are the same f32 model: logits agree to f32 rounding. The caches are
// f32: a bf16 cache would round the two paths' keys (equal to f32 rounding) apart wherever they
// straddle a bf16 rounding boundary, 2^-9 of a key at a time.
TEST_F(StoriesGgufTest, LogitsEqualTheConvertedSafetensorsModel) {
  ModelOptions exact;
  exact.kv_cache_dtype = DType::kF32;
  auto gguf = Model::load(stories_gguf(), *backend_, exact);
  auto hf = Model::load(dir_ / "hf", *backend_, exact);
  std::vector<int32_t> tokens = {1};
  const std::vector<int32_t> story = greedy_tokens(*hf, tokens, 40, false);
  tokens.insert(tokens.end(), story.begin(), story.end());
  const std::vector<float> expected = prefill_logits(*hf, tokens);
  const std::vector<float> got = prefill_logits(*gguf, tokens);
  ASSERT_EQ(got.size(), expected.size());
  double max_error = 0.0;
  double max_logit = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_error = std::max(max_error, static_cast<double>(std::abs(got[i] - expected[i])));
    max_logit = std::max(max_logit, static_cast<double>(std::abs(expected[i])));
  }
  std::cout << "[ stories260K.gguf ] " << tokens.size() << " tokens: max |logit| " << max_logit
            << ", max |difference| " << max_error << "\n";
  // As in test_stories260k: f32 rounding over rows whose largest logit is ~22.
  EXPECT_LE(max_error, 2e-5 + 1e-5 * max_logit);
}

// The tokenizer built from the GGUF metadata (scores -> merges) encodes and decodes as the
// tokenizer.json convert_llama2c.py writes from tok512.bin; and a GGUF model pairs with a
// safetensors one.
TEST_F(StoriesGgufTest, TokenizerAndPairingMatchTheConvertedModel) {
  auto gguf = Model::load(stories_gguf(), *backend_);
  auto hf = Model::load(dir_ / "hf", *backend_);
  const auto from_gguf = load_tokenizer(gguf->paths());
  const auto from_json = load_tokenizer(hf->paths());
  ASSERT_NE(from_gguf, nullptr);
  ASSERT_NE(from_json, nullptr);
  int64_t lines = 0;
  for (const std::string& line : corpus_lines()) {
    for (const bool special : {false, true}) {
      const std::vector<int32_t> ids = from_json->encode(line, special);
      ASSERT_EQ(from_gguf->encode(line, special), ids) << line;
      EXPECT_EQ(from_gguf->decode(ids, !special), from_json->decode(ids, !special)) << line;
    }
    ++lines;
  }
  std::cout << "[ stories260K.gguf ] tokenizer equal on " << lines << " corpus lines\n";

  // Either may draft for the other (speculative decoding across formats is run from the command
  // line below); both compute the same story.
  EXPECT_NO_THROW(check_pairing(*gguf, *hf));
  EXPECT_NO_THROW(check_pairing(*hf, *gguf));
  const std::vector<int32_t> prompt = from_gguf->encode("Once upon a time", true);
  EXPECT_EQ(greedy_tokens(*gguf, prompt, 60, true), greedy_tokens(*hf, prompt, 60, true));
}

// From the command line, a .gguf file is a --target or a --draft like any checkpoint, and a
// --tokenizer for specrun tokenize.
TEST_F(StoriesGgufTest, CommandLineTakesTheFile) {
  const std::string specrun = "'" + testing::tool_path("specrun").string() + "'";
  const std::string gguf = "'" + stories_gguf().string() + "'";
  auto result =
      testing::run_command(specrun + " --target " + gguf + " --draft '" + (dir_ / "hf").string() +
                           "' --prompt 'Once upon a time' --max-tokens 24 "
                           "--temperature 0");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_TRUE(result.stdout_text.starts_with(", there was a little girl named Lily"))
      << result.stdout_text;
  result = testing::run_command("echo 'Once upon a time' | " + specrun + " tokenize --tokenizer " +
                                gguf + " --add-special");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  const auto json_ids =
      testing::run_command("echo 'Once upon a time' | " + specrun + " tokenize --tokenizer '" +
                           (dir_ / "hf" / "tokenizer.json").string() + "' --add-special");
  EXPECT_EQ(result.stdout_text, json_ids.stdout_text);
}

// Llama 3's tokenizer as llama.cpp stores it (tokens, token types, merges, pre 'llama-bpe')
// tokenizes the conformance corpus as its tokenizer.json does.
TEST(GgufSharedTokenizer, Llama3FromMetadataEqualsItsTokenizerJson) {
  const fs::path json_path = testing::shared_path("tokenizers/llama3/tokenizer.json");
  if (!fs::exists(json_path)) GTEST_SKIP() << "no ../shared/tokenizers/llama3";
  const nlohmann::json document = nlohmann::json::parse(testing::read_file(json_path));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (const auto& [token, id] : document["model"]["vocab"].items()) {
    const size_t index = id.get<size_t>();
    if (tokens.size() <= index) tokens.resize(index + 1), types.resize(index + 1, 1);
    tokens[index] = token;
  }
  for (const nlohmann::json& added : document["added_tokens"]) {
    const size_t index = added["id"].get<size_t>();
    if (tokens.size() <= index) tokens.resize(index + 1), types.resize(index + 1, 1);
    tokens[index] = added["content"].get<std::string>();
    types[index] = added["special"].get<bool>() ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (const nlohmann::json& merge : document["model"]["merges"]) {
    merges.push_back(merge.is_string()
                         ? merge.get<std::string>()
                         : merge[0].get<std::string>() + " " + merge[1].get<std::string>());
  }
  testing::GgufWriter writer;
  writer.kv_string("tokenizer.ggml.model", "gpt2");
  writer.kv_string("tokenizer.ggml.pre", "llama-bpe");
  writer.kv_strings("tokenizer.ggml.tokens", tokens);
  writer.kv_i32s("tokenizer.ggml.token_type", types);
  writer.kv_strings("tokenizer.ggml.merges", merges);
  writer.kv_u32("tokenizer.ggml.bos_token_id", 128000);
  writer.kv_bool("tokenizer.ggml.add_bos_token", false);  // as this tokenizer.json's processor
  TempDir dir;
  writer.write(dir / "llama3.gguf");

  CheckpointPaths paths;
  paths.format = CheckpointFormat::kGguf;
  paths.tokenizer = dir / "llama3.gguf";
  const auto from_gguf = load_tokenizer(paths);
  const auto from_json = text::Tokenizer::load(json_path);
  int64_t lines = 0;
  for (const std::string& line : corpus_lines()) {
    const std::vector<int32_t> ids = from_json->encode(line, false);
    ASSERT_EQ(from_gguf->encode(line, false), ids) << line;
    EXPECT_EQ(from_gguf->decode(ids, false), from_json->decode(ids, false)) << line;
    ++lines;
  }
  std::cout << "[ llama3 via GGUF ] equal on " << lines << " corpus lines\n";
}

}  // namespace
}  // namespace specrun
