// The plain generation loop: greedy equals a manual argmax loop, and every stop condition.
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/generate.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override { write_model(/*eos=*/2); }

  void write_model(int32_t eos) {
    fixtures::GeneratorOptions options;
    options.vocab_size = 128;
    options.eos_token_id = eos;
    options.max_position_embeddings = 64;
    fixtures::write_random_checkpoint(options, dir_.path());
  }

  std::unique_ptr<Model> load(int64_t kv_tokens = 0) {
    ModelOptions options;
    options.kv_cache_tokens = kv_tokens;
    options.kv_block_size = 4;
    return Model::load(dir_.path(), *backend_, options);
  }

  static GenerationOptions greedy(int64_t max_tokens, bool stop_at_eos = false) {
    GenerationOptions options;
    options.sampling.temperature = 0.0f;
    options.max_tokens = max_tokens;
    options.stop_at_eos = stop_at_eos;
    return options;
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
  const std::vector<int32_t> prompt_ = {1, 17, 33, 90};
};

TEST_F(GenerateTest, GreedyEqualsAManualArgmaxLoop) {
  auto model = load();
  std::vector<int32_t> streamed;
  const GenerationResult result = generate(*model, prompt_, greedy(12), [&](int32_t token) {
    streamed.push_back(token);
    return true;
  });
  EXPECT_EQ(result.tokens, streamed);
  EXPECT_EQ(result.stop_reason, StopReason::kMaxTokens);
  EXPECT_EQ(result.prompt_tokens, 4);
  EXPECT_EQ(model->kv_cache().num_sequences(), 0);  // the sequence was freed

  // The same by hand: feed the whole sequence so far, take the argmax of the last row.
  std::vector<int32_t> sequence = prompt_;
  std::vector<int32_t> manual;
  for (int step = 0; step < 12; ++step) {
    const SequenceId s = model->kv_cache().add_sequence();
    Logits logits;
    const SequenceInput input[] = {{s, sequence, false}};
    model->forward(input, &logits);
    model->kv_cache().remove_sequence(s);
    manual.push_back(argmax(logits.last(0)));
    sequence.push_back(manual.back());
  }
  EXPECT_EQ(result.tokens, manual);
}

TEST_F(GenerateTest, StopsAtEosWithoutEmittingIt) {
  auto model = load();
  const std::vector<int32_t> free_run = generate(*model, prompt_, greedy(10)).tokens;
  // Make the fourth greedy token the EOS (choosing one that does not occur earlier).
  size_t index = 3;
  while (std::find(free_run.begin(), free_run.begin() + index, free_run[index]) !=
         free_run.begin() + index) {
    ++index;
  }
  ASSERT_LT(index, free_run.size());
  model.reset();
  write_model(free_run[index]);
  model = load();
  const GenerationResult result = generate(*model, prompt_, greedy(10, /*stop_at_eos=*/true));
  EXPECT_EQ(result.stop_reason, StopReason::kEndOfSequence);
  EXPECT_EQ(result.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + index));
  // Ignoring EOS generates through it.
  EXPECT_EQ(generate(*model, prompt_, greedy(10, false)).tokens, free_run);
}

TEST_F(GenerateTest, StopsAtTheContextLimit) {
  // A 12-token cache and a 4-token prompt: 8 more tokens can be fed, so 9 are emitted (the last
  // one is never fed).
  auto model = load(/*kv_tokens=*/12);
  ASSERT_EQ(model->context_limit(), 12);
  const GenerationResult result = generate(*model, prompt_, greedy(100));
  EXPECT_EQ(result.stop_reason, StopReason::kContextLimit);
  EXPECT_EQ(result.tokens.size(), 9u);
  // The trained context limits too: max_position_embeddings is 64.
  auto large_cache = load(/*kv_tokens=*/1000);
  EXPECT_EQ(large_cache->context_limit(), 64);
  EXPECT_EQ(generate(*large_cache, prompt_, greedy(1000)).tokens.size(), 61u);
}

TEST_F(GenerateTest, CallbackCanStopGeneration) {
  auto model = load();
  int calls = 0;
  const GenerationResult result =
      generate(*model, prompt_, greedy(50), [&](int32_t) { return ++calls < 3; });
  EXPECT_EQ(result.stop_reason, StopReason::kStopped);
  EXPECT_EQ(result.tokens.size(), 3u);
}

TEST_F(GenerateTest, SampledGenerationIsReproducibleBySeed) {
  auto model = load();
  GenerationOptions options;
  options.max_tokens = 20;
  options.stop_at_eos = false;
  options.sampling.temperature = 1.5f;
  options.sampling.top_p = 0.95f;
  options.sampling.seed = 5;
  const auto first = generate(*model, prompt_, options).tokens;
  EXPECT_EQ(generate(*model, prompt_, options).tokens, first);
  options.sampling.seed = 6;
  EXPECT_NE(generate(*model, prompt_, options).tokens, first);
}

TEST_F(GenerateTest, RejectsImpossibleRequests) {
  auto model = load(/*kv_tokens=*/8);
  EXPECT_THROW(generate(*model, std::vector<int32_t>{}, greedy(4)), Error);
  const std::vector<int32_t> too_long(9, 5);
  EXPECT_THROW(generate(*model, too_long, greedy(4)), Error);
  EXPECT_THROW(generate(*model, prompt_, greedy(-1)), Error);
  GenerationOptions bad = greedy(4);
  bad.sampling.top_p = 2.0f;
  EXPECT_THROW(generate(*model, prompt_, bad), Error);
  const std::vector<int32_t> bad_token = {1, 128};
  EXPECT_THROW(generate(*model, bad_token, greedy(4)), Error);
  EXPECT_EQ(model->kv_cache().num_sequences(), 0);  // nothing leaked on the error paths
  EXPECT_EQ(model->kv_cache().free_blocks(), 2);
  EXPECT_TRUE(generate(*model, prompt_, greedy(0)).tokens.empty());
}

}  // namespace
}  // namespace specrun
