#include "runtime/model/weights.h"

#include <set>
#include <string>

#include <spdlog/spdlog.h>

#include "runtime/base/check.h"
#include "runtime/model/gguf.h"

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
    return take(*info, shape, meaning);
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
    return checkpoint_.paths.format == CheckpointFormat::kGguf ? hf_to_gguf_tensor_name(name)
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

  const Checkpoint& checkpoint_;
  std::set<std::string> bound_;
};

}  // namespace

ModelWeights bind_weights(const Checkpoint& checkpoint) {
  const ModelConfig& c = checkpoint.config;
  Binder binder(checkpoint);
  const int64_t q_width = c.num_heads * c.head_dim;
  const int64_t kv_width = c.num_kv_heads * c.head_dim;

  ModelWeights weights;
  weights.embedding = binder.require("model.embed_tokens.weight", {c.vocab_size, c.hidden_size},
                                     "vocab_size, hidden_size");
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    const std::string attention = prefix + "self_attn.";
    const std::string mlp = prefix + "mlp.";
    LayerWeights l;
    l.attention_norm =
        binder.require(prefix + "input_layernorm.weight", {c.hidden_size}, "hidden_size");
    l.q_proj = binder.require(attention + "q_proj.weight", {q_width, c.hidden_size},
                              "num_attention_heads * head_dim, hidden_size");
    l.k_proj = binder.require(attention + "k_proj.weight", {kv_width, c.hidden_size},
                              "num_key_value_heads * head_dim, hidden_size");
    l.v_proj = binder.require(attention + "v_proj.weight", {kv_width, c.hidden_size},
                              "num_key_value_heads * head_dim, hidden_size");
    l.o_proj = binder.require(attention + "o_proj.weight", {c.hidden_size, q_width},
                              "hidden_size, num_attention_heads * head_dim");
    l.q_bias = binder.optional(c.qkv_bias, attention + "q_proj.bias", {q_width},
                               "num_attention_heads * head_dim");
    l.k_bias = binder.optional(c.qkv_bias, attention + "k_proj.bias", {kv_width},
                               "num_key_value_heads * head_dim");
    l.v_bias = binder.optional(c.qkv_bias, attention + "v_proj.bias", {kv_width},
                               "num_key_value_heads * head_dim");
    l.o_bias = binder.optional(c.o_bias, attention + "o_proj.bias", {c.hidden_size}, "hidden_size");
    l.mlp_norm =
        binder.require(prefix + "post_attention_layernorm.weight", {c.hidden_size}, "hidden_size");
    l.gate_proj = binder.require(mlp + "gate_proj.weight", {c.intermediate_size, c.hidden_size},
                                 "intermediate_size, hidden_size");
    l.up_proj = binder.require(mlp + "up_proj.weight", {c.intermediate_size, c.hidden_size},
                               "intermediate_size, hidden_size");
    l.down_proj = binder.require(mlp + "down_proj.weight", {c.hidden_size, c.intermediate_size},
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
    weights.output = binder.require("lm_head.weight", {c.vocab_size, c.hidden_size},
                                    "vocab_size, hidden_size; tie_word_embeddings is false");
  }
  binder.reject_unbound(c.architecture_name + " with " + std::to_string(c.num_layers) + " layers" +
                        (c.qkv_bias ? "" : " and no q/k/v bias"));
  return weights;
}

}  // namespace specrun
