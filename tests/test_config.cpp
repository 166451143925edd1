// config.json parsing: the configs of real checkpoints (with every key specrun ignores) parse to
// the right hyperparameters; each missing, ill-typed or unsupported key is one Error naming the
// source and the key; RoPE frequencies match the Hugging Face formulas computed independently.
#include "runtime/model/config.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::TempDir;

constexpr const char* kSource = "/models/x/config.json";

ModelConfig parse(const std::string& text) {
  return parse_model_config(json::parse(text), kSource);
}

void expect_config_error(const json& document, std::initializer_list<std::string> parts) {
  expect_error([&] { parse_model_config(document, kSource); }, {kSource});
  expect_error([&] { parse_model_config(document, kSource); }, parts);
}

// --- Configs as published on the Hugging Face hub ---

constexpr const char* kLlama2_7B = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pad_token_id": 0,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr const char* kMistral7B_v01 = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr const char* kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

constexpr const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3-0.6B's config.json as published: heads wider than hidden / heads, q/k norms (implied by the
// architecture; no key says so), tied embeddings.
constexpr const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

TEST(ConfigTest, Llama2_7B) {
  const ModelConfig c = parse(kLlama2_7B);
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.architecture_name, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // the default: Llama 2 does not write it
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c.rope_style, kernels::RopeStyle::kRotateHalf);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
}

TEST(ConfigTest, Llama31_8B) {
  const ModelConfig c = parse(kLlama31_8B);
  EXPECT_EQ(c.architecture, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_ids, std::vector<int32_t>{128000});
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ConfigTest, Llama32_1B) {
  const ModelConfig c = parse(kLlama32_1B);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{128001});
}

TEST(ConfigTest, Mistral7B_v01) {
  const ModelConfig c = parse(kMistral7B_v01);
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.architecture_name, "MistralForCausalLM");
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.widest_window(), 4096);  // every layer windowed
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ConfigTest, Mistral7B_v03) {
  const ModelConfig c = parse(kMistral7B_v03);
  EXPECT_EQ(c.architecture, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 0);  // null: full attention
  EXPECT_EQ(c.vocab_size, 32768);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
}

TEST(ConfigTest, Qwen25_05B) {
  const ModelConfig c = parse(kQwen25_05B);
  EXPECT_EQ(c.architecture, Architecture::kQwen2);
  EXPECT_EQ(c.architecture_name, "Qwen2ForCausalLM");
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.num_heads, 14);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  // sliding_window is written but unused while use_sliding_window is false.
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151643});
}

// Gemma 3 1B's config.json as published (transformers 4.50: the layer pattern as a number, the
// local RoPE base as its own key).
constexpr const char* kGemma3_1B = R"({
  "architectures": ["Gemma3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_logit_softcapping": null,
  "bos_token_id": 2,
  "cache_implementation": "hybrid",
  "eos_token_id": [1, 106],
  "final_logit_softcapping": null,
  "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152,
  "initializer_range": 0.02,
  "intermediate_size": 6912,
  "max_position_embeddings": 32768,
  "model_type": "gemma3_text",
  "num_attention_heads": 4,
  "num_hidden_layers": 26,
  "num_key_value_heads": 1,
  "pad_token_id": 0,
  "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": 512,
  "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "use_cache": true,
  "vocab_size": 262144
})";

TEST(ConfigTest, Gemma3_1B) {
  const ModelConfig c = parse(kGemma3_1B);
  EXPECT_EQ(c.architecture, Architecture::kGemma3);
  EXPECT_EQ(c.head_dim, 256);  // 4 x 256 = 1,024 query channels on a 1,152-wide model
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.norm_gain_offset);
  EXPECT_TRUE(c.output_norms);
  EXPECT_EQ(c.mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma's default: the file does not say
  EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(1152.0f));
  EXPECT_FLOAT_EQ(c.query_scale, 1.0f / 16.0f);
  EXPECT_EQ(c.sliding_window, 512);
  ASSERT_EQ(c.sliding_layers.size(), 26u);
  for (int64_t layer = 0; layer < 26; ++layer) {
    // Every sixth layer global: 5, 11, 17, 23.
    EXPECT_EQ(c.layer_window(layer), layer % 6 == 5 ? 0 : 512) << layer;
    EXPECT_EQ(c.local_rope(layer), layer % 6 != 5) << layer;
  }
  EXPECT_EQ(c.widest_window(), 0);  // the global layers size attention's workspace
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.local_rope_theta, 1e4);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 106}));
  // The local layers rotate with base 1e4, the global ones with 1e6.
  EXPECT_FLOAT_EQ(rope_inverse_frequencies(c, true)[1], std::pow(1e4f, -2.0f / 256.0f));
  EXPECT_FLOAT_EQ(rope_inverse_frequencies(c, false)[1], std::pow(1e6f, -2.0f / 256.0f));

  // transformers 5's form: layer_types and a rope_parameters entry per kind of layer; the 4B's
  // global layers scale linearly by 8.
  json document = json::parse(kGemma3_1B);
  for (const char* key : {"sliding_window_pattern", "rope_local_base_freq", "rope_theta"}) {
    document.erase(key);
  }
  document["layer_types"] = json::array();
  for (int i = 0; i < 26; ++i) {
    document["layer_types"].push_back(i % 2 ? "full_attention" : "sliding_attention");
  }
  document["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelConfig v5 = parse_model_config(document, kSource);
  EXPECT_EQ(v5.layer_window(0), 512);
  EXPECT_EQ(v5.layer_window(1), 0);
  EXPECT_EQ(v5.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(v5.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(v5.local_rope_theta, 1e4);

  // What it does not run is refused by name.
  for (const auto& [key, value] : {std::pair{"final_logit_softcapping", json(30.0)},
                                   std::pair{"attn_logit_softcapping", json(50.0)},
                                   std::pair{"use_bidirectional_attention", json(true)},
                                   std::pair{"hidden_activation", json("silu")},
                                   std::pair{"layer_types", json::array({"full_attention"})}}) {
    SCOPED_TRACE(key);
    json broken = json::parse(kGemma3_1B);
    broken[key] = value;
    expect_error([&] { parse_model_config(broken, kSource); }, {kSource, key});
  }
}

// google/gemma-3-4b-it's config.json as the Hub has it (vision_config shortened): text_config
// states only what differs from Gemma3TextConfig's defaults, and the end-of-sequence ids are the
// whole model's.
constexpr const char* kGemma3_4B_Multimodal = R"({
  "architectures": ["Gemma3ForConditionalGeneration"],
  "boi_token_index": 255999,
  "eoi_token_index": 256000,
  "eos_token_id": [1, 106],
  "image_token_index": 262144,
  "initializer_range": 0.02,
  "mm_tokens_per_image": 256,
  "model_type": "gemma3",
  "text_config": {
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "model_type": "gemma3_text",
    "num_hidden_layers": 34,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024
  },
  "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0",
  "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}
})";

TEST(ConfigTest, Gemma3_4B_MultimodalIsItsTextModel) {
  const ModelConfig c = parse(kGemma3_4B_Multimodal);
  EXPECT_EQ(c.architecture, Architecture::kGemma3);
  EXPECT_EQ(c.architecture_name, "Gemma3ForConditionalGeneration");
  EXPECT_TRUE(c.text_of_multimodal);
  // Stated by text_config.
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.intermediate_size, 10240);
  EXPECT_EQ(c.num_layers, 34);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  // Gemma3TextConfig's defaults.
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_FLOAT_EQ(c.query_scale, 1.0f / 16.0f);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.local_rope_theta, 1e4);
  EXPECT_EQ(c.layer_window(5), 0);  // every sixth layer global
  EXPECT_EQ(c.layer_window(6), 1024);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_ids, (std::vector<int32_t>{2}));
  // The whole model's.
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 106}));

  // An error in the text model's keys names text_config.
  json broken = json::parse(kGemma3_4B_Multimodal);
  broken["text_config"]["num_attention_heads"] = 7;
  expect_error([&] { parse_model_config(broken, kSource); },
               {kSource, "text_config", "num_key_value_heads"});
  broken["text_config"] = "gemma";
  expect_error([&] { parse_model_config(broken, kSource); }, {kSource, "'text_config'"});
  broken.erase("text_config");
  expect_error([&] { parse_model_config(broken, kSource); }, {kSource, "'text_config'"});
  broken = json::parse(kGemma3_4B_Multimodal);
  broken.erase("architectures");  // model_type alone says it too
  EXPECT_TRUE(parse_model_config(broken, kSource).text_of_multimodal);

  // A quantized one's modules left unquantized are named as the text model's.
  json quantized = json::parse(kGemma3_4B_Multimodal);
  quantized["quantization_config"] = {
      {"quant_method", "fp8"},
      {"modules_to_not_convert",
       {"language_model.lm_head", "language_model.model.layers.0.mlp.down_proj",
        "model.language_model.layers.1.mlp.up_proj", "vision_tower.encoder", "re:.*norm"}}};
  const ModelConfig quantized_config = parse_model_config(quantized, kSource);
  ASSERT_TRUE(quantized_config.quantization.has_value());
  EXPECT_EQ(quantized_config.quantization->unquantized,
            (std::vector<std::string>{"lm_head", "model.layers.0.mlp.down_proj",
                                      "model.layers.1.mlp.up_proj", "vision_tower.encoder",
                                      "re:.*norm"}));
}

TEST(ConfigTest, Qwen3_06B) {
  const ModelConfig c = parse(kQwen3_06B);
  EXPECT_EQ(c.architecture, Architecture::kQwen3);
  EXPECT_EQ(c.architecture_name, "Qwen3ForCausalLM");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // 16 x 128 = 2,048 query channels on a 1,024-wide model
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});

  json document = json::parse(kQwen3_06B);
  document["attention_bias"] = true;  // Qwen3's switch for bias on q, k, v and o
  const ModelConfig biased = parse_model_config(document, kSource);
  EXPECT_TRUE(biased.qkv_bias);
  EXPECT_TRUE(biased.o_bias);
  EXPECT_TRUE(biased.qk_norm);

  document = json::parse(kQwen3_06B);
  document["use_sliding_window"] = true;
  expect_error([&] { parse_model_config(document, kSource); },
               {kSource, "use_sliding_window", "not supported"});
}

TEST(ConfigTest, LlamaWithAttentionAndMlpBias) {
  json document = json::parse(kLlama2_7B);
  document["attention_bias"] = true;
  document["mlp_bias"] = true;
  const ModelConfig c = parse_model_config(document, kSource);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
}

TEST(ConfigTest, ModelTypeFallbackWithoutArchitectures) {
  for (const auto& [type, architecture, name] :
       {std::tuple{"llama", Architecture::kLlama, "LlamaForCausalLM"},
        std::tuple{"mistral", Architecture::kMistral, "MistralForCausalLM"},
        std::tuple{"qwen2", Architecture::kQwen2, "Qwen2ForCausalLM"},
        std::tuple{"qwen3", Architecture::kQwen3, "Qwen3ForCausalLM"},
        std::tuple{"gemma3_text", Architecture::kGemma3, "Gemma3ForCausalLM"}}) {
    SCOPED_TRACE(type);
    json document = json::parse(kLlama2_7B);
    document.erase("architectures");
    document["model_type"] = type;
    const ModelConfig c = parse_model_config(document, kSource);
    EXPECT_EQ(c.architecture, architecture);
    EXPECT_EQ(c.architecture_name, name);
  }
  // null counts as absent.
  json document = json::parse(kMistral7B_v01);
  document["architectures"] = nullptr;
  EXPECT_EQ(parse_model_config(document, kSource).architecture, Architecture::kMistral);
}

TEST(ConfigTest, NullOptionalKeysTakeDefaults) {
  json document = json::parse(kLlama2_7B);
  for (const char* key : {"num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling",
                          "max_position_embeddings", "tie_word_embeddings", "hidden_act",
                          "bos_token_id", "eos_token_id"}) {
    document[key] = nullptr;
  }
  const ModelConfig c = parse_model_config(document, kSource);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_TRUE(c.bos_token_ids.empty());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ConfigTest, BosTokenIdAsListIsAccepted) {
  // The field is a list (like eos_token_id); specrun starts from its first entry.
  json document = json::parse(kLlama2_7B);
  document["bos_token_id"] = {1, 3};
  EXPECT_EQ(parse_model_config(document, kSource).bos_token_ids, (std::vector<int32_t>{1, 3}));
}

TEST(ConfigTest, OutputTokenIdsReduceTheHead) {
  json document = json::parse(kLlama2_7B);
  EXPECT_TRUE(parse_model_config(document, kSource).output_token_ids.empty());
  document["output_token_ids"] = {0, 2, 31999};
  EXPECT_EQ(parse_model_config(document, kSource).output_token_ids,
            (std::vector<int32_t>{0, 2, 31999}));
}

TEST(ConfigErrorTest, OutputTokenIdsMustBeIncreasingIdsOfAnUntiedHead) {
  json document = json::parse(kLlama2_7B);
  document["output_token_ids"] = {0, 5, 5};
  expect_config_error(document,
                      {"'output_token_ids'", "strictly increasing", "entry 2 (5) follows 5"});
  document["output_token_ids"] = {3, 32000};
  expect_config_error(
      document, {"'output_token_ids'", "holds 32000 (entry 1)", "outside the vocabulary of 32000"});
  document["output_token_ids"] = json::array();
  expect_config_error(document, {"'output_token_ids'", "is empty"});
  document["output_token_ids"] = {1, "two"};
  expect_config_error(document, {"'output_token_ids'", "list of token ids"});
  document["output_token_ids"] = {1, 2};
  document["tie_word_embeddings"] = true;
  expect_config_error(document, {"'output_token_ids'", "tie_word_embeddings is true"});
}

TEST(ConfigTest, RopeScalingDefaultAndLinear) {
  json document = json::parse(kLlama2_7B);
  document["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(parse_model_config(document, kSource).rope_scaling.type, RopeScalingType::kNone);
  document["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const ModelConfig c = parse_model_config(document, kSource);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
}

TEST(ConfigTest, RopeParametersAsTransformers5WritesThem) {
  // save_pretrained in transformers 5 moves rope_theta and rope_scaling into rope_parameters.
  json document = json::parse(kLlama31_8B);
  const json scaling = document["rope_scaling"];
  document.erase("rope_scaling");
  document.erase("rope_theta");
  document["rope_parameters"] = scaling;
  document["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig c = parse_model_config(document, kSource);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(rope_inverse_frequencies(c),
            rope_inverse_frequencies(parse_model_config(json::parse(kLlama31_8B), kSource)));

  document["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  const ModelConfig plain = parse_model_config(document, kSource);
  EXPECT_DOUBLE_EQ(plain.rope_theta, 1e6);
  EXPECT_EQ(plain.rope_scaling.type, RopeScalingType::kNone);

  document["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_config_error(document, {"'rope_parameters'", "yarn", "not supported"});
  document["rope_parameters"] = 10000.0;
  expect_config_error(document, {"'rope_parameters'", "must be an object"});
}

TEST(ConfigTest, LoadFromFile) {
  TempDir dir;
  const std::filesystem::path path = dir / "config.json";
  testing::write_file(path, kLlama31_8B);
  const ModelConfig c = load_model_config(path);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
}

// --- Errors ---

TEST(ConfigErrorTest, NotAnObject) {
  expect_config_error(json::array({1, 2}), {"not a JSON object"});
  expect_config_error(json("LlamaForCausalLM"), {"not a JSON object"});
}

TEST(ConfigErrorTest, UnknownArchitecture) {
  json document = json::parse(kLlama2_7B);
  document["architectures"] = {"GPT2LMHeadModel"};
  expect_config_error(document, {"architecture 'GPT2LMHeadModel'", "not supported"});
}

TEST(ConfigErrorTest, ArchitecturesIllTyped) {
  for (const json& value : {json::array(), json("LlamaForCausalLM"), json::array({1})}) {
    SCOPED_TRACE(value.dump());
    json document = json::parse(kLlama2_7B);
    document["architectures"] = value;
    expect_config_error(document, {"'architectures'"});
  }
}

TEST(ConfigErrorTest, UnknownModelType) {
  json document = json::parse(kLlama2_7B);
  document.erase("architectures");
  document["model_type"] = "gpt2";
  expect_config_error(document, {"model_type 'gpt2'", "not supported"});
  document.erase("model_type");
  expect_config_error(document, {"'architectures'", "'model_type'"});
}

TEST(ConfigErrorTest, MissingRequiredKey) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    SCOPED_TRACE(key);
    json document = json::parse(kLlama31_8B);
    document.erase(key);
    expect_config_error(document, {std::string("key '") + key + "' is required"});
    document[key] = nullptr;
    expect_config_error(document, {std::string("key '") + key + "' is required"});
  }
}

TEST(ConfigErrorTest, IllTypedInteger) {
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"}) {
    for (const json& value : {json("64"), json(64.5), json(-1), json(0), json(true),
                              json::array({64}), json(18446744073709551615ull)}) {
      SCOPED_TRACE(std::string(key) + " = " + value.dump());
      json document = json::parse(kLlama31_8B);
      document[key] = value;
      expect_config_error(
          document, {std::string("key '") + key + "'", "must be a positive integer", value.dump()});
    }
  }
}

TEST(ConfigErrorTest, IllTypedNumberAndBoolean) {
  for (const char* key : {"rms_norm_eps", "rope_theta"}) {
    for (const json& value : {json("1e-5"), json(0.0), json(-1.0), json(true)}) {
      SCOPED_TRACE(std::string(key) + " = " + value.dump());
      json document = json::parse(kLlama31_8B);
      document[key] = value;
      expect_config_error(document, {std::string("key '") + key + "'", "positive number"});
    }
  }
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    for (const json& value : {json("false"), json(0), json(1)}) {
      SCOPED_TRACE(std::string(key) + " = " + value.dump());
      json document = json::parse(kLlama31_8B);
      document[key] = value;
      expect_config_error(document, {std::string("key '") + key + "'", "true or false"});
    }
  }
}

TEST(ConfigErrorTest, HeadsNotDivisibleByKvHeads) {
  json document = json::parse(kLlama31_8B);
  document["num_key_value_heads"] = 6;
  expect_config_error(document, {"key 'num_key_value_heads'", "(6)", "(32)"});
}

TEST(ConfigErrorTest, OddHeadDim) {
  json document = json::parse(kLlama31_8B);
  document["head_dim"] = 127;
  expect_config_error(document, {"key 'head_dim'", "even"});
  // Derived from hidden_size / heads: 4064 / 32 = 127.
  document.erase("head_dim");
  document["hidden_size"] = 4064;
  expect_config_error(document, {"key 'head_dim'", "even"});
}

TEST(ConfigErrorTest, HeadDimBeyondAnyModelsIsRefused) {
  // Found by fuzz_model_config: RoPE's table of head_dim / 2 frequencies took 3.8 GB before any
  // weight was read.
  json document = json::parse(kLlama31_8B);
  document["head_dim"] = 1888888888;
  expect_config_error(document,
                      {"key 'head_dim'", "gives 1888888888 channels per head", "limit of 1024"});
  document["head_dim"] = kMaxHeadDim;
  EXPECT_EQ(parse_model_config(document, kSource).head_dim, kMaxHeadDim);
  // Derived from hidden_size / heads: 65600 / 32 = 2050.
  document.erase("head_dim");
  document["hidden_size"] = 65600;
  expect_config_error(document, {"key 'hidden_size'", "gives 2050 channels per head"});
}

TEST(ConfigErrorTest, HiddenSizeNotMultipleOfHeadsWithoutHeadDim) {
  json document = json::parse(kLlama2_7B);
  document["hidden_size"] = 4100;
  expect_config_error(document, {"key 'hidden_size'", "num_attention_heads"});
  // An explicit head_dim makes it fine.
  document["head_dim"] = 128;
  EXPECT_EQ(parse_model_config(document, kSource).head_dim, 128);
}

TEST(ConfigErrorTest, HiddenActNotSilu) {
  json document = json::parse(kLlama2_7B);
  document["hidden_act"] = "gelu";
  expect_config_error(document, {"key 'hidden_act'", "silu", "gelu"});
  document["hidden_act"] = 1;
  expect_config_error(document, {"key 'hidden_act'"});
}

TEST(ConfigErrorTest, UnsupportedRopeScaling) {
  json document = json::parse(kLlama31_8B);
  document["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_config_error(document, {"key 'rope_scaling'", "'yarn'", "not supported"});
  // The older spelling of the type key.
  document["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  expect_config_error(document, {"key 'rope_scaling'", "'dynamic'"});
}

TEST(ConfigErrorTest, MalformedRopeScaling) {
  json document = json::parse(kLlama31_8B);
  document["rope_scaling"] = "llama3";
  expect_config_error(document, {"key 'rope_scaling'", "object"});
  document["rope_scaling"] = {{"factor", 8.0}};
  expect_config_error(document, {"key 'rope_scaling'", "rope_type"});
  document["rope_scaling"] = {{"rope_type", 3}};
  expect_config_error(document, {"key 'rope_scaling'", "rope_type"});
  document["rope_scaling"] = {{"type", "linear"}};
  expect_config_error(document, {"rope_scaling", "key 'factor'", "required"});
  document["rope_scaling"] = {{"type", "linear"}, {"factor", -2.0}};
  expect_config_error(document, {"rope_scaling", "key 'factor'", "positive"});
}

TEST(ConfigErrorTest, Llama3ScalingMissingField) {
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SCOPED_TRACE(key);
    json document = json::parse(kLlama31_8B);
    document["rope_scaling"].erase(key);
    expect_config_error(document, {"rope_scaling", std::string("key '") + key + "'", "llama3"});
  }
}

TEST(ConfigErrorTest, Llama3ScalingBadValues) {
  json document = json::parse(kLlama31_8B);
  document["rope_scaling"]["high_freq_factor"] = 1.0;
  expect_config_error(document, {"rope_scaling", "key 'high_freq_factor'", "low_freq_factor"});
  document = json::parse(kLlama31_8B);
  document["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
  expect_config_error(document, {"rope_scaling", "key 'original_max_position_embeddings'"});
  document = json::parse(kLlama31_8B);
  document["rope_scaling"]["factor"] = "8";
  expect_config_error(document, {"rope_scaling", "key 'factor'"});
}

TEST(ConfigErrorTest, Qwen2SlidingWindow) {
  json document = json::parse(kQwen25_05B);
  document["use_sliding_window"] = true;
  expect_config_error(document, {"key 'use_sliding_window'", "not supported"});
}

TEST(ConfigErrorTest, MistralSlidingWindowIllTyped) {
  json document = json::parse(kMistral7B_v01);
  document["sliding_window"] = -4096;
  expect_config_error(document, {"key 'sliding_window'"});
}

TEST(ConfigErrorTest, TokenIdOutsideVocabulary) {
  json document = json::parse(kLlama31_8B);
  document["eos_token_id"] = {128001, 128256};
  expect_config_error(document, {"key 'eos_token_id'", "128256", "outside the vocabulary"});
  document = json::parse(kLlama2_7B);
  document["bos_token_id"] = 32000;
  expect_config_error(document, {"key 'bos_token_id'", "32000", "outside the vocabulary"});
}

TEST(ConfigErrorTest, TokenIdIllTyped) {
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    for (const json& value : {json("1"), json(-1), json(1.5), json::array({1, "2"}),
                              json::array({json::array({1})}), json(4294967296ll)}) {
      SCOPED_TRACE(std::string(key) + " = " + value.dump());
      json document = json::parse(kLlama2_7B);
      document[key] = value;
      expect_config_error(document, {std::string("key '") + key + "'", "token id"});
    }
  }
}

TEST(ConfigErrorTest, LoadNotJsonNamesPath) {
  TempDir dir;
  const std::filesystem::path path = dir / "config.json";
  testing::write_file(path, "{\"architectures\": [\"LlamaForCausalLM\"],\n  oops");
  expect_error([&] { load_model_config(path); }, {path.string(), "not valid JSON"});
  testing::write_file(path, "");
  expect_error([&] { load_model_config(path); }, {path.string(), "not valid JSON"});
}

TEST(ConfigErrorTest, LoadErrorsNameThePath) {
  TempDir dir;
  const std::filesystem::path path = dir / "config.json";
  json document = json::parse(kLlama2_7B);
  document.erase("vocab_size");
  testing::write_file(path, document.dump());
  expect_error([&] { load_model_config(path); }, {path.string(), "key 'vocab_size'"});
}

TEST(ConfigErrorTest, DimensionsBeyondTheLimit) {
  // 2^62 + 64 heads of dim 4: the product wraps to 256, which a 256x256 weight would match.
  const int64_t huge = (int64_t{1} << 62) + 64;
  for (const char* key : {"num_attention_heads", "head_dim", "num_key_value_heads", "vocab_size",
                          "hidden_size", "intermediate_size", "num_hidden_layers"}) {
    SCOPED_TRACE(key);
    json document = json::parse(kLlama2_7B);
    document["head_dim"] = 4;
    document[key] = huge;
    if (std::string(key) == "num_attention_heads") document["num_key_value_heads"] = huge;
    expect_config_error(document, {std::string("key '") + key + "'", std::to_string(huge),
                                   "beyond the limit of 2147483647"});
  }
  // At the limit it parses (the tensors are checked against it at load); head_dim has its own,
  // lower limit (HeadDimBeyondAnyModelsIsRefused).
  json document = json::parse(kLlama2_7B);
  document["intermediate_size"] = kMaxModelDimension - 1;
  EXPECT_EQ(parse_model_config(document, kSource).intermediate_size, kMaxModelDimension - 1);
}

TEST(ConfigErrorTest, HugeMaxPositionEmbeddingsParses) {
  // Not a tensor dimension: the context limit is the smaller of it and the KV cache.
  json document = json::parse(kLlama2_7B);
  document["max_position_embeddings"] = INT64_MAX;
  EXPECT_EQ(parse_model_config(document, kSource).max_position_embeddings, INT64_MAX);
}

TEST(ConfigErrorTest, DeeplyNestedFile) {
  TempDir dir;
  const std::filesystem::path path = dir / "config.json";
  // 100k levels in 200 KB: refused while parsing, with the file and the limit named.
  testing::write_file(path, testing::nested_json_arrays(100'000));
  expect_error([&] { load_model_config(path); }, {path.string(), "nests deeper than 64 levels"});
  testing::write_file(path, "{\"vocab_size\": " + testing::nested_json_arrays(100'000) + "}");
  expect_error([&] { load_model_config(path); }, {path.string(), "nests deeper than 64 levels"});
}

TEST(ConfigErrorTest, ErrorsQuoteShortExcerpts) {
  // A wrong value of any size is quoted in a few dozen characters, not in full.
  json document = json::parse(kLlama2_7B);
  document["rms_norm_eps"] = std::string(100'000, 'x');
  try {
    parse_model_config(document, kSource);
    FAIL() << "no error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("key 'rms_norm_eps'"), std::string::npos) << message;
    EXPECT_NE(message.find("xxx..."), std::string::npos) << message;
    EXPECT_LT(message.size(), 300u);
  }
  // Invalid UTF-8 in the value is shown replaced, not thrown over.
  document["rms_norm_eps"] = std::string("\xff\xfe");
  expect_config_error(document, {"key 'rms_norm_eps'", "must be a positive number"});
}

TEST(ConfigErrorTest, LoadMissingFile) {
  TempDir dir;
  const std::filesystem::path path = dir / "config.json";
  expect_error([&] { load_model_config(path); }, {path.string(), "cannot open"});
}

// --- RoPE inverse frequencies ---

ModelConfig rope_config(int64_t head_dim, double theta) {
  ModelConfig config;
  config.head_dim = head_dim;
  config.rope_theta = theta;
  return config;
}

TEST(ConfigRopeTest, PlainFrequencies) {
  for (const auto& [head_dim, theta] :
       {std::pair{int64_t{128}, 10000.0}, std::pair{int64_t{64}, 500000.0},
        std::pair{int64_t{2}, 10000.0}, std::pair{int64_t{8}, 1e6}}) {
    SCOPED_TRACE(std::to_string(head_dim) + " " + std::to_string(theta));
    const std::vector<float> inv_freq = rope_inverse_frequencies(rope_config(head_dim, theta));
    ASSERT_EQ(inv_freq.size(), static_cast<size_t>(head_dim / 2));
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double expected =
          1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
      EXPECT_NEAR(inv_freq[i], expected, 1e-6 * expected) << "i = " << i;
    }
    EXPECT_EQ(inv_freq[0], 1.0f);
  }
}

TEST(ConfigRopeTest, LinearScaling) {
  ModelConfig config = rope_config(64, 10000.0);
  config.rope_scaling.type = RopeScalingType::kLinear;
  config.rope_scaling.factor = 4.0;
  const std::vector<float> inv_freq = rope_inverse_frequencies(config);
  ASSERT_EQ(inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double expected = 1.0 / std::pow(10000.0, 2.0 * i / 64.0) / 4.0;
    EXPECT_NEAR(inv_freq[i], expected, 1e-6 * expected) << "i = " << i;
  }
}

TEST(ConfigRopeTest, Llama3ScalingCoversAllThreeBands) {
  ModelConfig config = rope_config(128, 500000.0);
  config.rope_scaling.type = RopeScalingType::kLlama3;
  config.rope_scaling.factor = 8.0;
  config.rope_scaling.low_freq_factor = 1.0;
  config.rope_scaling.high_freq_factor = 4.0;
  config.rope_scaling.original_max_position_embeddings = 8192;
  const std::vector<float> inv_freq = rope_inverse_frequencies(config);
  ASSERT_EQ(inv_freq.size(), 64u);

  // transformers' _compute_llama3_parameters, in double.
  const double factor = 8.0, low = 1.0, high = 4.0, context = 8192.0;
  const double low_freq_wavelength = context / low;
  const double high_freq_wavelength = context / high;
  int kept = 0, scaled = 0, interpolated = 0;
  for (int i = 0; i < 64; ++i) {
    const double frequency = 1.0 / std::pow(500000.0, (2.0 * i) / 128.0);
    const double wavelength = 2.0 * std::numbers::pi / frequency;
    double expected;
    if (wavelength < high_freq_wavelength) {
      expected = frequency;
      ++kept;
    } else if (wavelength > low_freq_wavelength) {
      expected = frequency / factor;
      ++scaled;
    } else {
      const double smooth = (context / wavelength - low) / (high - low);
      expected = (1.0 - smooth) * frequency / factor + smooth * frequency;
      ++interpolated;
    }
    EXPECT_NEAR(inv_freq[i], expected, 1e-6 * expected) << "i = " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(interpolated, 0);
}

TEST(ConfigRopeTest, Llama31ConfigEndToEnd) {
  // The parsed Llama 3.1 config gives the same frequencies as the hand-built one.
  ModelConfig built = rope_config(128, 500000.0);
  built.rope_scaling.type = RopeScalingType::kLlama3;
  built.rope_scaling.factor = 8.0;
  built.rope_scaling.low_freq_factor = 1.0;
  built.rope_scaling.high_freq_factor = 4.0;
  built.rope_scaling.original_max_position_embeddings = 8192;
  EXPECT_EQ(rope_inverse_frequencies(parse(kLlama31_8B)), rope_inverse_frequencies(built));
}

TEST(ConfigFileTest, ConfigJsonThatIsNotARegularFileIsRefused) {
  testing::TempDir dir;
  const auto fifo = dir / "config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { load_model_config(fifo); }, {fifo.string(), "not a regular file"});
}

}  // namespace
}  // namespace specrun
