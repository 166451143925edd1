// The decode loop's state, shared by its two halves: the requests' life and the scheduler thread
// (batch_engine.cpp), and the phases of a step (step.cpp). Internal to runtime/engine/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "draft/step_drafter.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/engine/settings.h"
#include "target/logprobs.h"
#include "target/scorer.h"
#include "verify/commit.h"
#include "verify/gamma_policy.h"
#include "verify/verifier.h"

namespace specrun {

using Clock = std::chrono::steady_clock;

inline double milliseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// One request, from submit() to its final update.
struct Sequence {
  RequestId id = 0;                // the engine's id, also the proposer's sequence id
  EngineRequest request;           // as submitted (validated)
  SamplingParams sampling;         // what the sampler, proposers and scorer read of it
  UpdateCallback on_update;        // where its updates go
  Clock::time_point submitted;     // submit() time: every stat is measured from it
  std::vector<int32_t> committed;  // prompt then every generated token
  int64_t generated = 0;           // tokens emitted
  SequenceId target_kv = -1;       // its target KV sequence, once admitted
  bool drafts_with_model = false;  // proposes through the engine's draft model
  // With a feature-reading draft: the target's sealed blocks that carry the target's feature at
  // their last position (KvCache::annotate), from the first.
  int64_t annotated_blocks = 0;
  int64_t reserved_target_blocks = 0;  // KV blocks held back for its worst case
  int64_t worst_positions = 0;         // the most target positions it holds (what they cover)
  int64_t reserved_draft_blocks = 0;   // the same in the draft's cache
  RandomStream random;                 // its random numbers, keyed by its seed
  // The prompt's log-probabilities (EngineRequest::prompt_logprobs), until its first update.
  std::vector<TokenLogprob> prompt_logprobs;
  // Its penalties and logit bias, over its text so far; null when it has none.
  std::unique_ptr<LogitProcessor> processor;
  RequestStats stats;            // its figures so far (runtime/engine/stats.h)
  std::vector<double> token_ms;  // each token's arrival, from submit
  DraftingState drafting;        // drafts kept ahead, lookup's contests
};

// What one step carries from phase to phase; rows are the running sequences, in order.
struct StepWork {
  std::vector<DraftPlan> plans;  // [batch]
  // [batch] each row as drafting sees it (its committed text as the step began: valid until
  // commit appends to it).
  std::vector<DraftingRow> rows;
  StepDrafts drafts;         // the proposals [batch, gamma], and the drafts ahead of them
  Features target_features;  // [each row's fed tokens (pending, drafts, alternates), hidden]
  std::vector<float> committed_features;  // [accepted + 1, hidden] one row's, reused
  const Scores* scores = nullptr;         // the target's, in the scorer, until the next step
  std::vector<RowDraws> draws;            // [batch] each row's random numbers for verification
  Verdict verdict;                        // [batch, gamma + 1]
  // [batch] where the target's forward fed the alternate a row accepted (0 the pending token),
  // -1 where it accepted none.
  std::vector<int64_t> alternate_input;
  // [batch] the log-probabilities of each row's committed tokens, where it asked for them
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<std::optional<FinishReason>> stops;       // [batch] why a row ends with this step
  std::vector<size_t> first_new;                        // [batch] where its new tokens begin
  std::vector<int64_t> accepted_new;                    // [batch] of those, the accepted drafts
  std::map<GammaControl, std::vector<size_t>> rows_of;  // the rows each policy planned
  double draft_ms = 0.0;                                // proposing
  double verify_ms = 0.0;                               // scoring and verifying
  kernels::TransferCounts transfers;  // what the step waited for and read back, both models
  std::string failure;                // why the step failed, "" if it did not
};

struct BatchEngine::State {
  State(Model& target_model, Model* draft_model, const BatchEngineOptions& engine_options)
      : target(target_model),
        draft(draft_model),
        options(engine_options),
        drafter(draft_model, engine_options.overlap, target_model.config().vocab_size),
        scorer(target_model, SamplingParams{}),
        verification(target_model.backend()),
        logprobs(target_model.backend()) {}

  Model& target;
  Model* draft;
  BatchEngineOptions options;
  StepDrafter drafter;               // the proposers, composed per row
  Scorer scorer;                     // each row brings its own sampling settings
  BackendVerification verification;  // on the target's backend, where the scores are
  LogprobReader logprobs;            // the rows' log-probabilities, where requests ask
  // The gamma policies in use, made on first use; they persist across requests, since acceptance
  // and costs are properties of the model pair and the machine.
  std::map<GammaControl, std::unique_ptr<GammaPolicy>> policies;

  // Guarded by `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake;                 // work arrived, a cancel, or shutdown
  std::deque<std::unique_ptr<Sequence>> queue;  // submitted, not yet admitted (FIFO)
  std::vector<RequestId> cancels;               // asked for, not yet applied
  std::unordered_map<RequestId, bool> live;     // queued or running ids
  bool stopping = false;                        // shutdown() was called
  RequestId next_id = 1;
  BatchEngineStats counters;  // engine-wide figures

  // Scheduler thread only.
  std::vector<std::unique_ptr<Sequence>> running;
  int64_t reserved_target_blocks = 0;  // sum over running sequences
  int64_t reserved_draft_blocks = 0;

  std::thread scheduler;
  std::once_flag shut_down;

  // The scheduler thread (batch_engine.cpp): applies cancels, admits, steps.
  void run();
  // The final update carries `last`'s tokens, drafted and accepted_drafts: a final step's.
  void finish(std::unique_ptr<Sequence> sequence, FinishReason reason, const std::string& error,
              const RequestUpdate& last = {});
  void publish_kv();
  // The KV figures of `counters` from the target's cache; `mutex` must be held.
  void count_kv(const KvCache& cache) {
    counters.kv_tokens_free = cache.free_blocks() * cache.layout().block_size;
    counters.kv_tokens_cached = cache.cached_blocks() * cache.layout().block_size;
  }
  GammaPolicy& policy(GammaControl kind);

  // The phases (step.cpp).
  void admit(std::vector<std::unique_ptr<Sequence>> admitted);
  // One prefill of `admitted`, none of whose prompts shares its first block with another's.
  void admit_wave(std::vector<std::unique_ptr<Sequence>> admitted);
  // The prefill of a prompt whose log-probabilities are asked for (EngineRequest::prompt_logprobs).
  void prefill_reading_logprobs(Sequence& sequence);
  // Starts the admitted sequence's target cache from cached blocks of `fed` (its prompt but the
  // last token) and returns how many positions it reused.
  int64_t reuse_cached_prefix(Sequence& sequence, std::span<const int32_t> fed);
  // Keeps the target's feature at the last position of each block the target sealed since, with
  // the block (KvCache::annotate): a later request reusing the block hands it to the draft.
  void annotate_sealed(Sequence& sequence);
  void step();
  void retire_full_contexts();
  void plan(StepWork& work);
  void propose(StepWork& work);
  void draft_ahead(StepWork& work);
  void score(StepWork& work);
  void collect_verdict(StepWork& work);
  void drop_alternates_past_room(Proposals& proposals, int64_t b, const Sequence& sequence) const;
  void commit(StepWork& work);
  // Commits row b's verdict into its sequence and both caches; returns what drafting needs of it.
  RowVerdict commit_row(StepWork& work, size_t b, DraftOutcome& outcome);
  void roll_back_target(StepWork& work, size_t b, const RowCommit& commit, int64_t length);
  void deliver(StepWork& work);

  // What the sequence's rule reads besides its drafts: a test's replacement rule's where the
  // options give one (BatchEngineOptions::verifier), else the rule of its sampling settings.
  bool rule_takes_alternates(const Sequence& sequence) const {
    return options.verifier != nullptr ? options.verifier->takes_alternates()
                                       : takes_alternates(verify_rule(sequence.sampling));
  }
  bool rule_reads_draft_distributions(const Sequence& sequence) const {
    return options.verifier != nullptr ? options.verifier->reads_draft_distributions()
                                       : reads_draft_distributions(verify_rule(sequence.sampling));
  }
  // Alternates the draft offers beside each of the sequence's drafts: where its rule takes them
  // and the target's backend reads token trees.
  int64_t alternates_for(const Sequence& sequence) const {
    const bool possible = draft != nullptr && target.backend().attends_with_key_gaps() &&
                          rule_takes_alternates(sequence) && sequence.processor == nullptr &&
                          sequence.request.logprobs < 0;
    return possible ? sequence.request.speculation.draft_alternates : 0;
  }
  // [batch] the top tokens each running row asks beside its logprobs, -1 where it asks none.
  std::vector<int64_t> logprob_tops() const {
    std::vector<int64_t> tops;
    tops.reserve(running.size());
    for (const auto& sequence : running) tops.push_back(sequence->request.logprobs);
    return tops;
  }
  // Drafts a step starting now could verify, gamma_max aside: the tokens still to come less the
  // one a step always adds, and room in both models' contexts (DraftingRow::room).
  int64_t room(const Sequence& sequence) const;
  // The most drafts the sequence may verify in a step: its gamma_max and its room; 0 for a
  // sequence that does not speculate.
  int64_t cap(const Sequence& sequence) const;
  // Both models' backends' transfers so far (one backend's once where they share it).
  kernels::TransferCounts transfers() const {
    kernels::TransferCounts counts = target.backend().transfer_counts();
    if (draft != nullptr && &draft->backend() != &target.backend()) {
      const kernels::TransferCounts more = draft->backend().transfer_counts();
      counts.host_waits += more.host_waits;
      counts.bytes_to_host += more.bytes_to_host;
    }
    return counts;
  }
};

}  // namespace specrun
