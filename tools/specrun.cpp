// specrun: generate from a checkpoint, speculatively when a draft is given. Generated text (or
// token ids, for a checkpoint without tokenizer.json) goes to stdout as it is produced; logs and
// the closing stats go to stderr.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/engine/pairing.h"
#include "runtime/engine/run_config.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "tools/cli_support.h"
#include "tools/generation_report.h"
#include "tools/text_commands.h"

namespace {

struct Options {
  std::string target;                     // checkpoint directory or file
  std::string draft;                      // draft checkpoint; empty for none
  std::string config_path;                // TOML settings, overridden by flags
  std::optional<std::string> prompt;      // --prompt TEXT
  std::optional<std::string> prompt_ids;  // "1,2,3"; given but empty is an error
  std::optional<int64_t> gamma;           // --gamma N: the first (and with fixed, every) gamma
  bool no_draft = false;                  // plain decoding even with a draft
  std::string stats_json;                 // --stats-json FILE
  std::string rope_style = "auto";        // auto, rotate-half, interleaved
  std::string log_level = "warn";         // spdlog level
  bool ignore_eos = false;                // generate past EOS
  bool quiet = false;                     // no stats on stderr
  specrun::RunConfig flags;               // values of the settings given as flags
  // Copies the settings given on the command line over a config.
  std::function<void(specrun::RunConfig&)> apply_flags;
};

// The settings of this run: defaults, then the config file, then the flags.
specrun::RunConfig resolve_config(const Options& options) {
  specrun::RunConfig config;
  if (!options.config_path.empty()) config = specrun::load_run_config(options.config_path);
  options.apply_flags(config);
  if (options.ignore_eos) config.generation.stop_at_eos = false;
  specrun::SpeculativeOptions& speculative = config.speculative;
  if (options.gamma) {
    // --gamma moves the range with it when it falls outside.
    speculative.gamma.initial = *options.gamma;
    speculative.gamma.max = std::max(speculative.gamma.max, *options.gamma);
    speculative.gamma.min = std::min(speculative.gamma.min, *options.gamma);
  }
  if (options.no_draft) speculative.method = specrun::SpeculativeMethod::kNone;
  if (speculative.method == specrun::SpeculativeMethod::kDraftModel && options.draft.empty()) {
    spdlog::info("no --draft: plain decoding");
    speculative.method = specrun::SpeculativeMethod::kNone;
  }
  specrun::validate_run_config(config);
  return config;
}

std::string read_stdin() {
  std::string text;
  char buffer[4096];
  size_t count;
  while ((count = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) text.append(buffer, count);
  return text;
}

int run(const Options& options) {
  if (options.target.empty()) throw specrun::Error("--target is required");
  const specrun::RunConfig config = resolve_config(options);
  // Every argument is checked before the (possibly large) models are loaded.
  if (options.prompt && options.prompt_ids) {
    throw specrun::Error("--prompt and --prompt-ids exclude each other");
  }
  std::vector<int32_t> prompt;
  if (options.prompt_ids) {
    prompt = specrun::tools::parse_token_ids(*options.prompt_ids, "--prompt-ids");
  }
  if (!options.stats_json.empty() && !std::ofstream(options.stats_json, std::ios::app)) {
    throw specrun::Error("--stats-json: cannot write " + options.stats_json);
  }
  specrun::ModelOptions model_options;
  model_options.kv_cache_tokens = config.kv_cache_tokens;
  model_options.kv_block_size = config.kv_block_size;
  model_options.rope_style = specrun::tools::parse_rope_style(options.rope_style);

  auto pool = std::make_shared<specrun::kernels::cpu::ThreadPool>(config.threads);
  specrun::kernels::cpu::CpuBackend backend(pool);
  const auto target = specrun::Model::load(options.target, backend, model_options);
  std::unique_ptr<specrun::Model> draft;
  if (config.speculative.method == specrun::SpeculativeMethod::kDraftModel) {
    draft = specrun::Model::load(options.draft, backend, model_options);
    specrun::check_pairing(*target, *draft);
  }
  std::unique_ptr<specrun::text::Tokenizer> tokenizer;
  if (target->paths().tokenizer) {
    tokenizer = specrun::text::Tokenizer::load(*target->paths().tokenizer);
  }

  // The prompt: ids as given, or text from --prompt or stdin through the tokenizer (with its
  // BOS); with neither, the BOS token alone.
  if (!options.prompt_ids) {
    std::optional<std::string> text = options.prompt;
    if (!text && !::isatty(STDIN_FILENO)) text = read_stdin();
    if (text && !text->empty()) {
      if (!tokenizer) {
        throw specrun::Error(target->paths().directory.string() +
                             " has no tokenizer.json: give the prompt as --prompt-ids");
      }
      prompt = tokenizer->encode(*text, /*add_special_tokens=*/true);
    }
    if (prompt.empty()) {
      if (target->config().bos_token_ids.empty()) {
        throw specrun::Error("no prompt was given and the model declares no bos_token_id");
      }
      prompt = {target->config().bos_token_ids.front()};
    }
  }
  for (const int32_t id : prompt) {
    if (id < 0 || id >= target->config().vocab_size) {
      throw specrun::Error("prompt token id " + std::to_string(id) +
                           " is outside the model's vocabulary [0, " +
                           std::to_string(target->config().vocab_size) + ")");
    }
  }

  // Stream text as soon as it forms whole characters; ids when there is no tokenizer.
  std::optional<specrun::text::StreamingDecoder> stream;
  if (tokenizer) stream.emplace(*tokenizer, /*skip_special_tokens=*/true);
  bool first = true;
  const auto emit = [&](int32_t token) {
    if (stream) {
      const std::string piece = stream->step(token);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::printf(first ? "%d" : " %d", token);
    }
    std::fflush(stdout);
    first = false;
    return true;
  };
  specrun::SpeculativeGenerator generator(*target, draft.get(), config.generation,
                                          config.speculative);
  specrun::SpeculativeStats stats;
  const specrun::GenerationResult result = generator.generate(prompt, emit, &stats);
  if (stream) {
    const std::string rest = stream->flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);

  const specrun::tools::RunDescription run{
      std::string(backend.name()),   pool->num_threads(),  config.speculative.method,
      config.speculative.controller, result.prompt_tokens, result.stop_reason};
  if (!options.quiet) specrun::tools::print_stats(stderr, stats, run);
  if (!options.stats_json.empty()) specrun::tools::write_stats_json(options.stats_json, stats, run);
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
  app.add_option("--draft", options.draft,
                 "Draft checkpoint for speculative decoding (same forms as --target); it must "
                 "share the target's tokenizer");
  app.add_option("--config", options.config_path,
                 "TOML settings file (see configs/default.toml); flags override it");
  app.add_option("--prompt", options.prompt,
                 "Prompt text, encoded with the target's tokenizer.json (default: stdin when it "
                 "is not a terminal, else the BOS token alone)");
  app.add_option("--prompt-ids", options.prompt_ids,
                 "Prompt as comma-separated token ids, e.g. 1,450,4996 (for debugging)");
  app.add_option("--gamma", options.gamma,
                 "Drafts per step to start with (every step with --controller fixed)");
  app.add_flag("--no-draft", options.no_draft,
               "Run the target alone (plain decoding), for comparison");
  CLI::Option* method = app.add_option(
      "--method", f.speculative.method,
      "Who proposes: draft (the --draft model), prompt_lookup (n-grams of the text so far), "
      "none");
  method->transform(CLI::CheckedTransformer(
      std::map<std::string, specrun::SpeculativeMethod>{
          {"draft", specrun::SpeculativeMethod::kDraftModel},
          {"prompt_lookup", specrun::SpeculativeMethod::kPromptLookup},
          {"none", specrun::SpeculativeMethod::kNone}},
      CLI::ignore_case));
  CLI::Option* controller =
      app.add_option("--controller", f.speculative.controller,
                     "How gamma adapts: goodput (measured tokens per second), heuristic, fixed");
  controller->transform(CLI::CheckedTransformer(
      std::map<std::string, specrun::ControllerKind>{
          {"goodput", specrun::ControllerKind::kGoodput},
          {"heuristic", specrun::ControllerKind::kHeuristic},
          {"fixed", specrun::ControllerKind::kFixed}},
      CLI::ignore_case));
  app.add_option("--stats-json", options.stats_json,
                 "Also write the run's stats as JSON to this file");
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
    if (given(method)) config.speculative.method = f.speculative.method;
    if (given(controller)) config.speculative.controller = f.speculative.controller;
  };
  return specrun::tools::run_reporting_errors("specrun", options.log_level,
                                              [&] { return run(options); });
}
