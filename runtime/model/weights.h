// The weights of a Llama-family model, bound by name from a checkpoint and checked against its
// config.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/weight_layout.h"
#include "runtime/model/checkpoint.h"

namespace specrun {

// A view of one tensor: host bytes in the checkpoint's mapping until the model places it on its
// backend.
struct WeightView {
  const void* data = nullptr;  // null when absent (an optional bias)
  DType dtype = DType::kF32;   // stored dtype
  std::vector<int64_t> shape;  // dimensions
  uint64_t size_bytes = 0;     // bytes of data
  // A quantized weight's scales (kernels::MatmulParams has the layout): as the checkpoint stores
  // them until the model places them, then f32 on its backend.
  const void* scales = nullptr;
  DType scale_dtype = DType::kF32;  // F32, BF16 or F16 as stored
  int64_t scale_block_rows = 0;     // output rows sharing a scale
  int64_t scale_block_cols = 0;     // input columns sharing a scale
  int64_t scale_count = 0;          // scales in the grid
  // How the elements lie once placed: the backend's matmul layout for linear weights, the head
  // and a table a tied head shares; row-major until then (and for everything else).
  kernels::WeightLayout layout = kernels::WeightLayout::kRows;

  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  WeightView attention_norm;         // [hidden]
  WeightView q_proj;                 // [heads * head_dim, hidden]
  WeightView k_proj;                 // [kv_heads * head_dim, hidden]
  WeightView v_proj;                 // [kv_heads * head_dim, hidden]
  WeightView o_proj;                 // [hidden, heads * head_dim]
  WeightView q_bias;                 // [heads * head_dim] when qkv_bias
  WeightView k_bias;                 // [kv_heads * head_dim] when qkv_bias
  WeightView v_bias;                 // [kv_heads * head_dim] when qkv_bias
  WeightView o_bias;                 // [hidden] when o_bias
  WeightView q_norm;                 // [head_dim] when qk_norm: every query head's gain
  WeightView k_norm;                 // [head_dim] when qk_norm: every key head's gain
  WeightView attention_output_norm;  // [hidden] when output_norms: on o_proj's output
  WeightView mlp_output_norm;        // [hidden] when output_norms: on down_proj's output
  WeightView mlp_norm;               // [hidden]: the MLP's input norm
  WeightView gate_proj;              // [intermediate, hidden]
  WeightView up_proj;                // [intermediate, hidden]
  WeightView down_proj;              // [hidden, intermediate]
  WeightView gate_bias;              // [intermediate] when mlp_bias
  WeightView up_bias;                // [intermediate] when mlp_bias
  WeightView down_bias;              // [hidden] when mlp_bias

  // Every tensor of the layer, those the config leaves out empty: what walks all of them (byte
  // counts, uploads) walks this, so that a new tensor is one line here.
  static constexpr size_t kTensors = 20;
  std::array<WeightView*, kTensors> views() { return views_of<WeightView>(*this); }
  std::array<const WeightView*, kTensors> views() const {
    return views_of<const WeightView>(*this);
  }

 private:
  template <typename View, typename Layer>
  static std::array<View*, kTensors> views_of(Layer& l) {
    return {&l.attention_norm, &l.q_proj,    &l.k_proj,    &l.v_proj,
            &l.o_proj,         &l.q_bias,    &l.k_bias,    &l.v_bias,
            &l.o_bias,         &l.q_norm,    &l.k_norm,    &l.attention_output_norm,
            &l.mlp_norm,       &l.gate_proj, &l.up_proj,   &l.down_proj,
            &l.gate_bias,      &l.up_bias,   &l.down_bias, &l.mlp_output_norm};
  }
};

struct ModelWeights {
  WeightView embedding;  // [vocab, embedding_columns()]
  // A feature-reading draft's input projections (ModelConfig::feature_width); absent otherwise.
  WeightView token_projection;    // [hidden, embedding_columns()]
  WeightView feature_projection;  // [hidden, feature_width]
  std::vector<LayerWeights> layers;
  WeightView final_norm;  // [hidden]
  WeightView output;      // [vocab, hidden]; the embedding when tied
};

// Binds every tensor the config requires, with its shape checked, and rejects any tensor the
// architecture does not use. Errors name the weights file and the tensor.
ModelWeights bind_weights(const Checkpoint& checkpoint);

}  // namespace specrun
