// The CPU backend's logits against Hugging Face transformers: each case is a small random model
// that transformers itself built and saved (save_pretrained: its config.json, its safetensors),
// loaded by specrun's Model, on four prompts (9 to 45 tokens) and a 64-token greedy continuation
// of each, every position compared. This joins the NumPy reference test (test_reference), which
// checks the arithmetic against float64 from specrun's own checkpoints; here the reference is the
// library people actually run, on files written by it. Skips without transformers
// (tools/setup-python.sh transformers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/logprobs.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/model/safetensors.h"
#include "tests/hf_conformance.h"

namespace specrun {
namespace {

// The bound on |specrun - transformers|, as a fraction of the largest |logit| of the row, the same
// for bf16 and f32 checkpoints. Set from first principles before any measurement:
// - Both sides compute in f32 on the same weight values. transformers' from_pretrained(dtype=
//   float32) widens a bf16 checkpoint to f32 at load, exactly (bf16 is the top half of an f32;
//   hf_reference.py checks every parameter is f32), and specrun's CPU backend widens each bf16
//   weight to f32 as it reads it. So a bf16 case is an f32 computation on bf16-valued weights, and
//   nothing but f32 rounding separates the two sides, for either dtype.
// - Rounding differences: dot products of up to 320 terms summed in different orders (each side
//   within sqrt(n) u to n u of sum |x w|, u = 2^-24, i.e. 1e-6 to 2e-5 relative); RoPE, where
//   transformers rounds the angle position * inv_freq to f32 (up to 108 * 2^-24 ~ 6.4e-6 rad at
//   the last position) and specrun computes it in double; exp, rsqrt and silu within 1-2 ulp.
// - Propagated through 2-3 residual layers of unit-scale activations, these leave the final hidden
//   state off by a few 1e-5 relative at worst, and a logit (a 64-128-term dot product with its
//   output row) off by that much of sum_k |h_k W_vk|, which is about the row's largest |logit|.
// So 1e-4 of the row's largest |logit| bounds the worst case with a margin of a few, while the
// typical error should be near 1e-6 of it. A semantic difference (RoPE pairing, theta or scaling,
// a missing bias, the window) moves logits by 1e-2 to 1 of that scale: 2-4 orders above.
constexpr double kTolerance = 1e-4;

// A case's model as every comparison loads it: room for its prompts and continuations, f32 keys
// and values (the reference's exact ones).
ModelOptions comparison_options() {
  ModelOptions options;
  options.kv_cache_tokens = 1024;
  options.kv_cache_dtype = DType::kF32;
  return options;
}

class HfConformanceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfConformanceTest, LogitsAndGreedyContinuationMatchTransformers) {
  const std::string& name = GetParam();
  testing::TempDir scratch;
  std::string skip_reason;
  const std::filesystem::path directory = testing::hf_reference_dir(name, scratch, &skip_reason);
  if (directory.empty()) GTEST_SKIP() << skip_reason;
  const testing::HfReference reference = testing::load_hf_reference(directory, name);
  ASSERT_FALSE(reference.prompts.empty());

  auto backend = testing::make_cpu_backend(2);
  auto model = Model::load(directory / name, *backend, comparison_options());
  ASSERT_EQ(model->config().vocab_size, reference.vocab_size);

  const testing::HfComparison c = testing::compare_with_hf(*model, reference, kTolerance);
  std::cout << "[ hf cpu ] " << testing::describe(name, c, kTolerance) << " (" << reference.versions
            << ")\n";
  EXPECT_EQ(c.violations, 0) << c.violations << " logits beyond the bound; first at "
                             << c.first_violation;
  EXPECT_EQ(c.greedy_failures, 0) << "greedy choices differ where the reference has a clear "
                                     "margin; first at "
                                  << c.first_greedy_failure;
}

// Log-probabilities as a client reads them (Request::logprobs) against transformers' logits: the
// log-softmax of its row at each generated token, and at each of the top tokens reported. The
// engine runs speculatively with the model drafting for itself (every draft accepted), so most
// tokens' log-probabilities come from rows scored after drafts. A log-probability is a logit less
// the row's log-sum-exp, each within the logits' bound, so twice the bound holds it.
TEST(HfLogprobs, SpeculativeLogprobsAreTransformersLogSoftmax) {
  for (const std::string name : {"llama_gqa_f32", "gemma3_local_global_f32"}) {
    testing::TempDir scratch;
    std::string skip_reason;
    const std::filesystem::path directory = testing::hf_reference_dir(name, scratch, &skip_reason);
    if (directory.empty()) GTEST_SKIP() << skip_reason;
    const testing::HfReference reference = testing::load_hf_reference(directory, name);
    auto backend = testing::make_cpu_backend(2);
    auto target = Model::load(directory / name, *backend, comparison_options());
    auto draft = Model::load(directory / name, *backend, comparison_options());
    BatchEngine engine(*target, draft.get(), {});
    int64_t compared = 0, accepted = 0;
    for (const testing::HfReference::Prompt& prompt : reference.prompts) {
      EngineRequest request;
      request.prompt = prompt.tokens;
      request.sampling = testing::greedy(static_cast<int64_t>(prompt.continuation.size()));
      request.speculation =
          testing::speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, 4);
      request.logprobs = 5;
      const Completion result = engine.run(std::move(request));
      ASSERT_EQ(result.logprobs.size(), result.tokens.size()) << result.error;
      accepted += result.stats.accepted;
      const auto length = static_cast<int64_t>(prompt.tokens.size());
      for (size_t i = 0; i < result.tokens.size(); ++i) {
        // Past a near tie the two may continue differently; the logits test judges those.
        if (result.tokens[i] != prompt.continuation[i]) break;
        const std::span<const float> row =
            reference.row(prompt, length - 1 + static_cast<int64_t>(i));
        const double total = kernels::cpu::log_sum_exp(row);
        float largest = 0.0f;
        for (const float x : row) largest = std::max(largest, std::abs(x));
        const double bound = 2 * kTolerance * largest;
        const auto expected = [&](int32_t token) {
          return static_cast<double>(row[static_cast<size_t>(token)]) - total;
        };
        const TokenLogprob& logprob = result.logprobs[i];
        EXPECT_NEAR(logprob.logprob, expected(result.tokens[i]), bound) << name << " token " << i;
        ASSERT_EQ(logprob.top.size(), 5u);
        for (const TopLogprob& top : logprob.top) {
          EXPECT_NEAR(top.logprob, expected(top.token), bound) << name << " token " << i;
        }
        ++compared;
      }
    }
    EXPECT_GT(compared, 100) << name;
    EXPECT_GT(accepted, compared / 2) << name << ": few rows after drafts were compared";
  }
}

// A deliberate break of an f32 case's model: its config.json edited by `edit_config`, and each
// tensor's f32 values by `edit_tensor` (returning false drops the tensor).
struct Break {
  std::string what;
  std::function<void(nlohmann::json&)> edit_config = [](nlohmann::json&) {};
  std::function<bool(const std::string&, std::span<float>)> edit_tensor =
      [](const std::string&, std::span<float>) { return true; };
};

std::filesystem::path write_broken(const std::filesystem::path& model,
                                   const std::filesystem::path& out, const Break& change) {
  std::filesystem::create_directories(out);
  nlohmann::json config = nlohmann::json::parse(testing::read_file(model / "config.json"));
  change.edit_config(config);
  std::ofstream(out / "config.json") << config.dump();
  const SafetensorsFile file(model / "model.safetensors");
  std::vector<std::vector<float>> kept;
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& tensor : file.tensors()) {
    EXPECT_EQ(tensor.dtype, DType::kF32) << tensor.name;
    const auto* values = static_cast<const float*>(tensor.data);
    std::vector<float>& copy = kept.emplace_back(values, values + tensor.num_elements());
    if (!change.edit_tensor(tensor.name, copy)) {
      kept.pop_back();
      continue;
    }
    tensors.push_back({tensor.name, tensor.dtype, tensor.shape, std::as_bytes(std::span(copy))});
  }
  write_safetensors(out / "model.safetensors", tensors, file.metadata());
  return out;
}

// Each break of `name` misses transformers' logits by far more than the bound: the bound catches
// what the architecture adds.
void expect_breaks_caught(const std::string& name, const std::vector<Break>& breaks) {
  testing::TempDir scratch;
  std::string skip_reason;
  const std::filesystem::path directory = testing::hf_reference_dir(name, scratch, &skip_reason);
  if (directory.empty()) GTEST_SKIP() << skip_reason;
  const testing::HfReference reference = testing::load_hf_reference(directory, name);
  auto backend = testing::make_cpu_backend(2);
  const ModelOptions options = comparison_options();
  for (size_t i = 0; i < breaks.size(); ++i) {
    SCOPED_TRACE(breaks[i].what);
    const std::filesystem::path broken =
        write_broken(directory / name, scratch.path() / ("break" + std::to_string(i)), breaks[i]);
    auto model = Model::load(broken, *backend, options);
    const testing::HfComparison c = testing::compare_with_hf(*model, reference, kTolerance);
    std::cout << "[ hf cpu ] " << breaks[i].what << ": " << testing::describe(name, c, kTolerance)
              << "\n";
    EXPECT_GT(c.worst_ratio, 10.0) << "the break stays within 10x the bound";
  }
}

bool is_qk_norm(const std::string& tensor) {
  return tensor.ends_with("q_norm.weight") || tensor.ends_with("k_norm.weight");
}

TEST(HfConformanceBreaks, AQwen3WithoutItsQueryAndKeyNormsIsCaught) {
  expect_breaks_caught(
      "qwen3_qk_norm_f32",
      {{"q/k norm gains all one", [](nlohmann::json&) {},
        [](const std::string& tensor, std::span<float> values) {
          if (is_qk_norm(tensor)) std::ranges::fill(values, 1.0f);
          return true;
        }},
       {"no q/k norm (read as a Llama)",
        [](nlohmann::json& config) {
          config["architectures"] = {"LlamaForCausalLM"};
          config["model_type"] = "llama";
        },
        [](const std::string& tensor, std::span<float>) { return !is_qk_norm(tensor); }}});
}

TEST(HfConformanceBreaks, AGemma3MissingAnyOfItsDifferencesIsCaught) {
  expect_breaks_caught(
      "gemma3_local_global_f32",
      {{"gains w, not 1 + w", [](nlohmann::json&) {},
        [](const std::string& tensor, std::span<float> values) {
          if (tensor.ends_with("norm.weight")) {
            for (float& value : values) value -= 1.0f;  // read as 1 + (w - 1)
          }
          return true;
        }},
       {"every layer global",
        [](nlohmann::json& config) {
          config["layer_types"] = {"full_attention", "full_attention", "full_attention"};
        }},
       {"a window of 16", [](nlohmann::json& config) { config["sliding_window"] = 16; }},
       {"the local layers on the global RoPE base",
        [](nlohmann::json& config) {
          config["rope_parameters"]["sliding_attention"]["rope_theta"] = 100000.0;
        }},
       {"scores scaled by head_dim^-0.5",
        [](nlohmann::json& config) { config["query_pre_attn_scalar"] = 32; }}});
}

INSTANTIATE_TEST_SUITE_P(Models, HfConformanceTest, ::testing::ValuesIn(testing::hf_case_names()),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return param_info.param;
                         });

}  // namespace
}  // namespace specrun
