// specrun: generate from a checkpoint, speculatively when a draft is given, as the first user of
// the public API (specrun/specrun.hpp): one engine, one request, its stream printed as it comes.
// Generated text (or token ids, for a checkpoint without tokenizer.json) goes to stdout as it is
// produced; logs and the closing stats go to stderr.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "runtime/server/server.h"
#include "specrun/chat.hpp"
#include "specrun/specrun.hpp"
#include "tools/bundled_pair.h"
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
  bool no_draft = false;                  // plain decoding even with a draft
  bool compare = false;                   // rerun on the target alone and report the speedup
  int compare_rounds = 3;                 // speculative / target-alone pairs --compare times
  bool chat = false;                      // the prompt is a user message of the chat template
  std::string chat_template;              // a Jinja template file in place of the target's
  std::string stats_json;                 // --stats-json FILE
  std::string rope_style = "auto";        // auto, rotate-half, interleaved
  std::string log_level = "warn";         // spdlog level (debug: the memory plan before loading)
  bool ignore_eos = false;                // generate past EOS
  bool quiet = false;                     // no stats on stderr
  specrun::EngineConfig flags;            // values of the settings given as flags
  // Copies the settings given on the command line over a config.
  std::function<void(specrun::EngineConfig&)> apply_flags;
};

// The flags of one settings table (specrun/settings.hpp): --key, dashes for underscores,
// each read as text and checked by its row, so that the command line takes what a TOML file and
// the server take, in the same words. --gamma moves the range [--gamma-min, --gamma-max] to take
// it, as the server's speculative.gamma does.
template <typename Settings>
class SettingFlags {
 public:
  explicit SettingFlags(std::span<const specrun::Setting<Settings>> rows)
      : rows_(rows), texts_(rows.size()) {}

  void add(CLI::App& app, const Settings& defaults) {
    for (size_t i = 0; i < rows_.size(); ++i) {
      const specrun::Setting<Settings>& row = rows_[i];
      CLI::Option* option = app.add_option(flag(row), texts_[i], row.help);
      option->default_str(specrun::setting_text(row.get(defaults)));
      switch (row.range.kind) {
        case specrun::SettingKind::kInteger:
          option->type_name("INT");
          break;
        case specrun::SettingKind::kNumber:
          option->type_name("FLOAT");
          break;
        case specrun::SettingKind::kChoice: {
          std::string names;
          for (const std::string& name : row.range.choices)
            names += (names.empty() ? "" : "|") + name;
          option->type_name(names);
          break;
        }
      }
      options_.push_back(option);
    }
  }

  // The given flags' values over `settings`; throws Error naming the flag of a bad value.
  void apply(Settings& settings) const {
    std::optional<int64_t> gamma;  // set last: it may move the range its neighbours set
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (options_[i]->count() == 0) continue;
      const specrun::Setting<Settings>& row = rows_[i];
      const std::optional<specrun::SettingValue> value =
          specrun::parse_setting_text(row.range.kind, texts_[i]);
      if (!value) {
        throw specrun::Error(flag(row) + " must be " + specrun::describe_range(row.range) +
                             ", got '" + texts_[i] + "'");
      }
      if (const std::optional<std::string> problem = specrun::setting_problem(row.range, *value)) {
        throw specrun::Error(flag(row) + " " + *problem);
      }
      if (std::string_view(row.key) == "gamma") {
        gamma = std::get<int64_t>(*value);
      } else {
        row.set(settings, *value);
      }
    }
    if constexpr (std::is_same_v<Settings, specrun::SpeculationSettings>) {
      if (gamma) specrun::set_gamma_moving_range(settings, *gamma);
    }
  }

 private:
  static std::string flag(const specrun::Setting<Settings>& row) {
    std::string name = std::string("--") + row.key;
    std::replace(name.begin(), name.end(), '_', '-');
    return name;
  }

  std::span<const specrun::Setting<Settings>> rows_;
  std::vector<std::string> texts_;     // [rows] what each flag was given
  std::vector<CLI::Option*> options_;  // [rows]
};

// Without a target (flag or [model] target): the bundled pair (models/pycode-*), announced in
// one line on stderr.
void with_bundled_pair(specrun::EngineConfig& config) {
  if (!config.target.empty()) return;
  if (!config.draft.empty()) throw specrun::Error("--draft needs --target");
  const std::optional<specrun::tools::BundledPair> pair = specrun::tools::find_bundled_pair();
  if (!pair) {
    std::string searched;
    for (const auto& folder : specrun::tools::bundled_model_folders()) {
      searched += (searched.empty() ? "" : ", ") + folder.string();
    }
    throw specrun::Error(
        "no --target given and the bundled pair (pycode-target, pycode-draft) "
        "is not in " +
        searched);
  }
  config.target = pair->target.string();
  config.draft = pair->draft.string();
  std::fprintf(stderr,
               "specrun: no --target; using the bundled pair trained on Python's standard "
               "library: target %s, draft %s\n",
               config.target.c_str(), config.draft.c_str());
}

// The settings of this run: defaults, then the config file, then the flags; the models from the
// flags, then the file's [model] table, then the bundled pair. A server keeps its batch size and
// its draft (a request may ask for the draft when the default method is another).
specrun::EngineConfig resolve_config(const Options& options, bool serving = false) {
  specrun::EngineConfig config;
  if (!options.config_path.empty()) config = specrun::EngineConfig::from_toml(options.config_path);
  options.apply_flags(config);
  if (!options.target.empty()) config.target = options.target;
  if (!options.draft.empty()) config.draft = options.draft;
  with_bundled_pair(config);
  if (options.ignore_eos) config.sampling.stop_at_eos = false;
  specrun::SpeculationSettings& speculation = config.speculation;
  if (options.no_draft) speculation.method = specrun::SpeculationMethod::kNone;
  if (speculation.method == specrun::SpeculationMethod::kDraftModel && config.draft.empty()) {
    spdlog::info("no --draft: plain decoding");
    speculation.method = specrun::SpeculationMethod::kNone;
  }
  config.rope_style = options.rope_style;
  if (serving) return config;
  // The draft is loaded (and checked against the target) only when it proposes.
  if (speculation.method != specrun::SpeculationMethod::kDraftModel) config.draft.clear();
  config.max_batch = 1;  // one request at a time
  return config;
}

// `specrun serve`: the engine's settings as for a run, the server's from the [server] table of
// --config and its own flags.
int serve(const Options& options, specrun::ServerConfig server,
          const std::function<void(specrun::ServerConfig&)>& apply_server_flags) {
  specrun::EngineConfig engine_config = resolve_config(options, /*serving=*/true);
  // A server decodes many requests at once: unless told otherwise, a KV cache for 16,384 tokens
  // rather than one context's worth.
  if (engine_config.kv_cache_tokens == 0) engine_config.kv_cache_tokens = 16384;
  if (!options.config_path.empty()) server = specrun::ServerConfig::from_toml(options.config_path);
  apply_server_flags(server);
  return specrun::server::serve(engine_config, server);
}

std::string read_stdin() {
  std::string text;
  char buffer[4096];
  size_t count;
  while ((count = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) text.append(buffer, count);
  return text;
}

// Why generation ended; a failed request is the run's error.
specrun::FinishReason finish_reason(const specrun::Result& result) {
  if (result.reason == specrun::FinishReason::kFailed) throw specrun::Error(result.error);
  return result.reason;
}

// `text` as the one user message of the target's chat template, with the assistant's turn opened;
// the template writes the special tokens itself, as transformers' apply_chat_template does.
std::string chat_prompt(const std::string& text, const specrun::EngineInfo& info,
                        const std::string& template_file) {
  const std::optional<specrun::ChatTemplate> chat_template =
      specrun::ChatTemplate::load(info, template_file);
  if (!chat_template) {
    throw specrun::Error(info.target +
                         " has no chat template: give one with --chat-template FILE, or run "
                         "without --chat");
  }
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", text}}};
  return chat_template->render(messages.dump());
}

int run(const Options& options) {
  // Every argument is checked before the (possibly large) models are loaded (create() checks the
  // settings first).
  const specrun::EngineConfig engine_config = resolve_config(options);
  if (options.prompt && options.prompt_ids) {
    throw specrun::Error("--prompt and --prompt-ids exclude each other");
  }
  if (options.chat && options.prompt_ids) {
    throw specrun::Error("--chat formats a text prompt: it excludes --prompt-ids");
  }
  if (!options.chat_template.empty() && !options.chat) {
    throw specrun::Error(
        "--chat-template is the template of --chat (or of specrun serve): give "
        "--chat too");
  }
  if (options.compare_rounds < 1) {
    throw specrun::Error("--compare-rounds must be at least 1, got " +
                         std::to_string(options.compare_rounds));
  }
  specrun::Request request;
  if (options.prompt_ids) {
    request.prompt_ids = specrun::tools::parse_token_ids(*options.prompt_ids, "--prompt-ids");
  }
  if (!options.stats_json.empty() && !std::ofstream(options.stats_json, std::ios::app)) {
    throw specrun::Error("--stats-json: cannot write " + options.stats_json);
  }
  // Engine::create plans the memory before loading and refuses a plan that does not fit (its one
  // error); the stats show the plan after the run, so that bad input stays one line.
  const auto engine = specrun::Engine::create(engine_config);
  const specrun::EngineInfo& info = engine->info();

  // The prompt: ids as given, or text from --prompt or stdin through the tokenizer (with its
  // BOS); with neither, the BOS token alone.
  if (!options.prompt_ids) {
    std::optional<std::string> text = options.prompt;
    if (!text && !::isatty(STDIN_FILENO)) text = read_stdin();
    if (text && !text->empty()) {
      if (!info.has_tokenizer) {
        throw specrun::Error(info.target +
                             " has no tokenizer.json: give the prompt as --prompt-ids");
      }
      if (options.chat) {
        request.prompt_ids =
            engine->tokenize(chat_prompt(*text, info, options.chat_template), false);
      } else {
        request.prompt = *text;
      }
    } else {
      if (info.bos_token_id < 0) {
        throw specrun::Error("no prompt was given and the model declares no bos_token_id");
      }
      request.prompt_ids = {info.bos_token_id};
    }
  }

  // Text as soon as it forms whole characters (the engine's events carry only those); token ids
  // when there is no tokenizer. The callback runs on the engine's thread while this one waits.
  bool first = true;
  const auto print = [&](const specrun::Event& event) {
    if (info.has_tokenizer) {
      std::fwrite(event.text.data(), 1, event.text.size(), stdout);
    } else {
      for (const int32_t token : event.tokens) {
        std::printf(first ? "%d" : " %d", token);
        first = false;
      }
    }
    // A full disk or a closed pipe stops the request rather than generating for nobody.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw specrun::Error(std::string("writing the output failed: ") + std::strerror(errno));
    }
  };
  // The speedup compares steady speeds: the first request of a process also pays for paging the
  // weights in and waking the threads, so untimed short runs go first, on the target alone and
  // speculatively (which also warms the draft, and leaves the prompt in both models' prefix
  // caches, as every later round finds it).
  auto on_target_alone = [&](const specrun::Request& of) {
    specrun::Request plain = of;
    plain.speculation = engine_config.speculation;
    plain.speculation->method = specrun::SpeculationMethod::kNone;
    return plain;
  };
  const bool compare =
      options.compare && engine_config.speculation.method != specrun::SpeculationMethod::kNone;
  if (compare) {
    for (specrun::Request warm_up : {on_target_alone(request), request}) {
      warm_up.sampling = engine_config.sampling;
      warm_up.sampling->max_tokens = std::min<int64_t>(warm_up.sampling->max_tokens, 16);
      finish_reason(engine->submit(warm_up).wait());  // throws if it failed
    }
  }
  const specrun::Result result = engine->submit(request, print).wait();
  std::printf("\n");
  std::fflush(stdout);

  specrun::tools::RunDescription run{.backend = info.device,
                                     .threads = info.threads,
                                     .cpu_kernels = info.cpu_kernels,
                                     .activations = info.activations,
                                     .method = engine_config.speculation.method,
                                     .controller = engine_config.speculation.controller,
                                     .verification = engine_config.speculation.verification,
                                     .reason = finish_reason(result),
                                     .baseline = std::nullopt,
                                     .memory = info.memory};
  if (compare) {
    // The same request (prompt, sampling settings and seed) on the target alone, not shown,
    // alternating with speculative reruns (not shown either): one ratio a round, so that a machine
    // whose speed drifts moves both sides of each ratio alike.
    specrun::tools::Baseline baseline;
    baseline.same_output = true;
    std::vector<double> target_alone;
    for (int round = 0; round < options.compare_rounds; ++round) {
      const specrun::Result speculative = round == 0 ? result : engine->submit(request).wait();
      finish_reason(speculative);  // throws if it failed
      const specrun::Result plain = engine->submit(on_target_alone(request)).wait();
      finish_reason(plain);
      target_alone.push_back(plain.stats.tokens_per_second);
      baseline.speedups.push_back(plain.stats.tokens_per_second > 0
                                      ? speculative.stats.tokens_per_second /
                                            plain.stats.tokens_per_second
                                      : 0.0);
      baseline.same_output = baseline.same_output && plain.tokens == result.tokens &&
                             speculative.tokens == result.tokens;
    }
    baseline.tokens_per_second = specrun::tools::median(target_alone);
    run.baseline = baseline;
  }
  if (!options.quiet) specrun::tools::print_stats(stderr, result.stats, run);
  if (!options.stats_json.empty()) {
    specrun::tools::write_stats_json(options.stats_json, result.stats, run);
  }
  return 0;
}

// A flag's choices by the names the settings spell them with; the help shows them as its type.
template <typename Enum>
CLI::Validator choices(std::initializer_list<Enum> values) {
  std::map<std::string, Enum> names;
  for (const Enum value : values) names.emplace(specrun::to_string(value), value);
  CLI::Validator validator = CLI::CheckedTransformer(names, CLI::ignore_case);
  validator.description("");
  return validator;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  specrun::EngineConfig& f = options.flags;
  CLI::App app{"specrun: generate from a Llama-family checkpoint (speculative decoding runtime)"};
  app.add_option(
      "--target", options.target,
      "Target checkpoint: a directory with config.json and *.safetensors, a "
      ".safetensors / .safetensors.index.json file with config.json beside it, or a "
      ".gguf file (default: the bundled pair, models/pycode-target with models/pycode-draft)");
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
  app.add_flag("--no-draft", options.no_draft,
               "Run the target alone (plain decoding), for comparison");
  app.add_flag("--compare", options.compare,
               "After the speculative run, run the same request on the target alone (not "
               "shown) and report its speed and the speedup: --compare-rounds pairs of runs, "
               "speculative and target alone in turn, the median ratio and its range; a short "
               "untimed run on the target alone goes first, so that neither pays for paging the "
               "weights in");
  app.add_option("--compare-rounds", options.compare_rounds,
                 "How many speculative / target-alone pairs --compare runs")
      ->capture_default_str();
  app.add_flag("--chat", options.chat,
               "The prompt is a user message: format it with the target's chat template (from "
               "tokenizer_config.json or the GGUF file) and let the model answer");
  // One flag for the run's --chat and for specrun serve, which takes it through fallthrough.
  CLI::Option* chat_template =
      app.add_option("--chat-template", options.chat_template,
                     "A Jinja chat template file in place of the target's: --chat's, or the "
                     "server's");
  // A flag for every setting of a request's speculation and sampling ([speculative] and
  // [sampling] of the TOML file, the server's "speculative" object), from one table each.
  SettingFlags<specrun::SpeculationSettings> speculation_flags(specrun::speculation_settings());
  speculation_flags.add(app, specrun::EngineConfig{}.speculation);
  SettingFlags<specrun::SamplingSettings> sampling_flags(specrun::sampling_settings());
  sampling_flags.add(app, specrun::EngineConfig{}.sampling);
  CLI::Option* quantize = app.add_option(
      "--quantize", f.quantize,
      "Quantize the target's linear layers at load (model.quantize): fp8 (E4M3) or int8, one "
      "symmetric scale per output channel; embeddings and the output projection stay bf16");
  CLI::Option* draft_quantize =
      app.add_option("--draft-quantize", f.draft_quantize,
                     "The same for the draft's linear layers (model.draft_quantize)");
  for (CLI::Option* option : {quantize, draft_quantize}) {
    option
        ->transform(choices({specrun::Quantization::kNone, specrun::Quantization::kFP8,
                             specrun::Quantization::kINT8}))
        ->type_name("none|fp8|int8");
  }
  CLI::Option* quantize_lm_head =
      app.add_flag("--quantize-lm-head", f.quantize_lm_head,
                   "Quantize the output projections of the models quantized at load too "
                   "(model.quantize_lm_head): with --draft-quantize alone, the draft's only");
  app.add_option("--stats-json", options.stats_json,
                 "Also write the run's stats as JSON to this file");
  CLI::Option* threads = app.add_option("--threads", f.threads, "CPU threads; 0 uses every core");
  CLI::Option* kv_tokens =
      app.add_option("--kv-cache-tokens", f.kv_cache_tokens,
                     "KV cache capacity in tokens; 0 uses the model's context, at most 8192");
  CLI::Option* kv_dtype =
      app.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                     "How the KV caches store keys and values (runtime.kv_cache_dtype): bf16 (the "
                     "default: half the memory and the bytes attention reads) or f32 (exact)");
  kv_dtype->transform(choices({specrun::KvCacheDtype::kBF16, specrun::KvCacheDtype::kF32}))
      ->type_name("bf16|f32");
  CLI::Option* device = app.add_option("--device", f.device,
                                       "Where the models run: cpu, cuda (the first GPU) or cuda:N");
  for (CLI::Option* option : {threads, kv_tokens, device}) {
    option->capture_default_str();
  }
  app.add_flag("--ignore-eos", options.ignore_eos, "Keep generating past end-of-sequence tokens");
  CLI::Option* deterministic =
      app.add_flag("--deterministic", f.deterministic,
                   "Batch-invariant kernels (runtime.deterministic): output independent of what "
                   "shares a batch, greedy speculative equal to greedy target-only bitwise");
  CLI::Option* activations = app.add_option(
      "--activations", f.activations,
      "CPU: what bf16 weights meet (runtime.activations): bf16 (rounded activations, multiplied "
      "by AMX tiles or vdpbf16ps: faster prefill and verification), f32 (exact), int8 (bf16, and "
      "with --quantize int8 the activations quantized to int8 per token, integer dot products: "
      "about twice bf16's prefill, approximate) or auto (bf16 where the CPU multiplies bf16 pairs "
      "in hardware, else f32)");
  activations
      ->transform(
          choices({specrun::ActivationPrecision::kAuto, specrun::ActivationPrecision::kF32,
                   specrun::ActivationPrecision::kBF16, specrun::ActivationPrecision::kInt8}))
      ->type_name("auto|f32|bf16|int8");
  CLI::Option* overlap = app.add_option(
      "--overlap-drafting", f.overlap_drafting,
      "Draft ahead while the target verifies (runtime.overlap_drafting): auto (where the draft "
      "runs beside the verification, on its own stream: CUDA, where each row's gamma policy "
      "decides), on or off; output is the same either way");
  overlap
      ->transform(choices({specrun::OverlapDrafting::kAuto, specrun::OverlapDrafting::kOn,
                           specrun::OverlapDrafting::kOff}))
      ->type_name("auto|on|off");
  bool no_prefix_cache = false;
  CLI::Option* prefix_cache = app.add_flag(
      "--no-prefix-cache", no_prefix_cache,
      "Compute every prompt in full rather than starting from cached KV blocks of the same "
      "prefix (runtime.prefix_cache = false); output is the same either way");
  app.add_option("--rope-style", options.rope_style,
                 "RoPE channel pairing: auto (the checkpoint's: rotate-half for Hugging Face, "
                 "interleaved for GGUF), rotate-half or interleaved (Meta's weight layout)")
      ->capture_default_str();
  app.add_option("--log-level", options.log_level,
                 "trace, debug (the memory plan before loading, the kernels chosen), info, warn, "
                 "error or off")
      ->capture_default_str();
  app.add_flag("--quiet", options.quiet, "Print no stats on stderr");
  app.require_subcommand(0, 1);
  const specrun::tools::TextCommands text_commands(app);
  // `specrun serve [engine flags] [server flags]`: the engine's flags are the main command's.
  specrun::ServerConfig server_flags;
  CLI::App* serve_command = app.add_subcommand(
      "serve",
      "Serve the models over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions, "
      "/v1/models, /health, /metrics) and a chat page (/) until SIGINT or SIGTERM");
  serve_command->fallthrough();
  CLI::Option* host = serve_command->add_option("--host", server_flags.host, "Address to listen on")
                          ->capture_default_str();
  CLI::Option* port =
      serve_command->add_option("--port", server_flags.port, "TCP port; 0 picks a free one")
          ->capture_default_str();
  CLI::Option* model_name = serve_command->add_option(
      "--model-name", server_flags.model_name,
      "The model id clients name (default: the target's file or directory name)");
  CLI::Option* max_requests =
      serve_command
          ->add_option("--max-requests", server_flags.max_requests,
                       "Requests queued or running at once; more get 429 with Retry-After")
          ->capture_default_str();
  CLI::Option* max_body = serve_command
                              ->add_option("--max-body-bytes", server_flags.max_body_bytes,
                                           "Larger request bodies get 413")
                              ->capture_default_str();
  CLI::Option* grace = serve_command
                           ->add_option("--shutdown-grace", server_flags.shutdown_grace_seconds,
                                        "Seconds in-flight requests may take to finish after "
                                        "SIGINT or SIGTERM")
                           ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (text_commands.ran()) return text_commands.run();

  // Settings given as flags win over the config file.
  auto given = [](const CLI::Option* option) { return option->count() > 0; };
  options.apply_flags = [&](specrun::EngineConfig& config) {
    speculation_flags.apply(config.speculation);
    sampling_flags.apply(config.sampling);
    if (given(threads)) config.threads = f.threads;
    if (given(kv_tokens)) config.kv_cache_tokens = f.kv_cache_tokens;
    if (given(kv_dtype)) config.kv_cache_dtype = f.kv_cache_dtype;
    if (given(device)) config.device = f.device;
    if (given(deterministic)) config.deterministic = f.deterministic;
    if (given(activations)) config.activations = f.activations;
    if (given(prefix_cache)) config.prefix_cache = !no_prefix_cache;
    if (given(overlap)) config.overlap_drafting = f.overlap_drafting;
    if (given(quantize)) config.quantize = f.quantize;
    if (given(draft_quantize)) config.draft_quantize = f.draft_quantize;
    if (given(quantize_lm_head)) config.quantize_lm_head = f.quantize_lm_head;
  };
  if (serve_command->parsed()) {
    const auto apply_server_flags = [&](specrun::ServerConfig& config) {
      if (given(host)) config.host = server_flags.host;
      if (given(port)) config.port = server_flags.port;
      if (given(model_name)) config.model_name = server_flags.model_name;
      if (given(chat_template)) config.chat_template = options.chat_template;
      if (given(max_requests)) config.max_requests = server_flags.max_requests;
      if (given(max_body)) config.max_body_bytes = server_flags.max_body_bytes;
      if (given(grace)) config.shutdown_grace_seconds = server_flags.shutdown_grace_seconds;
    };
    return specrun::tools::run_reporting_errors("specrun", options.log_level, [&] {
      return serve(options, server_flags, apply_server_flags);
    });
  }
  return specrun::tools::run_reporting_errors("specrun", options.log_level,
                                              [&] { return run(options); });
}
