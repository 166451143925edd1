// The public C++ API (specrun/specrun.hpp) on a generated layer-skip pair: many threads submitting
// mixed requests get exactly what each request gets alone; streams add up to results; text comes
// in whole characters; cancellation and shutdown finish every request and free the KV cache; bad
// configs and requests are one clear Error; EngineConfig::from_toml.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/cpu/matmul.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "specrun/chat.hpp"
#include "specrun/specrun.hpp"
#include "tests/gguf_writer.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// True when `text` is well-formed UTF-8 (no split or invalid sequence).
bool valid_utf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    size_t length = byte < 0x80           ? 1
                    : (byte >> 5) == 0x6  ? 2
                    : (byte >> 4) == 0xE  ? 3
                    : (byte >> 3) == 0x1E ? 4
                                          : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

SamplingSettings greedy(int64_t max_tokens, bool stop_at_eos = false) {
  SamplingSettings sampling;
  sampling.temperature = 0.0f;
  sampling.max_tokens = max_tokens;
  sampling.stop_at_eos = stop_at_eos;
  return sampling;
}

// Every event of one request, as its callback or next() saw them.
struct Stream {
  std::vector<Event> events;  // in delivery order
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> all;
    for (const Event& event : events)
      all.insert(all.end(), event.tokens.begin(), event.tokens.end());
    return all;
  }
  std::string text() const {
    std::string all;
    for (const Event& event : events) all += event.text;
    return all;
  }
};

// Checks that a stream is well formed and adds up to the result: one final event, last.
void expect_stream_matches(const Stream& stream, const Result& result) {
  ASSERT_FALSE(stream.events.empty());
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) EXPECT_FALSE(stream.events[i].finished);
  const Event& last = stream.events.back();
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.reason, result.reason);
  for (const Event& event : stream.events) EXPECT_EQ(event.request, result.request);
  EXPECT_EQ(stream.tokens(), result.tokens);
  EXPECT_EQ(stream.text(), result.text);
}

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_layer_skip_pair(dir_.path()); }

  EngineConfig config(bool with_draft = true) const {
    EngineConfig config;
    config.target = (dir_ / "target").string();
    if (with_draft) config.draft = (dir_ / "draft").string();
    config.threads = 2;
    config.kv_cache_tokens = 4096;
    config.max_batch = 32;
    return config;
  }

  // Greedy decoding on a model of its own (the engine's must not be shared): what any greedy
  // request must produce, whatever the batch, the method or gamma.
  std::pair<std::vector<int32_t>, FinishReason> greedy_alone(const std::vector<int32_t>& prompt,
                                                             const SamplingSettings& sampling) {
    if (!reference_) reference_ = Model::load(dir_ / "target", *backend_);
    SamplingSettings reference = sampling;
    reference.temperature = 0.0f;
    const testing::ReferenceRun result = testing::reference_decode(*reference_, prompt, reference);
    return {result.tokens, result.reason};
  }

  // Polls the engine's figures until `done` holds (at most 5 s): the batch engine counts a step
  // after delivering its updates, so they may lag the last result a moment.
  template <typename Done>
  static EngineStats poll_stats(const Engine& engine, Done done) {
    EngineStats stats = engine.stats();
    for (int i = 0; i < 500 && !done(stats); ++i) {
      std::this_thread::sleep_for(10ms);
      stats = engine.stats();
    }
    return stats;
  }
  static EngineStats wait_until_idle(const Engine& engine) {
    return poll_stats(engine, [](const EngineStats& stats) {
      return stats.running == 0 && stats.waiting == 0 && stats.finished == stats.submitted &&
             stats.kv_tokens_free == stats.kv_tokens_capacity;
    });
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::Backend> backend_ = testing::make_engine_cpu_backend(1);
  std::unique_ptr<Model> reference_;
};

// One request of the concurrent mix.
struct Spec {
  Request request;       // what is submitted
  bool pull = false;     // next() rather than a callback
  bool sampled = false;  // temperature > 0
};

std::vector<Spec> mixed_requests(int count) {
  std::vector<Spec> specs;
  const SpeculationMethod methods[] = {SpeculationMethod::kDraftModel,
                                       SpeculationMethod::kPromptLookup, SpeculationMethod::kNone};
  const GammaControl controllers[] = {GammaControl::kGoodput, GammaControl::kHeuristic,
                                      GammaControl::kFixed};
  for (int i = 0; i < count; ++i) {
    Spec spec;
    // Prompts differ from request to request, so a result delivered to the wrong request shows.
    std::vector<int32_t> prompt = {1, 3 + (i * 7) % 250, 3 + (i * 13) % 250};
    for (int k = 0; k < i % 5; ++k) prompt.push_back(3 + (i + 11 * k) % 250);
    spec.request.prompt_ids = prompt;
    spec.sampled = i % 2 == 1;
    SamplingSettings sampling = greedy(4 + i % 29, /*stop_at_eos=*/i % 3 == 0);
    if (spec.sampled) {
      sampling.temperature = 0.6f + 0.1f * static_cast<float>(i % 5);
      sampling.top_k = i % 4 == 1 ? 40 : 0;
      sampling.top_p = i % 4 == 3 ? 0.9f : 1.0f;
      sampling.seed = 1000 + static_cast<uint64_t>(i);
    }
    SpeculationSettings speculation;
    speculation.method = methods[i % 3];
    // Sampled output follows the request's own random numbers. With shared noise (the default) it
    // does not depend on how the steps drafted, so any controller goes; with rejection sampling it
    // does, and the goodput controller's batch-wide choice of gamma would make it depend on the
    // batch: those requests use controllers that decide from the request alone.
    const bool rejection = spec.sampled && i % 4 == 3;
    if (rejection) speculation.verification = Verification::kRejection;
    speculation.controller = rejection ? controllers[1 + (i / 2) % 2] : controllers[(i / 3) % 3];
    speculation.gamma = 1 + i % 6;
    speculation.gamma_min = speculation.controller == GammaControl::kFixed ? speculation.gamma : 0;
    spec.request.sampling = sampling;
    spec.request.speculation = speculation;
    spec.pull = (i / 2) % 2 == 0;
    specs.push_back(std::move(spec));
  }
  return specs;
}

TEST_F(ApiTest, ConcurrentMixedRequestsEqualTheSameRequestsRunAlone) {
  constexpr int kRequests = 256;
  constexpr int kThreads = 32;
  const std::vector<Spec> specs = mixed_requests(kRequests);
  std::vector<Result> results(kRequests);
  std::vector<Stream> streams(kRequests);
  std::vector<uint64_t> ids(kRequests);
  {
    const auto engine = Engine::create(config());
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<std::pair<int, RequestHandle>> handles;
        for (int i = t; i < kRequests; i += kThreads) {
          Stream* stream = &streams[static_cast<size_t>(i)];
          StreamCallback callback;
          if (!specs[static_cast<size_t>(i)].pull) {
            callback = [stream](const Event& event) { stream->events.push_back(event); };
          }
          handles.emplace_back(i, engine->submit(specs[static_cast<size_t>(i)].request, callback));
        }
        for (auto& [i, handle] : handles) {
          if (specs[static_cast<size_t>(i)].pull) {
            // Until the final event (a request queued behind the others may wait long for its
            // first one on a loaded machine).
            while (std::optional<Event> event = handle.next(300s)) {
              const bool finished = event->finished;
              streams[static_cast<size_t>(i)].events.push_back(std::move(*event));
              if (finished) break;
            }
          }
          results[static_cast<size_t>(i)] = handle.wait();
          ids[static_cast<size_t>(i)] = handle.id();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    int64_t tokens = 0;
    for (const Result& result : results) tokens += static_cast<int64_t>(result.tokens.size());
    const EngineStats stats = poll_stats(*engine, [&](const EngineStats& now) {
      return now.tokens_generated == tokens && now.kv_tokens_free == now.kv_tokens_capacity;
    });
    EXPECT_EQ(stats.submitted, kRequests);
    EXPECT_EQ(stats.finished, kRequests);
    EXPECT_GT(stats.mean_batch, 1.0) << "requests from 32 threads should share steps";
    EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);
    EXPECT_EQ(stats.tokens_generated, tokens);
  }

  EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), static_cast<size_t>(kRequests));
  // Sampled requests alone, one at a time, on a fresh engine.
  const auto alone = Engine::create(config());
  int greedy_count = 0, sampled_count = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Spec& spec = specs[static_cast<size_t>(i)];
    const Result& result = results[static_cast<size_t>(i)];
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(result.request, ids[static_cast<size_t>(i)]);
    expect_stream_matches(streams[static_cast<size_t>(i)], result);
    EXPECT_EQ(result.stats.tokens_generated, static_cast<int64_t>(result.tokens.size()));
    EXPECT_EQ(result.stats.prompt_tokens, static_cast<int64_t>(spec.request.prompt_ids.size()));
    if (spec.sampled) {
      const Result expected = alone->submit(spec.request).wait();
      EXPECT_EQ(result.tokens, expected.tokens);
      EXPECT_EQ(result.reason, expected.reason);
      ++sampled_count;
    } else {
      const auto [tokens, reason] = greedy_alone(spec.request.prompt_ids, *spec.request.sampling);
      EXPECT_EQ(result.tokens, tokens);
      EXPECT_EQ(result.reason, reason);
      ++greedy_count;
    }
  }
  EXPECT_EQ(greedy_count, kRequests / 2);
  EXPECT_EQ(sampled_count, kRequests / 2);
}

TEST_F(ApiTest, ResultStatsDescribeTheRequest) {
  const auto engine = Engine::create(config());
  Request request;
  request.prompt_ids = {1, 17, 200};
  request.sampling = greedy(24);
  SpeculationSettings speculation;
  speculation.controller = GammaControl::kFixed;
  speculation.gamma = 3;
  speculation.gamma_min = 3;
  request.speculation = speculation;
  const Result result = engine->submit(request).wait();
  ASSERT_EQ(result.reason, FinishReason::kMaxTokens) << result.error;
  const RequestStats& stats = result.stats;
  EXPECT_EQ(stats.prompt_tokens, 3);
  EXPECT_EQ(stats.tokens_generated, 24);
  EXPECT_GE(stats.queue_ms, 0.0);
  EXPECT_GT(stats.ttft_ms, 0.0);
  EXPECT_LE(stats.ttft_ms, stats.total_ms);
  EXPECT_GT(stats.tokens_per_second, 0.0);
  EXPECT_LE(stats.itl_ms_p50, stats.itl_ms_p99);
  EXPECT_GT(stats.steps, 0);
  EXPECT_GT(stats.drafted, 0);
  EXPECT_LE(stats.accepted, stats.drafted);
  EXPECT_DOUBLE_EQ(stats.acceptance_rate,
                   static_cast<double>(stats.accepted) / static_cast<double>(stats.drafted));
  int64_t steps = 0;
  for (const auto& [gamma, count] : stats.gamma_histogram) {
    EXPECT_LE(gamma, 3);
    steps += count;
  }
  EXPECT_EQ(steps, stats.steps);
  EXPECT_GT(stats.target_ms, 0.0);
  EXPECT_EQ(result.tokens, greedy_alone(request.prompt_ids, *request.sampling).first);
  EXPECT_STREQ(to_string(result.reason), "max_tokens");
  EXPECT_EQ(stats.cached_prompt_tokens, 0);
}

TEST_F(ApiTest, RepeatedPromptsComeFromThePrefixCache) {
  // A 40-token prompt: its first 39 positions go into the cache, 32 of them in whole blocks of
  // 16; a second request finds them. Off, nothing is cached and the output is the same.
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 39; ++i) prompt.push_back(3 + (i * 37) % 250);
  std::vector<std::vector<int32_t>> outputs;
  for (const bool prefix_cache : {true, false}) {
    EngineConfig settings = config();
    settings.prefix_cache = prefix_cache;
    const auto engine = Engine::create(settings);
    Request request;
    request.prompt_ids = prompt;
    request.sampling = greedy(8);
    const Result first = engine->submit(request).wait();
    const Result second = engine->submit(request).wait();
    EXPECT_EQ(first.stats.cached_prompt_tokens, 0);
    EXPECT_EQ(second.stats.cached_prompt_tokens, prefix_cache ? 32 : 0);
    EXPECT_EQ(first.tokens, second.tokens);
    const EngineStats stats = engine->stats();
    EXPECT_EQ(stats.prompt_tokens, 80);
    EXPECT_EQ(stats.cached_prompt_tokens, prefix_cache ? 32 : 0);
    EXPECT_DOUBLE_EQ(stats.prefix_cache_hit_rate, prefix_cache ? 0.4 : 0.0);
    EXPECT_EQ(stats.kv_tokens_cached > 0, prefix_cache);
    EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);
    outputs.push_back(second.tokens);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST_F(ApiTest, EachActivationPrecisionGivesItsOwnBackendsGreedyOutput) {
  // The engine's activations setting reaches the kernels: f32 gives what the exact CPU backend
  // gives alone, bf16 what a backend rounding activations to bf16 gives, speculating or not, on a
  // prompt whose greedy continuations under the two differ; and for a target quantized to INT8,
  // int8 what a backend quantizing activations to int8 gives, on a prompt where it differs from
  // bf16.
  struct Precision {
    ActivationPrecision setting;
    kernels::cpu::Activations activations;
    Quantization quantize;
  };
  const std::pair<Precision, Precision> pairs[] = {
      {{ActivationPrecision::kF32, kernels::cpu::Activations::kF32, Quantization::kNone},
       {ActivationPrecision::kBF16, kernels::cpu::Activations::kBF16, Quantization::kNone}},
      {{ActivationPrecision::kBF16, kernels::cpu::Activations::kBF16, Quantization::kINT8},
       {ActivationPrecision::kInt8, kernels::cpu::Activations::kInt8, Quantization::kINT8}}};
  for (const auto& pair : pairs) {
    const Precision precisions[] = {pair.first, pair.second};
    std::vector<std::unique_ptr<kernels::cpu::CpuBackend>> backends;
    std::vector<std::unique_ptr<Model>> models;
    for (const Precision& precision : precisions) {
      backends.push_back(std::make_unique<kernels::cpu::CpuBackend>(
          std::make_shared<kernels::cpu::ThreadPool>(1), precision.activations));
      ModelOptions options;
      options.quantize =
          precision.quantize == Quantization::kINT8 ? WeightQuantize::kINT8 : WeightQuantize::kNone;
      models.push_back(Model::load(dir_ / "target", *backends.back(), options));
    }
    Request request;
    request.sampling = greedy(32);
    request.sampling->stop_at_eos = false;
    std::vector<std::vector<int32_t>> expected(2);
    for (int32_t first = 3; first < 250 && expected[0] == expected[1]; first += 7) {
      request.prompt_ids = {1, first, 200, 5};
      for (size_t i = 0; i < 2; ++i) {
        expected[i] =
            testing::reference_decode(*models[i], request.prompt_ids, *request.sampling).tokens;
      }
    }
    ASSERT_NE(expected[0], expected[1]) << "no prompt tells two precisions apart";
    for (size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE(std::string(to_string(precisions[i].setting)) + " " +
                   to_string(precisions[i].quantize));
      for (const bool with_draft : {false, true}) {
        EngineConfig settings = config(with_draft);
        settings.activations = precisions[i].setting;
        settings.quantize = precisions[i].quantize;
        const auto engine = Engine::create(settings);
        EXPECT_EQ(engine->submit(request).wait().tokens, expected[i]) << with_draft;
        // And the engine says which it ran, with the kernels' copy.
        EXPECT_EQ(engine->info().activations, to_string(precisions[i].setting));
        EXPECT_EQ(engine->info().cpu_kernels, kernels::cpu::best_matmul_variant().name);
      }
    }
  }
}

TEST_F(ApiTest, OverlappedDraftingIsTheSameOutputAndCountsItsDraftsAhead) {
  // On, the engine drafts ahead and keeps some of those drafts; off and auto (off on the CPU,
  // where nothing runs beside the verification), it never drafts ahead. The tokens are the same.
  // A fixed gamma: the goodput controller decodes plainly where the steps it timed say drafting
  // does not pay, and a step slowed by a busy machine could say so.
  Request request;
  request.prompt_ids = {1, 5, 9, 13};
  request.sampling = greedy(24);
  SpeculationSettings speculation;
  speculation.controller = GammaControl::kFixed;
  speculation.gamma = 3;
  request.speculation = speculation;
  std::vector<std::vector<int32_t>> outputs;
  for (const OverlapDrafting overlap :
       {OverlapDrafting::kOn, OverlapDrafting::kOff, OverlapDrafting::kAuto}) {
    EngineConfig settings = config();
    settings.overlap_drafting = overlap;
    const auto engine = Engine::create(settings);
    outputs.push_back(engine->submit(request).wait().tokens);
    const EngineStats stats = engine->stats();
    if (overlap == OverlapDrafting::kOn) {
      EXPECT_GT(stats.drafted_ahead, 0);
      EXPECT_LE(stats.ahead_taken, stats.drafted_ahead);
    } else {
      EXPECT_EQ(stats.drafted_ahead, 0) << to_string(overlap);
      EXPECT_EQ(stats.ahead_taken, 0) << to_string(overlap);
    }
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
  EXPECT_EQ(outputs[0], greedy_alone(request.prompt_ids, *request.sampling).first);
}

TEST_F(ApiTest, TextStreamsInWholeCharactersAndAddsUpToTheResult) {
  for (const char* model : {"target", "draft"}) {
    testing::write_file(dir_ / model / "tokenizer.json", testing::byte_tokenizer_json());
  }
  // A fixed gamma: how many tokens an event carries then follows from the seeded draws alone.
  // (With the goodput controller it follows the measured step costs, and under ThreadSanitizer a
  // run could draft deep enough that no event ended inside a character.)
  EngineConfig settings = config();
  settings.speculation.controller = GammaControl::kFixed;
  settings.speculation.gamma = 2;
  const auto engine = Engine::create(settings);
  ASSERT_TRUE(engine->info().has_tokenizer);
  // "é" is two bytes and "叫" three: each is several byte-fallback tokens.
  const std::vector<int32_t> ids = engine->tokenize("a\xC3\xA9\xE5\x8F\xAB");
  EXPECT_EQ(ids,
            (std::vector<int32_t>{1, 0x61 + 3, 0xC3 + 3, 0xA9 + 3, 0xE5 + 3, 0x8F + 3, 0xAB + 3}));
  EXPECT_EQ(engine->detokenize(ids), "a\xC3\xA9\xE5\x8F\xAB");  // <s> skipped

  const auto tokenizer = text::Tokenizer::load(dir_ / "target" / "tokenizer.json");
  int held_back = 0;  // events whose tokens end inside a character, so their text waits
  for (int i = 0; i < 16; ++i) {
    Request request;
    request.prompt = "Once upon a time " + std::to_string(i);
    SamplingSettings sampling;
    sampling.temperature = 1.0f;
    sampling.seed = static_cast<uint64_t>(i);
    sampling.max_tokens = 32;
    sampling.stop_at_eos = false;
    request.sampling = sampling;
    Stream stream;
    RequestHandle handle =
        engine->submit(request, [&](const Event& event) { stream.events.push_back(event); });
    const Result result = handle.wait();
    expect_stream_matches(stream, result);
    EXPECT_EQ(result.stats.prompt_tokens,
              static_cast<int64_t>(engine->tokenize(request.prompt).size()));
    // The tokenizer's own streaming over the same ids, in one go: events split nothing and lose
    // nothing. (Not decode() of all the ids: a run of byte tokens that is not UTF-8 turns into
    // one U+FFFD per byte there, even the valid bytes a stream has already shown.)
    text::StreamingDecoder decoder(*tokenizer, /*skip_special_tokens=*/true);
    std::string streamed;
    for (const int32_t token : result.tokens) streamed += decoder.step(token);
    EXPECT_EQ(result.text, streamed + decoder.flush());
    for (const Event& event : stream.events) {
      EXPECT_TRUE(valid_utf8(event.text)) << "a split character in an event";
      if (!event.tokens.empty() && event.text.empty()) ++held_back;
    }
  }
  EXPECT_GT(held_back, 0);
}

// Structured output: sampled text under a JSON schema (and under a GBNF grammar) is a sentence of
// it, ends with the model's end-of-sequence token once complete, and is the same with and without
// speculation (shared noise); logprobs and a logit bias come through the API with it. A schema or
// grammar that does not compile is one error at submit, naming it.
TEST_F(ApiTest, ConstrainedOutputFollowsItsGrammarWithAndWithoutSpeculation) {
  for (const char* model : {"target", "draft"}) {
    testing::write_file(dir_ / model / "tokenizer.json", testing::byte_tokenizer_json());
  }
  const auto engine = Engine::create(config());
  const std::string schema =
      R"({"type": "object", "properties": {"ok": {"type": "boolean"},
          "size": {"enum": ["small", "large"]}, "count": {"type": "integer"}},
          "required": ["ok", "size"]})";
  int64_t accepted = 0, drafted = 0;
  for (int i = 0; i < 6; ++i) {
    Request request;
    request.prompt = "Answer in JSON " + std::to_string(i);
    request.sampling =
        SamplingSettings{.temperature = 1.0f, .seed = static_cast<uint64_t>(i), .max_tokens = 200};
    request.constraint =
        i < 4 ? OutputConstraint{ConstraintKind::kJsonSchema, schema}
              : OutputConstraint{ConstraintKind::kGbnf, "root ::= (\"yes\" | \"no\") \" please\"?"};
    request.logprobs = 2;
    request.logit_bias = {{0x22 + 3, 1.0f}};  // '"' a little more likely
    std::vector<Result> results;
    for (const SpeculationMethod method :
         {SpeculationMethod::kDraftModel, SpeculationMethod::kNone}) {
      request.speculation =
          SpeculationSettings{.method = method, .controller = GammaControl::kFixed, .gamma = 3};
      results.push_back(engine->submit(request).wait());
    }
    const Result& result = results.front();
    accepted += result.stats.accepted;
    drafted += result.stats.drafted;
    EXPECT_EQ(result.tokens, results.back().tokens) << "request " << i;
    ASSERT_EQ(result.reason, FinishReason::kEndOfSequence) << result.text;
    ASSERT_EQ(result.logprobs.size(), result.tokens.size());
    for (size_t t = 0; t < result.logprobs.size(); ++t) {
      EXPECT_EQ(result.logprobs[t].token, result.tokens[t]);
      EXPECT_NEAR(result.logprobs[t].logprob, results.back().logprobs[t].logprob, 1e-5);
    }
    if (i < 4) {
      const nlohmann::json answer = nlohmann::json::parse(result.text);
      ASSERT_TRUE(answer.is_object()) << result.text;
      EXPECT_TRUE(answer.at("ok").is_boolean()) << result.text;
      EXPECT_TRUE(answer.at("size") == "small" || answer.at("size") == "large") << result.text;
      for (const auto& [key, value] : answer.items()) {
        EXPECT_TRUE(key == "ok" || key == "size" || (key == "count" && value.is_number_integer()))
            << result.text;
      }
    } else {
      EXPECT_TRUE(result.text == "yes" || result.text == "no" || result.text == "yes please" ||
                  result.text == "no please")
          << result.text;
    }
  }
  // The draft's rows are masked as the target's, so it drafts what the grammar allows: this pair
  // agrees on most of them (unmasked, its drafts were refused almost every time: 4 of 510).
  EXPECT_GT(accepted * 4, drafted * 3) << accepted << " of " << drafted << " drafts accepted";
  Request bad;
  bad.prompt = "x";
  bad.constraint = {ConstraintKind::kJsonSchema, R"({"type": "object", "not": {}})"};
  testing::expect_error([&] { engine->submit(bad); }, {"request", "not"});
  bad.constraint = {ConstraintKind::kGbnf, "root ::= missing"};
  testing::expect_error([&] { engine->submit(bad); }, {"request", "missing"});
}

// Each event says how many drafts its step verified, how many of its tokens (the first) were drafts
// the target accepted, and how much of its text (the start) those completed: the text a streaming
// decoder gives for the accepted drafts, continuing from the events before. The target drafting
// for itself accepts every draft, so all of an event's tokens but the target's last; without a
// draft none is.
TEST_F(ApiTest, EventsSayWhichOfTheirTokensAndTextCameFromAcceptedDrafts) {
  testing::write_file(dir_ / "target" / "tokenizer.json", testing::byte_tokenizer_json());
  const auto tokenizer = text::Tokenizer::load(dir_ / "target" / "tokenizer.json");
  for (const bool with_draft : {true, false}) {
    SCOPED_TRACE(with_draft ? "the target drafting for itself" : "no draft");
    EngineConfig settings = config(/*with_draft=*/false);
    if (with_draft) settings.draft = settings.target;
    settings.speculation.controller = GammaControl::kFixed;
    settings.speculation.gamma = 3;
    settings.speculation.draft_lookup_ngram = 0;  // the model's drafts alone
    const auto engine = Engine::create(settings);
    Request request;
    request.prompt = "Once upon a time";
    SamplingSettings sampling;
    sampling.temperature = 1.0f;  // random bytes: characters split across tokens and events
    sampling.seed = 5;
    sampling.max_tokens = 48;
    sampling.stop_at_eos = false;
    request.sampling = sampling;
    Stream stream;
    const Result result =
        engine->submit(request, [&](const Event& event) { stream.events.push_back(event); }).wait();
    expect_stream_matches(stream, result);
    text::StreamingDecoder decoder(*tokenizer, /*skip_special_tokens=*/true);
    int64_t drafted = 0, accepted = 0;
    for (const Event& event : stream.events) {
      ASSERT_LE(event.accepted_drafts, static_cast<int64_t>(event.tokens.size()));
      std::string from_drafts, from_target;
      for (size_t i = 0; i < event.tokens.size(); ++i) {
        const bool draft = static_cast<int64_t>(i) < event.accepted_drafts;
        (draft ? from_drafts : from_target) += decoder.step(event.tokens[i]);
      }
      if (event.finished) from_target += decoder.flush();
      EXPECT_EQ(event.text, from_drafts + from_target);
      EXPECT_EQ(event.accepted_text, from_drafts.size());
      EXPECT_EQ(event.accepted_drafts, with_draft ? event.drafted : 0);
      EXPECT_EQ(event.accepted_drafts + 1, static_cast<int64_t>(event.tokens.size()));
      drafted += event.drafted;
      accepted += event.accepted_drafts;
    }
    EXPECT_EQ(drafted, result.stats.drafted);
    EXPECT_EQ(accepted, result.stats.accepted);
    if (with_draft) {
      EXPECT_GT(accepted, 0);
    }
  }
}

TEST_F(ApiTest, AHugeTimeoutWaitsRatherThanTimingOut) {
  // now() + milliseconds::max() overflows the clock; the wait must still be a wait (the C ABI's
  // specrun_request_next with INT64_MAX comes here too).
  const auto engine = Engine::create(config());
  Request request;
  request.prompt_ids = {1, 5, 9};
  request.sampling = greedy(8);
  RequestHandle handle = engine->submit(request);
  const std::optional<Event> first = handle.next(std::chrono::milliseconds::max());
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(handle.wait().tokens.size(), 8u);
}

TEST_F(ApiTest, CancelFromTheCallbackAndFromAnotherThread) {
  const auto engine = Engine::create(config());
  Request request;
  request.prompt_ids = {1, 5, 9};
  request.sampling = greedy(400);

  // From the callback, after the first tokens.
  Engine* raw = engine.get();
  std::atomic<bool> cancelled{false};
  RequestHandle by_callback = engine->submit(request, [&](const Event& event) {
    if (!event.tokens.empty() && !cancelled.exchange(true)) raw->cancel(event.request);
  });
  // From another thread, once the first event came through next().
  RequestHandle by_thread = engine->submit(request);
  std::thread canceller([&] {
    std::optional<Event> first = by_thread.next(120s);
    ASSERT_TRUE(first.has_value());
    by_thread.cancel();
  });
  canceller.join();

  for (RequestHandle* handle : {&by_callback, &by_thread}) {
    const Result result = handle->wait();
    EXPECT_EQ(result.reason, FinishReason::kCancelled);
    EXPECT_LT(result.tokens.size(), 400u);
    EXPECT_TRUE(handle->finished());
    handle->cancel();  // finished: no effect
  }
  EXPECT_FALSE(engine->cancel(by_callback.id()));  // already finished
  EXPECT_FALSE(engine->cancel(987654321));         // unknown
  const EngineStats stats = wait_until_idle(*engine);
  EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);
  EXPECT_EQ(stats.finished, 2);
}

TEST_F(ApiTest, ACallbackThatThrowsFailsItsRequestOnly) {
  const auto engine = Engine::create(config());
  Request request;
  request.prompt_ids = {1, 5, 9};
  request.sampling = greedy(300);
  int calls = 0;
  RequestHandle failing = engine->submit(request, [&](const Event&) {
    ++calls;
    throw std::runtime_error("disk full");
  });
  request.sampling = greedy(10);
  RequestHandle healthy = engine->submit(request);
  const Result failed = failing.wait();
  EXPECT_EQ(failed.reason, FinishReason::kFailed);
  EXPECT_NE(failed.error.find("the stream callback threw: disk full"), std::string::npos)
      << failed.error;
  EXPECT_EQ(calls, 1);  // no event after the one that threw
  EXPECT_EQ(healthy.wait().reason, FinishReason::kMaxTokens);
  const EngineStats stats = wait_until_idle(*engine);
  EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);
}

TEST_F(ApiTest, ShutdownFinishesEveryRequestAndRefusesNewOnes) {
  EngineConfig settings = config();
  settings.max_batch = 4;  // most of the requests are still queued
  auto engine = Engine::create(settings);
  Request request;
  request.sampling = greedy(200);
  std::vector<RequestHandle> handles;
  for (int i = 0; i < 24; ++i) {
    request.prompt_ids = {1, 3 + i};
    handles.push_back(engine->submit(request));
  }
  ASSERT_TRUE(handles.front().next(120s).has_value());  // running
  engine->shutdown();
  int shut_down = 0;
  for (RequestHandle& handle : handles) {
    EXPECT_TRUE(handle.finished());  // shutdown() returns after the last update
    const Result result = handle.wait();
    EXPECT_TRUE(result.reason == FinishReason::kShutdown ||
                result.reason == FinishReason::kMaxTokens)
        << to_string(result.reason);
    shut_down += result.reason == FinishReason::kShutdown;
  }
  EXPECT_GT(shut_down, 0);
  testing::expect_error([&] { engine->submit(request); }, {"shut down"});
  engine->shutdown();  // idempotent
  engine.reset();
  // Handles outlive the engine.
  EXPECT_TRUE(handles.back().finished());
  handles.back().cancel();
  EXPECT_EQ(handles.back().wait().reason, FinishReason::kShutdown);
}

TEST_F(ApiTest, BadRequestsAreOneClearError) {
  EngineConfig settings = config();
  settings.kv_cache_tokens = 64;
  const auto engine = Engine::create(settings);
  auto submit = [&](const Request& request) {
    return [&engine, request] { engine->submit(request); };
  };
  Request request;
  testing::expect_error(submit(request), {"prompt is empty"});
  request.prompt_ids = {1, 9999};
  testing::expect_error(submit(request), {"9999", "outside the vocabulary"});
  request.prompt_ids = {1, -3};
  testing::expect_error(submit(request), {"-3", "outside the vocabulary"});
  request.prompt_ids = {};
  request.prompt = "hello";
  testing::expect_error(submit(request), {"no tokenizer.json", "prompt_ids"});
  request.prompt_ids = {1};
  testing::expect_error(submit(request), {"not both"});
  request.prompt = "";

  const auto with_sampling = [&](auto change) {
    Request bad = request;
    SamplingSettings sampling;
    change(sampling);
    bad.sampling = sampling;
    return submit(bad);
  };
  testing::expect_error(with_sampling([](SamplingSettings& s) { s.temperature = -1.0f; }),
                        {"temperature", "-1"});
  testing::expect_error(with_sampling([](SamplingSettings& s) { s.top_p = 1.5f; }),
                        {"top_p", "1.5"});
  testing::expect_error(with_sampling([](SamplingSettings& s) { s.top_k = -2; }), {"top_k", "-2"});
  testing::expect_error(with_sampling([](SamplingSettings& s) { s.max_tokens = -1; }),
                        {"max_tokens", "-1"});
  const auto with_speculation = [&](auto change) {
    Request bad = request;
    SpeculationSettings speculation;
    change(speculation);
    bad.speculation = speculation;
    return submit(bad);
  };
  testing::expect_error(with_speculation([](SpeculationSettings& s) { s.gamma_max = 100; }),
                        {"gamma"});
  testing::expect_error(with_speculation([](SpeculationSettings& s) { s.gamma = 9; }),
                        {"gamma_min <= gamma <= gamma_max", "gamma 9"});
  testing::expect_error(with_speculation([](SpeculationSettings& s) { s.draft_p_min = 2.0f; }),
                        {"draft_p_min"});
  testing::expect_error(
      with_speculation([](SpeculationSettings& s) { s.draft_lookup_below = 0.0f; }),
      {"draft_lookup_below", "(0, 1]"});
  testing::expect_error(with_speculation([](SpeculationSettings& s) { s.draft_lookup_ngram = 9; }),
                        {"draft_lookup_ngram", "lookup_max_ngram 3", "got 9"});
  testing::expect_error(with_speculation([](SpeculationSettings& s) { s.draft_alternates = -1; }),
                        {"draft_alternates", "[0, 8]", "got -1"});
  testing::expect_error(with_speculation([](SpeculationSettings& s) {
                          s.method = static_cast<SpeculationMethod>(7);
                        }),
                        {"method must be one of draft, prompt_lookup, none, got '7'"});

  // Larger than the KV cache: the prompt alone.
  request.prompt_ids = std::vector<int32_t>(65, 5);
  testing::expect_error(submit(request), {"65 tokens", "context limit of 64"});
  testing::expect_error([&] { engine->tokenize("hello"); }, {"no tokenizer.json"});
  testing::expect_error([] { RequestHandle().wait(); }, {"empty handle"});

  // Nothing was queued by the refused requests.
  EXPECT_EQ(engine->stats().submitted, 0);
}

TEST_F(ApiTest, TheMemoryPlanCountsBothModelsAndRefusesWhatCannotFit) {
  const MemoryPlan plan = plan_memory(config());
  EXPECT_EQ(plan.device, "cpu");
  EXPECT_GT(plan.available_bytes, 0u);  // the host's MemAvailable
  for (const ModelMemory* m : {&plan.target, &plan.draft}) {
    EXPECT_GT(m->weight_bytes, 0u);
    EXPECT_EQ(m->kv_tokens, 4096);
    EXPECT_EQ(m->kv_bytes, m->kv_bytes_per_token * 4096);
    EXPECT_GT(m->workspace_bytes, 0u);
    uint64_t typed = 0;  // the bytes by type add up to the weights'
    for (const auto& [type, bytes] : m->weight_types) typed += bytes;
    EXPECT_EQ(typed, m->weight_bytes);
    EXPECT_EQ(m->weight_types.count("BF16"), 1u);  // the models' matrices, as stored
  }
  EXPECT_EQ(plan.scratch_bytes, 0u);  // the CPU's ops take nothing of their own
  EXPECT_EQ(plan.total_bytes, plan.target.weight_bytes + plan.target.kv_bytes +
                                  plan.target.workspace_bytes + plan.draft.weight_bytes +
                                  plan.draft.kv_bytes + plan.draft.workspace_bytes);
  const std::string line = to_string(plan);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  for (const char* part :
       {"memory plan on cpu", "target", "+ draft", "4096 tokens", "available", "BF16"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " in " << line;
  }
  // The engine keeps the plan it was checked against.
  const auto engine = Engine::create(config());
  EXPECT_EQ(engine->info().memory.total_bytes, plan.total_bytes);
  EXPECT_EQ(engine->info().memory.draft.weight_bytes, plan.draft.weight_bytes);
  // Without a draft the draft counts nothing.
  EXPECT_EQ(plan_memory(config(false)).draft.weight_bytes, 0u);

  // A KV cache of 2^31 - 1 tokens of these models needs terabytes: refused in one line naming
  // the numbers and what to change, before anything is allocated.
  EngineConfig huge = config();
  huge.kv_cache_tokens = INT32_MAX;
  testing::expect_error([&] { Engine::create(huge); },
                        {"memory plan on cpu", "does not fit", "--quantize", "--kv-cache-tokens"});
}

TEST_F(ApiTest, BadConfigsAreOneClearError) {
  const auto create = [](EngineConfig settings) {
    return [settings] { Engine::create(settings); };
  };
  EngineConfig settings = config();
  settings.target = "";
  testing::expect_error(create(settings), {"target is empty"});
  settings = config();
  settings.target = (dir_ / "missing").string();
  testing::expect_error(create(settings), {(dir_ / "missing").string()});
  settings = config();
  settings.device = "tpu";
  testing::expect_error(create(settings), {"device 'tpu'"});
  // No build or machine has this one: no CUDA backend, no driver, or no such ordinal.
  settings = config();
  settings.device = "cuda:99";
  testing::expect_error(create(settings), {"device 'cuda:99'"});
  settings = config();
  settings.max_batch = 0;
  testing::expect_error(create(settings), {"max_batch", "got 0"});
  settings = config();
  settings.threads = -1;
  testing::expect_error(create(settings), {"threads", "got -1"});
  settings = config();
  settings.kv_block_size = 0;
  testing::expect_error(create(settings), {"kv_block_size", "got 0"});
  settings = config();
  settings.rope_style = "sideways";
  testing::expect_error(create(settings), {"rope_style 'sideways'"});
  settings = config();
  settings.sampling.top_p = 2.0f;
  testing::expect_error(create(settings), {"EngineConfig: sampling", "top_p"});
  settings = config();
  settings.speculation.gamma_min = 5;
  testing::expect_error(create(settings), {"EngineConfig: speculation", "gamma_min 5"});
  // A draft that does not pair with the target.
  fixtures::GeneratorOptions other;
  other.vocab_size = 100;
  fixtures::write_random_checkpoint(other, dir_ / "other");
  settings = config();
  settings.draft = (dir_ / "other").string();
  testing::expect_error(create(settings), {"vocab_size"});
}

TEST_F(ApiTest, FromTomlReadsTheModelsAndSettings) {
  fs::create_directories(dir_ / "configs");
  testing::write_file(dir_ / "configs" / "pair.toml",
                      "[model]\ntarget = \"../target\"\ndraft = \"../draft\"\n"
                      "[sampling]\ntemperature = 0\nmax_tokens = 7\n"
                      "[speculative]\ngamma = 2\ncontroller = \"fixed\"\nlookup_max_ngram = 5\n"
                      "[runtime]\nthreads = 1\nmax_batch = 3\nkv_cache_tokens = 512\n");
  const EngineConfig loaded = EngineConfig::from_toml((dir_ / "configs" / "pair.toml").string());
  EXPECT_EQ(loaded.target, (dir_ / "target").string());
  EXPECT_EQ(loaded.draft, (dir_ / "draft").string());
  EXPECT_EQ(loaded.sampling.temperature, 0.0f);
  EXPECT_EQ(loaded.sampling.max_tokens, 7);
  EXPECT_EQ(loaded.speculation.gamma, 2);
  EXPECT_EQ(loaded.speculation.controller, GammaControl::kFixed);
  EXPECT_EQ(loaded.speculation.lookup_max_ngram, 5);
  EXPECT_EQ(loaded.threads, 1);
  EXPECT_EQ(loaded.max_batch, 3);
  EXPECT_EQ(loaded.kv_cache_tokens, 512);

  const auto engine = Engine::create(loaded);
  const EngineInfo& info = engine->info();
  EXPECT_EQ(fs::path(info.target), dir_ / "target");
  EXPECT_EQ(fs::path(info.draft), dir_ / "draft");
  EXPECT_GT(info.target_parameters, info.draft_parameters);
  EXPECT_GT(info.draft_parameters, 0);
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.context_limit, 512);
  EXPECT_FALSE(info.has_tokenizer);
  EXPECT_EQ(info.device, "cpu");
  EXPECT_EQ(info.threads, 1);
  // runtime.activations "auto": bf16 where the kernels multiply bf16 pairs, else f32 (GGUF blocks
  // meet int8 either way).
  EXPECT_EQ(info.activations, kernels::cpu::best_matmul_variant().multiplies_bf16_pairs()
                                  ? "bf16"
                                  : "f32 (int8 for GGUF blocks)");
  Request request;
  request.prompt_ids = {1, 2, 3};
  const Result result = engine->submit(request).wait();  // the file's sampling defaults
  SamplingSettings expected = greedy(7, /*stop_at_eos=*/true);
  EXPECT_EQ(result.tokens, greedy_alone(request.prompt_ids, expected).first);

  testing::write_file(dir_ / "bad.toml", "[model]\ntarget = 1\n");
  testing::expect_error([&] { EngineConfig::from_toml((dir_ / "bad.toml").string()); },
                        {"bad.toml:2:", "model.target", "must be a string"});
}

// The public chat template: the target's (EngineInfo::chat_template) or a file in its place,
// rendered from a JSON list of messages with the target's BOS and EOS texts; bad input is one
// Error saying what.
TEST(ApiChatTemplate, RendersAConversationAndSaysWhatIsWrongWithBadInput) {
  EngineInfo info;
  info.target = "models/m";
  info.bos_token = "<s>";
  info.eos_token = "</s>";
  EXPECT_FALSE(ChatTemplate::load(info).has_value());  // no template: none
  info.chat_template =
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
      "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
  const std::optional<ChatTemplate> chat = ChatTemplate::load(info);
  ASSERT_TRUE(chat.has_value());
  const std::string messages =
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])";
  EXPECT_EQ(chat->render(messages), "<s>[system] Be brief.</s>[user] Hi</s>[assistant] ");
  EXPECT_EQ(chat->render(messages, {.add_generation_prompt = false}),
            "<s>[system] Be brief.</s>[user] Hi</s>");
  testing::expect_error([&] { chat->render("[{\"role\": "); }, {"chat messages", "not JSON"});
  testing::expect_error([&] { chat->render(R"({"role": "user"})"); }, {"not a JSON list"});
  testing::expect_error([&] { chat->render(R"(["hello"])"); }, {"not a JSON object"});

  // A file in the checkpoint's place; a missing one and a broken one name themselves.
  testing::TempDir dir;
  testing::write_file(dir / "t.jinja",
                      "{% for m in messages %}{{ m.content | upper }}{% endfor %}");
  const std::optional<ChatTemplate> from_file =
      ChatTemplate::load(info, (dir / "t.jinja").string());
  ASSERT_TRUE(from_file.has_value());
  EXPECT_EQ(from_file->render(messages), "BE BRIEF.HI");
  testing::expect_error([&] { ChatTemplate::load(info, (dir / "none.jinja").string()); },
                        {"none.jinja", "no such chat template file"});
  testing::write_file(dir / "bad.jinja", "{% for m in messages %}");
  testing::expect_error([&] { ChatTemplate::load(info, (dir / "bad.jinja").string()); },
                        {"bad.jinja"});
  info.chat_template = "{{ raise_exception('roles must alternate') }}";
  testing::expect_error([&] { ChatTemplate::load(info)->render(messages); },
                        {"roles must alternate"});
}

// A broken template names the file it came from: a GGUF file's metadata, or the
// tokenizer_config.json beside a Hugging Face checkpoint's tokenizer.json (not just its folder).
TEST(ApiChatTemplate, ABrokenTemplateNamesTheFileItCameFrom) {
  testing::TempDir dir;
  fixtures::GeneratorOptions options;
  options.dtype = DType::kF32;
  options.vocab_size = 256;
  options.num_layers = 1;
  fixtures::write_random_checkpoint(options, dir / "hf");
  testing::GgufModelOptions gguf;
  gguf.chat_template = "{% for m in messages %}";
  testing::write_gguf_from_checkpoint(dir / "hf", dir / "m.gguf", gguf);
  EngineConfig config;
  config.target = (dir / "m.gguf").string();
  config.threads = 1;
  config.kv_cache_tokens = 256;
  const auto from_gguf = Engine::create(config);
  EXPECT_EQ(from_gguf->info().chat_template_origin,
            (dir / "m.gguf").string() + " (tokenizer.chat_template)");
  testing::expect_error([&] { ChatTemplate::load(from_gguf->info()); },
                        {(dir / "m.gguf").string() + " (tokenizer.chat_template)"});

  testing::write_file(dir / "hf" / "tokenizer.json", testing::byte_tokenizer_json());
  testing::write_file(dir / "hf" / "tokenizer_config.json",
                      R"({"chat_template": "{% for m in messages %}"})");
  config.target = (dir / "hf").string();
  const auto from_hf = Engine::create(config);
  EXPECT_EQ(from_hf->info().chat_template_origin, (dir / "hf" / "tokenizer_config.json").string());
  testing::expect_error([&] { ChatTemplate::load(from_hf->info()); },
                        {(dir / "hf" / "tokenizer_config.json").string()});
}

}  // namespace
}  // namespace specrun
