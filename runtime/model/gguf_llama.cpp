// The `llama` architecture of GGUF files: hyperparameters, tensor names and the tokenizer, turned
// into what the Hugging Face loading path already understands (ModelConfig, HF tensor names, a
// tokenizer.json document), so that both formats share one binding, one forward and one tokenizer.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <span>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/model/gguf.h"
#include "runtime/model/safetensors.h"
#include "runtime/text/unicode.h"
#include "specrun/error.hpp"

namespace specrun {
namespace {

using nlohmann::json;

// Per-layer tensor parts: GGUF name, Hugging Face name.
constexpr std::pair<std::string_view, std::string_view> kLayerParts[] = {
    {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"},
    {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
};
// Gemma's norms: its ffn_norm is the MLP's input norm (pre_feedforward_layernorm), and it has two
// more, on the attention's and the MLP's outputs. Looked up before kLayerParts.
constexpr std::pair<std::string_view, std::string_view> kGemmaLayerParts[] = {
    {"ffn_norm", "pre_feedforward_layernorm"},
    {"post_attention_norm", "post_attention_layernorm"},
    {"post_ffw_norm", "post_feedforward_layernorm"},
};
// The per-layer names of `architecture`'s files, the most specific first.
using NameParts = std::span<const std::pair<std::string_view, std::string_view>>;
std::array<NameParts, 2> layer_parts(std::string_view architecture) {
  return {architecture == "gemma3" ? NameParts(kGemmaLayerParts) : NameParts(),
          NameParts(kLayerParts)};
}

constexpr std::pair<std::string_view, std::string_view> kGlobalTensors[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    // A feature-reading draft's input projections (ModelConfig::feature_width).
    {"token_proj.weight", "model.token_proj.weight"},
    {"feature_proj.weight", "model.feature_proj.weight"},
};

// SentencePiece token types as llama.cpp writes them in tokenizer.ggml.token_type.
constexpr int64_t kTokenNormal = 1;
constexpr int64_t kTokenUnknown = 2;
constexpr int64_t kTokenControl = 3;
constexpr int64_t kTokenUserDefined = 4;

// Splits "blk.N.rest" into N and rest; false for another shape.
bool split_layer(std::string_view name, std::string_view prefix, std::string_view* layer,
                 std::string_view* rest) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  const size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  *layer = name.substr(0, dot);
  if (!std::all_of(layer->begin(), layer->end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *rest = name.substr(dot + 1);
  return true;
}

// A token id key: absent, or uint32's all-ones (llama.cpp's "none"), is nullopt.
std::optional<int32_t> token_id(const GgufFile& file, std::string_view key, int64_t vocab) {
  const std::optional<int64_t> id = file.get_int(key);
  if (!id || *id == -1 || *id == UINT32_MAX) return std::nullopt;
  if (*id < 0 || *id >= vocab) {
    file.fail_key(key, "holds " + std::to_string(*id) + ", outside the vocabulary of " +
                           std::to_string(vocab));
  }
  return static_cast<int32_t>(*id);
}

int64_t positive(const GgufFile& file, const std::string& key) {
  const int64_t value = file.require_int(key);
  if (value <= 0 || value > INT32_MAX) {
    file.fail_key(key, "must be a positive integer, got " + std::to_string(value));
  }
  return value;
}

double positive_number(const GgufFile& file, const std::string& key, double fallback) {
  const std::optional<double> value = file.get_number(key);
  if (!value) return fallback;
  if (!(*value > 0.0) || !std::isfinite(*value)) {
    file.fail_key(key, "must be a positive number, got " + std::to_string(*value));
  }
  return *value;
}

// Gemma 3 as llama.cpp runs it: what Hugging Face's config says in keys, llama.cpp's converter
// writes as weights (every norm gain already 1 + w) or leaves to its loader's constants (every
// sixth layer global, the local layers' RoPE base 1e4, scores scaled by head_dim^-0.5 but for the
// 27B's hidden / heads).
void gemma3_config(const GgufFile& file, const std::string& prefix, ModelConfig& c) {
  c.qk_norm = true;
  c.output_norms = true;
  c.mlp_activation = MlpActivation::kGeluTanh;
  c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  constexpr int64_t kGlobalEvery = 6;
  c.sliding_layers.assign(static_cast<size_t>(c.num_layers), false);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    c.sliding_layers[static_cast<size_t>(layer)] = (layer + 1) % kGlobalEvery != 0;
  }
  c.sliding_window = positive(file, prefix + "attention.sliding_window");
  c.local_rope_theta = 10000.0;
  constexpr int64_t k27bLayers = 62;
  const double query_scalar = c.num_layers == k27bLayers ? static_cast<double>(c.hidden_size) /
                                                               static_cast<double>(c.num_heads)
                                                         : static_cast<double>(c.head_dim);
  c.query_scale = static_cast<float>(1.0 / std::sqrt(query_scalar));
}

int64_t vocabulary_size(const GgufFile& file, const std::string& prefix) {
  if (const std::optional<int64_t> size = file.get_int(prefix + "vocab_size")) {
    if (*size <= 0 || *size > INT32_MAX) {
      file.fail_key(prefix + "vocab_size",
                    "must be a positive integer, got " + std::to_string(*size));
    }
    return *size;
  }
  if (const GgufValue* tokens = file.get_array("tokenizer.ggml.tokens", GgufType::kString)) {
    if (!tokens->array.empty() && tokens->array.size() <= INT32_MAX) {
      return static_cast<int64_t>(tokens->array.size());
    }
  }
  if (const GgufTensorInfo* embedding = file.find_tensor("token_embd.weight")) {
    if (embedding->ne.size() == 2 && embedding->ne[1] > 0 && embedding->ne[1] <= INT32_MAX) {
      return embedding->ne[1];
    }
  }
  throw Error(file.path().string() + ": no vocabulary size (no " + prefix +
              "vocab_size, tokenizer.ggml.tokens or "
              "token_embd.weight [hidden, vocab])");
}

// ---- tokenizer ---------------------------------------------------------------------------

json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// BOS (and EOS) around each sequence, as the post-processor of a tokenizer.json writes it.
json template_processing(const std::vector<std::pair<std::string, int64_t>>& before,
                         const std::vector<std::pair<std::string, int64_t>>& after) {
  json single = json::array();
  json pair = json::array();
  json special = json::object();
  auto add = [&](json& sequence, const std::vector<std::pair<std::string, int64_t>>& tokens,
                 int type_id) {
    for (const auto& [content, id] : tokens) {
      sequence.push_back({{"SpecialToken", {{"id", content}, {"type_id", type_id}}}});
      special[content] = {{"id", content}, {"ids", {id}}, {"tokens", {content}}};
    }
  };
  for (int side = 0; side < 2; ++side) {
    add(pair, before, side);
    pair.push_back({{"Sequence", {{"id", side == 0 ? "A" : "B"}, {"type_id", side}}}});
    add(pair, after, side);
  }
  add(single, before, 0);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  add(single, after, 0);
  return {{"type", "TemplateProcessing"},
          {"single", single},
          {"pair", pair},
          {"special_tokens", special}};
}

// Code point boundaries of a valid UTF-8 string (excluding 0 and its size).
std::vector<size_t> char_boundaries(const std::string& text) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) {
    if ((static_cast<uint8_t>(text[i]) & 0xc0) != 0x80) cuts.push_back(i);
  }
  return cuts;
}

// SentencePiece BPE merges from the piece scores, as Hugging Face's SentencePiece extractor (and
// tools/convert_llama2c.py) derive them: every split of a normal piece into two pieces of the
// vocabulary, the splits of one piece ordered by the halves' ids, all ordered by the merged
// piece's score, highest first, ties kept in vocabulary order.
json spm_merges(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                const std::vector<int64_t>& types, const std::map<std::string, int64_t>& vocab) {
  struct Merge {
    int64_t left;   // id of the left half
    int64_t right;  // id of the right half
    double score;   // the merged piece's score
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (types[id] != kTokenNormal) continue;
    const std::string& piece = tokens[id];
    std::vector<Merge> local;
    for (const size_t cut : char_boundaries(piece)) {
      const auto left = vocab.find(piece.substr(0, cut));
      const auto right = vocab.find(piece.substr(cut));
      if (left != vocab.end() && right != vocab.end()) {
        local.push_back({left->second, right->second, scores[id]});
      }
    }
    std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score > b.score; });
  json result = json::array();
  for (const Merge& merge : merges) {
    result.push_back(
        {tokens[static_cast<size_t>(merge.left)], tokens[static_cast<size_t>(merge.right)]});
  }
  return result;
}

// The pre-tokenizer llama.cpp's tokenizer.ggml.pre names, in tokenizer.json form (what the
// model's own tokenizer.json has); nullopt for a name not supported here.
std::optional<json> byte_level_pre_tokenizer(const std::string& pre, bool* ignore_merges) {
  const json byte_level_regex = {{"type", "ByteLevel"},
                                 {"add_prefix_space", false},
                                 {"trim_offsets", true},
                                 {"use_regex", true}};
  auto split_then_bytes = [](const std::string& pattern) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", pattern}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", false},
                   {"use_regex", false}}}}};
  };
  *ignore_merges = false;
  // GPT-2's split, as Hugging Face's converter writes it for these files.
  if (pre == "default" || pre == "gpt2") return byte_level_regex;
  // Each digit alone, then GPT-2's split (StarCoder's tokenizer.json layout).
  if (pre == "smollm" || pre == "starcoder" || pre == "refact") {
    return json{
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_regex}}};
  }
  if (pre == "llama-bpe" || pre == "llama3") {
    *ignore_merges = true;
    return split_then_bytes(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  }
  if (pre == "qwen2") {
    return split_then_bytes(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> gguf_to_hf_tensor_name(std::string_view name,
                                                  std::string_view architecture) {
  for (const auto& [gguf, hf] : kGlobalTensors) {
    if (name == gguf) return std::string(hf);
  }
  std::string_view layer;
  std::string_view rest;
  if (!split_layer(name, "blk.", &layer, &rest)) return std::nullopt;
  for (const NameParts parts : layer_parts(architecture)) {
    for (const auto& [gguf, hf] : parts) {
      for (const std::string_view suffix : {".weight", ".bias"}) {
        if (rest.size() == gguf.size() + suffix.size() && rest.starts_with(gguf) &&
            rest.ends_with(suffix)) {
          return "model.layers." + std::string(layer) + "." + std::string(hf) + std::string(suffix);
        }
      }
    }
  }
  return std::nullopt;
}

std::string hf_to_gguf_tensor_name(std::string_view name, std::string_view architecture) {
  for (const auto& [gguf, hf] : kGlobalTensors) {
    if (name == hf) return std::string(gguf);
  }
  std::string_view layer;
  std::string_view rest;
  if (split_layer(name, "model.layers.", &layer, &rest)) {
    for (const NameParts parts : layer_parts(architecture)) {
      for (const auto& [gguf, hf] : parts) {
        for (const std::string_view suffix : {".weight", ".bias"}) {
          if (rest.size() == hf.size() + suffix.size() && rest.starts_with(hf) &&
              rest.ends_with(suffix)) {
            return "blk." + std::string(layer) + "." + std::string(gguf) + std::string(suffix);
          }
        }
      }
    }
  }
  return std::string(name);
}

ModelConfig gguf_model_config(const GgufFile& file) {
  const std::string architecture = file.require_string("general.architecture");
  ModelConfig c;
  if (architecture == "llama") {
    c.architecture = Architecture::kLlama;
    // llama.cpp's converter permutes a Llama's q and k rows into Meta's interleaved pairing.
    c.rope_style = kernels::RopeStyle::kInterleaved;
  } else if (architecture == "qwen2" || architecture == "qwen3" || architecture == "gemma3") {
    c.architecture = architecture == "qwen2"   ? Architecture::kQwen2
                     : architecture == "qwen3" ? Architecture::kQwen3
                                               : Architecture::kGemma3;
    // Their q and k rows are stored as Hugging Face holds them (llama.cpp's NEOX rotation).
    c.rope_style = kernels::RopeStyle::kRotateHalf;
  } else {
    file.fail_key("general.architecture", "is '" + architecture +
                                              "', which is not supported (llama, qwen2, qwen3, "
                                              "gemma3)");
  }
  c.architecture_name = architecture;
  // The hyperparameters' keys start with the architecture's name: "qwen3.block_count".
  const std::string prefix = architecture + ".";
  c.hidden_size = positive(file, prefix + "embedding_length");
  c.intermediate_size = positive(file, prefix + "feed_forward_length");
  c.num_layers = positive(file, prefix + "block_count");
  c.num_heads = positive(file, prefix + "attention.head_count");
  c.num_kv_heads = file.find(prefix + "attention.head_count_kv") != nullptr
                       ? positive(file, prefix + "attention.head_count_kv")
                       : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0) {
    file.fail_key(prefix + "attention.head_count_kv", "(" + std::to_string(c.num_kv_heads) +
                                                          ") must divide attention.head_count (" +
                                                          std::to_string(c.num_heads) + ")");
  }
  if (file.find(prefix + "attention.key_length") != nullptr) {
    c.head_dim = positive(file, prefix + "attention.key_length");
    if (file.find(prefix + "attention.value_length") != nullptr &&
        positive(file, prefix + "attention.value_length") != c.head_dim) {
      file.fail_key(prefix + "attention.value_length", "must equal attention.key_length");
    }
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      file.fail_key(prefix + "embedding_length",
                    "is not a multiple of attention.head_count and no attention.key_length is "
                    "given");
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim > kMaxHeadDim) {
    file.fail_key(file.find(prefix + "attention.key_length") != nullptr
                      ? prefix + "attention.key_length"
                      : prefix + "embedding_length",
                  "gives " + std::to_string(c.head_dim) +
                      " channels per head, beyond the limit of " + std::to_string(kMaxHeadDim));
  }
  if (c.head_dim % 2 != 0) file.fail_key(prefix + "attention.key_length", "must be even for RoPE");
  if (file.find(prefix + "rope.dimension_count") != nullptr &&
      positive(file, prefix + "rope.dimension_count") != c.head_dim) {
    file.fail_key(prefix + "rope.dimension_count",
                  "is " + std::to_string(*file.get_int(prefix + "rope.dimension_count")) +
                      ", but RoPE over part of a head is not supported (head dim " +
                      std::to_string(c.head_dim) + ")");
  }
  if (const std::optional<int64_t> experts = file.get_int(prefix + "expert_count");
      experts && *experts > 0) {
    file.fail_key(prefix + "expert_count", "is " + std::to_string(*experts) +
                                               ": mixture-of-experts models are not supported");
  }
  c.rms_norm_eps = positive_number(file, prefix + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = positive_number(file, prefix + "rope.freq_base", 10000.0);
  const std::string scaling = file.get_string(prefix + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = positive_number(file, prefix + "rope.scaling.factor", 0.0);
    if (c.rope_scaling.factor == 0.0) file.fail_key(prefix + "rope.scaling.factor", "is required");
  } else if (scaling != "none") {
    file.fail_key(prefix + "rope.scaling.type",
                  "is '" + scaling + "', which is not supported (none, linear)");
  } else if (const std::optional<double> scale = file.get_number(prefix + "rope.scale_linear");
             scale && *scale != 1.0) {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = positive_number(file, prefix + "rope.scale_linear", 1.0);
  }
  c.max_position_embeddings = positive(file, prefix + "context_length");
  if (c.architecture == Architecture::kQwen2) c.qkv_bias = true;
  if (c.architecture == Architecture::kGemma3) gemma3_config(file, prefix, c);
  if (c.architecture == Architecture::kQwen3) {
    c.qk_norm = true;
    // Qwen3's attention_bias, off in every published model, shows as the tensors' presence.
    c.qkv_bias = file.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = file.find_tensor("blk.0.attn_output.bias") != nullptr;
  }
  c.vocab_size = vocabulary_size(file, prefix);
  c.tie_word_embeddings = file.find_tensor("output.weight") == nullptr;
  if (const GgufValue* ids = file.get_array(kOutputTokenIdsKey, GgufType::kInt32)) {
    for (const GgufValue& id : ids->array) {
      if (!id.is_integer() || static_cast<int64_t>(id.bits) < INT32_MIN ||
          static_cast<int64_t>(id.bits) > INT32_MAX) {
        file.fail_key(kOutputTokenIdsKey, "must hold token ids (integers)");
      }
      c.output_token_ids.push_back(static_cast<int32_t>(static_cast<int64_t>(id.bits)));
    }
    if (const auto problem = output_token_ids_problem(c.output_token_ids, c.vocab_size)) {
      file.fail_key(kOutputTokenIdsKey, *problem);
    }
    if (c.tie_word_embeddings) {
      file.fail_key(kOutputTokenIdsKey,
                    "needs an output.weight tensor of its own (none is stored)");
    }
  }
  if (file.get_int(kFeatureWidthKey)) {
    c.feature_width = positive(file, std::string(kFeatureWidthKey));
    if (c.feature_width != c.hidden_size) {
      file.fail_key(kFeatureWidthKey, "is " + std::to_string(c.feature_width) + ", not " + prefix +
                                          "embedding_length: the draft's own output "
                                          "stands for the target's feature");
    }
    const GgufTensorInfo* embedding = file.find_tensor("token_embd.weight");
    if (embedding == nullptr || embedding->ne.size() != 2 || embedding->ne[0] <= 0 ||
        embedding->ne[0] > INT32_MAX) {
      file.fail_key(kFeatureWidthKey,
                    "needs a token_embd.weight [width, vocab] tensor to read the tokens' width");
    }
    c.embedding_width = embedding->ne[0];
    if (c.tie_word_embeddings && c.embedding_width != c.hidden_size) {
      file.fail_key(kFeatureWidthKey,
                    "needs an output.weight tensor of its own: its token_embd.weight is " +
                        std::to_string(c.embedding_width) + " wide, not " + prefix +
                        "embedding_length");
    }
  }
  if (const auto bos = token_id(file, "tokenizer.ggml.bos_token_id", c.vocab_size)) {
    c.bos_token_ids = {*bos};
  }
  if (const auto eos = token_id(file, "tokenizer.ggml.eos_token_id", c.vocab_size)) {
    c.eos_token_ids = {*eos};
  }
  // Chat models end a turn with their end-of-turn token, which llama.cpp also stops on.
  std::optional<int32_t> eot = token_id(file, "tokenizer.ggml.eot_token_id", c.vocab_size);
  if (!eot && c.architecture == Architecture::kGemma3) {
    // Gemma's files name no end-of-turn id; llama.cpp finds <end_of_turn> by its text.
    if (const GgufValue* tokens = file.get_array("tokenizer.ggml.tokens", GgufType::kString)) {
      for (size_t id = 0; id < tokens->array.size() && id < static_cast<size_t>(c.vocab_size);
           ++id) {
        if (tokens->array[id].string == "<end_of_turn>") eot = static_cast<int32_t>(id);
      }
    }
  }
  if (eot &&
      std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), *eot) == c.eos_token_ids.end()) {
    c.eos_token_ids.push_back(*eot);
  }
  c.chat_template = file.get_string("tokenizer.chat_template").value_or("");
  return c;
}

std::optional<json> gguf_tokenizer_json(const GgufFile& file) {
  const std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) return std::nullopt;
  if (*model != "llama" && *model != "gpt2") {
    file.fail_key("tokenizer.ggml.model",
                  "is '" + *model + "', which is not supported (llama, gpt2)");
  }
  const GgufValue* token_array = file.get_array("tokenizer.ggml.tokens", GgufType::kString);
  if (token_array == nullptr || token_array->array.empty()) {
    file.fail_key("tokenizer.ggml.tokens", "is required (a non-empty array of strings)");
  }
  if (token_array->array.size() > INT32_MAX) {
    file.fail_key("tokenizer.ggml.tokens", "has more tokens than 32-bit ids can number");
  }
  const int64_t size = static_cast<int64_t>(token_array->array.size());
  std::vector<std::string> tokens;
  tokens.reserve(static_cast<size_t>(size));
  std::map<std::string, int64_t> vocab;
  for (int64_t id = 0; id < size; ++id) {
    const std::string& token = token_array->array[static_cast<size_t>(id)].string;
    if (!text::is_valid_utf8(token)) {
      file.fail_key("tokenizer.ggml.tokens", "entry " + std::to_string(id) + " is not valid UTF-8");
    }
    tokens.push_back(token);
    vocab[token] = id;  // a repeated token keeps its last id, as both converters do
  }
  auto numbers = [&](const char* key) {
    std::vector<double> values;
    const GgufValue* array = file.get_array(key, GgufType::kFloat32);
    if (array == nullptr) return values;
    if (static_cast<int64_t>(array->array.size()) != size) {
      file.fail_key(key, "has " + std::to_string(array->array.size()) + " entries for " +
                             std::to_string(size) + " tokens");
    }
    for (const GgufValue& value : array->array) {
      values.push_back(value.is_integer() ? static_cast<double>(static_cast<int64_t>(value.bits))
                                          : value.number);
    }
    return values;
  };
  std::vector<int64_t> types;
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    for (const double type : numbers("tokenizer.ggml.token_type")) {
      types.push_back(static_cast<int64_t>(type));
    }
  } else {
    types.assign(static_cast<size_t>(size), kTokenNormal);
  }
  const auto bos = token_id(file, "tokenizer.ggml.bos_token_id", size);
  const auto eos = token_id(file, "tokenizer.ggml.eos_token_id", size);
  const auto unk = token_id(file, "tokenizer.ggml.unknown_token_id", size);
  const bool spm = *model == "llama";
  const bool add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  const bool add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  auto special = [&](std::optional<int32_t> id, const char* key) {
    if (!id) file.fail_key(key, "is required when the tokenizer adds it");
    return std::pair<std::string, int64_t>(tokens[static_cast<size_t>(*id)], *id);
  };
  std::vector<std::pair<std::string, int64_t>> before;
  std::vector<std::pair<std::string, int64_t>> after;
  if (add_bos) before.push_back(special(bos, "tokenizer.ggml.bos_token_id"));
  if (add_eos) after.push_back(special(eos, "tokenizer.ggml.eos_token_id"));

  json added = json::array();
  for (int64_t id = 0; id < size; ++id) {
    const int64_t type = types[static_cast<size_t>(id)];
    const bool is_special = type == kTokenControl || type == kTokenUnknown;
    if (is_special || type == kTokenUserDefined || (unk && id == *unk)) {
      added.push_back(added_token(id, tokens[static_cast<size_t>(id)], type != kTokenUserDefined));
    }
  }

  json document = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  json bpe = {{"type", "BPE"},
              {"dropout", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"vocab", vocab}};
  if (spm) {
    const GgufValue* scores = file.get_array("tokenizer.ggml.scores", GgufType::kFloat32);
    if (scores == nullptr) {
      file.fail_key("tokenizer.ggml.scores", "is required for tokenizer.ggml.model 'llama'");
    }
    const bool prefix_space = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
    const std::string space = "\u2581";
    json normalizers = json::array();
    if (prefix_space) normalizers.push_back({{"type", "Prepend"}, {"prepend", space}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space}});
    document["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    document["pre_tokenizer"] = nullptr;
    json decoders = {{{"type", "Replace"}, {"pattern", {{"String", space}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}};
    if (prefix_space) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    document["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    bpe["unk_token"] = unk ? json(tokens[static_cast<size_t>(*unk)]) : json(nullptr);
    bpe["fuse_unk"] = true;
    bpe["byte_fallback"] = true;
    bpe["ignore_merges"] = false;
    bpe["merges"] = spm_merges(tokens, numbers("tokenizer.ggml.scores"), types, vocab);
  } else {
    const std::string pre = file.get_string("tokenizer.ggml.pre").value_or("default");
    bool ignore_merges = false;
    std::optional<json> pre_tokenizer = byte_level_pre_tokenizer(pre, &ignore_merges);
    if (!pre_tokenizer) {
      file.fail_key("tokenizer.ggml.pre",
                    "is '" + pre +
                        "', a pre-tokenizer that is not supported (default, gpt2, smollm, "
                        "starcoder, refact, llama-bpe, qwen2)");
    }
    const GgufValue* merges = file.get_array("tokenizer.ggml.merges", GgufType::kString);
    if (merges == nullptr) {
      file.fail_key("tokenizer.ggml.merges", "is required for tokenizer.ggml.model 'gpt2'");
    }
    json merge_list = json::array();
    for (size_t i = 0; i < merges->array.size(); ++i) {
      const std::string& merge = merges->array[i].string;
      if (!text::is_valid_utf8(merge) || merge.find(' ') == std::string::npos) {
        file.fail_key("tokenizer.ggml.merges",
                      "entry " + std::to_string(i) + " is not two tokens separated by a space");
      }
      merge_list.push_back(merge);
    }
    document["normalizer"] = pre == "qwen2" ? json{{"type", "NFC"}} : json(nullptr);
    document["pre_tokenizer"] = *pre_tokenizer;
    document["decoder"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", true},
                           {"trim_offsets", true},
                           {"use_regex", true}};
    bpe["unk_token"] = nullptr;
    bpe["fuse_unk"] = false;
    bpe["byte_fallback"] = false;
    bpe["ignore_merges"] = ignore_merges;
    bpe["merges"] = std::move(merge_list);
  }
  if (!before.empty() || !after.empty()) {
    document["post_processor"] = template_processing(before, after);
  } else if (!spm) {
    document["post_processor"] = {{"type", "ByteLevel"},
                                  {"add_prefix_space", true},
                                  {"trim_offsets", false},
                                  {"use_regex", true}};
  } else {
    document["post_processor"] = nullptr;
  }
  document["model"] = std::move(bpe);
  return document;
}

namespace {

// The specrun dtype of a ggml block type kept as stored; nullopt for those widened at load.
std::optional<DType> block_dtype(uint32_t ggml_type) {
  switch (ggml_type) {
    case kGgmlQ4_0:
      return DType::kQ4_0;
    case kGgmlQ4_1:
      return DType::kQ4_1;
    case kGgmlQ8_0:
      return DType::kQ8_0;
    default:
      return std::nullopt;
  }
}

// A block whose scale or offset is NaN or infinite makes every product of its row NaN: refused at
// load, naming the tensor and the block, rather than found as a corrupt forward.
void check_block_scales(const std::filesystem::path& path, const GgufTensorInfo& tensor,
                        DType dtype) {
  const auto* blocks = reinterpret_cast<const uint8_t*>(tensor.data);
  const int64_t count = tensor.num_elements() / kQuantBlockElements;
  for (int64_t b = 0; b < count; ++b) {
    if (!block_scales_finite(blocks + b * dtype_block_bytes(dtype), dtype)) {
      throw Error(path.string() + ": tensor '" + tensor.name + "' (" +
                  std::string(dtype_name(dtype)) + ") has a scale that is not finite in block " +
                  std::to_string(b) + " of " + std::to_string(count));
    }
  }
}

}  // namespace

TensorStore TensorStore::open_gguf(const std::filesystem::path& path) {
  TensorStore store;
  auto file = std::make_shared<const GgufFile>(path);
  store.gguf_tensors_.reserve(file->tensors().size());
  // Tensor names depend on it; a file without one is refused with the model config.
  const std::string architecture = file->get_string("general.architecture").value_or("llama");
  for (const GgufTensorInfo& tensor : file->tensors()) {
    const GgmlTypeInfo& type = *ggml_type_info(tensor.type);  // the reader refused unknown types
    TensorInfo info{gguf_to_hf_tensor_name(tensor.name, architecture).value_or(tensor.name),
                    DType::kBF16,
                    tensor.shape(),
                    tensor.offset,
                    tensor.offset + tensor.size_bytes,
                    tensor.data,
                    path};
    const int64_t elements = tensor.num_elements();
    if (tensor.type == kGgmlF32 || tensor.type == kGgmlF16 || tensor.type == kGgmlBF16) {
      info.dtype = tensor.type == kGgmlF32   ? DType::kF32
                   : tensor.type == kGgmlF16 ? DType::kF16
                                             : DType::kBF16;
      // general.alignment may be below the element size.
      if (reinterpret_cast<uintptr_t>(tensor.data) % dtype_size(info.dtype) != 0) {
        auto copy = std::make_unique<std::byte[]>(tensor.size_bytes);
        std::memcpy(copy.get(), tensor.data, tensor.size_bytes);
        info.data = copy.get();
        store.converted_.push_back(std::move(copy));
      }
    } else if (const std::optional<DType> blocks = block_dtype(tensor.type);
               blocks && tensor.ne.size() == 2) {
      // A matrix is kept as the file stores it, in the mapping: the CPU multiplies (and looks
      // up) the blocks as they lie, and a device's upload widens them (Model::place_weights).
      // Vectors (norms, biases) are widened here, as the other types are.
      info.dtype = *blocks;
      check_block_scales(path, tensor, *blocks);
    } else {
      if (!type.supported) {
        throw Error(path.string() + ": tensor '" + tensor.name + "' has ggml type " +
                    std::string(type.name) + ", which specrun cannot read (" +
                    supported_type_names() + ")");
      }
      // [elements] bf16: what the backends compute with.
      auto bytes = std::make_unique<std::byte[]>(static_cast<size_t>(elements) * sizeof(uint16_t));
      dequantize_to_bf16(tensor.type, tensor.data, elements,
                         reinterpret_cast<uint16_t*>(bytes.get()));
      info.data = bytes.get();
      store.converted_.push_back(std::move(bytes));
    }
    store.gguf_tensors_.push_back(std::move(info));
    const TensorInfo& stored = store.gguf_tensors_.back();
    if (!store.by_name_.emplace(stored.name, &stored).second) {
      throw Error(path.string() + ": tensor '" + tensor.name + "' names '" + stored.name +
                  "', which another tensor of the file also names");
    }
  }
  store.gguf_ = std::move(file);
  return store;
}

}  // namespace specrun
