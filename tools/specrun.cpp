// specrun: generate from a checkpoint. Generated token ids go to stdout as they are produced;
// logs and the closing stats go to stderr.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/engine/generate.h"
#include "runtime/model/model.h"
#include "tools/cli_support.h"

namespace {

struct Options {
  std::string target;      // checkpoint directory or file
  std::string prompt_ids;  // "1,2,3"
  specrun::GenerationOptions generation;
  int threads = 0;                  // 0: one per core
  int64_t kv_cache_tokens = 0;      // 0: the model's context, at most 8192
  std::string rope_style = "auto";  // auto, rotate-half, interleaved
  std::string log_level = "warn";   // spdlog level
  bool quiet = false;               // no stats on stderr
};

int run(const Options& options) {
  specrun::ModelOptions model_options;
  model_options.kv_cache_tokens = options.kv_cache_tokens;
  model_options.rope_style = specrun::tools::parse_rope_style(options.rope_style);

  auto pool = std::make_shared<specrun::kernels::cpu::ThreadPool>(options.threads);
  specrun::kernels::cpu::CpuBackend backend(pool);
  const auto model = specrun::Model::load(options.target, backend, model_options);

  std::vector<int32_t> prompt;
  if (!options.prompt_ids.empty()) {
    prompt = specrun::tools::parse_token_ids(options.prompt_ids, "--prompt-ids");
  } else if (!model->config().bos_token_ids.empty()) {
    prompt = {model->config().bos_token_ids.front()};
  } else {
    throw specrun::Error("the model declares no bos_token_id; give a prompt with --prompt-ids");
  }

  bool first = true;
  const specrun::GenerationResult result =
      specrun::generate(*model, prompt, options.generation, [&](int32_t token) {
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
        "specrun: %zu prompt tokens, %zu generated (stop: %s) on %s with %d threads\n"
        "specrun: prefill %.1f ms (%.1f tokens/s), decode %.1f tokens/s\n",
        static_cast<size_t>(result.prompt_tokens), result.tokens.size(),
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
  CLI::App app{
      "specrun: generate text from a Llama-family checkpoint (speculative decoding runtime)"};
  app.add_option("--target", options.target,
                 "Target checkpoint: a directory with config.json and *.safetensors, or a "
                 ".safetensors / .safetensors.index.json file with config.json beside it")
      ->required();
  app.add_option("--prompt-ids", options.prompt_ids,
                 "Prompt as comma-separated token ids, e.g. 1,450,4996 (default: the BOS token)");
  app.add_option("--max-tokens", options.generation.max_tokens, "Most new tokens to generate")
      ->capture_default_str();
  app.add_option("--temperature", options.generation.sampling.temperature,
                 "Sampling temperature; 0 is greedy")
      ->capture_default_str();
  app.add_option("--top-k", options.generation.sampling.top_k,
                 "Keep the k most probable tokens; 0 disables")
      ->capture_default_str();
  app.add_option("--top-p", options.generation.sampling.top_p,
                 "Keep the fewest most probable tokens whose probability reaches p; 1 disables")
      ->capture_default_str();
  app.add_option("--min-p", options.generation.sampling.min_p,
                 "Drop tokens less probable than min-p times the most probable; 0 disables")
      ->capture_default_str();
  app.add_option("--seed", options.generation.sampling.seed, "Seed of the sampler")
      ->capture_default_str();
  app.add_flag(
      "--ignore-eos", [&](int64_t) { options.generation.stop_at_eos = false; },
      "Keep generating past end-of-sequence tokens");
  app.add_option("--threads", options.threads, "CPU threads; 0 uses every core")
      ->capture_default_str();
  app.add_option("--kv-cache-tokens", options.kv_cache_tokens,
                 "KV cache capacity in tokens; 0 uses the model's context, at most 8192")
      ->capture_default_str();
  app.add_option("--rope-style", options.rope_style,
                 "RoPE channel pairing: auto (rotate-half, as Hugging Face checkpoints), "
                 "rotate-half or interleaved (Meta/GGUF weight layout)")
      ->capture_default_str();
  app.add_option("--log-level", options.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.add_flag("--quiet", options.quiet, "Print no stats on stderr");
  CLI11_PARSE(app, argc, argv);
  return specrun::tools::run_reporting_errors("specrun", options.log_level,
                                              [&] { return run(options); });
}
