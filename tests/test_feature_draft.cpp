// A draft that reads its target's features (ModelConfig::feature_width, EAGLE-style): its input
// path against an ordinary model with the same layers, the features a forward returns, the
// proposer's alignment (token p reads the target's feature at p - 1; drafts read the draft's
// own) through drafting and rollback, the features handed over where a step took an alternate,
// the engine's greedy and shared-noise output against the target alone (prefix caching and
// alternates included), and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "draft/proposer.h"
#include "runtime/base/check.h"
#include "runtime/sampling/rng.h"
#include "target/scorer.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

using fixtures::GeneratorOptions;
using testing::decode;
using testing::greedy;
using testing::reference_decode;
using testing::speculation;

constexpr int64_t kVocab = 96;
constexpr int64_t kWidth = 48;           // both models' hidden size: the features' width
constexpr int64_t kEmbeddingWidth = 16;  // the draft's token embedding

GeneratorOptions model_options(uint64_t seed, int64_t hidden, int64_t layers) {
  GeneratorOptions options;
  options.vocab_size = kVocab;
  options.hidden_size = hidden;
  options.intermediate_size = 2 * hidden;
  options.num_layers = layers;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.seed = seed;
  options.max_position_embeddings = 256;
  options.dtype = DType::kF32;
  return options;
}

std::vector<float> floats_of(const testing::OwnedTensor& tensor) {
  std::vector<float> values(tensor.bytes.size() / sizeof(float));
  std::memcpy(values.data(), tensor.bytes.data(), tensor.bytes.size());
  return values;
}

void edit_config(const std::filesystem::path& directory, const nlohmann::json& changes) {
  nlohmann::json config = nlohmann::json::parse(testing::read_file(directory / "config.json"));
  config.update(changes);
  testing::write_file(directory / "config.json", config.dump());
}

class FeatureDraftTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fixtures::write_random_checkpoint(model_options(1, kWidth, 2), dir_ / "target");
    // The draft: one layer, kWidth wide, a kEmbeddingWidth token embedding and the two input
    // projections (random), reading kWidth features.
    fixtures::write_random_checkpoint(model_options(2, kWidth, 1), dir_ / "draft");
    testing::edit_tensors(dir_ / "draft" / "model.safetensors", [&](auto& tensors) {
      for (auto& tensor : tensors) {
        if (tensor.name != "model.embed_tokens.weight") continue;
        tensor.shape = {kVocab, kEmbeddingWidth};
        tensor.bytes = testing::bytes_of(testing::random_floats(kVocab * kEmbeddingWidth, 11));
      }
      const float token_scale = 1.0f / std::sqrt(float(kEmbeddingWidth));
      const float feature_scale = 1.0f / std::sqrt(float(kWidth));
      tensors.push_back(
          {"model.token_proj.weight",
           DType::kF32,
           {kWidth, kEmbeddingWidth},
           testing::bytes_of(testing::random_floats(kWidth * kEmbeddingWidth, 12, token_scale))});
      tensors.push_back(
          {"model.feature_proj.weight",
           DType::kF32,
           {kWidth, kWidth},
           testing::bytes_of(testing::random_floats(kWidth * kWidth, 13, feature_scale))});
    });
    edit_config(dir_ / "draft", {{"feature_width", kWidth}, {"embedding_width", kEmbeddingWidth}});
    target_ = load("target");
    draft_ = load("draft");
  }

  std::unique_ptr<Model> load(const std::string& name) {
    ModelOptions options;
    options.kv_block_size = 4;  // small blocks: rollbacks and prefix reuse cross block boundaries
    return Model::load(dir_ / name, *backend_, options);
  }

  // The target's features at every position of `tokens`, from a fresh sequence.
  std::vector<float> target_features(std::span<const int32_t> tokens) {
    const SequenceId sequence = target_->kv_cache().add_sequence();
    Logits logits;
    Features features;
    const SequenceInput input[] = {{sequence, tokens, false}};
    target_->forward(input, &logits, &features);
    target_->kv_cache().remove_sequence(sequence);
    EXPECT_EQ(features.width, kWidth);
    EXPECT_EQ(features.values.size(), tokens.size() * kWidth);
    return features.values;
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(2);
  std::unique_ptr<Model> target_, draft_;
};

std::vector<std::vector<int32_t>> prompts() {
  return {{1}, {1, 5, 9, 13}, {1, 40, 41, 42, 40, 41, 42, 40, 41}, {7, 7, 7, 7, 7, 7}};
}

TEST_F(FeatureDraftTest, ReadsTheTokenAndTheFeatureThroughItsProjections) {
  // Features that are a function of the token, G[x], make the draft an ordinary model whose
  // embedding table is E Wt^T + G Wf^T: the same layers, fed the same rows.
  const auto tensors = testing::read_tensors(dir_ / "draft" / "model.safetensors");
  std::map<std::string, std::vector<float>> by_name;
  for (const auto& tensor : tensors) by_name[tensor.name] = floats_of(tensor);
  const std::vector<float> table = testing::random_floats(kVocab * kWidth, 21);  // G
  std::vector<float> embedding(kVocab * kWidth, 0.0f);
  for (int64_t v = 0; v < kVocab; ++v) {
    for (int64_t o = 0; o < kWidth; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < kEmbeddingWidth; ++i) {
        sum += double(by_name["model.embed_tokens.weight"][v * kEmbeddingWidth + i]) *
               by_name["model.token_proj.weight"][o * kEmbeddingWidth + i];
      }
      for (int64_t i = 0; i < kWidth; ++i) {
        sum += double(table[v * kWidth + i]) * by_name["model.feature_proj.weight"][o * kWidth + i];
      }
      embedding[v * kWidth + o] = static_cast<float>(sum);
    }
  }
  fixtures::write_random_checkpoint(model_options(2, kWidth, 1), dir_ / "plain");
  testing::edit_tensors(dir_ / "plain" / "model.safetensors", [&](auto& plain) {
    for (auto& tensor : plain) {
      if (tensor.name == "model.embed_tokens.weight") tensor.bytes = testing::bytes_of(embedding);
    }
  });
  auto plain = load("plain");

  const std::vector<int32_t> tokens = {1, 40, 41, 42, 7, 7, 90, 3};
  std::vector<float> features;
  for (const int32_t token : tokens) {
    features.insert(features.end(), table.begin() + token * kWidth,
                    table.begin() + (token + 1) * kWidth);
  }
  // Fed in two parts (a catch-up, then more), against the plain model fed at once.
  const SequenceId reading = draft_->kv_cache().add_sequence();
  const SequenceId ordinary = plain->kv_cache().add_sequence();
  const std::span<const int32_t> all(tokens);
  const std::span<const float> all_features(features);
  Logits first, second, expected;
  const SequenceInput part1[] = {{reading, all.first(5), true, all_features.first(5 * kWidth)}};
  draft_->forward(part1, &first);
  const SequenceInput part2[] = {{reading, all.subspan(5), true, all_features.subspan(5 * kWidth)}};
  draft_->forward(part2, &second);
  const SequenceInput whole[] = {{ordinary, all, true}};
  plain->forward(whole, &expected);
  ASSERT_EQ(expected.rows(), 8);
  for (int64_t row = 0; row < 8; ++row) {
    const std::span<const float> got = row < 5 ? first.row(row) : second.row(row - 5);
    for (int64_t v = 0; v < kVocab; ++v) {
      EXPECT_NEAR(got[size_t(v)], expected.row(row)[size_t(v)], 2e-4) << "row " << row;
    }
  }
}

TEST_F(FeatureDraftTest, ForwardReturnsTheFeaturesItsHeadScores) {
  // The features are each token's final-norm row: the head of those gives the logits.
  const auto tensors = testing::read_tensors(dir_ / "target" / "model.safetensors");
  std::vector<float> head;
  for (const auto& tensor : tensors) {
    if (tensor.name == "lm_head.weight") head = floats_of(tensor);
  }
  ASSERT_EQ(head.size(), size_t(kVocab * kWidth));
  const SequenceId a = target_->kv_cache().add_sequence();
  const SequenceId b = target_->kv_cache().add_sequence();
  const std::vector<int32_t> first = {1, 5, 9}, second = {1, 40, 41, 42, 40};
  const SequenceInput batch[] = {{a, first, true}, {b, second, false}};
  Logits logits;
  Features features;
  target_->forward(batch, &logits, &features);
  ASSERT_EQ(features.row_begin, (std::vector<int64_t>{0, 3, 8}));
  ASSERT_EQ(features.values.size(), size_t(8 * kWidth));
  // Sequence a's three logit rows, then b's last.
  const std::pair<int64_t, int64_t> rows[] = {{0, 0}, {1, 1}, {2, 2}, {3, 7}};
  for (const auto& [logit_row, feature_row] : rows) {
    for (int64_t v = 0; v < kVocab; ++v) {
      double sum = 0.0;
      for (int64_t i = 0; i < kWidth; ++i) {
        sum += double(features.values[size_t(feature_row * kWidth + i)]) *
               head[size_t(v * kWidth + i)];
      }
      EXPECT_NEAR(logits.row(logit_row)[size_t(v)], sum, 2e-4);
    }
  }
  // Sequence b's rows are its own.
  EXPECT_EQ(features.of(1).size(), size_t(5 * kWidth));
}

TEST_F(FeatureDraftTest, ProposerReadsTheTargetsFeatureAtThePositionBefore) {
  SamplingParams greedy_params;
  greedy_params.temperature = 0.0f;
  // By hand: token p reads the target's feature at p - 1 (zeros first); each draft then reads
  // the draft's own output feature at the position before.
  auto by_hand = [&](std::span<const int32_t> text, int64_t gamma) {
    const int64_t length = static_cast<int64_t>(text.size());
    const std::vector<float> target = target_features(text);
    std::vector<float> fed(static_cast<size_t>(length * kWidth), 0.0f);
    std::copy(target.begin(), target.end() - kWidth, fed.begin() + kWidth);
    const SequenceId sequence = draft_->kv_cache().add_sequence();
    Logits logits;
    Features own;
    std::vector<int32_t> input(text.begin(), text.end());
    std::vector<int32_t> drafts;
    for (int64_t i = 0; i < gamma; ++i) {
      const SequenceInput step[] = {{sequence, input, false, fed}};
      draft_->forward(step, &logits, &own);
      const std::span<const float> row = logits.last(0);
      drafts.push_back(
          static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
      input = {drafts.back()};
      fed.assign(own.values.end() - kWidth, own.values.end());
    }
    draft_->kv_cache().remove_sequence(sequence);
    return drafts;
  };
  auto proposed = [](const Proposals& proposals) {
    const std::span<const int32_t> row = proposals.row_tokens(0);
    return std::vector<int32_t>(row.begin(), row.begin() + proposals.counts[0]);
  };

  std::vector<int32_t> committed = {1, 40, 41, 42, 40, 41, 7};
  ModelProposer proposer(*draft_, greedy_params, 0.0f);
  proposer.add_sequence(0);
  // As after a prefill of all but the last token.
  std::vector<float> features =
      target_features(std::span<const int32_t>(committed).first(committed.size() - 1));
  proposer.observe_features(0, 0, features);
  const DraftRequest request[] = {{0, committed, 3}};
  const Proposals first = proposer.propose(request);
  ASSERT_EQ(first.counts[0], 3);
  EXPECT_EQ(proposed(first), by_hand(committed, 3));
  // The draft's cache: the 7 committed tokens (read with the target's features), d1 and d2.
  EXPECT_EQ(proposer.cached_length(0), 7 + 2);

  // A step that accepted d1 and then took another token: the target computed features at the
  // pending token and d1. The positions d1 and d2 were fed with the draft's own features: rolled
  // back, d1 is read again with the target's.
  const int64_t pending = static_cast<int64_t>(committed.size()) - 1;
  committed.push_back(first.tokens[0]);
  committed.push_back(first.tokens[0] == 3 ? 4 : 3);
  const std::vector<float> now = target_features(std::span<const int32_t>(committed).first(9));
  proposer.observe_features(
      0, pending,
      std::span<const float>(now).subspan(static_cast<size_t>(pending * kWidth), 2 * kWidth));
  proposer.rollback(0, static_cast<int64_t>(committed.size()) - 1);
  EXPECT_EQ(proposer.cached_length(0), 7);
  const DraftRequest again[] = {{0, committed, 2}};
  EXPECT_EQ(proposed(proposer.propose(again)), by_hand(committed, 2));

  // The features handed over must reach the token before the last: a gap is the engine's bug.
  ModelProposer gapped(*draft_, greedy_params, 0.0f);
  gapped.add_sequence(1);
  gapped.observe_features(1, 0, std::span<const float>(features).first(3 * kWidth));
  const DraftRequest too_far[] = {{1, committed, 1}};
  EXPECT_THROW(gapped.propose(too_far), Error);
}

TEST_F(FeatureDraftTest, GreedyAndSharedNoiseOutputsAreTheTargetsOwn) {
  int64_t drafted = 0, accepted = 0;
  for (const auto& prompt : prompts()) {
    const std::vector<int32_t> expected = reference_decode(*target_, prompt, greedy(40)).tokens;
    for (const GammaControl controller :
         {GammaControl::kFixed, GammaControl::kHeuristic, GammaControl::kGoodput}) {
      for (const int64_t gamma : {1, 3, 6}) {
        const Completion result =
            decode(*target_, draft_.get(), prompt, greedy(40),
                   speculation(SpeculationMethod::kDraftModel, controller, gamma));
        ASSERT_EQ(result.tokens, expected) << to_string(controller) << ", gamma " << gamma;
        drafted += result.stats.drafted;
        accepted += result.stats.accepted;
      }
    }
    SamplingSettings sampling;
    sampling.temperature = 0.8f;
    sampling.seed = 5;
    sampling.max_tokens = 30;
    sampling.stop_at_eos = false;
    SpeculationSettings settings =
        speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, 3);
    settings.verification = Verification::kSharedNoise;
    EXPECT_EQ(decode(*target_, draft_.get(), prompt, sampling, settings).tokens,
              reference_decode(*target_, prompt, sampling, Verification::kSharedNoise).tokens);
  }
  EXPECT_GT(drafted, 0);
  EXPECT_LT(accepted, drafted);  // random weights: the drafts are often wrong
}

TEST(CommittedFeatures, ThePendingTokensAndTheAcceptedOnesTheLastAnAlternatesWhereTaken) {
  // Fed: the pending token, three drafts, then alternates; row r holds r in both columns.
  std::vector<float> fed;
  for (int row = 0; row < 7; ++row) fed.insert(fed.end(), {float(row), float(row)});
  std::vector<float> out;
  committed_features(fed, 2, 2, -1, out);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 1, 2, 2}));
  committed_features(fed, 2, 0, -1, out);
  EXPECT_EQ(out, (std::vector<float>{0, 0}));
  // d1 accepted, then the alternate fed at 5 in place of d2.
  committed_features(fed, 2, 2, 5, out);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 1, 1, 5, 5}));
  // The first draft rejected and an alternate taken in its place.
  committed_features(fed, 2, 1, 4, out);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 4, 4}));
  EXPECT_THROW(committed_features(fed, 2, 7, -1, out), Error);  // more than was fed
  EXPECT_THROW(committed_features(fed, 2, 2, 2, out), Error);   // an alternate among the drafts
  EXPECT_THROW(committed_features(fed, 2, 2, 7, out), Error);   // past what was fed
}

TEST_F(FeatureDraftTest, AlternatesChangeNoOutputAndAreTaken) {
  int64_t scored = 0, taken = 0;
  SamplingSettings sampled;
  sampled.temperature = 0.8f;
  sampled.seed = 3;
  sampled.max_tokens = 40;
  sampled.stop_at_eos = false;
  for (const auto& prompt : prompts()) {
    for (const SamplingSettings& sampling : {greedy(40), sampled}) {
      const std::vector<int32_t> expected =
          reference_decode(*target_, prompt, sampling, Verification::kSharedNoise).tokens;
      for (const int64_t gamma : {1, 3}) {
        SpeculationSettings settings =
            speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, gamma);
        settings.verification = Verification::kSharedNoise;
        settings.draft_alternates = 8;
        const Completion result = decode(*target_, draft_.get(), prompt, sampling, settings);
        ASSERT_EQ(result.tokens, expected)
            << "gamma " << gamma << ", temperature " << sampling.temperature;
        scored += result.stats.alternates;
        taken += result.stats.alternates_accepted;
      }
    }
  }
  EXPECT_GT(taken, 0);
  EXPECT_LT(taken, scored);
}

TEST_F(FeatureDraftTest, PrefixCachedPromptsStillGiveTheDraftItsFeatures) {
  // One engine: later requests start from the cached blocks of earlier ones (both caches), and
  // the target reuses no more than the draft can read on from. The expected outputs come first:
  // nothing else may use the models while the engine runs.
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 0; i < 21; ++i) prompt.push_back(3 + (i * 7) % 80);
  std::vector<EngineRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (const size_t length : {prompt.size(), prompt.size(), prompt.size() - 3, prompt.size()}) {
    EngineRequest request;
    request.prompt.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(length));
    request.sampling = greedy(24);
    request.speculation = speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, 3);
    expected.push_back(reference_decode(*target_, request.prompt, request.sampling).tokens);
    requests.push_back(std::move(request));
  }
  BatchEngine engine(*target_, draft_.get(), {});
  for (size_t i = 0; i < requests.size(); ++i) {
    const Completion result = engine.run(std::move(requests[i]));
    ASSERT_EQ(result.reason, FinishReason::kMaxTokens) << result.error;
    EXPECT_EQ(result.tokens, expected[i]) << "request " << i;
  }
  EXPECT_GT(engine.stats().cached_prompt_tokens, 0);
}

TEST_F(FeatureDraftTest, ARepeatedPromptReusesAsMuchOfTheTargetsCacheAsWithoutTheDraft) {
  // A cached block keeps the target's feature at its last position, which the draft reads beside
  // the first token it computes: the target reuses every whole block of the prompt but its last
  // token, as it does without speculation. The draft's own cache bounds it: after a plain request
  // alone (which never ran the draft) the first speculative one computes the prompt in full.
  const auto make_prompt = [](int32_t step) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 0; i < 21; ++i) prompt.push_back(3 + (i * step) % 70);  // 22, blocks of 4
    return prompt;
  };
  const int64_t whole_blocks = 20;  // of the 21 before the last token
  const auto request = [&](const std::vector<int32_t>& prompt, SpeculationMethod method) {
    EngineRequest r;
    r.prompt = prompt;
    r.sampling = greedy(12);
    r.speculation = speculation(method, GammaControl::kFixed, 3);
    return r;
  };
  const std::vector<int32_t> speculative_first = make_prompt(5), plain_first = make_prompt(11);
  const std::vector<int32_t> expected[] = {
      reference_decode(*target_, speculative_first, greedy(12)).tokens,
      reference_decode(*target_, plain_first, greedy(12)).tokens};
  BatchEngine engine(*target_, draft_.get(), {});
  for (const int64_t cached : {int64_t{0}, whole_blocks, whole_blocks}) {
    const Completion result =
        engine.run(request(speculative_first, SpeculationMethod::kDraftModel));
    EXPECT_EQ(result.tokens, expected[0]) << result.error;
    EXPECT_EQ(result.stats.cached_prompt_tokens, cached);
    EXPECT_GT(result.stats.drafted, 0);
  }
  const Completion plain = engine.run(request(plain_first, SpeculationMethod::kNone));
  EXPECT_EQ(plain.tokens, expected[1]);
  for (const int64_t cached : {int64_t{0}, whole_blocks}) {
    const Completion result = engine.run(request(plain_first, SpeculationMethod::kDraftModel));
    EXPECT_EQ(result.tokens, expected[1]) << result.error;
    EXPECT_EQ(result.stats.cached_prompt_tokens, cached);
  }
}

TEST_F(FeatureDraftTest, RefusesWhatItCannotRead) {
  // A forward without features, or an ordinary model given some.
  const SequenceId sequence = draft_->kv_cache().add_sequence();
  const std::vector<int32_t> tokens = {1, 2};
  const std::vector<float> one_row(kWidth, 0.0f);
  Logits logits;
  const SequenceInput missing[] = {{sequence, tokens, false}};
  testing::expect_error([&] { draft_->forward(missing, &logits); },
                        {"sequence", "brings 0 feature values for 2 tokens", "48 per token"});
  const SequenceInput short_of_one[] = {{sequence, tokens, false, one_row}};
  testing::expect_error([&] { draft_->forward(short_of_one, &logits); },
                        {"brings 48 feature values for 2 tokens"});
  EXPECT_EQ(draft_->kv_cache().length(sequence), 0);
  const SequenceId plain = target_->kv_cache().add_sequence();
  const SequenceInput unwanted[] = {
      {plain, std::span<const int32_t>(tokens).first(1), false, one_row}};
  testing::expect_error([&] { target_->forward(unwanted, &logits); }, {"the model reads none"});

  // config.json: the width must be the draft's own; embedding_width only with feature_width.
  edit_config(dir_ / "draft", {{"feature_width", 64}});
  testing::expect_error([&] { load("draft"); },
                        {"config.json", "feature_width", "is 64, not hidden_size (48)"});
  edit_config(dir_ / "draft", {{"feature_width", nullptr}});
  testing::expect_error([&] { load("draft"); },
                        {"embedding_width", "only for a draft that reads features"});

  // A target of another width, and overlapped drafting (it drafts ahead of the target's features).
  fixtures::write_random_checkpoint(model_options(3, 32, 1), dir_ / "narrow");
  auto narrow = load("narrow");
  testing::expect_error(
      [&] { BatchEngine engine(*narrow, draft_.get(), {}); },
      {"reads its target's features, 48 wide", "hidden size of 32", "not this target's draft"});
  BatchEngineOptions overlap;
  overlap.overlap = OverlapDrafting::kOn;
  testing::expect_error([&] { BatchEngine engine(*target_, draft_.get(), overlap); },
                        {"overlapped drafting needs a draft that does not read"});
}

}  // namespace
}  // namespace specrun
