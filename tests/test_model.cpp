// The invariants of the forward pass that speculative decoding builds on, all bitwise on the CPU
// backend: batch invariance, rollback, and prefill-then-decode equal to one forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using fixtures::GeneratorOptions;

std::vector<int32_t> token_run(int32_t first, int count, int32_t vocab) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back((first + 37 * i) % vocab);
  return tokens;
}

bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GeneratorOptions options;
    options.vocab_size = 300;
    options.hidden_size = 96;
    options.intermediate_size = 200;
    options.num_layers = 3;
    options.num_heads = 6;
    options.num_kv_heads = 2;
    fixtures::write_random_checkpoint(options, dir_.path());
  }

  std::unique_ptr<Model> load(kernels::Backend& backend, int64_t block_size = 16,
                              int64_t kv_tokens = 512) {
    ModelOptions options;
    options.kv_block_size = block_size;
    options.kv_cache_tokens = kv_tokens;
    return Model::load(dir_.path(), backend, options);
  }

  // Logits of every token of `tokens`, fed as one prefill on a fresh sequence.
  std::vector<float> prefill_logits(Model& model, const std::vector<int32_t>& tokens) {
    const SequenceId s = model.kv_cache().add_sequence();
    Logits logits;
    const SequenceInput input[] = {{s, tokens, true}};
    model.forward(input, &logits);
    model.kv_cache().remove_sequence(s);
    return logits.values;
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
};

TEST_F(ModelTest, LastLogitsRowsMatchAllLogitsRows) {
  auto model = load(*backend_);
  const std::vector<int32_t> tokens = token_run(3, 9, 300);
  const std::vector<float> all = prefill_logits(*model, tokens);
  const SequenceId s = model->kv_cache().add_sequence();
  Logits last;
  const SequenceInput input[] = {{s, tokens, false}};
  model->forward(input, &last);
  ASSERT_EQ(last.rows(), 1);
  EXPECT_TRUE(bitwise_equal(last.last(0), std::span<const float>(all).subspan(8 * 300, 300)));
  EXPECT_EQ(model->kv_cache().length(s), 9);
}

TEST_F(ModelTest, PrefillThenDecodeEqualsOneForwardBitwise) {
  auto model = load(*backend_, /*block_size=*/4);
  const std::vector<int32_t> tokens = token_run(11, 14, 300);
  const std::vector<float> whole = prefill_logits(*model, tokens);
  // Feed the same tokens in uneven chunks: 5, then one at a time, then 3, then the rest.
  const std::vector<size_t> chunks = {5, 1, 1, 1, 3, 3};
  const SequenceId s = model->kv_cache().add_sequence();
  size_t fed = 0;
  for (const size_t chunk : chunks) {
    Logits logits;
    const SequenceInput input[] = {{s, std::span<const int32_t>(tokens).subspan(fed, chunk), true}};
    model->forward(input, &logits);
    for (size_t i = 0; i < chunk; ++i) {
      ASSERT_TRUE(bitwise_equal(logits.row(static_cast<int64_t>(i)),
                                std::span<const float>(whole).subspan((fed + i) * 300, 300)))
          << "token " << fed + i;
    }
    fed += chunk;
  }
  EXPECT_EQ(fed, tokens.size());
}

TEST_F(ModelTest, RowsAreBatchInvariantBitwise) {
  auto model = load(*backend_, /*block_size=*/8);
  const std::vector<int32_t> x = token_run(5, 7, 300);
  const std::vector<int32_t> y = token_run(40, 12, 300);
  const std::vector<int32_t> z = token_run(99, 1, 300);
  const std::vector<float> x_alone = prefill_logits(*model, x);
  const std::vector<float> y_alone = prefill_logits(*model, y);
  const std::vector<float> z_alone = prefill_logits(*model, z);

  // The same sequences batched in different orders and combinations.
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 2}, {2, 1, 0}};
  const std::vector<int32_t>* inputs[] = {&x, &y, &z};
  const std::vector<float>* alone[] = {&x_alone, &y_alone, &z_alone};
  for (const auto& order : orders) {
    std::vector<SequenceInput> batch;
    for (const int which : order) {
      batch.push_back({model->kv_cache().add_sequence(), *inputs[which], true});
    }
    Logits logits;
    model->forward(batch, &logits);
    for (size_t b = 0; b < order.size(); ++b) {
      const int64_t first = logits.row_begin[b];
      const int64_t rows = logits.row_begin[b + 1] - first;
      ASSERT_EQ(rows, static_cast<int64_t>(inputs[order[b]]->size()));
      ASSERT_TRUE(bitwise_equal(
          std::span<const float>(logits.values).subspan(first * 300, rows * 300), *alone[order[b]]))
          << "sequence " << order[b] << " at batch position " << b;
    }
    for (const SequenceInput& input : batch) model->kv_cache().remove_sequence(input.sequence);
  }
}

TEST_F(ModelTest, DecodeStepsAreBatchInvariantAcrossThreadCounts) {
  // A verification-shaped step (several tokens on a cached prefix) next to other sequences'
  // decode steps, on 1 and 3 threads: identical bits.
  std::vector<std::vector<float>> results;
  for (const int threads : {1, 3}) {
    auto backend = testing::make_cpu_backend(threads);
    auto model = load(*backend);
    const SequenceId a = model->kv_cache().add_sequence();
    const SequenceId b = model->kv_cache().add_sequence();
    Logits logits;
    const std::vector<int32_t> prefix_a = token_run(1, 6, 300), prefix_b = token_run(2, 3, 300);
    const SequenceInput prefill[] = {{a, prefix_a, false}, {b, prefix_b, false}};
    model->forward(prefill, &logits);
    const std::vector<int32_t> verify = token_run(7, 5, 300), step = {17};
    const SequenceInput mixed[] = {{b, step, false}, {a, verify, true}};
    model->forward(mixed, &logits);
    results.emplace_back(logits.values.begin() + 300, logits.values.end());  // a's rows

    // a's verification rows alone, on a fresh model instance, must match too.
    auto alone_model = load(*backend);
    const std::vector<int32_t> joined = [&] {
      std::vector<int32_t> all = prefix_a;
      all.insert(all.end(), verify.begin(), verify.end());
      return all;
    }();
    const std::vector<float> whole = prefill_logits(*alone_model, joined);
    ASSERT_TRUE(
        bitwise_equal(results.back(), std::span<const float>(whole).subspan(6 * 300, 5 * 300)));
  }
  EXPECT_TRUE(bitwise_equal(results[0], results[1]));
}

TEST_F(ModelTest, RollbackThenAppendEqualsAFreshCacheBitwise) {
  // Append A, truncate to keep part of it, append B: the logits of B equal those of a fresh
  // cache fed kept(A) + B. Block size 4 makes the truncation cross and split blocks.
  for (const int64_t keep : {0, 3, 4, 5, 8, 10}) {
    auto model = load(*backend_, /*block_size=*/4);
    const std::vector<int32_t> a = token_run(21, 10, 300);
    const std::vector<int32_t> b = token_run(77, 5, 300);
    KvCache& cache = model->kv_cache();
    const SequenceId s = cache.add_sequence();
    // Another sequence interleaves so that freed blocks are reused by someone else.
    const SequenceId other = cache.add_sequence();
    Logits logits;
    const SequenceInput first[] = {{s, a, true}};
    model->forward(first, &logits);
    cache.truncate(s, keep);
    const std::vector<int32_t> other_tokens = token_run(5, 9, 300);
    const SequenceInput interleaved[] = {{other, other_tokens, false}};
    model->forward(interleaved, &logits);
    const SequenceInput second[] = {{s, b, true}};
    model->forward(second, &logits);

    std::vector<int32_t> expected_tokens(a.begin(), a.begin() + keep);
    expected_tokens.insert(expected_tokens.end(), b.begin(), b.end());
    auto fresh_model = load(*backend_, /*block_size=*/4);
    const std::vector<float> fresh = prefill_logits(*fresh_model, expected_tokens);
    EXPECT_TRUE(bitwise_equal(logits.values, std::span<const float>(fresh).subspan(keep * 300)))
        << "keep " << keep;
  }
}

// A token tree in one forward: a chain with branches forking from it. Each branch token's logits
// equal those of its own path fed as a chain, bitwise; an accepted branch moved into place
// (KvCache::copy_position) continues as if the path had been fed.
TEST_F(ModelTest, ATokenTreeScoresEachPathAsItsOwnChainBitwise) {
  auto model = load(*backend_, /*block_size=*/4);
  KvCache& cache = model->kv_cache();
  const std::vector<int32_t> prefix = token_run(9, 6, 300);
  const SequenceId s = cache.add_sequence();
  Logits logits;
  const SequenceInput prefill[] = {{s, prefix, false}};
  model->forward(prefill, &logits);
  // [pending, d1, d2, d3, a1, a2, a2'] with a1 beside d1 (after pending), a2 and a2' beside d2.
  const std::vector<int32_t> tree = {11, 12, 13, 14, 21, 22, 23};
  const std::vector<int32_t> parents = {-1, 0, 1, 2, 0, 1, 1};
  SequenceInput scored[] = {{s, tree, true}};
  scored[0].parents = parents;
  model->forward(scored, &logits);
  ASSERT_EQ(logits.rows(), 7);
  EXPECT_EQ(cache.length(s), 6 + 7);
  const auto path_logits = [&](std::vector<int32_t> path) {
    std::vector<int32_t> text = prefix;
    text.insert(text.end(), path.begin(), path.end());
    const std::vector<float> all = prefill_logits(*model, text);
    return std::vector<float>(all.end() - 300, all.end());
  };
  const std::vector<std::vector<int32_t>> paths = {
      {11}, {11, 12}, {11, 12, 13}, {11, 12, 13, 14}, {11, 21}, {11, 12, 22}, {11, 12, 23}};
  for (size_t row = 0; row < paths.size(); ++row) {
    EXPECT_TRUE(bitwise_equal(logits.row(static_cast<int64_t>(row)), path_logits(paths[row])))
        << "row " << row;
  }
  // Accept pending, d1, then a2' (fed at 6 + 6): it moves to position 6 + 2, the cache keeps
  // those three, and the next token reads them.
  cache.copy_position(s, 6 + 6, 6 + 2);
  cache.truncate(s, 6 + 3);
  const std::vector<int32_t> next = {31};
  const SequenceInput step[] = {{s, next, false}};
  model->forward(step, &logits);
  EXPECT_TRUE(bitwise_equal(logits.last(0), path_logits({11, 12, 23, 31})));
}

TEST_F(ModelTest, ATreeOfAnotherShapeOrWithBadParentsIsRefusedBeforeTheCacheIsTouched) {
  auto model = load(*backend_);
  KvCache& cache = model->kv_cache();
  const SequenceId s = cache.add_sequence();
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<std::vector<int32_t>> bad = {
      {-1, 0, 1},            // one parent short
      {-1, 0, 2, 2, 3, 4},   // a parent that comes after (itself)
      {-1, 0, -2, 1, 2, 3},  // below -1
      {-1, 0, 0, 1, 2, 4},   // 5's path 0, 2, 4, 5 is the chain's first and then no run
  };
  for (const std::vector<int32_t>& parents : bad) {
    SequenceInput input[] = {{s, tokens, true}};
    input[0].parents = parents;
    Logits logits;
    try {
      model->forward(input, &logits);
      ADD_FAILURE() << "accepted parents of size " << parents.size();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("sequence " + std::to_string(s)), std::string::npos)
          << error.what();
    }
    EXPECT_EQ(cache.length(s), 0);
  }
}

// A backend whose attention takes no key gaps (CUDA today) is refused a tree, by name, before the
// cache is touched.
TEST_F(ModelTest, ABackendWithoutKeyGapsIsRefusedATree) {
  struct NoKeyGaps : testing::ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    bool attends_with_key_gaps() const override { return false; }
  } backend(*backend_);
  auto model = load(backend);
  const SequenceId s = model->kv_cache().add_sequence();
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> parents = {-1, 0, 0};
  SequenceInput input[] = {{s, tokens, true}};
  input[0].parents = parents;
  Logits logits;
  try {
    model->forward(input, &logits);
    ADD_FAILURE() << "a tree was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("does not take token trees"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(model->kv_cache().length(s), 0);
}

TEST_F(ModelTest, BadInputLeavesEveryCacheUntouched) {
  auto model = load(*backend_);
  KvCache& cache = model->kv_cache();
  const SequenceId s = cache.add_sequence();
  const std::vector<int32_t> prefix = token_run(1, 4, 300);
  Logits logits;
  const SequenceInput prefill[] = {{s, prefix, false}};
  model->forward(prefill, &logits);
  const std::vector<float> before(logits.values);

  const std::vector<int32_t> out_of_vocab = {5, 300};
  const std::vector<int32_t> negative = {-1};
  const std::vector<int32_t> empty;
  const std::vector<int32_t> good = {7};
  const SequenceInput bad_token[] = {{s, out_of_vocab, false}};
  const SequenceInput bad_negative[] = {{s, negative, false}};
  const SequenceInput no_tokens[] = {{s, empty, false}};
  const SequenceInput unknown[] = {{s, good, false}, {12345, good, false}};
  const SequenceInput twice[] = {{s, good, false}, {s, good, false}};
  for (const auto& batch :
       {std::span<const SequenceInput>(bad_token), std::span<const SequenceInput>(bad_negative),
        std::span<const SequenceInput>(no_tokens), std::span<const SequenceInput>(unknown),
        std::span<const SequenceInput>(twice)}) {
    EXPECT_THROW(model->forward(batch, &logits), Error);
    EXPECT_EQ(cache.length(s), 4);
  }
  // The sequence goes on as if nothing happened: its next logits equal a clean run's.
  const SequenceInput step[] = {{s, good, false}};
  model->forward(step, &logits);
  std::vector<int32_t> clean = prefix;
  clean.push_back(7);
  const std::vector<float> expected = prefill_logits(*model, clean);
  EXPECT_TRUE(bitwise_equal(logits.values, std::span<const float>(expected).subspan(4 * 300)));
}

TEST_F(ModelTest, KvExhaustionIsAClearErrorThatCorruptsNothing) {
  auto model = load(*backend_, /*block_size=*/4, /*kv_tokens=*/16);  // 4 blocks
  KvCache& cache = model->kv_cache();
  const SequenceId a = cache.add_sequence();
  const SequenceId b = cache.add_sequence();
  const std::vector<int32_t> prefix_a = token_run(3, 9, 300);  // 3 blocks
  Logits logits;
  const SequenceInput fill[] = {{a, prefix_a, false}};
  model->forward(fill, &logits);
  const std::vector<int32_t> too_long = token_run(4, 5, 300);  // needs 2 blocks, 1 free
  const std::vector<int32_t> step = {9};
  const SequenceInput overflow[] = {{a, step, false}, {b, too_long, false}};
  try {
    model->forward(overflow, &logits);
    FAIL() << "no error";
  } catch (const KvCacheFullError& error) {
    EXPECT_NE(std::string(error.what()).find("KV cache full"), std::string::npos);
  }
  EXPECT_EQ(cache.length(a), 9);
  EXPECT_EQ(cache.length(b), 0);
  EXPECT_EQ(cache.free_blocks(), 1);
  const SequenceInput continue_a[] = {{a, step, false}};
  model->forward(continue_a, &logits);
  std::vector<int32_t> clean = prefix_a;
  clean.push_back(9);
  auto fresh = load(*backend_);
  const std::vector<float> expected = prefill_logits(*fresh, clean);
  EXPECT_TRUE(bitwise_equal(logits.values, std::span<const float>(expected).subspan(9 * 300)));
}

TEST_F(ModelTest, TwoModelsShareAProcessAndAPoolIndependently) {
  // A draft and a target: different shapes, one thread pool, interleaved calls.
  testing::TempDir draft_dir;
  GeneratorOptions draft_options;
  draft_options.vocab_size = 300;
  draft_options.num_layers = 1;
  draft_options.seed = 9;
  fixtures::write_random_checkpoint(draft_options, draft_dir.path());
  auto target = load(*backend_);
  auto draft = Model::load(draft_dir.path(), *backend_);
  const std::vector<int32_t> tokens = token_run(8, 6, 300);
  const std::vector<float> target_alone = prefill_logits(*target, tokens);
  const std::vector<float> draft_alone = prefill_logits(*draft, tokens);

  const SequenceId t = target->kv_cache().add_sequence();
  const SequenceId d = draft->kv_cache().add_sequence();
  Logits target_logits, draft_logits;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t token[] = {tokens[i]};
    const SequenceInput d_step[] = {{d, token, false}};
    const SequenceInput t_step[] = {{t, token, false}};
    draft->forward(d_step, &draft_logits);
    target->forward(t_step, &target_logits);
    ASSERT_TRUE(bitwise_equal(target_logits.values,
                              std::span<const float>(target_alone).subspan(i * 300, 300)));
    ASSERT_TRUE(bitwise_equal(draft_logits.values,
                              std::span<const float>(draft_alone).subspan(i * 300, 300)));
  }
}

TEST_F(ModelTest, ReportsShapeAndLimits) {
  auto model = load(*backend_, 16, 100);
  EXPECT_EQ(model->config().num_layers, 3);
  EXPECT_EQ(model->context_limit(), 112);  // 100 tokens round up to 7 blocks of 16
  // embed + lm_head + per layer (q, k, v, o, gate, up, down, 2 norms) + final norm
  const int64_t per_layer = 96 * 96 + 2 * 32 * 96 + 96 * 96 + 3 * 200 * 96 + 2 * 96;
  EXPECT_EQ(model->parameter_count(), 2 * 300 * 96 + 3 * per_layer + 96);
  // bf16; the CPU lays matmul weights out in tiles of 16 columns: down_proj's 200 take 208.
  const int64_t padding = 3 * 96 * 8;
  EXPECT_EQ(model->weight_bytes(), 2u * (2 * 300 * 96 + 3 * per_layer + 96 + padding));
  // A decode step reads one row of the untied table: 300 rows less one.
  EXPECT_EQ(model->decode_read_bytes(),
            2u * (2 * 300 * 96 + 3 * per_layer + 96 + padding) - 2u * 299 * 96);
}

TEST_F(ModelTest, TheMemoryPlanIsWhatTheModelHolds) {
  // Weights as placed (in place on the CPU; quantized at load), and the cache as allocated.
  for (const WeightQuantize quantize :
       {WeightQuantize::kNone, WeightQuantize::kINT8, WeightQuantize::kFP8}) {
    for (const bool head : {false, true}) {
      ModelOptions options;
      options.kv_cache_tokens = 100;  // whole blocks: 112
      options.quantize = quantize;
      options.quantize_output = head;
      const auto model = Model::load(dir_.path(), *backend_, options);
      const MemoryNeeds needs = Model::plan_memory(open_checkpoint(dir_.path()), options, true,
                                                   testing::layouts_of(*backend_), 8);
      EXPECT_EQ(needs.weight_bytes, model->weight_bytes()) << int(quantize) << " head " << head;
      EXPECT_EQ(needs.kv_tokens, model->kv_cache().capacity_tokens());
      EXPECT_EQ(needs.kv_bytes, needs.kv_bytes_per_token * 112u);
      // 3 layers of K and V, 2 heads of 16, bf16 (the default)
      EXPECT_EQ(needs.kv_bytes_per_token, 2u * 3 * 2 * 16 * 2);
      EXPECT_EQ(needs.kv_bytes_per_token, model->kv_cache().bytes_per_token());
    }
  }
  ModelOptions f32;
  f32.kv_cache_tokens = 100;
  f32.kv_cache_dtype = DType::kF32;
  const auto model = Model::load(dir_.path(), *backend_, f32);
  const MemoryNeeds needs = Model::plan_memory(open_checkpoint(dir_.path()), f32, true,
                                               testing::layouts_of(*backend_), 8);
  EXPECT_EQ(needs.kv_bytes_per_token, 2u * 3 * 2 * 16 * sizeof(float));
  EXPECT_EQ(needs.kv_bytes_per_token, model->kv_cache().bytes_per_token());
}

TEST_F(ModelTest, AReducedHeadScoresItsTokensAsTheFullHeadAndBansTheRest) {
  // A draft's head reduced to some tokens: their logits are the full head's rows (the same
  // weights, multiplied alone), every other token's is -infinity, and the model holds and plans
  // only the rows it keeps, in each weight format.
  std::vector<int32_t> kept;
  for (int32_t id = 0; id < 300; id += 3) kept.push_back(id);
  kept.push_back(299);
  const auto reduced_dir = dir_.path() / "reduced";
  fixtures::write_reduced_head_checkpoint(dir_.path(), kept, reduced_dir);
  const std::vector<int32_t> tokens = token_run(5, 9, 300);
  for (const WeightQuantize quantize : {WeightQuantize::kNone, WeightQuantize::kINT8}) {
    SCOPED_TRACE(int(quantize));
    ModelOptions options;
    options.kv_cache_tokens = 64;
    options.quantize = quantize;
    options.quantize_output = quantize != WeightQuantize::kNone;
    const auto full = Model::load(dir_.path(), *backend_, options);
    const auto reduced = Model::load(reduced_dir, *backend_, options);
    EXPECT_EQ(reduced->config().output_token_ids, kept);
    const std::vector<float> expected = prefill_logits(*full, tokens);  // [9, 300]
    const std::vector<float> got = prefill_logits(*reduced, tokens);    // [9, 300]
    ASSERT_EQ(got.size(), expected.size());
    const std::set<int32_t> scored(kept.begin(), kept.end());
    int64_t compared = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (scored.count(static_cast<int32_t>(i % 300)) != 0) {
        // Each output row is its own dot product: the same bits whatever rows share the head.
        ASSERT_EQ(got[i], expected[i]) << "row " << i / 300 << ", token " << i % 300;
        ++compared;
      } else {
        ASSERT_EQ(got[i], -std::numeric_limits<float>::infinity()) << "token " << i % 300;
      }
    }
    EXPECT_EQ(compared, 9 * static_cast<int64_t>(kept.size()));
    EXPECT_LT(reduced->weight_bytes(), full->weight_bytes());
    EXPECT_EQ(Model::plan_memory(open_checkpoint(reduced_dir), options, true,
                                 testing::layouts_of(*backend_), 8)
                  .weight_bytes,
              reduced->weight_bytes());
    EXPECT_EQ(reduced->parameter_count(),
              full->parameter_count() - (300 - static_cast<int64_t>(kept.size())) * 96);
  }
}

TEST_F(ModelTest, AReducedHeadMustMatchItsTokenList) {
  const auto reduced_dir = dir_.path() / "reduced";
  fixtures::write_reduced_head_checkpoint(dir_.path(), {1, 5, 7}, reduced_dir);
  // config.json's list and the head's rows disagree: the tensor is named.
  const auto config_path = reduced_dir / "config.json";
  nlohmann::json config = nlohmann::json::parse(testing::read_file(config_path));
  config["output_token_ids"] = {1, 5, 7, 9};
  testing::write_file(config_path, config.dump());
  testing::expect_error([&] { Model::load(reduced_dir, *backend_); },
                        {"model.safetensors", "tensor 'lm_head.weight' has shape [3, 96]",
                         "one row per output_token_ids entry"});
  // Nothing to reduce from a tied head.
  GeneratorOptions tied;
  tied.tie_word_embeddings = true;
  fixtures::write_random_checkpoint(tied, dir_.path() / "tied");
  testing::expect_error(
      [&] {
        fixtures::write_reduced_head_checkpoint(dir_.path() / "tied", {1}, dir_.path() / "x");
      },
      {"ties its output projection"});
}

TEST_F(ModelTest, ABf16KvCacheStaysWithinItsRoundingOfTheF32Cache) {
  // Keys and values rounded to bf16 (8 bits of mantissa) move each logit by about 2^-9 of the
  // attention output's size times the weights downstream: well under 1% of the logits' spread on
  // this model, with the same greedy choices where the f32 margin is clear. Each cache alone keeps
  // prefill-then-decode bitwise equal to one forward.
  ModelOptions options;
  options.kv_cache_tokens = 512;
  options.kv_cache_dtype = DType::kF32;
  const auto exact = Model::load(dir_.path(), *backend_, options);
  options.kv_cache_dtype = DType::kBF16;
  const auto rounded = Model::load(dir_.path(), *backend_, options);
  ASSERT_EQ(rounded->kv_cache().layout().dtype, DType::kBF16);
  const std::vector<int32_t> tokens = token_run(5, 40, 300);
  const std::vector<float> reference = prefill_logits(*exact, tokens);
  const std::vector<float> got = prefill_logits(*rounded, tokens);
  ASSERT_EQ(got.size(), reference.size());
  double largest_error = 0.0;
  double spread = 0.0;
  int clear_margins = 0;
  for (size_t row = 0; row < tokens.size(); ++row) {
    const float* want = reference.data() + row * 300;
    const float* have = got.data() + row * 300;
    const auto [low, high] = std::minmax_element(want, want + 300);
    spread = std::max(spread, static_cast<double>(*high - *low));
    for (int i = 0; i < 300; ++i) {
      largest_error = std::max(largest_error, std::abs(static_cast<double>(have[i]) - want[i]));
    }
    // Greedy choice where the f32 logits' top two are apart by more than twice the error bound.
    std::vector<float> sorted(want, want + 300);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] > 0.02 * spread) {
      ++clear_margins;
      EXPECT_EQ(std::max_element(have, have + 300) - have,
                std::max_element(want, want + 300) - want)
          << "row " << row;
    }
  }
  EXPECT_GT(largest_error, 0.0) << "the bf16 cache changed nothing: is it stored as bf16?";
  EXPECT_LT(largest_error, 0.01 * spread);
  EXPECT_GT(clear_margins, 10);
}

// The small model the device-placement tests load: 300 tokens (not a multiple of any tile), 64
// wide, two layers of grouped-query attention.
GeneratorOptions device_weights_shape(DType dtype) {
  GeneratorOptions options;
  options.vocab_size = 300;
  options.hidden_size = 64;
  options.intermediate_size = 128;
  options.num_layers = 2;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.dtype = dtype;
  return options;
}

TEST(DeviceWeights, ThePlansForwardShapeIsEveryLinearLayerAtItsLargest) {
  // What a backend's own scratch is planned from: every linear layer with the rows of a forward
  // filling the cache (the head with the logits rows), in the dtype it is placed in, and attention
  // over the whole cache.
  testing::TempDir dir;
  GeneratorOptions options = device_weights_shape(DType::kBF16);
  options.tie_word_embeddings = true;
  fixtures::write_random_checkpoint(options, dir.path());
  ModelOptions model_options;
  model_options.kv_cache_tokens = 60;  // 64 in whole blocks of 16
  const auto plan = [&](const ModelOptions& o, bool host_memory) {
    return Model::plan_memory(
               open_checkpoint(dir.path()), o, host_memory,
               [](DType) { return kernels::WeightLayout::kRows; }, 6)
        .forward;
  };
  const kernels::ForwardShape forward = plan(model_options, false);
  ASSERT_EQ(forward.matmuls.size(), 7u * 2 + 1);  // q, k, v, o, gate, up, down; the tied head
  std::multiset<std::array<int64_t, 3>> shapes;
  for (const kernels::MatmulParams& m : forward.matmuls) {
    shapes.insert({m.rows, m.in_features, m.out_features});
    EXPECT_EQ(m.weight_dtype, DType::kBF16);  // a device holds bf16
  }
  // Per layer q, k, v, o, gate, up, down (rows, in, out); the head with the logits rows.
  std::multiset<std::array<int64_t, 3>> expected = {{6, 64, 300}};
  for (int layer = 0; layer < 2; ++layer) {
    expected.insert({{64, 64, 64},
                     {64, 64, 32},
                     {64, 64, 32},
                     {64, 64, 64},
                     {64, 64, 128},
                     {64, 64, 128},
                     {64, 128, 64}});
  }
  EXPECT_EQ(shapes, expected);
  EXPECT_EQ(forward.attention.num_tokens, 64);
  EXPECT_EQ(forward.attention.num_seqs, 1);
  EXPECT_EQ(forward.attention.num_heads, 4);
  EXPECT_EQ(forward.attention.num_kv_heads, 2);
  EXPECT_EQ(forward.attention.head_dim, 16);
  EXPECT_EQ(forward.attention.block_size * forward.attention.max_blocks_per_seq, 64);
  EXPECT_EQ(forward.attention.cache_dtype, DType::kBF16);
  // Quantized at load: the linear layers as codes, the head too when asked.
  ModelOptions int8 = model_options;
  int8.quantize = WeightQuantize::kINT8;
  for (const bool head : {false, true}) {
    int8.quantize_output = head;
    for (const kernels::MatmulParams& m : plan(int8, false).matmuls) {
      const bool is_head = m.out_features == 300;
      EXPECT_EQ(m.weight_dtype, is_head && !head ? DType::kBF16 : DType::kI8);
    }
  }
  ModelOptions fp8 = model_options;
  fp8.quantize = WeightQuantize::kFP8;
  EXPECT_EQ(plan(fp8, false).matmuls.front().weight_dtype, DType::kF8E4M3);
  // Options the load refuses, the plan refuses alike.
  ModelOptions no_blocks = model_options;
  no_blocks.kv_block_size = 0;
  testing::expect_error([&] { plan(no_blocks, false); }, {"KV block size must be positive"});
  // On the host the weights stay as stored.
  for (const kernels::MatmulParams& m : plan(model_options, true).matmuls) {
    EXPECT_EQ(m.weight_dtype, options.dtype);
  }
}

TEST(DeviceWeights, F32AndF16CheckpointsAreUploadedAsBf16) {
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend cpu(pool);
  std::vector<std::vector<float>> logits;
  for (const DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    testing::TempDir dir;
    const GeneratorOptions options = device_weights_shape(dtype);
    fixtures::write_random_checkpoint(options, dir.path());
    testing::DeviceLikeBackend device(pool);
    ModelOptions model_options;
    model_options.kv_cache_tokens = 64;
    const auto model = Model::load(dir.path(), device, model_options);
    const auto on_host = Model::load(dir.path(), cpu, model_options);
    // The device holds bf16: half the bytes of f32, as many as f16, every one of them uploaded.
    EXPECT_EQ(model->weight_bytes(), 2u * static_cast<uint64_t>(model->parameter_count()));
    EXPECT_GE(device.uploaded, model->weight_bytes());
    EXPECT_EQ(on_host->weight_bytes(),
              dtype_size(dtype) * static_cast<uint64_t>(on_host->parameter_count()));
    // The memory plan knows both placements.
    EXPECT_EQ(Model::plan_memory(open_checkpoint(dir.path()), model_options, false,
                                 testing::layouts_of(device), 1)
                  .weight_bytes,
              model->weight_bytes());
    EXPECT_EQ(Model::plan_memory(open_checkpoint(dir.path()), model_options, true,
                                 testing::layouts_of(cpu), 1)
                  .weight_bytes,
              on_host->weight_bytes());
    // With bf16 activations, bf16 weights take the layout of the copy of the matmul in use (AMX's
    // pair tiles pad the 300-row table to 304 rows): the plan still counts what the model holds.
    kernels::cpu::CpuBackend rounded(pool, kernels::cpu::Activations::kBF16);
    const auto on_host_rounded = Model::load(dir.path(), rounded, model_options);
    EXPECT_EQ(Model::plan_memory(open_checkpoint(dir.path()), model_options, true,
                                 testing::layouts_of(rounded), 1)
                  .weight_bytes,
              on_host_rounded->weight_bytes());
    if (rounded.matmul_weight_layout(dtype) == kernels::WeightLayout::kPairTiles) {
      EXPECT_GT(on_host_rounded->weight_bytes(), on_host->weight_bytes());
    }
    const SequenceId s = model->kv_cache().add_sequence();
    const std::vector<int32_t> tokens = {1, 7, 42, 299, 3};
    Logits out;
    const SequenceInput input[] = {{s, tokens, true}};
    model->forward(input, &out);
    logits.push_back(out.values);
  }
  // Every checkpoint stores the same draws (rounded to its dtype); f32 rounded to bf16 is the
  // bf16 checkpoint exactly. f16 rounds first to f16, so it may differ in the last bf16 bit.
  EXPECT_EQ(logits[1], logits[0]);
  ASSERT_EQ(logits[2].size(), logits[0].size());
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_NEAR(logits[2][i], logits[0][i], 0.05 + 0.02 * std::fabs(logits[0][i])) << i;
  }
}

TEST(MatmulGroup, IsEachTargetsMatmulAndRefusesMismatchedTargets) {
  // The backend-neutral group (the CPU backend's): every target as matmul() computes it alone.
  auto backend = testing::make_cpu_backend(2);
  const int64_t rows = 3, in = 48;
  const std::vector<float> x = testing::random_floats(rows * in, 1);
  const testing::StoredTensor a = testing::store(testing::random_floats(20 * in, 2), DType::kBF16);
  const testing::StoredTensor b = testing::store(testing::random_floats(7 * in, 3), DType::kF32);
  const testing::StoredTensor bias = testing::store(testing::random_floats(7, 4), DType::kF32);
  std::vector<float> out_a(rows * 20), out_b(rows * 7), alone_a(rows * 20), alone_b(rows * 7);
  const kernels::MatmulTarget targets[] = {{{rows, in, 20, DType::kBF16, DType::kF32},
                                            a.data(DType::kBF16),
                                            nullptr,
                                            nullptr,
                                            out_a.data()},
                                           {{rows, in, 7, DType::kF32, DType::kF32},
                                            b.data(DType::kF32),
                                            nullptr,
                                            bias.data(DType::kF32),
                                            out_b.data()}};
  ASSERT_TRUE(backend->matmul_group(x.data(), targets, 2).is_ok());
  ASSERT_TRUE(
      backend
          ->matmul(targets[0].params, x.data(), targets[0].weight, nullptr, nullptr, alone_a.data())
          .is_ok());
  ASSERT_TRUE(backend
                  ->matmul(targets[1].params, x.data(), targets[1].weight, nullptr, targets[1].bias,
                           alone_b.data())
                  .is_ok());
  EXPECT_EQ(out_a, alone_a);
  EXPECT_EQ(out_b, alone_b);
  kernels::MatmulTarget mismatched[] = {targets[0], targets[1]};
  mismatched[1].params.rows = 2;
  EXPECT_EQ(backend->matmul_group(x.data(), mismatched, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->matmul_group(x.data(), targets, 0).code(), StatusCode::kInvalidArgument);
}

TEST(FusedOps, TheBackendNeutralOnesAreTheTwoOpsAndRefuseMismatchedShapes) {
  // rope_kv_write and add_rmsnorm as the CPU backend runs them: the two calls each stands for.
  auto backend = testing::make_cpu_backend(2);
  const int64_t tokens = 3, heads = 4, kv_heads = 2, head_dim = 8, slots = 16;
  const kernels::RopeParams rope{tokens, heads, kv_heads, head_dim,
                                 kernels::RopeStyle::kRotateHalf};
  const kernels::KvWriteParams cache{tokens, kv_heads, head_dim, slots, DType::kBF16};
  const std::vector<int32_t> positions = {4, 5, 9}, slot_ids = {15, 0, 7};
  const std::vector<float> inv_freq = {1.0f, 0.5f, 0.25f, 0.125f};
  const std::vector<float> q = testing::random_floats(tokens * heads * head_dim, 5);
  const std::vector<float> k = testing::random_floats(tokens * kv_heads * head_dim, 6);
  const std::vector<float> v = testing::random_floats(tokens * kv_heads * head_dim, 7);
  std::vector<float> q1 = q, k1 = k, q2 = q, k2 = k;
  std::vector<uint16_t> kc1(slots * kv_heads * head_dim), vc1 = kc1, kc2 = kc1, vc2 = kc1;
  ASSERT_TRUE(backend->rope(rope, positions.data(), inv_freq.data(), q1.data(), k1.data()).is_ok());
  ASSERT_TRUE(backend->kv_write(cache, k1.data(), v.data(), slot_ids.data(), kc1.data(), vc1.data())
                  .is_ok());
  ASSERT_TRUE(backend
                  ->rope_kv_write(rope, cache, positions.data(), inv_freq.data(), slot_ids.data(),
                                  q2.data(), k2.data(), v.data(), kc2.data(), vc2.data())
                  .is_ok());
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(kc1, kc2);
  EXPECT_EQ(vc1, vc2);
  kernels::KvWriteParams other = cache;
  other.num_kv_heads = 1;
  EXPECT_EQ(backend
                ->rope_kv_write(rope, other, positions.data(), inv_freq.data(), slot_ids.data(),
                                q2.data(), k2.data(), v.data(), kc2.data(), vc2.data())
                .code(),
            StatusCode::kInvalidArgument);

  const kernels::RmsNormParams norm{tokens, 40, 1e-5f, DType::kBF16};
  const testing::StoredTensor weight = testing::store(testing::random_floats(40, 8), DType::kBF16);
  const std::vector<float> addend = testing::random_floats(tokens * 40, 9);
  std::vector<float> x1 = testing::random_floats(tokens * 40, 10), x2 = x1;
  std::vector<float> out1(x1.size()), out2(x1.size());
  ASSERT_TRUE(backend->add(tokens * 40, addend.data(), x1.data()).is_ok());
  ASSERT_TRUE(backend->rmsnorm(norm, x1.data(), weight.data(DType::kBF16), out1.data()).is_ok());
  ASSERT_TRUE(
      backend->add_rmsnorm(norm, addend.data(), x2.data(), weight.data(DType::kBF16), out2.data())
          .is_ok());
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(backend
                ->add_rmsnorm({tokens, 0, 1e-5f, DType::kBF16}, addend.data(), x2.data(),
                              weight.data(DType::kBF16), out2.data())
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(SyntheticModel, PublishedShapesAndTheirSizes) {
  // Parameter counts of the published checkpoints these shapes stand for.
  const auto parameters = [](const ModelConfig& c) {
    const int64_t per_layer = 2 * c.hidden_size * c.num_heads * c.head_dim +
                              2 * c.hidden_size * c.num_kv_heads * c.head_dim +
                              3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size;
    return c.num_layers * per_layer + c.hidden_size +
           (c.tie_word_embeddings ? 1 : 2) * c.vocab_size * c.hidden_size;
  };
  EXPECT_EQ(parameters(synthetic_config("llama-3.2-1b")), 1235814400);
  EXPECT_EQ(parameters(synthetic_config("llama-3.1-8b")), 8030261248);
  EXPECT_EQ(parameters(synthetic_config("llama-3.1-70b")), 70553706496);
  testing::expect_error([] { synthetic_config("llama-9"); }, {"'llama-9'", "llama-3.1-8b", "tiny"});
}

TEST(SyntheticModel, WeightsDependOnTheSeedAloneAndLogitsStayFinite) {
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend backend(pool);
  const ModelConfig config = synthetic_config("tiny");
  ModelOptions options;
  options.kv_cache_tokens = 64;
  auto logits_of = [&](Model& model) {
    const SequenceId s = model.kv_cache().add_sequence();
    const std::vector<int32_t> tokens = {1, 17, 4000, 5, 5, 260};
    Logits logits;
    const SequenceInput input[] = {{s, tokens, true}};
    model.forward(input, &logits);
    model.kv_cache().remove_sequence(s);
    return logits.values;
  };
  const auto first = Model::synthetic(config, "synthetic tiny", 9, backend, options);
  const auto again = Model::synthetic(config, "synthetic tiny", 9, backend, options);
  const auto other = Model::synthetic(config, "synthetic tiny", 10, backend, options);
  EXPECT_EQ(first->paths().directory, "synthetic tiny");
  const int64_t per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512 + 2 * 256;
  EXPECT_EQ(first->parameter_count(), 2 * per_layer + 256 + 4096 * 256);  // tied
  EXPECT_EQ(first->weight_bytes(), 2u * static_cast<uint64_t>(first->parameter_count()));
  EXPECT_EQ(first->decode_read_bytes(), first->weight_bytes());  // the tied head reads it all
  const std::vector<float> a = logits_of(*first), b = logits_of(*again), c = logits_of(*other);
  ASSERT_EQ(a.size(), 6u * 4096u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean_square = 0;
  for (const float value : a) {
    ASSERT_TRUE(std::isfinite(value));
    mean_square += double(value) * value;
  }
  // The weights' scale keeps activations of order one through the layers.
  mean_square /= double(a.size());
  EXPECT_GT(mean_square, 1e-2);
  EXPECT_LT(mean_square, 1e4);
}

TEST(SyntheticModel, QuantizedWeightsAreCodesWithOneScaleARow) {
  // --quantize on a synthetic model: one byte a linear weight and an f32 scale a row, written
  // directly; the activations keep the bf16 model's scale.
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend backend(pool);
  const ModelConfig config = synthetic_config("tiny");  // tied
  const int64_t linear = 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512);
  const int64_t linear_rows = 2 * (256 + 2 * 128 + 256 + 2 * 512 + 256);
  const int64_t others = 2 * 2 * 256 + 256 + 4096 * 256;  // norms and the table, bf16
  for (const WeightQuantize quantize : {WeightQuantize::kFP8, WeightQuantize::kINT8}) {
    for (const bool head : {false, true}) {
      ModelOptions options;
      options.kv_cache_tokens = 64;
      options.quantize = quantize;
      options.quantize_output = head;
      const auto model = Model::synthetic(config, "synthetic tiny", 9, backend, options);
      const std::string what = std::string(quantize == WeightQuantize::kFP8 ? "fp8" : "int8") +
                               (head ? " with its head" : "");
      EXPECT_EQ(model->parameter_count(), linear + others) << what;
      const uint64_t head_copy = head ? 4096u * 256u + 4096u * sizeof(float) : 0u;
      EXPECT_EQ(model->weight_bytes(), static_cast<uint64_t>(linear) +
                                           static_cast<uint64_t>(linear_rows) * sizeof(float) +
                                           2u * static_cast<uint64_t>(others) + head_copy)
          << what;
      const SequenceId s = model->kv_cache().add_sequence();
      const std::vector<int32_t> tokens = {1, 17, 4000, 5, 5, 260};
      Logits logits;
      const SequenceInput input[] = {{s, tokens, true}};
      model->forward(input, &logits);
      double mean_square = 0;
      for (const float value : logits.values) {
        ASSERT_TRUE(std::isfinite(value)) << what;
        mean_square += double(value) * value;
      }
      mean_square /= double(logits.values.size());
      EXPECT_GT(mean_square, 1e-2) << what;
      EXPECT_LT(mean_square, 1e4) << what;
    }
  }
}

TEST(SyntheticModel, AnUntiedShapeGetsItsOwnHead) {
  // The published 8B shape is untied: its head is a second table, which a decode step reads in
  // full while it reads one row of the embedding.
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend backend(pool);
  ModelConfig config = synthetic_config("tiny");
  config.tie_word_embeddings = false;
  ModelOptions options;
  options.kv_cache_tokens = 64;
  const auto model = Model::synthetic(config, "synthetic tiny, untied", 9, backend, options);
  const int64_t per_layer = 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512 + 2 * 256;
  EXPECT_EQ(model->parameter_count(), 2 * per_layer + 256 + 2 * 4096 * 256);
  EXPECT_EQ(model->weight_bytes(), 2u * static_cast<uint64_t>(model->parameter_count()));
  EXPECT_EQ(model->decode_read_bytes(), model->weight_bytes() - 2u * 4095 * 256);
}

}  // namespace
}  // namespace specrun
