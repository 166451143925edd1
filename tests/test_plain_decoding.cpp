// Plain decoding is the engine's step with no drafts: greedy equals a manual argmax loop, sampled
// output is reproducible by seed, and every stop condition and refusal holds. The reference
// decode (tests/test_support) is checked here against the manual loop, so that the suites which
// compare the engine with it rest on a checked oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <vector>

#include "tests/host_sampling.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using testing::decode;
using testing::greedy;
using testing::reference_decode;

SpeculationSettings plain() {
  SpeculationSettings settings;
  settings.method = SpeculationMethod::kNone;
  return settings;
}

class PlainDecodingTest : public ::testing::Test {
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

  testing::TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
  const std::vector<int32_t> prompt_ = {1, 17, 33, 90};
};

TEST_F(PlainDecodingTest, GreedyEqualsAManualArgmaxLoop) {
  auto model = load();
  BatchEngine engine(*model, nullptr, {});
  EngineRequest request;
  request.prompt = prompt_;
  request.sampling = greedy(12);
  request.speculation = plain();
  std::vector<int32_t> streamed;
  const RequestId id = engine.submit(request, [&](const RequestUpdate& update) {
    streamed.insert(streamed.end(), update.tokens.begin(), update.tokens.end());
  });
  EXPECT_GT(id, 0u);
  const Completion result = engine.run(request);
  engine.shutdown();
  EXPECT_EQ(result.tokens, streamed);
  EXPECT_EQ(result.reason, FinishReason::kMaxTokens);
  EXPECT_EQ(result.stats.steps, 12);  // one target step per token, no drafts
  EXPECT_EQ(result.stats.drafted, 0);
  EXPECT_EQ(model->kv_cache().num_sequences(), 0);  // the sequences were freed

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
  EXPECT_EQ(reference_decode(*model, prompt_, greedy(12)).tokens, manual);
}

TEST_F(PlainDecodingTest, StopsAtEosWithoutEmittingIt) {
  auto model = load();
  const std::vector<int32_t> free_run =
      decode(*model, nullptr, prompt_, greedy(10), plain()).tokens;
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
  SamplingSettings stopping = greedy(10);
  stopping.stop_at_eos = true;
  const Completion result = decode(*model, nullptr, prompt_, stopping, plain());
  EXPECT_EQ(result.reason, FinishReason::kEndOfSequence);
  EXPECT_EQ(result.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + index));
  EXPECT_EQ(reference_decode(*model, prompt_, stopping).tokens, result.tokens);
  // Ignoring EOS generates through it.
  EXPECT_EQ(decode(*model, nullptr, prompt_, greedy(10), plain()).tokens, free_run);
}

TEST_F(PlainDecodingTest, StopsAtTheContextLimit) {
  // A 12-token cache and a 4-token prompt: 8 more tokens can be fed, so 9 are emitted (the last
  // one is never fed).
  auto model = load(/*kv_tokens=*/12);
  ASSERT_EQ(model->context_limit(), 12);
  const Completion result = decode(*model, nullptr, prompt_, greedy(100), plain());
  EXPECT_EQ(result.reason, FinishReason::kContextLimit);
  EXPECT_EQ(result.tokens.size(), 9u);
  EXPECT_EQ(reference_decode(*model, prompt_, greedy(100)).tokens, result.tokens);
  // The trained context limits too: max_position_embeddings is 64.
  auto large_cache = load(/*kv_tokens=*/1000);
  EXPECT_EQ(large_cache->context_limit(), 64);
  EXPECT_EQ(decode(*large_cache, nullptr, prompt_, greedy(1000), plain()).tokens.size(), 61u);
}

TEST_F(PlainDecodingTest, CancelStopsGeneration) {
  auto model = load();
  BatchEngine engine(*model, nullptr, {});
  EngineRequest request;
  request.prompt = prompt_;
  request.sampling = greedy(50);
  request.speculation = plain();
  std::mutex mutex;
  std::condition_variable finished;
  std::vector<int32_t> tokens;
  std::optional<FinishReason> reason;
  int updates = 0;
  RequestId id = 0;
  {
    std::lock_guard lock(mutex);  // the callback waits until the id is known
    id = engine.submit(request, [&](const RequestUpdate& update) {
      std::lock_guard inner(mutex);
      tokens.insert(tokens.end(), update.tokens.begin(), update.tokens.end());
      if (++updates == 3) engine.cancel(id);
      if (update.finished) {
        reason = update.reason;
        finished.notify_all();
      }
    });
  }
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return reason.has_value(); });
  EXPECT_EQ(*reason, FinishReason::kCancelled);
  EXPECT_EQ(tokens.size(), 3u);  // the step that asked delivered its token; none after it
}

TEST_F(PlainDecodingTest, SampledDecodingIsReproducibleBySeed) {
  auto model = load();
  SamplingSettings sampling;
  sampling.max_tokens = 20;
  sampling.stop_at_eos = false;
  sampling.temperature = 1.5f;
  sampling.top_p = 0.95f;
  sampling.seed = 5;
  const auto first = decode(*model, nullptr, prompt_, sampling, plain()).tokens;
  EXPECT_EQ(decode(*model, nullptr, prompt_, sampling, plain()).tokens, first);
  EXPECT_EQ(reference_decode(*model, prompt_, sampling).tokens, first);
  sampling.seed = 6;
  EXPECT_NE(decode(*model, nullptr, prompt_, sampling, plain()).tokens, first);
}

TEST_F(PlainDecodingTest, RejectsImpossibleRequests) {
  auto model = load(/*kv_tokens=*/8);
  BatchEngine engine(*model, nullptr, {});
  auto submit = [&](std::vector<int32_t> prompt, const SamplingSettings& sampling) {
    EngineRequest request;
    request.prompt = std::move(prompt);
    request.sampling = sampling;
    request.speculation = plain();
    return engine.submit(std::move(request), {});
  };
  testing::expect_error([&] { submit({}, greedy(4)); }, {"prompt is empty"});
  testing::expect_error([&] { submit(std::vector<int32_t>(9, 5), greedy(4)); },
                        {"9 tokens", "context limit of 8"});
  testing::expect_error([&] { submit(prompt_, greedy(-1)); }, {"max_tokens", "-1"});
  SamplingSettings bad = greedy(4);
  bad.top_p = 2.0f;
  testing::expect_error([&] { submit(prompt_, bad); }, {"top_p"});
  testing::expect_error([&] { submit({1, 128}, greedy(4)); }, {"128", "vocabulary"});
  EXPECT_EQ(model->kv_cache().num_sequences(), 0);  // nothing leaked on the error paths
  EXPECT_EQ(model->kv_cache().free_blocks(), 2);
  const Completion none = engine.run([&] {
    EngineRequest request;
    request.prompt = prompt_;
    request.sampling = greedy(0);
    return request;
  }());
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.reason, FinishReason::kMaxTokens);
}

}  // namespace
}  // namespace specrun
