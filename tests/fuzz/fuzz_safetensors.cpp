// Fuzzes the safetensors reader: the input is a whole .safetensors file (8-byte header length,
// JSON header, data section). Every tensor it accepts must lie inside the file, so the harness
// reads each accepted tensor's bytes (ASan and the mapping's bounds catch a range that does not).
#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = specrun::fuzz::write_scratch_file("model.safetensors", {data, size});
  specrun::fuzz::expect_clean_refusal([&] {
    const specrun::TensorStore store = specrun::TensorStore::open_file(path);
    uint64_t checksum = 0;
    for (const specrun::TensorInfo* tensor : store.all()) {
      const auto* bytes = static_cast<const uint8_t*>(tensor->data);
      for (uint64_t i = 0; i < tensor->size_bytes(); ++i) checksum += bytes[i];
    }
    // Keeps the reads from being optimised away.
    if (checksum == 0xdeadbeefcafe) std::abort();
  });
  return 0;
}
