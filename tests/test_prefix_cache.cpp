// Prefix caching through the engine's step: every output bit is the same with the cache on and
// off (greedy and sampled, plain and speculative, prefixes ending at, before and after a block
// boundary, conversations continued, requests cancelled, blocks evicted under memory pressure,
// many threads), the draft's cache is reused too, and the stats count what came from the cache.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/engine/batch_engine.h"
#include "runtime/sampling/rng.h"
#include "tests/deferred_backend.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

constexpr int64_t kBlock = 8;

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A layer-skip pair: drafts are accepted often, so steps mix acceptance and rollback.
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
  }

  // The pair with the cache on or off, `kv_tokens` positions each.
  struct Pair {
    std::unique_ptr<Model> target;
    std::unique_ptr<Model> draft;
  };
  Pair load(bool prefix_cache, int64_t kv_tokens = 4096) {
    ModelOptions options;
    options.kv_cache_tokens = kv_tokens;
    options.kv_block_size = kBlock;
    options.prefix_cache = prefix_cache;
    return {Model::load(dir_ / "target", *backend_, options),
            Model::load(dir_ / "draft", *backend_, options)};
  }

  // `count` token ids drawn from `seed` (never BOS 1 or EOS 2).
  static std::vector<int32_t> text(size_t count, uint64_t seed) {
    Rng rng(seed);
    std::vector<int32_t> tokens(count);
    for (int32_t& token : tokens) token = static_cast<int32_t>(3 + rng.next() % 120);
    return tokens;
  }

  static std::vector<int32_t> join(std::vector<int32_t> head, const std::vector<int32_t>& tail) {
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  }

  // One of five ways to decode: plain greedy, greedy with the draft (fixed and goodput), sampled
  // with shared noise under goodput, sampled by rejection at a fixed gamma.
  static EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens, int flavour,
                               uint64_t seed) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.sampling = testing::greedy(max_tokens);
    const GammaControl controls[] = {GammaControl::kFixed, GammaControl::kFixed,
                                     GammaControl::kGoodput, GammaControl::kGoodput,
                                     GammaControl::kFixed};
    r.speculation = testing::speculation(
        flavour == 0 ? SpeculationMethod::kNone : SpeculationMethod::kDraftModel,
        controls[flavour % 5], flavour == 4 ? 2 : 3);
    if (flavour >= 3) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = seed;
    }
    if (flavour == 4) r.speculation.verification = Verification::kRejection;
    return r;
  }

  // The waves one after another through one engine (so later waves find what earlier ones
  // sealed), each wave's requests decoded together.
  static std::vector<Completion> run_waves(Pair& pair,
                                           const std::vector<std::vector<EngineRequest>>& waves,
                                           int64_t max_batch = 64) {
    BatchEngine engine(*pair.target, pair.draft.get(), {.max_batch = max_batch});
    std::vector<Completion> completions;
    for (const auto& wave : waves) {
      for (Completion& completion : engine.run(wave)) completions.push_back(std::move(completion));
    }
    return completions;
  }

  static int64_t cached_tokens(const std::vector<Completion>& completions) {
    int64_t total = 0;
    for (const Completion& completion : completions) {
      total += completion.stats.cached_prompt_tokens;
    }
    return total;
  }

  static void expect_same(const std::vector<Completion>& on, const std::vector<Completion>& off) {
    ASSERT_EQ(on.size(), off.size());
    for (size_t i = 0; i < on.size(); ++i) {
      EXPECT_EQ(on[i].reason, off[i].reason) << "request " << i << ": " << on[i].error;
      EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<kernels::Backend> backend_ = testing::make_suite_backend(2);
};

TEST_F(PrefixCacheTest, OutputIsBitwiseTheSameWithTheCacheOnAndOff) {
  const std::vector<int32_t> system = join({1}, text(5 * kBlock - 1, 7));  // 5 whole blocks
  // Prefixes of the system prompt ending one token before, at and one after block boundaries,
  // then a suffix of the request's own; the system prompt itself, and one token past it.
  std::vector<std::vector<int32_t>> prompts;
  for (const size_t shared : {size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{16}, size_t{17},
                              size_t{33}, size_t{40}}) {
    const std::vector<int32_t> head(system.begin(), system.begin() + shared);
    prompts.push_back(join(head, text(1 + shared % 5, 100 + shared)));
  }
  prompts.push_back(system);
  prompts.push_back(join(system, {5}));
  for (int flavour = 0; flavour < 5; ++flavour) {
    SCOPED_TRACE("flavour " + std::to_string(flavour));
    // First the system prompt alone, then every prompt at once, then every prompt again.
    std::vector<std::vector<EngineRequest>> waves(3);
    waves[0].push_back(request(system, 12, flavour, 1));
    for (size_t i = 0; i < prompts.size(); ++i) {
      waves[1].push_back(request(prompts[i], 12 + static_cast<int64_t>(i % 3) * 7, flavour, i));
      waves[2].push_back(request(prompts[i], 12, flavour, 50 + i));
    }
    Pair on = load(true), off = load(false);
    const std::vector<Completion> cached = run_waves(on, waves);
    const std::vector<Completion> computed = run_waves(off, waves);
    expect_same(cached, computed);
    EXPECT_GT(cached_tokens(cached), 0);
    EXPECT_EQ(cached_tokens(computed), 0);
    // Fixed gammas draft every step; goodput may decode plainly throughout, on timings alone (a
    // loaded CI machine made it so once), leaving the draft's cache unused.
    if (flavour == 1 || flavour == 4) {
      EXPECT_GT(on.draft->kv_cache().reused_positions(), 0) << "the draft's cache";
    }
    // A greedy run is also the reference decode.
    if (flavour < 3) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        const EngineRequest& r = waves[2][i];
        EXPECT_EQ(cached[1 + prompts.size() + i].tokens,
                  testing::reference_decode(*off.target, r.prompt, r.sampling).tokens);
      }
    }
  }
}

TEST_F(PrefixCacheTest, AConversationContinuesFromItsOwnCachedAnswer) {
  // Turn two's prompt is turn one's prompt, its answer and a new question: the answer's blocks,
  // sealed as they were committed, are reused.
  for (const int flavour : {1, 3}) {
    Pair on = load(true), off = load(false);
    const std::vector<int32_t> first_prompt = join({1}, text(20, 3));
    std::vector<std::vector<int32_t>> turns;
    for (Pair* pair : {&on, &off}) {
      BatchEngine engine(*pair->target, pair->draft.get(), {});
      const Completion first = engine.run(request(first_prompt, 30, flavour, 9));
      const std::vector<int32_t> second_prompt = join(join(first_prompt, first.tokens), text(5, 4));
      const Completion second = engine.run(request(second_prompt, 20, flavour, 10));
      turns.push_back(second.tokens);
      if (pair == &on) {
        // Turn one's text but its last token (which was never fed), in whole blocks.
        EXPECT_EQ(second.stats.cached_prompt_tokens,
                  (static_cast<int64_t>(first_prompt.size() + first.tokens.size() - 1) / kBlock) *
                      kBlock);
      }
    }
    EXPECT_EQ(turns[0], turns[1]) << "flavour " << flavour;
  }
}

// Requests admitted together with one prompt (a server's n choices) prefill it once: the first
// computes its blocks, the others reuse them in a second wave of the same admission, and the
// output is the same as with the cache off. A different prompt in the batch prefills alongside.
TEST_F(PrefixCacheTest, RequestsAdmittedTogetherWithOnePromptPrefillItOnce) {
  const std::vector<int32_t> prompt = join({1}, text(3 * kBlock + 5, 44));
  std::vector<EngineRequest> together;
  for (int i = 0; i < 4; ++i) together.push_back(request(prompt, 8, 3, 100 + i));
  together.push_back(request(join({1}, text(2 * kBlock, 45)), 8, 1, 0));
  Pair on = load(true), off = load(false);
  const std::vector<Completion> cached = run_waves(on, {together});
  expect_same(cached, run_waves(off, {together}));
  const auto whole_blocks = static_cast<int64_t>((prompt.size() - 1) / kBlock * kBlock);
  EXPECT_EQ(cached[0].stats.cached_prompt_tokens, 0);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(cached[static_cast<size_t>(i)].stats.cached_prompt_tokens, whole_blocks) << i;
  }
  EXPECT_EQ(cached[4].stats.cached_prompt_tokens, 0);
}

TEST_F(PrefixCacheTest, ABlockIsReusedOnlyAfterTheSamePrefix) {
  // X S and Y T are cached; Y S holds S's tokens after another first block, so only Y may be
  // reused: S's keys and values there depend on Y.
  const std::vector<int32_t> x = join({1}, text(kBlock - 1, 40)),
                             y = join({1}, text(kBlock - 1, 41));
  const std::vector<int32_t> s = text(kBlock, 42), t = text(kBlock, 43);
  const std::vector<std::vector<EngineRequest>> waves = {
      {request(join(join(x, s), {9}), 10, 1, 0), request(join(join(y, t), {9}), 10, 1, 0)},
      {request(join(join(y, s), {9}), 10, 1, 0)}};
  Pair on = load(true), off = load(false);
  const std::vector<Completion> cached = run_waves(on, waves);
  expect_same(cached, run_waves(off, waves));
  EXPECT_EQ(cached[2].stats.cached_prompt_tokens, kBlock);
}

TEST_F(PrefixCacheTest, EvictionUnderMemoryPressureChangesNoOutput) {
  // 12 blocks for everything: three system prompts of 3 blocks each, each request reserving up
  // to 6 blocks, two at a time, so the cached prompts are evicted and recomputed again and again.
  std::vector<std::vector<int32_t>> systems;
  for (uint64_t s = 0; s < 3; ++s) systems.push_back(join({1}, text(3 * kBlock - 1, 20 + s)));
  std::vector<std::vector<EngineRequest>> waves;
  for (int i = 0; i < 18; ++i) {
    if (i % 2 == 0) waves.emplace_back();
    const std::vector<int32_t> prompt =
        join(systems[static_cast<size_t>((i / 2 + i % 2) % 3)], text(1 + i % 4, 60 + i));
    waves.back().push_back(request(prompt, 16, i % 5, static_cast<uint64_t>(i)));
  }
  Pair on = load(true, 12 * kBlock), off = load(false, 12 * kBlock);
  const std::vector<Completion> cached = run_waves(on, waves);
  const std::vector<Completion> computed = run_waves(off, waves);
  expect_same(cached, computed);
  EXPECT_GT(cached_tokens(cached), 0);
  // Far more blocks were sealed than fit: the cache evicted to make room, and every request ran.
  EXPECT_LE(on.target->kv_cache().cached_blocks(), 12);
  for (const Completion& completion : cached) {
    EXPECT_EQ(completion.reason, FinishReason::kMaxTokens) << completion.error;
  }
  EXPECT_EQ(on.target->kv_cache().free_blocks(), 12);
  EXPECT_EQ(on.draft->kv_cache().free_blocks(), 12);
}

TEST_F(PrefixCacheTest, CancelledRequestsLeaveTheCacheConsistent) {
  const std::vector<int32_t> prompt = join({1}, text(6 * kBlock + 3, 11));
  std::vector<std::vector<int32_t>> outputs;
  for (const bool prefix_cache : {true, false}) {
    Pair pair = load(prefix_cache);
    BatchEngine engine(*pair.target, pair.draft.get(), {});
    // Cancelled at once, from another thread: queued, or just prefilled. Its updates wait for
    // the cancellation to be sent, so that it cannot finish first (200 tokens of the test pair
    // take a few milliseconds, less than a busy machine may take to start a thread).
    std::mutex mutex;
    std::condition_variable done;
    int finished = 0;
    FinishReason reason = FinishReason::kMaxTokens;
    std::atomic<bool> cancel_sent{false};
    const RequestId id = engine.submit(request(prompt, 200, 1, 0), [&](const RequestUpdate& u) {
      if (!u.finished) {
        cancel_sent.wait(false);
        return;
      }
      std::lock_guard lock(mutex);
      reason = u.reason;
      finished += 1;
      done.notify_all();
    });
    std::thread([&] {
      EXPECT_TRUE(engine.cancel(id));
      cancel_sent = true;
      cancel_sent.notify_all();
    }).join();
    // Cancelled from its own callback after two updates, mid-decode. By the update's id: the
    // scheduler may deliver both before submit() has returned the id.
    std::atomic<int> updates{0};
    std::vector<int32_t> partial;
    engine.submit(request(prompt, 200, 3, 5), [&](const RequestUpdate& u) {
      std::lock_guard lock(mutex);
      partial.insert(partial.end(), u.tokens.begin(), u.tokens.end());
      if (++updates == 2) {
        EXPECT_TRUE(engine.cancel(u.id));
      }
      if (!u.finished) return;
      finished += 1;
      done.notify_all();
    });
    {
      std::unique_lock lock(mutex);
      ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(120), [&] { return finished == 2; }));
    }
    EXPECT_EQ(reason, FinishReason::kCancelled);
    // The same prompt again, and the cancelled request's text continued.
    const Completion again = engine.run(request(prompt, 24, 2, 0));
    const Completion continued = engine.run(request(join(prompt, partial), 24, 4, 7));
    outputs.push_back(join(again.tokens, continued.tokens));
    if (prefix_cache) {
      EXPECT_GT(again.stats.cached_prompt_tokens, 0);
      EXPECT_GT(continued.stats.cached_prompt_tokens, 0);
    }
    EXPECT_EQ(pair.target->kv_cache().num_sequences(), 0);
    EXPECT_EQ(pair.target->kv_cache().free_blocks(), pair.target->kv_cache().layout().num_blocks);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST_F(PrefixCacheTest, StatsCountThePromptTokensTakenFromTheCache) {
  Pair pair = load(true);
  BatchEngine engine(*pair.target, pair.draft.get(), {});
  const std::vector<int32_t> prompt = join({1}, text(5 * kBlock, 13));  // 41 tokens
  EXPECT_EQ(engine.run(request(prompt, 4, 1, 0)).stats.cached_prompt_tokens, 0);
  // The prompt but its last token goes into the cache: 40 positions, five whole blocks.
  EXPECT_EQ(engine.run(request(prompt, 4, 1, 0)).stats.cached_prompt_tokens, 40);
  // One token shorter: 39 positions, four whole blocks.
  const std::vector<int32_t> shorter(prompt.begin(), prompt.end() - 1);
  EXPECT_EQ(engine.run(request(shorter, 4, 1, 0)).stats.cached_prompt_tokens, 32);
  const BatchEngineStats stats = engine.stats();
  EXPECT_EQ(stats.prompt_tokens, 41 + 41 + 40);
  EXPECT_EQ(stats.cached_prompt_tokens, 72);
  EXPECT_GT(stats.kv_tokens_cached, 0);
  EXPECT_EQ(stats.kv_tokens_free, stats.kv_tokens_capacity);
}

TEST_F(PrefixCacheTest, ManyThreadsSharingPrefixesWithCancellations) {
  // Greedy requests from eight threads over two system prompts; every third one is cancelled
  // from its submitting thread. The rest equal the reference decode on a cache-free model.
  Pair on = load(true), off = load(false);
  const std::vector<std::vector<int32_t>> systems = {join({1}, text(19, 30)),
                                                     join({1}, text(27, 31))};
  constexpr int kThreads = 8, kPerThread = 6;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    requests.push_back(request(join(systems[static_cast<size_t>(i % 2)], text(i % 7, 200 + i)),
                               10 + i % 9, i % 3, 0));
  }
  std::vector<std::vector<int32_t>> tokens(requests.size());
  std::vector<FinishReason> reasons(requests.size(), FinishReason::kFailed);
  {
    BatchEngine engine(*on.target, on.draft.get(), {.max_batch = 6});
    std::mutex mutex;
    std::condition_variable done;
    size_t finished = 0;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const size_t i = static_cast<size_t>(t * kPerThread + k);
          const RequestId id = engine.submit(requests[i], [&, i](const RequestUpdate& u) {
            std::lock_guard lock(mutex);
            tokens[i].insert(tokens[i].end(), u.tokens.begin(), u.tokens.end());
            if (!u.finished) return;
            reasons[i] = u.reason;
            finished += 1;
            done.notify_all();
          });
          if (i % 3 == 2) engine.cancel(id);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    std::unique_lock lock(mutex);
    ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(300),
                              [&] { return finished == requests.size(); }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (reasons[i] == FinishReason::kCancelled) continue;
    EXPECT_EQ(reasons[i], FinishReason::kMaxTokens) << "request " << i;
    EXPECT_EQ(
        tokens[i],
        testing::reference_decode(*off.target, requests[i].prompt, requests[i].sampling).tokens)
        << "request " << i;
  }
  EXPECT_GT(on.target->kv_cache().reused_positions(), 0);
  EXPECT_EQ(on.target->kv_cache().num_sequences(), 0);
}

}  // namespace
}  // namespace specrun
