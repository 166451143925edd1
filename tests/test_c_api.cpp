// The C ABI (specrun/specrun.h): defaults, streaming through a function pointer and pulling with
// timeouts, results and stats in C structs, cancellation, shutdown, and on every error path a
// status code and a thread-local message, never an exception or a crash.
#include "specrun/specrun.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "runtime/model/model.h"
#include "specrun/specrun.hpp"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;

// Asserts a failed call: its status, and a last-error message naming the function and holding
// every fragment.
void expect_failure(specrun_status status, specrun_status expected, const char* function,
                    std::initializer_list<std::string> fragments) {
  EXPECT_EQ(status, expected) << specrun_status_name(status) << ": " << specrun_last_error();
  const std::string message = specrun_last_error();
  EXPECT_EQ(message.rfind(std::string(function) + ": ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos) << message << "\nmissing: " << fragment;
  }
}

// Stores an int in an enum field as C code may, without forming an out-of-range enum value in
// C++ (which would be undefined).
template <typename Enum>
void store_int(Enum* field, int value) {
  static_assert(sizeof(Enum) == sizeof(int));
  std::memcpy(field, &value, sizeof(value));
}

// What a C callback collects: every event's tokens and text, and the final reason.
struct Collected {
  std::vector<int32_t> tokens;                           // every event's tokens, in order
  std::string text;                                      // every event's text
  int events = 0;                                        // callbacks received
  int finished = 0;                                      // events with finished set
  specrun_finish_reason reason = SPECRUN_FINISH_FAILED;  // the final event's reason
  int64_t drafted = 0;                                   // every event's drafted
  int64_t accepted_drafts = 0;                           // every event's accepted_drafts
  std::vector<specrun_token_logprob> logprobs;           // every event's logprobs, in order
  bool consistent = true;  // every event's counts agreed with its tokens and text
};

void collect(const specrun_event* event, void* user_data) {
  auto* collected = static_cast<Collected*>(user_data);
  collected->tokens.insert(collected->tokens.end(), event->tokens,
                           event->tokens + event->token_count);
  collected->text.append(event->text, event->text_length);
  ++collected->events;
  collected->drafted += event->drafted;
  collected->accepted_drafts += event->accepted_drafts;
  if (event->logprobs != nullptr) {
    collected->logprobs.insert(collected->logprobs.end(), event->logprobs,
                               event->logprobs + event->logprob_count);
  }
  if (event->accepted_drafts < 0 || event->accepted_drafts > event->drafted ||
      static_cast<size_t>(event->accepted_drafts) > event->token_count ||
      event->accepted_text > event->text_length ||
      (event->logprob_count != 0 && event->logprob_count != event->token_count) ||
      (event->logprob_count == 0) != (event->logprobs == nullptr)) {
    collected->consistent = false;
  }
  if (event->finished) {
    ++collected->finished;
    collected->reason = event->reason;
  }
}

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_layer_skip_pair(dir_.path());
    target_ = (dir_ / "target").string();
    draft_ = (dir_ / "draft").string();
  }

  specrun_engine_config config() const {
    specrun_engine_config config;
    EXPECT_EQ(specrun_engine_config_init(&config), SPECRUN_OK);
    config.target = target_.c_str();
    config.draft = draft_.c_str();
    config.threads = 2;
    config.kv_cache_tokens = 2048;
    config.sampling.temperature = 0.0f;
    config.sampling.stop_at_eos = 0;
    config.sampling.max_tokens = 12;
    return config;
  }

  specrun_engine* create() const {
    const specrun_engine_config settings = config();
    specrun_engine* engine = nullptr;
    EXPECT_EQ(specrun_engine_create(&settings, &engine), SPECRUN_OK) << specrun_last_error();
    return engine;
  }

  std::vector<int32_t> greedy_alone(const std::vector<int32_t>& prompt, int64_t max_tokens) {
    auto backend = testing::make_engine_cpu_backend(1);
    auto model = Model::load(target_, *backend);
    return testing::reference_decode(*model, prompt, testing::greedy(max_tokens)).tokens;
  }

  testing::TempDir dir_;
  std::string target_, draft_;
};

TEST_F(CApiTest, InitSetsTheCppDefaults) {
  specrun_engine_config config;
  std::memset(&config, 0xAB, sizeof(config));
  ASSERT_EQ(specrun_engine_config_init(&config), SPECRUN_OK);
  const EngineConfig defaults;
  EXPECT_EQ(config.target, nullptr);
  EXPECT_EQ(config.draft, nullptr);
  EXPECT_EQ(config.device, nullptr);
  EXPECT_EQ(config.rope_style, nullptr);
  EXPECT_EQ(config.deterministic, 0);
  EXPECT_EQ(config.activations, SPECRUN_ACTIVATIONS_AUTO);
  EXPECT_EQ(config.prefix_cache, 1);
  EXPECT_EQ(config.quantize, SPECRUN_QUANTIZATION_NONE);
  EXPECT_EQ(config.draft_quantize, SPECRUN_QUANTIZATION_NONE);
  EXPECT_EQ(config.quantize_lm_head, 0);
  EXPECT_EQ(config.kv_cache_dtype, SPECRUN_KV_CACHE_BF16);
  EXPECT_EQ(config.overlap_drafting, SPECRUN_OVERLAP_AUTO);
  EXPECT_EQ(config.threads, defaults.threads);
  EXPECT_EQ(config.kv_cache_tokens, defaults.kv_cache_tokens);
  EXPECT_EQ(config.kv_block_size, defaults.kv_block_size);
  EXPECT_EQ(config.max_batch, defaults.max_batch);
  EXPECT_EQ(config.sampling.temperature, defaults.sampling.temperature);
  EXPECT_EQ(config.sampling.top_k, defaults.sampling.top_k);
  EXPECT_EQ(config.sampling.top_p, defaults.sampling.top_p);
  EXPECT_EQ(config.sampling.min_p, defaults.sampling.min_p);
  EXPECT_EQ(config.sampling.seed, defaults.sampling.seed);
  EXPECT_EQ(config.sampling.max_tokens, defaults.sampling.max_tokens);
  EXPECT_EQ(config.sampling.stop_at_eos, 1);
  EXPECT_EQ(config.speculation.method, SPECRUN_METHOD_DRAFT);
  EXPECT_EQ(config.speculation.controller, SPECRUN_CONTROLLER_GOODPUT);
  EXPECT_EQ(config.speculation.verification, SPECRUN_VERIFICATION_SHARED_NOISE);
  EXPECT_EQ(config.speculation.gamma, defaults.speculation.gamma);
  EXPECT_EQ(config.speculation.gamma_min, defaults.speculation.gamma_min);
  EXPECT_EQ(config.speculation.gamma_max, defaults.speculation.gamma_max);
  EXPECT_EQ(config.speculation.draft_p_min, defaults.speculation.draft_p_min);
  EXPECT_EQ(config.speculation.lookup_min_ngram, defaults.speculation.lookup_min_ngram);
  EXPECT_EQ(config.speculation.lookup_max_ngram, defaults.speculation.lookup_max_ngram);
  EXPECT_EQ(config.speculation.draft_lookup_ngram, defaults.speculation.draft_lookup_ngram);
  EXPECT_EQ(config.speculation.draft_lookup_below, defaults.speculation.draft_lookup_below);
  EXPECT_EQ(config.speculation.draft_alternates, defaults.speculation.draft_alternates);

  specrun_request_params params;
  std::memset(&params, 0xAB, sizeof(params));
  ASSERT_EQ(specrun_request_params_init(&params), SPECRUN_OK);
  EXPECT_EQ(params.prompt, nullptr);
  EXPECT_EQ(params.prompt_ids, nullptr);
  EXPECT_EQ(params.prompt_id_count, 0u);
  EXPECT_EQ(params.sampling, nullptr);
  EXPECT_EQ(params.speculation, nullptr);
  EXPECT_EQ(params.on_event, nullptr);
  EXPECT_EQ(params.user_data, nullptr);
  EXPECT_EQ(params.logit_bias_tokens, nullptr);
  EXPECT_EQ(params.logit_bias_values, nullptr);
  EXPECT_EQ(params.logit_bias_count, 0u);
  EXPECT_EQ(params.logprobs, Request{}.logprobs);
  EXPECT_EQ(params.logprobs, -1);
  EXPECT_EQ(params.constraint_kind, SPECRUN_CONSTRAINT_NONE);
  EXPECT_EQ(params.constraint_text, nullptr);
  EXPECT_EQ(SPECRUN_MAX_TOP_LOGPROBS, kMaxTopLogprobs);
  EXPECT_STREQ(specrun_version(), "0.1.0");
  EXPECT_STREQ(specrun_status_name(SPECRUN_ERROR_SHUT_DOWN), "shut_down");
  EXPECT_STREQ(specrun_finish_reason_name(SPECRUN_FINISH_CANCELLED), "cancelled");
}

TEST_F(CApiTest, NullPointersAreRejectedByEveryFunction) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  specrun_request_params params;
  specrun_request_params_init(&params);
  const int32_t ids[] = {1, 2};
  params.prompt_ids = ids;
  params.prompt_id_count = 2;
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  const specrun_engine_config settings = config();
  specrun_engine* out_engine = nullptr;
  specrun_event* event = nullptr;
  specrun_result* result = nullptr;
  uint64_t id = 0;
  int flag = 0;
  specrun_engine_stats stats;
  specrun_engine_info info;
  int32_t* tokens = nullptr;
  size_t count = 0;
  char* text = nullptr;
  const specrun_status invalid = SPECRUN_ERROR_INVALID_ARGUMENT;

  expect_failure(specrun_sampling_init(nullptr), invalid, "specrun_sampling_init", {"sampling"});
  expect_failure(specrun_speculation_init(nullptr), invalid, "specrun_speculation_init",
                 {"speculation is NULL"});
  expect_failure(specrun_engine_config_init(nullptr), invalid, "specrun_engine_config_init",
                 {"config is NULL"});
  expect_failure(specrun_request_params_init(nullptr), invalid, "specrun_request_params_init",
                 {"params is NULL"});
  expect_failure(specrun_engine_create(nullptr, &out_engine), invalid, "specrun_engine_create",
                 {"config is NULL"});
  expect_failure(specrun_engine_create(&settings, nullptr), invalid, "specrun_engine_create",
                 {"engine is NULL"});
  specrun_engine_config no_target = settings;
  no_target.target = nullptr;
  expect_failure(specrun_engine_create(&no_target, &out_engine), invalid, "specrun_engine_create",
                 {"config->target is NULL"});
  expect_failure(specrun_engine_create_from_toml(nullptr, &out_engine), invalid,
                 "specrun_engine_create_from_toml", {"path is NULL"});
  expect_failure(specrun_engine_create_from_toml("x.toml", nullptr), invalid,
                 "specrun_engine_create_from_toml", {"engine is NULL"});
  EXPECT_EQ(out_engine, nullptr);
  expect_failure(specrun_engine_shutdown(nullptr), invalid, "specrun_engine_shutdown", {"NULL"});
  expect_failure(specrun_submit(nullptr, &params, &request), invalid, "specrun_submit",
                 {"engine is NULL"});
  expect_failure(specrun_submit(engine, nullptr, &request), invalid, "specrun_submit",
                 {"params is NULL"});
  expect_failure(specrun_submit(engine, &params, nullptr), invalid, "specrun_submit",
                 {"request is NULL"});
  specrun_request_params no_ids = params;
  no_ids.prompt_ids = nullptr;
  specrun_request* refused = nullptr;
  expect_failure(specrun_submit(engine, &no_ids, &refused), invalid, "specrun_submit",
                 {"prompt_ids is NULL with prompt_id_count 2"});
  EXPECT_EQ(refused, nullptr);
  specrun_request_params too_many = params;
  too_many.prompt_id_count = SIZE_MAX;  // never read past the two ids there are
  expect_failure(specrun_submit(engine, &too_many, &refused), invalid, "specrun_submit",
                 {"prompt_id_count " + std::to_string(SIZE_MAX), "context limit"});
  EXPECT_EQ(refused, nullptr);
  expect_failure(specrun_request_next(nullptr, 0, &event), invalid, "specrun_request_next",
                 {"request is NULL"});
  expect_failure(specrun_request_next(request, 0, nullptr), invalid, "specrun_request_next",
                 {"event is NULL"});
  expect_failure(specrun_request_wait(nullptr, &result), invalid, "specrun_request_wait",
                 {"request is NULL"});
  expect_failure(specrun_request_wait(request, nullptr), invalid, "specrun_request_wait",
                 {"result is NULL"});
  expect_failure(specrun_request_id(nullptr, &id), invalid, "specrun_request_id", {"request"});
  expect_failure(specrun_request_id(request, nullptr), invalid, "specrun_request_id", {"id"});
  expect_failure(specrun_request_finished(nullptr, &flag), invalid, "specrun_request_finished",
                 {"request"});
  expect_failure(specrun_request_finished(request, nullptr), invalid, "specrun_request_finished",
                 {"finished is NULL"});
  expect_failure(specrun_request_cancel(nullptr), invalid, "specrun_request_cancel", {"request"});
  expect_failure(specrun_engine_cancel(nullptr, 1, &flag), invalid, "specrun_engine_cancel",
                 {"engine"});
  expect_failure(specrun_engine_stats_get(nullptr, &stats), invalid, "specrun_engine_stats_get",
                 {"engine"});
  expect_failure(specrun_engine_stats_get(engine, nullptr), invalid, "specrun_engine_stats_get",
                 {"stats"});
  expect_failure(specrun_engine_info_get(nullptr, &info), invalid, "specrun_engine_info_get",
                 {"engine"});
  expect_failure(specrun_engine_info_get(engine, nullptr), invalid, "specrun_engine_info_get",
                 {"info"});
  expect_failure(specrun_tokenize(nullptr, "a", 1, &tokens, &count), invalid, "specrun_tokenize",
                 {"engine"});
  expect_failure(specrun_tokenize(engine, nullptr, 1, &tokens, &count), invalid, "specrun_tokenize",
                 {"text"});
  expect_failure(specrun_tokenize(engine, "a", 1, nullptr, &count), invalid, "specrun_tokenize",
                 {"tokens"});
  expect_failure(specrun_tokenize(engine, "a", 1, &tokens, nullptr), invalid, "specrun_tokenize",
                 {"count"});
  expect_failure(specrun_detokenize(nullptr, ids, 2, &text), invalid, "specrun_detokenize",
                 {"engine"});
  expect_failure(specrun_detokenize(engine, nullptr, 2, &text), invalid, "specrun_detokenize",
                 {"tokens is NULL with count 2"});
  expect_failure(specrun_detokenize(engine, ids, 2, nullptr), invalid, "specrun_detokenize",
                 {"text"});
  // Releasing NULL is nothing.
  specrun_engine_destroy(nullptr);
  specrun_request_free(nullptr);
  specrun_event_free(nullptr);
  specrun_result_free(nullptr);
  specrun_tokens_free(nullptr);
  specrun_string_free(nullptr);

  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK);
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
}

TEST_F(CApiTest, StreamsThroughTheCallbackAndReturnsTheResult) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = {1, 17, 200};
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = prompt.data();
  params.prompt_id_count = prompt.size();
  specrun_speculation speculation;
  specrun_speculation_init(&speculation);
  speculation.controller = SPECRUN_CONTROLLER_FIXED;
  speculation.gamma = 3;
  speculation.gamma_min = 3;
  params.speculation = &speculation;
  Collected collected;
  params.on_event = collect;
  params.user_data = &collected;
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();

  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  const std::vector<int32_t> tokens(result->tokens, result->tokens + result->token_count);
  EXPECT_EQ(tokens, greedy_alone(prompt, 12));
  EXPECT_EQ(collected.tokens, tokens);
  EXPECT_EQ(collected.finished, 1);
  EXPECT_EQ(collected.reason, SPECRUN_FINISH_MAX_TOKENS);
  EXPECT_EQ(result->reason, SPECRUN_FINISH_MAX_TOKENS);
  EXPECT_STREQ(result->text, "");  // no tokenizer
  EXPECT_EQ(result->text_length, 0u);
  EXPECT_STREQ(result->error, "");
  uint64_t id = 0;
  ASSERT_EQ(specrun_request_id(request, &id), SPECRUN_OK);
  EXPECT_EQ(result->request, id);
  int finished = 0;
  ASSERT_EQ(specrun_request_finished(request, &finished), SPECRUN_OK);
  EXPECT_EQ(finished, 1);

  const specrun_request_stats& stats = result->stats;
  EXPECT_EQ(stats.prompt_tokens, 3);
  EXPECT_EQ(stats.tokens_generated, 12);
  EXPECT_GT(stats.ttft_ms, 0.0);
  EXPECT_LE(stats.ttft_ms, stats.total_ms);
  EXPECT_GT(stats.steps, 0);
  int64_t steps = 0;
  for (int gamma = 0; gamma <= SPECRUN_MAX_GAMMA; ++gamma) {
    if (gamma > 3) {
      EXPECT_EQ(stats.gamma_histogram[gamma], 0);
    }
    steps += stats.gamma_histogram[gamma];
  }
  EXPECT_EQ(steps, stats.steps);
  EXPECT_LE(stats.accepted, stats.drafted);
  EXPECT_LE(stats.looked_up, stats.drafted);
  EXPECT_LE(stats.looked_up_accepted, stats.looked_up);
  // Each step waited at least once, for its verdict, and read it back.
  EXPECT_GE(stats.host_waits, stats.steps);
  EXPECT_GT(stats.bytes_to_host, 0u);
  specrun_result_free(result);

  // A request with a callback has nothing to pull.
  specrun_event* event = nullptr;
  expect_failure(specrun_request_next(request, 0, &event), SPECRUN_ERROR_END_OF_STREAM,
                 "specrun_request_next", {"no more events"});
  EXPECT_EQ(event, nullptr);
  specrun_request_free(request);

  // The engine counts a step after delivering its updates: its figures may lag a moment.
  specrun_engine_stats engine_stats;
  for (int i = 0; i < 500; ++i) {
    ASSERT_EQ(specrun_engine_stats_get(engine, &engine_stats), SPECRUN_OK);
    if (engine_stats.tokens_generated == 12) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_stats.submitted, 1);
  EXPECT_EQ(engine_stats.tokens_generated, 12);
  EXPECT_GT(engine_stats.kv_tokens_capacity, 0);
  EXPECT_GT(engine_stats.prompt_tokens, 0);
  EXPECT_EQ(engine_stats.cached_prompt_tokens, 0);  // one request: nothing to reuse yet
  EXPECT_DOUBLE_EQ(engine_stats.prefix_cache_hit_rate, 0.0);
  EXPECT_EQ(engine_stats.drafted_ahead, 0);  // overlap is auto: off on the CPU
  EXPECT_EQ(engine_stats.ahead_taken, 0);
  EXPECT_GE(engine_stats.host_waits, engine_stats.steps);
  EXPECT_GT(engine_stats.bytes_to_host, 0u);
  // Acceptance by draft position, summing to the totals.
  int64_t drafted_at = 0, accepted_at = 0;
  for (int i = 0; i < SPECRUN_MAX_GAMMA; ++i) {
    drafted_at += engine_stats.drafted_at[i];
    accepted_at += engine_stats.accepted_at[i];
    EXPECT_LE(engine_stats.accepted_at[i], engine_stats.drafted_at[i]) << i;
  }
  EXPECT_EQ(drafted_at, engine_stats.drafted);
  EXPECT_EQ(accepted_at, engine_stats.accepted);
  EXPECT_GT(engine_stats.drafted_at[0], 0);
  specrun_engine_info info;
  ASSERT_EQ(specrun_engine_info_get(engine, &info), SPECRUN_OK);
  EXPECT_EQ(fs::path(info.target), fs::path(target_));
  EXPECT_EQ(fs::path(info.draft), fs::path(draft_));
  EXPECT_EQ(info.vocab_size, 256);
  EXPECT_EQ(info.has_tokenizer, 0);
  EXPECT_STREQ(info.device, "cpu");
  EXPECT_EQ(info.threads, 2);
  // activations "auto" resolved as the C++ engine resolves it, and the kernels named.
  EXPECT_STREQ(info.cpu_kernels,
               std::string(specrun::kernels::cpu::best_matmul_variant().name).c_str());
  EXPECT_STREQ(info.activations,
               specrun::kernels::cpu::best_matmul_variant().multiplies_bf16_pairs()
                   ? "bf16"
                   : "f32 (int8 for GGUF blocks)");
  specrun_engine_destroy(engine);
}

// Holds the scheduler thread inside a callback until released, so that no other event can be
// delivered meanwhile: a pull with a timeout then times out for certain.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false;  // the callback is holding the scheduler
  bool open = false;     // the callback may return
};

void hold(const specrun_event* event, void* user_data) {
  auto* gate = static_cast<Gate*>(user_data);
  if (event->finished) return;
  std::unique_lock lock(gate->mutex);
  gate->entered = true;
  gate->changed.notify_all();
  gate->changed.wait(lock, [&] { return gate->open; });
}

TEST_F(CApiTest, PullsEventsWithTimeoutsUntilTheEnd) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = {1, 40, 41};
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = prompt.data();
  params.prompt_id_count = prompt.size();
  Gate gate;
  specrun_request_params holding = params;
  holding.on_event = hold;
  holding.user_data = &gate;
  specrun_request* held = nullptr;
  ASSERT_EQ(specrun_submit(engine, &holding, &held), SPECRUN_OK) << specrun_last_error();
  {
    std::unique_lock lock(gate.mutex);
    ASSERT_TRUE(
        gate.changed.wait_for(lock, std::chrono::seconds(10), [&] { return gate.entered; }));
  }
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_event* event = nullptr;
  expect_failure(specrun_request_next(request, 20, &event), SPECRUN_ERROR_TIMEOUT,
                 "specrun_request_next", {"no event within 20 ms"});
  EXPECT_EQ(event, nullptr);
  {
    std::lock_guard lock(gate.mutex);
    gate.open = true;
  }
  gate.changed.notify_all();

  std::vector<int32_t> pulled;
  int finished_events = 0;
  specrun_finish_reason reason = SPECRUN_FINISH_FAILED;
  specrun_status status;
  while ((status = specrun_request_next(request, -1, &event)) == SPECRUN_OK) {
    pulled.insert(pulled.end(), event->tokens, event->tokens + event->token_count);
    EXPECT_STREQ(event->text, "");
    if (event->finished) {
      ++finished_events;
      reason = event->reason;
    }
    specrun_event_free(event);
  }
  EXPECT_EQ(status, SPECRUN_ERROR_END_OF_STREAM) << specrun_last_error();
  EXPECT_EQ(finished_events, 1);
  EXPECT_EQ(reason, SPECRUN_FINISH_MAX_TOKENS);
  EXPECT_EQ(pulled, greedy_alone(prompt, 12));
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK);
  EXPECT_EQ(std::vector<int32_t>(result->tokens, result->tokens + result->token_count), pulled);
  specrun_result_free(result);
  ASSERT_EQ(specrun_request_wait(held, &result), SPECRUN_OK);  // waiting twice is fine
  specrun_result_free(result);
  specrun_request_free(held);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
}

void cancel_self(const specrun_event* event, void* user_data) {
  auto* engine = static_cast<specrun_engine*>(user_data);
  if (!event->finished && event->token_count > 0)
    specrun_engine_cancel(engine, event->request, nullptr);
}

TEST_F(CApiTest, CancelsByHandleAndById) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  const int32_t prompt[] = {1, 5, 9};
  specrun_sampling sampling;
  specrun_sampling_init(&sampling);
  sampling.temperature = 0.0f;
  sampling.max_tokens = 500;
  sampling.stop_at_eos = 0;
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = prompt;
  params.prompt_id_count = 3;
  params.sampling = &sampling;

  specrun_request* by_handle = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &by_handle), SPECRUN_OK);
  specrun_event* event = nullptr;
  ASSERT_EQ(specrun_request_next(by_handle, 120000, &event), SPECRUN_OK) << specrun_last_error();
  specrun_event_free(event);
  ASSERT_EQ(specrun_request_cancel(by_handle), SPECRUN_OK);

  params.on_event = cancel_self;
  params.user_data = engine;
  specrun_request* by_id = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &by_id), SPECRUN_OK);

  for (specrun_request* request : {by_handle, by_id}) {
    specrun_result* result = nullptr;
    ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK);
    EXPECT_EQ(result->reason, SPECRUN_FINISH_CANCELLED);
    EXPECT_LT(result->token_count, 500u);
    uint64_t id = 0;
    specrun_request_id(request, &id);
    int cancelled = 1;
    ASSERT_EQ(specrun_engine_cancel(engine, id, &cancelled), SPECRUN_OK);
    EXPECT_EQ(cancelled, 0);                                 // finished already
    EXPECT_EQ(specrun_request_cancel(request), SPECRUN_OK);  // no effect, no error
    specrun_result_free(result);
    specrun_request_free(request);
  }
  specrun_engine_destroy(engine);
}

TEST_F(CApiTest, TheMemoryPlanIsTheCppPlan) {
  // Planned from the C settings before any engine exists, and the plan an engine was checked
  // against: both the C++ API's, field for field, quantized target included.
  specrun_engine_config settings = config();
  settings.quantize = SPECRUN_QUANTIZATION_INT8;
  settings.kv_cache_dtype = SPECRUN_KV_CACHE_F32;
  specrun_memory_plan planned;
  ASSERT_EQ(specrun_plan_memory(&settings, &planned), SPECRUN_OK) << specrun_last_error();
  EngineConfig cpp;
  cpp.target = target_;
  cpp.draft = draft_;
  cpp.threads = 2;
  cpp.kv_cache_tokens = 2048;
  cpp.quantize = Quantization::kINT8;
  cpp.kv_cache_dtype = KvCacheDtype::kF32;
  const MemoryPlan expected = plan_memory(cpp);
  const auto expect_model = [](const specrun_model_memory& c, const ModelMemory& m,
                               const char* which) {
    EXPECT_EQ(c.weight_bytes, m.weight_bytes) << which;
    EXPECT_EQ(c.kv_bytes_per_token, m.kv_bytes_per_token) << which;
    EXPECT_EQ(c.kv_tokens, m.kv_tokens) << which;
    EXPECT_EQ(c.kv_bytes, m.kv_bytes) << which;
    EXPECT_EQ(c.workspace_bytes, m.workspace_bytes) << which;
  };
  expect_model(planned.target, expected.target, "target");
  expect_model(planned.draft, expected.draft, "draft");
  EXPECT_EQ(planned.total_bytes, expected.total_bytes);
  EXPECT_GT(planned.draft.weight_bytes, 0u);
  EXPECT_GT(planned.available_bytes, 0u);

  specrun_engine* engine = nullptr;
  ASSERT_EQ(specrun_engine_create(&settings, &engine), SPECRUN_OK) << specrun_last_error();
  specrun_memory_plan checked;
  ASSERT_EQ(specrun_engine_memory_get(engine, &checked), SPECRUN_OK);
  expect_model(checked.target, expected.target, "engine's target");
  EXPECT_EQ(checked.total_bytes, expected.total_bytes);
  expect_failure(specrun_engine_memory_get(nullptr, &checked), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_memory_get", {"engine"});
  expect_failure(specrun_engine_memory_get(engine, nullptr), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_memory_get", {"plan"});
  specrun_engine_destroy(engine);

  expect_failure(specrun_plan_memory(nullptr, &planned), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_plan_memory", {"config"});
  expect_failure(specrun_plan_memory(&settings, nullptr), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_plan_memory", {"plan"});
  const std::string missing = (dir_ / "missing").string();
  settings.target = missing.c_str();
  expect_failure(specrun_plan_memory(&settings, &planned), SPECRUN_ERROR_FAILED,
                 "specrun_plan_memory", {missing});
}

TEST_F(CApiTest, RefusedRequestsAndConfigsReturnTheirCodeAndMessage) {
  specrun_engine_config settings = config();
  const std::string missing = (dir_ / "missing").string();
  settings.target = missing.c_str();
  specrun_engine* engine = nullptr;
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_FAILED,
                 "specrun_engine_create", {missing});
  EXPECT_EQ(engine, nullptr);
  settings = config();
  store_int(&settings.speculation.method, 9);
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_create", {"config->speculation.method 9"});
  settings = config();
  store_int(&settings.draft_quantize, 3);
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_create", {"config->draft_quantize 3", "specrun_quantization"});
  settings = config();
  store_int(&settings.kv_cache_dtype, 2);
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_create", {"config->kv_cache_dtype 2", "specrun_kv_cache_dtype"});
  settings = config();
  store_int(&settings.overlap_drafting, 3);
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_create",
                 {"config->overlap_drafting 3", "specrun_overlap_drafting"});
  settings = config();
  store_int(&settings.activations, 4);
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_engine_create", {"config->activations 4", "specrun_activations"});
  settings = config();
  settings.max_batch = 0;
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_FAILED,
                 "specrun_engine_create", {"max_batch", "got 0"});
  settings = config();
  settings.device = "tpu";
  expect_failure(specrun_engine_create(&settings, &engine), SPECRUN_ERROR_FAILED,
                 "specrun_engine_create", {"device 'tpu'"});
  testing::write_file(dir_ / "bad.toml", "[runtime]\nmax_batch = -4\n");
  expect_failure(specrun_engine_create_from_toml((dir_ / "bad.toml").string().c_str(), &engine),
                 SPECRUN_ERROR_FAILED, "specrun_engine_create_from_toml",
                 {"bad.toml:2:", "runtime.max_batch", "got -4"});
  EXPECT_EQ(engine, nullptr);
  testing::write_file(dir_ / "outside.toml", "[model]\ntarget = \"/etc\"\n");
  expect_failure(specrun_engine_create_from_toml_within((dir_ / "outside.toml").string().c_str(),
                                                        dir_.path().c_str(), &engine),
                 SPECRUN_ERROR_FAILED, "specrun_engine_create_from_toml_within",
                 {"outside.toml:2:", "model.target", "outside"});
  expect_failure(specrun_engine_create_from_toml_within("x.toml", nullptr, &engine),
                 SPECRUN_ERROR_INVALID_ARGUMENT, "specrun_engine_create_from_toml_within",
                 {"model_root is NULL"});
  expect_failure(specrun_engine_create_from_toml_within("x.toml", "", &engine),
                 SPECRUN_ERROR_FAILED, "specrun_engine_create_from_toml_within",
                 {"model_root must not be empty"});
  EXPECT_EQ(engine, nullptr);

  engine = create();
  ASSERT_NE(engine, nullptr);
  specrun_request_params params;
  specrun_request_params_init(&params);
  specrun_request* request = nullptr;
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_FAILED, "specrun_submit",
                 {"prompt is empty"});
  params.prompt = "hello";
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_FAILED, "specrun_submit",
                 {"no tokenizer.json"});
  const int32_t out_of_vocab[] = {1, 256};
  params.prompt = nullptr;
  params.prompt_ids = out_of_vocab;
  params.prompt_id_count = 2;
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_FAILED, "specrun_submit",
                 {"256", "outside the vocabulary"});
  const int32_t ids[] = {1, 2};
  params.prompt_ids = ids;
  specrun_sampling sampling;
  specrun_sampling_init(&sampling);
  sampling.top_p = 0.0f;
  params.sampling = &sampling;
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_submit", {"params->sampling.top_p must be in (0, 1], got 0"});
  params.sampling = nullptr;
  specrun_speculation speculation;
  specrun_speculation_init(&speculation);
  store_int(&speculation.controller, -1);
  params.speculation = &speculation;
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_submit", {"params->speculation.controller -1"});
  specrun_speculation_init(&speculation);
  store_int(&speculation.verification, 2);
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_INVALID_ARGUMENT,
                 "specrun_submit", {"params->speculation.verification 2"});
  EXPECT_EQ(request, nullptr);
  int32_t* tokens = nullptr;
  size_t count = 7;
  expect_failure(specrun_tokenize(engine, "hello", 1, &tokens, &count), SPECRUN_ERROR_FAILED,
                 "specrun_tokenize", {"no tokenizer.json"});
  EXPECT_EQ(tokens, nullptr);
  EXPECT_EQ(count, 0u);
  specrun_engine_destroy(engine);
}

// How this test writes a setting's value into the C structs, by key, independently of the library's
// own binding: a C enum by its C name, a number the C field cannot hold reported as false.
template <typename Field>
bool store_integer(Field& field, int64_t value) {
  if (!std::in_range<Field>(value)) return false;
  field = static_cast<Field>(value);
  return true;
}

template <typename Enum>
bool store_choice(Enum& field, const std::string& name, const std::map<std::string, int>& numbers) {
  const auto it = numbers.find(name);
  store_int(&field, it == numbers.end() ? 99 : it->second);  // a name C has not: a stray number
  return true;
}

bool write_c_setting(specrun_sampling& c, const std::string& key, const SettingValue& value) {
  if (key == "temperature")
    return c.temperature = static_cast<float>(std::get<double>(value)), true;
  if (key == "top_p") return c.top_p = static_cast<float>(std::get<double>(value)), true;
  if (key == "min_p") return c.min_p = static_cast<float>(std::get<double>(value)), true;
  if (key == "frequency_penalty")
    return c.frequency_penalty = static_cast<float>(std::get<double>(value)), true;
  if (key == "presence_penalty")
    return c.presence_penalty = static_cast<float>(std::get<double>(value)), true;
  if (key == "repetition_penalty")
    return c.repetition_penalty = static_cast<float>(std::get<double>(value)), true;
  if (key == "top_k") return store_integer(c.top_k, std::get<int64_t>(value));
  if (key == "seed") {
    c.seed = static_cast<uint64_t>(std::get<int64_t>(value));  // -1 is 2^64 - 1, past int64
    return true;
  }
  if (key == "max_tokens") return store_integer(c.max_tokens, std::get<int64_t>(value));
  ADD_FAILURE() << "sampling setting " << key << " has no field in specrun_sampling";
  return false;
}

bool write_c_setting(specrun_speculation& c, const std::string& key, const SettingValue& value) {
  if (key == "method") {
    return store_choice(c.method, std::get<std::string>(value),
                        {{"draft", SPECRUN_METHOD_DRAFT},
                         {"prompt_lookup", SPECRUN_METHOD_PROMPT_LOOKUP},
                         {"none", SPECRUN_METHOD_NONE}});
  }
  if (key == "controller") {
    return store_choice(c.controller, std::get<std::string>(value),
                        {{"goodput", SPECRUN_CONTROLLER_GOODPUT},
                         {"heuristic", SPECRUN_CONTROLLER_HEURISTIC},
                         {"fixed", SPECRUN_CONTROLLER_FIXED}});
  }
  if (key == "verification") {
    return store_choice(c.verification, std::get<std::string>(value),
                        {{"rejection", SPECRUN_VERIFICATION_REJECTION},
                         {"shared_noise", SPECRUN_VERIFICATION_SHARED_NOISE}});
  }
  int64_t* integers[] = {&c.gamma,
                         &c.gamma_min,
                         &c.gamma_max,
                         &c.lookup_min_ngram,
                         &c.lookup_max_ngram,
                         &c.draft_lookup_ngram,
                         &c.draft_alternates};
  const char* integer_keys[] = {"gamma",
                                "gamma_min",
                                "gamma_max",
                                "lookup_min_ngram",
                                "lookup_max_ngram",
                                "draft_lookup_ngram",
                                "draft_alternates"};
  for (size_t i = 0; i < std::size(integers); ++i) {
    if (key == integer_keys[i]) return store_integer(*integers[i], std::get<int64_t>(value));
  }
  if (key == "draft_p_min")
    return c.draft_p_min = static_cast<float>(std::get<double>(value)), true;
  if (key == "draft_lookup_below") {
    return c.draft_lookup_below = static_cast<float>(std::get<double>(value)), true;
  }
  ADD_FAILURE() << "speculation setting " << key << " has no field in specrun_speculation";
  return false;
}

// The C structs are one more front end of the setting tables: every row has its field, a value
// in range is taken, and one out of range is refused before the request runs, naming the field.
TEST_F(CApiTest, TakesEverySettingOfTheTablesAndRefusesEachValueOutOfRangeNamingItsField) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  const int32_t ids[] = {1, 2, 3};
  const auto submit_and_wait = [&](const specrun_request_params& params) {
    specrun_request* request = nullptr;
    ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
    specrun_result* result = nullptr;
    ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
    EXPECT_NE(result->reason, SPECRUN_FINISH_FAILED) << result->error;
    specrun_result_free(result);
    specrun_request_free(request);
  };
  const auto refused = [&](const specrun_request_params& params, const std::string& field) {
    specrun_request* request = nullptr;
    expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_INVALID_ARGUMENT,
                   "specrun_submit", {field});
    EXPECT_EQ(request, nullptr);
  };
  for (const Setting<SamplingSettings>& row : sampling_settings()) {
    SCOPED_TRACE(row.key);
    specrun_sampling sampling;
    specrun_sampling_init(&sampling);
    sampling.max_tokens = 4;
    specrun_request_params params;
    specrun_request_params_init(&params);
    params.prompt_ids = ids;
    params.prompt_id_count = std::size(ids);
    params.sampling = &sampling;
    SamplingSettings defaults;
    defaults.max_tokens = 4;
    ASSERT_TRUE(write_c_setting(sampling, row.key, testing::other_setting_value(row, defaults)));
    submit_and_wait(params);
    specrun_sampling_init(&sampling);
    SettingValue bad = testing::bad_setting_value(row);
    if (!write_c_setting(sampling, row.key, bad)) {
      bad = row.range.integer_minimum - 1;  // past what the C field holds: below the minimum
      ASSERT_TRUE(write_c_setting(sampling, row.key, bad));
    }
    refused(params, std::string("params->sampling.") + row.key);
  }
  for (const Setting<SpeculationSettings>& row : speculation_settings()) {
    SCOPED_TRACE(row.key);
    specrun_speculation speculation;
    specrun_speculation_init(&speculation);
    specrun_request_params params;
    specrun_request_params_init(&params);
    params.prompt_ids = ids;
    params.prompt_id_count = std::size(ids);
    params.speculation = &speculation;
    ASSERT_TRUE(write_c_setting(speculation, row.key,
                                testing::other_setting_value(row, SpeculationSettings{})));
    submit_and_wait(params);
    specrun_speculation_init(&speculation);
    ASSERT_TRUE(write_c_setting(speculation, row.key, testing::bad_setting_value(row)));
    refused(params, std::string("params->speculation.") + row.key);
  }
  specrun_engine_destroy(engine);
}

// In a debug build every entry point checks its handles: memory that is not a live handle (what a
// destroyed or freed one's is, until reused) is refused, and destroying or freeing it does
// nothing but say so. A release build does not check (the header says it is undefined there).
TEST_F(CApiTest, HandlesThatAreNotLiveAreRefusedInDebugBuilds) {
#ifdef NDEBUG
  GTEST_SKIP() << "handles are checked in debug builds only";
#else
  const auto invalid = SPECRUN_ERROR_INVALID_ARGUMENT;
  // Zeroed memory as large and aligned as any handle: not the live mark.
  alignas(64) static unsigned char not_a_handle[256] = {};
  auto* engine = reinterpret_cast<specrun_engine*>(not_a_handle);
  auto* request = reinterpret_cast<specrun_request*>(not_a_handle);
  specrun_engine_stats stats;
  expect_failure(specrun_engine_stats_get(engine, &stats), invalid, "specrun_engine_stats_get",
                 {"engine is not a live handle"});
  specrun_request_params params;
  specrun_request_params_init(&params);
  specrun_request* submitted = nullptr;
  expect_failure(specrun_submit(engine, &params, &submitted), invalid, "specrun_submit",
                 {"engine is not a live handle"});
  expect_failure(specrun_request_cancel(request), invalid, "specrun_request_cancel",
                 {"request is not a live handle"});
  specrun_engine_destroy(engine);  // does nothing but say so
  EXPECT_NE(std::string(specrun_last_error()).find("engine is not a live handle"),
            std::string::npos);
  specrun_request_free(request);
  EXPECT_NE(std::string(specrun_last_error()).find("request is not a live handle"),
            std::string::npos);
  // A live engine and request pass, and are freed once.
  specrun_engine* live_engine = create();
  ASSERT_NE(live_engine, nullptr);
  EXPECT_EQ(specrun_engine_stats_get(live_engine, &stats), SPECRUN_OK);
  specrun_engine_destroy(live_engine);
#endif
}

TEST_F(CApiTest, ShutdownFinishesRequestsAndRefusesNewOnes) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  specrun_sampling sampling;
  specrun_sampling_init(&sampling);
  sampling.max_tokens = 400;
  sampling.stop_at_eos = 0;
  const int32_t ids[] = {1, 2, 3};
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = ids;
  params.prompt_id_count = 3;
  params.sampling = &sampling;
  specrun_request* running = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &running), SPECRUN_OK);
  specrun_event* event = nullptr;
  ASSERT_EQ(specrun_request_next(running, 120000, &event), SPECRUN_OK);
  specrun_event_free(event);
  ASSERT_EQ(specrun_engine_shutdown(engine), SPECRUN_OK);
  ASSERT_EQ(specrun_engine_shutdown(engine), SPECRUN_OK);  // idempotent
  specrun_request* late = nullptr;
  expect_failure(specrun_submit(engine, &params, &late), SPECRUN_ERROR_SHUT_DOWN, "specrun_submit",
                 {"shut down"});
  EXPECT_EQ(late, nullptr);
  specrun_engine_destroy(engine);
  // The handle outlives the engine.
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(running, &result), SPECRUN_OK);
  EXPECT_EQ(result->reason, SPECRUN_FINISH_SHUTDOWN);
  EXPECT_STREQ(specrun_finish_reason_name(result->reason), "shutdown");
  specrun_result_free(result);
  EXPECT_EQ(specrun_request_cancel(running), SPECRUN_OK);
  specrun_request_free(running);
}

TEST_F(CApiTest, TheLastErrorBelongsToTheCallingThread) {
  EXPECT_EQ(specrun_engine_shutdown(nullptr), SPECRUN_ERROR_INVALID_ARGUMENT);
  const std::string mine = specrun_last_error();
  std::string theirs_before, theirs_after;
  std::thread other([&] {
    theirs_before = specrun_last_error();
    specrun_request_cancel(nullptr);
    theirs_after = specrun_last_error();
  });
  other.join();
  EXPECT_EQ(theirs_before, "");
  EXPECT_NE(theirs_after.find("specrun_request_cancel"), std::string::npos);
  EXPECT_EQ(specrun_last_error(), mine);
  // A successful call leaves the message of the last failure.
  specrun_sampling sampling;
  EXPECT_EQ(specrun_sampling_init(&sampling), SPECRUN_OK);
  EXPECT_EQ(specrun_last_error(), mine);
}

TEST_F(CApiTest, TextThroughTheTokenizerAndFromToml) {
  for (const char* model : {"target", "draft"}) {
    testing::write_file(dir_ / model / "tokenizer.json", testing::byte_tokenizer_json());
  }
  testing::write_file(dir_ / "engine.toml",
                      "[model]\ntarget = \"target\"\ndraft = \"draft\"\n"
                      "[sampling]\nmax_tokens = 16\nseed = 3\n[runtime]\nthreads = 1\n");
  specrun_engine* engine = nullptr;
  ASSERT_EQ(specrun_engine_create_from_toml_within((dir_ / "engine.toml").string().c_str(),
                                                   dir_.path().c_str(), &engine),
            SPECRUN_OK)
      << specrun_last_error();
  int32_t* tokens = nullptr;
  size_t count = 0;
  ASSERT_EQ(specrun_tokenize(engine, "hi", 1, &tokens, &count), SPECRUN_OK);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + count),
            (std::vector<int32_t>{1, 'h' + 3, 'i' + 3}));
  char* text = nullptr;
  ASSERT_EQ(specrun_detokenize(engine, tokens, count, &text), SPECRUN_OK);
  EXPECT_STREQ(text, "hi");
  specrun_string_free(text);
  specrun_tokens_free(tokens);

  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt = "Once upon a time";
  Collected collected;
  params.on_event = collect;
  params.user_data = &collected;
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK);
  EXPECT_EQ(collected.text, std::string(result->text, result->text_length));
  // text_length bytes, then the terminating NUL (the text itself may hold NUL bytes: id 3 is 0x00).
  EXPECT_EQ(result->text[result->text_length], '\0');
  EXPECT_EQ(collected.tokens,
            std::vector<int32_t>(result->tokens, result->tokens + result->token_count));
  EXPECT_EQ(result->stats.prompt_tokens, 17);  // BOS and 16 bytes
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
}

// A bias of 100 on one token makes greedy decoding choose it at every position, drafts and all.
TEST_F(CApiTest, LogitBiasForcesAToken) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = {1, 17, 200};
  const int32_t tokens[] = {42, 43};
  const float values[] = {100.0f, -100.0f};
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = prompt.data();
  params.prompt_id_count = prompt.size();
  params.logit_bias_tokens = tokens;
  params.logit_bias_values = values;
  params.logit_bias_count = 2;
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  EXPECT_EQ(std::vector<int32_t>(result->tokens, result->tokens + result->token_count),
            std::vector<int32_t>(12, 42));
  EXPECT_NE(greedy_alone(prompt, 12), std::vector<int32_t>(12, 42));  // the bias did it
  EXPECT_EQ(result->logprobs, nullptr);                               // not asked for
  EXPECT_EQ(result->logprob_count, 0u);
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
}

// Logprobs through the C ABI are the C++ API's for the same request, in the events (pushed to a
// callback and pulled) and in the result; the events' drafted and accepted_drafts add up to the
// request's stats.
TEST_F(CApiTest, LogprobsAndDraftCountsAreTheCppApis) {
  const std::vector<int32_t> prompt = {1, 17, 200};
  EngineConfig settings;
  settings.target = target_;
  settings.draft = draft_;
  settings.threads = 2;
  settings.kv_cache_tokens = 2048;
  settings.sampling.temperature = 0.0f;
  settings.sampling.stop_at_eos = false;
  settings.sampling.max_tokens = 12;
  Request cpp_request;
  cpp_request.prompt_ids = prompt;
  cpp_request.logprobs = 3;
  const Result expected = Engine::create(settings)->submit(cpp_request).wait();
  ASSERT_EQ(expected.logprobs.size(), 12u);

  const auto expect_cpp = [&](const specrun_token_logprob* logprobs, size_t count) {
    ASSERT_EQ(count, expected.logprobs.size());
    for (size_t t = 0; t < count; ++t) {
      SCOPED_TRACE("token " + std::to_string(t));
      const TokenLogprob& want = expected.logprobs[t];
      EXPECT_EQ(logprobs[t].token, want.token);
      EXPECT_FLOAT_EQ(logprobs[t].logprob, want.logprob);
      ASSERT_EQ(logprobs[t].top_count, 3);
      ASSERT_EQ(want.top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(logprobs[t].top_tokens[k], want.top[k].token);
        EXPECT_FLOAT_EQ(logprobs[t].top_logprobs[k], want.top[k].logprob);
      }
    }
  };

  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  specrun_speculation speculation;
  specrun_speculation_init(&speculation);
  speculation.controller = SPECRUN_CONTROLLER_FIXED;
  speculation.gamma = 3;
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt_ids = prompt.data();
  params.prompt_id_count = prompt.size();
  params.speculation = &speculation;
  params.logprobs = 3;
  Collected collected;
  params.on_event = collect;
  params.user_data = &collected;
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  EXPECT_EQ(std::vector<int32_t>(result->tokens, result->tokens + result->token_count),
            expected.tokens);
  {
    SCOPED_TRACE("result");
    expect_cpp(result->logprobs, result->logprob_count);
  }
  {
    SCOPED_TRACE("callback");
    expect_cpp(collected.logprobs.data(), collected.logprobs.size());
  }
  EXPECT_TRUE(collected.consistent);
  EXPECT_GT(result->stats.drafted, 0);
  EXPECT_EQ(collected.drafted, result->stats.drafted);
  EXPECT_EQ(collected.accepted_drafts, result->stats.accepted);
  specrun_result_free(result);
  specrun_request_free(request);

  // Pulled: each event owns a copy, valid until specrun_event_free.
  params.on_event = nullptr;
  params.user_data = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  std::vector<specrun_token_logprob> pulled;
  int64_t drafted = 0, accepted = 0;
  for (;;) {
    specrun_event* event = nullptr;
    ASSERT_EQ(specrun_request_next(request, -1, &event), SPECRUN_OK) << specrun_last_error();
    EXPECT_EQ(event->logprob_count, event->token_count);
    if (event->logprob_count > 0) {
      pulled.insert(pulled.end(), event->logprobs, event->logprobs + event->logprob_count);
    }
    drafted += event->drafted;
    accepted += event->accepted_drafts;
    const bool finished = event->finished != 0;
    specrun_event_free(event);
    if (finished) break;
  }
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  {
    SCOPED_TRACE("pulled");
    expect_cpp(pulled.data(), pulled.size());
  }
  EXPECT_EQ(drafted, result->stats.drafted);
  EXPECT_EQ(accepted, result->stats.accepted);
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
}

// A GBNF grammar holds greedy decoding to its sentences, through the C ABI as through C++; a
// grammar or schema that does not compile is the engine's refusal, SPECRUN_ERROR_FAILED.
TEST_F(CApiTest, ConstrainedOutputFollowsItsGrammar) {
  for (const char* model : {"target", "draft"}) {
    testing::write_file(dir_ / model / "tokenizer.json", testing::byte_tokenizer_json());
  }
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  specrun_sampling sampling;
  specrun_sampling_init(&sampling);
  sampling.temperature = 0.0f;
  sampling.max_tokens = 16;
  specrun_request_params params;
  specrun_request_params_init(&params);
  params.prompt = "Answer: ";
  params.sampling = &sampling;
  params.constraint_kind = SPECRUN_CONSTRAINT_GBNF;
  params.constraint_text = R"(root ::= "yes" | "no")";
  specrun_request* request = nullptr;
  ASSERT_EQ(specrun_submit(engine, &params, &request), SPECRUN_OK) << specrun_last_error();
  specrun_result* result = nullptr;
  ASSERT_EQ(specrun_request_wait(request, &result), SPECRUN_OK) << specrun_last_error();
  const std::string text(result->text, result->text_length);
  EXPECT_TRUE(text == "yes" || text == "no") << text;
  EXPECT_EQ(result->reason, SPECRUN_FINISH_END_OF_SEQUENCE) << text;
  specrun_result_free(result);
  specrun_request_free(request);

  params.constraint_text = "root ::= missing";
  request = nullptr;
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_FAILED, "specrun_submit",
                 {"missing"});
  EXPECT_EQ(request, nullptr);
  params.constraint_kind = SPECRUN_CONSTRAINT_JSON_SCHEMA;
  params.constraint_text = R"({"type": "object", "not": {}})";
  expect_failure(specrun_submit(engine, &params, &request), SPECRUN_ERROR_FAILED, "specrun_submit",
                 {"not"});
  EXPECT_EQ(request, nullptr);
  specrun_engine_destroy(engine);
}

// Inconsistent bias, logprobs and constraint fields are refused before anything is submitted,
// naming the field; values only the engine can judge come back as its refusal.
TEST_F(CApiTest, RefusesInconsistentBiasLogprobsAndConstraintNamingTheField) {
  specrun_engine* engine = create();
  ASSERT_NE(engine, nullptr);
  static const int32_t ids[] = {1, 2};
  static const int32_t tokens[] = {5, 6, 5};
  static const float values[] = {1.0f, 2.0f, 3.0f};
  static const float too_much[] = {150.0f};
  static const int32_t outside[] = {256};
  struct Case {
    const char* what;
    void (*edit)(specrun_request_params&);
    specrun_status status;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"a count without tokens",
       [](specrun_request_params& p) {
         p.logit_bias_values = values;
         p.logit_bias_count = 2;
       },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logit_bias_tokens is NULL", "logit_bias_count 2"}},
      {"a count without values",
       [](specrun_request_params& p) {
         p.logit_bias_tokens = tokens;
         p.logit_bias_count = 2;
       },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logit_bias_values is NULL", "logit_bias_count 2"}},
      {"a count past the bound",
       [](specrun_request_params& p) {
         p.logit_bias_tokens = tokens;
         p.logit_bias_values = values;
         p.logit_bias_count = SIZE_MAX;
       },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logit_bias_count must be at most 300"}},
      {"a token twice",
       [](specrun_request_params& p) {
         p.logit_bias_tokens = tokens;
         p.logit_bias_values = values;
         p.logit_bias_count = 3;
       },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logit_bias_tokens[2]", "logit_bias_tokens[0]", "token 5"}},
      {"a bias out of range",
       [](specrun_request_params& p) {
         p.logit_bias_tokens = tokens;
         p.logit_bias_values = too_much;
         p.logit_bias_count = 1;
       },
       SPECRUN_ERROR_FAILED,
       {"logit_bias", "[-100, 100]", "150"}},
      {"a token outside the vocabulary",
       [](specrun_request_params& p) {
         p.logit_bias_tokens = outside;
         p.logit_bias_values = values;
         p.logit_bias_count = 1;
       },
       SPECRUN_ERROR_FAILED,
       {"logit_bias", "256"}},
      {"logprobs 21",
       [](specrun_request_params& p) { p.logprobs = 21; },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logprobs must be -1 (none) or in [0, 20], got 21"}},
      {"logprobs -2",
       [](specrun_request_params& p) { p.logprobs = -2; },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->logprobs", "got -2"}},
      {"a grammar without text",
       [](specrun_request_params& p) { p.constraint_kind = SPECRUN_CONSTRAINT_GBNF; },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->constraint_text must hold the grammar", "SPECRUN_CONSTRAINT_GBNF", "NULL"}},
      {"a schema that is empty",
       [](specrun_request_params& p) {
         p.constraint_kind = SPECRUN_CONSTRAINT_JSON_SCHEMA;
         p.constraint_text = "";
       },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->constraint_text must hold the schema", "SPECRUN_CONSTRAINT_JSON_SCHEMA"}},
      {"text without a kind",
       [](specrun_request_params& p) { p.constraint_text = "root ::= \"a\""; },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->constraint_text must be NULL", "SPECRUN_CONSTRAINT_NONE"}},
      {"an unknown kind",
       [](specrun_request_params& p) { store_int(&p.constraint_kind, 7); },
       SPECRUN_ERROR_INVALID_ARGUMENT,
       {"params->constraint_kind 7 is not a specrun_constraint_kind"}},
      {"a constraint without a tokenizer",
       [](specrun_request_params& p) { p.constraint_kind = SPECRUN_CONSTRAINT_JSON_OBJECT; },
       SPECRUN_ERROR_FAILED,
       {"tokenizer"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    specrun_request_params params;
    specrun_request_params_init(&params);
    params.prompt_ids = ids;
    params.prompt_id_count = 2;
    c.edit(params);
    specrun_request* request = nullptr;
    const specrun_status status = specrun_submit(engine, &params, &request);
    EXPECT_EQ(status, c.status) << specrun_last_error();
    const std::string message = specrun_last_error();
    EXPECT_EQ(message.rfind("specrun_submit: ", 0), 0u) << message;
    for (const std::string& fragment : c.fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos) << message << "\nmissing: " << fragment;
    }
    EXPECT_EQ(request, nullptr);
  }
  specrun_engine_destroy(engine);
}

}  // namespace
}  // namespace specrun
