// specbench: CPU prefill, decode and verification costs of a model, with the machine's memory
// bandwidth measured in the same run as the baseline for decode (a decode step reads every weight
// once, so weight bytes over read bandwidth is its floor).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/core/weight_layout.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/fill.h"
#include "kernels/cpu/sampling.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/engine/pairing.h"
#include "runtime/engine/settings.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/model/model.h"
#include "runtime/sampling/rng.h"
#include "specrun/chat.hpp"
#include "specrun/specrun.hpp"
#include "tools/cli_support.h"
#include "tools/device_bench.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double milliseconds(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A model of about 100M parameters (Llama shape, tied embeddings, bf16).
specrun::fixtures::GeneratorOptions hundred_million_shape() {
  specrun::fixtures::GeneratorOptions o;
  o.vocab_size = 32000;
  o.hidden_size = 768;
  o.intermediate_size = 2048;
  o.num_layers = 12;
  o.num_heads = 12;
  o.num_kv_heads = 4;
  o.tie_word_embeddings = true;
  o.dtype = specrun::DType::kBF16;
  o.max_position_embeddings = 4096;
  return o;
}

struct Bandwidth {
  double read = 0;  // bytes read per second: the best pattern's (below), the floor of a decode step
  double copy = 0;  // bytes read + written per second by memcpy, every thread
  std::string read_pattern;                           // the pattern that read fastest
  nlohmann::json patterns = nlohmann::json::array();  // every pattern's figure
};

// Sums a share of the buffer in eight independent lanes (so that no add chain bounds the loop),
// software-prefetching `prefetch_bytes` ahead when that is not 0.
uint64_t sum_words(const uint64_t* words, int64_t begin, int64_t end, int64_t prefetch_bytes) {
  uint64_t lanes[8] = {};
  const int64_t prefetch_words = prefetch_bytes / static_cast<int64_t>(sizeof(uint64_t));
  for (int64_t i = begin; i + 8 <= end; i += 8) {
    if (prefetch_words > 0) __builtin_prefetch(words + i + prefetch_words);
    for (int l = 0; l < 8; ++l) lanes[l] += words[i + l];
  }
  uint64_t sum = 0;
  for (const uint64_t lane : lanes) sum += lane;
  return sum;
}

// The machine's memory bandwidth over a buffer far larger than the caches, median of `repeats`
// runs after a warm-up. Read bandwidth is the best of several patterns (one thread and every
// thread of the pool, with and without software prefetch), so that a decode step is held to the
// most the machine does, not to one loop a slow kernel could match.
Bandwidth measure_bandwidth(specrun::kernels::cpu::ThreadPool& pool, size_t bytes, int repeats) {
  std::vector<uint64_t> source(bytes / sizeof(uint64_t), 1), destination(source.size(), 0);
  const int64_t words = static_cast<int64_t>(source.size());
  std::atomic<uint64_t> checksum{0};  // keeps the reads from being optimised away
  const auto time_median = [&](const auto& body) {
    std::vector<double> seconds;
    for (int r = 0; r < repeats + 1; ++r) {
      const auto start = Clock::now();
      body();
      if (r > 0) seconds.push_back(milliseconds(start) / 1e3);  // the first is a warm-up
    }
    return median(seconds);
  };
  Bandwidth result;
  for (const bool all_threads : {false, true}) {
    for (const int64_t prefetch : {int64_t{0}, int64_t{4096}}) {
      const double seconds = time_median([&] {
        if (all_threads) {
          pool.parallel_for(words, 1 << 17, [&](int64_t begin, int64_t end) {
            checksum += sum_words(source.data(), begin, end, prefetch);
          });
        } else {
          checksum += sum_words(source.data(), 0, words, prefetch);
        }
      });
      const double read = static_cast<double>(bytes) / seconds;
      const std::string name = std::string(all_threads ? "every thread" : "one thread") +
                               (prefetch > 0 ? ", prefetch 4 KiB ahead" : "");
      result.patterns.push_back({{"pattern", name}, {"read_bytes_per_second", read}});
      if (read > result.read) {
        result.read = read;
        result.read_pattern = name;
      }
    }
  }
  const double copy_seconds = time_median([&] {
    pool.parallel_for(words, 1 << 17, [&](int64_t begin, int64_t end) {
      std::memcpy(destination.data() + begin, source.data() + begin,
                  static_cast<size_t>(end - begin) * sizeof(uint64_t));
    });
  });
  result.copy = 2.0 * static_cast<double>(bytes) / copy_seconds;
  if (checksum.load() == 0) std::fprintf(stderr, "specbench: read check failed\n");
  return result;
}

// The x86-64 level of this machine and the extensions the CPU kernels can use; "" elsewhere.
std::string machine_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  std::string level = "x86-64";
  // By features: Clang's __builtin_cpu_supports does not take level names.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("bmi2")) {
    level = "x86-64-v3 (AVX2, FMA)";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd")) {
      level = "x86-64-v4 (AVX-512)";
    }
  }
  if (__builtin_cpu_supports("avx512bf16")) level += " + AVX512-BF16";
  if (__builtin_cpu_supports("avx512vnni")) level += " + AVX512-VNNI";
  return level;
#else
  return "";
#endif
}

// ---- speculative decoding -----------------------------------------------------------------------

// Median milliseconds of `repeats` calls of `body`, after one warm-up call.
template <typename Body>
double median_ms(int repeats, const Body& body) {
  std::vector<double> times;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto start = Clock::now();
    body();
    if (r > 0) times.push_back(milliseconds(start));
  }
  return median(times);
}

// The cost of one target forward over `tokens` new tokens on a cached prefix of `prefix` tokens.
double forward_ms(specrun::Model& model, int64_t prefix, int64_t tokens, int repeats) {
  specrun::KvCache& cache = model.kv_cache();
  const specrun::SequenceId sequence = cache.add_sequence();
  std::vector<int32_t> prompt(static_cast<size_t>(prefix));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i % 50);
  specrun::Logits logits;
  const specrun::SequenceInput prefill[] = {{sequence, prompt, false}};
  model.forward(prefill, &logits);
  const std::vector<int32_t> step(static_cast<size_t>(tokens), 7);
  const double ms = median_ms(repeats, [&] {
    const specrun::SequenceInput input[] = {{sequence, step, true}};
    model.forward(input, &logits);
    cache.truncate(sequence, prefix);
  });
  cache.remove_sequence(sequence);
  return ms;
}

struct RunSummary {
  double tokens_per_second = 0;
  double acceptance = 0;            // accepted / drafted
  double per_token_acceptance = 0;  // accepted / (accepted + rejections): Leviathan's alpha
  double mean_accepted_length = 0;
  double draft_share = 0;  // of the total time, spent proposing
  std::map<int64_t, int64_t> gamma_histogram;
};

// The prompts one after another through one engine (so an adaptive controller learns across
// them, as a server's does), each alone in its batch.
RunSummary run_generation(specrun::Model& target, specrun::Model* draft,
                          const std::vector<std::vector<int32_t>>& prompts, int64_t tokens,
                          float temperature, const specrun::SpeculationSettings& speculation) {
  specrun::BatchEngine engine(target, draft, {.max_batch = 1});
  RunSummary summary;
  int64_t generated = 0, drafted = 0, accepted = 0, steps = 0, committed = 0, rejections = 0;
  double total_ms = 0, draft_ms = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    specrun::EngineRequest request;
    request.prompt = prompts[p];
    request.sampling.temperature = temperature;
    request.sampling.max_tokens = tokens;
    request.sampling.stop_at_eos = false;
    request.speculation = speculation;
    const specrun::RequestStats stats = engine.run(std::move(request)).stats;
    generated += stats.tokens_generated;
    total_ms += stats.total_ms;
    draft_ms += stats.draft_ms;
    drafted += stats.drafted;
    accepted += stats.accepted;
    steps += stats.steps;
    committed += stats.accepted + stats.steps;  // accepted drafts and one token a step
    rejections += stats.rejections;
    for (const auto& [gamma, count] : stats.gamma_histogram)
      summary.gamma_histogram[gamma] += count;
  }
  summary.tokens_per_second = 1e3 * static_cast<double>(generated) / total_ms;
  summary.draft_share = draft_ms / total_ms;
  summary.acceptance = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0;
  summary.per_token_acceptance =
      accepted + rejections
          ? static_cast<double>(accepted) / static_cast<double>(accepted + rejections)
          : 0;
  summary.mean_accepted_length =
      steps ? static_cast<double>(committed) / static_cast<double>(steps) : 0;
  return summary;
}

std::string histogram_text(const std::map<int64_t, int64_t>& histogram) {
  std::string text;
  for (const auto& [gamma, count] : histogram) {
    text += (text.empty() ? "" : " ") + std::to_string(gamma) + ":" + std::to_string(count);
  }
  return text;
}

// ---- structured output
// ---------------------------------------------------------------------------

// What structured output costs: the same chat requests free and under a JSON schema, target-only
// and speculative, through one engine (greedy, so every configuration answers alike where the
// schema allows), each configuration's tokens/s the median over `repeats` interleaved rounds; and
// the grammar's mask per position, replayed over the constrained answers with a matcher as the
// engine holds one (its mask cache warm from earlier answers), beside the target-only step.
nlohmann::json constrained_bench(const std::string& target_path, const std::string& draft_path,
                                 int threads, int64_t tokens, int repeats) {
  specrun::EngineConfig config;
  config.target = target_path;
  config.draft = draft_path;
  config.threads = threads;
  const auto engine = specrun::Engine::create(config);
  const auto chat = specrun::ChatTemplate::load(engine->info());
  if (!chat) throw specrun::Error("--constrained needs a target with a chat template");
  const std::string schema = R"({"type": "object", "properties": {"title": {"type": "string"},)"
                             R"( "author": {"type": "string"}, "year": {"type": "integer"},)"
                             R"( "genres": {"type": "array", "items": {"type": "string"}}},)"
                             R"( "required": ["title", "author", "year", "genres"]})";
  const char* questions[] = {
      "Describe a famous novel as JSON with its title, author, year and genres.",
      "Give me a classic science fiction book as JSON: title, author, year, genres.",
      "Answer in JSON: a children's book with its title, author, year and genres.",
      "Name a book about history, as JSON with title, author, year and genres."};
  std::vector<std::vector<int32_t>> prompts;
  for (const char* question : questions) {
    const nlohmann::json messages = {{{"role", "user"}, {"content", question}}};
    prompts.push_back(engine->tokenize(chat->render(messages.dump()), false));
  }
  struct Configuration {
    const char* name;
    bool constrained;
    bool speculative;
    std::vector<double> tokens_per_second{};
    int64_t drafted = 0, accepted = 0;
    std::vector<std::vector<int32_t>> answers{};
  };
  std::vector<Configuration> configurations = {{"free, target only", false, false},
                                               {"free, speculative", false, true},
                                               {"json schema, target only", true, false},
                                               {"json schema, speculative", true, true}};
  for (int round = 0; round < repeats + 1; ++round) {  // round 0 warms up
    for (Configuration& configuration : configurations) {
      int64_t generated = 0;
      double total_ms = 0.0;
      configuration.answers.clear();
      for (const std::vector<int32_t>& prompt : prompts) {
        specrun::Request request;
        request.prompt_ids = prompt;
        request.sampling = specrun::SamplingSettings{.temperature = 0.0f, .max_tokens = tokens};
        specrun::SpeculationSettings speculation;
        if (!configuration.speculative) speculation.method = specrun::SpeculationMethod::kNone;
        request.speculation = speculation;
        if (configuration.constrained) {
          request.constraint = {specrun::ConstraintKind::kJsonSchema, schema};
        }
        const specrun::Result result = engine->submit(request).wait();
        if (result.reason == specrun::FinishReason::kFailed) throw specrun::Error(result.error);
        generated += result.stats.tokens_generated;
        total_ms += result.stats.total_ms;
        if (round > 0) {
          configuration.drafted += result.stats.drafted;
          configuration.accepted += result.stats.accepted;
        }
        configuration.answers.push_back(result.tokens);
      }
      if (round > 0) configuration.tokens_per_second.push_back(1e3 * generated / total_ms);
    }
  }

  // The mask's own cost per position, on the constrained answers.
  const specrun::Checkpoint checkpoint = specrun::open_checkpoint(target_path);
  const auto tokenizer = specrun::load_tokenizer(checkpoint.paths);
  const auto vocabulary = specrun::grammar::TokenVocabulary::from_tokenizer(
      *tokenizer, checkpoint.config.eos_token_ids);
  const auto grammar = specrun::grammar::json_schema_grammar(std::string_view(schema));
  std::vector<uint32_t> mask(vocabulary->mask_words());
  std::vector<double> mask_us, cold_us;
  specrun::grammar::Matcher cached(grammar, vocabulary);  // its copies share the mask cache
  for (int pass = 0; pass < 2; ++pass) {  // the first pass fills the cache, as earlier steps do
    for (const std::vector<int32_t>& answer : configurations[2].answers) {
      specrun::grammar::Matcher matcher = cached;
      for (const int32_t token : answer) {
        const auto start = Clock::now();
        matcher.fill_mask(mask);
        (pass == 1 ? mask_us : cold_us).push_back(1e3 * milliseconds(start));
        if (!matcher.accept_token(token)) break;
      }
    }
  }
  const double cold_mean_us = cold_us.empty()
                                  ? 0.0
                                  : std::accumulate(cold_us.begin(), cold_us.end(), 0.0) /
                                        static_cast<double>(cold_us.size());
  const double free_plain = median(configurations[0].tokens_per_second);
  const double step_ms = 1e3 / free_plain;
  const double mask_mean_us = mask_us.empty()
                                  ? 0.0
                                  : std::accumulate(mask_us.begin(), mask_us.end(), 0.0) /
                                        static_cast<double>(mask_us.size());
  std::sort(mask_us.begin(), mask_us.end());
  const double mask_p90_us = mask_us.empty() ? 0.0 : mask_us[mask_us.size() * 9 / 10];

  nlohmann::json result = {
      {"label", "structured output"}, {"target", target_path},
      {"draft", draft_path},          {"tokens", tokens},
      {"prompts", prompts.size()},    {"schema", nlohmann::json::parse(schema)}};
  std::printf("\n== structured output: %zu chat requests x %lld tokens, greedy, median of %d ==\n",
              prompts.size(), static_cast<long long>(tokens), repeats);
  std::printf("%-26s %10s %10s\n", "configuration", "tokens/s", "accepted");
  for (const Configuration& configuration : configurations) {
    const double acceptance = configuration.drafted ? static_cast<double>(configuration.accepted) /
                                                          static_cast<double>(configuration.drafted)
                                                    : 0.0;
    const double tps = median(configuration.tokens_per_second);
    std::printf("%-26s %10.1f %10.3f\n", configuration.name, tps, acceptance);
    result["runs"].push_back({{"configuration", configuration.name},
                              {"tokens_per_second", tps},
                              {"acceptance", acceptance}});
  }
  const double free_speedup = median(configurations[1].tokens_per_second) / free_plain;
  const double constrained_plain = median(configurations[2].tokens_per_second);
  const double constrained_speedup =
      median(configurations[3].tokens_per_second) / constrained_plain;
  result["constrained_over_free_target_only"] = constrained_plain / free_plain;
  result["speedup_free"] = free_speedup;
  result["speedup_constrained"] = constrained_speedup;
  result["speedup_constrained_over_free"] = constrained_speedup / free_speedup;
  for (const std::vector<int32_t>& answer : configurations[2].answers) {
    result["constrained_answers"].push_back(engine->detokenize(answer));
  }
  result["mask_positions"] = mask_us.size();
  result["mask_mean_us"] = mask_mean_us;
  result["mask_first_sight_mean_us"] = cold_mean_us;
  result["mask_p90_us"] = mask_p90_us;
  result["target_only_ms_per_token"] = step_ms;
  result["mask_share_of_step"] = mask_mean_us / 1e3 / step_ms;
  std::printf(
      "constrained / free tokens/s, target only: %.2f; speculation's speedup free %.2fx, "
      "constrained %.2fx (ratio %.2f)\n",
      constrained_plain / free_plain, free_speedup, constrained_speedup,
      constrained_speedup / free_speedup);
  std::printf(
      "grammar mask per position: mean %.1f us, p90 %.1f us = %.2f%% of a target-only token "
      "(%.2f ms); %.1f us on first sight of each state (an empty mask cache)\n",
      mask_mean_us, mask_p90_us, 100.0 * mask_mean_us / 1e3 / step_ms, step_ms, cold_mean_us);
  return result;
}

// Speculative against target-only on the same prompts in the same run, with the measured costs
// and the speedup Leviathan et al.'s formula predicts from them.
nlohmann::json speculative_bench(const std::string& label, const std::string& target_path,
                                 const std::string& draft_path,
                                 specrun::kernels::cpu::CpuBackend& backend, int64_t tokens,
                                 int64_t prompt_count, float temperature) {
  specrun::ModelOptions options;
  options.kv_cache_tokens = 4096;
  const auto target = specrun::Model::load(target_path, backend, options);
  const auto draft = specrun::Model::load(draft_path, backend, options);
  specrun::check_pairing(*target, *draft);
  const int64_t prefix = 32;
  const int repeats = 15;

  std::printf("\n== %s: target %.1fM parameters (%lld layers), draft %.1fM (%lld layers) ==\n",
              label.c_str(), static_cast<double>(target->parameter_count()) / 1e6,
              static_cast<long long>(target->config().num_layers),
              static_cast<double>(draft->parameter_count()) / 1e6,
              static_cast<long long>(draft->config().num_layers));
  const double decode = forward_ms(*target, prefix, 1, repeats);
  const double draft_step = forward_ms(*draft, prefix, 1, repeats);
  std::printf("costs (median of %d): target decode %.3f ms, draft step %.3f ms (c = %.3f)\n",
              repeats, decode, draft_step, draft_step / decode);
  std::printf("verify cost / decode cost by gamma + 1 tokens:");
  std::vector<double> verify(9);
  for (int64_t gamma = 0; gamma <= 8; ++gamma) {
    verify[static_cast<size_t>(gamma)] = forward_ms(*target, prefix, gamma + 1, repeats);
    std::printf(" %lld:%.2f", static_cast<long long>(gamma + 1),
                verify[static_cast<size_t>(gamma)] / decode);
  }
  std::printf("\n");

  specrun::Rng rng(99);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t p = 0; p < prompt_count; ++p) {
    std::vector<int32_t> prompt(static_cast<size_t>(prefix));
    for (int32_t& token : prompt) {
      token = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(target->config().vocab_size));
    }
    prompts.push_back(prompt);
  }
  specrun::SpeculationSettings plain;
  plain.method = specrun::SpeculationMethod::kNone;
  const RunSummary baseline = run_generation(*target, nullptr, prompts, tokens, temperature, plain);
  std::printf("target only: %.1f tokens/s (temperature %.2f, %lld prompts x %lld tokens)\n",
              baseline.tokens_per_second, temperature, static_cast<long long>(prompt_count),
              static_cast<long long>(tokens));

  nlohmann::json result = {{"label", label},
                           {"target_parameters", target->parameter_count()},
                           {"draft_parameters", draft->parameter_count()},
                           {"decode_ms", decode},
                           {"draft_step_ms", draft_step},
                           {"verify_ms", verify},
                           {"target_only_tokens_per_second", baseline.tokens_per_second}};
  std::printf("%-13s %-10s %8s %8s %10s %10s %10s  %s\n", "verification", "controller", "gamma",
              "accepted", "tokens/s", "speedup", "predicted", "gamma histogram (drafts:steps)");
  auto report = [&](const std::string& controller, int64_t gamma,
                    const specrun::SpeculationSettings& speculation) {
    const RunSummary run =
        run_generation(*target, draft.get(), prompts, tokens, temperature, speculation);
    const double speedup = run.tokens_per_second / baseline.tokens_per_second;
    // Leviathan et al.: E(gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha) tokens per step, each
    // step costing gamma draft steps and one verification of gamma + 1 tokens; alpha is the
    // per-token acceptance (drafts behind a rejection were never judged).
    double predicted = NAN;
    if (gamma > 0) {
      const double alpha = std::min(run.per_token_acceptance, 0.999999);
      const double expected =
          (1.0 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1.0 - alpha);
      predicted = expected * decode /
                  (static_cast<double>(gamma) * draft_step + verify[static_cast<size_t>(gamma)]);
    }
    std::printf("%-13s %-10s %8s %8.3f %10.1f %9.2fx %9.2fx  %s\n",
                specrun::to_string(speculation.verification), controller.c_str(),
                gamma > 0 ? std::to_string(gamma).c_str() : "adaptive", run.acceptance,
                run.tokens_per_second, speedup, predicted,
                histogram_text(run.gamma_histogram).c_str());
    result["runs"].push_back(
        {{"controller", controller},
         {"verification", specrun::to_string(speculation.verification)},
         {"gamma", gamma},
         {"acceptance", run.acceptance},
         {"per_token_acceptance", run.per_token_acceptance},
         {"mean_accepted_length", run.mean_accepted_length},
         {"tokens_per_second", run.tokens_per_second},
         {"speedup", speedup},
         {"predicted_speedup",
          std::isnan(predicted) ? nlohmann::json() : nlohmann::json(predicted)}});
  };
  for (const int64_t gamma : {1, 2, 3, 4, 6, 8}) {
    specrun::SpeculationSettings fixed;
    fixed.verification = specrun::Verification::kRejection;
    fixed.controller = specrun::GammaControl::kFixed;
    fixed.gamma = fixed.gamma_min = gamma;
    fixed.gamma_max = 8;
    report("fixed", gamma, fixed);
  }
  specrun::SpeculationSettings goodput;  // the default controller and verification (shared noise)
  specrun::SpeculationSettings goodput_rejection = goodput;
  goodput_rejection.verification = specrun::Verification::kRejection;
  report("goodput", 0, goodput_rejection);
  // Shared-noise verification on the same prompts: what reproducibility costs in acceptance.
  for (const int64_t gamma : {2, 4}) {
    specrun::SpeculationSettings fixed;
    fixed.controller = specrun::GammaControl::kFixed;
    fixed.gamma = fixed.gamma_min = gamma;
    fixed.gamma_max = 8;
    fixed.verification = specrun::Verification::kSharedNoise;
    report("fixed", gamma, fixed);
  }
  report("goodput", 0, goodput);

  // The goodput controller's speedup again, paired: target-only and goodput runs alternate, so
  // that drift in the machine's speed (a shared VM varies by a third from run to run) hits both;
  // each goodput run starts a fresh controller, so its calibration and probes are counted.
  constexpr int kPairs = 7;
  std::vector<double> ratios, draft_shares;
  for (int pair = 0; pair < kPairs; ++pair) {
    const RunSummary alone = run_generation(*target, nullptr, prompts, tokens, temperature, plain);
    const RunSummary adaptive =
        run_generation(*target, draft.get(), prompts, tokens, temperature, goodput);
    ratios.push_back(adaptive.tokens_per_second / alone.tokens_per_second);
    draft_shares.push_back(adaptive.draft_share);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "goodput / target-only, %d alternating pairs: median %.3fx (range %.3fx to %.3fx); "
      "proposing took %.1f%% of the goodput runs' time\n",
      kPairs, ratios[ratios.size() / 2], ratios.front(), ratios.back(),
      100.0 * std::accumulate(draft_shares.begin(), draft_shares.end(), 0.0) / kPairs);
  result["goodput_paired_speedup"] = {{"median", ratios[ratios.size() / 2]},
                                      {"min", ratios.front()},
                                      {"max", ratios.back()},
                                      {"pairs", kPairs}};
  return result;
}

// A layer-skip pair: a target whose deep layers change the logits little, and its first layers as
// the draft. Synthetic: acceptance is set by construction, the costs are real.
void write_layer_skip_pair(const std::filesystem::path& directory, int64_t vocab, int64_t hidden,
                           int64_t intermediate, int64_t layers, int64_t heads, int64_t kv_heads,
                           int64_t draft_layers, float deep_scale) {
  specrun::fixtures::GeneratorOptions o;
  o.vocab_size = vocab;
  o.hidden_size = hidden;
  o.intermediate_size = intermediate;
  o.num_layers = layers;
  o.num_heads = heads;
  o.num_kv_heads = kv_heads;
  // Untied: with the embedding as output projection a random model mostly repeats its input token,
  // which any draft predicts.
  o.tie_word_embeddings = false;
  o.max_position_embeddings = 4096;
  o.shallow_layers = draft_layers;
  o.deep_layer_scale = deep_scale;
  specrun::fixtures::write_random_checkpoint(o, directory / "target");
  specrun::fixtures::write_truncated_checkpoint(directory / "target", draft_layers,
                                                directory / "draft");
}

// The host's cost per row of what every drafted and verified position pays: process_logits (the
// processed distribution) and sample_with_noise (the shared-noise draw), on one thread as the
// engine runs them, over a synthetic row of `vocab` logits shaped like a language model's (a wide
// normal spread, a few tokens far above it). Median of `repeats` runs of 200 rows each.
nlohmann::json sampling_bench(int64_t vocab, int64_t repeats) {
  if (vocab < 2 || repeats < 1) {
    throw specrun::Error("--sampling takes a vocabulary of at least 2 tokens and --repeats >= 1");
  }
  specrun::Rng rng(17);
  std::vector<float> logits(static_cast<size_t>(vocab)), probs(logits.size());
  for (float& logit : logits) {  // about normal, spread 2.5: twelve uniforms' sum, less six
    double sum = -6.0;
    for (int i = 0; i < 12; ++i) sum += rng.uniform();
    logit = static_cast<float>(2.5 * sum);
  }
  for (int i = 0; i < 20; ++i) logits[rng.next() % logits.size()] += 12.0f;
  const specrun::RandomStream stream(7);
  struct Setting {
    const char* name;
    float temperature, top_p;
    int64_t top_k;
  };
  const Setting settings[] = {{"greedy", 0.0f, 1.0f, 0},
                              {"T 0.7", 0.7f, 1.0f, 0},
                              {"T 0.7, top-p 0.9", 0.7f, 0.9f, 0},
                              {"T 0.7, top-k 40", 0.7f, 1.0f, 40}};
  constexpr int kRows = 200;
  std::printf("sampling: one thread, a row of %lld logits, median of %lld runs of %d rows\n",
              static_cast<long long>(vocab), static_cast<long long>(repeats), kRows);
  std::printf("%-18s %14s %18s\n", "setting", "process us/row", "noise draw us/row");
  nlohmann::json results = nlohmann::json::array();
  for (const Setting& setting : settings) {
    specrun::SamplingParams params;
    params.temperature = setting.temperature;
    params.top_p = setting.top_p;
    params.top_k = setting.top_k;
    const specrun::kernels::LogitsSettings row_settings = specrun::logits_settings(params);
    std::vector<double> process_us, noise_us;
    int64_t sink = 0;
    for (int64_t run = 0; run <= repeats; ++run) {  // run 0 warms up
      const auto start = Clock::now();
      for (int row = 0; row < kRows; ++row) {
        if (specrun::kernels::cpu::process_logits(row_settings, logits, probs) !=
            specrun::kernels::RowStatus::kOk) {
          throw specrun::Error("the measured row of logits failed to process");
        }
      }
      const auto middle = Clock::now();
      for (int row = 0; row < kRows; ++row)
        sink += specrun::kernels::cpu::sample_with_noise(probs, stream, row, {});
      const auto end = Clock::now();
      if (run == 0) continue;
      process_us.push_back(std::chrono::duration<double, std::micro>(middle - start).count() /
                           kRows);
      noise_us.push_back(std::chrono::duration<double, std::micro>(end - middle).count() / kRows);
    }
    const double process = median(process_us), noise = median(noise_us);
    std::printf("%-18s %14.1f %18.1f\n", setting.name, process, noise);
    results.push_back({{"setting", setting.name},
                       {"process_logits_us", process},
                       {"sample_with_noise_us", noise},
                       {"checksum", sink}});
  }
  return {{"vocab", vocab}, {"repeats", repeats}, {"rows", kRows}, {"settings", results}};
}

// One CPU matmul of `shape` ("ROWSxINxOUT": activation rows, reduction length, weight rows),
// nothing else: the weights in bf16 and in each of `formats` (codes with one scale a row),
// laid out as the CPU backend lays them out, against f32 activations and each of
// `activation_names`; each call the median of `repeats` runs of enough calls to last about 20 ms,
// after a warm-up. Weights of a few MiB stay in the caches, where a kernel's instructions, not
// the memory, set its speed; weights far larger than the last-level cache measure the stream.
// `copies` > 1: the calls take `copies` copies of the weights in turn, as a model's layers take
// theirs, so that small weights come from memory too when their copies outgrow the caches, each
// call starting a stream of its own.
nlohmann::json matmul_bench(const std::string& shape, const std::vector<std::string>& formats,
                            const std::vector<std::string>& activation_names, int threads,
                            int repeats, int64_t copies) {
  namespace cpu = specrun::kernels::cpu;
  using specrun::DType;
  int64_t rows = 0, in = 0, out = 0;
  char extra = 0;
  if (std::sscanf(shape.c_str(), "%ldx%ldx%ld%c", &rows, &in, &out, &extra) != 3 || rows < 1 ||
      in < 1 || out < 1 || rows * in > (int64_t{1} << 28) || out * in > (int64_t{1} << 31)) {
    throw specrun::Error("--matmul takes ROWSxINxOUT, each at least 1 (e.g. 1x4096x2048), got '" +
                         shape + "'");
  }
  if (repeats < 1) throw specrun::Error("--repeats must be at least 1");
  if (copies < 1 || copies > 4096) {
    throw specrun::Error("--matmul-copies takes 1 to 4096, got " + std::to_string(copies));
  }
  auto pool = std::make_shared<cpu::ThreadPool>(threads);
  // Written as the synthetic models' weights are (Model::write_synthetic_weights): uniform values,
  // and for 8-bit formats codes uniform over the code range with one scale a row.
  const auto fill = [&](void* to, int64_t count, DType dtype, uint64_t seed, float range) {
    const specrun::Status status =
        cpu::fill_uniform({count, dtype, seed, -range, range}, to, *pool);
    if (!status.is_ok()) throw specrun::Error("writing the operands: " + status.to_string());
  };
  const float bound = std::sqrt(3.0f / static_cast<float>(in));
  std::vector<float> x(static_cast<size_t>(rows * in));
  fill(x.data(), rows * in, DType::kF32, 1, 1.0f);
  struct Weight {
    std::string name;
    DType dtype;
    std::vector<uint8_t> row_major;  // [out, in] elements of dtype
    std::vector<float> scales;       // [out] for codes
  };
  std::vector<Weight> stored;
  stored.push_back(
      {"bf16", DType::kBF16, std::vector<uint8_t>(static_cast<size_t>(out * in) * 2), {}});
  fill(stored.back().row_major.data(), out * in, DType::kBF16, 2, bound);
  for (const std::string& format : formats) {
    if (format != "fp8" && format != "int8") {
      throw specrun::Error("--quantize takes fp8 and int8, got '" + format + "'");
    }
    const DType dtype = format == "fp8" ? DType::kF8E4M3 : DType::kI8;
    const float code_max = dtype == DType::kI8 ? 127.0f : specrun::kF8E4M3Max;
    stored.push_back({format, dtype, std::vector<uint8_t>(static_cast<size_t>(out * in)),
                      std::vector<float>(static_cast<size_t>(out), bound / code_max)});
    fill(stored.back().row_major.data(), out * in, dtype, 3, code_max);
  }
  std::vector<std::pair<std::string, cpu::Activations>> activations = {
      {"f32", cpu::Activations::kF32}};
  for (const std::string& name : activation_names) {
    activations.emplace_back(name,
                             name == "int8" ? cpu::Activations::kInt8 : cpu::Activations::kBF16);
  }
  const cpu::MatmulVariant& variant = cpu::best_matmul_variant();
  std::printf(
      "matmul: [%ld, %ld] x [%ld, %ld]^T, %ld cop%s of the weights, %d threads, kernels: %s; "
      "median of %d runs\n",
      static_cast<long>(rows), static_cast<long>(in), static_cast<long>(out), static_cast<long>(in),
      static_cast<long>(copies), copies == 1 ? "y" : "ies", pool->num_threads(),
      std::string(variant.name).c_str(), repeats);
  std::printf("%-8s %-12s %10s %12s %10s %14s\n", "weights", "activations", "us/call", "GFLOP/s",
              "GB/s", "vs bf16 weights");
  std::vector<float> result(static_cast<size_t>(rows * out));
  nlohmann::json results = nlohmann::json::array();
  for (const auto& named : activations) {
    // Not a structured binding: the lambda below captures it (Clang 14 refuses bindings there).
    const std::string& activation_name = named.first;
    const cpu::Activations activation = named.second;
    const cpu::CpuBackend backend(pool, activation, &variant);
    double bf16_us = 0.0;
    for (const Weight& weight : stored) {
      // int8 activations meet INT8 weights alone: FP8 ones take bf16 activations (measured with
      // them), bf16 weights too (measured again here, as the ratio's baseline).
      if (activation == cpu::Activations::kInt8 && weight.dtype == DType::kF8E4M3) continue;
      const specrun::kernels::WeightLayout layout = backend.matmul_weight_layout(weight.dtype);
      const size_t copy_bytes =
          specrun::kernels::stored_weight_bytes(layout, out, in, weight.dtype);
      std::vector<uint8_t> laid_out(copy_bytes * static_cast<size_t>(copies));
      const specrun::Status laid = specrun::kernels::lay_out_weight(
          layout, weight.row_major.data(), out, in, weight.dtype, laid_out.data());
      if (!laid.is_ok()) throw specrun::Error("laying out the weights: " + laid.to_string());
      for (int64_t c = 1; c < copies; ++c) {
        std::memcpy(laid_out.data() + static_cast<size_t>(c) * copy_bytes, laid_out.data(),
                    copy_bytes);
      }
      specrun::kernels::MatmulParams params{rows, in, out, weight.dtype, DType::kF32};
      params.weight_layout = layout;
      if (!weight.scales.empty()) {
        params.scale_block_rows = 1;
        params.scale_block_cols = in;
      }
      int64_t next_copy = 0;
      const auto call = [&] {
        const uint8_t* copy = laid_out.data() + static_cast<size_t>(next_copy) * copy_bytes;
        next_copy = (next_copy + 1) % copies;
        const specrun::Status status = cpu::matmul(
            params, x.data(), copy, weight.scales.empty() ? nullptr : weight.scales.data(), nullptr,
            result.data(), *pool, activation, &variant);
        if (!status.is_ok()) throw specrun::Error("matmul: " + status.to_string());
      };
      // Calls per run: as many as take about 20 ms, from the warm-up's.
      const auto warm = Clock::now();
      int64_t calls = 0;
      do {
        call();
        ++calls;
      } while (milliseconds(warm) < 20.0);
      std::vector<double> us;
      for (int r = 0; r < repeats; ++r) {
        const auto start = Clock::now();
        for (int64_t c = 0; c < calls; ++c) call();
        us.push_back(1000.0 * milliseconds(start) / static_cast<double>(calls));
      }
      const double per_call = median(us);
      if (weight.dtype == DType::kBF16) bf16_us = per_call;
      const auto bytes = static_cast<double>(copy_bytes);
      const double gflops = 2.0 * rows * in * out / per_call / 1e3;
      std::printf("%-8s %-12s %10.2f %12.1f %10.1f %13.2fx\n", weight.name.c_str(),
                  activation_name.c_str(), per_call, gflops, bytes / per_call / 1e3,
                  bf16_us / per_call);
      results.push_back({{"weights", weight.name},
                         {"activations", activation_name},
                         {"us_per_call", per_call},
                         {"calls_per_run", calls},
                         {"gflops", gflops},
                         {"weight_bytes", copy_bytes},
                         {"speedup_vs_bf16_weights", bf16_us / per_call}});
    }
  }
  return {{"rows", rows},
          {"in_features", in},
          {"out_features", out},
          {"threads", pool->num_threads()},
          {"kernels", std::string(variant.name)},
          {"repeats", repeats},
          {"weight_copies", copies},
          {"results", results}};
}

// `count` processes that spin on the CPU while this object lives: other work on the machine,
// sharing its cores with the measurement (they die with specbench if it is killed).
class BusyProcesses {
 public:
  explicit BusyProcesses(int count) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = ::fork();
      if (pid < 0) {
        stop();  // the destructor does not run for a constructor that throws
        throw specrun::Error("--busy-cores: cannot start busy process " + std::to_string(i + 1) +
                             " of " + std::to_string(count));
      }
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
      }
      pids_.push_back(pid);
    }
  }
  ~BusyProcesses() { stop(); }
  BusyProcesses(const BusyProcesses&) = delete;
  BusyProcesses& operator=(const BusyProcesses&) = delete;

 private:
  void stop() {
    for (const pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (const pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    pids_.clear();
  }

  std::vector<pid_t> pids_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int threads = 0;
  int64_t prompt_tokens = 256;
  int64_t decode_tokens = 64;
  int repeats = 5;
  std::string json_path;
  CLI::App app{
      "specbench: prefill and decode throughput, speculative against target-only decoding, and "
      "(--synthetic) the costs of published shapes on a device"};
  app.add_option("--model", model_path,
                 "Checkpoint to measure (default: a generated ~100M-parameter Llama-shaped model)");
  app.add_option("--threads", threads, "CPU threads; 0 uses every core")->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "Prefill length")->capture_default_str();
  app.add_option("--decode-tokens", decode_tokens, "Decode steps per run")->capture_default_str();
  app.add_option("--repeats", repeats, "Measured runs (after one warm-up); the median is reported")
      ->capture_default_str();
  app.add_option("--json", json_path, "Also write the results as JSON to this file");
  std::vector<std::string> quantize;
  app.add_option("--quantize", quantize,
                 "Also measure the model quantized at load, in the same run: fp8, int8 or both "
                 "(comma-separated), each against the weights as stored; with --synthetic, the "
                 "target quantized (one of them) against its bf16 self where that fits and "
                 "--max-verify-tokens is at least 5")
      ->delimiter(',');
  std::vector<std::string> cpu_kernels;
  app.add_option("--cpu-kernels", cpu_kernels,
                 "The copies of the CPU matmul kernels to measure, comma-separated, the first as "
                 "the baseline and each other with the weights as stored, in the same run "
                 "(amx, native, x86-64-v4+bf16, x86-64-v3, portable: those this build has and "
                 "this CPU runs; amx differs from the next only for bf16 weights with "
                 "--activations bf16); default the best")
      ->delimiter(',');
  bool quantize_lm_head = false;
  app.add_flag("--quantize-lm-head", quantize_lm_head,
               "With --quantize: the output projection too (a tied one as a quantized copy), as "
               "specrun --quantize-lm-head");
  std::vector<std::string> activation_names;
  app.add_option("--activations", activation_names,
                 "Also measure with these activations (runtime.activations), comma-separated, in "
                 "the same run: bf16, the weights as stored (and each copy of the kernels asked "
                 "for, and each --quantize format) with activations rounded to bf16 (AMX tile "
                 "multiplies with the amx kernels, vdpbf16ps where the kernels have AVX512-BF16), "
                 "with their verification costs; int8, --quantize int8 with activations "
                 "quantized to int8 per token (vpdpbusd where the kernels have AVX512-VNNI), with "
                 "its verification costs, in each copy of the kernels asked for; f32, the weights "
                 "as stored with f32 activations (GGUF's Q4_0, Q4_1 and Q8_0 blocks widened to f32 "
                 "values rather than meeting activations quantized per block, as they do "
                 "otherwise)")
      ->check(CLI::IsMember({"bf16", "int8", "f32"}))
      ->delimiter(',');
  int busy_cores = 0;
  app.add_option("--busy-cores", busy_cores,
                 "Also measure the weights as stored with this many processes spinning beside "
                 "specbench, as other work sharing the machine's cores, in the same run");
  int64_t sampling_vocab = 0;
  app.add_option("--sampling", sampling_vocab,
                 "Measure the host's logits processing and shared-noise draw per row of this many "
                 "logits (e.g. 49152), for greedy, T 0.7, top-p and top-k, and nothing else");
  std::string matmul_shape;
  app.add_option("--matmul", matmul_shape,
                 "Measure one CPU matmul of this shape, ROWSxINxOUT (e.g. 1x4096x2048: a decode "
                 "row against 2048 weight rows of 4096), the weights in bf16 and in each "
                 "--quantize format, with f32 and each --activations, and nothing else");
  int64_t matmul_copies = 1;
  app.add_option("--matmul-copies", matmul_copies,
                 "With --matmul: calls take this many copies of the weights in turn, as a model's "
                 "layers do (e.g. 64 copies of a small weight come from memory, not the caches)")
      ->default_val(1);
  bool speculative = false;
  std::string target_path, draft_path;
  int64_t spec_tokens = 256, spec_prompts = 3;
  float spec_temperature = 1.0f;
  app.add_flag("--speculative", speculative,
               "Speculative against target-only decoding: measured costs, speedups, and the "
               "speedups predicted from them (default: two generated layer-skip pairs, a small "
               "compute-bound and a large memory-bound target)");
  bool constrained = false;
  app.add_flag("--constrained", constrained,
               "Structured output's cost: chat requests free and under a JSON schema, target-only "
               "and speculative, on the --target and --draft pair (with a tokenizer), and the "
               "grammar mask's cost per position");
  app.add_option("--target", target_path, "With --speculative: the target checkpoint");
  app.add_option("--draft", draft_path, "With --speculative: the draft checkpoint");
  app.add_option("--spec-tokens", spec_tokens, "With --speculative: tokens per prompt")
      ->capture_default_str();
  app.add_option("--spec-prompts", spec_prompts, "With --speculative: prompts per run")
      ->capture_default_str();
  app.add_option("--spec-temperature", spec_temperature,
                 "With --speculative: sampling temperature (0 is greedy)")
      ->capture_default_str();
  specrun::tools::DeviceBenchOptions device_bench;
  std::string synthetic;
  app.add_option("--synthetic", synthetic,
                 "Measure synthetic models of a published shape (llama-3.2-1b, llama-3.1-8b, "
                 "llama-3.1-70b) with random weights written on the device: decode against the "
                 "bandwidth floor, verification of 2..16 tokens, prefill, the draft's step, and "
                 "speculative against target-only generation");
  app.add_option("--synthetic-draft", device_bench.draft_shape,
                 "With --synthetic: the draft's shape; \"\" for none")
      ->capture_default_str();
  app.add_option("--device", device_bench.device, "With --synthetic: cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_flag("--deterministic", device_bench.deterministic,
               "With --synthetic: batch-invariant kernels (runtime.deterministic)");
  app.add_option("--context", device_bench.context,
                 "With --synthetic: tokens in the cache before each measured step")
      ->capture_default_str();
  app.add_option("--max-verify-tokens", device_bench.max_verify_tokens,
                 "With --synthetic: verification is measured for 2..this many tokens")
      ->capture_default_str();
  std::string kv_cache_dtype = specrun::to_string(specrun::KvCacheDtype::kBF16);
  app.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "How the KV caches store keys and values: bf16 (specrun's default) or f32")
      ->check([](const std::string& name) {
        return specrun::parse_kv_cache_dtype(name) ? std::string() : "not one of bf16, f32";
      })
      ->capture_default_str();
  app.add_option("--kv-cache-tokens", device_bench.kv_cache_tokens,
                 "With --synthetic: each model's KV-cache capacity (0: what the measurements "
                 "need)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const specrun::DType kv_dtype =
      specrun::kernel_dtype(*specrun::parse_kv_cache_dtype(kv_cache_dtype));
  device_bench.kv_cache_dtype = kv_dtype;

  if (app.count("--sampling") > 0) {
    return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
      const nlohmann::json result = sampling_bench(sampling_vocab, repeats);
      if (!json_path.empty()) std::ofstream(json_path) << result.dump(2) << "\n";
      return 0;
    });
  }

  if (app.count("--matmul") > 0) {
    return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
      const nlohmann::json result =
          matmul_bench(matmul_shape, quantize, activation_names, threads, repeats, matmul_copies);
      if (!json_path.empty()) std::ofstream(json_path) << result.dump(2) << "\n";
      return 0;
    });
  }

  if (!synthetic.empty()) {
    return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
      // With --synthetic, --quantize takes one dtype: the target's, measured against its bf16
      // self in the same run where that fits.
      if (quantize.size() > 1) {
        throw specrun::Error("--quantize with --synthetic takes one of fp8 and int8");
      }
      if (!quantize.empty()) {
        if (quantize[0] == "fp8") {
          device_bench.quantize = specrun::WeightQuantize::kFP8;
        } else if (quantize[0] == "int8") {
          device_bench.quantize = specrun::WeightQuantize::kINT8;
        } else {
          throw specrun::Error("--quantize takes fp8 and int8, got '" + quantize[0] + "'");
        }
      }
      device_bench.target_shape = synthetic;
      device_bench.threads = threads;
      device_bench.repeats = repeats;
      device_bench.json_path = json_path;
      // The prefill measured is 2048 tokens unless --prompt-tokens says otherwise.
      if (app.count("--prompt-tokens") > 0) device_bench.prefill_tokens = prompt_tokens;
      if (app.count("--decode-tokens") > 0) device_bench.generate_tokens = decode_tokens;
      return specrun::tools::run_device_bench(device_bench);
    });
  }

  if (constrained) {
    return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
      if (target_path.empty() || draft_path.empty()) {
        throw specrun::Error("--constrained takes --target and --draft (a pair with a tokenizer)");
      }
      std::printf("machine: %d threads\n", threads);
      const nlohmann::json result =
          constrained_bench(target_path, draft_path, threads, spec_tokens, repeats);
      if (!json_path.empty()) std::ofstream(json_path) << result.dump(2) << "\n";
      return 0;
    });
  }

  if (speculative) {
    return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
      auto pool = std::make_shared<specrun::kernels::cpu::ThreadPool>(threads);
      specrun::kernels::cpu::CpuBackend backend(pool);
      std::printf(
          "machine: %d threads; speedup = speculative tokens/s over target-only tokens/s "
          "on the same prompts in this run (prefills included)\n",
          pool->num_threads());
      nlohmann::json results = nlohmann::json::array();
      if (!target_path.empty() || !draft_path.empty()) {
        if (target_path.empty() || draft_path.empty()) {
          throw specrun::Error("--speculative takes both --target and --draft, or neither");
        }
        results.push_back(speculative_bench("given pair", target_path, draft_path, backend,
                                            spec_tokens, spec_prompts, spec_temperature));
      } else {
        const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                                ("specbench-spec-" + std::to_string(::getpid()));
        std::fprintf(stderr, "specbench: generating layer-skip pairs in %s\n", directory.c_str());
        write_layer_skip_pair(directory / "small", 512, 128, 344, 8, 4, 2, 1, 0.3f);
        write_layer_skip_pair(directory / "large", 8192, 768, 2048, 12, 12, 4, 2, 0.3f);
        results.push_back(speculative_bench("small target (8 x 128 wide)",
                                            (directory / "small" / "target").string(),
                                            (directory / "small" / "draft").string(), backend,
                                            spec_tokens, spec_prompts, spec_temperature));
        results.push_back(speculative_bench("large target (12 x 768 wide)",
                                            (directory / "large" / "target").string(),
                                            (directory / "large" / "draft").string(), backend,
                                            spec_tokens, spec_prompts, spec_temperature));
        std::filesystem::remove_all(directory);
      }
      if (!json_path.empty()) std::ofstream(json_path) << results.dump(2) << "\n";
      return 0;
    });
  }

  return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
    if (prompt_tokens < 1 || decode_tokens < 1 || repeats < 1) {
      throw specrun::Error("--prompt-tokens, --decode-tokens and --repeats must be positive");
    }
    const auto asked = [&](const char* name) {
      return std::find(activation_names.begin(), activation_names.end(), name) !=
             activation_names.end();
    };
    const bool bf16_activations = asked("bf16"), int8_activations = asked("int8"),
               f32_activations = asked("f32");
    if (int8_activations && std::find(quantize.begin(), quantize.end(), "int8") == quantize.end()) {
      throw specrun::Error("--activations int8 measures --quantize int8: add it");
    }
    std::filesystem::path generated;
    if (model_path.empty()) {
      generated =
          std::filesystem::temp_directory_path() / ("specbench-100m-" + std::to_string(::getpid()));
      std::fprintf(stderr, "specbench: generating a ~100M-parameter model in %s\n",
                   generated.c_str());
      specrun::fixtures::write_random_checkpoint(hundred_million_shape(), generated);
      model_path = generated.string();
    }
    auto pool = std::make_shared<specrun::kernels::cpu::ThreadPool>(threads);
    using specrun::kernels::cpu::Activations;
    using specrun::kernels::cpu::MatmulVariant;
    std::vector<const MatmulVariant*> variants;  // asked for; the first is the baseline's
    for (const std::string& name : cpu_kernels) {
      const MatmulVariant* found = nullptr;
      std::string known;
      for (const MatmulVariant& candidate : specrun::kernels::cpu::matmul_variants()) {
        if (!candidate.supported()) continue;
        if (candidate.name == name) found = &candidate;
        known += (known.empty() ? "" : ", ") + std::string(candidate.name);
      }
      if (found == nullptr) {
        throw specrun::Error("--cpu-kernels: '" + name + "' is not one this build has and " +
                             "this CPU runs (" + known + ")");
      }
      variants.push_back(found);
    }
    if (variants.empty()) variants.push_back(&specrun::kernels::cpu::best_matmul_variant());
    // The weights as stored first (the baseline), then with bf16 activations if asked, then each
    // other copy of the kernels and each quantization asked for, in one run.
    struct Mode {
      specrun::WeightQuantize quantize;
      Activations activations;
      const MatmulVariant* variant;
      std::string name;
      int busy_cores = 0;  // processes spinning beside the measurement
    };
    const MatmulVariant* baseline = variants.front();
    // f32 activations, and GGUF blocks meeting them quantized per block, as "auto" has them where
    // bf16 pairs are not multiplied in hardware (the same numbers as f32 for every other weight).
    std::vector<Mode> modes = {
        {specrun::WeightQuantize::kNone, Activations::kF32Int8Blocks, baseline, "as stored"}};
    if (f32_activations) {
      modes.push_back({specrun::WeightQuantize::kNone, Activations::kF32, baseline, "f32 act"});
    }
    if (bf16_activations) {
      modes.push_back({specrun::WeightQuantize::kNone, Activations::kBF16, baseline, "bf16 act"});
    }
    for (size_t v = 1; v < variants.size(); ++v) {
      modes.push_back({specrun::WeightQuantize::kNone, Activations::kF32Int8Blocks, variants[v],
                       std::string(variants[v]->name)});
      if (bf16_activations) {
        modes.push_back({specrun::WeightQuantize::kNone, Activations::kBF16, variants[v],
                         std::string(variants[v]->name) + " bf16"});
      }
    }
    if (busy_cores < 0) throw specrun::Error("--busy-cores must not be negative");
    if (busy_cores > 0) {
      modes.push_back({specrun::WeightQuantize::kNone, Activations::kF32Int8Blocks, baseline,
                       std::to_string(busy_cores) + " busy", busy_cores});
    }
    for (const std::string& name : quantize) {
      specrun::WeightQuantize format;
      if (name == "fp8") {
        format = specrun::WeightQuantize::kFP8;
      } else if (name == "int8") {
        format = specrun::WeightQuantize::kINT8;
      } else {
        throw specrun::Error("--quantize takes fp8 and int8, got '" + name + "'");
      }
      modes.push_back({format, Activations::kF32, baseline, name});
      // 8-bit weights with one scale per row meet bf16 activations as bf16 weights do.
      if (bf16_activations) {
        modes.push_back({format, Activations::kBF16, baseline, name + " bf16"});
      }
      if (int8_activations && format == specrun::WeightQuantize::kINT8) {
        modes.push_back({format, Activations::kInt8, baseline, name + " int8"});
        // And in each other copy of the kernels asked for (vpdpbusd or not).
        for (size_t v = 1; v < variants.size(); ++v) {
          modes.push_back({format, Activations::kInt8, variants[v],
                           name + " int8 " + std::string(variants[v]->name)});
        }
      }
    }

    struct Measured {
      std::string name;                // "as stored", "fp8", "int8"
      int64_t parameters = 0;          // the model's
      uint64_t weight_bytes = 0;       // as loaded
      uint64_t decode_read_bytes = 0;  // what a decode step reads
      double prefill_ms = 0;           // median prefill of prompt_tokens
      double step_ms = 0;              // median decode step
      // Median forward over k = 1..kMaxVerifyTokens new tokens with logits for each (the
      // verification of k - 1 drafts), on the prompt's context: [k - 1].
      std::vector<double> verify_ms;
      Activations activations = Activations::kF32;  // the mode's
    };
    constexpr int64_t kMaxVerifyTokens = 16;
    const auto measure = [&](const Mode& mode) {
      specrun::ModelOptions model_options;
      model_options.kv_cache_tokens = prompt_tokens + decode_tokens + 16;
      model_options.kv_cache_dtype = kv_dtype;
      model_options.quantize = mode.quantize;
      model_options.quantize_output = quantize_lm_head;
      specrun::kernels::cpu::CpuBackend backend(pool, mode.activations, mode.variant);
      const auto model = specrun::Model::load(model_path, backend, model_options);
      const specrun::ModelConfig& config = model->config();
      specrun::Rng rng(7);  // the same prompt and tokens for every mode
      std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
      for (int32_t& token : prompt) {
        token = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size));
      }
      specrun::KvCache& cache = model->kv_cache();
      specrun::Logits logits;
      const BusyProcesses busy(mode.busy_cores);
      std::vector<double> prefill_ms;
      std::vector<double> decode_ms;  // per step
      for (int r = 0; r < repeats + 1; ++r) {
        const specrun::SequenceId sequence = cache.add_sequence();
        const specrun::SequenceInput prefill[] = {{sequence, prompt, false}};
        auto start = Clock::now();
        model->forward(prefill, &logits);
        const double prefill_time = milliseconds(start);
        int32_t token = prompt.back();
        std::vector<double> steps;
        for (int64_t step = 0; step < decode_tokens; ++step) {
          const int32_t fed[] = {token};
          const specrun::SequenceInput decode[] = {{sequence, fed, false}};
          start = Clock::now();
          model->forward(decode, &logits);
          steps.push_back(milliseconds(start));
          token = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size));
        }
        cache.remove_sequence(sequence);
        if (r == 0) continue;  // warm-up
        prefill_ms.push_back(prefill_time);
        decode_ms.push_back(median(steps));
      }
      Measured measured{mode.name,
                        model->parameter_count(),
                        model->weight_bytes(),
                        model->decode_read_bytes(),
                        median(prefill_ms),
                        median(decode_ms),
                        {},
                        mode.activations};
      if ((mode.quantize == specrun::WeightQuantize::kNone && mode.busy_cores == 0 &&
           (mode.activations == Activations::kBF16 || mode.variant == baseline)) ||
          mode.activations == Activations::kInt8) {
        const specrun::SequenceId sequence = cache.add_sequence();
        const specrun::SequenceInput prefill[] = {{sequence, prompt, false}};
        model->forward(prefill, &logits);
        for (int64_t k = 1; k <= kMaxVerifyTokens; ++k) {
          // The prompt's first k tokens, repeated where the prompt is shorter than k.
          std::vector<int32_t> tokens(static_cast<size_t>(k));
          for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = prompt[i % prompt.size()];
          measured.verify_ms.push_back(median_ms(repeats, [&] {
            const specrun::SequenceInput input[] = {{sequence, tokens, true}};
            model->forward(input, &logits);
            cache.truncate(sequence, prompt_tokens);
          }));
        }
        cache.remove_sequence(sequence);
      }
      return measured;
    };
    std::vector<Measured> runs;
    for (const Mode& mode : modes) runs.push_back(measure(mode));
    const Measured& base = runs.front();
    const int64_t parameters = base.parameters;
    const uint64_t weight_bytes = base.weight_bytes;
    const uint64_t decode_read_bytes = base.decode_read_bytes;
    const Bandwidth bandwidth = measure_bandwidth(*pool, size_t{512} << 20, repeats);
    const double prefill_tps = 1e3 * static_cast<double>(prompt_tokens) / base.prefill_ms;
    const double step_ms = base.step_ms;
    const double decode_tps = 1e3 / step_ms;
    const double decode_bandwidth = static_cast<double>(decode_read_bytes) / (step_ms / 1e3);
    // A decode step reads every weight once (one row of an untied embedding table): its floor is
    // those bytes at the read bandwidth.
    const double floor_ms = 1e3 * static_cast<double>(decode_read_bytes) / bandwidth.read;

    char cpu[256] = "unknown";
    {
      std::ifstream info("/proc/cpuinfo");
      std::string line;
      while (std::getline(info, line)) {
        if (line.rfind("model name", 0) == 0) {
          std::snprintf(cpu, sizeof(cpu), "%s", line.substr(line.find(':') + 2).c_str());
          break;
        }
      }
    }
    const std::string isa = machine_isa();
    std::printf("machine: %s, %d threads; %s; kernels: %s\n", cpu, pool->num_threads(), isa.c_str(),
                std::string(baseline->name).c_str());
    std::printf("model: %s, %.1fM parameters, %.1f MiB of weights\n", model_path.c_str(),
                static_cast<double>(parameters) / 1e6,
                static_cast<double>(weight_bytes) / (1 << 20));
    std::printf("prefill: %lld tokens in %.1f ms: %.1f tokens/s (median of %d)\n",
                static_cast<long long>(prompt_tokens), base.prefill_ms, prefill_tps, repeats);
    std::printf("decode: %.2f ms/token: %.1f tokens/s (median step, %lld steps x %d runs)\n",
                step_ms, decode_tps, static_cast<long long>(decode_tokens), repeats);
    std::printf(
        "memory: read %.1f GB/s (best of %zu patterns: %s), copy %.1f GB/s (read + write), "
        "measured in this run\n",
        bandwidth.read / 1e9, bandwidth.patterns.size(), bandwidth.read_pattern.c_str(),
        bandwidth.copy / 1e9);
    std::printf(
        "decode reads weights at %.1f GB/s: %.0f%% of the read bandwidth (floor %.2f "
        "ms/token), %.0f%% of the copy bandwidth\n",
        decode_bandwidth / 1e9, 100.0 * decode_bandwidth / bandwidth.read, floor_ms,
        100.0 * decode_bandwidth / bandwidth.copy);
    // Verification of k - 1 drafts against one decode step, both on the prompt's context.
    const auto verify_costs = [&](const Measured& run) {
      nlohmann::json costs = nlohmann::json::array();
      std::printf("verify k tokens / one decode step, %s (k = 2..%lld):", run.name.c_str(),
                  static_cast<long long>(kMaxVerifyTokens));
      for (int64_t k = 2; k <= kMaxVerifyTokens; ++k) {
        const double ratio = run.verify_ms[static_cast<size_t>(k - 1)] / run.verify_ms[0];
        std::printf(" %lld: %.2f%s", static_cast<long long>(k), ratio,
                    k < kMaxVerifyTokens ? "," : "\n");
        costs.push_back({{"tokens", k},
                         {"ms", run.verify_ms[static_cast<size_t>(k - 1)]},
                         {"decode_steps", ratio}});
      }
      return costs;
    };
    nlohmann::json verify = verify_costs(base);
    // Every run with bf16 activations (one a copy of the kernels asked for) and with int8 ones
    // measured its own; the first with bf16 activations is the JSON's verify_bf16_activations.
    nlohmann::json verify_bf16;
    std::map<std::string, nlohmann::json> verify_of_run;
    for (const Measured& run : runs) {
      if (&run == &base || run.verify_ms.empty()) continue;
      verify_of_run[run.name] = verify_costs(run);
      if (verify_bf16.is_null() && run.activations == Activations::kBF16) {
        verify_bf16 = verify_of_run[run.name];
      }
    }
    nlohmann::json quantized = nlohmann::json::array();
    if (runs.size() > 1) {
      std::printf(
          "weights     MiB  decode ms  tokens/s  vs as stored  of floor  prefill tokens/s  vs as "
          "stored\n");
      for (const Measured& run : runs) {
        const double run_floor_ms =
            1e3 * static_cast<double>(run.decode_read_bytes) / bandwidth.read;
        const double run_prefill_tps = 1e3 * static_cast<double>(prompt_tokens) / run.prefill_ms;
        std::printf("%-9s %5.1f  %9.2f  %8.1f  %11.2fx  %7.0f%%  %16.1f  %7.2fx\n",
                    run.name.c_str(), static_cast<double>(run.weight_bytes) / (1 << 20),
                    run.step_ms, 1e3 / run.step_ms, base.step_ms / run.step_ms,
                    100.0 * run_floor_ms / run.step_ms, run_prefill_tps,
                    base.prefill_ms / run.prefill_ms);
        quantized.push_back({{"weights", run.name},
                             {"weight_bytes", run.weight_bytes},
                             {"decode_read_bytes", run.decode_read_bytes},
                             {"decode_ms_per_token", run.step_ms},
                             {"decode_speedup", base.step_ms / run.step_ms},
                             {"decode_fraction_of_floor", run_floor_ms / run.step_ms},
                             {"prefill_ms", run.prefill_ms},
                             {"prefill_speedup", base.prefill_ms / run.prefill_ms}});
        if (const auto costs = verify_of_run.find(run.name); costs != verify_of_run.end()) {
          quantized.back()["verify"] = costs->second;
        }
      }
    }
    if (!json_path.empty()) {
      nlohmann::json results = {{"machine", cpu},
                                {"isa", isa},
                                {"kernels", baseline->name},
                                {"threads", pool->num_threads()},
                                {"parameters", parameters},
                                {"weight_bytes", weight_bytes},
                                {"decode_read_bytes", decode_read_bytes},
                                {"prompt_tokens", prompt_tokens},
                                {"kv_cache_dtype", kv_cache_dtype},
                                {"prefill_ms", base.prefill_ms},
                                {"prefill_tokens_per_second", prefill_tps},
                                {"decode_ms_per_token", step_ms},
                                {"decode_tokens_per_second", decode_tps},
                                {"read_bandwidth_bytes_per_second", bandwidth.read},
                                {"read_bandwidth_pattern", bandwidth.read_pattern},
                                {"read_bandwidth_patterns", bandwidth.patterns},
                                {"copy_bandwidth_bytes_per_second", bandwidth.copy},
                                {"verify_one_step_ms", base.verify_ms[0]},
                                {"verify", verify},
                                {"decode_fraction_of_floor", floor_ms / step_ms}};
      if (!quantized.empty()) results["modes"] = quantized;
      if (!verify_bf16.is_null()) results["verify_bf16_activations"] = verify_bf16;
      std::ofstream(json_path) << results.dump(2) << "\n";
    }
    if (!generated.empty()) std::filesystem::remove_all(generated);
    return 0;
  });
}
