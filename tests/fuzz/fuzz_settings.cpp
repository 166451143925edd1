// Fuzzes the TOML settings reader: the input is the text of a settings file, read as
// EngineConfig::from_toml reads one, then validated as Engine::create validates it, and read as
// ServerConfig::from_toml reads its [server] table.
#include "runtime/api/config.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specrun::fuzz::expect_clean_refusal([&] {
    specrun::EngineConfig config = specrun::engine_config_from_toml_text(
        specrun::fuzz::as_text(data, size), "/fuzz/settings.toml", "/fuzz");
    // The command line names the target when the file does not; past that, validation goes on.
    if (config.target.empty()) config.target = "/fuzz/model";
    specrun::validate(config);
  });
  specrun::fuzz::expect_clean_refusal([&] {
    specrun::server_config_from_toml_text(specrun::fuzz::as_text(data, size),
                                          "/fuzz/settings.toml");
  });
  return 0;
}
