#include "tools/device_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/device_buffer.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/engine/device.h"
#include "runtime/model/model.h"
#include "runtime/model/synthetic.h"
#include "runtime/sampling/rng.h"

namespace specrun::tools {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
  SPECRUN_CHECK(!values.empty());
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written, timed by the device's
// clock: a decode step's floor is the bytes it reads at this rate.
double copy_bandwidth(kernels::Backend& backend, size_t bytes, int repeats) {
  DeviceBuffer source(backend, bytes, "bandwidth source");
  DeviceBuffer destination(backend, bytes, "bandwidth destination");
  std::vector<double> ms;
  for (int r = 0; r < repeats + 1; ++r) {
    double elapsed = 0;
    SPECRUN_CHECK_OK(
        backend.time_ms(
            [&] { return backend.copy_on_device(destination.data(), source.data(), bytes); },
            &elapsed),
        "bandwidth copy");
    if (r > 0) ms.push_back(elapsed);  // the first warms up
  }
  return 2.0 * static_cast<double>(bytes) / (median(ms) / 1e3);
}

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, Rng& rng) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& token : tokens) {
    token = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

// The median time of one forward of `tokens` new tokens for a sequence holding `context`, the
// cache rolled back after each, so every sample sees the same context. Logits come back to the
// host as in a real step (every row's when `all_logits`, as verification needs).
double step_ms(Model& model, int64_t context, int64_t tokens, bool all_logits, int samples,
               Rng& rng) {
  KvCache& cache = model.kv_cache();
  const SequenceId sequence = cache.add_sequence();
  Logits logits;
  const std::vector<int32_t> prompt = random_tokens(context, model.config().vocab_size, rng);
  const SequenceInput prefill[] = {{sequence, prompt, false}};
  model.forward(prefill, &logits);
  std::vector<double> ms;
  for (int s = 0; s < samples + 1; ++s) {
    const std::vector<int32_t> fed = random_tokens(tokens, model.config().vocab_size, rng);
    const SequenceInput step[] = {{sequence, fed, all_logits}};
    const auto start = Clock::now();
    model.forward(step, &logits);
    if (s > 0) ms.push_back(milliseconds_since(start));  // the first warms up this shape
    cache.truncate(sequence, context);
  }
  cache.remove_sequence(sequence);
  return median(ms);
}

double prefill_ms(Model& model, int64_t tokens, int repeats, Rng& rng) {
  KvCache& cache = model.kv_cache();
  Logits logits;
  std::vector<double> ms;
  for (int r = 0; r < repeats + 1; ++r) {
    const SequenceId sequence = cache.add_sequence();
    const std::vector<int32_t> prompt = random_tokens(tokens, model.config().vocab_size, rng);
    const SequenceInput prefill[] = {{sequence, prompt, false}};
    const auto start = Clock::now();
    model.forward(prefill, &logits);
    if (r > 0) ms.push_back(milliseconds_since(start));
    cache.remove_sequence(sequence);
  }
  return median(ms);
}

// Leviathan et al.'s expected speedup for per-token acceptance alpha, gamma drafts, a draft step
// costing c target steps and verification of gamma + 1 tokens costing v target steps.
double predicted_speedup(double alpha, int64_t gamma, double c, double v) {
  const double expected =
      alpha >= 1.0 ? static_cast<double>(gamma + 1)
                   : (1.0 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1.0 - alpha);
  return expected / (static_cast<double>(gamma) * c + v);
}

std::string parameters_text(double parameters) {
  char text[32];
  std::snprintf(text, sizeof(text), parameters >= 1e9 ? "%.2fB" : "%.1fM",
                parameters >= 1e9 ? parameters / 1e9 : parameters / 1e6);
  return text;
}

std::string bytes_text(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), bytes >= double(1ull << 30) ? "%.2f GiB" : "%.1f MiB",
                bytes >= double(1ull << 30) ? bytes / double(1ull << 30) : bytes / double(1 << 20));
  return text;
}

struct ModelReport {
  double decode_ms = 0;    // one token at batch 1
  double floor_ms = 0;     // bytes a decode step reads over the copy bandwidth
  std::string weights;     // bytes of weights, for the report
  std::string parameters;  // parameter count, for the report
};

ModelReport measure_decode(Model& model, double bandwidth, const DeviceBenchOptions& options,
                           Rng& rng) {
  ModelReport report;
  report.decode_ms = step_ms(model, options.context, 1, false, 8 * options.repeats, rng);
  report.floor_ms = 1e3 * static_cast<double>(model.decode_read_bytes()) / bandwidth;
  report.weights = bytes_text(static_cast<double>(model.weight_bytes()));
  report.parameters = parameters_text(static_cast<double>(model.parameter_count()));
  return report;
}

const char* weights_name(WeightQuantize quantize) {
  return quantize == WeightQuantize::kFP8    ? "fp8"
         : quantize == WeightQuantize::kINT8 ? "int8"
                                             : "bf16";
}

// Bytes of a synthetic model's bf16 weights, from its shapes alone.
uint64_t bf16_weight_bytes(const ModelConfig& config) {
  const ModelWeights layout = synthetic_layout(config, DType::kBF16);
  uint64_t bytes =
      layout.embedding.size_bytes + layout.final_norm.size_bytes + layout.output.size_bytes;
  for (const LayerWeights& l : layout.layers) {
    for (const WeightView* view : l.views()) bytes += view->size_bytes;
  }
  return bytes;
}

// The device's free memory now, or 0 where the backend cannot say.
uint64_t free_memory(kernels::Backend& backend) {
  uint64_t bytes = 0;
  return backend.available_memory(&bytes).is_ok() ? bytes : 0;
}

}  // namespace

int run_device_bench(const DeviceBenchOptions& options) {
  if (options.context < 1 || options.prefill_tokens < 1 || options.max_verify_tokens < 2 ||
      options.generate_tokens < 1 || options.repeats < 1) {
    throw Error(
        "--context, --prefill-tokens, --generate-tokens and --repeats must be positive, and "
        "--max-verify-tokens at least 2");
  }
  // Every setting is checked before anything is measured.
  const int64_t needed_tokens =
      std::max(options.prefill_tokens, options.context + options.max_verify_tokens) +
      options.generate_tokens + 64;
  if (options.kv_cache_tokens != 0 && options.kv_cache_tokens < needed_tokens) {
    throw Error("--kv-cache-tokens " + std::to_string(options.kv_cache_tokens) + " is below the " +
                std::to_string(needed_tokens) + " the measurements need");
  }
  const ModelConfig target_config = synthetic_config(options.target_shape);
  const ModelConfig draft_config =
      options.draft_shape.empty() ? ModelConfig{} : synthetic_config(options.draft_shape);
  parse_device(options.device);
  auto pool = make_thread_pool(options.threads);
  const std::unique_ptr<kernels::Backend> backend =
      make_backend(options.device, pool, BackendOptions{options.deterministic});
  nlohmann::json results;
  results["device"] = std::string(backend->name());
  results["deterministic"] = options.deterministic;

  // Big enough to leave every cache level behind on any device; smaller on the host.
  const size_t copy_bytes = backend->uses_host_memory() ? size_t{256} << 20 : size_t{1} << 30;
  const double bandwidth = copy_bandwidth(*backend, copy_bytes, options.repeats);
  std::printf("device: %s%s; copy bandwidth %.0f GB/s (read + write, device to device)\n",
              std::string(backend->name()).c_str(),
              options.deterministic ? ", deterministic (batch-invariant kernels)" : "",
              bandwidth / 1e9);
  results["copy_bandwidth_bytes_per_second"] = bandwidth;

  ModelOptions model_options;
  model_options.kv_cache_tokens = std::max(options.kv_cache_tokens, needed_tokens);
  model_options.kv_cache_dtype = options.kv_cache_dtype;
  Rng rng(2024);
  // A device's free memory, before the models; the host's available memory says little (pages
  // are taken as they are touched), so it is not reported there.
  const uint64_t free_at_start = backend->uses_host_memory() ? 0 : free_memory(*backend);
  uint64_t least_free = free_at_start;  // after each model has been measured

  // The bf16 baseline of a quantized target, measured first in the same run where it fits.
  std::optional<double> baseline_decode_ms, baseline_prefill_ms, baseline_verify_ms;
  if (options.quantize != WeightQuantize::kNone && options.max_verify_tokens >= 5) {
    const uint64_t bf16_bytes = bf16_weight_bytes(target_config);
    // Its weights and a tenth more for the cache and workspaces (on the host: always).
    if (backend->uses_host_memory() || bf16_bytes + bf16_bytes / 10 < free_at_start) {
      std::fprintf(stderr, "specbench: writing synthetic %s bf16 weights on %s (the baseline)\n",
                   options.target_shape.c_str(), std::string(backend->name()).c_str());
      const std::unique_ptr<Model> baseline = Model::synthetic(
          target_config, "synthetic " + options.target_shape, 1, *backend, model_options);
      baseline_decode_ms = measure_decode(*baseline, bandwidth, options, rng).decode_ms;
      baseline_verify_ms = step_ms(*baseline, options.context, 5, true, 2 * options.repeats, rng);
      baseline_prefill_ms = prefill_ms(*baseline, options.prefill_tokens, options.repeats, rng);
      std::printf(
          "baseline %s bf16: decode %.3f ms/token, verification of 5 tokens %.3f ms, prefill of "
          "%lld tokens %.1f ms\n",
          options.target_shape.c_str(), *baseline_decode_ms, *baseline_verify_ms,
          static_cast<long long>(options.prefill_tokens), *baseline_prefill_ms);
      results["baseline_bf16"] = {{"decode_ms", *baseline_decode_ms},
                                  {"verify_5_ms", *baseline_verify_ms},
                                  {"prefill_ms", *baseline_prefill_ms}};
    } else {
      std::printf("baseline %s bf16: not measured: %s of weights do not fit the %s free\n",
                  options.target_shape.c_str(), bytes_text(double(bf16_bytes)).c_str(),
                  bytes_text(double(free_at_start)).c_str());
    }
  }

  std::fprintf(stderr, "specbench: writing synthetic %s %s weights on %s\n",
               options.target_shape.c_str(), weights_name(options.quantize),
               std::string(backend->name()).c_str());
  ModelOptions target_options = model_options;
  target_options.quantize = options.quantize;
  const std::unique_ptr<Model> target = Model::synthetic(
      target_config, "synthetic " + options.target_shape, 1, *backend, target_options);

  // Target decode against the floor.
  const ModelReport decode = measure_decode(*target, bandwidth, options, rng);
  std::printf(
      "target %s: %s parameters, %s %s; decode at batch 1 (context %lld, %s KV cache): %.3f "
      "ms/token, %.1f tokens/s; floor %.3f ms: %.0f%% of the floor\n",
      options.target_shape.c_str(), decode.parameters.c_str(), decode.weights.c_str(),
      weights_name(options.quantize), static_cast<long long>(options.context),
      std::string(dtype_name(options.kv_cache_dtype)).c_str(), decode.decode_ms,
      1e3 / decode.decode_ms, decode.floor_ms, 100.0 * decode.floor_ms / decode.decode_ms);
  results["target"] = {{"shape", options.target_shape},
                       {"weights", weights_name(options.quantize)},
                       {"parameters", target->parameter_count()},
                       {"weight_bytes", target->weight_bytes()},
                       {"decode_read_bytes", target->decode_read_bytes()},
                       {"kv_cache_tokens", target->kv_cache().capacity_tokens()},
                       {"kv_cache_dtype", std::string(dtype_name(options.kv_cache_dtype))},
                       {"decode_ms", decode.decode_ms},
                       {"floor_ms", decode.floor_ms},
                       {"fraction_of_floor", decode.floor_ms / decode.decode_ms}};
  if (baseline_decode_ms) {
    std::printf("%s against bf16, same run: decode %.2fx faster\n", weights_name(options.quantize),
                *baseline_decode_ms / decode.decode_ms);
    results["target"]["decode_speedup_over_bf16"] = *baseline_decode_ms / decode.decode_ms;
  }

  // Verification of gamma + 1 tokens against one decode step.
  std::printf("verification / decode step by gamma + 1 tokens (all logits to the host):");
  std::vector<double> verify_ratio(static_cast<size_t>(options.max_verify_tokens) + 1, 1.0);
  nlohmann::json verify = nlohmann::json::object();
  for (int64_t tokens = 2; tokens <= options.max_verify_tokens; ++tokens) {
    const double ms = step_ms(*target, options.context, tokens, true, 2 * options.repeats, rng);
    verify_ratio[static_cast<size_t>(tokens)] = ms / decode.decode_ms;
    verify[std::to_string(tokens)] = ms;
    std::printf(" %lld:%.2f", static_cast<long long>(tokens), ms / decode.decode_ms);
  }
  std::printf("\n");
  results["verify_ms_by_tokens"] = verify;

  // Prefill.
  const double prefill = prefill_ms(*target, options.prefill_tokens, options.repeats, rng);
  std::printf("prefill: %lld tokens in %.1f ms: %.0f tokens/s\n",
              static_cast<long long>(options.prefill_tokens), prefill,
              1e3 * static_cast<double>(options.prefill_tokens) / prefill);
  results["prefill"] = {{"tokens", options.prefill_tokens}, {"ms", prefill}};
  if (baseline_prefill_ms) {
    // Verification of 5 is measured for both: max_verify_tokens is at least 5 when the baseline
    // ran (checked below), so verify_ratio[5] holds this run's measurement.
    const double verify_5_ms = verify_ratio[5] * decode.decode_ms;
    std::printf("%s against bf16, same run: verification of 5 tokens %.2fx, prefill %.2fx faster\n",
                weights_name(options.quantize), *baseline_verify_ms / verify_5_ms,
                *baseline_prefill_ms / prefill);
    results["target"]["verify_5_speedup_over_bf16"] = *baseline_verify_ms / verify_5_ms;
    results["prefill"]["speedup_over_bf16"] = *baseline_prefill_ms / prefill;
  }
  least_free = std::min(least_free, free_memory(*backend));

  if (!options.draft_shape.empty()) {
    std::fprintf(stderr, "specbench: writing synthetic %s weights on %s\n",
                 options.draft_shape.c_str(), std::string(backend->name()).c_str());
    // On a stream of its own, as Engine::create places a draft.
    const std::unique_ptr<kernels::Backend> draft_stream = backend->create_stream();
    if (draft_stream == nullptr) throw Error("cannot make a stream for the draft");
    const std::unique_ptr<Model> draft = Model::synthetic(
        draft_config, "synthetic " + options.draft_shape, 2, *draft_stream, model_options);
    const ModelReport draft_decode = measure_decode(*draft, bandwidth, options, rng);
    least_free = std::min(least_free, free_memory(*backend));
    const double c = draft_decode.decode_ms / decode.decode_ms;
    std::printf(
        "draft %s: %s parameters, %s bf16; step %.3f ms (%.0f%% of its floor %.3f ms); "
        "c = draft step / target step = %.3f\n",
        options.draft_shape.c_str(), draft_decode.parameters.c_str(), draft_decode.weights.c_str(),
        draft_decode.decode_ms, 100.0 * draft_decode.floor_ms / draft_decode.decode_ms,
        draft_decode.floor_ms, c);
    results["draft"] = {{"shape", options.draft_shape},
                        {"parameters", draft->parameter_count()},
                        {"decode_ms", draft_decode.decode_ms},
                        {"floor_ms", draft_decode.floor_ms},
                        {"c", c}};

    // End to end: greedy target-only against speculative at fixed gammas, the same prompt. The
    // synthetic pair shares no knowledge, so its acceptance is that of two random models; what
    // carries over to a real pair is the cost of each step, so the report pairs the measured
    // per-step costs with the speedup Leviathan et al.'s formula gives them at real acceptances.
    const std::vector<int32_t> prompt =
        random_tokens(options.context, target_config.vocab_size, rng);
    auto decode_with = [&](SpeculationMethod method, int64_t gamma) {
      EngineRequest request;
      request.prompt = prompt;
      request.sampling.temperature = 0.0f;
      request.sampling.max_tokens = options.generate_tokens;
      request.sampling.stop_at_eos = false;
      request.speculation.method = method;
      request.speculation.controller = GammaControl::kFixed;
      request.speculation.gamma = gamma;
      request.speculation.gamma_min = 0;
      request.speculation.gamma_max = std::max<int64_t>(gamma, 1);
      BatchEngine engine(*target, draft.get(), {.max_batch = 1});
      engine.run(request);  // warm-up
      return engine.run(request).stats;
    };
    const RequestStats alone = decode_with(SpeculationMethod::kNone, 0);
    const double alone_tps = 1e3 * static_cast<double>(alone.tokens_generated) / alone.total_ms;
    std::printf(
        "generation, %lld greedy tokens after a %lld-token prompt: target alone %.1f tokens/s\n",
        static_cast<long long>(options.generate_tokens), static_cast<long long>(options.context),
        alone_tps);
    std::printf(
        "gamma  tokens/s  speedup  acceptance  draft ms/step  verify ms/step  predicted at alpha "
        "0.6 / 0.7 / 0.8 / 0.9\n");
    nlohmann::json runs = nlohmann::json::array();
    for (const int64_t gamma : {2, 4, 6}) {
      if (gamma + 1 > options.max_verify_tokens) break;
      const RequestStats stats = decode_with(SpeculationMethod::kDraftModel, gamma);
      const double tps = 1e3 * static_cast<double>(stats.tokens_generated) / stats.total_ms;
      const double steps = static_cast<double>(std::max<int64_t>(stats.steps, 1));
      const double v = verify_ratio[static_cast<size_t>(gamma + 1)];
      std::printf("%5lld  %8.1f  %6.2fx  %10.3f  %13.3f  %14.3f  %.2fx / %.2fx / %.2fx / %.2fx\n",
                  static_cast<long long>(gamma), tps, tps / alone_tps, stats.acceptance_rate,
                  stats.draft_ms / steps, stats.target_ms / steps,
                  predicted_speedup(0.6, gamma, c, v), predicted_speedup(0.7, gamma, c, v),
                  predicted_speedup(0.8, gamma, c, v), predicted_speedup(0.9, gamma, c, v));
      runs.push_back({{"gamma", gamma},
                      {"tokens_per_second", tps},
                      {"speedup", tps / alone_tps},
                      {"acceptance", stats.acceptance_rate},
                      {"draft_ms_per_step", stats.draft_ms / steps},
                      {"target_ms_per_step", stats.target_ms / steps},
                      {"predicted_speedup_alpha_0.8", predicted_speedup(0.8, gamma, c, v)}});
    }
    results["generation"] = {{"target_alone_tokens_per_second", alone_tps}, {"speculative", runs}};
    least_free = std::min(least_free, free_memory(*backend));
  }
  if (free_at_start != 0) {
    // What the models took: weights, KV caches, workspaces and the backend's scratch, at their
    // largest (the CUDA context and the copy buffers measured before are not in it).
    const uint64_t used = free_at_start - least_free;
    std::printf(
        "device memory taken by the models (weights, KV caches of %lld tokens, "
        "workspaces): %s of %s free at the start\n",
        static_cast<long long>(model_options.kv_cache_tokens), bytes_text(double(used)).c_str(),
        bytes_text(double(free_at_start)).c_str());
    results["memory"] = {{"free_at_start_bytes", free_at_start},
                         {"models_bytes", used},
                         {"kv_cache_tokens", model_options.kv_cache_tokens}};
  }
  if (!options.json_path.empty()) std::ofstream(options.json_path) << results.dump(2) << "\n";
  return 0;
}

}  // namespace specrun::tools
