#include "runtime/engine/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "draft/proposer.h"
#include "runtime/base/check.h"
#include "runtime/engine/settings.h"
#include "target/scorer.h"
#include "verify/gamma_policy.h"
#include "verify/verifier.h"

namespace specrun {
namespace {

using Clock = std::chrono::steady_clock;

double milliseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Row `row` of `from`, alone: its drafts and their q.
Proposals one_row(const Proposals& from, int64_t row) {
  const int64_t count = from.counts[static_cast<size_t>(row)];
  Proposals proposals;
  proposals.batch = 1;
  proposals.gamma = count;
  proposals.vocab = from.vocab;
  const auto tokens = from.tokens.begin() + row * from.gamma;
  proposals.tokens.assign(tokens, tokens + count);
  proposals.counts.assign(1, static_cast<int32_t>(count));
  if (!from.point_masses()) {
    const auto probs = from.probs.begin() + row * from.gamma * from.vocab;
    proposals.probs.assign(probs, probs + count * from.vocab);
  }
  if (from.has_contests()) {
    const auto model = from.model_offers.begin() + row * from.gamma;
    const auto lookup = from.lookup_offers.begin() + row * from.gamma;
    proposals.model_offers.assign(model, model + count);
    proposals.lookup_offers.assign(lookup, lookup + count);
  }
  return proposals;
}

// How often prompt lookup and the draft model, offering different tokens for a draft, offered
// the one the target committed. Lookup is preferred until the model has won more often: a draft
// that agrees with its target soon keeps its own tokens; one that cannot copy from its context
// gives way where the text repeats itself.
struct LookupContests {
  int64_t lookup_won = 0;  // contests where lookup's token was the target's
  int64_t model_won = 0;   // contests where the model's was
  bool prefer_lookup() const { return lookup_won >= model_won; }
};

// `committed` followed by `drafts`: the text a draft continues from, as if they were accepted.
std::vector<int32_t> followed_by(std::span<const int32_t> committed,
                                 std::span<const int32_t> drafts) {
  std::vector<int32_t> text(committed.begin(), committed.end());
  text.insert(text.end(), drafts.begin(), drafts.end());
  return text;
}

}  // namespace

// One request, from submit() to its final update.
struct Sequence {
  RequestId id = 0;                // the engine's id, also the proposer's sequence id
  EngineRequest request;           // as submitted (validated)
  SamplingParams sampling;         // what the sampler, proposers and scorer read of it
  UpdateCallback on_update;        // where its updates go
  Clock::time_point submitted;     // submit() time: every stat is measured from it
  double queue_ms = 0.0;           // submit to admission
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
  SequenceStats stats;                 // its figures so far
  // Overlapped drafting: the drafts proposed past the last step's, kept because that step
  // accepted all of its drafts and added the first of these. One row [1, count]: that token (now
  // the pending one), then the next proposals with their q. Empty when none are kept.
  Proposals ahead;
  bool ahead_complete = false;  // drafting ahead gave every draft asked for (no confidence stop)
  // Prompt lookup against the draft model where they offered different tokens (Proposals'
  // contests): which offered the token the target committed, over every step verified so far
  // (`contests`) and over all but the last (`contests_before`). A step's proposals follow
  // contests_before, so that drafts proposed ahead of it, before the last verdict, are those the
  // step itself would propose.
  LookupContests contests, contests_before;
};

// What the draft model is asked for `sequence`: `gamma` drafts continuing `text` from output
// `position`, with the request's confidence floor and prompt lookup, preferring lookup's offers
// as `contests` say.
DraftRequest draft_request(const Sequence& sequence, std::span<const int32_t> text, int64_t gamma,
                           int64_t position, int64_t max_catch_up, const LookupContests& contests,
                           int64_t alternates) {
  const SpeculationSettings& speculation = sequence.request.speculation;
  DraftRequest request{static_cast<int64_t>(sequence.id),
                       text,
                       gamma,
                       sequence.random,
                       position,
                       &sequence.sampling};
  request.draft_p_min = speculation.draft_p_min;
  request.max_catch_up = max_catch_up;
  request.lookup_min_ngram = speculation.draft_lookup_ngram;
  request.lookup_max_ngram = speculation.lookup_max_ngram;
  request.lookup_below = speculation.draft_lookup_below;
  request.prefer_lookup = contests.prefer_lookup();
  request.alternates = alternates;
  return request;
}

// What one step carries from phase to phase; rows are the running sequences, in order.
struct StepWork {
  std::vector<DraftPlan> plans;                  // [batch]
  std::vector<int64_t> catch_up;                 // [batch] tokens the draft read first
  std::vector<Proposals> kept;                   // [batch] drafts kept ahead (Sequence)
  std::vector<int64_t> from_kept;                // [batch] proposals taken from `kept`
  std::vector<std::vector<int32_t>> draft_text;  // [batch] what a draft request reads
  Proposals ahead;                               // [rows drafting ahead, gamma + 1]
  std::vector<int64_t> ahead_row;                // [batch] its row in `ahead`, -1: none
  std::vector<int64_t> ahead_wanted;             // [rows drafting ahead] drafts asked for
  Proposals proposals;                           // [batch, gamma]
  Features target_features;  // [each row's fed tokens (pending, drafts, alternates), hidden]
  std::vector<float> committed_features;  // [accepted + 1, hidden] one row's, reused
  const Scores* scores = nullptr;         // the target's, in the scorer, until the next step
  std::vector<RowDraws> draws;            // [batch] each row's random numbers for verification
  Verdict verdict;                        // [batch, gamma + 1]
  // [batch] where the target's forward fed the alternate a row accepted (0 the pending token),
  // -1 where it accepted none.
  std::vector<int64_t> alternate_input;
  std::vector<std::optional<FinishReason>> stops;       // [batch] why a row ends with this step
  std::vector<size_t> first_new;                        // [batch] where its new tokens begin
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
        scorer(target_model, SamplingParams{}),
        verification(target_model.backend()) {}

  Model& target;
  Model* draft;
  BatchEngineOptions options;
  std::unique_ptr<ModelProposer> draft_proposer;  // when there is a draft model
  Scorer scorer;                                  // each row brings its own sampling settings
  BackendVerification verification;               // on the target's backend, where the scores are
  GreedyVerifier greedy_verifier;
  RejectionSampler rejection_sampler;
  SharedNoiseVerifier shared_noise_verifier;
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

  void run();
  // The phases of a step.
  void admit(std::vector<std::unique_ptr<Sequence>> admitted);
  // Keeps the target's feature at the last position of each block the target sealed since, with
  // the block (KvCache::annotate): a later request reusing the block hands it to the draft.
  void annotate_sealed(Sequence& sequence);
  void step();
  void retire_full_contexts();
  void plan(StepWork& work);
  void propose(StepWork& work);
  void assemble(StepWork& work, const Proposals& from_model, std::span<const int64_t> model_rows,
                std::span<const std::pair<int64_t, Proposals>> point_mass);
  void draft_ahead(StepWork& work);
  void score(StepWork& work);
  void collect_verdict(StepWork& work);
  void drop_alternates_past_room(Proposals& proposals, int64_t b, const Sequence& sequence) const;
  void commit(StepWork& work);
  void tally_contests(Sequence& sequence, const StepWork& work, int64_t b);
  void deliver(StepWork& work);

  // The rule a row with these settings is verified by (the test's replacement, when set).
  const Verifier& verifier_for(const SamplingParams& sampling) const {
    if (options.verifier != nullptr) return *options.verifier;
    switch (verify_rule(sampling)) {
      case kernels::VerifyRule::kGreedy:
        return greedy_verifier;
      case kernels::VerifyRule::kSharedNoise:
        return shared_noise_verifier;
      case kernels::VerifyRule::kRejection:
        break;
    }
    return rejection_sampler;
  }
  // Whether the sequence's verification reads the draft's distributions (DraftRequest::
  // keep_distributions).
  bool reads_draft_distributions(const Sequence& sequence) const {
    return verifier_for(sequence.sampling).reads_draft_distributions();
  }
  // Alternates the draft offers beside each of the sequence's drafts: where its rule takes them
  // and the target's backend reads token trees.
  int64_t alternates_for(const Sequence& sequence) const {
    const bool possible = draft != nullptr && target.backend().attends_with_key_gaps() &&
                          verifier_for(sequence.sampling).takes_alternates();
    return possible ? sequence.request.speculation.draft_alternates : 0;
  }
  void finish(std::unique_ptr<Sequence> sequence, FinishReason reason, const std::string& error,
              std::span<const int32_t> last_tokens = {});
  void publish_kv();
  // The KV figures of `counters` from the target's cache; `mutex` must be held.
  void count_kv(const KvCache& cache) {
    counters.kv_tokens_free = cache.free_blocks() * cache.layout().block_size;
    counters.kv_tokens_cached = cache.cached_blocks() * cache.layout().block_size;
  }
  // The most drafts the sequence may verify in a step that starts with `length` committed tokens
  // and `generated` of them generated.
  int64_t cap(const Sequence& sequence, int64_t length, int64_t generated) const;
  int64_t cap(const Sequence& sequence) const {
    return cap(sequence, static_cast<int64_t>(sequence.committed.size()), sequence.generated);
  }
  GammaPolicy& policy(GammaControl kind);
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

BatchEngine::BatchEngine(Model& target, Model* draft, const BatchEngineOptions& options)
    : state_(std::make_unique<State>(target, draft, options)) {
  if (options.max_batch < 1) {
    throw Error("max_batch must be at least 1, got " + std::to_string(options.max_batch));
  }
  if (options.verifier != nullptr && !target.backend().uses_host_memory()) {
    throw Error("a replacement verifier reads the scores on the host: the " +
                std::string(target.backend().name()) + " backend keeps them in device memory");
  }
  if (draft != nullptr) {
    const ModelConfig& reads = draft->config();
    if (reads.reads_features() && reads.feature_width != target.config().hidden_size) {
      throw Error(draft->paths().weights.string() + " reads its target's features, " +
                  std::to_string(reads.feature_width) + " wide, but " +
                  target.paths().weights.string() + " has a hidden size of " +
                  std::to_string(target.config().hidden_size) + ": it is not this target's draft");
    }
    if (reads.reads_features() && options.overlap == OverlapDrafting::kOn) {
      throw Error("overlapped drafting needs a draft that does not read its target's features (" +
                  draft->paths().weights.string() +
                  " does): it drafts ahead before the target has computed them");
    }
    state_->draft_proposer = std::make_unique<ModelProposer>(*draft, SamplingParams{}, 0.0f);
  }
  state_->counters.kv_tokens_capacity = target.kv_cache().capacity_tokens();
  state_->count_kv(target.kv_cache());
  state_->scheduler = std::thread([state = state_.get()] { state->run(); });
}

BatchEngine::~BatchEngine() {
  shutdown();
}

void BatchEngine::shutdown() {
  std::call_once(state_->shut_down, [&] {
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->wake.notify_all();
    if (state_->scheduler.joinable()) state_->scheduler.join();
  });
}

RequestId BatchEngine::submit(EngineRequest request, UpdateCallback on_update) {
  State& s = *state_;
  validate_prompt(s.target, request.prompt);
  validate(request.sampling);
  validate(request.speculation);

  auto sequence = std::make_unique<Sequence>();
  sequence->drafts_with_model =
      request.speculation.method == SpeculationMethod::kDraftModel && s.draft != nullptr;
  // Reserve the worst case: the target never holds more than prompt + max_tokens - 1 positions
  // (a step's drafts are capped by the tokens still to come) nor more than its context limit,
  // which counts the cache; the draft holds fewer. So a valid prompt always fits an empty cache.
  // (max_tokens is clamped first: prompt + max_tokens must not overflow.)
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  const int64_t worst = prompt + std::min(request.sampling.max_tokens, s.target.context_limit());
  sequence->worst_positions = std::min(worst, s.target.context_limit());
  sequence->reserved_target_blocks = s.target.kv_cache().blocks_for(sequence->worst_positions);
  SPECRUN_CHECK(sequence->reserved_target_blocks <= s.target.kv_cache().layout().num_blocks);
  if (sequence->drafts_with_model) {
    for (const int32_t id : request.prompt) {
      if (id >= s.draft->config().vocab_size) {
        throw Error("prompt token id " + std::to_string(id) +
                    " is outside the draft model's vocabulary [0, " +
                    std::to_string(s.draft->config().vocab_size) + ")");
      }
    }
    sequence->reserved_draft_blocks =
        s.draft->kv_cache().blocks_for(std::min(worst, s.draft->context_limit()));
    SPECRUN_CHECK(sequence->reserved_draft_blocks <= s.draft->kv_cache().layout().num_blocks);
  }
  sequence->submitted = Clock::now();
  sequence->committed = request.prompt;
  sequence->sampling = sampling_params(request.sampling, request.speculation.verification);
  sequence->random = RandomStream(request.sampling.seed);
  sequence->request = std::move(request);
  sequence->on_update = std::move(on_update);

  RequestId id = 0;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) throw Error("the engine was shut down; it takes no more requests");
    id = s.next_id++;
    sequence->id = id;
    s.live.emplace(id, true);
    s.queue.push_back(std::move(sequence));
    s.counters.submitted += 1;
    s.counters.waiting = static_cast<int64_t>(s.queue.size());
  }
  s.wake.notify_all();
  return id;
}

std::vector<Completion> BatchEngine::run(std::vector<EngineRequest> requests) {
  std::vector<Completion> completions(requests.size());
  std::mutex mutex;
  std::condition_variable done;
  size_t finished = 0;
  std::vector<RequestId> submitted;
  try {
    for (size_t i = 0; i < requests.size(); ++i) {
      submitted.push_back(submit(std::move(requests[i]), [&, i](const RequestUpdate& update) {
        Completion& completion = completions[i];
        completion.tokens.insert(completion.tokens.end(), update.tokens.begin(),
                                 update.tokens.end());
        if (!update.finished) return;
        completion.reason = update.reason;
        completion.error = update.error;
        if (update.stats != nullptr) completion.stats = *update.stats;
        std::lock_guard lock(mutex);
        finished += 1;
        done.notify_all();
      }));
    }
  } catch (...) {
    // The callbacks of those already queued write into this frame: they must end first.
    for (const RequestId id : submitted) cancel(id);
    std::unique_lock lock(mutex);
    done.wait(lock, [&] { return finished == submitted.size(); });
    throw;
  }
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished == requests.size(); });
  return completions;
}

Completion BatchEngine::run(EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  return std::move(run(std::move(one)).front());
}

bool BatchEngine::cancel(RequestId id) {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.live.count(id) == 0) return false;
    s.cancels.push_back(id);
  }
  s.wake.notify_all();
  return true;
}

BatchEngineStats BatchEngine::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->counters;
}

void BatchEngine::State::publish_kv() {
  const KvCache& cache = target.kv_cache();
  std::lock_guard lock(mutex);
  count_kv(cache);
  counters.running = static_cast<int64_t>(running.size());
  counters.waiting = static_cast<int64_t>(queue.size());
}

GammaPolicy& BatchEngine::State::policy(GammaControl kind) {
  std::unique_ptr<GammaPolicy>& slot = policies[kind];
  if (!slot) slot = make_gamma_policy(kind, kMaxGamma);
  return *slot;
}

void BatchEngine::State::finish(std::unique_ptr<Sequence> sequence, FinishReason reason,
                                const std::string& error, std::span<const int32_t> last_tokens) {
  if (sequence->target_kv >= 0) {
    target.kv_cache().remove_sequence(sequence->target_kv);
    reserved_target_blocks -= sequence->reserved_target_blocks;
    reserved_draft_blocks -= sequence->reserved_draft_blocks;
    if (sequence->drafts_with_model)
      draft_proposer->remove_sequence(static_cast<int64_t>(sequence->id));
    for (auto& [kind, policy] : policies) policy->forget(static_cast<int64_t>(sequence->id));
  }
  SequenceStats& stats = sequence->stats;
  stats.total_ms = milliseconds(sequence->submitted, Clock::now());
  stats.tokens_generated = sequence->generated;
  {
    const KvCache& cache = target.kv_cache();
    std::lock_guard lock(mutex);
    live.erase(sequence->id);
    counters.finished += 1;
    count_kv(cache);
  }
  if (sequence->on_update) {
    RequestUpdate update;
    update.id = sequence->id;
    update.tokens = last_tokens;
    update.finished = true;
    update.reason = reason;
    update.error = error;
    update.stats = &stats;
    update.queue_ms = sequence->queue_ms;
    sequence->on_update(update);
  }
}

// The most drafts the sequence may verify in a step: its gamma_max, the tokens still to come
// (a step commits up to gamma + 1), and room in both models' contexts.
int64_t BatchEngine::State::cap(const Sequence& sequence, int64_t length, int64_t generated) const {
  const SpeculationSettings& speculation = sequence.request.speculation;
  const bool lookup = speculation.method == SpeculationMethod::kPromptLookup;
  if (!sequence.drafts_with_model && !lookup) return 0;
  const int64_t remaining = sequence.request.sampling.max_tokens - generated;
  int64_t gamma = std::min({speculation.gamma_max, remaining - 1, target.context_limit() - length});
  if (sequence.drafts_with_model) gamma = std::min(gamma, draft->context_limit() - length + 1);
  return std::max<int64_t>(gamma, 0);
}

void BatchEngine::State::run() {
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> cancelled_queued;
    std::vector<RequestId> cancelled_running;
    std::vector<std::unique_ptr<Sequence>> admitted;
    bool stop = false;
    {
      std::unique_lock lock(mutex);
      wake.wait(lock,
                [&] { return stopping || !queue.empty() || !running.empty() || !cancels.empty(); });
      stop = stopping;
      for (const RequestId id : cancels) {
        const auto it = std::find_if(queue.begin(), queue.end(),
                                     [&](const auto& sequence) { return sequence->id == id; });
        if (it != queue.end()) {
          cancelled_queued.push_back(std::move(*it));
          queue.erase(it);
        } else {
          cancelled_running.push_back(id);
        }
      }
      cancels.clear();
      if (stop) {
        for (auto& sequence : queue) cancelled_queued.push_back(std::move(sequence));
        queue.clear();
      } else {
        // First come, first served: the head waits for room rather than being overtaken, so a
        // long request is not starved by a stream of short ones.
        while (!queue.empty() &&
               static_cast<int64_t>(running.size() + admitted.size()) < options.max_batch) {
          const Sequence& head = *queue.front();
          if (reserved_target_blocks + head.reserved_target_blocks >
                  target.kv_cache().layout().num_blocks ||
              (head.drafts_with_model && reserved_draft_blocks + head.reserved_draft_blocks >
                                             draft->kv_cache().layout().num_blocks)) {
            break;
          }
          reserved_target_blocks += head.reserved_target_blocks;
          reserved_draft_blocks += head.reserved_draft_blocks;
          admitted.push_back(std::move(queue.front()));
          queue.pop_front();
        }
      }
      counters.waiting = static_cast<int64_t>(queue.size());
    }
    const FinishReason cancel_reason = stop ? FinishReason::kShutdown : FinishReason::kCancelled;
    for (auto& sequence : cancelled_queued) finish(std::move(sequence), cancel_reason, "");
    for (const RequestId id : cancelled_running) {
      const auto it = std::find_if(running.begin(), running.end(),
                                   [&](const auto& sequence) { return sequence->id == id; });
      if (it == running.end()) continue;  // finished meanwhile
      std::unique_ptr<Sequence> sequence = std::move(*it);
      running.erase(it);
      finish(std::move(sequence), FinishReason::kCancelled, "");
    }
    if (stop) {
      for (auto& sequence : running) finish(std::move(sequence), FinishReason::kShutdown, "");
      running.clear();
      publish_kv();
      return;
    }
    if (!admitted.empty()) admit(std::move(admitted));
    if (!running.empty()) step();
    publish_kv();
  }
}

// Admit and prefill: one batched target prefill of every prompt but its last token (which is fed
// with the first step's drafts), after the cached blocks it starts with; the prefilled prompt is
// sealed, so that later requests reuse it. The draft catches up in its first proposal. A request
// for no tokens at all finishes here.
void BatchEngine::State::admit(std::vector<std::unique_ptr<Sequence>> admitted) {
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Sequence>> starting;
  std::vector<SequenceInput> prefill;
  std::vector<std::pair<Sequence*, int64_t>> prefilled;  // and the first position it computes
  const bool reads_features = draft_proposer != nullptr && draft_proposer->reads_features();
  for (auto& sequence : admitted) {
    sequence->queue_ms = milliseconds(sequence->submitted, start);
    sequence->target_kv = target.kv_cache().add_sequence();
    if (sequence->drafts_with_model)
      draft_proposer->add_sequence(static_cast<int64_t>(sequence->id));
    if (sequence->request.sampling.max_tokens == 0) {
      finish(std::move(sequence), FinishReason::kMaxTokens, "");
      continue;
    }
    const std::span<const int32_t> fed =
        std::span<const int32_t>(sequence->committed).first(sequence->committed.size() - 1);
    // A draft reading the target's features needs them from the position before the first token
    // it computes: the target reuses no more of its cache than the draft, and where it reuses as
    // much, the feature at its last reused position comes from the block there (annotate_sealed
    // kept it), or the target computes that block again.
    const bool hands_features = reads_features && sequence->drafts_with_model;
    std::span<const int32_t> reusable = fed;
    int64_t draft_reused = 0;
    if (hands_features) {
      draft_reused =
          draft_proposer->reuse_prefix(static_cast<int64_t>(sequence->id), sequence->committed);
      reusable = fed.first(static_cast<size_t>(draft_reused));
    }
    KvCache& cache = target.kv_cache();
    const int64_t block = cache.layout().block_size;
    int64_t reused = cache.reuse_prefix(sequence->target_kv, reusable);
    if (hands_features && reused > 0 && reused == draft_reused) {
      const std::span<const float> feature =
          cache.annotation(sequence->target_kv, reused / block - 1);
      if (feature.empty()) {
        reused -= block;
        cache.truncate(sequence->target_kv, reused);
      } else {
        draft_proposer->observe_features(static_cast<int64_t>(sequence->id), reused - 1, feature);
      }
    }
    sequence->annotated_blocks = reused / block;
    sequence->stats.cached_prompt_tokens = reused;
    if (reused < static_cast<int64_t>(fed.size())) {
      prefill.push_back({sequence->target_kv, fed.subspan(static_cast<size_t>(reused)), false});
      prefilled.emplace_back(sequence.get(), reused);
    }
    starting.push_back(std::move(sequence));
  }
  try {
    if (!prefill.empty()) {
      Logits unused;
      unused.keep_on_device = true;  // a prefill's logits are never read
      Features features;
      target.forward(prefill, &unused, reads_features ? &features : nullptr);
      for (size_t s = 0; reads_features && s < prefilled.size(); ++s) {
        const auto& [sequence, first] = prefilled[s];
        if (!sequence->drafts_with_model) continue;
        draft_proposer->observe_features(static_cast<int64_t>(sequence->id), first,
                                         features.of(static_cast<int64_t>(s)));
      }
    }
  } catch (const std::exception& error) {
    for (auto& sequence : starting) {
      finish(std::move(sequence), FinishReason::kFailed,
             std::string("prefill failed: ") + error.what());
    }
    return;
  }
  const double prefill_ms = milliseconds(start, Clock::now());
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  for (auto& sequence : starting) {
    target.kv_cache().seal(sequence->target_kv, target.kv_cache().length(sequence->target_kv));
    annotate_sealed(*sequence);
    sequence->stats.target_ms += prefill_ms;
    prompt_tokens += static_cast<int64_t>(sequence->request.prompt.size());
    cached_prompt_tokens += sequence->stats.cached_prompt_tokens;
    running.push_back(std::move(sequence));
  }
  std::lock_guard lock(mutex);
  counters.target_ms += prefill_ms;
  counters.prompt_tokens += prompt_tokens;
  counters.cached_prompt_tokens += cached_prompt_tokens;
}

void BatchEngine::State::annotate_sealed(Sequence& sequence) {
  if (!sequence.drafts_with_model || !draft_proposer->reads_features()) return;
  KvCache& cache = target.kv_cache();
  const int64_t block = cache.layout().block_size;
  for (; sequence.annotated_blocks < cache.sealed_blocks(sequence.target_kv);
       ++sequence.annotated_blocks) {
    const std::span<const float> feature = draft_proposer->target_feature(
        static_cast<int64_t>(sequence.id), (sequence.annotated_blocks + 1) * block - 1);
    if (feature.empty()) return;
    cache.annotate(sequence.target_kv, sequence.annotated_blocks, feature);
  }
}

void BatchEngine::State::step() {
  retire_full_contexts();
  if (running.empty()) return;
  const kernels::TransferCounts before = transfers();
  StepWork work;
  plan(work);
  propose(work);
  // The target's forward and verification are enqueued first, so that the draft's work ahead runs
  // beside them on its own stream; then the step waits once, for the verdict.
  if (work.failure.empty()) score(work);
  if (work.failure.empty()) draft_ahead(work);
  if (work.failure.empty()) collect_verdict(work);
  if (!work.failure.empty()) {
    // Forwards leave the caches as they were on error; the batch cannot go on, so every running
    // request ends with the reason rather than the engine stopping.
    for (auto& sequence : running) finish(std::move(sequence), FinishReason::kFailed, work.failure);
    running.clear();
    return;
  }
  const kernels::TransferCounts after = transfers();
  work.transfers = {after.host_waits - before.host_waits,
                    after.bytes_to_host - before.bytes_to_host};
  commit(work);
  deliver(work);
}

// Sequences whose context is full stop before the step (they could not feed a token).
void BatchEngine::State::retire_full_contexts() {
  const int64_t target_limit = target.context_limit();
  for (size_t i = 0; i < running.size();) {
    if (static_cast<int64_t>(running[i]->committed.size()) > target_limit) {
      std::unique_ptr<Sequence> sequence = std::move(running[i]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      finish(std::move(sequence), FinishReason::kContextLimit, "");
    } else {
      ++i;
    }
  }
}

// Plan: each policy in use plans the rows that chose it.
void BatchEngine::State::plan(StepWork& work) {
  const size_t batch = running.size();
  work.plans.assign(batch, DraftPlan{});
  // Drafting ahead is the policies' call only where the backend would hide it: the draft on a
  // stream of its own, which the device runs beside the target's. A draft reading the target's
  // features cannot run ahead of them.
  const bool ahead_hidden = options.overlap == OverlapDrafting::kAuto && draft != nullptr &&
                            &draft->backend() != &target.backend() &&
                            draft->backend().runs_models_concurrently() &&
                            !draft->config().reads_features();
  for (size_t b = 0; b < batch; ++b) {
    work.rows_of[running[b]->request.speculation.controller].push_back(b);
  }
  for (const auto& [kind, members] : work.rows_of) {
    std::vector<GammaRow> rows;
    rows.reserve(members.size());
    for (const size_t b : members) {
      const Sequence& sequence = *running[b];
      const SpeculationSettings& speculation = sequence.request.speculation;
      const int64_t limit = cap(sequence);
      rows.push_back({static_cast<int64_t>(sequence.id), limit,
                      std::min(speculation.gamma_min, limit), speculation.gamma_max,
                      speculation.gamma, sequence.drafts_with_model && ahead_hidden});
    }
    std::vector<DraftPlan> plans(rows.size());
    policy(kind).plan(rows, plans);
    for (size_t i = 0; i < members.size(); ++i) {
      SPECRUN_CHECK(plans[i].gamma >= 0 && plans[i].gamma <= rows[i].cap)
          << to_string(kind) << " planned " << plans[i].gamma << " drafts, cap " << rows[i].cap;
      work.plans[members[i]] = plans[i];
    }
  }
}

// Propose: the draft model for its rows in one batched call, prompt lookup (or a calibration
// step's filler) per row.
void BatchEngine::State::propose(StepWork& work) {
  const auto start = Clock::now();
  const int64_t batch = static_cast<int64_t>(running.size());
  std::vector<DraftRequest> model_requests;
  std::vector<int64_t> model_rows;
  std::vector<std::pair<int64_t, Proposals>> point_mass;
  work.catch_up.assign(static_cast<size_t>(batch), 0);
  work.kept.assign(static_cast<size_t>(batch), Proposals{});
  work.from_kept.assign(static_cast<size_t>(batch), 0);
  work.draft_text.assign(static_cast<size_t>(batch), {});
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& sequence = *running[static_cast<size_t>(b)];
    const DraftPlan& plan = work.plans[static_cast<size_t>(b)];
    const auto row = static_cast<size_t>(b);
    // Drafts kept ahead are this step's first proposals when it drafts with the model, as far as
    // it wants them; the draft's cache keeps what it has fed of those taken (all but the last, as
    // if it had proposed them now) and drops the rest.
    int64_t rest = plan.gamma;
    if (!sequence.ahead.tokens.empty()) {
      Proposals& kept = work.kept[row];
      kept = std::move(sequence.ahead);
      sequence.ahead = Proposals{};
      const int64_t available = kept.counts[0] - 1;
      int64_t& taken = work.from_kept[row];
      if (!plan.filler && plan.max_catch_up == 0) taken = std::min(plan.gamma, available);
      draft_proposer->rollback_keeping(static_cast<int64_t>(sequence.id),
                                       static_cast<int64_t>(sequence.committed.size()) - 1, taken);
      // The draft model proposes the rest, unless its confidence floor stopped drafting ahead.
      rest = taken == 0 ? plan.gamma : (sequence.ahead_complete ? plan.gamma - taken : 0);
    }
    sequence.ahead_complete = false;
    if (plan.gamma == 0) continue;
    const SpeculationSettings& speculation = sequence.request.speculation;
    if (sequence.drafts_with_model && !plan.filler) {
      if (rest == 0) continue;  // every proposal is a kept one
      // After kept drafts, the draft continues from them as if they were committed.
      const int64_t taken = work.from_kept[row];
      std::span<const int32_t> text = sequence.committed;
      if (taken > 0) {
        work.draft_text[row] = followed_by(sequence.committed, work.kept[row].row_tokens(0).subspan(
                                                                   1, static_cast<size_t>(taken)));
        text = work.draft_text[row];
      }
      model_requests.push_back(draft_request(sequence, text, rest, sequence.generated + taken,
                                             plan.max_catch_up, sequence.contests_before,
                                             alternates_for(sequence)));
      model_requests.back().alternate_floor = plan.alternate_floor;
      model_requests.back().keep_distributions = reads_draft_distributions(sequence);
      model_rows.push_back(b);
      work.catch_up[row] = static_cast<int64_t>(text.size()) -
                           draft_proposer->cached_length(static_cast<int64_t>(sequence.id));
    } else {
      PromptLookupProposer lookup(speculation.lookup_min_ngram, speculation.lookup_max_ngram,
                                  /*pad_to_gamma=*/plan.filler);
      const DraftRequest request[] = {{static_cast<int64_t>(sequence.id), sequence.committed,
                                       plan.gamma, sequence.random, sequence.generated}};
      point_mass.emplace_back(b, lookup.propose(request));
    }
  }
  Proposals from_model;
  try {
    if (!model_requests.empty()) from_model = draft_proposer->propose(model_requests);
  } catch (const std::exception& error) {
    work.failure = std::string("drafting failed: ") + error.what();
    return;
  }
  assemble(work, from_model, model_rows, point_mass);
  work.draft_ms = milliseconds(start, Clock::now());
}

// The step's one [batch, gamma] set of proposals from the draft model's rows and the point-mass
// rows, with q materialised for point-mass rows when the batch mixes them with the model's.
void BatchEngine::State::assemble(StepWork& work, const Proposals& from_model,
                                  std::span<const int64_t> model_rows,
                                  std::span<const std::pair<int64_t, Proposals>> point_mass) {
  const int64_t batch = static_cast<int64_t>(running.size());
  Proposals& proposals = work.proposals;
  proposals.batch = batch;
  for (const DraftPlan& plan : work.plans) proposals.gamma = std::max(proposals.gamma, plan.gamma);
  proposals.tokens.assign(static_cast<size_t>(batch * proposals.gamma), -1);
  proposals.counts.assign(static_cast<size_t>(batch), 0);
  const bool any_kept = std::any_of(work.from_kept.begin(), work.from_kept.end(),
                                    [](int64_t taken) { return taken > 0; });
  const bool any_drafts = !model_rows.empty() || any_kept;
  // q is materialised for every row when some row's rule reads it, else for none (point masses).
  const bool materialise =
      any_drafts && std::any_of(running.begin(), running.end(), [&](const auto& sequence) {
        return reads_draft_distributions(*sequence);
      });
  // Only the draft model's rows bring alternates (drafts kept ahead never do).
  const int64_t alternates_width = from_model.alternates_width;
  if (any_drafts) {
    proposals.vocab = std::max(from_model.vocab, target.config().vocab_size);
    for (const Proposals& kept : work.kept) proposals.vocab = std::max(proposals.vocab, kept.vocab);
  }
  if (materialise) {
    proposals.probs.assign(static_cast<size_t>(batch * proposals.gamma * proposals.vocab), 0.0f);
  } else {
    proposals.probs.clear();
  }
  // Row b's proposals from `offset` on are `source`'s row `source_row` from its draft `first` on.
  auto place = [&](int64_t b, const Proposals& source, int64_t source_row, int64_t first,
                   int64_t count, int64_t offset) {
    const std::span<const int32_t> tokens =
        source.row_tokens(source_row)
            .subspan(static_cast<size_t>(first), static_cast<size_t>(count));
    proposals.counts[static_cast<size_t>(b)] = static_cast<int32_t>(offset + count);
    if (source.has_contests() && !proposals.has_contests()) {
      proposals.model_offers.assign(proposals.tokens.size(), -1);
      proposals.lookup_offers.assign(proposals.tokens.size(), -1);
    }
    if (source.has_alternates() && !proposals.has_alternates()) {
      proposals.alternates_width = alternates_width;
      proposals.alternates.assign(proposals.tokens.size() * static_cast<size_t>(alternates_width),
                                  -1);
    }
    for (int64_t i = 0; i < count; ++i) {
      const int32_t token = tokens[static_cast<size_t>(i)];
      const auto slot = static_cast<size_t>(b * proposals.gamma + offset + i);
      proposals.tokens[slot] = token;
      if (source.has_contests()) {
        const auto from = static_cast<size_t>(source_row * source.gamma + first + i);
        proposals.model_offers[slot] = source.model_offers[from];
        proposals.lookup_offers[slot] = source.lookup_offers[from];
      }
      if (source.has_alternates()) {
        const std::span<const int32_t> from = source.alternates_of(source_row, first + i);
        std::copy(from.begin(), from.end(),
                  proposals.alternates.begin() +
                      static_cast<ptrdiff_t>(slot) * proposals.alternates_width);
      }
      if (!materialise) continue;
      float* q = proposals.probs.data() + (b * proposals.gamma + offset + i) * proposals.vocab;
      if (source.point_masses()) {
        q[token] = 1.0f;
      } else {
        const std::span<const float> from = source.q(source_row, first + i);
        std::copy(from.begin(), from.end(), q);
      }
    }
  };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t taken = work.from_kept[static_cast<size_t>(b)];
    if (taken > 0) place(b, work.kept[static_cast<size_t>(b)], 0, 1, taken, 0);
  }
  for (size_t r = 0; r < model_rows.size(); ++r) {
    const auto row = static_cast<int64_t>(r);
    const int64_t b = model_rows[r];
    place(b, from_model, row, 0, from_model.counts[r], work.from_kept[static_cast<size_t>(b)]);
  }
  for (const auto& [b, source] : point_mass) place(b, source, 0, 0, source.counts[0], 0);
}

// Overlapped drafting: every row the draft model proposed for in full goes on drafting past its
// last draft as if all were accepted: first the token verification would then add, then as many
// drafts as the next step could verify (this step's gamma at most). A backend with a stream per
// model runs this beside the verification the step enqueued before it (score), on its own stream:
// the host waits for the draft's draws here, and for the target's verdict only after.
void BatchEngine::State::draft_ahead(StepWork& work) {
  if (draft_proposer == nullptr || options.overlap == OverlapDrafting::kOff) return;
  const auto start = Clock::now();
  const int64_t batch = static_cast<int64_t>(running.size());
  std::vector<DraftRequest> requests;
  work.ahead_row.assign(static_cast<size_t>(batch), -1);
  for (int64_t b = 0; b < batch; ++b) {
    const auto row = static_cast<size_t>(b);
    Sequence& sequence = *running[row];
    const DraftPlan& plan = work.plans[row];
    const int64_t drafted = work.proposals.counts[row];
    // A row stopped by the confidence floor has fed its last draft and found the draft unsure.
    if (!sequence.drafts_with_model || plan.filler || plan.max_catch_up > 0 || drafted == 0 ||
        drafted < plan.gamma || (options.overlap == OverlapDrafting::kAuto && !plan.draft_ahead)) {
      continue;
    }
    const int64_t length = static_cast<int64_t>(sequence.committed.size()) + drafted + 1;
    const int64_t wanted =
        std::min(plan.gamma, cap(sequence, length, sequence.generated + drafted + 1)) + 1;
    if (wanted < 2) continue;  // the next step could verify none of them
    std::vector<int32_t>& text = work.draft_text[row];
    text = followed_by(sequence.committed, work.proposals.row_tokens(b));
    work.ahead_row[row] = static_cast<int64_t>(requests.size());
    work.ahead_wanted.push_back(wanted);
    // Drafts ahead are taken only where every draft was accepted: no alternate of theirs would be.
    requests.push_back(draft_request(sequence, text, wanted, sequence.generated + drafted, 0,
                                     sequence.contests, 0));
    requests.back().keep_distributions = reads_draft_distributions(sequence);
  }
  if (requests.empty()) return;
  try {
    work.ahead = draft_proposer->propose(requests);
  } catch (const std::exception& error) {
    work.failure = std::string("drafting ahead failed: ") + error.what();
    return;
  }
  work.draft_ms += milliseconds(start, Clock::now());
}

// Score and verify: one target forward scores every row; each row is verified by its own
// request's rule (greedy at temperature 0, else rejection sampling or shared noise) with its own
// random numbers, those of the output positions it decides. Both are enqueued here, on the
// target's stream, and the verdict collected by collect_verdict.
void BatchEngine::State::score(StepWork& work) {
  const auto start = Clock::now();
  const int64_t batch = static_cast<int64_t>(running.size());
  std::vector<ScoreRequest> score_requests;
  score_requests.reserve(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence& sequence = *running[static_cast<size_t>(b)];
    if (work.proposals.has_alternates()) drop_alternates_past_room(work.proposals, b, sequence);
    ScoreRequest& request = score_requests.emplace_back();
    request = {sequence.target_kv, sequence.committed.back(), work.proposals.row_tokens(b),
               &sequence.sampling};
    if (work.proposals.has_alternates()) {
      const Proposals& proposals = work.proposals;
      request.alternates_width = proposals.alternates_width;
      request.alternates =
          std::span<const int32_t>(proposals.alternates)
              .subspan(static_cast<size_t>(b * proposals.gamma * proposals.alternates_width),
                       request.drafts.size() * static_cast<size_t>(proposals.alternates_width));
    }
  }
  try {
    const bool reads_features = draft_proposer != nullptr && draft_proposer->reads_features();
    work.scores = &scorer.score(score_requests, reads_features ? &work.target_features : nullptr);
    work.draws.clear();
    std::vector<kernels::VerifyRule> rules;
    for (const auto& sequence : running) {
      work.draws.push_back({sequence->random, sequence->generated});
      rules.push_back(verify_rule(sequence->sampling));
    }
    if (options.verifier == nullptr) {
      verification.enqueue(work.proposals, *work.scores, rules, work.draws);
    }
  } catch (const std::exception& error) {
    work.failure = std::string("verification failed: ") + error.what();
    return;
  }
  work.verify_ms = milliseconds(start, Clock::now());
}

// The verdict of the verification score() enqueued: the step's one wait for the target.
void BatchEngine::State::collect_verdict(StepWork& work) {
  const auto start = Clock::now();
  const int64_t batch = static_cast<int64_t>(running.size());
  const Scores& scores = *work.scores;
  try {
    if (options.verifier == nullptr) {
      work.verdict = verification.collect(work.proposals, scores, &work.alternate_input);
    } else {
      // A test's rule, on the host (the scores are in host memory: see the constructor).
      Verdict& verdict = work.verdict;
      verdict = options.verifier->verify(work.proposals, scores, work.draws);
      work.alternate_input.assign(static_cast<size_t>(batch), -1);
      for (int64_t b = 0; work.proposals.has_alternates() && b < batch; ++b) {
        const int64_t k = accepted_alternate(work.proposals, verdict, b);
        if (k < 0) continue;
        const int64_t replaced = verdict.accepted[static_cast<size_t>(b)] - 1;  // the draft's
        work.alternate_input[static_cast<size_t>(b)] =
            scores.alternate_inputs[scores.alternate_entry(b, replaced, k)];
      }
    }
  } catch (const std::exception& error) {
    work.failure = std::string("verification failed: ") + error.what();
    return;
  }
  work.verify_ms += milliseconds(start, Clock::now());
}

// Alternates take cache positions past the drafts for the length of the step: those past the
// sequence's worst case (its context, and what its KV blocks were reserved for) are dropped, the
// latest drafts' first.
void BatchEngine::State::drop_alternates_past_room(Proposals& proposals, int64_t b,
                                                   const Sequence& sequence) const {
  int64_t room = sequence.worst_positions - static_cast<int64_t>(sequence.committed.size()) -
                 proposals.counts[static_cast<size_t>(b)];
  const auto first = proposals.alternates.begin() +
                     static_cast<ptrdiff_t>(b * proposals.gamma * proposals.alternates_width);
  for (auto it = first; it != first + proposals.gamma * proposals.alternates_width; ++it) {
    if (*it >= 0 && room-- <= 0) *it = -1;
  }
}

// Commit and roll back: each row's accepted drafts and new token are committed (stopping at EOS or
// the token limit), both caches keep the committed tokens but the new pending one, the policies
// see the outcome, and the step is counted, so that a client reading the engine's stats after an
// update sees the step in them.
void BatchEngine::State::commit(StepWork& work) {
  const size_t batch = running.size();
  std::vector<DraftOutcome> outcomes(batch);
  work.stops.assign(batch, std::nullopt);
  work.first_new.assign(batch, 0);
  int64_t emitted_total = 0, drafted_total = 0, accepted_total = 0, continuing = 0;
  int64_t drafted_ahead = 0, ahead_taken = 0;
  const std::vector<int32_t>& eos = target.config().eos_token_ids;
  const auto now = Clock::now();
  for (size_t b = 0; b < batch; ++b) {
    Sequence& sequence = *running[b];
    const int64_t drafted = work.proposals.counts[b];
    const int64_t accepted = work.verdict.accepted[b];
    const int64_t ahead_row = work.ahead_row.empty() ? -1 : work.ahead_row[b];
    outcomes[b] = {static_cast<int64_t>(sequence.id),
                   drafted,
                   accepted,
                   work.plans[b].filler,
                   work.catch_up[b],
                   work.from_kept[b],
                   ahead_row >= 0 ? work.ahead.counts[static_cast<size_t>(ahead_row)] : 0};
    drafted_total += drafted;
    accepted_total += accepted;
    SequenceStats& stats = sequence.stats;
    stats.record_step(drafted, accepted, work.draft_ms, work.verify_ms);
    stats.host_waits += work.transfers.host_waits;
    stats.bytes_to_host += work.transfers.bytes_to_host;
    if (work.proposals.has_alternates()) {
      const Proposals& proposals = work.proposals;
      const auto first = proposals.alternates.begin() +
                         static_cast<ptrdiff_t>(b) * proposals.gamma * proposals.alternates_width;
      outcomes[b].alternates = std::count_if(first, first + drafted * proposals.alternates_width,
                                             [](int32_t token) { return token >= 0; });
      stats.alternates += outcomes[b].alternates;
    }
    tally_contests(sequence, work, static_cast<int64_t>(b));

    const SamplingSettings& sampling = sequence.request.sampling;
    std::optional<FinishReason>& stop = work.stops[b];
    work.first_new[b] = sequence.committed.size();
    for (const int32_t token : work.verdict.row(static_cast<int64_t>(b))) {
      if (sampling.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
        stop = FinishReason::kEndOfSequence;
        break;
      }
      sequence.committed.push_back(token);
      sequence.generated += 1;
      stats.tokens_generated = sequence.generated;
      stats.token_ms.push_back(milliseconds(sequence.submitted, now));
      if (stats.token_ms.size() == 1) stats.ttft_ms = stats.token_ms.front();
      if (sequence.generated >= sampling.max_tokens) {
        stop = FinishReason::kMaxTokens;
        break;
      }
    }
    emitted_total += static_cast<int64_t>(sequence.committed.size() - work.first_new[b]);
    // Both caches keep the committed tokens but the new pending one, sealed for reuse; a
    // finishing sequence's too, so that a request continuing its text finds it cached.
    const int64_t keep = static_cast<int64_t>(sequence.committed.size()) - 1;
    // An accepted alternate was scored past the drafts: its keys and values move to its position
    // (the draft's cache holds the draft there, and reads the alternate again).
    int64_t draft_keep = keep;
    const int64_t fed = work.alternate_input.empty() ? -1 : work.alternate_input[b];
    const bool took_alternate = fed >= 0;
    outcomes[b].alternate_taken = took_alternate;
    if (took_alternate) {
      const auto first_fed = static_cast<int64_t>(work.first_new[b]) - 1;  // the pending token
      const int64_t position = first_fed + accepted;
      if (position < keep) {
        target.kv_cache().copy_position(sequence.target_kv, first_fed + fed, position);
      }
      draft_keep = std::min(keep, position);
      stats.alternates_accepted += 1;
    }
    target.kv_cache().truncate(sequence.target_kv, keep);
    target.kv_cache().seal(sequence.target_kv, keep);
    if (sequence.drafts_with_model && draft_proposer->reads_features() && !stop) {
      // The target's features at the positions now committed for good: the pending token's and
      // the accepted drafts', the last of them an accepted alternate's (scored past the drafts).
      committed_features(work.target_features.of(static_cast<int64_t>(b)),
                         static_cast<size_t>(work.target_features.width), accepted, fed,
                         work.committed_features);
      draft_proposer->observe_features(static_cast<int64_t>(sequence.id),
                                       static_cast<int64_t>(work.first_new[b]) - 1,
                                       work.committed_features);
      annotate_sealed(sequence);
    }
    if (sequence.drafts_with_model) {
      // Drafts ahead are kept when every draft was accepted and the new token is their first.
      const int64_t ahead_count =
          ahead_row >= 0 ? work.ahead.counts[static_cast<size_t>(ahead_row)] : 0;
      if (ahead_row >= 0) drafted_ahead += 1;
      if (ahead_row >= 0 && !stop && accepted == drafted && !took_alternate && ahead_count >= 2 &&
          work.ahead.tokens[static_cast<size_t>(ahead_row * work.ahead.gamma)] ==
              sequence.committed.back()) {
        sequence.ahead = one_row(work.ahead, ahead_row);
        sequence.ahead_complete = ahead_count == work.ahead_wanted[static_cast<size_t>(ahead_row)];
        draft_proposer->rollback_keeping(static_cast<int64_t>(sequence.id), keep,
                                         sequence.ahead.counts[0]);
        ahead_taken += 1;
      } else {
        draft_proposer->rollback(static_cast<int64_t>(sequence.id), draft_keep);
      }
    }
    if (!stop) continuing += 1;
  }
  for (const auto& [kind, members] : work.rows_of) {
    policy(kind).observe(outcomes, work.draft_ms, work.verify_ms);
  }
  const KvCache& cache = target.kv_cache();
  std::lock_guard lock(mutex);
  counters.steps += 1;
  counters.sequence_steps += static_cast<int64_t>(batch);
  counters.tokens_generated += emitted_total;
  counters.drafted += drafted_total;
  counters.accepted += accepted_total;
  counters.drafted_ahead += drafted_ahead;
  counters.ahead_taken += ahead_taken;
  counters.draft_ms += work.draft_ms;
  counters.target_ms += work.verify_ms;
  counters.host_waits += work.transfers.host_waits;
  counters.bytes_to_host += work.transfers.bytes_to_host;
  counters.running = continuing;
  count_kv(cache);
}

// Each draft the verdict decided (those accepted and the first rejected) on which prompt lookup
// and the draft model offered different tokens counts for the one that offered the target's.
void BatchEngine::State::tally_contests(Sequence& sequence, const StepWork& work, int64_t b) {
  sequence.contests_before = sequence.contests;
  const Proposals& proposals = work.proposals;
  if (!proposals.has_contests()) return;
  const std::span<const int32_t> decided = work.verdict.row(b);
  const int64_t accepted = work.verdict.accepted[static_cast<size_t>(b)];
  const int64_t drafted = proposals.counts[static_cast<size_t>(b)];
  // Past an accepted alternate (the last accepted token) no draft was decided: they followed the
  // draft it replaced, which was rejected.
  const bool took_alternate =
      !work.alternate_input.empty() && work.alternate_input[static_cast<size_t>(b)] >= 0;
  const int64_t accepted_drafts = took_alternate ? accepted - 1 : accepted;
  for (int64_t i = 0; i < std::min(drafted, accepted_drafts + 1); ++i) {
    const auto slot = static_cast<size_t>(b * proposals.gamma + i);
    const int32_t model = proposals.model_offers[slot];
    const int32_t lookup = proposals.lookup_offers[slot];
    if (model < 0) continue;
    const int32_t target_token = decided[static_cast<size_t>(i)];
    if (target_token == lookup) sequence.contests.lookup_won += 1;
    if (target_token == model) sequence.contests.model_won += 1;
    if (proposals.tokens[slot] == lookup) {
      sequence.stats.looked_up += 1;
      if (i < accepted_drafts) sequence.stats.looked_up_accepted += 1;
    }
  }
}

// Deliver: each request gets the step's tokens; those that stopped finish with them.
void BatchEngine::State::deliver(StepWork& work) {
  std::vector<std::unique_ptr<Sequence>> still_running;
  still_running.reserve(running.size());
  for (size_t b = 0; b < running.size(); ++b) {
    std::unique_ptr<Sequence>& sequence = running[b];
    const std::span<const int32_t> new_tokens =
        std::span<const int32_t>(sequence->committed).subspan(work.first_new[b]);
    if (const std::optional<FinishReason> stop = work.stops[b]) {
      // The final update carries this step's tokens.
      const std::vector<int32_t> last(new_tokens.begin(), new_tokens.end());
      finish(std::move(sequence), *stop, "", last);
      continue;
    }
    if (sequence->on_update) {
      RequestUpdate update;
      update.id = sequence->id;
      update.tokens = new_tokens;
      update.stats = &sequence->stats;
      update.queue_ms = sequence->queue_ms;
      sequence->on_update(update);
    }
    still_running.push_back(std::move(sequence));
  }
  running = std::move(still_running);
}

}  // namespace specrun
