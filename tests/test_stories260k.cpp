// A real trained checkpoint from the wild: Karpathy's TinyStories 260K Llama in llama2.c format
// (../shared/models/stories260K). tools/convert_llama2c.py turns it into a Hugging Face
// checkpoint twice, with q/k rows permuted for rotate-half RoPE (hf) and as Meta wrote them for
// interleaved RoPE (meta). Both must decode the known story, and the logits must match the NumPy
// reference. Random weights cannot show that the model computes language; this can.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/engine/pairing.h"
#include "runtime/engine/settings.h"
#include "runtime/model/model.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

using specrun::testing::TempDir;

// The known greedy continuation of BOS for this checkpoint (../shared/README.md).
constexpr char kExpectedStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";
constexpr int64_t kGreedyTokens = 60;
constexpr int64_t kReferenceTokens = 20;
// Same reasoning as tests/test_reference.cpp: f32 compute over f32 weights against float64, so
// only f32 rounding remains, and it tracks the scale of the whole row (the final norm and the
// tied classifier), not each logit. Measured: max abs error 4.8e-6 on rows whose largest logit
// is ~22, i.e. about 2.5 ulps of it (0.18 of the bound below at worst). Five trained layers
// round more than the two-layer random cases, hence atol 2e-5 rather than 1e-5; still a factor
// ~5 of headroom and four orders of magnitude below a real defect.
constexpr double kAtol = 2e-5;
constexpr double kRtol = 1e-5;

std::filesystem::path checkpoint_path() {
  return specrun::testing::shared_path("models/stories260K/stories260K.bin");
}
std::filesystem::path tokenizer_path() {
  return specrun::testing::shared_path("models/stories260K/tok512.bin");
}

// llama2.c tokenizer file: int32 max_token_length, then per token float32 score, int32 length
// and that many bytes of the piece.
std::vector<std::string> read_llama2c_vocab(const std::filesystem::path& path, int64_t vocab) {
  const std::string bytes = specrun::testing::read_file(path);
  size_t offset = sizeof(int32_t);
  std::vector<std::string> pieces;
  for (int64_t i = 0; i < vocab; ++i) {
    int32_t length = 0;
    if (offset + sizeof(float) + sizeof(length) > bytes.size()) {
      throw std::runtime_error(path.string() + ": truncated at token " + std::to_string(i));
    }
    std::memcpy(&length, bytes.data() + offset + sizeof(float), sizeof(length));
    offset += sizeof(float) + sizeof(length);
    if (length < 0 || offset + static_cast<size_t>(length) > bytes.size()) {
      throw std::runtime_error(path.string() + ": bad length at token " + std::to_string(i));
    }
    pieces.emplace_back(bytes.data() + offset, static_cast<size_t>(length));
    offset += static_cast<size_t>(length);
  }
  return pieces;
}

// Concatenates the pieces, turning "<0xNN>" byte-fallback pieces into their byte; the leading
// space SentencePiece puts on the first word after BOS is dropped, as llama2.c's decoder does.
std::string decode(const std::vector<std::string>& pieces, std::span<const int32_t> tokens) {
  std::string text;
  for (const int32_t token : tokens) {
    const std::string& piece = pieces.at(static_cast<size_t>(token));
    unsigned int byte = 0;
    if (piece.size() == 6 && piece.starts_with("<0x") && piece.ends_with(">") &&
        std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1) {
      text += static_cast<char>(byte);
    } else {
      text += piece;
    }
  }
  if (text.starts_with(" ")) text.erase(0, 1);
  return text;
}

class Stories260kTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(checkpoint_path()) || !std::filesystem::exists(tokenizer_path())) {
      GTEST_SKIP() << "stories260K is not in ../shared/models";
    }
    if (specrun::testing::reference_python().empty()) {
      GTEST_SKIP() << "no Python with NumPy was found at configure time";
    }
    convert("hf");
    convert("meta");
  }

  void convert(const std::string& layout) {
    const std::string command = "'" + specrun::testing::reference_python() + "' '" +
                                specrun::testing::source_path("tools/convert_llama2c.py").string() +
                                "' '" + checkpoint_path().string() + "' '" +
                                (dir_ / layout).string() + "' --layout " + layout;
    const auto result = specrun::testing::run_command(command);
    ASSERT_EQ(result.exit_code, 0) << command << "\n" << result.stderr_text;
  }

  std::unique_ptr<Model> load(const std::string& layout) {
    ModelOptions options;
    options.kv_cache_dtype = DType::kF32;  // the NumPy reference's exact keys and values
    if (layout == "meta") options.rope_style = kernels::RopeStyle::kInterleaved;
    return Model::load(dir_ / layout, *backend_, options);
  }

  std::vector<int32_t> greedy(Model& model) {
    SamplingSettings sampling = testing::greedy(kGreedyTokens);
    sampling.stop_at_eos = true;
    const std::vector<int32_t> prompt = {1};  // BOS
    return testing::reference_decode(model, prompt, sampling).tokens;
  }

  // Compares one prefill of `tokens` (all logits) against the reference.
  void expect_matches_reference(const std::string& layout, std::span<const int32_t> tokens) {
    const std::vector<double> ref = testing::reference_logits(
        dir_ / layout, tokens, layout == "meta", dir_ / (layout + "-ref.bin"));
    auto model = load(layout);
    const int64_t vocab = model->config().vocab_size;
    ASSERT_EQ(ref.size(), tokens.size() * static_cast<size_t>(vocab));
    const SequenceInput input{model->kv_cache().add_sequence(), tokens, /*all_logits=*/true};
    Logits logits;
    model->forward(std::span<const SequenceInput>(&input, 1), &logits);
    ASSERT_EQ(logits.values.size(), ref.size());
    double max_error = 0.0;
    double max_ref = 0.0;
    double worst_ratio = 0.0;
    int64_t violations = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double error = std::abs(static_cast<double>(logits.values[i]) - ref[i]);
      max_error = std::max(max_error, error);
      max_ref = std::max(max_ref, std::abs(ref[i]));
      const double bound = kAtol + kRtol * std::abs(ref[i]);
      worst_ratio = std::max(worst_ratio, error / bound);
      if (!(error <= bound)) ++violations;
    }
    std::cout << "[ stories260K ] " << layout << " layout, " << tokens.size()
              << " tokens: max |ref| " << max_ref << ", max abs error " << max_error
              << " (worst error/tolerance " << worst_ratio << ")\n";
    EXPECT_EQ(violations, 0) << layout << ": " << violations << " logits beyond atol " << kAtol
                             << " + rtol " << kRtol << " (max abs error " << max_error << ")";

    // The reference's own greedy choices must be the tokens that follow: an independent check
    // that the float64 model, not only the C++ one, reproduces the story.
    for (size_t position = 0; position + 1 < tokens.size(); ++position) {
      const double* row = ref.data() + position * static_cast<size_t>(vocab);
      const auto best = std::max_element(row, row + vocab) - row;
      EXPECT_EQ(best, tokens[position + 1]) << "reference argmax at position " << position;
    }
  }

  TempDir dir_;
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = specrun::testing::make_cpu_backend(2);
};

TEST_F(Stories260kTest, GreedyStoryIsTheSameInBothRopeLayouts) {
  auto hf = load("hf");
  auto meta = load("meta");
  const std::vector<int32_t> hf_tokens = greedy(*hf);
  const std::vector<int32_t> meta_tokens = greedy(*meta);
  EXPECT_EQ(hf_tokens, meta_tokens);

  const std::vector<std::string> pieces = read_llama2c_vocab(tokenizer_path(), 512);
  const std::string text = decode(pieces, hf_tokens);
  std::cout << "[ stories260K ] greedy: \"" << text << "\"\n";
  EXPECT_EQ(static_cast<int64_t>(hf_tokens.size()), kGreedyTokens);
  EXPECT_TRUE(text.starts_with(kExpectedStory)) << text;
}

TEST_F(Stories260kTest, LogitsMatchNumpyReference) {
  auto model = load("hf");
  std::vector<int32_t> tokens = {1};
  const std::vector<int32_t> story = greedy(*model);
  ASSERT_GE(static_cast<int64_t>(story.size()), kReferenceTokens - 1);
  tokens.insert(tokens.end(), story.begin(), story.begin() + (kReferenceTokens - 1));
  expect_matches_reference("hf", tokens);
  expect_matches_reference("meta", tokens);
}

// Real pairs from one real checkpoint: the f32 model as the target; as drafts, its bf16 rounding
// (which agrees nearly always) and its first three layers alone (a layer-skip draft, which agrees
// now and then). Greedy speculative output must be the target's, token for token.
TEST_F(Stories260kTest, SpeculativeWithDraftsCutFromItEqualsTargetGreedy) {
  const Checkpoint source = open_checkpoint(dir_ / "hf");
  std::vector<std::vector<uint16_t>> rounded;
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo* info : source.tensors.all()) {
    ASSERT_EQ(info->dtype, DType::kF32);
    std::vector<uint16_t>& bits = rounded.emplace_back(static_cast<size_t>(info->num_elements()));
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = f32_to_bf16(static_cast<const float*>(info->data)[i]);
    }
    tensors.push_back(
        {info->name, DType::kBF16, info->shape, std::as_bytes(std::span<const uint16_t>(bits))});
  }
  std::filesystem::create_directories(dir_ / "bf16");
  write_safetensors(dir_ / "bf16" / "model.safetensors", tensors);
  std::filesystem::copy_file(dir_ / "hf" / "config.json", dir_ / "bf16" / "config.json");

  specrun::fixtures::write_truncated_checkpoint(dir_ / "hf", 3, dir_ / "skip3");
  auto target = load("hf");
  // Measured greedy acceptance: bf16 1.0, the first 3 of 5 layers 0.12 (the model was not trained
  // for layer skipping; 1 or 2 layers reach only 0.01).
  const std::pair<std::string, double> drafts[] = {{"bf16", 0.9}, {"skip3", 0.05}};
  for (const auto& [draft_name, minimum_acceptance] : drafts) {
    auto draft = Model::load(dir_ / draft_name, *backend_);
    check_pairing(*target, *draft);
    SamplingSettings sampling = testing::greedy(120);
    sampling.stop_at_eos = true;
    const std::vector<int32_t> prompt = {1};
    const std::vector<int32_t> expected =
        testing::reference_decode(*target, prompt, sampling).tokens;
    int64_t drafted = 0, accepted = 0;
    for (const GammaControl controller :
         {GammaControl::kFixed, GammaControl::kHeuristic, GammaControl::kGoodput}) {
      for (const int64_t gamma : {1, 3, 6}) {
        const Completion result = testing::decode(
            *target, draft.get(), prompt, sampling,
            testing::speculation(SpeculationMethod::kDraftModel, controller, gamma));
        EXPECT_EQ(result.tokens, expected) << to_string(controller) << " gamma " << gamma;
        drafted += result.stats.drafted;
        accepted += result.stats.accepted;
      }
    }
    const double acceptance = static_cast<double>(accepted) / static_cast<double>(drafted);
    std::cout << "[ stories260K ] " << draft_name << " draft for the f32 target: greedy acceptance "
              << acceptance << " over " << drafted << " drafts\n";
    EXPECT_GT(acceptance, minimum_acceptance) << draft_name;
  }
}

TEST_F(Stories260kTest, QuantizedModelsKeepTheirLossGreedyTokensAndAcceptance) {
  // Quality of FP8 and INT8 quantized at load on a real trained model: cross-entropy on stories
  // the f32 model samples itself (temperature 1, so their loss under a model is the f32 model's
  // entropy plus how far that model's distribution moved: held-out text from the distribution
  // that matters), greedy tokens equal to f32's, and greedy acceptance of the first-3-layers
  // draft with a quantized target and with a quantized draft. INT8 also with activations quantized
  // to int8 per token, on a backend that does so.
  specrun::fixtures::write_truncated_checkpoint(dir_ / "hf", 3, dir_ / "skip3");
  // Every model keeps keys and values in f32, as load() does, so that the figures measure the
  // quantization alone (bf16 caches move near ties too).
  ModelOptions exact_cache;
  exact_cache.kv_cache_dtype = DType::kF32;
  auto target = load("hf");
  auto draft = Model::load(dir_ / "skip3", *backend_, exact_cache);
  std::vector<std::vector<int32_t>> stories;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    SamplingSettings sampling;
    sampling.temperature = 1.0f;
    sampling.seed = seed;
    sampling.max_tokens = 160;
    sampling.stop_at_eos = false;
    std::vector<int32_t> story = {1};  // BOS
    const std::vector<int32_t> drawn = testing::reference_decode(*target, story, sampling).tokens;
    story.insert(story.end(), drawn.begin(), drawn.end());
    stories.push_back(std::move(story));
  }
  // Each position's argmax with the stories fed (teacher forcing): how often two models agree
  // step by step, free of the cascade a free-running comparison adds after a first difference.
  const auto argmaxes = [&](Model& model) {
    std::vector<int32_t> picks;
    for (const std::vector<int32_t>& story : stories) {
      const SequenceId sequence = model.kv_cache().add_sequence();
      const SequenceInput input{sequence, story, /*all_logits=*/true};
      Logits logits;
      model.forward({&input, 1}, &logits);
      model.kv_cache().remove_sequence(sequence);
      for (int64_t r = 0; r < logits.rows(); ++r) {
        const std::span<const float> row = logits.row(r);
        picks.push_back(
            static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
      }
    }
    return picks;
  };
  const auto loss = [&](Model& model) {
    double total = 0.0;
    for (const std::vector<int32_t>& story : stories) {
      total += testing::cross_entropy(model, story) / double(stories.size());
    }
    return total;
  };
  // Greedy continuations of each story's first 8 tokens, 48 tokens each.
  SamplingSettings greedy = testing::greedy(48);
  const SpeculationSettings speculation =
      testing::speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, 3);
  const double f32_loss = loss(*target);
  const std::vector<int32_t> f32_picks = argmaxes(*target);
  kernels::cpu::CpuBackend int8_activations(std::make_shared<kernels::cpu::ThreadPool>(2),
                                            kernels::cpu::Activations::kInt8);
  for (const testing::QuantizedVariant& mode :
       testing::quantized_variants(*backend_, int8_activations)) {
    const char* name = mode.name;
    ModelOptions options = exact_cache;
    options.quantize = mode.quantize;
    const auto quantized_target = Model::load(dir_ / "hf", *mode.backend, options);
    const auto quantized_draft = Model::load(dir_ / "skip3", *mode.backend, options);
    const double quantized_loss = loss(*quantized_target);
    const std::vector<int32_t> picks = argmaxes(*quantized_target);
    int64_t same_picks = 0;
    for (size_t i = 0; i < picks.size(); ++i) same_picks += picks[i] == f32_picks[i] ? 1 : 0;
    int64_t equal = 0, total = 0;
    int64_t drafted[3] = {}, accepted[3] = {};  // f32 pair; quantized target; quantized draft
    for (const std::vector<int32_t>& story : stories) {
      const std::vector<int32_t> prompt(story.begin(), story.begin() + 8);
      const std::vector<int32_t> original =
          testing::reference_decode(*target, prompt, greedy).tokens;
      const std::vector<int32_t> quantized =
          testing::reference_decode(*quantized_target, prompt, greedy).tokens;
      for (size_t i = 0; i < std::min(original.size(), quantized.size()); ++i) {
        equal += original[i] == quantized[i] ? 1 : 0;
      }
      total += static_cast<int64_t>(original.size());
      const Completion runs[3] = {
          testing::decode(*target, draft.get(), prompt, greedy, speculation),
          testing::decode(*quantized_target, draft.get(), prompt, greedy, speculation),
          testing::decode(*target, quantized_draft.get(), prompt, greedy, speculation)};
      EXPECT_EQ(runs[0].tokens, original);
      EXPECT_EQ(runs[1].tokens, quantized) << name;  // still the (quantized) target's own
      EXPECT_EQ(runs[2].tokens, original) << name;
      for (int r = 0; r < 3; ++r) {
        drafted[r] += runs[r].stats.drafted;
        accepted[r] += runs[r].stats.accepted;
      }
    }
    const auto rate = [&](int r) {
      return double(accepted[r]) / double(std::max<int64_t>(drafted[r], 1));
    };
    std::cout << "[ quantized ] stories260K " << name << ": loss " << quantized_loss << " (f32 "
              << f32_loss << ", " << 100.0 * (quantized_loss / f32_loss - 1.0)
              << "%); argmax equal to f32's at " << same_picks << "/" << picks.size()
              << " story positions; free-running greedy tokens equal " << equal << "/" << total
              << "; greedy acceptance of the 3-layer draft: f32 pair " << rate(0)
              << ", quantized target " << rate(1) << ", quantized draft " << rate(2) << "\n";
    EXPECT_LT(quantized_loss, 1.01 * f32_loss) << name;
    // Teacher-forced: a 64-wide model with 3-bit FP8 mantissas still picks f32's token almost
    // everywhere; free-running, one early near tie changes every token after it, so that count
    // is reported, not bounded.
    EXPECT_GT(same_picks, static_cast<int64_t>(picks.size()) * 93 / 100) << name;
  }
}

// Text in, text out, from the command line: the prompt through the converted tokenizer.json, the
// story streamed back, with and without a draft, from --prompt and from stdin.
TEST_F(Stories260kTest, CommandLineStreamsTheStoryAsText) {
  const std::string python = specrun::testing::reference_python();
  for (const std::string dtype : {"f32", "bf16"}) {
    const auto result = specrun::testing::run_command(
        "'" + python + "' '" + specrun::testing::source_path("tools/convert_llama2c.py").string() +
        "' '" + checkpoint_path().string() + "' '" + (dir_ / ("text-" + dtype)).string() +
        "' --tokenizer '" + tokenizer_path().string() + "' --dtype " + dtype);
    ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  }
  const std::string specrun = "'" + specrun::testing::tool_path("specrun").string() +
                              "' --threads 1 --max-tokens 40 --temperature 0 --target '" +
                              (dir_ / "text-f32").string() + "'";
  const std::string story = ", there was a little girl named Lily. She loved to play outside";
  const auto plain = specrun::testing::run_command(specrun + " --prompt 'Once upon a time'");
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  EXPECT_EQ(plain.stdout_text.rfind(story, 0), 0u) << plain.stdout_text;
  const auto speculative = specrun::testing::run_command(
      specrun + " --prompt 'Once upon a time' --draft '" + (dir_ / "text-bf16").string() + "'");
  ASSERT_EQ(speculative.exit_code, 0) << speculative.stderr_text;
  EXPECT_EQ(speculative.stdout_text, plain.stdout_text);
  EXPECT_NE(speculative.stderr_text.find("acceptance"), std::string::npos);
  const auto from_stdin = specrun::testing::run_command("printf 'Once upon a time' | " + specrun);
  EXPECT_EQ(from_stdin.stdout_text, plain.stdout_text);
}

}  // namespace
}  // namespace specrun
