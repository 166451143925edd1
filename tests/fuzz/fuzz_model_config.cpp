// Fuzzes config.json: the input is the document's text, read as the checkpoint loader reads it
// (bounded JSON parsing, then the model config with every size checked).
#include "runtime/base/json.h"
#include "runtime/model/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specrun::fuzz::expect_clean_refusal([&] {
    const nlohmann::json document =
        specrun::parse_json(specrun::fuzz::as_text(data, size), "config.json");
    const specrun::ModelConfig config = specrun::parse_model_config(document, "config.json");
    (void)specrun::rope_inverse_frequencies(config);
  });
  return 0;
}
