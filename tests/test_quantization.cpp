// Quantized weights on the CPU backend: FP8 checkpoints as published (compressed-tensors per
// tensor and per channel, block-wise "fp8" with weight_scale_inv) against their dequantized f32
// twins; every malformed one as one error naming the file and tensor or key; quantization at load
// (FP8 and INT8, per output channel) close to the original; and greedy speculative output equal to
// greedy target-only output with the same quantized target, through the C++ and C APIs.
//
// Tolerances. A pre-quantized checkpoint and its twin hold the same weights (code * scale, rounded
// once to f32); the kernel applies the scale after summing a block's or row's products, so each
// output differs by a few roundings of f32 accumulation: 1e-4 of the largest logit bounds it with
// room. Quantizing at load changes the weights by up to half a step of the code grid (int8: 1/254
// of a row's largest magnitude; FP8: 1/16 of the value, 3 mantissa bits): the logits of these
// small random models move by a few per cent of their range, and greedy tokens mostly agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/core/dtype.h"
#include "runtime/model/model.h"
#include "specrun/specrun.h"
#include "specrun/specrun.hpp"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::OwnedTensor;

fixtures::GeneratorOptions f32_model() {
  fixtures::GeneratorOptions options;
  options.dtype = DType::kF32;
  options.hidden_size = 128;
  options.intermediate_size = 320;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  options.seed = 11;
  return options;
}

std::vector<float> logits_of(const fs::path& directory, const std::vector<int32_t>& tokens,
                             const ModelOptions& options = {}) {
  auto backend = testing::make_cpu_backend(2);
  ModelOptions model_options = options;
  model_options.kv_cache_tokens = 64;
  const auto model = Model::load(directory, *backend, model_options);
  const SequenceId sequence = model->kv_cache().add_sequence();
  Logits logits;
  const SequenceInput input[] = {{sequence, tokens, true}};
  model->forward(input, &logits);
  return logits.values;
}

const std::vector<int32_t> kPrompt = {1, 17, 200, 5, 5, 99, 254, 3};

double largest_magnitude(const std::vector<float>& values) {
  double largest = 0;
  for (const float v : values) largest = std::max(largest, std::fabs(double(v)));
  return largest;
}

std::vector<float> forward_logits(Model& model, const std::vector<int32_t>& tokens) {
  const SequenceId sequence = model.kv_cache().add_sequence();
  Logits logits;
  const SequenceInput input[] = {{sequence, tokens, true}};
  model.forward(input, &logits);
  model.kv_cache().remove_sequence(sequence);
  return logits.values;
}

class Fp8CheckpointTest : public ::testing::TestWithParam<testing::Fp8Layout> {};

TEST_P(Fp8CheckpointTest, ComputesWhatItsDequantizedTwinComputes) {
  testing::TempDir dir;
  fixtures::write_random_checkpoint(f32_model(), dir / "fp8");
  fixtures::write_random_checkpoint(f32_model(), dir / "twin");
  testing::write_fp8_checkpoint(dir / "fp8", dir / "twin", GetParam());

  auto backend = testing::make_cpu_backend(1);
  const auto model = Model::load(dir / "fp8", *backend);
  const auto twin = Model::load(dir / "twin", *backend);
  // Codes are one byte: the linear layers' weights take a quarter of their f32 twin's bytes.
  EXPECT_LT(model->weight_bytes(), twin->weight_bytes());
  // The memory plan, from headers alone, counts what the model holds (codes and f32 scales).
  EXPECT_EQ(
      Model::plan_memory(open_checkpoint(dir / "fp8"), {}, true, testing::layouts_of(*backend), 1)
          .weight_bytes,
      model->weight_bytes());

  const std::vector<float> quantized = logits_of(dir / "fp8", kPrompt);
  const std::vector<float> reference = logits_of(dir / "twin", kPrompt);
  ASSERT_EQ(quantized.size(), reference.size());
  const double tolerance = 1e-4 * largest_magnitude(reference);
  for (size_t i = 0; i < reference.size(); ++i) {
    ASSERT_NEAR(quantized[i], reference[i], tolerance) << GetParam().label << " logit " << i;
  }
}

TEST_P(Fp8CheckpointTest, ADeviceUploadsTheCodesAsTheyAre) {
  testing::TempDir dir;
  fixtures::write_random_checkpoint(f32_model(), dir / "fp8");
  fixtures::write_random_checkpoint(f32_model(), dir / "twin");
  testing::write_fp8_checkpoint(dir / "fp8", dir / "twin", GetParam());
  // The other tensors in bf16, as a device holds them, so that both placements hold the same
  // weights and the device-like backend (the CPU's kernels) must give the same bits.
  testing::edit_tensors(dir / "fp8" / "model.safetensors", [](std::vector<OwnedTensor>& tensors) {
    for (OwnedTensor& t : tensors) {
      const bool scale = t.name.find("weight_scale") != std::string::npos;
      if (t.dtype != DType::kF32 || scale) continue;
      std::vector<uint16_t> halves(t.bytes.size() / sizeof(float));
      for (size_t i = 0; i < halves.size(); ++i) {
        halves[i] = f32_to_bf16(load_as_f32(t.bytes.data(), DType::kF32, i));
      }
      t.dtype = DType::kBF16;
      t.bytes = testing::bytes_of(halves);
    }
  });
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend host(pool);
  testing::DeviceLikeBackend device(pool);
  ModelOptions options;
  options.kv_cache_tokens = 64;
  const auto on_host = Model::load(dir / "fp8", host, options);
  const auto on_device = Model::load(dir / "fp8", device, options);
  EXPECT_EQ(on_device->weight_bytes(), on_host->weight_bytes());
  EXPECT_EQ(Model::plan_memory(open_checkpoint(dir / "fp8"), options, false,
                               testing::layouts_of(device), 1)
                .weight_bytes,
            on_device->weight_bytes());
  EXPECT_EQ(forward_logits(*on_device, kPrompt), forward_logits(*on_host, kPrompt));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Fp8CheckpointTest,
    ::testing::Values(
        testing::Fp8Layout{"compressed_tensors_channel", "compressed-tensors", 0, 0, false},
        testing::Fp8Layout{"compressed_tensors_tensor", "compressed-tensors", 0, 0, true},
        testing::Fp8Layout{"fp8_per_channel", "fp8", 0, 0, false},
        testing::Fp8Layout{"fp8_block_128", "fp8", 128, 128, false},
        testing::Fp8Layout{"fp8_block_32x48", "fp8", 32, 48, false}),
    [](const auto& param_info) { return param_info.param.label; });

// --- Malformed quantized checkpoints: one error naming the file and the tensor or key ---

class Fp8CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    fixtures::write_random_checkpoint(f32_model(), dir_ / "fp8");
    fixtures::write_random_checkpoint(f32_model(), dir_ / "twin");
    testing::write_fp8_checkpoint(dir_ / "fp8", dir_ / "twin", {"block", "fp8", 128, 128, false});
  }

  void edit_tensors(const std::function<void(std::vector<OwnedTensor>&)>& edit) {
    testing::edit_tensors(weights(), edit);
  }
  void edit_config(const std::function<void(json&)>& edit) {
    json config = json::parse(testing::read_file(dir_ / "fp8" / "config.json"));
    edit(config);
    testing::write_file(dir_ / "fp8" / "config.json", config.dump(2));
  }
  void expect_load_error(std::initializer_list<std::string> fragments) {
    auto backend = testing::make_cpu_backend(1);
    testing::expect_error([&] { Model::load(dir_ / "fp8", *backend); }, fragments);
  }
  fs::path weights() const { return dir_ / "fp8" / "model.safetensors"; }

  testing::TempDir dir_;
  const std::string scale_ = "model.layers.1.mlp.down_proj.weight_scale_inv";
};

TEST_F(Fp8CheckpointErrors, AMissingScale) {
  edit_tensors([&](std::vector<OwnedTensor>& tensors) {
    std::erase_if(tensors, [&](const OwnedTensor& t) { return t.name == scale_; });
  });
  expect_load_error({"model.safetensors", "missing tensor '" + scale_ + "'"});
}

TEST_F(Fp8CheckpointErrors, AMisshapedScale) {
  edit_tensors([&](std::vector<OwnedTensor>& tensors) {
    for (OwnedTensor& t : tensors) {
      if (t.name == scale_) {
        t.shape = {2, 2};
        t.bytes.resize(4 * sizeof(float));
      }
    }
  });
  expect_load_error({"model.safetensors", scale_, "shape [2, 2]"});
}

TEST_F(Fp8CheckpointErrors, AScaleOfAnUnsupportedDtype) {
  edit_tensors([&](std::vector<OwnedTensor>& tensors) {
    for (OwnedTensor& t : tensors) {
      if (t.name == scale_) {
        t.dtype = DType::kI8;
        t.bytes.resize(t.bytes.size() / sizeof(float));
      }
    }
  });
  expect_load_error({"model.safetensors", scale_, "I8"});
}

TEST_F(Fp8CheckpointErrors, ANanCode) {
  const std::string weight = "model.layers.0.self_attn.k_proj.weight";
  edit_tensors([&](std::vector<OwnedTensor>& tensors) {
    for (OwnedTensor& t : tensors) {
      if (t.name == weight) t.bytes[37] = std::byte{0x7F};
    }
  });
  expect_load_error({"model.safetensors", weight, "NaN"});
}

TEST_F(Fp8CheckpointErrors, AScaleThatIsNotFiniteAndPositive) {
  // A scale multiplies its whole block: zero, negative or non-finite would zero, flip or poison
  // it without a word.
  for (const float bad : {0.0f, -0.5f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(bad);
    edit_tensors([&](std::vector<OwnedTensor>& tensors) {
      for (OwnedTensor& t : tensors) {
        if (t.name == scale_) std::memcpy(t.bytes.data(), &bad, sizeof(float));
      }
    });
    expect_load_error({"model.safetensors", scale_, "at entry 0", "finite and positive"});
  }
}

TEST_F(Fp8CheckpointErrors, PatternsOfUnquantizedModulesMatchWholeNamesAndAreBounded) {
  // A "re:" entry matches a whole module name: one naming a quantized layer contradicts the file.
  edit_config([](json& config) {
    config["quantization_config"]["modules_to_not_convert"] = {"lm_head", "re:.*\\.down_proj"};
  });
  expect_load_error({"model.safetensors", "down_proj", "left unquantized"});
  // Matching part of a name is not matching it.
  edit_config([](json& config) {
    config["quantization_config"]["modules_to_not_convert"] = {"re:down_proj"};
  });
  auto backend = testing::make_cpu_backend(1);
  EXPECT_NO_THROW(Model::load(dir_ / "fp8", *backend));
  // A pattern that does not compile, and one that backtracks without end, are one error naming
  // the entry (the load neither hangs nor crashes).
  for (const auto& [entry, why] : {std::pair<std::string, std::string>{"re:(", "does not compile"},
                                   {"re:(\\w|\\w\\w|.)*(?<=[^.])$(?<!\\d)[.]", "match limit"}}) {
    const std::string pattern = entry;  // a lambda below captures it (not a structured binding)
    SCOPED_TRACE(pattern);
    edit_config(
        [&](json& config) { config["quantization_config"]["modules_to_not_convert"] = {pattern}; });
    expect_load_error({"config.json", pattern, why});
  }
}

TEST_F(Fp8CheckpointErrors, StaticInputScales) {
  edit_tensors([&](std::vector<OwnedTensor>& tensors) {
    tensors.push_back({"model.layers.0.mlp.up_proj.input_scale",
                       DType::kF32,
                       {1},
                       testing::bytes_of(std::vector<float>{0.5f})});
  });
  expect_load_error({"model.safetensors", "model.layers.0.mlp.up_proj.input_scale", "static"});
}

TEST_F(Fp8CheckpointErrors, QuantizationConfigsSpecrunDoesNotApply) {
  const auto expect_config_error = [&](const std::function<void(json&)>& edit,
                                       std::initializer_list<std::string> fragments) {
    const std::string original = testing::read_file(dir_ / "fp8" / "config.json");
    edit_config(edit);
    expect_load_error(fragments);
    testing::write_file(dir_ / "fp8" / "config.json", original);
  };
  expect_config_error([](json& c) { c["quantization_config"]["quant_method"] = "awq"; },
                      {"config.json", "quant_method 'awq'"});
  expect_config_error([](json& c) { c["quantization_config"]["activation_scheme"] = "static"; },
                      {"config.json", "activation_scheme 'static'"});
  expect_config_error(
      [](json& c) {
        c["quantization_config"]["weight_block_size"] = {128, 100};
      },
      {"config.json", "weight_block_size"});
  // FP8 codes with no quantization_config to say how they are scaled.
  expect_config_error([](json& c) { c.erase("quantization_config"); },
                      {"model.safetensors", "F8_E4M3", "quantization_config"});
}

// --- Quantization at load ---

class QuantizeAtLoadTest : public ::testing::TestWithParam<WeightQuantize> {};

TEST_P(QuantizeAtLoadTest, StaysCloseToTheOriginalAndReadsFewerBytes) {
  testing::TempDir dir;
  fixtures::GeneratorOptions options = f32_model();
  options.dtype = DType::kBF16;
  fixtures::write_random_checkpoint(options, dir / "model");
  ModelOptions quantized_options;
  quantized_options.quantize = GetParam();
  const std::vector<float> original = logits_of(dir / "model", kPrompt);
  const std::vector<float> quantized = logits_of(dir / "model", kPrompt, quantized_options);
  ASSERT_EQ(original.size(), quantized.size());
  const double range = largest_magnitude(original);
  double worst = 0;
  for (size_t i = 0; i < original.size(); ++i) {
    ASSERT_TRUE(std::isfinite(quantized[i])) << i;
    worst = std::max(worst, std::fabs(double(quantized[i]) - original[i]));
  }
  EXPECT_LT(worst, 0.05 * range);
  EXPECT_GT(worst, 0.0);  // the weights did change

  auto backend = testing::make_cpu_backend(1);
  const auto plain = Model::load(dir / "model", *backend);
  const auto small = Model::load(dir / "model", *backend, quantized_options);
  // Linear layers go from two bytes a weight to one (plus a scale per row); embeddings and the
  // head stay bf16.
  EXPECT_LT(small->weight_bytes(), plain->weight_bytes());
  EXPECT_GT(small->weight_bytes(), plain->weight_bytes() / 2);
}

TEST_P(QuantizeAtLoadTest, QuantizesTheHeadOnlyWhenAsked) {
  testing::TempDir dir;
  fixtures::GeneratorOptions options = f32_model();
  options.dtype = DType::kBF16;
  fixtures::write_random_checkpoint(options, dir / "model");
  auto backend = testing::make_cpu_backend(1);
  ModelOptions body;
  body.quantize = GetParam();
  ModelOptions with_head = body;
  with_head.quantize_output = true;
  const auto a = Model::load(dir / "model", *backend, body);
  const auto b = Model::load(dir / "model", *backend, with_head);
  // The head is vocab x hidden: quantizing it saves about half its bf16 bytes.
  const uint64_t head_bf16 = uint64_t{256} * 128 * 2;
  EXPECT_NEAR(double(a->weight_bytes() - b->weight_bytes()), head_bf16 / 2.0, 256 * 4 + 1);
}

TEST_P(QuantizeAtLoadTest, ADeviceQuantizesOnTheWayUpToTheHostsCodes) {
  // A device's rows are quantized a chunk at a time on the host and uploaded: the host's codes
  // and scales. The device-like backend computes with the CPU's kernels, so its logits are the
  // host's bit for bit, and it holds what the memory plan says a device holds.
  auto pool = std::make_shared<kernels::cpu::ThreadPool>(2);
  kernels::cpu::CpuBackend host(pool);
  for (const bool tied : {false, true}) {
    for (const bool head : {false, true}) {
      testing::TempDir dir;
      fixtures::GeneratorOptions generator = f32_model();
      generator.dtype = DType::kBF16;
      generator.tie_word_embeddings = tied;
      fixtures::write_random_checkpoint(generator, dir / "model");
      ModelOptions options;
      options.kv_cache_tokens = 64;
      options.quantize = GetParam();
      options.quantize_output = head;
      testing::DeviceLikeBackend device(pool);
      const auto on_host = Model::load(dir / "model", host, options);
      const auto on_device = Model::load(dir / "model", device, options);
      const std::string what = std::string(tied ? "tied" : "untied") + (head ? ", head" : "");
      EXPECT_EQ(on_device->weight_bytes(), on_host->weight_bytes()) << what;
      EXPECT_EQ(Model::plan_memory(open_checkpoint(dir / "model"), options, false,
                                   testing::layouts_of(device), 1)
                    .weight_bytes,
                on_device->weight_bytes())
          << what;
      EXPECT_GE(device.uploaded, on_device->weight_bytes()) << what;
      EXPECT_EQ(forward_logits(*on_device, kPrompt), forward_logits(*on_host, kPrompt)) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantizeAtLoadTest,
                         ::testing::Values(WeightQuantize::kFP8, WeightQuantize::kINT8),
                         [](const auto& param_info) {
                           return param_info.param == WeightQuantize::kFP8 ? "fp8" : "int8";
                         });

TEST(QuantizeAtLoad, APreQuantizedCheckpointIsReadAsItIs) {
  testing::TempDir dir;
  fixtures::write_random_checkpoint(f32_model(), dir / "fp8");
  fixtures::write_random_checkpoint(f32_model(), dir / "twin");
  testing::write_fp8_checkpoint(dir / "fp8", dir / "twin", {"channel", "fp8", 0, 0, false});
  ModelOptions options;
  options.quantize = WeightQuantize::kINT8;
  EXPECT_EQ(logits_of(dir / "fp8", kPrompt, options), logits_of(dir / "fp8", kPrompt));
}

// --- Greedy speculation with quantized models ---

class QuantizedSpeculationTest : public ::testing::TestWithParam<Quantization> {
 protected:
  void SetUp() override { testing::write_layer_skip_pair(dir_.path()); }

  EngineConfig config(Quantization target, Quantization draft) const {
    EngineConfig config;
    config.target = (dir_ / "target").string();
    config.draft = (dir_ / "draft").string();
    config.threads = 2;
    config.kv_cache_tokens = 1024;
    config.quantize = target;
    config.draft_quantize = draft;
    return config;
  }

  static Request greedy(const std::vector<int32_t>& prompt, SpeculationMethod method,
                        int64_t gamma) {
    Request request;
    request.prompt_ids = prompt;
    request.sampling = testing::greedy(40);
    request.speculation = testing::speculation(method, GammaControl::kFixed, gamma);
    return request;
  }

  testing::TempDir dir_;
};

TEST_P(QuantizedSpeculationTest, GreedySpeculationEqualsTheQuantizedTargetAlone) {
  const Quantization q = GetParam();
  // A quantized target with a bf16 draft, and both quantized.
  for (const Quantization draft : {Quantization::kNone, q}) {
    const auto engine = Engine::create(config(q, draft));
    for (const std::vector<int32_t>& prompt :
         std::vector<std::vector<int32_t>>{{1, 5, 9, 2, 7}, {3}, {11, 12, 13, 14, 15, 16, 17}}) {
      const Result alone = engine->submit(greedy(prompt, SpeculationMethod::kNone, 0)).wait();
      ASSERT_EQ(alone.reason, FinishReason::kMaxTokens) << alone.error;
      for (const int64_t gamma : {1, 4, 7}) {
        const Result speculative =
            engine->submit(greedy(prompt, SpeculationMethod::kDraftModel, gamma)).wait();
        ASSERT_EQ(speculative.reason, FinishReason::kMaxTokens) << speculative.error;
        EXPECT_EQ(speculative.tokens, alone.tokens) << to_string(q) << " gamma " << gamma;
      }
    }
  }
}

TEST_P(QuantizedSpeculationTest, TheCApiQuantizesAsTheCppApiDoes) {
  const Quantization q = GetParam();
  const auto engine = Engine::create(config(q, q));
  const std::vector<int32_t> prompt = {1, 5, 9, 2, 7};
  const std::vector<int32_t> expected =
      engine->submit(greedy(prompt, SpeculationMethod::kDraftModel, 4)).wait().tokens;

  specrun_engine_config settings;
  ASSERT_EQ(specrun_engine_config_init(&settings), SPECRUN_OK);
  const std::string target = (dir_ / "target").string(), draft = (dir_ / "draft").string();
  settings.target = target.c_str();
  settings.draft = draft.c_str();
  settings.threads = 2;
  settings.kv_cache_tokens = 1024;
  settings.quantize =
      q == Quantization::kFP8 ? SPECRUN_QUANTIZATION_FP8 : SPECRUN_QUANTIZATION_INT8;
  settings.draft_quantize = settings.quantize;
  settings.sampling.temperature = 0.0f;
  settings.sampling.max_tokens = 40;
  settings.sampling.stop_at_eos = 0;
  settings.speculation.controller = SPECRUN_CONTROLLER_FIXED;
  settings.speculation.gamma = 4;
  specrun_engine* c_engine = nullptr;
  ASSERT_EQ(specrun_engine_create(&settings, &c_engine), SPECRUN_OK) << specrun_last_error();
  specrun_request_params params;
  ASSERT_EQ(specrun_request_params_init(&params), SPECRUN_OK);
  params.prompt_ids = prompt.data();
  params.prompt_id_count = prompt.size();
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(c_engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  EXPECT_EQ(std::vector<int32_t>(result->tokens, result->tokens + result->token_count), expected);
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(c_engine);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantizedSpeculationTest,
                         ::testing::Values(Quantization::kFP8, Quantization::kINT8),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

}  // namespace
}  // namespace specrun
