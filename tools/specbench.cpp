// specbench: CPU prefill and decode throughput of a model, with the machine's memory copy
// bandwidth measured in the same run as the baseline for decode (a decode step reads every weight
// once, so weight bytes over copy bandwidth is its floor).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/model/model.h"
#include "runtime/sampling/rng.h"
#include "tools/cli_support.h"
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
  double read;  // bytes read per second, summing a buffer: the floor of a weight-streaming step
  double copy;  // bytes read + written per second by memcpy
};

// Measured over a buffer far larger than the caches, every thread of the pool on its share: the
// same threads decode uses. Median of `repeats` runs after a warm-up.
Bandwidth measure_bandwidth(specrun::kernels::cpu::ThreadPool& pool, size_t bytes, int repeats) {
  std::vector<uint64_t> source(bytes / sizeof(uint64_t), 1), destination(source.size(), 0);
  const int64_t words = static_cast<int64_t>(source.size());
  std::vector<double> read_seconds, copy_seconds;
  std::atomic<uint64_t> checksum{0};  // keeps the reads from being optimised away
  for (int r = 0; r < repeats + 1; ++r) {
    auto start = Clock::now();
    pool.parallel_for(words, 1 << 17, [&](int64_t begin, int64_t end) {
      uint64_t lanes[8] = {};
      for (int64_t i = begin; i + 8 <= end; i += 8) {
        for (int l = 0; l < 8; ++l) lanes[l] += source[static_cast<size_t>(i + l)];
      }
      uint64_t sum = 0;
      for (const uint64_t lane : lanes) sum += lane;
      checksum += sum;
    });
    const double read_time = milliseconds(start) / 1e3;
    start = Clock::now();
    pool.parallel_for(words, 1 << 17, [&](int64_t begin, int64_t end) {
      std::memcpy(destination.data() + begin, source.data() + begin,
                  static_cast<size_t>(end - begin) * sizeof(uint64_t));
    });
    const double copy_time = milliseconds(start) / 1e3;
    if (r == 0) continue;  // warm-up
    read_seconds.push_back(read_time);
    copy_seconds.push_back(copy_time);
  }
  if (checksum.load() == 0) std::fprintf(stderr, "specbench: read check failed\n");
  return {static_cast<double>(bytes) / median(read_seconds),
          2.0 * static_cast<double>(bytes) / median(copy_seconds)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  int threads = 0;
  int64_t prompt_tokens = 256;
  int64_t decode_tokens = 64;
  int repeats = 5;
  std::string json_path;
  CLI::App app{"specbench: CPU prefill and decode throughput"};
  app.add_option("--model", model_path,
                 "Checkpoint to measure (default: a generated ~100M-parameter Llama-shaped model)");
  app.add_option("--threads", threads, "CPU threads; 0 uses every core")->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "Prefill length")->capture_default_str();
  app.add_option("--decode-tokens", decode_tokens, "Decode steps per run")->capture_default_str();
  app.add_option("--repeats", repeats, "Measured runs (after one warm-up); the median is reported")
      ->capture_default_str();
  app.add_option("--json", json_path, "Also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  return specrun::tools::run_reporting_errors("specbench", "warn", [&] {
    if (prompt_tokens < 1 || decode_tokens < 1 || repeats < 1) {
      throw specrun::Error("--prompt-tokens, --decode-tokens and --repeats must be positive");
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
    specrun::kernels::cpu::CpuBackend backend(pool);
    specrun::ModelOptions model_options;
    model_options.kv_cache_tokens = prompt_tokens + decode_tokens + 16;
    const auto model = specrun::Model::load(model_path, backend, model_options);
    const specrun::ModelConfig& config = model->config();

    // Weight bytes a decode step reads: every tensor once (a tied table counted once).
    uint64_t weight_bytes = 0;
    for (const auto* info : specrun::open_checkpoint(model_path).tensors.all()) {
      weight_bytes += info->size_bytes();
    }

    specrun::Rng rng(7);
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
    for (int32_t& token : prompt) {
      token = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(config.vocab_size));
    }
    specrun::KvCache& cache = model->kv_cache();
    specrun::Logits logits;

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
    const Bandwidth bandwidth = measure_bandwidth(*pool, size_t{512} << 20, 5);
    const double prefill_tps = 1e3 * static_cast<double>(prompt_tokens) / median(prefill_ms);
    const double step_ms = median(decode_ms);
    const double decode_tps = 1e3 / step_ms;
    const double decode_bandwidth = static_cast<double>(weight_bytes) / (step_ms / 1e3);
    // A decode step reads every weight once: its floor is weight bytes at the read bandwidth.
    const double floor_ms = 1e3 * static_cast<double>(weight_bytes) / bandwidth.read;

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
    std::printf("machine: %s, %d threads\n", cpu, pool->num_threads());
    std::printf("model: %s, %.1fM parameters, %.1f MiB of weights\n", model_path.c_str(),
                static_cast<double>(model->parameter_count()) / 1e6,
                static_cast<double>(weight_bytes) / (1 << 20));
    std::printf("prefill: %lld tokens in %.1f ms: %.1f tokens/s (median of %d)\n",
                static_cast<long long>(prompt_tokens), median(prefill_ms), prefill_tps, repeats);
    std::printf("decode: %.2f ms/token: %.1f tokens/s (median step, %lld steps x %d runs)\n",
                step_ms, decode_tps, static_cast<long long>(decode_tokens), repeats);
    std::printf("memory: read %.1f GB/s, copy %.1f GB/s (read + write), measured in this run\n",
                bandwidth.read / 1e9, bandwidth.copy / 1e9);
    std::printf(
        "decode reads weights at %.1f GB/s: %.0f%% of the read bandwidth (floor %.2f "
        "ms/token), %.0f%% of the copy bandwidth\n",
        decode_bandwidth / 1e9, 100.0 * decode_bandwidth / bandwidth.read, floor_ms,
        100.0 * decode_bandwidth / bandwidth.copy);
    if (!json_path.empty()) {
      const nlohmann::json results = {{"machine", cpu},
                                      {"threads", pool->num_threads()},
                                      {"parameters", model->parameter_count()},
                                      {"weight_bytes", weight_bytes},
                                      {"prompt_tokens", prompt_tokens},
                                      {"prefill_ms", median(prefill_ms)},
                                      {"prefill_tokens_per_second", prefill_tps},
                                      {"decode_ms_per_token", step_ms},
                                      {"decode_tokens_per_second", decode_tps},
                                      {"read_bandwidth_bytes_per_second", bandwidth.read},
                                      {"copy_bandwidth_bytes_per_second", bandwidth.copy},
                                      {"decode_fraction_of_floor", floor_ms / step_ms}};
      std::ofstream(json_path) << results.dump(2) << "\n";
    }
    if (!generated.empty()) std::filesystem::remove_all(generated);
    return 0;
  });
}
