// The continuous-batching engine on token ids: batched results equal the same requests run alone
// (greedy against the reference decode, sampled against the same request alone in a fresh engine);
// requests from many threads are neither lost, duplicated nor mixed; a short KV cache makes
// requests wait without corrupting running ones; cancellation frees KV blocks; shutdown finishes
// every request.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/engine/batch_engine.h"
#include "tests/deferred_backend.h"
#include "tests/host_verifiers.h"
#include "tests/test_support.h"
#include "verify/verifier.h"

namespace specrun {
namespace {

// Collects one request's updates and waits for its final one.
class Collector {
 public:
  UpdateCallback callback() {
    return [this](const RequestUpdate& update) {
      std::lock_guard lock(mutex_);
      EXPECT_FALSE(finished_) << "an update after the final one";
      tokens_.insert(tokens_.end(), update.tokens.begin(), update.tokens.end());
      updates_ += 1;
      if (update.finished) {
        finished_ = true;
        status_ = update.reason;
        error_ = update.error;
        if (update.stats != nullptr) stats_ = *update.stats;
        done_.notify_all();
      }
    };
  }
  void wait() {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(done_.wait_for(lock, std::chrono::seconds(120), [&] { return finished_; }))
        << "the request never finished";
  }
  std::vector<int32_t> tokens() {
    std::lock_guard lock(mutex_);
    return tokens_;
  }
  FinishReason status() {
    std::lock_guard lock(mutex_);
    return status_;
  }
  std::string error() {
    std::lock_guard lock(mutex_);
    return error_;
  }
  RequestStats stats() {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  int64_t updates() {
    std::lock_guard lock(mutex_);
    return updates_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<int32_t> tokens_;
  int64_t updates_ = 0;
  bool finished_ = false;
  FinishReason status_ = FinishReason::kMaxTokens;
  std::string error_;
  RequestStats stats_;
};

class BatchEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A layer-skip pair: the target's deep layers change little, the draft is its first layer.
    fixtures::GeneratorOptions options;
    options.vocab_size = 128;
    options.hidden_size = 64;
    options.intermediate_size = 128;
    options.num_layers = 3;
    options.num_heads = 4;
    options.num_kv_heads = 2;
    options.max_position_embeddings = 512;
    options.shallow_layers = 1;
    options.deep_layer_scale = 0.3f;
    options.eos_token_id = 2;
    fixtures::write_random_checkpoint(options, dir_ / "target");
    fixtures::write_truncated_checkpoint(dir_ / "target", 1, dir_ / "draft");
    target_ = load("target");
    draft_ = load("draft");
  }

  std::unique_ptr<Model> load(const std::string& name, int64_t kv_tokens = 4096) {
    ModelOptions options;
    options.kv_cache_tokens = kv_tokens;
    options.kv_block_size = 8;
    return Model::load(dir_ / name, *backend_, options);
  }

  static EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens, float temperature,
                               SpeculationMethod method, GammaControl controller, int64_t gamma,
                               uint64_t seed = 0) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.stop_at_eos = false;
    r.speculation = testing::speculation(method, controller, gamma);
    return r;
  }

  // A mix of prompts, lengths, methods and controllers, all greedy.
  std::vector<EngineRequest> greedy_mix(int count) {
    std::vector<EngineRequest> requests;
    const SpeculationMethod methods[] = {
        SpeculationMethod::kDraftModel, SpeculationMethod::kPromptLookup, SpeculationMethod::kNone};
    const GammaControl controllers[] = {GammaControl::kGoodput, GammaControl::kFixed,
                                        GammaControl::kHeuristic};
    for (int i = 0; i < count; ++i) {
      std::vector<int32_t> prompt = {1};
      for (int j = 0; j < 1 + (i * 7) % 23; ++j) prompt.push_back(3 + (i * 31 + j * 17) % 120);
      requests.push_back(request(prompt, 8 + (i * 13) % 40, 0.0f, methods[i % 3],
                                 controllers[(i / 3) % 3], 1 + i % 6));
    }
    return requests;
  }

  std::vector<int32_t> alone(const EngineRequest& r) {
    return testing::reference_decode(*target_, r.prompt, r.sampling).tokens;
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::Backend> backend_ = testing::make_suite_backend(2);
  std::unique_ptr<Model> target_;
  std::unique_ptr<Model> draft_;
};

TEST_F(BatchEngineTest, GreedyBatchedResultsEqualEachRequestAlone) {
  const std::vector<EngineRequest> requests = greedy_mix(30);
  std::vector<std::vector<int32_t>> expected;
  for (const EngineRequest& r : requests) expected.push_back(alone(r));
  BatchEngine engine(*target_, draft_.get(), {.max_batch = 16});
  std::vector<std::unique_ptr<Collector>> collectors;
  for (const EngineRequest& r : requests) {
    collectors.push_back(std::make_unique<Collector>());
    engine.submit(r, collectors.back()->callback());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->status(), FinishReason::kMaxTokens) << i;
    EXPECT_EQ(collectors[i]->tokens(), expected[i]) << "request " << i;
    EXPECT_EQ(collectors[i]->stats().tokens_generated, static_cast<int64_t>(expected[i].size()));
  }
  const BatchEngineStats stats = engine.stats();
  EXPECT_EQ(stats.submitted, 30);
  EXPECT_EQ(stats.finished, 30);
  EXPECT_GT(stats.sequence_steps, stats.steps);  // some steps ran several sequences
  EXPECT_GT(stats.drafted, 0);
}

TEST_F(BatchEngineTest, SampledRequestsAreTheSameAloneAndInABatch) {
  // Fixed gammas: the random streams are per request, so a request's tokens do not depend on its
  // batch mates.
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(
        request({1, 5 + i, 9, 40 + i}, 24, 0.9f,
                i % 2 ? SpeculationMethod::kDraftModel : SpeculationMethod::kPromptLookup,
                GammaControl::kFixed, 1 + i % 4, 100 + i));
  }
  std::vector<std::vector<int32_t>> expected;
  for (const EngineRequest& r : requests) {
    BatchEngine single(*target_, draft_.get(), {});
    Collector collector;
    single.submit(r, collector.callback());
    collector.wait();
    expected.push_back(collector.tokens());
  }
  BatchEngine engine(*target_, draft_.get(), {});
  std::vector<std::unique_ptr<Collector>> collectors;
  for (const EngineRequest& r : requests) {
    collectors.push_back(std::make_unique<Collector>());
    engine.submit(r, collectors.back()->callback());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->tokens(), expected[i]) << "request " << i;
  }
  // Different seeds give different samples (the streams really are per request).
  EXPECT_NE(expected[1], expected[3]);
}

TEST_F(BatchEngineTest, ManyThreadsSubmittingAtOnce) {
  const std::vector<EngineRequest> requests = greedy_mix(96);
  std::vector<std::vector<int32_t>> expected;
  for (const EngineRequest& r : requests) expected.push_back(alone(r));
  BatchEngine engine(*target_, draft_.get(), {.max_batch = 24});
  std::vector<std::unique_ptr<Collector>> collectors(requests.size());
  for (auto& collector : collectors) collector = std::make_unique<Collector>();
  std::vector<RequestId> ids(requests.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < requests.size(); i += 16) {
        ids[i] = engine.submit(requests[i], collectors[i]->callback());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<RequestId> unique(ids.begin(), ids.end());
  EXPECT_EQ(unique.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->tokens(), expected[i]) << "request " << i;
  }
  EXPECT_EQ(engine.stats().finished, static_cast<int64_t>(requests.size()));
}

TEST_F(BatchEngineTest, ShortKvCacheMakesRequestsWaitNotFail) {
  // Room for about two requests at a time (each reserves prompt + max_tokens positions).
  auto target = load("target", 160);
  auto draft = load("draft", 160);
  const std::vector<EngineRequest> requests = greedy_mix(9);
  std::vector<std::vector<int32_t>> expected;
  for (const EngineRequest& r : requests) expected.push_back(alone(r));
  // Expectations come first: the engine's models are its own while it runs.
  const EngineRequest greedy =
      request({1, 2, 3}, 400, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
  const std::vector<int32_t> expected_greedy =
      testing::reference_decode(*target, greedy.prompt, greedy.sampling).tokens;
  BatchEngine engine(*target, draft.get(), {});
  std::vector<std::unique_ptr<Collector>> collectors;
  for (const EngineRequest& r : requests) {
    collectors.push_back(std::make_unique<Collector>());
    engine.submit(r, collectors.back()->callback());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    collectors[i]->wait();
    EXPECT_EQ(collectors[i]->status(), FinishReason::kMaxTokens) << i;
    EXPECT_EQ(collectors[i]->tokens(), expected[i]) << "request " << i;
  }
  const BatchEngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);

  // A prompt that could never fit is refused at once, naming the sizes; a long max_tokens is
  // not an error: the request ends at the context limit, which counts the cache.
  EngineRequest huge = request(std::vector<int32_t>(200, 5), 4, 0.0f,
                               SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
  testing::expect_error([&] { engine.submit(huge, {}); }, {"200", "160"});
  Collector collector;
  engine.submit(greedy, collector.callback());
  collector.wait();
  EXPECT_EQ(collector.status(), FinishReason::kContextLimit);
  EXPECT_EQ(collector.tokens(), expected_greedy);
}

TEST_F(BatchEngineTest, CancelStopsARequestAndFreesItsBlocks) {
  BatchEngine engine(*target_, draft_.get(), {});
  std::atomic<RequestId> id{0};
  std::atomic<int> seen{0};
  Collector collector;
  UpdateCallback inner = collector.callback();
  EngineRequest r =
      request({1, 4, 5}, 400, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
  // Cancelled from its own callback after a few updates, by the id the update carries: the
  // scheduler can deliver them before submit() has returned the id to this thread.
  id = engine.submit(r, [&](const RequestUpdate& update) {
    inner(update);
    if (++seen == 3) {
      EXPECT_TRUE(engine.cancel(update.id));
    }
  });
  collector.wait();
  EXPECT_EQ(collector.status(), FinishReason::kCancelled);
  EXPECT_LT(collector.tokens().size(), 400u);
  EXPECT_FALSE(engine.cancel(id));  // already finished

  // Cancelled from another thread while queued or running.
  Collector other;
  const RequestId other_id = engine.submit(r, other.callback());
  std::thread([&] { EXPECT_TRUE(engine.cancel(other_id)); }).join();
  other.wait();
  EXPECT_EQ(other.status(), FinishReason::kCancelled);

  for (int i = 0; i < 100 && engine.stats().kv_tokens_free != engine.stats().kv_tokens_capacity;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine.stats().kv_tokens_free, engine.stats().kv_tokens_capacity);
  EXPECT_EQ(target_->kv_cache().num_sequences(), 0);
  EXPECT_EQ(draft_->kv_cache().num_sequences(), 0);
}

TEST_F(BatchEngineTest, ShutdownFinishesEveryRequest) {
  std::vector<std::unique_ptr<Collector>> collectors;
  {
    BatchEngine engine(*target_, draft_.get(), {.max_batch = 4});
    for (const EngineRequest& r : greedy_mix(20)) {
      EngineRequest longer = r;
      longer.sampling.max_tokens = 300;
      collectors.push_back(std::make_unique<Collector>());
      engine.submit(longer, collectors.back()->callback());
    }
    engine.shutdown();
    testing::expect_error([&] { engine.submit(greedy_mix(1)[0], {}); }, {"shut down"});
    engine.shutdown();  // idempotent
  }
  int shut_down = 0;
  for (auto& collector : collectors) {
    collector->wait();
    const FinishReason status = collector->status();
    EXPECT_TRUE(status == FinishReason::kShutdown || status == FinishReason::kMaxTokens);
    shut_down += status == FinishReason::kShutdown;
  }
  EXPECT_GT(shut_down, 0);
  EXPECT_EQ(target_->kv_cache().num_sequences(), 0);
}

TEST_F(BatchEngineTest, BadRequestsAreRefusedAtSubmit) {
  BatchEngine engine(*target_, draft_.get(), {});
  EngineRequest good =
      request({1, 2}, 4, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
  EngineRequest empty = good;
  empty.prompt.clear();
  testing::expect_error([&] { engine.submit(empty, {}); }, {"empty"});
  EngineRequest outside = good;
  outside.prompt = {1, 500};
  testing::expect_error([&] { engine.submit(outside, {}); }, {"500"});
  EngineRequest bad_gamma = good;
  bad_gamma.speculation.gamma = 9;
  bad_gamma.speculation.gamma_max = 8;
  testing::expect_error([&] { engine.submit(bad_gamma, {}); }, {"gamma"});
  EngineRequest bad_top_p = good;
  bad_top_p.sampling.top_p = 1.5f;
  testing::expect_error([&] { engine.submit(bad_top_p, {}); }, {"top_p"});
  EXPECT_EQ(engine.stats().submitted, 0);
}

TEST_F(BatchEngineTest, EndOfSequenceAndTheContextLimitStopARequest) {
  // Context: 512 positions; a prompt of 500 leaves room for 13 tokens.
  std::vector<int32_t> prompt(500, 7);
  prompt[0] = 1;
  const EngineRequest r =
      request(prompt, 100, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
  const testing::ReferenceRun expected = testing::reference_decode(*target_, prompt, r.sampling);
  // With EOS honoured, a request ends at the first EOS (not emitted), as the plain loop does.
  std::vector<EngineRequest> stopping = greedy_mix(12);
  std::vector<testing::ReferenceRun> plain;
  for (EngineRequest& item : stopping) {
    item.sampling.stop_at_eos = true;
    item.sampling.max_tokens = 60;
    plain.push_back(testing::reference_decode(*target_, item.prompt, item.sampling));
  }

  // The expectations come first: the engine's models are its own while it runs.
  BatchEngine engine(*target_, draft_.get(), {});
  Collector collector;
  engine.submit(r, collector.callback());
  collector.wait();
  EXPECT_EQ(collector.status(), FinishReason::kContextLimit);
  EXPECT_EQ(collector.tokens(), expected.tokens);
  EXPECT_EQ(expected.reason, FinishReason::kContextLimit);
  for (size_t i = 0; i < stopping.size(); ++i) {
    Collector c;
    engine.submit(stopping[i], c.callback());
    c.wait();
    EXPECT_EQ(c.tokens(), plain[i].tokens);
    EXPECT_EQ(c.status(), plain[i].reason);
  }
}

TEST_F(BatchEngineTest, GammaIsTheFirstDraftingStepsDepthUnderEveryController) {
  // The target drafting for itself accepts every draft, so nothing but the controller and the
  // budget limits what a step drafts. Under fixed and heuristic the first step drafts; under
  // goodput with gamma_min 1 the first step must draft too, and it drafts gamma.
  auto self = load("target");
  for (const GammaControl controller :
       {GammaControl::kFixed, GammaControl::kHeuristic, GammaControl::kGoodput}) {
    for (const int64_t gamma : {3, 6}) {
      BatchEngine engine(*target_, self.get(), {});
      EngineRequest r =
          request({1, 5, 9}, 40, 0.0f, SpeculationMethod::kDraftModel, controller, gamma);
      r.speculation.gamma_min = 1;
      std::vector<int64_t> drafted;  // per step, from the stats of each update
      int64_t seen = 0;
      std::mutex mutex;
      std::condition_variable done;
      bool finished = false;
      engine.submit(r, [&](const RequestUpdate& update) {
        std::lock_guard lock(mutex);
        drafted.push_back(update.stats->drafted - seen);
        seen = update.stats->drafted;
        finished = update.finished;
        if (finished) done.notify_all();
      });
      std::unique_lock lock(mutex);
      done.wait(lock, [&] { return finished; });
      ASSERT_FALSE(drafted.empty());
      EXPECT_EQ(drafted.front(), gamma) << to_string(controller) << ", gamma " << gamma;
    }
  }
}

TEST_F(BatchEngineTest, AHugeMaxTokensNeitherOverflowsNorStarvesOthers) {
  // prompt + max_tokens must not overflow the reservation: such a request reserves at most the
  // context limit, and the normal requests beside it all run.
  BatchEngine engine(*target_, draft_.get(), {});
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    EngineRequest huge =
        request({1, 3}, 0, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4);
    huge.sampling.max_tokens = std::numeric_limits<int64_t>::max();
    huge.sampling.stop_at_eos = true;
    requests.push_back(huge);
  }
  for (int i = 0; i < 8; ++i) {
    requests.push_back(
        request({1, 4, 5}, 6, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kGoodput, 4));
  }
  const std::vector<Completion> completions = engine.run(std::move(requests));
  for (size_t i = 0; i < completions.size(); ++i) {
    EXPECT_NE(completions[i].reason, FinishReason::kFailed) << i << ": " << completions[i].error;
    if (i >= 4) {
      EXPECT_EQ(completions[i].tokens.size(), 6u);
    }
  }
}

}  // namespace
}  // namespace specrun

namespace specrun {
namespace {

TEST_F(BatchEngineTest, ADraftOnAStreamOfItsOwnDecodesAsOnTheTargets) {
  // Engine::create gives the draft a stream of its own. The tokens are those of both models on
  // one stream, greedy and sampled, with every overlap setting. On a device whose streams run
  // concurrently (the deferred test backend claims to) kAuto then drafts ahead beside the
  // verification; with both models on one stream it never does.
  const std::unique_ptr<kernels::Backend> stream = backend_->create_stream();
  ASSERT_NE(stream, nullptr);
  ModelOptions options;
  options.kv_cache_tokens = 4096;
  options.kv_block_size = 8;
  const std::unique_ptr<Model> draft = Model::load(dir_ / "draft", *stream, options);
  for (const float temperature : {0.0f, 0.8f}) {
    for (const OverlapDrafting overlap :
         {OverlapDrafting::kAuto, OverlapDrafting::kOn, OverlapDrafting::kOff}) {
      SCOPED_TRACE("T " + std::to_string(temperature) + ", overlap " + to_string(overlap));
      std::vector<EngineRequest> requests;
      for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> prompt = {1};
        for (int j = 0; j < 6 + 5 * i; ++j) prompt.push_back(3 + (i * 29 + j * 13) % 120);
        requests.push_back(request(prompt, 20, temperature, SpeculationMethod::kDraftModel,
                                   GammaControl::kFixed, 3, static_cast<uint64_t>(i)));
      }
      const auto run = [&](Model* with_draft, BatchEngineStats* stats) {
        BatchEngine engine(*target_, with_draft, {.max_batch = 4, .overlap = overlap});
        std::vector<Completion> completions = engine.run(requests);
        *stats = engine.stats();
        return completions;
      };
      BatchEngineStats one_stream, two_streams;
      const std::vector<Completion> expected = run(draft_.get(), &one_stream);
      const std::vector<Completion> got = run(draft.get(), &two_streams);
      for (size_t i = 0; i < requests.size(); ++i) {
        ASSERT_EQ(got[i].tokens.size(), 20u) << got[i].error;
        EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
      }
      if (overlap == OverlapDrafting::kAuto) {
        EXPECT_EQ(one_stream.drafted_ahead, 0);
        if (stream->runs_models_concurrently()) {
          EXPECT_GT(two_streams.drafted_ahead, 0);
        } else {
          EXPECT_EQ(two_streams.drafted_ahead, 0);
        }
      }
    }
  }
}

TEST_F(BatchEngineTest, AHostVerifierOnABackendOutsideHostMemoryIsRefused) {
  // A replacement verifier (a test hook) reads the scores on the host, which a device keeps in
  // its own memory: the engine says so when it is made, rather than reading them.
  testing::DeferredBackend device(testing::make_cpu_backend(1), 0);
  ModelOptions options;
  options.kv_cache_tokens = 256;
  options.kv_block_size = 8;
  const std::unique_ptr<Model> target = Model::load(dir_ / "target", device, options);
  const GreedyVerifier verifier;
  try {
    BatchEngine engine(*target, nullptr, {.verifier = &verifier});
    FAIL() << "a host verifier on a device was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("replacement verifier"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("deferred"), std::string::npos) << error.what();
  }
}

// The CPU backend, whose draft model's output turns corrupt: NaN in the first row it samples.
class CorruptDraftBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Status run_sample(const kernels::SampleParams& params, const kernels::SampleRow* rows,
                    const float* logits, const int32_t* tokens, float* q, kernels::SampledRow* out,
                    int32_t* drawn) override {
    const_cast<float*>(logits)[0] = std::numeric_limits<float>::quiet_NaN();
    return ForwardingBackend::run_sample(params, rows, logits, tokens, q, out, drawn);
  }
};

TEST_F(BatchEngineTest, ADraftRowThatCannotBeSampledFailsTheRequestSayingWhy) {
  // The sample op reports the row's status; the request ends with the reason, not a crash: where
  // the host reads each draw (prompt lookup in the drafts), and where the drafts stay on the
  // backend and the statuses come back with the verdict.
  for (const int64_t lookup : {2, 0}) {
    SCOPED_TRACE("draft_lookup_ngram " + std::to_string(lookup));
    auto cpu = testing::make_cpu_backend(1);
    CorruptDraftBackend corrupt(*cpu);
    ModelOptions options;
    options.kv_cache_tokens = 256;
    options.kv_block_size = 8;
    const std::unique_ptr<Model> draft = Model::load(dir_ / "draft", corrupt, options);
    const std::unique_ptr<Model> target = Model::load(dir_ / "target", *cpu, options);
    BatchEngine engine(*target, draft.get(), {});
    EngineRequest r =
        request({1, 5, 9}, 8, 0.0f, SpeculationMethod::kDraftModel, GammaControl::kFixed, 3);
    r.speculation.draft_lookup_ngram = lookup;
    r.speculation.draft_alternates = 0;
    const Completion completion = engine.run(r);
    EXPECT_EQ(completion.reason, FinishReason::kFailed);
    EXPECT_NE(completion.error.find("drafting failed"), std::string::npos) << completion.error;
    EXPECT_NE(completion.error.find("the draft's row for sequence"), std::string::npos)
        << completion.error;
    EXPECT_NE(completion.error.find("NaN"), std::string::npos) << completion.error;
  }
}

// Requests whose drafts no decision of the host's reads (no prompt lookup, no alternates, no
// confidence floor): the drafts, and their q where rejection sampling reads it, stay where the
// draft drew them (Proposals::on_device). With `read_back`, a confidence floor no draft falls below
// (the draft's top probability is at least 1/128) has the host read every draw instead, for the
// same drafts. Temperature 0 is greedy, else `verification`'s rule.
std::vector<EngineRequest> drafts_on_device_requests(
    float temperature, int64_t gamma, bool read_back,
    Verification verification = Verification::kSharedNoise) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 3; ++i) {
    EngineRequest r;
    r.prompt = {1};
    for (int j = 0; j < 5 + 7 * i; ++j) r.prompt.push_back(3 + (i * 37 + j * 11) % 120);
    r.sampling.max_tokens = 18 + 3 * i;
    r.sampling.temperature = temperature;
    r.sampling.seed = static_cast<uint64_t>(i) + 5;
    r.sampling.stop_at_eos = false;
    r.speculation =
        testing::speculation(SpeculationMethod::kDraftModel, GammaControl::kFixed, gamma);
    r.speculation.verification = verification;
    r.speculation.draft_lookup_ngram = 0;
    r.speculation.draft_alternates = 0;
    r.speculation.draft_p_min = read_back ? 1e-6f : 0.0f;
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST_F(BatchEngineTest, DraftsLeftOnTheBackendDecodeAsDraftsReadBack) {
  // The target gathers the drafts (and rejection sampling's q) on its stream once it has waited
  // for the draft's event, and the host learns them from the verdict: one wait a step. Every step
  // accepts exactly what it accepts with the drafts read back, the tokens are the same, and they
  // are the target's alone (greedy) or the same with and without speculation (shared noise): with
  // the draft on the target's stream and on its own, on this suite's backend.
  const std::unique_ptr<kernels::Backend> stream = backend_->create_stream();
  ASSERT_NE(stream, nullptr);
  ModelOptions options;
  options.kv_cache_tokens = 4096;
  options.kv_block_size = 8;
  const std::unique_ptr<Model> own_stream_draft = Model::load(dir_ / "draft", *stream, options);
  struct Rule {
    float temperature;
    Verification verification;
  };
  const Rule rules[] = {{0.0f, Verification::kRejection},
                        {0.9f, Verification::kSharedNoise},
                        {0.9f, Verification::kRejection}};
  for (Model* draft : {draft_.get(), own_stream_draft.get()}) {
    for (const Rule& rule : rules) {
      for (const int64_t gamma : {1, 4}) {
        SCOPED_TRACE(std::string(draft == draft_.get() ? "one stream" : "two streams") + ", T " +
                     std::to_string(rule.temperature) + " by " + to_string(rule.verification) +
                     ", gamma " + std::to_string(gamma));
        const auto requests = [&](bool read_back) {
          return drafts_on_device_requests(rule.temperature, gamma, read_back, rule.verification);
        };
        const auto run = [&](bool read_back, BatchEngineStats* stats) {
          BatchEngine engine(*target_, draft, {.max_batch = 4, .overlap = OverlapDrafting::kOff});
          std::vector<Completion> completions = engine.run(requests(read_back));
          *stats = engine.stats();
          return completions;
        };
        BatchEngineStats on_device, read_back;
        const std::vector<Completion> got = run(false, &on_device);
        const std::vector<Completion> expected = run(true, &read_back);
        std::vector<EngineRequest> plain = requests(false);
        for (EngineRequest& r : plain) r.speculation.method = SpeculationMethod::kNone;
        BatchEngine target_only(*target_, nullptr, {.max_batch = 4});
        const std::vector<Completion> unspeculated = target_only.run(plain);
        // Rejection sampling's tokens depend on the drafts; greedy and shared noise's do not.
        const bool drafter_invariant =
            rule.verification != Verification::kRejection || rule.temperature == 0.0f;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NE(got[i].reason, FinishReason::kFailed) << got[i].error;
          EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
          if (drafter_invariant) {
            EXPECT_EQ(got[i].tokens, unspeculated[i].tokens) << "request " << i;
          }
          EXPECT_EQ(got[i].stats.accepted, expected[i].stats.accepted) << "request " << i;
        }
        EXPECT_GT(on_device.drafted, 0);
        EXPECT_EQ(on_device.drafted, read_back.drafted);
        EXPECT_EQ(on_device.accepted, read_back.accepted);
        EXPECT_EQ(on_device.host_waits, on_device.steps) << "one wait a step";
        EXPECT_GT(read_back.host_waits, read_back.steps) << "the floor reads the draws back";
      }
    }
  }
}

TEST_F(BatchEngineTest, DraftsLeftOnTheBackendAreCommittedTextInBothCaches) {
  // The caches recorded stand-ins for the drafts fed from the backend's memory; the accepted ones
  // are rewritten with their ids before they are sealed, so a request continuing a finished
  // request's text reuses its generated blocks in both caches, and decodes as the target does
  // alone.
  EngineRequest first = drafts_on_device_requests(0.0f, 4, false).front();
  first.sampling.max_tokens = 40;
  const BatchEngineOptions options{.max_batch = 4, .overlap = OverlapDrafting::kOff};
  EngineRequest second = first;
  {
    BatchEngine engine(*target_, draft_.get(), options);
    const Completion a = engine.run(first);
    ASSERT_EQ(a.tokens.size(), 40u) << a.error;
    EXPECT_EQ(engine.stats().host_waits, engine.stats().steps);
    second.prompt.insert(second.prompt.end(), a.tokens.begin(), a.tokens.end());
  }
  // The draft's cache sealed the generated text under its ids.
  KvCache& cache = draft_->kv_cache();
  const SequenceId probe = cache.add_sequence();
  const int64_t reused = cache.reuse_prefix(probe, second.prompt);
  cache.remove_sequence(probe);
  EXPECT_GT(reused, static_cast<int64_t>(first.prompt.size()) + 16);
  // So did the target's: a request continuing the text reuses every full block of it but its
  // last token.
  second.sampling.max_tokens = 12;
  Completion b;
  {
    BatchEngine engine(*target_, draft_.get(), options);
    b = engine.run(second);
  }
  ASSERT_EQ(b.tokens.size(), 12u) << b.error;
  EXPECT_EQ(b.tokens, alone(second));  // the models are the test's again once the engine is gone
  const int64_t reusable = (static_cast<int64_t>(second.prompt.size()) - 1) / 8 * 8;
  EXPECT_EQ(b.stats.cached_prompt_tokens, reusable);
  EXPECT_GT(reusable, static_cast<int64_t>(first.prompt.size()) + 8);
}

TEST_F(BatchEngineTest, ADroppedWaitForTheDraftsIsCaughtOnTheDeferredBackend) {
  // On the deferred test backend the draft's rounds run only when something forces them. With the
  // target's wait for the draft's event dropped (a deliberately broken engine), the target gathers
  // the draws before the draft has drawn them. The output may still be the target's (the
  // verification is exact whatever it is given): what gives the bug away is that the steps no
  // longer accept what the correct engine's accept, or that garbage ids fail the request.
  testing::DeferredBackend device(testing::make_cpu_backend(2), 0);
  const std::unique_ptr<kernels::Backend> stream = device.create_stream();
  ASSERT_NE(stream, nullptr);
  ModelOptions options;
  options.kv_cache_tokens = 1024;
  options.kv_block_size = 8;
  const std::unique_ptr<Model> target = Model::load(dir_ / "target", device, options);
  const std::unique_ptr<Model> draft = Model::load(dir_ / "draft", *stream, options);
  const std::vector<EngineRequest> requests = drafts_on_device_requests(0.0f, 4, false);
  const auto run = [&](bool skip_wait, BatchEngineStats* stats) {
    BatchEngine engine(
        *target, draft.get(),
        {.max_batch = 4, .overlap = OverlapDrafting::kOff, .skip_draft_wait = skip_wait});
    std::vector<Completion> completions = engine.run(requests);
    *stats = engine.stats();
    return completions;
  };
  BatchEngineStats correct, broken;
  const std::vector<Completion> waited = run(false, &correct);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_NE(waited[i].reason, FinishReason::kFailed) << waited[i].error;
    EXPECT_EQ(waited[i].tokens, alone(requests[i])) << "request " << i;
  }
  EXPECT_EQ(correct.host_waits, correct.steps);
  EXPECT_GT(correct.accepted, correct.drafted / 2) << "the pair agrees on most drafts";
  const std::vector<Completion> raced = run(true, &broken);
  const bool failed = std::any_of(raced.begin(), raced.end(), [](const Completion& completion) {
    return completion.reason == FinishReason::kFailed;
  });
  EXPECT_TRUE(failed || broken.accepted != correct.accepted)
      << "the dropped wait went unnoticed: " << broken.accepted << " of " << broken.drafted
      << " accepted, as with the wait";
}

TEST_F(BatchEngineTest, AcceptanceIsCountedByDraftPosition) {
  // Each step's drafts count at their positions: the totals are drafted and accepted, a position
  // is never drafted or accepted more often than the one before it, and the first is drafted in
  // every step that drafts.
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 4 + 3 * i; ++j) prompt.push_back(3 + (i * 31 + j * 7) % 120);
    requests.push_back(request(prompt, 30, i % 2 == 0 ? 0.0f : 0.8f, SpeculationMethod::kDraftModel,
                               GammaControl::kFixed, 2 + i, static_cast<uint64_t>(i)));
  }
  BatchEngine engine(*target_, draft_.get(), {.max_batch = 4});
  for (const Completion& completion : engine.run(requests)) {
    ASSERT_EQ(completion.tokens.size(), 30u) << completion.error;
  }
  const BatchEngineStats stats = engine.stats();
  ASSERT_EQ(stats.drafted_at.size(), stats.accepted_at.size());
  EXPECT_EQ(stats.drafted_at.size(), 5u) << "the largest gamma";
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < stats.drafted_at.size(); ++i) {
    drafted += stats.drafted_at[i];
    accepted += stats.accepted_at[i];
    EXPECT_LE(stats.accepted_at[i], stats.drafted_at[i]) << "position " << i;
    if (i > 0) {
      EXPECT_LE(stats.drafted_at[i], stats.drafted_at[i - 1]) << "position " << i;
      EXPECT_LE(stats.accepted_at[i], stats.accepted_at[i - 1]) << "position " << i;
    }
  }
  EXPECT_EQ(drafted, stats.drafted);
  EXPECT_EQ(accepted, stats.accepted);
  EXPECT_GT(stats.accepted_at[0], 0);
  EXPECT_LE(stats.drafted_at[0], stats.sequence_steps);
}

TEST_F(BatchEngineTest, AStepWaitsOnceAndReadsBackOnlyTokens) {
  // The target's logits are processed and verified where they were computed: a step waits for the
  // backend once (the verdict) and copies back a few words a row, however many drafts it verified
  // and whatever the sampling: at most (gamma + 2) x rows x 8 bytes. Plain decoding and prompt
  // lookup draft on the host without reading any logits. A draft model samples its rows where
  // they were computed too and reads back a SampledRow a row and draft (a few dozen bytes, where a
  // row of logits is vocab x 4), and rejection sampling, which reads q on the host, its
  // distributions: once a step, its rounds feeding one another on the backend, or once a draft
  // position where prompt lookup may propose in the model's place (the host decides each round).
  // Where no decision of the host's reads the draws (no lookup, no alternates), the draft's step is
  // not waited for at all, nor its q copied: one wait a step, tokens only.
  struct Case {
    SpeculationMethod method;
    float temperature;
    bool shared_noise;
    bool lookup_in_drafts = false;  // speculative.draft_lookup_ngram
    bool alternates = true;         // speculative.draft_alternates 2, else 0
  };
  const Case cases[] = {{SpeculationMethod::kNone, 0.0f, false},
                        {SpeculationMethod::kNone, 0.8f, false},
                        {SpeculationMethod::kPromptLookup, 0.0f, false},
                        {SpeculationMethod::kPromptLookup, 0.8f, false},
                        {SpeculationMethod::kPromptLookup, 0.8f, true},
                        {SpeculationMethod::kDraftModel, 0.0f, false},
                        {SpeculationMethod::kDraftModel, 0.8f, true},
                        {SpeculationMethod::kDraftModel, 0.8f, false},
                        {SpeculationMethod::kDraftModel, 0.0f, false, true},
                        {SpeculationMethod::kDraftModel, 0.8f, true, true},
                        {SpeculationMethod::kDraftModel, 0.8f, false, true},
                        {SpeculationMethod::kDraftModel, 0.0f, false, false, false},
                        {SpeculationMethod::kDraftModel, 0.8f, true, false, false},
                        {SpeculationMethod::kDraftModel, 0.8f, false, false, false}};
  const int64_t gamma = 4;
  const int64_t vocab = draft_->config().vocab_size;
  ASSERT_GT(vocab * 4, static_cast<int64_t>(sizeof(kernels::SampledRow)));
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(to_string(c.method)) + " at T " + std::to_string(c.temperature) +
                 (c.shared_noise ? " with shared noise" : "") +
                 (c.lookup_in_drafts ? ", lookup in the drafts" : "") +
                 (c.alternates ? "" : ", no alternates"));
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 3; ++i) {
      // Repetitive prompts, so that prompt lookup finds drafts.
      std::vector<int32_t> prompt = {1};
      for (int j = 0; j < 24; ++j) prompt.push_back(5 + (j + i) % 6);
      EngineRequest r = request(prompt, 24, c.temperature, c.method, GammaControl::kFixed, gamma,
                                static_cast<uint64_t>(i));
      r.speculation.verification =
          c.shared_noise ? Verification::kSharedNoise : Verification::kRejection;
      r.speculation.draft_lookup_ngram = c.lookup_in_drafts ? 2 : 0;
      r.speculation.draft_alternates = c.alternates ? 2 : 0;
      requests.push_back(std::move(r));
    }
    BatchEngine engine(*target_, draft_.get(), {.max_batch = 4});
    const std::vector<Completion> completions = engine.run(requests);
    for (const Completion& completion : completions) {
      ASSERT_EQ(completion.tokens.size(), 24u) << completion.error;
    }
    const BatchEngineStats stats = engine.stats();
    const uint64_t verdict_bytes = static_cast<uint64_t>(stats.sequence_steps * (gamma + 2) * 8);
    // Without lookup or alternates the drafts (and rejection sampling's q) stay on the backend:
    // the target gathers them, and the verdict brings their rows' statuses back with it.
    const bool drafts_stay =
        c.method == SpeculationMethod::kDraftModel && !c.lookup_in_drafts && !c.alternates;
    if (c.method != SpeculationMethod::kDraftModel || drafts_stay) {
      EXPECT_EQ(stats.host_waits, stats.steps);
      EXPECT_LE(stats.bytes_to_host, verdict_bytes);
    } else {
      const bool reads_q = c.temperature > 0.0f && !c.shared_noise;
      EXPECT_GT(stats.drafted, 0);
      EXPECT_LE(stats.host_waits, stats.steps * (1 + (c.lookup_in_drafts ? gamma : 1)));
      const uint64_t per_draft =
          sizeof(kernels::SampledRow) + (reads_q ? static_cast<uint64_t>(vocab) * 4 : 0);
      EXPECT_LE(stats.bytes_to_host,
                verdict_bytes + static_cast<uint64_t>(stats.sequence_steps * gamma) * per_draft);
    }
    EXPECT_GT(stats.bytes_to_host, 0u);
    if (c.method == SpeculationMethod::kPromptLookup) {
      EXPECT_GT(stats.drafted, 0);
    }
  }
}

}  // namespace
}  // namespace specrun
