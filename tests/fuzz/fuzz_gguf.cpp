// Fuzzes the GGUF reader: the input is a whole .gguf file. Accepted files go on through what a
// checkpoint load does with them: the model config and the tokenizer document from the metadata,
// and every tensor's bytes (quantized ones dequantised, as TensorStore does at load).
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "runtime/model/gguf.h"
#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = specrun::fuzz::write_scratch_file("model.gguf", {data, size});
  specrun::fuzz::expect_clean_refusal([&] {
    const specrun::GgufFile file(path);
    specrun::fuzz::expect_clean_refusal([&] { (void)specrun::gguf_model_config(file); });
    specrun::fuzz::expect_clean_refusal([&] { (void)specrun::gguf_tokenizer_json(file); });
    const specrun::TensorStore store = specrun::TensorStore::open_gguf(path);
    uint64_t checksum = 0;
    for (const specrun::TensorInfo* tensor : store.all()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor->data);
      for (uint64_t i = 0; i < tensor->size_bytes(); ++i) checksum += bytes[i];
    }
    if (checksum == 0xdeadbeefcafe) std::abort();
  });
  return 0;
}
