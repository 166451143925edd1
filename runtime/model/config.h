// The model hyperparameters read from a Hugging Face config.json (Llama family).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/backend.h"

namespace specrun {

enum class Architecture {
  kLlama,    // LlamaForCausalLM: Llama 2, 3, 3.1, 3.2 and their derivatives
  kMistral,  // MistralForCausalLM: optional sliding-window attention
  kQwen2,    // Qwen2ForCausalLM: bias on q, k and v
  kQwen3,    // Qwen3ForCausalLM: q and k RMS-normalised per head before RoPE, no bias by default
  kGemma3,   // Gemma3ForCausalLM: Qwen3's q/k norms, norms around attention and MLP with gains
             // 1 + w, a GELU-tanh MLP, local (windowed) and global layers with their own RoPE
};

// The activation of the gated MLP: down(act(gate(x)) * up(x)).
enum class MlpActivation {
  kSilu,      // SwiGLU: Llama, Mistral, Qwen
  kGeluTanh,  // GeGLU with tanh's approximation of GELU: Gemma
};

enum class RopeScalingType {
  kNone,    // plain inverse frequencies
  kLinear,  // every frequency divided by factor
  kLlama3,  // Llama 3.1's band-wise scaling
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;    // which scaling
  double factor = 1.0;                              // linear and llama3: context extension factor
  double low_freq_factor = 1.0;                     // llama3: wavelengths beyond ctx/low are scaled
  double high_freq_factor = 4.0;                    // llama3: wavelengths below ctx/high are kept
  int64_t original_max_position_embeddings = 8192;  // llama3: the pre-extension context
};

// How a pre-quantized checkpoint stores its linear weights: config.json's quantization_config, for
// the FP8 layouts published for vLLM and TensorRT-LLM (8-bit codes in F8_E4M3, or I8, with f32 or
// bf16 scales beside them). weight[o, i] = code[o, i] * scale of (o, i).
struct WeightQuantization {
  enum class Scales {
    kTensor,   // one scale per tensor: weight_scale of shape [] or [1]
    kChannel,  // one per output row: weight_scale [out, 1] or [out]
    kBlock,    // one per block_rows x block_cols block: [ceil(out / rows), ceil(in / cols)]
  };
  std::string method;                // "fp8" or "compressed-tensors", as config.json names it
  Scales scales = Scales::kChannel;  // the layout of the scales (kChannel also accepts kTensor)
  int64_t block_rows = 0;            // kBlock: output rows sharing a scale
  int64_t block_cols = 0;            // kBlock: input columns sharing a scale
  std::string scale_suffix;          // the scale tensor's name after the module's: ".weight_scale"
                                     // or ".weight_scale_inv" (block-wise "fp8")
  std::vector<std::string> unquantized;  // modules left unquantized ("lm_head"), by name or suffix
};

// The largest model dimension config.json may give (vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim), as GGUF's loader bounds
// its own.
inline constexpr int64_t kMaxModelDimension = INT32_MAX;
// The most channels per head a model may have. Published Llama-family models use 64 to 256 (the
// CUDA attention kernel's own limit is 256); tables sized by it (RoPE's frequencies, attention's
// per-head rows) are made before any weight is read, so an absurd head_dim must be refused first.
inline constexpr int64_t kMaxHeadDim = 1024;

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;  // which family's rules apply
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  // The text model of a multimodal checkpoint (Gemma3ForConditionalGeneration): its keys are
  // config.json's text_config, its weights sit under the language model's prefix beside a vision
  // tower's, which specrun neither reads nor loads (TensorStore::keep_text_model).
  bool text_of_multimodal = false;
  int64_t vocab_size = 0;         // rows of the embedding and of the output projection
  int64_t hidden_size = 0;        // model width
  int64_t intermediate_size = 0;  // MLP width
  int64_t num_layers = 0;         // decoder layers
  int64_t num_heads = 0;          // query heads
  int64_t num_kv_heads = 0;       // key/value heads (grouped-query attention)
  int64_t head_dim = 0;           // channels per head
  double rms_norm_eps = 1e-6;     // RMSNorm epsilon
  double rope_theta = 10000.0;    // RoPE base
  RopeScaling rope_scaling;       // RoPE frequency scaling
  kernels::RopeStyle rope_style = kernels::RopeStyle::kRotateHalf;  // HF layout; not in config.json
  int64_t max_position_embeddings = 2048;  // the context the model was trained for
  bool tie_word_embeddings = false;        // the output projection is the embedding
  bool qkv_bias = false;                   // q, k, v projections carry a bias
  bool o_bias = false;                     // the attention output projection carries a bias
  bool mlp_bias = false;                   // gate, up and down projections carry a bias
  bool qk_norm = false;  // each head of q and k is RMS-normalised (a gain per channel) before RoPE
  // Gemma: every norm's gain is stored as its offset from one (the model multiplies by 1 + w).
  bool norm_gain_offset = false;
  // Gemma: the attention's and the MLP's outputs are normalised before their residual adds
  // (post_attention_layernorm, post_feedforward_layernorm); the MLP's input norm is then
  // pre_feedforward_layernorm.
  bool output_norms = false;
  MlpActivation mlp_activation = MlpActivation::kSilu;  // the gated MLP's activation
  float embedding_scale = 1.0f;  // the embedding's rows are multiplied by it (Gemma: sqrt(hidden))
  float query_scale = 0.0f;      // attention's score scale; 0: 1 / sqrt(head_dim)
  // Which layers attend through the window (sliding_window positions): Gemma's local layers.
  // Empty: every layer, when sliding_window > 0.
  std::vector<bool> sliding_layers;
  double local_rope_theta = 0.0;       // the windowed layers' RoPE base, unscaled; 0: rope_theta
  int64_t sliding_window = 0;          // attend to this many latest positions; 0: all
  std::vector<int32_t> bos_token_ids;  // beginning-of-sequence ids (may be empty)
  std::vector<int32_t> eos_token_ids;  // any of these ends generation (may be empty)
  // The token each row of the output projection scores, when it scores only part of the
  // vocabulary (a draft's reduced head: the tokens outside it are never proposed, which costs
  // acceptance only where the target would pick them). Strictly increasing ids below vocab_size;
  // empty: every token, in order. Needs an untied output projection of [size, hidden_size].
  std::vector<int32_t> output_token_ids;
  // A draft that reads its target's features (EAGLE, Li et al. 2024): position j's input is
  // token_proj(embedding(x_j)) + feature_proj(f_{j-1}), where f is the target's last hidden state
  // after its final norm (the first position reads zeros); the draft's own final-norm output
  // stands for the target's feature at j when it drafts on. The target's hidden_size, and so
  // the draft's own; 0: an ordinary model.
  int64_t feature_width = 0;
  // The token embedding's width: hidden_size, but a feature-reading draft's may differ (its
  // token_proj maps it to hidden_size). 0: hidden_size.
  int64_t embedding_width = 0;
  std::string chat_template;  // the Jinja chat template a GGUF file carries; empty when none
  std::optional<WeightQuantization> quantization;  // a pre-quantized checkpoint's layout

  int64_t embedding_columns() const { return embedding_width > 0 ? embedding_width : hidden_size; }
  // The window `layer` attends through; 0: every position.
  int64_t layer_window(int64_t layer) const {
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
  }
  // The widest window any layer attends through (0: some layer sees every position): what sizes
  // attention's workspace.
  int64_t widest_window() const {
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      if (layer_window(layer) == 0) return 0;
    }
    return sliding_window;
  }
  // Whether `layer` rotates with the local RoPE base (local_rope_theta).
  bool local_rope(int64_t layer) const {
    return local_rope_theta > 0.0 && !sliding_layers.empty() &&
           sliding_layers[static_cast<size_t>(layer)];
  }
  bool reads_features() const { return feature_width > 0; }
};

// Why `ids` cannot be a model's output_token_ids (empty, not strictly increasing, or outside
// [0, vocab_size)); nullopt when they can.
std::optional<std::string> output_token_ids_problem(std::span<const int32_t> ids,
                                                    int64_t vocab_size);

// Parses a config.json document; `source` names it in errors. Unknown keys are ignored; a missing
// or ill-typed key the model needs, or an unsupported architecture or option, is an Error naming
// the key.
ModelConfig parse_model_config(const nlohmann::json& document, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& path);

// The RoPE inverse frequencies, scaling applied: [head_dim / 2]. `local`: the windowed layers'
// (local_rope_theta, no scaling).
std::vector<float> rope_inverse_frequencies(const ModelConfig& config, bool local = false);

}  // namespace specrun
