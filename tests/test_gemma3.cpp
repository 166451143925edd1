// A real pretrained Gemma 3 from PyPI: google/gemma-3-270m as GGUF Q4_K_M (18 layers, width 640,
// 4 heads of 256 on one KV head, every sixth layer global and the others attending through a
// window of 512, a 262,144-token SentencePiece vocabulary, tied embeddings; its matrices Q5_0,
// Q4_K, Q6_K and Q8_0), carried in four chunk packages that `tools/setup-python.sh gemma3`
// installs into .venv/ and tools/python/gemma3-path.sh joins. Skipped when it is not installed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "tests/hf_conformance.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;

class Gemma3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto found = testing::run_command(
        "'" + testing::source_path("tools/python/gemma3-path.sh").string() + "' 2>/dev/null");
    if (found.exit_code != 0) return;
    path_ = new fs::path(found.stdout_text.substr(0, found.stdout_text.find('\n')));
    backend_ = testing::make_cpu_backend(2).release();
    ModelOptions options;
    options.kv_cache_dtype = DType::kF32;  // transformers' exact keys and values
    options.kv_cache_tokens = 1024;
    model_ = Model::load(*path_, *backend_, options).release();
    tokenizer_ = load_tokenizer(model_->paths()).release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete backend_;
    delete path_;
  }
  void SetUp() override {
    if (model_ == nullptr) {
      GTEST_SKIP() << "Gemma 3 270M is not installed (tools/setup-python.sh gemma3)";
    }
  }

  // Gemma's chat format, as its chat template renders one user turn (text the tokenizer must
  // split at its special tokens).
  static std::string chat(const std::string& question) {
    return "<start_of_turn>user\n" + question + "<end_of_turn>\n<start_of_turn>model\n";
  }

  static inline fs::path* path_ = nullptr;
  static inline kernels::cpu::CpuBackend* backend_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline text::Tokenizer* tokenizer_ = nullptr;
};

TEST_F(Gemma3Test, ConfigFromTheFile) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.architecture, Architecture::kGemma3);
  EXPECT_EQ(c.num_layers, 18);
  EXPECT_EQ(c.hidden_size, 640);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 512);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    EXPECT_EQ(c.layer_window(layer), layer % 6 == 5 ? 0 : 512) << layer;
  }
  // <eos> and, found by its text, <end_of_turn>.
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 106}));
}

// The file is the pretrained model (google/gemma-3-270m, not the instruction-tuned one): it
// continues text rather than answering turns. Greedy, it knows where the Eiffel Tower stands and
// how a week goes on.
TEST_F(Gemma3Test, ContinuesTextGreedily) {
  for (const auto& [prompt, expected] :
       {std::pair{"The Eiffel Tower is located in the city of", " Paris"},
        std::pair{"Monday, Tuesday, Wednesday,", " Thursday, Friday, Saturday, Sunday"}}) {
    const std::vector<int32_t> ids = tokenizer_->encode(prompt, true);
    ASSERT_EQ(ids.front(), 2);  // <bos>
    const auto start = std::chrono::steady_clock::now();
    const Completion run = testing::decode(*model_, nullptr, ids, testing::greedy(12));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const std::string text = tokenizer_->decode(run.tokens, true);
    std::cout << "[ Gemma 3 ] \"" << prompt << "\" -> \"" << text << "\" (" << run.tokens.size()
              << " tokens, " << ms << " ms)\n";
    EXPECT_EQ(text.rfind(expected, 0), 0u) << text;
  }
}

// The tokenizer specrun converts from the file's metadata against the one transformers converts
// from the same file, on chat strings, text with digits, whitespace and non-ASCII.
TEST_F(Gemma3Test, TokenizerMatchesTransformersGgufConversion) {
  const std::string python =
      testing::venv_python_with("torch, transformers, accelerate, gguf, tokenizers");
  if (python.empty())
    GTEST_SKIP() << "no transformers in the venv (tools/setup-python.sh transformers)";
  testing::TempDir scratch;
  const std::vector<std::string> texts = {
      chat("What is the capital of France?"),
      "The year 2024 had 366 days; 3.14159 is pi.",
      "  leading spaces, trailing spaces  \n\ttabs\tand\nnewlines\n\n",
      "Größe, naïve café, 東京タワー, emoji 🙂 and Ελληνικά.",
      "def main():\n    return [x ** 2 for x in range(10)]\n",
  };
  const nlohmann::json input = {{"texts", texts}};
  testing::write_file(scratch / "texts.json", input.dump());
  const std::string line =
      "'" + python + "' '" + testing::source_path("tests/reference/hf_reference.py").string() +
      "' tokenize --model '" + path_->parent_path().string() + "' --gguf-file '" +
      path_->filename().string() + "' --input '" + (scratch / "texts.json").string() + "' --out '" +
      (scratch / "ids.json").string() + "'";
  const auto result = testing::run_command(line);
  ASSERT_EQ(result.exit_code, 0) << line << "\n" << result.stderr_text;
  const nlohmann::json want = nlohmann::json::parse(testing::read_file(scratch / "ids.json"));
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tokenizer_->encode(texts[i], true),
              want.at("encode_special")[i].get<std::vector<int32_t>>())
        << texts[i];
  }
}

// Logits and greedy continuations against transformers reading the same GGUF file, both ways as
// SmolLM2's suite compares them (tests/test_smollm2.cpp says how the bounds were set): against
// transformers with the matrices specrun widens to bf16 at load (the file's Q5_0, Q4_K and Q6_K
// ones) rounded as its loader rounds them, and its Q8_0 ones (multiplied as stored, widened to
// their f32 values under f32 activations) exact, only f32 rounding separates the two (18 layers:
// 2e-4 of the row's largest logit); against plain transformers (f32 weights), bf16 rounding of
// the weights adds up to 2e-2.
TEST_F(Gemma3Test, LogitsAndGreedyContinuationMatchTransformers) {
  const std::string python =
      testing::venv_python_with("torch, transformers, accelerate, gguf, tokenizers");
  if (python.empty())
    GTEST_SKIP() << "no transformers in the venv (tools/setup-python.sh transformers)";
  testing::TempDir scratch;
  std::string prompt_lines;
  for (const char* question : {"Why is the sky blue?", "Name three planets of the solar system.",
                               "Write one sentence about autumn."}) {
    std::string ids;
    for (const int32_t id : tokenizer_->encode(chat(question), true)) {
      ids += (ids.empty() ? "" : ",") + std::to_string(id);
    }
    prompt_lines += ids + "\n";
  }
  testing::write_file(scratch / "prompts.txt", prompt_lines);
  const std::string line =
      "'" + python + "' '" + testing::source_path("tests/reference/hf_reference.py").string() +
      "' run --model '" + path_->parent_path().string() + "' --gguf-file '" +
      path_->filename().string() + "' --prompts '" + (scratch / "prompts.txt").string() +
      "' --new-tokens 16 --out '" + (scratch / "f32_weights").string() + "' --bf16-weights-out '" +
      (scratch / "bf16_weights").string() + "'";
  const auto result = testing::run_command(line);
  ASSERT_EQ(result.exit_code, 0) << line << "\n" << result.stderr_text;
  for (const bool bf16 : {true, false}) {
    const std::string name = bf16 ? "bf16_weights" : "f32_weights";
    const testing::HfReference reference = testing::load_hf_reference(scratch.path(), name);
    ASSERT_EQ(reference.vocab_size, model_->config().vocab_size);
    const double tolerance = bf16 ? 2e-4 : 2e-2;
    const testing::HfComparison c = testing::compare_with_hf(*model_, reference, tolerance);
    std::cout << "[ Gemma 3 ] " << testing::describe("transformers, " + name, c, tolerance) << " ("
              << reference.versions << ")\n";
    EXPECT_EQ(c.violations, 0) << name << ": " << c.violations
                               << " logits beyond the bound; first at " << c.first_violation;
    EXPECT_EQ(c.greedy_failures, 0) << name << ": greedy choices differ where the reference has "
                                    << "a clear margin; first at " << c.first_greedy_failure;
  }
}

}  // namespace
}  // namespace specrun
