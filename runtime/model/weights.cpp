#include "runtime/model/weights.h"

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <spdlog/spdlog.h>

#include "runtime/base/check.h"
#include "runtime/model/gguf.h"
#include "runtime/model/module_list.h"

namespace specrun {
namespace {

// Buffers some exporters save that carry nothing the forward needs.
bool is_known_redundant(const std::string& name) {
  const std::string suffix = ".self_attn.rotary_emb.inv_freq";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class Binder {
 public:
  explicit Binder(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  WeightView require(const std::string& name, std::vector<int64_t> shape,
                     const std::string& meaning) {
    const TensorInfo* info = checkpoint_.tensors.find(name);
    if (info == nullptr) {
      throw Error(source() + ": missing tensor '" + shown(name) + "' " + shape_to_string(shape) +
                  " (" + meaning + ")");
    }
    if (is_quantized(info->dtype)) {
      throw Error(info->file.string() + ": tensor '" + shown(name) + "' is " +
                  std::string(dtype_name(info->dtype)) +
                  ", but only the weights of linear layers may be quantized");
    }
    return take(*info, shape, meaning);
  }

  // The weight of the linear layer `module` ("model.layers.0.self_attn.q_proj"), with its scales
  // when the checkpoint stores it quantized.
  WeightView linear(const std::string& module, std::vector<int64_t> shape,
                    const std::string& meaning) {
    const std::string name = module + ".weight";
    const TensorInfo* info = checkpoint_.tensors.find(name);
    if (info == nullptr || !is_quantized(info->dtype)) return require(name, shape, meaning);
    const std::string file = info->file.string();
    const std::optional<WeightQuantization>& quantization = checkpoint_.config.quantization;
    if (!quantization) {
      throw Error(file + ": tensor '" + shown(name) + "' is " +
                  std::string(dtype_name(info->dtype)) +
                  " but config.json has no quantization_config to say how it is scaled");
    }
    if (!unquantized_) {
      unquantized_.emplace(quantization->unquantized, checkpoint_.paths.config.string());
    }
    if (unquantized_->contains(module)) {
      throw Error(file + ": tensor '" + shown(name) + "' is quantized, but quantization_config " +
                  "lists '" + module + "' as left unquantized");
    }
    if (checkpoint_.tensors.find(module + ".input_scale") != nullptr) {
      throw Error(file + ": tensor '" + module +
                  ".input_scale': static input scales are not supported (dynamic activations)");
    }
    WeightView view = take(*info, shape, meaning);
    const std::string scale_name = module + quantization->scale_suffix;
    const TensorInfo* scale = checkpoint_.tensors.find(scale_name);
    if (scale == nullptr) {
      throw Error(file + ": missing tensor '" + scale_name + "', the scales of the quantized '" +
                  name + "'");
    }
    if (scale->dtype != DType::kF32 && scale->dtype != DType::kBF16 &&
        scale->dtype != DType::kF16) {
      throw Error(scale->file.string() + ": tensor '" + scale_name + "' is " +
                  std::string(dtype_name(scale->dtype)) + "; scales must be F32, BF16 or F16");
    }
    const int64_t rows = shape[0], columns = shape[1];
    const std::vector<int64_t>& grid = scale->shape;
    int64_t count = 1;
    for (const int64_t dimension : grid) count *= dimension;
    if (quantization->scales == WeightQuantization::Scales::kBlock) {
      const std::vector<int64_t> expected = {
          (rows + quantization->block_rows - 1) / quantization->block_rows,
          (columns + quantization->block_cols - 1) / quantization->block_cols};
      if (grid != expected) {
        throw Error(scale->file.string() + ": tensor '" + scale_name + "' has shape " +
                    shape_to_string(grid) + ", expected " + shape_to_string(expected) +
                    " (one scale per " + std::to_string(quantization->block_rows) + " x " +
                    std::to_string(quantization->block_cols) + " block)");
      }
      view.scale_block_rows = quantization->block_rows;
      view.scale_block_cols = quantization->block_cols;
    } else if (count == 1 && grid.size() <= 2) {
      view.scale_block_rows = rows;  // one scale for the tensor
      view.scale_block_cols = columns;
    } else if (grid == std::vector<int64_t>{rows, 1} || grid == std::vector<int64_t>{rows}) {
      view.scale_block_rows = 1;  // one per output channel
      view.scale_block_cols = columns;
    } else {
      throw Error(scale->file.string() + ": tensor '" + scale_name + "' has shape " +
                  shape_to_string(grid) + ", expected [" + std::to_string(rows) +
                  ", 1] (per output channel) or [] (per tensor)");
    }
    bound_.insert(scale_name);
    view.scales = scale->data;
    view.scale_dtype = scale->dtype;
    view.scale_count = count;
    refuse_unusable_scales(view, scale->file.string(), scale_name);
    if (view.dtype == DType::kF8E4M3) refuse_nan_codes(view, file, name);
    return view;
  }

  WeightView optional(bool wanted, const std::string& name, std::vector<int64_t> shape,
                      const std::string& meaning) {
    if (!wanted) return WeightView{};
    return require(name, std::move(shape), meaning);
  }

  // Every tensor not bound is an error, but for the known-redundant buffers.
  void reject_unbound(const std::string& what) {
    for (const TensorInfo* info : checkpoint_.tensors.all()) {
      if (bound_.count(info->name) != 0) continue;
      if (is_known_redundant(info->name)) {
        spdlog::debug("{}: ignoring redundant tensor '{}'", info->file.string(), info->name);
        continue;
      }
      throw Error(info->file.string() + ": unexpected tensor '" + shown(info->name) + "' " +
                  shape_to_string(info->shape) + ", not part of " + what);
    }
  }

  // Marks a tensor as seen without binding it (an lm_head that tying replaces).
  void mark(const std::string& name) { bound_.insert(name); }

 private:
  std::string source() const { return checkpoint_.paths.weights.string(); }
  // A tensor as its file names it: GGUF files have their own names (blk.N.attn_q.weight).
  std::string shown(const std::string& name) const {
    return checkpoint_.paths.format == CheckpointFormat::kGguf
               ? hf_to_gguf_tensor_name(name, checkpoint_.config.architecture_name)
               : name;
  }

  WeightView take(const TensorInfo& info, const std::vector<int64_t>& shape,
                  const std::string& meaning) {
    if (info.shape != shape) {
      throw Error(info.file.string() + ": tensor '" + shown(info.name) + "' has shape " +
                  shape_to_string(info.shape) + ", expected " + shape_to_string(shape) + " (" +
                  meaning + ")");
    }
    bound_.insert(info.name);
    return WeightView{info.data, info.dtype, info.shape, info.size_bytes()};
  }

  // FP8 E4M3 has NaN codes (0x7F, 0xFF) and no use for them in weights; the kernels read codes
  // without testing for them, so a checkpoint holding one is refused here.
  // A scale multiplies every code of its block: zero, negative, infinite or NaN would silently
  // zero, flip or poison a whole block of weights.
  static void refuse_unusable_scales(const WeightView& view, const std::string& file,
                                     const std::string& name) {
    for (size_t i = 0; i < static_cast<size_t>(view.scale_count); ++i) {
      const float scale = load_as_f32(view.scales, view.scale_dtype, i);
      if (!(std::isfinite(scale) && scale > 0.0f)) {
        throw Error(file + ": tensor '" + name + "' holds the scale " + std::to_string(scale) +
                    " at entry " + std::to_string(i) + "; scales must be finite and positive");
      }
    }
  }

  static void refuse_nan_codes(const WeightView& view, const std::string& file,
                               const std::string& name) {
    const auto* codes = static_cast<const uint8_t*>(view.data);
    for (uint64_t i = 0; i < view.size_bytes; ++i) {
      if ((codes[i] & 0x7fu) == 0x7fu) {
        throw Error(file + ": tensor '" + name + "' holds an FP8 NaN code at element " +
                    std::to_string(i));
      }
    }
  }

  const Checkpoint& checkpoint_;
  std::set<std::string> bound_;
  std::optional<ModuleList> unquantized_;  // quantization_config's, its patterns compiled once
};

}  // namespace

ModelWeights bind_weights(const Checkpoint& checkpoint) {
  const ModelConfig& c = checkpoint.config;
  Binder binder(checkpoint);
  const int64_t q_width = c.num_heads * c.head_dim;
  const int64_t kv_width = c.num_kv_heads * c.head_dim;

  ModelWeights weights;
  if (c.reads_features()) {
    weights.embedding =
        binder.require("model.embed_tokens.weight", {c.vocab_size, c.embedding_columns()},
                       "vocab_size, embedding_width");
    weights.token_projection = binder.linear(
        "model.token_proj", {c.hidden_size, c.embedding_columns()}, "hidden_size, embedding_width");
    weights.feature_projection = binder.linear(
        "model.feature_proj", {c.hidden_size, c.feature_width}, "hidden_size, feature_width");
  } else {
    weights.embedding = binder.require("model.embed_tokens.weight", {c.vocab_size, c.hidden_size},
                                       "vocab_size, hidden_size");
  }
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    const std::string attention = prefix + "self_attn.";
    const std::string mlp = prefix + "mlp.";
    LayerWeights l;
    l.attention_norm =
        binder.require(prefix + "input_layernorm.weight", {c.hidden_size}, "hidden_size");
    l.q_proj = binder.linear(attention + "q_proj", {q_width, c.hidden_size},
                             "num_attention_heads * head_dim, hidden_size");
    l.k_proj = binder.linear(attention + "k_proj", {kv_width, c.hidden_size},
                             "num_key_value_heads * head_dim, hidden_size");
    l.v_proj = binder.linear(attention + "v_proj", {kv_width, c.hidden_size},
                             "num_key_value_heads * head_dim, hidden_size");
    l.o_proj = binder.linear(attention + "o_proj", {c.hidden_size, q_width},
                             "hidden_size, num_attention_heads * head_dim");
    l.q_bias = binder.optional(c.qkv_bias, attention + "q_proj.bias", {q_width},
                               "num_attention_heads * head_dim");
    l.k_bias = binder.optional(c.qkv_bias, attention + "k_proj.bias", {kv_width},
                               "num_key_value_heads * head_dim");
    l.v_bias = binder.optional(c.qkv_bias, attention + "v_proj.bias", {kv_width},
                               "num_key_value_heads * head_dim");
    l.o_bias = binder.optional(c.o_bias, attention + "o_proj.bias", {c.hidden_size}, "hidden_size");
    l.q_norm = binder.optional(c.qk_norm, attention + "q_norm.weight", {c.head_dim}, "head_dim");
    l.k_norm = binder.optional(c.qk_norm, attention + "k_norm.weight", {c.head_dim}, "head_dim");
    if (c.output_norms) {
      // Gemma: post_attention_layernorm normalises the attention's output, not the MLP's input.
      l.attention_output_norm = binder.require(prefix + "post_attention_layernorm.weight",
                                               {c.hidden_size}, "hidden_size");
      l.mlp_norm = binder.require(prefix + "pre_feedforward_layernorm.weight", {c.hidden_size},
                                  "hidden_size");
      l.mlp_output_norm = binder.require(prefix + "post_feedforward_layernorm.weight",
                                         {c.hidden_size}, "hidden_size");
    } else {
      l.mlp_norm = binder.require(prefix + "post_attention_layernorm.weight", {c.hidden_size},
                                  "hidden_size");
    }
    l.gate_proj = binder.linear(mlp + "gate_proj", {c.intermediate_size, c.hidden_size},
                                "intermediate_size, hidden_size");
    l.up_proj = binder.linear(mlp + "up_proj", {c.intermediate_size, c.hidden_size},
                              "intermediate_size, hidden_size");
    l.down_proj = binder.linear(mlp + "down_proj", {c.hidden_size, c.intermediate_size},
                                "hidden_size, intermediate_size");
    l.gate_bias = binder.optional(c.mlp_bias, mlp + "gate_proj.bias", {c.intermediate_size},
                                  "intermediate_size");
    l.up_bias = binder.optional(c.mlp_bias, mlp + "up_proj.bias", {c.intermediate_size},
                                "intermediate_size");
    l.down_bias =
        binder.optional(c.mlp_bias, mlp + "down_proj.bias", {c.hidden_size}, "hidden_size");
    weights.layers.push_back(std::move(l));
  }
  weights.final_norm = binder.require("model.norm.weight", {c.hidden_size}, "hidden_size");
  if (c.tie_word_embeddings) {
    weights.output = weights.embedding;
    // Some exporters save the tied copy anyway; the embedding is what the model uses.
    if (const TensorInfo* head = checkpoint.tensors.find("lm_head.weight")) {
      if (head->shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
        throw Error(head->file.string() + ": tensor 'lm_head.weight' has shape " +
                    shape_to_string(head->shape) + ", expected " +
                    shape_to_string(std::vector<int64_t>{c.vocab_size, c.hidden_size}) +
                    " (vocab_size, hidden_size)");
      }
      spdlog::warn(
          "{}: 'lm_head.weight' is present but tie_word_embeddings is true; using the "
          "embedding as the output projection",
          head->file.string());
      binder.mark("lm_head.weight");
    }
  } else {
    if (c.output_token_ids.empty()) {
      weights.output = binder.linear("lm_head", {c.vocab_size, c.hidden_size},
                                     "vocab_size, hidden_size; tie_word_embeddings is false");
    } else {
      weights.output =
          binder.linear("lm_head", {static_cast<int64_t>(c.output_token_ids.size()), c.hidden_size},
                        "one row per output_token_ids entry, hidden_size");
    }
  }
  binder.reject_unbound(c.architecture_name + " with " + std::to_string(c.num_layers) + " layers" +
                        (c.qkv_bias ? "" : " and no q/k/v bias"));
  return weights;
}

}  // namespace specrun
