// specrun: generate from a checkpoint. Generated token ids go to stdout as they are produced;
// logs and the closing stats go to stderr.
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/run_config.h"
#include "runtime/model/model.h"
#include "tools/cli_support.h"
#include "tools/text_commands.h"

namespace {

struct Options {
  std::string target;                     // checkpoint directory or file
  std::string config_path;                // TOML settings, overridden by flags
  std::optional<std::string> prompt_ids;  // "1,2,3"; given but empty is an error
  std::string rope_style = "auto";        // auto, rotate-half, interleaved
  std::string log_level = "warn";         // spdlog level
  bool ignore_eos = false;                // generate past EOS
  bool quiet = false;                     // no stats on stderr
  specrun::RunConfig flags;               // values of the settings given as flags
  // Copies the settings given on the command line over a config.
  std::function<void(specrun::RunConfig&)> apply_flags;
};

int run(const Options& options) {
  if (options.target.empty()) throw specrun::Error("--target is required");
  specrun::RunConfig config;
  if (!options.config_path.empty()) config = specrun::load_run_config(options.config_path);
  options.apply_flags(config);
  if (options.ignore_eos) config.generation.stop_at_eos = false;
  specrun::validate_run_config(config);
  // Every argument is checked before the (possibly large) model is loaded.
  std::vector<int32_t> prompt;
  if (options.prompt_ids) {
    prompt = specrun::tools::parse_token_ids(*options.prompt_ids, "--prompt-ids");
  }
  const std::optional<specrun::kernels::RopeStyle> rope_style =
      specrun::tools::parse_rope_style(options.rope_style);

  specrun::ModelOptions model_options;
  model_options.kv_cache_tokens = config.kv_cache_tokens;
  model_options.kv_block_size = config.kv_block_size;
  model_options.rope_style = rope_style;

  auto pool = std::make_shared<specrun::kernels::cpu::ThreadPool>(config.threads);
  specrun::kernels::cpu::CpuBackend backend(pool);
  const auto model = specrun::Model::load(options.target, backend, model_options);

  if (options.prompt_ids) {
    for (const int32_t id : prompt) {
      if (id >= model->config().vocab_size) {
        throw specrun::Error("--prompt-ids: token id " + std::to_string(id) +
                             " is outside the model's vocabulary [0, " +
                             std::to_string(model->config().vocab_size) + ")");
      }
    }
  } else if (!model->config().bos_token_ids.empty()) {
    prompt = {model->config().bos_token_ids.front()};
  } else {
    throw specrun::Error("the model declares no bos_token_id; give a prompt with --prompt-ids");
  }

  bool first = true;
  const specrun::GenerationResult result =
      specrun::generate(*model, prompt, config.generation, [&](int32_t token) {
        std::printf(first ? "%d" : " %d", token);
        std::fflush(stdout);
        first = false;
        return true;
      });
  std::printf("\n");
  std::fflush(stdout);

  if (!options.quiet) {
    const double decode_steps = static_cast<double>(result.tokens.size()) - 1.0;
    std::fprintf(
        stderr,
        "specrun: %lld prompt tokens, %zu generated (stop: %s) on %s with %d threads\n"
        "specrun: prefill %.1f ms (%.1f tokens/s), decode %.1f tokens/s\n",
        static_cast<long long>(result.prompt_tokens), result.tokens.size(),
        specrun::stop_reason_name(result.stop_reason), std::string(backend.name()).c_str(),
        pool->num_threads(), result.prefill_ms,
        result.prefill_ms > 0 ? 1e3 * static_cast<double>(result.prompt_tokens) / result.prefill_ms
                              : 0.0,
        decode_steps > 0 && result.decode_ms > 0 ? 1e3 * decode_steps / result.decode_ms : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  specrun::RunConfig& f = options.flags;
  CLI::App app{"specrun: generate from a Llama-family checkpoint (speculative decoding runtime)"};
  app.add_option("--target", options.target,
                 "Target checkpoint: a directory with config.json and *.safetensors, or a "
                 ".safetensors / .safetensors.index.json file with config.json beside it "
                 "(required unless a subcommand runs)");
  app.add_option("--config", options.config_path,
                 "TOML settings file (see configs/default.toml); flags override it");
  app.add_option("--prompt-ids", options.prompt_ids,
                 "Prompt as comma-separated token ids, e.g. 1,450,4996 (default: the BOS token)");
  CLI::Option* max_tokens =
      app.add_option("--max-tokens", f.generation.max_tokens, "Most new tokens to generate");
  CLI::Option* temperature = app.add_option("--temperature", f.generation.sampling.temperature,
                                            "Sampling temperature; 0 is greedy");
  CLI::Option* top_k = app.add_option("--top-k", f.generation.sampling.top_k,
                                      "Keep the k most probable tokens; 0 disables");
  CLI::Option* top_p = app.add_option(
      "--top-p", f.generation.sampling.top_p,
      "Keep the fewest most probable tokens whose probability reaches p; 1 disables");
  CLI::Option* min_p =
      app.add_option("--min-p", f.generation.sampling.min_p,
                     "Drop tokens less probable than min-p times the most probable; 0 disables");
  CLI::Option* seed = app.add_option("--seed", f.generation.sampling.seed, "Seed of the sampler");
  CLI::Option* threads = app.add_option("--threads", f.threads, "CPU threads; 0 uses every core");
  CLI::Option* kv_tokens =
      app.add_option("--kv-cache-tokens", f.kv_cache_tokens,
                     "KV cache capacity in tokens; 0 uses the model's context, at most 8192");
  CLI::Option* device = app.add_option("--device", f.device, "Where the model runs: cpu");
  for (CLI::Option* option :
       {max_tokens, temperature, top_k, top_p, min_p, seed, threads, kv_tokens, device}) {
    option->capture_default_str();
  }
  app.add_flag("--ignore-eos", options.ignore_eos, "Keep generating past end-of-sequence tokens");
  app.add_option("--rope-style", options.rope_style,
                 "RoPE channel pairing: auto (rotate-half, as Hugging Face checkpoints), "
                 "rotate-half or interleaved (Meta/GGUF weight layout)")
      ->capture_default_str();
  app.add_option("--log-level", options.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_flag("--quiet", options.quiet, "Print no stats on stderr");
  app.require_subcommand(0, 1);
  const specrun::tools::TextCommands text_commands(app);
  CLI11_PARSE(app, argc, argv);
  if (text_commands.ran()) return text_commands.run();

  // Settings given as flags win over the config file.
  auto given = [](const CLI::Option* option) { return option->count() > 0; };
  options.apply_flags = [&](specrun::RunConfig& config) {
    if (given(max_tokens)) config.generation.max_tokens = f.generation.max_tokens;
    if (given(temperature))
      config.generation.sampling.temperature = f.generation.sampling.temperature;
    if (given(top_k)) config.generation.sampling.top_k = f.generation.sampling.top_k;
    if (given(top_p)) config.generation.sampling.top_p = f.generation.sampling.top_p;
    if (given(min_p)) config.generation.sampling.min_p = f.generation.sampling.min_p;
    if (given(seed)) config.generation.sampling.seed = f.generation.sampling.seed;
    if (given(threads)) config.threads = f.threads;
    if (given(kv_tokens)) config.kv_cache_tokens = f.kv_cache_tokens;
    if (given(device)) config.device = f.device;
  };
  return specrun::tools::run_reporting_errors("specrun", options.log_level,
                                              [&] { return run(options); });
}
