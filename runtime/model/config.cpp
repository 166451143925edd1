#include "runtime/model/config.h"

#include <cmath>
#include <numbers>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/base/mapped_file.h"
#include "runtime/model/safetensors.h"

namespace specrun {
namespace {

using nlohmann::json;

// Reads typed keys of one JSON object, naming the source and key in every error.
class KeyReader {
 public:
  KeyReader(const json& object, std::string source) : object_(object), source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": key '" + key + "' " + what);
  }

  // Absent and null both count as missing.
  const json* find(const std::string& key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t positive_int(const std::string& key) const {
    const json* value = find(key);
    if (value == nullptr) fail(key, "is required");
    return positive_int(key, *value);
  }

  int64_t positive_int(const std::string& key, int64_t fallback) const {
    const json* value = find(key);
    return value == nullptr ? fallback : positive_int(key, *value);
  }

  // A model dimension (a width, a count of heads or layers). No real model has one near 2^31, and
  // bounding each keeps every product of two (heads * head_dim, vocab * hidden) far inside int64,
  // so the shapes derived from them are exact when the tensors are checked against them.
  int64_t dimension(const std::string& key) const {
    const int64_t value = positive_int(key);
    if (value > kMaxModelDimension) {
      fail(key, "is " + std::to_string(value) + ", beyond the limit of " +
                    std::to_string(kMaxModelDimension));
    }
    return value;
  }

  double positive_number(const std::string& key, double fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number() || !(value->get<double>() > 0.0)) {
      fail(key, "must be a positive number, got " + json_excerpt(*value));
    }
    return value->get<double>();
  }

  bool boolean(const std::string& key, bool fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail(key, "must be true or false, got " + json_excerpt(*value));
    return value->get<bool>();
  }

  // An int, a list of ints, or absent/null (empty).
  std::vector<int32_t> token_ids(const std::string& key) const {
    const json* value = find(key);
    std::vector<int32_t> ids;
    if (value == nullptr) return ids;
    auto add = [&](const json& id) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        fail(key, "must be a token id or a list of token ids, got " + json_excerpt(*value));
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    };
    if (value->is_array()) {
      for (const json& id : *value) add(id);
    } else {
      add(*value);
    }
    return ids;
  }

 private:
  int64_t positive_int(const std::string& key, const json& value) const {
    if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
      fail(key, "must be a positive integer, got " + json_excerpt(value));
    }
    return value.get<int64_t>();
  }

  const json& object_;
  std::string source_;
};

// A list of strings, or absent/null (empty); `what` names it in errors.
std::vector<std::string> string_list(const json& object, const char* key, const std::string& what) {
  std::vector<std::string> strings;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return strings;
  if (!it->is_array()) throw Error(what + "." + key + " must be a list of strings");
  for (const json& entry : *it) {
    if (!entry.is_string()) throw Error(what + "." + key + " must be a list of strings");
    strings.push_back(entry.get<std::string>());
  }
  return strings;
}

// config.json's quantization_config. Supported: quant_method "fp8" (block-wise weight_scale_inv
// with weight_block_size, as DeepSeek-V3 and transformers' FineGrainedFP8 write it; or per-tensor
// and per-channel weight_scale) with dynamic activations, and "compressed-tensors" with 8-bit
// float or symmetric integer weights per tensor, channel, group or block and dynamic (or no)
// activation quantization. Anything that needs what specrun does not apply (static input scales,
// zero points, a quantized KV cache, other bit widths) is an Error naming the key.
std::optional<WeightQuantization> parse_quantization(const json& document,
                                                     const std::string& source) {
  const auto it = document.find("quantization_config");
  if (it == document.end() || it->is_null()) return std::nullopt;
  const std::string where = source + ": quantization_config";
  if (!it->is_object()) throw Error(where + " must be an object");
  const json& config = *it;
  const auto text = [&](const json& object, const char* key, const std::string& at) {
    const auto value = object.find(key);
    if (value == object.end() || value->is_null()) return std::string();
    if (!value->is_string()) throw Error(at + "." + key + " must be a string");
    return value->get<std::string>();
  };
  const std::string method = text(config, "quant_method", where);
  WeightQuantization quantization;
  quantization.method = method;
  if (method == "fp8") {
    const std::string activations = text(config, "activation_scheme", where);
    if (!activations.empty() && activations != "dynamic") {
      throw Error(where + ".activation_scheme '" + activations +
                  "' needs static input scales, which specrun does not apply (dynamic only)");
    }
    for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
      for (std::string& name : string_list(config, key, where)) {
        quantization.unquantized.push_back(std::move(name));
      }
    }
    const auto block = config.find("weight_block_size");
    if (block != config.end() && !block->is_null()) {
      if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
          !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() <= 0 ||
          (*block)[1].get<int64_t>() <= 0 || (*block)[1].get<int64_t>() % 16 != 0) {
        throw Error(where +
                    ".weight_block_size must be [rows, columns] with columns a multiple "
                    "of 16, got " +
                    json_excerpt(*block));
      }
      quantization.scales = WeightQuantization::Scales::kBlock;
      quantization.block_rows = (*block)[0].get<int64_t>();
      quantization.block_cols = (*block)[1].get<int64_t>();
      quantization.scale_suffix = ".weight_scale_inv";
    } else {
      quantization.scales = WeightQuantization::Scales::kChannel;  // or per tensor, by shape
      quantization.scale_suffix = ".weight_scale";
    }
    return quantization;
  }
  if (method == "compressed-tensors") {
    const std::string format = text(config, "format", where);
    if (format != "float-quantized" && format != "int-quantized" && format != "naive-quantized") {
      throw Error(where + ".format '" + format +
                  "' is not supported (float-quantized, int-quantized, naive-quantized)");
    }
    if (const auto kv = config.find("kv_cache_scheme"); kv != config.end() && !kv->is_null()) {
      throw Error(where + ".kv_cache_scheme: a quantized KV cache is not supported");
    }
    const auto groups = config.find("config_groups");
    if (groups == config.end() || !groups->is_object() || groups->size() != 1) {
      throw Error(where +
                  ".config_groups must hold exactly one group (one scheme for every "
                  "quantized linear layer)");
    }
    const std::string group_name = groups->begin().key();
    const json& group = groups->begin().value();
    const std::string at = where + ".config_groups." + group_name;
    if (!group.is_object()) throw Error(at + " must be an object");
    const std::vector<std::string> targets = string_list(group, "targets", at);
    if (targets != std::vector<std::string>{"Linear"}) {
      throw Error(at + ".targets must be [\"Linear\"]");
    }
    const auto weights = group.find("weights");
    if (weights == group.end() || !weights->is_object()) throw Error(at + ".weights is missing");
    const auto number = [&](const json& object, const char* key) -> int64_t {
      const auto value = object.find(key);
      return value != object.end() && value->is_number_integer() ? value->get<int64_t>() : -1;
    };
    const std::string type = text(*weights, "type", at + ".weights");
    if (number(*weights, "num_bits") != 8 || (type != "float" && type != "int")) {
      throw Error(at + ".weights must be 8-bit float or int, got " + json_excerpt(*weights));
    }
    if (const auto symmetric = weights->find("symmetric");
        symmetric != weights->end() && !(symmetric->is_boolean() && symmetric->get<bool>())) {
      throw Error(at + ".weights.symmetric must be true (zero points are not supported)");
    }
    if (const auto dynamic = weights->find("dynamic");
        dynamic != weights->end() && !(dynamic->is_boolean() && !dynamic->get<bool>())) {
      throw Error(at + ".weights.dynamic must be false (weights carry their scales)");
    }
    const std::string strategy = text(*weights, "strategy", at + ".weights");
    if (strategy == "tensor" || strategy == "channel") {
      quantization.scales = WeightQuantization::Scales::kChannel;  // or per tensor, by shape
    } else if (strategy == "group") {
      const int64_t size = number(*weights, "group_size");
      if (size <= 0 || size % 16 != 0) {
        throw Error(at + ".weights.group_size must be a positive multiple of 16");
      }
      quantization.scales = WeightQuantization::Scales::kBlock;
      quantization.block_rows = 1;
      quantization.block_cols = size;
    } else if (strategy == "block") {
      const auto structure = weights->find("block_structure");
      if (structure == weights->end() || !structure->is_array() || structure->size() != 2 ||
          !(*structure)[0].is_number_integer() || !(*structure)[1].is_number_integer() ||
          (*structure)[0].get<int64_t>() <= 0 || (*structure)[1].get<int64_t>() <= 0 ||
          (*structure)[1].get<int64_t>() % 16 != 0) {
        throw Error(at +
                    ".weights.block_structure must be [rows, columns] with columns a "
                    "multiple of 16");
      }
      quantization.scales = WeightQuantization::Scales::kBlock;
      quantization.block_rows = (*structure)[0].get<int64_t>();
      quantization.block_cols = (*structure)[1].get<int64_t>();
    } else {
      throw Error(at + ".weights.strategy '" + strategy +
                  "' is not supported (tensor, channel, group, block)");
    }
    if (const auto inputs = group.find("input_activations");
        inputs != group.end() && !inputs->is_null()) {
      if (!inputs->is_object() || !inputs->contains("dynamic") ||
          !(*inputs)["dynamic"].is_boolean() || !(*inputs)["dynamic"].get<bool>()) {
        throw Error(at +
                    ".input_activations: static input scales are not supported (dynamic "
                    "activation quantization only, which specrun computes in f32)");
      }
    }
    if (const auto outputs = group.find("output_activations");
        outputs != group.end() && !outputs->is_null()) {
      throw Error(at + ".output_activations: output quantization is not supported");
    }
    quantization.scale_suffix = ".weight_scale";
    quantization.unquantized = string_list(config, "ignore", where);
    return quantization;
  }
  throw Error(where + ".quant_method '" + method +
              "' is not supported (fp8, compressed-tensors; or no quantization_config, with "
              "--quantize to quantize at load)");
}

Architecture parse_architecture(const json& document, const std::string& source,
                                std::string* name) {
  const auto architectures = document.find("architectures");
  if (architectures != document.end() && !architectures->is_null()) {
    if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
      throw Error(source + ": key 'architectures' must be a non-empty list of strings");
    }
    *name = (*architectures)[0].get<std::string>();
    if (*name == "LlamaForCausalLM") return Architecture::kLlama;
    if (*name == "MistralForCausalLM") return Architecture::kMistral;
    if (*name == "Qwen2ForCausalLM") return Architecture::kQwen2;
    if (*name == "Qwen3ForCausalLM") return Architecture::kQwen3;
    if (*name == "Gemma3ForCausalLM") return Architecture::kGemma3;
    throw Error(source + ": architecture '" + *name +
                "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                "Qwen3ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration's text)");
  }
  // Some configs name only the model type.
  const auto model_type = document.find("model_type");
  if (model_type == document.end() || !model_type->is_string()) {
    throw Error(source + ": neither 'architectures' nor 'model_type' says what the model is");
  }
  const std::string type = model_type->get<std::string>();
  if (type == "llama") return *name = "LlamaForCausalLM", Architecture::kLlama;
  if (type == "mistral") return *name = "MistralForCausalLM", Architecture::kMistral;
  if (type == "qwen2") return *name = "Qwen2ForCausalLM", Architecture::kQwen2;
  if (type == "qwen3") return *name = "Qwen3ForCausalLM", Architecture::kQwen3;
  if (type == "gemma3_text") return *name = "Gemma3ForCausalLM", Architecture::kGemma3;
  throw Error(source + ": model_type '" + type +
              "' is not supported (llama, mistral, qwen2, qwen3, gemma3_text, gemma3)");
}

// `object_key` names the object in errors: rope_scaling, or rope_parameters (transformers 5).
RopeScaling parse_rope_scaling(const KeyReader& keys, const json* value,
                               const std::string& object_key, const std::string& source) {
  RopeScaling scaling;
  if (value == nullptr) return scaling;
  if (!value->is_object()) keys.fail(object_key, "must be an object or null");
  // Newer configs say rope_type, older ones type.
  const json* type = nullptr;
  for (const char* key : {"rope_type", "type"}) {
    const auto it = value->find(key);
    if (it != value->end() && !it->is_null()) {
      type = &*it;
      break;
    }
  }
  if (type == nullptr || !type->is_string()) keys.fail(object_key, "has no rope_type");
  const std::string name = type->get<std::string>();
  const KeyReader inner(*value, source + ": " + object_key);
  if (name == "default") return scaling;
  if (name == "linear") {
    scaling.type = RopeScalingType::kLinear;
    scaling.factor = inner.positive_number("factor", 0.0);
    if (scaling.factor == 0.0) inner.fail("factor", "is required");
    return scaling;
  }
  if (name == "llama3") {
    scaling.type = RopeScalingType::kLlama3;
    for (const char* key :
         {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (inner.find(key) == nullptr) inner.fail(key, "is required for rope_type llama3");
    }
    scaling.factor = inner.positive_number("factor", 1.0);
    scaling.low_freq_factor = inner.positive_number("low_freq_factor", 1.0);
    scaling.high_freq_factor = inner.positive_number("high_freq_factor", 4.0);
    scaling.original_max_position_embeddings =
        inner.positive_int("original_max_position_embeddings");
    if (scaling.high_freq_factor <= scaling.low_freq_factor) {
      inner.fail("high_freq_factor", "must exceed low_freq_factor");
    }
    return scaling;
  }
  keys.fail(object_key,
            "has rope_type '" + name + "', which is not supported (default, linear, llama3)");
}

// Gemma 3's RoPE: a base and scaling for its global layers and a base for its local ones, as
// transformers 5 writes them (rope_parameters.full_attention, .sliding_attention) or as earlier
// configs do (rope_theta, rope_scaling, rope_local_base_freq).
void parse_gemma3_rope(const KeyReader& keys, const std::string& source, ModelConfig& config) {
  config.rope_theta = 1e6;  // transformers' defaults: global 1e6, local 1e4
  config.local_rope_theta = 1e4;
  const json* parameters = keys.find("rope_parameters");
  if (parameters == nullptr) {
    config.rope_theta = keys.positive_number("rope_theta", config.rope_theta);
    config.local_rope_theta = keys.positive_number("rope_local_base_freq", config.local_rope_theta);
    config.rope_scaling =
        parse_rope_scaling(keys, keys.find("rope_scaling"), "rope_scaling", source);
    return;
  }
  if (!parameters->is_object()) keys.fail("rope_parameters", "must be an object or null");
  const KeyReader layers(*parameters, source + ": rope_parameters");
  for (const char* type : {"full_attention", "sliding_attention"}) {
    const json* entry = layers.find(type);
    if (entry == nullptr) continue;
    if (!entry->is_object()) layers.fail(type, "must be an object");
    const KeyReader inner(*entry, source + ": rope_parameters." + type);
    const bool global = std::string_view(type) == "full_attention";
    double& theta = global ? config.rope_theta : config.local_rope_theta;
    theta = inner.positive_number("rope_theta", theta);
    const RopeScaling scaling =
        parse_rope_scaling(keys, entry, std::string("rope_parameters.") + type, source);
    if (global) {
      config.rope_scaling = scaling;
    } else if (scaling.type != RopeScalingType::kNone) {
      inner.fail("rope_type", "is not default: scaled RoPE on the local layers is not supported");
    }
  }
}

// What Gemma 3 adds to the Llama layout, with what it must not use.
void parse_gemma3(const KeyReader& keys, ModelConfig& config) {
  if (const json* activation = keys.find("hidden_activation")) {
    if (!activation->is_string() || (activation->get<std::string>() != "gelu_pytorch_tanh" &&
                                     activation->get<std::string>() != "gelu_tanh")) {
      keys.fail("hidden_activation",
                "must be \"gelu_pytorch_tanh\", got " + json_excerpt(*activation));
    }
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    if (const json* value = keys.find(key); value != nullptr && !value->is_null()) {
      keys.fail(key, "is set: logit soft-capping (Gemma 2's) is not supported");
    }
  }
  if (keys.boolean("use_bidirectional_attention", false)) {
    keys.fail("use_bidirectional_attention", "is true; only causal attention is supported");
  }
  const bool attention_bias = keys.boolean("attention_bias", false);
  config.qkv_bias = attention_bias;
  config.o_bias = attention_bias;
  config.qk_norm = true;
  config.norm_gain_offset = true;
  config.output_norms = true;
  config.mlp_activation = MlpActivation::kGeluTanh;
  config.tie_word_embeddings = keys.boolean("tie_word_embeddings", true);
  config.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(config.hidden_size)));
  const double query_scalar = keys.positive_number("query_pre_attn_scalar", 256.0);
  config.query_scale = static_cast<float>(1.0 / std::sqrt(query_scalar));
  config.sliding_window = keys.positive_int("sliding_window", 4096);
  config.sliding_layers.assign(static_cast<size_t>(config.num_layers), false);
  if (const json* types = keys.find("layer_types")) {
    if (!types->is_array() || types->size() != static_cast<size_t>(config.num_layers)) {
      keys.fail("layer_types",
                "must list one type per layer (" + std::to_string(config.num_layers) + ")");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& type = (*types)[i];
      if (type == "sliding_attention") {
        config.sliding_layers[i] = true;
      } else if (type != "full_attention") {
        keys.fail("layer_types",
                  "holds " + json_excerpt(type) + " (sliding_attention or full_attention)");
      }
    }
  } else {
    // Earlier configs give the pattern: every pattern-th layer is global.
    const int64_t pattern = keys.positive_int("sliding_window_pattern", 6);
    for (int64_t i = 0; i < config.num_layers; ++i) {
      config.sliding_layers[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
    }
  }
}

// Whether the document describes a multimodal Gemma 3 (Gemma3ForConditionalGeneration, model_type
// gemma3), whose text model specrun runs.
bool is_gemma3_multimodal(const json& document) {
  const auto architectures = document.find("architectures");
  if (architectures != document.end() && architectures->is_array() && !architectures->empty()) {
    return (*architectures)[0] == "Gemma3ForConditionalGeneration";
  }
  const auto model_type = document.find("model_type");
  return model_type != document.end() && *model_type == "gemma3";
}

// The text model's config of a multimodal Gemma 3: its text_config, completed with
// Gemma3TextConfig's defaults where it leaves a dimension out (the Hub's files state only what
// differs from them: google/gemma-3-4b-it's gives five keys), and the keys the whole model states
// for its text (the end-of-sequence ids of its instruction-tuned files, tying, quantization).
json gemma3_text_document(const json& document, const std::string& source) {
  const auto text = document.find("text_config");
  if (text == document.end() || !text->is_object()) {
    throw Error(source +
                ": key 'text_config' must be an object (Gemma3ForConditionalGeneration keeps its "
                "text model's configuration there)");
  }
  json merged = {{"vocab_size", 262208},    {"hidden_size", 2304},      {"intermediate_size", 9216},
                 {"num_hidden_layers", 26}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                 {"head_dim", 256},         {"bos_token_id", 2},        {"eos_token_id", 1}};
  for (const auto& [key, value] : text->items()) merged[key] = value;
  for (const char* key :
       {"bos_token_id", "eos_token_id", "tie_word_embeddings", "quantization_config"}) {
    const auto value = document.find(key);
    if (value != document.end() && !value->is_null()) merged[key] = *value;
  }
  // A quantized checkpoint's modules left unquantized, by the text model's names ("re:" patterns
  // stay as written).
  if (merged.contains("quantization_config") && merged["quantization_config"].is_object()) {
    json& quantization = merged["quantization_config"];
    for (const char* key : {"ignore", "modules_to_not_convert", "ignored_layers"}) {
      if (!quantization.contains(key) || !quantization[key].is_array()) continue;
      for (json& name : quantization[key]) {
        if (!name.is_string()) continue;
        if (std::optional<std::string> text_name = multimodal_text_name(name.get<std::string>())) {
          name = std::move(*text_name);
        }
      }
    }
  }
  merged["architectures"] = json::array({"Gemma3ForCausalLM"});
  merged["model_type"] = "gemma3_text";
  return merged;
}

}  // namespace

ModelConfig parse_model_config(const json& document, const std::string& source) {
  if (!document.is_object()) throw Error(source + ": not a JSON object");
  if (is_gemma3_multimodal(document)) {
    ModelConfig config =
        parse_model_config(gemma3_text_document(document, source), source + ": text_config");
    config.architecture_name = "Gemma3ForConditionalGeneration";
    config.text_of_multimodal = true;
    return config;
  }
  ModelConfig config;
  config.architecture = parse_architecture(document, source, &config.architecture_name);
  const KeyReader keys(document, source);

  config.vocab_size = keys.dimension("vocab_size");
  config.hidden_size = keys.dimension("hidden_size");
  config.intermediate_size = keys.dimension("intermediate_size");
  config.num_layers = keys.dimension("num_hidden_layers");
  config.num_heads = keys.dimension("num_attention_heads");
  config.num_kv_heads = keys.find("num_key_value_heads") != nullptr
                            ? keys.dimension("num_key_value_heads")
                            : config.num_heads;
  if (config.num_heads % config.num_kv_heads != 0) {
    keys.fail("num_key_value_heads", "(" + std::to_string(config.num_kv_heads) +
                                         ") must divide num_attention_heads (" +
                                         std::to_string(config.num_heads) + ")");
  }
  if (keys.find("head_dim") != nullptr) {
    config.head_dim = keys.dimension("head_dim");
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      keys.fail("hidden_size", "is not a multiple of num_attention_heads and no head_dim is given");
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim > kMaxHeadDim) {
    keys.fail(keys.find("head_dim") != nullptr ? "head_dim" : "hidden_size",
              "gives " + std::to_string(config.head_dim) +
                  " channels per head, beyond the limit of " + std::to_string(kMaxHeadDim));
  }
  if (config.head_dim % 2 != 0) keys.fail("head_dim", "must be even for rotary embeddings");

  config.rms_norm_eps = keys.positive_number("rms_norm_eps", 1e-6);
  config.rope_theta = keys.positive_number("rope_theta", 10000.0);
  if (config.architecture == Architecture::kGemma3) {
    parse_gemma3_rope(keys, source, config);
  } else if (const json* parameters = keys.find("rope_parameters")) {
    // transformers 5 writes theta and the scaling together, as rope_parameters, and no
    // rope_theta or rope_scaling at the top level.
    if (!parameters->is_object()) keys.fail("rope_parameters", "must be an object or null");
    config.rope_theta = KeyReader(*parameters, source + ": rope_parameters")
                            .positive_number("rope_theta", config.rope_theta);
    config.rope_scaling = parse_rope_scaling(keys, parameters, "rope_parameters", source);
  } else {
    config.rope_scaling =
        parse_rope_scaling(keys, keys.find("rope_scaling"), "rope_scaling", source);
  }
  const int64_t default_context = config.architecture == Architecture::kLlama     ? 2048
                                  : config.architecture == Architecture::kMistral ? 131072
                                  : config.architecture == Architecture::kGemma3  ? 131072
                                                                                  : 32768;
  config.max_position_embeddings = keys.positive_int("max_position_embeddings", default_context);
  config.tie_word_embeddings = keys.boolean("tie_word_embeddings", false);

  if (config.architecture == Architecture::kGemma3) {
    parse_gemma3(keys, config);
  } else if (const json* activation = keys.find("hidden_act")) {
    if (!activation->is_string() || activation->get<std::string>() != "silu") {
      keys.fail("hidden_act", "must be \"silu\", got " + json_excerpt(*activation));
    }
  }

  switch (config.architecture) {
    case Architecture::kLlama: {
      const bool attention_bias = keys.boolean("attention_bias", false);
      config.qkv_bias = attention_bias;
      config.o_bias = attention_bias;
      config.mlp_bias = keys.boolean("mlp_bias", false);
      break;
    }
    case Architecture::kMistral:
      config.sliding_window = keys.positive_int("sliding_window", 0);
      break;
    case Architecture::kQwen2:
      config.qkv_bias = true;
      if (keys.boolean("use_sliding_window", false)) {
        keys.fail("use_sliding_window",
                  "is true; Qwen2's per-layer sliding window is not supported");
      }
      break;
    case Architecture::kGemma3:
      break;  // parse_gemma3
    case Architecture::kQwen3: {
      const bool attention_bias = keys.boolean("attention_bias", false);
      config.qkv_bias = attention_bias;
      config.o_bias = attention_bias;
      config.qk_norm = true;
      if (keys.boolean("use_sliding_window", false)) {
        keys.fail("use_sliding_window",
                  "is true; Qwen3's per-layer sliding window is not supported");
      }
      break;
    }
  }

  config.quantization = parse_quantization(document, source);

  config.bos_token_ids = keys.token_ids("bos_token_id");
  config.eos_token_ids = keys.token_ids("eos_token_id");
  for (const auto* ids : {&config.bos_token_ids, &config.eos_token_ids}) {
    for (const int32_t id : *ids) {
      if (id >= config.vocab_size) {
        keys.fail(ids == &config.bos_token_ids ? "bos_token_id" : "eos_token_id",
                  "holds " + std::to_string(id) + ", outside the vocabulary of " +
                      std::to_string(config.vocab_size));
      }
    }
  }
  if (keys.find("feature_width") != nullptr) {
    config.feature_width = keys.positive_int("feature_width", 0);
    if (config.feature_width != config.hidden_size) {
      keys.fail("feature_width", "is " + std::to_string(config.feature_width) +
                                     ", not hidden_size (" + std::to_string(config.hidden_size) +
                                     "): the draft's own output stands for the target's feature");
    }
    config.embedding_width = keys.positive_int("embedding_width", config.hidden_size);
    if (config.tie_word_embeddings && config.embedding_width != config.hidden_size) {
      keys.fail("embedding_width", "differs from hidden_size, so the head cannot be tied");
    }
  } else if (keys.find("embedding_width") != nullptr) {
    keys.fail("embedding_width", "is only for a draft that reads features (feature_width)");
  }
  if (keys.find("output_token_ids") != nullptr) {
    config.output_token_ids = keys.token_ids("output_token_ids");
    if (const auto problem = output_token_ids_problem(config.output_token_ids, config.vocab_size)) {
      keys.fail("output_token_ids", *problem);
    }
    if (config.tie_word_embeddings) {
      keys.fail("output_token_ids", "needs an lm_head of its own, but tie_word_embeddings is true");
    }
  }
  return config;
}

std::optional<std::string> output_token_ids_problem(std::span<const int32_t> ids,
                                                    int64_t vocab_size) {
  if (ids.empty()) return "is empty: a reduced output projection scores at least one token";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return "holds " + std::to_string(ids[i]) + " (entry " + std::to_string(i) +
             "), outside the vocabulary of " + std::to_string(vocab_size);
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      return "must be strictly increasing, but entry " + std::to_string(i) + " (" +
             std::to_string(ids[i]) + ") follows " + std::to_string(ids[i - 1]);
    }
  }
  return std::nullopt;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  const MappedFile file(path);
  const json document = parse_json(file.text(), path.string());
  return parse_model_config(document, path.string());
}

std::vector<float> rope_inverse_frequencies(const ModelConfig& config, bool local) {
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  const RopeScaling scaling = local ? RopeScaling{} : config.rope_scaling;
  const double theta =
      local && config.local_rope_theta > 0.0 ? config.local_rope_theta : config.rope_theta;
  for (int64_t i = 0; i < half; ++i) {
    double frequency =
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(config.head_dim));
    if (scaling.type == RopeScalingType::kLinear) {
      frequency /= scaling.factor;
    } else if (scaling.type == RopeScalingType::kLlama3) {
      const double context = static_cast<double>(scaling.original_max_position_embeddings);
      const double low_freq_wavelength = context / scaling.low_freq_factor;
      const double high_freq_wavelength = context / scaling.high_freq_factor;
      const double wavelength = 2.0 * std::numbers::pi / frequency;
      if (wavelength > low_freq_wavelength) {
        frequency /= scaling.factor;  // long wavelengths: fully scaled
      } else if (wavelength >= high_freq_wavelength) {
        // The band between: interpolate between scaled and unscaled.
        const double smooth = (context / wavelength - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        frequency = (1.0 - smooth) * frequency / scaling.factor + smooth * frequency;
      }
    }
    inv_freq[static_cast<size_t>(i)] = static_cast<float>(frequency);
  }
  return inv_freq;
}

}  // namespace specrun
