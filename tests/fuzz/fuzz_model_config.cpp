// Fuzzes config.json: the input is the document's text, read as the checkpoint loader reads it
// (bounded JSON parsing, then the model config with every size checked), and the
// quantization_config's module lists matched as the weight binder matches them ("re:" patterns).
#include "runtime/base/json.h"
#include "runtime/model/config.h"
#include "runtime/model/module_list.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specrun::fuzz::expect_clean_refusal([&] {
    const nlohmann::json document =
        specrun::parse_json(specrun::fuzz::as_text(data, size), "config.json");
    const specrun::ModelConfig config = specrun::parse_model_config(document, "config.json");
    (void)specrun::rope_inverse_frequencies(config);
    // The quantization_config's module lists, "re:" patterns included, as the weight binder
    // matches them against a model's modules.
    if (config.quantization) {
      specrun::ModuleList unquantized(config.quantization->unquantized, "config.json");
      for (const char* module : {"lm_head", "model.embed_tokens", "model.layers.0.self_attn.q_proj",
                                 "model.layers.31.mlp.down_proj", ""}) {
        (void)unquantized.contains(module);
      }
    }
  });
  return 0;
}
