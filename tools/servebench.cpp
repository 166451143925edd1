// servebench: serving throughput and per-request latency of the embedded engine (the public C++
// API) at several concurrencies, with speculation off and on, on the same requests in the same
// run. A closed loop: `concurrency` client threads each submit a request, wait for it, and submit
// the next, until the level's requests are done. Requests are greedy with a fixed length, so both
// modes produce the same tokens and only the time differs.
//
//   servebench [--target T --draft D] [--concurrency 1,4,16,64] [--max-tokens 64]
//   servebench --target T [--draft D] --shared-prefix 1000
//   servebench --http http://127.0.0.1:8000 [--concurrency 1,4,16] [--duration 20]
//
// Without --target it runs the bundled pair (models/pycode-*) on its sample prompts. With
// --shared-prefix N every request starts with the same N-token system prompt, and the levels
// compare the prefix cache off and on (speculation as configured: on with a draft) instead. With
// --http it loads a running `specrun serve` instead of an embedded engine: N streaming clients for
// a fixed time per level, speculation off and on per request, every stream checked complete.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "specrun/specrun.hpp"
#include "tools/bundled_pair.h"
#include "tools/cli_support.h"

namespace {

using Clock = std::chrono::steady_clock;

double milliseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(rank, values.size() - 1)];
}

double mean(const std::vector<double>& values) {
  double total = 0;
  for (const double value : values) total += value;
  return values.empty() ? 0.0 : total / static_cast<double>(values.size());
}

struct Options {
  std::string target;                             // checkpoint; "" for the bundled pair
  std::string draft;                              // draft checkpoint
  std::vector<int> concurrency = {1, 4, 16, 64};  // client threads per level
  int64_t requests = 0;                           // per level; 0: max(16, 2 * concurrency)
  int64_t max_tokens = 64;                        // tokens per request (EOS ignored)
  int threads = 0;                                // CPU threads of the engine
  int64_t kv_cache_tokens = 0;                    // 0: room for the largest level at once
  int64_t shared_prefix = 0;  // tokens of a system prompt every request starts with; 0: none
  std::string http;           // a running server's base URL: load it over HTTP instead
  double duration = 20.0;     // with --http: seconds each level runs
  std::string json;           // also write the figures here
};

// What one level compares: speculation off and on, or (with a shared prefix) the prefix cache.
struct Mode {
  bool speculative = false;  // the draft proposes
  bool prefix_cache = true;  // prompts start from cached blocks
};

struct Level {
  int concurrency = 0;
  Mode mode;
  int64_t requests = 0;
  int64_t tokens = 0;
  double seconds = 0;
  std::vector<double> latency_ms;  // per request, submit to finish
  std::vector<double> ttft_ms;     // per request
  double acceptance = 0;
  double mean_batch = 0;
  double drafts_per_step = 0;  // drafts verified per batched step, over the whole batch
  double draft_share = 0;      // of the wall time, spent drafting
  double cache_hit_rate = 0;   // prompt tokens taken from the prefix cache / prompt tokens
};

// A request's prompt: the shared system prompt's ids (BOS first), then the user prompt's without
// its BOS; or the user prompt as text when there is no shared prefix.
specrun::Request make_request(const specrun::Engine& engine, const std::vector<int32_t>& system,
                              const std::string& prompt) {
  specrun::Request request;
  if (system.empty()) {
    request.prompt = prompt;
    return request;
  }
  request.prompt_ids = system;
  for (const int32_t id : engine.tokenize(prompt, /*add_special_tokens=*/false)) {
    request.prompt_ids.push_back(id);
  }
  return request;
}

// Exactly `count` token ids of ordinary text (the prompts repeated), BOS first.
std::vector<int32_t> system_prompt(const specrun::Engine& engine,
                                   const std::vector<std::string>& prompts, int64_t count) {
  std::string text = "You are a careful assistant. Answer briefly and exactly.\n";
  std::vector<int32_t> ids = engine.tokenize(text);
  for (size_t i = 0; static_cast<int64_t>(ids.size()) < count; ++i) {
    text += prompts[i % prompts.size()] + "\n";
    ids = engine.tokenize(text);
  }
  ids.resize(static_cast<size_t>(count));
  return ids;
}

Level run_level(const Options& options, const std::vector<std::string>& prompts, int concurrency,
                Mode mode) {
  specrun::EngineConfig config;
  config.target = options.target;
  config.draft = options.draft;
  config.threads = options.threads;
  config.max_batch = 64;
  config.kv_cache_tokens = options.kv_cache_tokens;
  config.prefix_cache = mode.prefix_cache;
  config.sampling.temperature = 0.0f;
  config.sampling.max_tokens = options.max_tokens;
  config.sampling.stop_at_eos = false;
  config.speculation.method = mode.speculative ? specrun::SpeculationMethod::kDraftModel
                                               : specrun::SpeculationMethod::kNone;
  const auto engine = specrun::Engine::create(config);
  const std::vector<int32_t> system = options.shared_prefix > 0
                                          ? system_prompt(*engine, prompts, options.shared_prefix)
                                          : std::vector<int32_t>{};

  // Warm-up: page the weights in and let the controller measure a first step (with a shared
  // prefix, its first computation: in both modes, every measured request comes after it).
  engine->submit(make_request(*engine, system, prompts.front())).wait();

  Level level;
  level.concurrency = concurrency;
  level.mode = mode;
  level.requests = options.requests > 0 ? options.requests : std::max(16, 2 * concurrency);
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  const specrun::EngineStats before = engine->stats();
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (int64_t i = next++; i < level.requests; i = next++) {
        // With a shared system prompt each request's own part differs (as users' questions do),
        // so only the system prompt can come from the cache.
        std::string prompt = prompts[static_cast<size_t>(i) % prompts.size()];
        if (!system.empty()) prompt = "Request " + std::to_string(i) + ": " + prompt;
        const specrun::Result result = engine->submit(make_request(*engine, system, prompt)).wait();
        std::lock_guard lock(mutex);
        level.tokens += static_cast<int64_t>(result.tokens.size());
        level.latency_ms.push_back(result.stats.total_ms);
        level.ttft_ms.push_back(result.stats.ttft_ms);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  level.seconds = milliseconds(start, Clock::now()) / 1e3;
  const specrun::EngineStats after = engine->stats();
  const int64_t drafted = after.drafted - before.drafted;
  level.acceptance =
      drafted > 0 ? static_cast<double>(after.accepted - before.accepted) / double(drafted) : 0.0;
  const int64_t steps = after.steps - before.steps;
  level.drafts_per_step = steps > 0 ? double(drafted) / double(steps) : 0.0;
  level.draft_share = (after.draft_ms - before.draft_ms) / (level.seconds * 1e3);
  const int64_t prompt_tokens = after.prompt_tokens - before.prompt_tokens;
  level.cache_hit_rate =
      prompt_tokens > 0
          ? double(after.cached_prompt_tokens - before.cached_prompt_tokens) / double(prompt_tokens)
          : 0.0;
  level.mean_batch =
      steps > 0
          ? (after.mean_batch * double(after.steps) - before.mean_batch * double(before.steps)) /
                double(steps)
          : 0.0;
  return level;
}

std::vector<std::string> sample_prompts(const std::filesystem::path& samples) {
  std::vector<std::string> prompts;
  std::ifstream stream(samples);
  if (stream) {
    const nlohmann::json json = nlohmann::json::parse(stream);
    for (const auto& prompt : json.at("prompts")) prompts.push_back(prompt.at("text"));
  }
  if (prompts.empty()) prompts.push_back("def main():\n");
  return prompts;
}

// The prefix cache off and on at each concurrency, every request starting with the same system
// prompt; speculation as configured (on with a draft).
int run_shared_prefix(const Options& options, const std::vector<std::string>& prompts) {
  const bool speculative = !options.draft.empty();
  std::printf(
      "servebench: %s%s%s, greedy, %lld tokens per request, every prompt starting with the same "
      "%lld-token system prompt\n",
      options.target.c_str(), speculative ? " with draft " : "", options.draft.c_str(),
      static_cast<long long>(options.max_tokens), static_cast<long long>(options.shared_prefix));
  std::printf(
      "| clients | prefix cache | requests | tokens/s | vs off | TTFT mean ms | TTFT p50 | TTFT "
      "p99 | TTFT off / on | latency mean ms | prompt tokens from cache |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json report = nlohmann::json::array();
  for (const int concurrency : options.concurrency) {
    double off_rate = 0, off_ttft = 0;
    for (const bool cache : {false, true}) {
      const Level level = run_level(options, prompts, concurrency, Mode{speculative, cache});
      const double rate = double(level.tokens) / level.seconds;
      const double ttft = mean(level.ttft_ms);
      if (!cache) {
        off_rate = rate;
        off_ttft = ttft;
      }
      std::printf("| %d | %s | %lld | %.1f | %.2fx | %.1f | %.1f | %.1f | %s | %.1f | %.0f%% |\n",
                  concurrency, cache ? "on" : "off", static_cast<long long>(level.requests), rate,
                  rate / off_rate, ttft, percentile(level.ttft_ms, 0.5),
                  percentile(level.ttft_ms, 0.99),
                  cache ? (std::to_string(off_ttft / ttft).substr(0, 5) + "x").c_str() : "-",
                  mean(level.latency_ms), 100.0 * level.cache_hit_rate);
      std::fflush(stdout);
      report.push_back({{"concurrency", concurrency},
                        {"prefix_cache", cache},
                        {"speculative", speculative},
                        {"shared_prefix_tokens", options.shared_prefix},
                        {"requests", level.requests},
                        {"tokens", level.tokens},
                        {"seconds", level.seconds},
                        {"tokens_per_second", rate},
                        {"ttft_ms_mean", ttft},
                        {"ttft_ms_p50", percentile(level.ttft_ms, 0.5)},
                        {"ttft_ms_p99", percentile(level.ttft_ms, 0.99)},
                        {"latency_ms_mean", mean(level.latency_ms)},
                        {"prefix_cache_hit_rate", level.cache_hit_rate}});
    }
  }
  if (!options.json.empty()) std::ofstream(options.json) << report.dump(2) << "\n";
  return 0;
}

// ---- over HTTP --------------------------------------------------------------------------------

struct HttpLevel {
  int64_t requests = 0;                // streams completed
  int64_t errors = 0;                  // non-200 replies and broken connections
  int64_t incomplete = 0;              // 200 streams without a finish_reason and [DONE]
  int64_t tokens = 0;                  // completion tokens, from the usage chunks
  std::vector<double> ttft_ms;         // request sent to first text
  std::vector<double> inter_token_ms;  // between texts of one stream
  double seconds = 0;
};

// One streamed completion; its figures go into `level` (under `mutex`).
void stream_one(httplib::Client& client, const std::string& body, HttpLevel& level,
                std::mutex& mutex) {
  const auto sent = Clock::now();
  std::optional<Clock::time_point> last;
  std::vector<double> gaps;
  double ttft = -1;
  std::string pending;
  bool finished = false, done = false;
  int64_t tokens = 0;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = body;
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    pending.append(data, size);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // keep-alive comments
      if (event == "data: [DONE]") {
        done = true;
        continue;
      }
      const nlohmann::json chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        tokens = chunk["usage"].value("completion_tokens", int64_t{0});
      }
      if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
      const nlohmann::json& choice = chunk["choices"][0];
      if (!choice["finish_reason"].is_null()) finished = true;
      if (choice.value("text", std::string()).empty()) continue;
      const auto now = Clock::now();
      if (last) {
        gaps.push_back(milliseconds(*last, now));
      } else {
        ttft = milliseconds(sent, now);
      }
      last = now;
    }
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  const bool sent_ok = client.send(request, response, error);
  std::lock_guard lock(mutex);
  if (!sent_ok || response.status != 200) {
    level.errors += 1;
    return;
  }
  if (!finished || !done) {
    level.incomplete += 1;
    return;
  }
  level.requests += 1;
  level.tokens += tokens;
  if (ttft >= 0) level.ttft_ms.push_back(ttft);
  level.inter_token_ms.insert(level.inter_token_ms.end(), gaps.begin(), gaps.end());
}

HttpLevel run_http_level(const Options& options, const std::string& model,
                         const std::vector<std::string>& prompts, int concurrency,
                         bool speculative) {
  HttpLevel level;
  std::mutex mutex;
  std::atomic<int64_t> next{0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(options.duration));
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      httplib::Client client(options.http);
      client.set_read_timeout(600, 0);
      while (Clock::now() < deadline) {
        const int64_t i = next++;
        nlohmann::json body = {{"model", model},
                               {"prompt", prompts[static_cast<size_t>(i) % prompts.size()]},
                               {"max_tokens", options.max_tokens},
                               {"temperature", 0},
                               {"stream", true},
                               {"stream_options", {{"include_usage", true}}}};
        if (!speculative) body["speculative"] = false;
        stream_one(client, body.dump(), level, mutex);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  level.seconds = milliseconds(start, Clock::now()) / 1e3;
  return level;
}

// Loads a running server: each level's streaming clients, speculation off and on; fails (after
// the report) when any stream failed or was incomplete.
int run_http(const Options& options, const std::vector<std::string>& prompts) {
  if (options.duration <= 0 || options.duration > 3600) {
    throw specrun::Error("--duration must be in (0, 3600] seconds");
  }
  for (const int concurrency : options.concurrency) {
    if (concurrency < 1 || concurrency > 1024) {
      throw specrun::Error("--concurrency: each level must be in [1, 1024]");
    }
  }
  httplib::Client probe(options.http);
  const auto models = probe.Get("/v1/models");
  if (!models || models->status != 200) {
    throw specrun::Error("--http: no specrun serve answers at " + options.http + "/v1/models");
  }
  const nlohmann::json listed = nlohmann::json::parse(models->body, nullptr, false);
  if (listed.is_discarded() || !listed.contains("data") || listed["data"].empty()) {
    throw specrun::Error("--http: " + options.http + " lists no model (still loading?)");
  }
  const std::string model = listed["data"][0]["id"];
  std::printf(
      "servebench: %s (model %s) over HTTP, greedy streams of %lld tokens, %.0f s a level\n",
      options.http.c_str(), model.c_str(), static_cast<long long>(options.max_tokens),
      options.duration);
  std::printf(
      "| clients | speculation | streams | errors | incomplete | tokens/s | vs off | TTFT p50 ms | "
      "TTFT p99 | ITL p50 ms | ITL p99 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json report = nlohmann::json::array();
  int64_t failures = 0;
  for (const int concurrency : options.concurrency) {
    double off_rate = 0;
    for (const bool speculative : {false, true}) {
      const HttpLevel level = run_http_level(options, model, prompts, concurrency, speculative);
      const double rate = double(level.tokens) / level.seconds;
      if (!speculative) off_rate = rate;
      failures += level.errors + level.incomplete;
      std::printf("| %d | %s | %lld | %lld | %lld | %.1f | %.2fx | %.1f | %.1f | %.2f | %.2f |\n",
                  concurrency, speculative ? "on" : "off", static_cast<long long>(level.requests),
                  static_cast<long long>(level.errors), static_cast<long long>(level.incomplete),
                  rate, off_rate > 0 ? rate / off_rate : 0.0, percentile(level.ttft_ms, 0.5),
                  percentile(level.ttft_ms, 0.99), percentile(level.inter_token_ms, 0.5),
                  percentile(level.inter_token_ms, 0.99));
      std::fflush(stdout);
      report.push_back({{"concurrency", concurrency},
                        {"speculative", speculative},
                        {"streams", level.requests},
                        {"errors", level.errors},
                        {"incomplete", level.incomplete},
                        {"seconds", level.seconds},
                        {"tokens_per_second", rate},
                        {"ttft_ms_p50", percentile(level.ttft_ms, 0.5)},
                        {"ttft_ms_p99", percentile(level.ttft_ms, 0.99)},
                        {"itl_ms_p50", percentile(level.inter_token_ms, 0.5)},
                        {"itl_ms_p99", percentile(level.inter_token_ms, 0.99)}});
    }
  }
  if (!options.json.empty()) std::ofstream(options.json) << report.dump(2) << "\n";
  if (failures > 0) {
    throw specrun::Error(std::to_string(failures) + " streams failed or were incomplete");
  }
  return 0;
}

int run(Options options) {
  std::filesystem::path samples;
  if (!options.http.empty()) {
    const auto pair = specrun::tools::find_bundled_pair();
    return run_http(options, sample_prompts(pair ? pair->target.parent_path() / "samples.json"
                                                 : std::filesystem::path()));
  }
  if (options.target.empty()) {
    const auto pair = specrun::tools::find_bundled_pair();
    if (!pair) throw specrun::Error("no --target given and the bundled pair was not found");
    options.target = pair->target.string();
    options.draft = pair->draft.string();
    samples = pair->target.parent_path() / "samples.json";
  }
  if (options.draft.empty() && options.shared_prefix == 0) {
    throw specrun::Error("--draft is required with --target (without --shared-prefix)");
  }
  const std::vector<std::string> prompts = sample_prompts(samples);
  if (options.kv_cache_tokens == 0) {
    // Every client of the largest level in flight at once, prompts of a few hundred tokens.
    const int most = *std::max_element(options.concurrency.begin(), options.concurrency.end());
    options.kv_cache_tokens =
        std::min<int64_t>(65536, static_cast<int64_t>(most) *
                                     (512 + options.shared_prefix + options.max_tokens + 16));
  }
  if (options.shared_prefix > 0) return run_shared_prefix(options, prompts);

  std::printf("servebench: %s with draft %s, greedy, %lld tokens per request\n",
              options.target.c_str(), options.draft.c_str(),
              static_cast<long long>(options.max_tokens));
  std::printf(
      "| clients | speculation | requests | tokens/s | speedup | latency mean ms | "
      "p50 | p99 | TTFT mean ms | acceptance | drafts/step | drafting | mean batch |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json report = nlohmann::json::array();
  for (const int concurrency : options.concurrency) {
    double plain_rate = 0;
    for (const bool speculative : {false, true}) {
      const Level level = run_level(options, prompts, concurrency, Mode{speculative, true});
      const double rate = double(level.tokens) / level.seconds;
      if (!speculative) plain_rate = rate;
      std::printf(
          "| %d | %s | %lld | %.1f | %s | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %.1f |\n",
          concurrency, speculative ? "on" : "off", static_cast<long long>(level.requests), rate,
          speculative ? (std::to_string(rate / plain_rate).substr(0, 4) + "x").c_str() : "1.00x",
          mean(level.latency_ms), percentile(level.latency_ms, 0.5),
          percentile(level.latency_ms, 0.99), mean(level.ttft_ms),
          speculative ? std::to_string(level.acceptance).substr(0, 5).c_str() : "-",
          speculative ? std::to_string(level.drafts_per_step).substr(0, 4).c_str() : "-",
          speculative ? (std::to_string(100.0 * level.draft_share).substr(0, 4) + "%").c_str()
                      : "-",
          level.mean_batch);
      std::fflush(stdout);
      report.push_back({{"concurrency", concurrency},
                        {"speculative", speculative},
                        {"requests", level.requests},
                        {"tokens", level.tokens},
                        {"seconds", level.seconds},
                        {"tokens_per_second", rate},
                        {"latency_ms_mean", mean(level.latency_ms)},
                        {"latency_ms_p50", percentile(level.latency_ms, 0.5)},
                        {"latency_ms_p99", percentile(level.latency_ms, 0.99)},
                        {"ttft_ms_mean", mean(level.ttft_ms)},
                        {"acceptance_rate", level.acceptance},
                        {"drafts_per_step", level.drafts_per_step},
                        {"draft_share", level.draft_share},
                        {"mean_batch", level.mean_batch}});
    }
  }
  if (!options.json.empty()) std::ofstream(options.json) << report.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{
      "servebench: throughput and latency of the embedded engine by concurrency, with "
      "speculation off and on"};
  app.add_option("--target", options.target, "Target checkpoint (default: the bundled pair)");
  app.add_option("--draft", options.draft, "Draft checkpoint");
  app.add_option("--concurrency", options.concurrency, "Client counts to measure")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--requests", options.requests,
                 "Requests per level (default: max(16, 2 x clients))");
  app.add_option("--max-tokens", options.max_tokens, "Tokens per request")->capture_default_str();
  app.add_option("--threads", options.threads, "CPU threads; 0 uses every core");
  app.add_option("--kv-cache-tokens", options.kv_cache_tokens,
                 "KV capacity per model (default: room for the largest level at once)");
  app.add_option("--shared-prefix", options.shared_prefix,
                 "Start every request with the same system prompt of this many tokens, and "
                 "compare the prefix cache off and on instead of speculation");
  app.add_option("--http", options.http,
                 "Load a running specrun serve at this base URL (http://HOST:PORT) with streaming "
                 "clients instead of an embedded engine");
  app.add_option("--duration", options.duration, "With --http: seconds each level runs")
      ->capture_default_str();
  app.add_option("--json", options.json, "Also write the figures as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  return specrun::tools::run_reporting_errors("servebench", "warn", [&] { return run(options); });
}
