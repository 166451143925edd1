// The CPU backend's forward pass against the independent NumPy reference
// (tests/reference/llama_ref.py, float64, written from the Hugging Face modeling code). Each case
// writes a random checkpoint, runs the reference on a token sequence and compares every
// position's logits with |cpp - ref| <= atol + rtol * |ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

using fixtures::GeneratorOptions;
using specrun::testing::TempDir;

// Tolerance, from measurement (GCC 12, x86-64, 2 threads): the largest error over every case is
// 7e-7 on logits up to ~4.5 and 4e-6 on logits up to ~36 (tied embeddings and Qwen2, where the
// 1.0-spread embedding is the output projection), i.e. 1-2 f32 ulps of the largest logit of the
// row, and 0.13 of the bound below at worst (the per-case "worst error/tolerance" lines). That
// is what it should be: the C++ side computes in f32 with f32 accumulation over weights f32
// holds exactly (bf16 and f16 widen without rounding), so only f32 rounding separates it from
// the float64 reference. atol = rtol = 1e-5 leaves a factor ~8 for other compilers, vector
// widths and FMA contraction, and is still 3-5 orders of magnitude below what a semantic mistake
// costs (a wrong RoPE pairing, window or scaling moves logits by 0.16-1.2: the contrast lines).
constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;
// A contrast variant (the same weights without one feature) must differ from the case by at
// least this much, so that the feature is proven to be exercised, not merely tolerated.
constexpr double kMinContrast = 1e-2;

struct ReferenceCase {
  std::string name;
  GeneratorOptions options;
  int num_tokens = 16;
  bool interleaved = false;  // Meta/GGUF RoPE pairing, on both sides
  // When set: the same checkpoint without the feature under test, whose reference logits must
  // differ from this case's by more than kMinContrast.
  bool has_contrast = false;
  GeneratorOptions contrast;
  bool contrast_interleaved = false;
};

// Names the case in failure messages instead of dumping its bytes.
void PrintTo(const ReferenceCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<int32_t> make_tokens(int count, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    tokens.push_back(static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab)));
  }
  return tokens;
}

struct Comparison {
  double max_abs_error = 0.0;
  double max_ref = 0.0;
  double worst_ratio = 0.0;  // the largest error / (atol + rtol |ref|): 1 is the limit
  int64_t violations = 0;
  std::string first_violation;
};

Comparison compare(std::span<const float> cpp, std::span<const double> ref, int64_t vocab) {
  Comparison c;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double error = std::abs(static_cast<double>(cpp[i]) - ref[i]);
    c.max_abs_error = std::max(c.max_abs_error, error);
    c.max_ref = std::max(c.max_ref, std::abs(ref[i]));
    const double bound = kAtol + kRtol * std::abs(ref[i]);
    c.worst_ratio = std::max(c.worst_ratio, error / bound);
    if (!(error <= bound)) {
      if (c.violations++ == 0) {
        std::ostringstream where;
        where.precision(9);
        where << "position " << static_cast<int64_t>(i) / vocab << " token "
              << static_cast<int64_t>(i) % vocab << ": cpp " << cpp[i] << " ref " << ref[i];
        c.first_violation = where.str();
      }
    }
  }
  return c;
}

class ReferenceTest : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(ReferenceTest, LogitsMatchNumpyReference) {
  if (specrun::testing::reference_python().empty()) {
    GTEST_SKIP() << "no Python with NumPy was found at configure time";
  }
  const ReferenceCase& c = GetParam();
  TempDir dir;
  fixtures::write_random_checkpoint(c.options, dir / "model");
  const std::vector<int32_t> tokens =
      make_tokens(c.num_tokens, c.options.vocab_size, c.options.seed);
  const std::vector<double> ref =
      testing::reference_logits(dir / "model", tokens, c.interleaved, dir / "ref.bin");
  const int64_t vocab = c.options.vocab_size;
  ASSERT_EQ(static_cast<int64_t>(ref.size()), c.num_tokens * vocab);

  auto backend = specrun::testing::make_cpu_backend(2);
  ModelOptions model_options;
  model_options.kv_cache_tokens = 256;
  model_options.kv_cache_dtype = DType::kF32;  // the reference's exact keys and values
  if (c.interleaved) model_options.rope_style = kernels::RopeStyle::kInterleaved;
  auto model = Model::load(dir / "model", *backend, model_options);

  // One prefill of every token with all logits: the verification-shaped call.
  const SequenceId sequence = model->kv_cache().add_sequence();
  const SequenceInput input{sequence, tokens, /*all_logits=*/true};
  Logits logits;
  model->forward(std::span<const SequenceInput>(&input, 1), &logits);
  ASSERT_EQ(logits.vocab_size, vocab);
  ASSERT_EQ(logits.rows(), c.num_tokens);
  const Comparison prefill = compare(logits.values, ref, vocab);

  // The same tokens fed as a short prefill then one decode step at a time, through the KV cache:
  // every later row must match the reference as well.
  const SequenceId stepped = model->kv_cache().add_sequence();
  const int64_t head = 3;
  std::vector<float> stepped_values;
  for (int64_t begin = 0; begin < c.num_tokens; begin = begin == 0 ? head : begin + 1) {
    const int64_t count = begin == 0 ? head : 1;
    const SequenceInput step{stepped, std::span<const int32_t>(tokens).subspan(begin, count),
                             /*all_logits=*/true};
    Logits step_logits;
    model->forward(std::span<const SequenceInput>(&step, 1), &step_logits);
    stepped_values.insert(stepped_values.end(), step_logits.values.begin(),
                          step_logits.values.end());
  }
  ASSERT_EQ(stepped_values.size(), ref.size());
  const Comparison stepwise = compare(stepped_values, ref, vocab);

  std::cout << "[ reference ] " << c.name << ": " << c.num_tokens << " tokens, max |ref| "
            << prefill.max_ref << "; max abs error " << prefill.max_abs_error
            << " prefill (worst error/tolerance " << prefill.worst_ratio << "), "
            << stepwise.max_abs_error << " stepwise (worst error/tolerance " << stepwise.worst_ratio
            << ")\n";
  EXPECT_EQ(prefill.violations, 0)
      << "prefill: " << prefill.violations << " logits beyond atol " << kAtol << " + rtol " << kRtol
      << "; first at " << prefill.first_violation;
  EXPECT_EQ(stepwise.violations, 0)
      << "stepwise: " << stepwise.violations << " logits beyond atol " << kAtol << " + rtol "
      << kRtol << "; first at " << stepwise.first_violation;

  if (c.has_contrast) {
    fixtures::write_random_checkpoint(c.contrast, dir / "contrast");
    const std::vector<double> other = testing::reference_logits(
        dir / "contrast", tokens, c.contrast_interleaved, dir / "contrast.bin");
    ASSERT_EQ(other.size(), ref.size());
    double difference = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      difference = std::max(difference, std::abs(other[i] - ref[i]));
    }
    std::cout << "[ reference ] " << c.name << ": contrast variant differs by " << difference
              << "\n";
    EXPECT_GT(difference, kMinContrast) << "the feature under test does not change the logits";
  }
}

std::vector<ReferenceCase> reference_cases() {
  std::vector<ReferenceCase> cases;
  // Returns the new case, to be adjusted before the next add() moves the vector.
  auto add = [&](const std::string& name, GeneratorOptions options, int num_tokens) {
    options.seed = cases.size() + 11;
    ReferenceCase c;
    c.name = name;
    c.options = options;
    c.num_tokens = num_tokens;
    cases.push_back(c);
    return &cases.back();
  };

  GeneratorOptions base;  // Llama, 2 layers, hidden 64, 4 heads / 2 KV heads, BF16
  base.vocab_size = 192;
  add("llama_gqa_bf16", base, 16);

  GeneratorOptions mha = base;
  mha.num_kv_heads = 4;
  add("llama_mha_bf16", mha, 14);

  GeneratorOptions f32 = base;
  f32.dtype = DType::kF32;
  add("llama_gqa_f32", f32, 17);

  GeneratorOptions f16 = base;
  f16.dtype = DType::kF16;
  add("llama_gqa_f16", f16, 15);

  GeneratorOptions tied = base;
  tied.tie_word_embeddings = true;
  add("llama_tied", tied, 13);

  GeneratorOptions bias = base;
  bias.attention_bias = true;
  bias.dtype = DType::kF16;
  add("llama_attention_bias_f16", bias, 16);

  // original_max_position_embeddings 64, factor 8: with head_dim 16 pair 0 keeps its frequency,
  // pairs 1-2 are interpolated and pairs 3-7 slowed eightfold; 20 positions turn them far enough
  // to tell the difference.
  GeneratorOptions llama3 = base;
  llama3.llama3_rope_scaling = true;
  llama3.dtype = DType::kF32;
  ReferenceCase* scaled = add("llama3_rope_scaling", llama3, 20);
  scaled->has_contrast = true;
  scaled->contrast = scaled->options;
  scaled->contrast.llama3_rope_scaling = false;
  scaled->contrast_interleaved = false;

  // Window 5 over 18 tokens: most positions lose keys to the window.
  GeneratorOptions mistral = base;
  mistral.architecture = "MistralForCausalLM";
  mistral.sliding_window = 5;
  ReferenceCase* windowed = add("mistral_sliding_window", mistral, 18);
  windowed->has_contrast = true;
  windowed->contrast = windowed->options;
  windowed->contrast.sliding_window = 0;

  GeneratorOptions qwen2 = base;
  qwen2.architecture = "Qwen2ForCausalLM";
  qwen2.tie_word_embeddings = true;
  add("qwen2_qkv_bias", qwen2, 16);

  GeneratorOptions sharded = base;
  sharded.shards = 3;
  sharded.num_layers = 3;
  add("llama_sharded", sharded, 12);

  // head_dim 32 with 4 heads: q is 128 wide on a 64-wide model.
  GeneratorOptions wide_heads = base;
  wide_heads.head_dim = 32;
  wide_heads.dtype = DType::kF32;
  add("llama_explicit_head_dim", wide_heads, 16);

  // The same random weights read with the other pairing are a different model; both sides must
  // agree on which pairs rotate together.
  GeneratorOptions meta = base;
  meta.dtype = DType::kF32;
  ReferenceCase* interleaved = add("llama_interleaved_rope", meta, 16);
  interleaved->interleaved = true;
  interleaved->has_contrast = true;
  interleaved->contrast = interleaved->options;
  interleaved->contrast_interleaved = false;

  return cases;
}

INSTANTIATE_TEST_SUITE_P(Configurations, ReferenceTest, ::testing::ValuesIn(reference_cases()),
                         [](const ::testing::TestParamInfo<ReferenceCase>& param_info) {
                           return param_info.param.name;
                         });

}  // namespace
}  // namespace specrun
