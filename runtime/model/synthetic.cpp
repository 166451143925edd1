#include "runtime/model/synthetic.h"

#include "runtime/base/check.h"

namespace specrun {
namespace {

ModelConfig llama3(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads,
                   int64_t head_dim, bool tied) {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = 8;
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  c.max_position_embeddings = 131072;
  c.tie_word_embeddings = tied;
  c.bos_token_ids = {128000};
  c.eos_token_ids = {128001, 128008, 128009};
  return c;
}

WeightView view(DType dtype, std::vector<int64_t> shape) {
  uint64_t elements = 1;
  for (const int64_t dimension : shape) elements *= static_cast<uint64_t>(dimension);
  return WeightView{nullptr, dtype, std::move(shape), elements * dtype_size(dtype)};
}

}  // namespace

std::vector<std::string> synthetic_shapes() {
  return {"llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "tiny"};
}

ModelConfig synthetic_config(const std::string& shape) {
  if (shape == "llama-3.2-1b") return llama3(2048, 8192, 16, 32, 64, true);
  if (shape == "llama-3.1-8b") return llama3(4096, 14336, 32, 32, 128, false);
  if (shape == "llama-3.1-70b") return llama3(8192, 28672, 80, 64, 128, false);
  if (shape == "tiny") {  // Llama 3's structure at a size any machine measures in seconds
    ModelConfig c = llama3(256, 512, 2, 4, 64, true);
    c.vocab_size = 4096;
    c.num_kv_heads = 2;
    c.bos_token_ids = {1};
    c.eos_token_ids = {2};
    return c;
  }
  std::string known;
  for (const std::string& name : synthetic_shapes()) known += (known.empty() ? "" : ", ") + name;
  throw Error("synthetic shape '" + shape + "' is not one of " + known);
}

ModelWeights synthetic_layout(const ModelConfig& c, DType dtype) {
  SPECRUN_CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias) << "synthetic models carry no biases";
  const int64_t q_width = c.num_heads * c.head_dim;
  const int64_t kv_width = c.num_kv_heads * c.head_dim;
  ModelWeights weights;
  weights.embedding = view(dtype, {c.vocab_size, c.hidden_size});
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    LayerWeights l;
    l.attention_norm = view(dtype, {c.hidden_size});
    l.q_proj = view(dtype, {q_width, c.hidden_size});
    l.k_proj = view(dtype, {kv_width, c.hidden_size});
    l.v_proj = view(dtype, {kv_width, c.hidden_size});
    l.o_proj = view(dtype, {c.hidden_size, q_width});
    if (c.qk_norm) {
      l.q_norm = view(dtype, {c.head_dim});
      l.k_norm = view(dtype, {c.head_dim});
    }
    l.mlp_norm = view(dtype, {c.hidden_size});
    l.gate_proj = view(dtype, {c.intermediate_size, c.hidden_size});
    l.up_proj = view(dtype, {c.intermediate_size, c.hidden_size});
    l.down_proj = view(dtype, {c.hidden_size, c.intermediate_size});
    weights.layers.push_back(std::move(l));
  }
  weights.final_norm = view(dtype, {c.hidden_size});
  if (!c.tie_word_embeddings) weights.output = view(dtype, {c.vocab_size, c.hidden_size});
  return weights;
}

}  // namespace specrun
