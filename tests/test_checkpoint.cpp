// Checkpoints on disk: resolving a path to config.json and weights, binding tensors by name and
// shape, and loading a model. Valid checkpoints come from the generator; each case then damages
// one thing and expects one Error naming the file and the tensor or key, with no state left
// behind that would spoil the next load.
#include "runtime/model/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/allocation.h"
#include "runtime/base/check.h"
#include "runtime/model/model.h"
#include "runtime/model/weights.h"
#include "runtime/text/tokenizer.h"
#include "tests/test_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using fixtures::GeneratorOptions;
using fixtures::write_random_checkpoint;
using nlohmann::json;
using testing::edit_tensors;
using testing::expect_error;
using testing::OwnedTensor;
using testing::TempDir;

OwnedTensor zeros(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;
  return {name, dtype, std::move(shape),
          std::vector<std::byte>(static_cast<size_t>(count) * dtype_size(dtype))};
}

void remove_tensor(const fs::path& path, const std::string& name) {
  edit_tensors(path, [&](std::vector<OwnedTensor>& tensors) {
    const auto it = std::find_if(tensors.begin(), tensors.end(),
                                 [&](const OwnedTensor& t) { return t.name == name; });
    ASSERT_NE(it, tensors.end()) << name;
    tensors.erase(it);
  });
}

void add_tensor(const fs::path& path, OwnedTensor tensor) {
  edit_tensors(path, [&](std::vector<OwnedTensor>& tensors) { tensors.push_back(tensor); });
}

void replace_tensor(const fs::path& path, OwnedTensor tensor) {
  edit_tensors(path, [&](std::vector<OwnedTensor>& tensors) {
    for (OwnedTensor& t : tensors) {
      if (t.name == tensor.name) {
        t = tensor;
        return;
      }
    }
    FAIL() << "no tensor " << tensor.name;
  });
}

void edit_config(const fs::path& directory, const std::function<void(json&)>& edit) {
  json config = json::parse(testing::read_file(directory / "config.json"));
  edit(config);
  testing::write_file(directory / "config.json", config.dump(2));
}

// Defaults: Llama, vocab 256, hidden 64, intermediate 160, 2 layers, 4 heads of 16, 2 KV heads.
fs::path make_checkpoint(const TempDir& dir, GeneratorOptions options = {},
                         const std::string& name = "model") {
  const fs::path directory = dir / name;
  write_random_checkpoint(options, directory);
  return directory;
}

// --- Path resolution ---

TEST(CheckpointResolveTest, Directory) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const CheckpointPaths paths = resolve_checkpoint(checkpoint);
  EXPECT_EQ(paths.directory, checkpoint);
  EXPECT_EQ(paths.config, checkpoint / "config.json");
  EXPECT_EQ(paths.weights, checkpoint / "model.safetensors");
  EXPECT_FALSE(paths.sharded);
  EXPECT_FALSE(paths.tokenizer.has_value());
}

TEST(CheckpointResolveTest, SafetensorsFile) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const CheckpointPaths paths = resolve_checkpoint(checkpoint / "model.safetensors");
  EXPECT_EQ(paths.directory, checkpoint);
  EXPECT_EQ(paths.config, checkpoint / "config.json");
  EXPECT_EQ(paths.weights, checkpoint / "model.safetensors");
  EXPECT_FALSE(paths.sharded);
}

TEST(CheckpointResolveTest, ShardedDirectoryAndIndexFile) {
  TempDir dir;
  GeneratorOptions options;
  options.shards = 3;
  const fs::path checkpoint = make_checkpoint(dir, options);
  const fs::path index = checkpoint / "model.safetensors.index.json";
  for (const fs::path& path : {checkpoint, index}) {
    SCOPED_TRACE(path.string());
    const CheckpointPaths paths = resolve_checkpoint(path);
    EXPECT_EQ(paths.directory, checkpoint);
    EXPECT_EQ(paths.weights, index);
    EXPECT_TRUE(paths.sharded);
    EXPECT_EQ(paths.config, checkpoint / "config.json");
  }
}

TEST(CheckpointResolveTest, SingleOddlyNamedSafetensors) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::rename(checkpoint / "model.safetensors", checkpoint / "weights.safetensors");
  EXPECT_EQ(resolve_checkpoint(checkpoint).weights, checkpoint / "weights.safetensors");
}

TEST(CheckpointResolveTest, TokenizerDetected) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  testing::write_file(checkpoint / "tokenizer.json", "{}");
  const CheckpointPaths paths = resolve_checkpoint(checkpoint);
  ASSERT_TRUE(paths.tokenizer.has_value());
  EXPECT_EQ(*paths.tokenizer, checkpoint / "tokenizer.json");
  EXPECT_EQ(resolve_checkpoint(checkpoint / "model.safetensors").tokenizer, paths.tokenizer);
}

TEST(CheckpointResolveTest, NonexistentPath) {
  TempDir dir;
  const fs::path path = dir / "no-such-model";
  expect_error([&] { resolve_checkpoint(path); }, {path.string(), "no such file or directory"});
  expect_error([&] { open_checkpoint(path); }, {path.string()});
}

TEST(CheckpointResolveTest, DirectoryWithoutWeights) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::remove(checkpoint / "model.safetensors");
  expect_error([&] { resolve_checkpoint(checkpoint); },
               {checkpoint.string(), "no model.safetensors", "no other .safetensors file"});
}

TEST(CheckpointResolveTest, DirectoryWithTwoSafetensorsAndNoIndex) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::rename(checkpoint / "model.safetensors", checkpoint / "a.safetensors");
  fs::copy_file(checkpoint / "a.safetensors", checkpoint / "b.safetensors");
  expect_error([&] { resolve_checkpoint(checkpoint); },
               {checkpoint.string(), "several .safetensors files without an index"});
}

TEST(CheckpointResolveTest, MissingConfig) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::remove(checkpoint / "config.json");
  for (const fs::path& path : {checkpoint, checkpoint / "model.safetensors"}) {
    SCOPED_TRACE(path.string());
    expect_error([&] { resolve_checkpoint(path); },
                 {(checkpoint / "config.json").string(), "missing"});
  }
}

TEST(CheckpointResolveTest, ConfigIsADirectory) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::remove(checkpoint / "config.json");
  fs::create_directory(checkpoint / "config.json");
  expect_error([&] { resolve_checkpoint(checkpoint); },
               {(checkpoint / "config.json").string(), "not a regular file"});
}

TEST(CheckpointResolveTest, WrongExtension) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  fs::copy_file(checkpoint / "model.safetensors", checkpoint / "model.bin");
  for (const fs::path& path : {checkpoint / "model.bin", checkpoint / "config.json"}) {
    SCOPED_TRACE(path.string());
    expect_error([&] { resolve_checkpoint(path); },
                 {path.string(), "expected a checkpoint directory"});
  }
}

TEST(CheckpointResolveTest, WeightsNotARegularFile) {
  // Opening a FIFO for reading blocks until a writer comes: it must be refused, not opened.
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  fs::remove(weights);
  ASSERT_EQ(::mkfifo(weights.c_str(), 0600), 0);
  for (const fs::path& path : {checkpoint, weights}) {
    SCOPED_TRACE(path.string());
    expect_error([&] { open_checkpoint(path); }, {weights.string()});
  }
  fs::remove(weights);
  fs::create_directory(weights);
  expect_error([&] { open_checkpoint(checkpoint); }, {weights.string(), "not a regular file"});
}

TEST(CheckpointResolveTest, IndexNotARegularFile) {
  TempDir dir;
  GeneratorOptions options;
  options.shards = 2;
  const fs::path checkpoint = make_checkpoint(dir, options);
  const fs::path index = checkpoint / "model.safetensors.index.json";
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  expect_error([&] { open_checkpoint(checkpoint); }, {index.string(), "not a regular file"});
}

// A tokenizer.json that is there but is not a file is an error naming it, never
// a checkpoint without a tokenizer (and never a blocked open).
TEST(CheckpointResolveTest, TokenizerOrConfigNotARegularFile) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path tokenizer = checkpoint / "tokenizer.json";
  ASSERT_EQ(::mkfifo(tokenizer.c_str(), 0600), 0);
  expect_error([&] { resolve_checkpoint(checkpoint); }, {tokenizer.string(), "not a regular file"});
  expect_error([&] { text::Tokenizer::load(checkpoint); },
               {tokenizer.string(), "not a regular file"});
  fs::remove(tokenizer);
  fs::create_directory(tokenizer);
  expect_error([&] { resolve_checkpoint(checkpoint); }, {tokenizer.string(), "not a regular file"});
  fs::remove(tokenizer);
  EXPECT_FALSE(resolve_checkpoint(checkpoint).tokenizer.has_value());
}

TEST(CheckpointResolveTest, TokenizerConfigNotARegularFile) {
  TempDir dir;
  testing::write_file(dir.path() / "tokenizer.json",
                      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  fs::create_directory(dir.path() / "tokenizer_config.json");
  expect_error([&] { text::Tokenizer::load(dir.path()); },
               {(dir.path() / "tokenizer_config.json").string(), "not a regular file"});
}

// --- Opening: the config and every header, before any binding ---

TEST(CheckpointOpenTest, GoodCheckpoint) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const Checkpoint opened = open_checkpoint(checkpoint);
  EXPECT_EQ(opened.config.vocab_size, 256);
  EXPECT_EQ(opened.config.num_layers, 2);
  // embed, 2 x 9 per layer, norm, lm_head.
  EXPECT_EQ(opened.tensors.all().size(), 21u);
}

TEST(CheckpointOpenTest, GarbageConfig) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  testing::write_file(checkpoint / "config.json",
                      "\x7f"
                      "ELF garbage {{{");
  expect_error([&] { open_checkpoint(checkpoint); },
               {(checkpoint / "config.json").string(), "not valid JSON"});
}

TEST(CheckpointOpenTest, TruncatedWeights) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  testing::write_file(weights, testing::read_file(weights).substr(0, 100));
  expect_error([&] { open_checkpoint(checkpoint); }, {weights.string(), "past the end"});
}

TEST(CheckpointOpenTest, TruncatedDataSection) {
  // The header survives; the last tensors' bytes do not.
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  const std::string bytes = testing::read_file(weights);
  testing::write_file(weights, bytes.substr(0, bytes.size() - 10));
  expect_error([&] { open_checkpoint(checkpoint); },
               {weights.string(), "tensor '", "past the data section"});
}

// --- Binding ---

TEST(CheckpointBindTest, GoodCheckpoint) {
  TempDir dir;
  const Checkpoint checkpoint = open_checkpoint(make_checkpoint(dir));
  const ModelWeights weights = bind_weights(checkpoint);
  EXPECT_EQ(weights.embedding.shape, (std::vector<int64_t>{256, 64}));
  ASSERT_EQ(weights.layers.size(), 2u);
  EXPECT_EQ(weights.layers[1].q_proj.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(weights.layers[1].k_proj.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(weights.layers[0].down_proj.shape, (std::vector<int64_t>{64, 160}));
  EXPECT_FALSE(weights.layers[0].q_bias);
  EXPECT_EQ(weights.layers[0].gate_proj.dtype, DType::kBF16);
  EXPECT_TRUE(weights.output);
  EXPECT_NE(weights.output.data, weights.embedding.data);
}

TEST(CheckpointBindTest, MissingTensor) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  remove_tensor(weights, "model.layers.1.self_attn.k_proj.weight");
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error(
      [&] { bind_weights(opened); },
      {weights.string(), "missing tensor 'model.layers.1.self_attn.k_proj.weight'", "[32, 64]"});
}

TEST(CheckpointBindTest, MissingLmHeadWhenUntied) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  remove_tensor(checkpoint / "model.safetensors", "lm_head.weight");
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {"missing tensor 'lm_head.weight'", "tie_word_embeddings is false"});
}

TEST(CheckpointBindTest, MissingTensorInShardedCheckpoint) {
  // Dropping a tensor from both a shard and the index leaves a consistent store without it.
  TempDir dir;
  GeneratorOptions options;
  options.shards = 2;
  const fs::path checkpoint = make_checkpoint(dir, options);
  const fs::path index = checkpoint / "model.safetensors.index.json";
  json document = json::parse(testing::read_file(index));
  const std::string name = "model.norm.weight";
  const std::string shard = document["weight_map"][name];
  document["weight_map"].erase(name);
  testing::write_file(index, document.dump());
  remove_tensor(checkpoint / shard, name);
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); }, {index.string(), "missing tensor '" + name + "'"});
}

TEST(CheckpointBindTest, WrongShape) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  // Transposed.
  replace_tensor(weights, zeros("model.layers.0.mlp.down_proj.weight", DType::kBF16, {160, 64}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {weights.string(), "tensor 'model.layers.0.mlp.down_proj.weight'",
                "has shape [160, 64], expected [64, 160]", "hidden_size, intermediate_size"});
}

TEST(CheckpointBindTest, ConfigDisagreesWithWeights) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  edit_config(checkpoint, [](json& config) { config["intermediate_size"] = 128; });
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {"model.safetensors", "tensor 'model.layers.0.mlp.gate_proj.weight'", "[160, 64]",
                "expected [128, 64]"});
}

TEST(CheckpointBindTest, UnexpectedLayerTensor) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  add_tensor(weights, zeros("model.layers.2.mlp.up_proj.weight", DType::kBF16, {160, 64}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {weights.string(), "unexpected tensor 'model.layers.2.mlp.up_proj.weight'",
                "LlamaForCausalLM with 2 layers"});
}

TEST(CheckpointBindTest, UnexpectedUnrelatedTensor) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  const fs::path weights = checkpoint / "model.safetensors";
  add_tensor(weights, zeros("foo", DType::kF32, {3}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); }, {weights.string(), "unexpected tensor 'foo'"});
}

TEST(CheckpointBindTest, UnexpectedBiasWithoutAttentionBias) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  add_tensor(checkpoint / "model.safetensors",
             zeros("model.layers.0.self_attn.q_proj.bias", DType::kBF16, {64}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {"unexpected tensor 'model.layers.0.self_attn.q_proj.bias'", "no q/k/v bias"});
}

TEST(CheckpointBindTest, RotaryInvFreqIgnored) {
  TempDir dir;
  const fs::path checkpoint = make_checkpoint(dir);
  add_tensor(checkpoint / "model.safetensors",
             zeros("model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {8}));
  add_tensor(checkpoint / "model.safetensors",
             zeros("model.layers.1.self_attn.rotary_emb.inv_freq", DType::kF32, {8}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  EXPECT_NO_THROW(bind_weights(opened));
}

TEST(CheckpointBindTest, TiedModel) {
  TempDir dir;
  GeneratorOptions options;
  options.tie_word_embeddings = true;
  const Checkpoint opened = open_checkpoint(make_checkpoint(dir, options));
  EXPECT_EQ(opened.tensors.find("lm_head.weight"), nullptr);
  const ModelWeights weights = bind_weights(opened);
  EXPECT_EQ(weights.output.data, weights.embedding.data);
}

TEST(CheckpointBindTest, TiedModelWithRedundantLmHead) {
  TempDir dir;
  GeneratorOptions options;
  options.tie_word_embeddings = true;
  const fs::path checkpoint = make_checkpoint(dir, options);
  add_tensor(checkpoint / "model.safetensors", zeros("lm_head.weight", DType::kBF16, {256, 64}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  const ModelWeights weights = bind_weights(opened);
  // The embedding, not the saved copy, is the output projection.
  EXPECT_EQ(weights.output.data, weights.embedding.data);
}

TEST(CheckpointBindTest, TiedModelWithWrongShapeLmHead) {
  TempDir dir;
  GeneratorOptions options;
  options.tie_word_embeddings = true;
  const fs::path checkpoint = make_checkpoint(dir, options);
  const fs::path weights = checkpoint / "model.safetensors";
  add_tensor(weights, zeros("lm_head.weight", DType::kBF16, {255, 64}));
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {weights.string(), "tensor 'lm_head.weight'", "[255, 64]", "expected [256, 64]"});
}

TEST(CheckpointBindTest, Qwen2) {
  TempDir dir;
  GeneratorOptions options;
  options.architecture = "Qwen2ForCausalLM";
  const Checkpoint opened = open_checkpoint(make_checkpoint(dir, options));
  const ModelWeights weights = bind_weights(opened);
  EXPECT_TRUE(weights.layers[0].q_bias);
  EXPECT_EQ(weights.layers[0].k_bias.shape, std::vector<int64_t>{32});
  EXPECT_FALSE(weights.layers[0].o_bias);
}

TEST(CheckpointBindTest, Qwen2MissingQkvBias) {
  TempDir dir;
  GeneratorOptions options;
  options.architecture = "Qwen2ForCausalLM";
  const fs::path checkpoint = make_checkpoint(dir, options);
  const fs::path weights = checkpoint / "model.safetensors";
  remove_tensor(weights, "model.layers.1.self_attn.v_proj.bias");
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {weights.string(), "missing tensor 'model.layers.1.self_attn.v_proj.bias'", "[32]"});
}

TEST(CheckpointBindTest, Qwen3BindsItsQueryAndKeyNormsAndMissesNoneOfThem) {
  TempDir dir;
  GeneratorOptions options;
  options.architecture = "Qwen3ForCausalLM";
  options.head_dim = 32;
  const fs::path checkpoint = make_checkpoint(dir, options);
  const Checkpoint opened = open_checkpoint(checkpoint);
  const ModelWeights weights = bind_weights(opened);
  EXPECT_EQ(weights.layers[1].q_norm.shape, std::vector<int64_t>{32});
  EXPECT_EQ(weights.layers[1].k_norm.shape, std::vector<int64_t>{32});
  EXPECT_FALSE(weights.layers[0].q_bias);
  const fs::path file = checkpoint / "model.safetensors";
  remove_tensor(file, "model.layers.1.self_attn.k_norm.weight");
  const Checkpoint missing = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(missing); },
               {file.string(), "missing tensor 'model.layers.1.self_attn.k_norm.weight'", "[32]"});
}

TEST(CheckpointBindTest, LlamaAttentionBiasMissingOutputBias) {
  TempDir dir;
  GeneratorOptions options;
  options.attention_bias = true;
  const fs::path checkpoint = make_checkpoint(dir, options);
  EXPECT_NO_THROW(bind_weights(open_checkpoint(checkpoint)));
  remove_tensor(checkpoint / "model.safetensors", "model.layers.0.self_attn.o_proj.bias");
  const Checkpoint opened = open_checkpoint(checkpoint);
  expect_error([&] { bind_weights(opened); },
               {"missing tensor 'model.layers.0.self_attn.o_proj.bias'"});
}

// --- Model::load ---

// The logits of a short prompt, to compare loads.
std::vector<float> prompt_logits(Model& model) {
  const SequenceId sequence = model.kv_cache().add_sequence();
  const std::vector<int32_t> tokens = {1, 17, 200, 3};
  const SequenceInput batch[] = {{sequence, tokens, false}};
  Logits logits;
  model.forward(batch, &logits);
  model.kv_cache().remove_sequence(sequence);
  return logits.values;
}

TEST(CheckpointModelLoadTest, EveryDtype) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    GeneratorOptions options;
    options.dtype = dtype;
    const fs::path checkpoint = make_checkpoint(dir, options, std::string(dtype_name(dtype)));
    const std::unique_ptr<Model> model = Model::load(checkpoint, *backend);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->config().vocab_size, 256);
    EXPECT_EQ(model->paths().weights, checkpoint / "model.safetensors");
    const std::vector<float> logits = prompt_logits(*model);
    ASSERT_EQ(logits.size(), 256u);
    for (const float value : logits) ASSERT_TRUE(std::isfinite(value));
  }
}

TEST(CheckpointModelLoadTest, ShardedMatchesSingleFile) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  GeneratorOptions options;
  const fs::path single = make_checkpoint(dir, options, "single");
  options.shards = 3;
  const fs::path sharded = make_checkpoint(dir, options, "sharded");
  const std::unique_ptr<Model> a = Model::load(single, *backend);
  const std::unique_ptr<Model> b = Model::load(sharded, *backend);
  EXPECT_TRUE(b->paths().sharded);
  EXPECT_EQ(a->parameter_count(), b->parameter_count());
  EXPECT_EQ(prompt_logits(*a), prompt_logits(*b));
}

// Gemma 3's 4B and larger models ship as Gemma3ForConditionalGeneration: the text model's config
// in text_config, its tensors under the language model's prefix beside a vision tower's. Written
// either way (the Hub's files and transformers 5: language_model.model.X; transformers 4.5x:
// model.language_model.X with an lm_head), the text model is the text-only checkpoint's, and the
// vision tensors are never read.
TEST(CheckpointModelLoadTest, AMultimodalGemma3IsItsTextModel) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  GeneratorOptions options;
  options.architecture = "Gemma3ForCausalLM";
  options.head_dim = 32;
  const fs::path text_only = make_checkpoint(dir, options, "text");
  const std::unique_ptr<Model> reference = Model::load(text_only, *backend);
  const std::vector<float> want = prompt_logits(*reference);

  // The text model's tensors under `text_prefix` and its output projection named `head`.
  const auto multimodal = [&](const std::string& name, const std::string& text_prefix,
                              const std::string& head = "language_model.lm_head.weight") {
    const fs::path directory = make_checkpoint(dir, options, name);
    edit_tensors(directory / "model.safetensors", [&](std::vector<OwnedTensor>& tensors) {
      for (OwnedTensor& tensor : tensors) {
        tensor.name = tensor.name == "lm_head.weight"
                          ? head
                          : text_prefix + tensor.name.substr(std::string("model.").size());
      }
      tensors.push_back(zeros("vision_tower.vision_model.embeddings.patch_embedding.weight",
                              DType::kF32, {8, 3, 14, 14}));
      tensors.push_back(
          zeros("multi_modal_projector.mm_input_projection_weight", DType::kF32, {8, 64}));
    });
    edit_config(directory, [](json& config) {
      json text = config;
      text.erase("architectures");
      text.erase("eos_token_id");
      config = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                {"model_type", "gemma3"},
                {"eos_token_id", {1, 106}},
                {"text_config", text},
                {"vision_config", {{"model_type", "siglip_vision_model"}}}};
    });
    return directory;
  };
  for (const auto& [prefix, head] : {std::pair<std::string, std::string>{
                                         "language_model.model.", "language_model.lm_head.weight"},
                                     {"model.language_model.", "lm_head.weight"}}) {
    SCOPED_TRACE(prefix);
    const fs::path directory = multimodal("multimodal", prefix, head);
    const std::unique_ptr<Model> model = Model::load(directory, *backend);
    EXPECT_EQ(model->config().architecture, Architecture::kGemma3);
    EXPECT_EQ(model->config().architecture_name, "Gemma3ForConditionalGeneration");
    EXPECT_EQ(model->config().eos_token_ids, (std::vector<int32_t>{1, 106}));
    EXPECT_EQ(model->parameter_count(), reference->parameter_count());
    EXPECT_EQ(prompt_logits(*model), want);
    fs::remove_all(directory);
  }

  // A tensor that is the text model's under both names is refused, naming it.
  const fs::path twice = multimodal("twice", "language_model.model.");
  add_tensor(twice / "model.safetensors", zeros("model.norm.weight", DType::kF32, {64}));
  expect_error([&] { open_checkpoint(twice); },
               {"tensors 'language_model.model.norm.weight' and 'model.norm.weight' are both the "
                "text model's 'model.norm.weight'"});
  // A vision-free name the text model does not have is refused as in any checkpoint.
  const fs::path stray = multimodal("stray", "language_model.model.");
  add_tensor(stray / "model.safetensors", zeros("audio_tower.weight", DType::kF32, {4}));
  expect_error([&] { bind_weights(open_checkpoint(stray)); },
               {"unexpected tensor 'audio_tower.weight'"});
  // Without its text_config there is no text model to run.
  edit_config(stray, [](json& config) { config.erase("text_config"); });
  expect_error([&] { open_checkpoint(stray); }, {"config.json", "'text_config'"});
}

TEST(CheckpointModelLoadTest, ErrorsNameTheCulprit) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  const fs::path checkpoint = make_checkpoint(dir);
  remove_tensor(checkpoint / "model.safetensors", "model.norm.weight");
  expect_error([&] { Model::load(checkpoint, *backend); },
               {(checkpoint / "model.safetensors").string(), "missing tensor 'model.norm.weight'"});
}

TEST(CheckpointModelLoadTest, LoadAfterFailureWorks) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  const fs::path good = make_checkpoint(dir, {}, "good");
  const fs::path bad = make_checkpoint(dir, {}, "bad");
  add_tensor(bad / "model.safetensors", zeros("foo", DType::kF32, {1}));
  const std::vector<float> expected = prompt_logits(*Model::load(good, *backend));

  expect_error([&] { Model::load(bad, *backend); }, {"unexpected tensor 'foo'"});
  const std::unique_ptr<Model> model = Model::load(good, *backend);
  EXPECT_EQ(prompt_logits(*model), expected);
  // The failure is not cached either: the same error again, and a fixed checkpoint loads.
  expect_error([&] { Model::load(bad, *backend); }, {"unexpected tensor 'foo'"});
  remove_tensor(bad / "model.safetensors", "foo");
  EXPECT_EQ(prompt_logits(*Model::load(bad, *backend)), expected);
}

TEST(CheckpointModelLoadTest, OverflowingDimensionsAreOneError) {
  // The defaults have 4 heads of 16 (q width 64) and 2 KV heads (width 32): 2^62 + 16 heads of
  // 4 wrap to 64 in 64 bits, and used to load against these weights and crash in RoPE.
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  const fs::path checkpoint = make_checkpoint(dir);
  const std::string config = (checkpoint / "config.json").string();
  edit_config(checkpoint, [](json& c) {
    c["num_attention_heads"] = (int64_t{1} << 62) + 16;
    c["num_key_value_heads"] = (int64_t{1} << 62) + 8;
    c["head_dim"] = 4;
  });
  expect_error([&] { Model::load(checkpoint, *backend); },
               {config, "key 'num_attention_heads'", "beyond the limit"});
  // The neighbours: a huge head_dim, a huge num_key_value_heads.
  edit_config(checkpoint, [](json& c) {
    c["num_attention_heads"] = 4;
    c["num_key_value_heads"] = 2;
    c["head_dim"] = (int64_t{1} << 62) + 16;
  });
  expect_error([&] { Model::load(checkpoint, *backend); },
               {config, "key 'head_dim'", "beyond the limit"});
  edit_config(checkpoint, [](json& c) {
    c["head_dim"] = 16;
    c["num_key_value_heads"] = (int64_t{1} << 62) + 2;
  });
  expect_error([&] { Model::load(checkpoint, *backend); },
               {config, "key 'num_key_value_heads'", "beyond the limit"});
  // Within the limit but not what the tensors hold: the shapes are checked against the file.
  edit_config(checkpoint, [](json& c) {
    c["num_key_value_heads"] = 2;
    c["head_dim"] = kMaxHeadDim;
  });
  expect_error([&] { Model::load(checkpoint, *backend); }, {"q_proj.weight", "has shape"});
}

TEST(CheckpointModelLoadTest, HugeContextWithATinyCache) {
  // max_position_embeddings is not a tensor's dimension: any value loads, and the context is the
  // smaller of it and the KV cache.
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  const fs::path checkpoint = make_checkpoint(dir);
  edit_config(checkpoint, [](json& c) { c["max_position_embeddings"] = INT64_MAX; });
  ModelOptions options;
  options.kv_cache_tokens = 16;
  const std::unique_ptr<Model> model = Model::load(checkpoint, *backend, options);
  EXPECT_EQ(model->context_limit(), 16);
  const std::vector<float> logits = prompt_logits(*model);
  for (const float value : logits) ASSERT_TRUE(std::isfinite(value));
  // Without an explicit size, the cache takes its default, not the configured context.
  EXPECT_LT(Model::load(checkpoint, *backend)->context_limit(), INT64_MAX);
}

TEST(CheckpointModelLoadTest, AllocationFailureNamesTheFile) {
  // What a load that runs out of memory reports: one Error naming the file.
  expect_error(
      [] {
        naming_allocation_failure("/models/x/model.safetensors",
                                  []() -> int { throw std::bad_alloc(); });
      },
      {"/models/x/model.safetensors", "out of memory"});
  EXPECT_EQ(naming_allocation_failure("f", [] { return 7; }), 7);
}

TEST(CheckpointModelLoadTest, BadOptions) {
  TempDir dir;
  const auto backend = testing::make_cpu_backend(1);
  const fs::path checkpoint = make_checkpoint(dir);
  ModelOptions options;
  options.kv_block_size = 0;
  expect_error([&] { Model::load(checkpoint, *backend, options); }, {"KV block size", "0"});
  options.kv_block_size = -16;
  expect_error([&] { Model::load(checkpoint, *backend, options); }, {"KV block size", "-16"});
  options = ModelOptions{};
  options.kv_cache_tokens = -1;
  expect_error([&] { Model::load(checkpoint, *backend, options); }, {"KV cache size", "-1"});
  // Beyond the 32-bit slot index: rejected before any arithmetic on it can overflow.
  options.kv_cache_tokens = INT64_MAX;
  expect_error([&] { Model::load(checkpoint, *backend, options); },
               {"KV cache size", std::to_string(INT64_MAX)});
  options.kv_cache_tokens = 64;
  EXPECT_EQ(Model::load(checkpoint, *backend, options)->kv_cache().capacity_tokens(), 64);
}

}  // namespace
}  // namespace specrun
