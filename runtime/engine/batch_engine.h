// The decode loop: continuous batching under speculative decoding, on token ids. It is the only
// one: plain decoding is a step with no drafts, one request is a batch of one, and the API, the
// CLI, the C ABI, the benchmarks and the tests all run it.
//
// A scheduler thread admits queued requests between steps while the batch and the KV caches have
// room, and runs one step for every running sequence at once, in phases: plan (each sequence's
// gamma policy says how many drafts), propose (the draft model for all its rows in one batched
// pass per draft position; prompt lookup per row), score (one batched target forward), verify
// (each row by its own request's rule: greedy or rejection sampling), commit and roll back both
// caches per sequence, deliver. The policies see every step's outcome and costs, so gamma falls
// as the batch grows and speculation stops paying, and rises again as load drops.
//
// With overlapped drafting, the draft proposes past each row's drafts (as if all were accepted)
// after the step has enqueued the target's forward and verification and before it waits for the
// verdict: with the draft on a stream of its own (Backend::create_stream), a device runs it beside
// the verification. A row whose drafts are all accepted, and whose new token is the draft's own
// next one, takes the drafts after it as its next proposals; every other row drops them and the
// draft's cache rolls back. Each draft is drawn with the random numbers of the output position it
// is proposed for, so the output is bitwise the same with overlap on and off.
//
// KV room is reserved at admission for a request's worst case (prompt + max_tokens, or the
// context limit, which counts the cache), so a running sequence never runs out and the rest wait;
// a prompt longer than the context limit is refused at submit(). A prompt starts from the cached
// blocks of an earlier sequence with the same prefix where there are some (prefix caching, in both
// models' caches); the reservation still counts them, so caching never makes a request wait.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/stats.h"
#include "runtime/grammar/matcher.h"
#include "runtime/model/model.h"
#include "specrun/logprobs.hpp"
#include "specrun/settings.hpp"

namespace specrun {

class Verifier;

using RequestId = uint64_t;

struct EngineRequest {
  std::vector<int32_t> prompt;            // token ids (BOS included when wanted); not empty
  SamplingSettings sampling;              // sampling, penalties, max_tokens, stop_at_eos
  SpeculationSettings speculation;        // method, controller, gamma limits, draft_p_min, lookup
  std::map<int32_t, float> logit_bias{};  // added to these tokens' logits at every position
  // Log-probabilities of each generated token with this many top tokens beside it (at most
  // kMaxTopLogprobs); -1: none. A request asking for them, or with penalties, bias or a grammar,
  // brings no alternates (a token tree's rows would need their own processing).
  int64_t logprobs = -1;
  // The prompt's log-probabilities (each token's after the first, from the target's raw logits)
  // with this many top tokens beside each, delivered with the first update; -1: none. The prompt
  // is then computed whole, not taken from the prefix cache.
  int64_t prompt_logprobs = -1;
  // Structured output: the generated text follows this grammar, spelled in this vocabulary of
  // the target's (runtime/grammar); both null: free text.
  std::shared_ptr<const grammar::Grammar> grammar{};
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary{};
};

// What one step did for one request, delivered on the scheduler thread.
struct RequestUpdate {
  RequestId id = 0;
  std::span<const int32_t> tokens;                 // tokens committed by this step (may be empty)
  bool finished = false;                           // the request's last update
  FinishReason reason = FinishReason::kMaxTokens;  // when finished
  std::string error;                               // when reason is kFailed
  const RequestStats* stats = nullptr;  // the request's figures so far (final when finished)
  int64_t drafted = 0;                  // drafts the target verified in the step
  // The first this many of `tokens` are drafts the target accepted; the rest (one, unless the
  // request stopped first) it chose itself.
  int64_t accepted_drafts = 0;
  std::span<const TokenLogprob> logprobs;  // one per token, where the request asked for them
  // The prompt's, one per token after its first, in the request's first update (where it asked).
  std::span<const TokenLogprob> prompt_logprobs;
};

// Called for every update of a request, in order, on the scheduler thread, with no engine lock
// held: it may call cancel() but not submit() or shutdown(). The batch waits for it, so it must be
// short.
using UpdateCallback = std::function<void(const RequestUpdate&)>;

struct BatchEngineOptions {
  int64_t max_batch = 64;  // running sequences at most
  // Replaces the verification of every row (on the target's backend, Backend::verify) with a rule
  // run on the host when set: tests pass deliberately broken ones to show that the distribution
  // checks catch them. Needs a target backend in host memory. Must outlive the engine.
  const Verifier* verifier = nullptr;
  // Drafting ahead while the target verifies (specrun/settings.hpp's OverlapDrafting). kAuto leaves
  // it to each row's gamma policy where the draft has a stream of its own that the device runs
  // beside the target's (a GPU's; the CPU runs one op at a time).
  OverlapDrafting overlap = OverlapDrafting::kAuto;
  // The most logits (rows times the vocabulary) a prompt whose log-probabilities are asked for
  // holds at once: its prefill runs in chunks of as many rows (64 MiB of f32 by default).
  int64_t prompt_logprob_logits = int64_t{1} << 24;
  // A deliberately broken engine, for the tests that show the deferred test backend catches a
  // missing wait: where the drafts stay on the draft's backend (Proposals::on_device), the target's
  // ops read them without waiting for the draft's event. Never set outside those tests.
  bool skip_draft_wait = false;
};

struct BatchEngineStats {
  int64_t submitted = 0;             // requests accepted by submit()
  int64_t finished = 0;              // requests finished for any reason
  int64_t running = 0;               // in the batch now
  int64_t waiting = 0;               // queued now
  int64_t tokens_generated = 0;      // tokens emitted over every request
  int64_t steps = 0;                 // batched steps
  int64_t sequence_steps = 0;        // sum over steps of the sequences in them
  int64_t drafted = 0;               // drafts verified
  int64_t accepted = 0;              // drafts accepted
  int64_t drafted_ahead = 0;         // rows that drafted ahead of their verification (overlap)
  int64_t ahead_taken = 0;           // of those, rows whose drafts ahead the next step proposed
  double draft_ms = 0.0;             // time proposing
  double target_ms = 0.0;            // time in target forwards (prefill and scoring)
  int64_t prompt_tokens = 0;         // prompt tokens of the requests admitted
  int64_t cached_prompt_tokens = 0;  // of those, served from the target's prefix cache
  int64_t kv_tokens_capacity = 0;    // target KV cache
  int64_t kv_tokens_free = 0;        // target KV positions an append may take now
  int64_t kv_tokens_cached = 0;      // target KV positions in reusable prefix blocks now
  // What the steps (not prefills) waited for and copied back from the models' backends
  // (Backend::transfer_counts): one wait and a few bytes a row per step where only tokens come
  // back (a draft model's drafts left on its backend included), one more where the host reads a
  // draft model's drafts (one a draft position where its drafts look up).
  int64_t host_waits = 0;
  uint64_t bytes_to_host = 0;
  // [draft position, from 0] drafts verified at that position of their step and, of those, drafts
  // accepted: where along the drafts acceptance falls off (each non-increasing; their sums are
  // drafted and accepted).
  std::vector<int64_t> drafted_at;
  std::vector<int64_t> accepted_at;
};

// A request run to its end (BatchEngine::run).
struct Completion {
  std::vector<int32_t> tokens;                     // every generated token
  std::vector<TokenLogprob> logprobs;              // one per token, where the request asked
  std::vector<TokenLogprob> prompt_logprobs;       // the prompt's, where the request asked
  FinishReason reason = FinishReason::kMaxTokens;  // why it finished
  std::string error;                               // when reason is kFailed
  RequestStats stats;                              // its figures
};

class BatchEngine {
 public:
  // `draft` may be null (requests asking for the draft method then decode plainly). Both models
  // must outlive the engine and must not be used by anyone else while it runs. Starts the
  // scheduler thread.
  BatchEngine(Model& target, Model* draft, const BatchEngineOptions& options);
  ~BatchEngine();  // shutdown()
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Validates (Error for an empty prompt, ids outside either model's vocabulary, a prompt past
  // the context limit, bad sampling or speculation settings, or an engine that was shut down) and
  // queues the request.
  RequestId submit(EngineRequest request, UpdateCallback on_update);
  // Submits every request, waits until all have finished, and returns their completions in
  // order: the synchronous use of the loop (benchmarks, tests). The requests are decoded together
  // as any concurrent ones would be.
  std::vector<Completion> run(std::vector<EngineRequest> requests);
  Completion run(EngineRequest request);
  // Stops a queued or running request at the next step boundary (reason kCancelled) and frees
  // its KV blocks; false when the id is unknown or already finished.
  bool cancel(RequestId id);
  // Stops taking requests; every queued and running request finishes with kShutdown; joins the
  // scheduler. Idempotent.
  void shutdown();
  // Counts every step whose updates were delivered (a step is counted before its updates go out).
  BatchEngineStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace specrun
