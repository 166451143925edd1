// Continuous batching under speculative decoding, on token ids. A scheduler thread admits queued
// requests between steps while the batch and the KV caches have room, and runs one step for every
// running sequence at once: the draft proposes for all of them in one batched pass per draft
// position, the target scores all of them in one batched forward, each row is verified by its own
// request's rule (greedy or rejection sampling), and both caches roll back per sequence. Each
// sequence keeps its own gamma; the goodput controller chooses them for the whole batch from the
// measured acceptance of each sequence and the measured cost of the batch's steps, so gamma falls
// as the batch grows and speculation stops paying, and rises again as load drops.
//
// KV room is reserved at admission for a request's worst case (prompt + max_tokens, or the
// context limit, which counts the cache), so a running sequence never runs out and the rest wait;
// a prompt longer than the context limit is refused at submit().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/generate.h"
#include "runtime/engine/speculative.h"
#include "runtime/model/model.h"

namespace specrun {

using RequestId = uint64_t;

enum class FinishStatus {
  kEndOfSequence,  // the model produced an EOS token
  kMaxTokens,      // max_tokens were produced
  kContextLimit,   // the sequence filled the model's context
  kCancelled,      // cancel() was called
  kShutdown,       // the engine shut down first
  kFailed,         // an error stopped it (RequestUpdate::error)
};

const char* finish_status_name(FinishStatus status);

struct EngineRequest {
  std::vector<int32_t> prompt;     // token ids (BOS included when wanted); not empty
  GenerationOptions generation;    // sampling, max_tokens, stop_at_eos
  SpeculativeOptions speculative;  // method, controller, gamma limits, draft_p_min, lookup
};

// What one step did for one request, delivered on the scheduler thread.
struct RequestUpdate {
  RequestId id = 0;
  std::span<const int32_t> tokens;                 // tokens committed by this step (may be empty)
  bool finished = false;                           // the request's last update
  FinishStatus status = FinishStatus::kMaxTokens;  // when finished
  std::string error;                               // when status is kFailed
  const SpeculativeStats* stats = nullptr;  // the request's figures so far (final when finished)
  double queue_ms = 0.0;                    // from submit to admission
};

// Called for every update of a request, in order, on the scheduler thread, with no engine lock
// held: it may call cancel() but not submit() or shutdown(). The batch waits for it, so it must be
// short.
using UpdateCallback = std::function<void(const RequestUpdate&)>;

struct BatchEngineOptions {
  int64_t max_batch = 64;  // running sequences at most
};

struct BatchEngineStats {
  int64_t submitted = 0;           // requests accepted by submit()
  int64_t finished = 0;            // requests finished for any reason
  int64_t running = 0;             // in the batch now
  int64_t waiting = 0;             // queued now
  int64_t tokens_generated = 0;    // tokens emitted over every request
  int64_t steps = 0;               // batched steps
  int64_t sequence_steps = 0;      // sum over steps of the sequences in them
  int64_t drafted = 0;             // drafts verified
  int64_t accepted = 0;            // drafts accepted
  double draft_ms = 0.0;           // time proposing
  double target_ms = 0.0;          // time in target forwards (prefill and scoring)
  int64_t kv_tokens_capacity = 0;  // target KV cache
  int64_t kv_tokens_free = 0;      // free target KV positions now
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
  // the context limit, bad sampling or speculative settings, or an engine that was shut down) and
  // queues the request.
  RequestId submit(EngineRequest request, UpdateCallback on_update);
  // Stops a queued or running request at the next step boundary (status kCancelled) and frees
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
