// specrun-genmodel: writes a deterministic random Llama-family checkpoint (config.json and
// safetensors) for tests, demos and benchmarks.
#include <string>

#include <CLI/CLI.hpp>

#include "runtime/base/check.h"
#include "tools/cli_support.h"
#include "tools/fixtures/checkpoint_generator.h"

int main(int argc, char** argv) {
  specrun::fixtures::GeneratorOptions o;
  std::string out;
  std::string dtype = "bf16";
  CLI::App app{"specrun-genmodel: write a deterministic random Llama-family checkpoint"};
  app.add_option("--out", out, "Directory to write config.json and the safetensors into")
      ->required();
  app.add_option("--architecture", o.architecture,
                 "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or "
                 "Gemma3ForCausalLM")
      ->capture_default_str();
  app.add_option("--vocab", o.vocab_size, "Vocabulary size")->capture_default_str();
  app.add_option("--hidden", o.hidden_size, "Model width")->capture_default_str();
  app.add_option("--intermediate", o.intermediate_size, "MLP width")->capture_default_str();
  app.add_option("--layers", o.num_layers, "Decoder layers")->capture_default_str();
  app.add_option("--heads", o.num_heads, "Query heads")->capture_default_str();
  app.add_option("--kv-heads", o.num_kv_heads, "Key/value heads")->capture_default_str();
  app.add_option("--head-dim", o.head_dim, "Channels per head; 0 derives hidden / heads")
      ->capture_default_str();
  app.add_flag("--tied", o.tie_word_embeddings, "Tie the output projection to the embedding");
  app.add_flag("--bias", o.attention_bias, "Llama, Qwen3: bias on q, k, v and o");
  app.add_option("--dtype", dtype, "f32, f16 or bf16")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed; the same seed writes the same bytes")
      ->capture_default_str();
  app.add_option("--rope-theta", o.rope_theta, "RoPE base")->capture_default_str();
  app.add_flag("--llama3-rope", o.llama3_rope_scaling, "Write a Llama 3.1 rope_scaling block");
  app.add_option("--max-position", o.max_position_embeddings, "Trained context length")
      ->capture_default_str();
  app.add_option("--sliding-window", o.sliding_window,
                 "Mistral sliding window, 0 for none; Gemma 3 local layers' window, 0 for 4")
      ->capture_default_str();
  app.add_option("--bos", o.bos_token_id, "BOS token id")->capture_default_str();
  app.add_option("--eos", o.eos_token_id, "EOS token id")->capture_default_str();
  app.add_option("--shards", o.shards, "Split the weights over this many files with an index")
      ->capture_default_str();
  app.add_option("--shallow-layers", o.shallow_layers,
                 "Layers from this index on get output projections scaled by --deep-scale "
                 "(0: none), so that the first layers alone make a layer-skip draft")
      ->capture_default_str();
  app.add_option("--deep-scale", o.deep_layer_scale, "See --shallow-layers")->capture_default_str();
  std::string truncate_source;
  app.add_option("--truncate", truncate_source,
                 "Instead of generating: write the first --layers layers of this checkpoint to "
                 "--out (a layer-skip draft)");
  CLI11_PARSE(app, argc, argv);
  return specrun::tools::run_reporting_errors("specrun-genmodel", "warn", [&] {
    if (dtype == "f32") {
      o.dtype = specrun::DType::kF32;
    } else if (dtype == "f16") {
      o.dtype = specrun::DType::kF16;
    } else if (dtype == "bf16") {
      o.dtype = specrun::DType::kBF16;
    } else {
      throw specrun::Error("--dtype: '" + dtype + "' is not one of f32, f16, bf16");
    }
    if (!truncate_source.empty()) {
      specrun::fixtures::write_truncated_checkpoint(truncate_source, o.num_layers, out);
    } else {
      specrun::fixtures::write_random_checkpoint(o, out);
    }
    return 0;
  });
}
