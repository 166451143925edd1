#include "runtime/engine/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "draft/proposer.h"
#include "kernels/core/check.h"
#include "target/scorer.h"
#include "verify/batch_gamma.h"
#include "verify/verifier.h"

namespace specrun {

const char* finish_status_name(FinishStatus status) {
  switch (status) {
    case FinishStatus::kEndOfSequence:
      return "end_of_sequence";
    case FinishStatus::kMaxTokens:
      return "max_tokens";
    case FinishStatus::kContextLimit:
      return "context_limit";
    case FinishStatus::kCancelled:
      return "cancelled";
    case FinishStatus::kShutdown:
      return "shutdown";
    case FinishStatus::kFailed:
      return "failed";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

double milliseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// The most drafts any request may ask for (validate_speculative's bound).
constexpr int64_t kGammaLimit = 64;

}  // namespace

// One request, from submit() to its final update.
struct Sequence {
  RequestId id = 0;                    // the engine's id, also the proposer's sequence id
  EngineRequest request;               // as submitted (validated)
  UpdateCallback on_update;            // where its updates go
  Clock::time_point submitted;         // submit() time: every stat is measured from it
  double queue_ms = 0.0;               // submit to admission
  std::vector<int32_t> committed;      // prompt then every generated token
  int64_t generated = 0;               // tokens emitted
  SequenceId target_kv = -1;           // its target KV sequence, once admitted
  bool drafts_with_model = false;      // proposes through the engine's draft model
  int64_t reserved_target_blocks = 0;  // KV blocks held back for its worst case
  int64_t reserved_draft_blocks = 0;   // the same in the draft's cache
  Rng verify_rng{0};                   // the verifier's stream (the request's seed)
  Rng draft_rng{0};                    // the drafts' stream
  std::unique_ptr<GammaController> own_controller;  // fixed or heuristic; null for goodput
  SpeculativeStats stats;                           // its figures so far
};

struct BatchEngine::State {
  State(Model& target_model, Model* draft_model, const BatchEngineOptions& engine_options)
      : target(target_model),
        draft(draft_model),
        options(engine_options),
        scorer(target_model, SamplingParams{}),
        goodput(kGammaLimit) {}

  Model& target;
  Model* draft;
  BatchEngineOptions options;
  std::unique_ptr<ModelProposer> draft_proposer;  // when there is a draft model
  Scorer scorer;                                  // each row brings its own sampling settings
  GreedyVerifier greedy_verifier;
  RejectionSampler rejection_sampler;
  BatchGoodputController goodput;  // the gammas of every goodput-controlled sequence

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
  void admit(std::vector<std::unique_ptr<Sequence>> admitted);
  void step();
  void finish(std::unique_ptr<Sequence> sequence, FinishStatus status, const std::string& error,
              std::span<const int32_t> last_tokens = {});
  void publish_kv();
  int64_t cap(const Sequence& sequence) const;
};

BatchEngine::BatchEngine(Model& target, Model* draft, const BatchEngineOptions& options)
    : state_(std::make_unique<State>(target, draft, options)) {
  if (options.max_batch < 1) {
    throw Error("max_batch must be at least 1, got " + std::to_string(options.max_batch));
  }
  if (draft != nullptr) {
    state_->draft_proposer = std::make_unique<ModelProposer>(*draft, SamplingParams{}, 0.0f);
  }
  state_->counters.kv_tokens_capacity = target.kv_cache().capacity_tokens();
  state_->counters.kv_tokens_free =
      target.kv_cache().free_blocks() * target.kv_cache().layout().block_size;
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
  validate_request(s.target, request.prompt, request.generation.max_tokens);
  validate_sampling(request.generation.sampling);
  validate_speculative(request.speculative);

  auto sequence = std::make_unique<Sequence>();
  sequence->drafts_with_model =
      request.speculative.method == SpeculativeMethod::kDraftModel && s.draft != nullptr;
  // Reserve the worst case: the target never holds more than prompt + max_tokens - 1 positions
  // (a step's drafts are capped by the tokens still to come) nor more than its context limit,
  // which counts the cache; the draft holds fewer. So a valid prompt always fits an empty cache.
  const int64_t worst = static_cast<int64_t>(request.prompt.size()) + request.generation.max_tokens;
  sequence->reserved_target_blocks =
      s.target.kv_cache().blocks_for(std::min(worst, s.target.context_limit()));
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
  sequence->verify_rng = Rng(request.generation.sampling.seed);
  sequence->draft_rng = Rng(request.generation.sampling.seed ^ kDraftSeedSalt);
  if (request.speculative.controller != ControllerKind::kGoodput) {
    sequence->own_controller =
        make_gamma_controller(request.speculative.controller, request.speculative.gamma);
  }
  sequence->stats.tokens_generated = 0;
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
  counters.kv_tokens_free = cache.free_blocks() * cache.layout().block_size;
  counters.running = static_cast<int64_t>(running.size());
  counters.waiting = static_cast<int64_t>(queue.size());
}

void BatchEngine::State::finish(std::unique_ptr<Sequence> sequence, FinishStatus status,
                                const std::string& error, std::span<const int32_t> last_tokens) {
  if (sequence->target_kv >= 0) {
    target.kv_cache().remove_sequence(sequence->target_kv);
    reserved_target_blocks -= sequence->reserved_target_blocks;
    reserved_draft_blocks -= sequence->reserved_draft_blocks;
    if (sequence->drafts_with_model)
      draft_proposer->remove_sequence(static_cast<int64_t>(sequence->id));
    goodput.remove_sequence(static_cast<int64_t>(sequence->id));
  }
  SpeculativeStats& stats = sequence->stats;
  stats.total_ms = milliseconds(sequence->submitted, Clock::now());
  stats.tokens_generated = sequence->generated;
  {
    const KvCache& cache = target.kv_cache();
    std::lock_guard lock(mutex);
    live.erase(sequence->id);
    counters.finished += 1;
    counters.kv_tokens_free = cache.free_blocks() * cache.layout().block_size;
  }
  if (sequence->on_update) {
    RequestUpdate update;
    update.id = sequence->id;
    update.tokens = last_tokens;
    update.finished = true;
    update.status = status;
    update.error = error;
    update.stats = &stats;
    update.queue_ms = sequence->queue_ms;
    sequence->on_update(update);
  }
}

// The most drafts the sequence may verify this step: its gamma_max, the tokens still to come
// (a step commits up to gamma + 1), and room in both models' contexts.
int64_t BatchEngine::State::cap(const Sequence& sequence) const {
  const SpeculativeOptions& speculative = sequence.request.speculative;
  const bool lookup = speculative.method == SpeculativeMethod::kPromptLookup;
  if (!sequence.drafts_with_model && !lookup) return 0;
  const int64_t n = static_cast<int64_t>(sequence.committed.size());
  const int64_t remaining = sequence.request.generation.max_tokens - sequence.generated;
  int64_t gamma = std::min({speculative.gamma.max, remaining - 1, target.context_limit() - n});
  if (sequence.drafts_with_model) gamma = std::min(gamma, draft->context_limit() - n + 1);
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
    const FinishStatus cancel_status = stop ? FinishStatus::kShutdown : FinishStatus::kCancelled;
    for (auto& sequence : cancelled_queued) finish(std::move(sequence), cancel_status, "");
    for (const RequestId id : cancelled_running) {
      const auto it = std::find_if(running.begin(), running.end(),
                                   [&](const auto& sequence) { return sequence->id == id; });
      if (it == running.end()) continue;  // finished meanwhile
      std::unique_ptr<Sequence> sequence = std::move(*it);
      running.erase(it);
      finish(std::move(sequence), FinishStatus::kCancelled, "");
    }
    if (stop) {
      for (auto& sequence : running) finish(std::move(sequence), FinishStatus::kShutdown, "");
      running.clear();
      publish_kv();
      return;
    }
    if (!admitted.empty()) admit(std::move(admitted));
    if (!running.empty()) step();
    publish_kv();
  }
}

// Starts admitted sequences: one batched target prefill of every prompt but its last token
// (which is fed with the first step's drafts). The draft catches up in its first proposal.
void BatchEngine::State::admit(std::vector<std::unique_ptr<Sequence>> admitted) {
  const auto start = Clock::now();
  std::vector<SequenceInput> prefill;
  for (auto& sequence : admitted) {
    sequence->queue_ms = milliseconds(sequence->submitted, start);
    sequence->target_kv = target.kv_cache().add_sequence();
    if (sequence->drafts_with_model)
      draft_proposer->add_sequence(static_cast<int64_t>(sequence->id));
    if (sequence->committed.size() > 1) {
      prefill.push_back(
          {sequence->target_kv,
           std::span<const int32_t>(sequence->committed).first(sequence->committed.size() - 1),
           false});
    }
  }
  try {
    if (!prefill.empty()) {
      Logits unused;
      target.forward(prefill, &unused);
    }
  } catch (const std::exception& error) {
    for (auto& sequence : admitted) {
      finish(std::move(sequence), FinishStatus::kFailed,
             std::string("prefill failed: ") + error.what());
    }
    return;
  }
  const double prefill_ms = milliseconds(start, Clock::now());
  {
    std::lock_guard lock(mutex);
    counters.target_ms += prefill_ms;
  }
  for (auto& sequence : admitted) {
    sequence->stats.target_ms += prefill_ms;
    running.push_back(std::move(sequence));
  }
}

void BatchEngine::State::step() {
  const int64_t target_limit = target.context_limit();
  // Sequences whose context is full stop before the step (they could not feed a token).
  for (size_t i = 0; i < running.size();) {
    if (static_cast<int64_t>(running[i]->committed.size()) > target_limit) {
      std::unique_ptr<Sequence> sequence = std::move(running[i]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      finish(std::move(sequence), FinishStatus::kContextLimit, "");
    } else {
      ++i;
    }
  }
  if (running.empty()) return;
  const int64_t batch = static_cast<int64_t>(running.size());

  // 1. Gammas: goodput-controlled rows are chosen together; the others bring their own.
  std::vector<BatchGoodputController::Row> rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence& sequence = *running[static_cast<size_t>(b)];
    const int64_t limit = cap(sequence);
    BatchGoodputController::Row& row = rows[static_cast<size_t>(b)];
    row.sequence = static_cast<int64_t>(sequence.id);
    row.cap = limit;
    row.min = std::min(sequence.request.speculative.gamma.min, limit);
    row.initial = sequence.request.speculative.gamma.initial;
    if (limit == 0) {
      row.fixed = 0;
    } else if (sequence.own_controller) {
      row.fixed = std::clamp<int64_t>(sequence.own_controller->next_gamma(), 0, limit);
    }
  }
  const std::vector<int64_t> gammas = goodput.choose(rows);
  // A calibration step gives the controller's rows free filler instead of the draft model's work.
  std::vector<bool> calibration(static_cast<size_t>(batch), false);
  if (goodput.calibrating()) {
    for (int64_t b = 0; b < batch; ++b) {
      calibration[static_cast<size_t>(b)] = rows[static_cast<size_t>(b)].fixed < 0;
    }
  }

  // 2. Proposals: the draft model for its rows in one batched call, prompt lookup per row; then
  // one [batch, gamma] set, with q materialised for lookup rows when the batch mixes them.
  const auto step_start = Clock::now();
  std::vector<DraftRequest> model_requests;
  std::vector<int64_t> model_rows;
  std::vector<std::pair<int64_t, Proposals>> lookup_proposals;
  std::vector<int64_t> catch_up(static_cast<size_t>(batch), 0);
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& sequence = *running[static_cast<size_t>(b)];
    const int64_t gamma = gammas[static_cast<size_t>(b)];
    if (gamma == 0) continue;
    if (sequence.drafts_with_model && !calibration[static_cast<size_t>(b)]) {
      const bool probed = goodput.probing() && rows[static_cast<size_t>(b)].fixed < 0;
      model_requests.push_back({static_cast<int64_t>(sequence.id), sequence.committed, gamma,
                                &sequence.draft_rng, &sequence.request.generation.sampling,
                                sequence.request.speculative.draft_p_min,
                                probed ? BatchGoodputController::kProbeCatchUp : 0});
      model_rows.push_back(b);
      catch_up[static_cast<size_t>(b)] =
          static_cast<int64_t>(sequence.committed.size()) -
          draft_proposer->cached_length(static_cast<int64_t>(sequence.id));
    } else {
      PromptLookupProposer lookup(sequence.request.speculative.lookup_min_ngram,
                                  sequence.request.speculative.lookup_max_ngram,
                                  calibration[static_cast<size_t>(b)]);
      const DraftRequest request[] = {{static_cast<int64_t>(sequence.id), sequence.committed, gamma,
                                       &sequence.draft_rng, nullptr, -1.0f}};
      lookup_proposals.emplace_back(b, lookup.propose(request));
    }
  }
  Proposals from_model;
  std::string failure;
  try {
    if (!model_requests.empty()) from_model = draft_proposer->propose(model_requests);
  } catch (const std::exception& error) {
    failure = std::string("drafting failed: ") + error.what();
  }
  Proposals proposals;
  proposals.batch = batch;
  for (const int64_t gamma : gammas) proposals.gamma = std::max(proposals.gamma, gamma);
  proposals.tokens.assign(static_cast<size_t>(batch * proposals.gamma), -1);
  proposals.counts.assign(static_cast<size_t>(batch), 0);
  const bool materialise = !model_rows.empty() && failure.empty();
  if (materialise) {
    proposals.vocab = std::max(from_model.vocab, target.config().vocab_size);
    proposals.probs.assign(static_cast<size_t>(batch * proposals.gamma * proposals.vocab), 0.0f);
  }
  auto place = [&](int64_t b, const Proposals& source, int64_t source_row) {
    const std::span<const int32_t> tokens = source.row_tokens(source_row);
    proposals.counts[static_cast<size_t>(b)] = static_cast<int32_t>(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      proposals.tokens[static_cast<size_t>(b * proposals.gamma) + i] = tokens[i];
      if (!materialise) continue;
      float* q = proposals.probs.data() +
                 (b * proposals.gamma + static_cast<int64_t>(i)) * proposals.vocab;
      if (source.point_masses()) {
        q[tokens[i]] = 1.0f;
      } else {
        const std::span<const float> from = source.q(source_row, static_cast<int64_t>(i));
        std::copy(from.begin(), from.end(), q);
      }
    }
  };
  if (failure.empty()) {
    for (size_t r = 0; r < model_rows.size(); ++r) {
      place(model_rows[r], from_model, static_cast<int64_t>(r));
    }
  }
  for (const auto& [b, source] : lookup_proposals) place(b, source, 0);
  const auto draft_done = Clock::now();

  // 3. One target forward scores every row; 4. each row is verified by its own rule.
  std::vector<ScoreRequest> score_requests;
  score_requests.reserve(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const Sequence& sequence = *running[static_cast<size_t>(b)];
    score_requests.push_back({sequence.target_kv, sequence.committed.back(),
                              proposals.row_tokens(b), &sequence.request.generation.sampling});
  }
  Verdict verdict;
  if (failure.empty()) {
    try {
      const Scores scores = scorer.score(score_requests);
      std::vector<Rng> rngs;
      rngs.reserve(static_cast<size_t>(batch));
      bool any_greedy = false, any_sampled = false;
      for (const auto& sequence : running) {
        rngs.push_back(sequence->verify_rng);
        const bool greedy = sequence->request.generation.sampling.temperature == 0.0f;
        any_greedy |= greedy;
        any_sampled |= !greedy;
      }
      if (any_sampled) verdict = rejection_sampler.verify(proposals, scores, rngs);
      if (any_greedy) {
        const Verdict greedy = greedy_verifier.verify(proposals, scores, rngs);
        if (!any_sampled) {
          verdict = greedy;
        } else {
          for (int64_t b = 0; b < batch; ++b) {
            if (running[static_cast<size_t>(b)]->request.generation.sampling.temperature != 0) {
              continue;
            }
            std::copy_n(greedy.tokens.begin() + b * greedy.width, greedy.width,
                        verdict.tokens.begin() + b * verdict.width);
            verdict.accepted[static_cast<size_t>(b)] = greedy.accepted[static_cast<size_t>(b)];
          }
        }
      }
      for (int64_t b = 0; b < batch; ++b) {
        running[static_cast<size_t>(b)]->verify_rng = rngs[static_cast<size_t>(b)];
      }
    } catch (const std::exception& error) {
      failure = std::string("verification failed: ") + error.what();
    }
  }
  if (!failure.empty()) {
    // Forwards leave the caches as they were on error; the batch cannot go on, so every running
    // request ends with the reason rather than the engine stopping.
    for (auto& sequence : running) finish(std::move(sequence), FinishStatus::kFailed, failure);
    running.clear();
    return;
  }
  const auto verify_done = Clock::now();
  const double draft_ms = milliseconds(step_start, draft_done);
  const double verify_ms = milliseconds(draft_done, verify_done);

  // 5. Commit and roll back; count the step; then report (finishing what stopped), so that a
  // client reading the engine's stats after an update sees the step in them.
  std::vector<BatchGoodputController::Outcome> outcomes(static_cast<size_t>(batch));
  std::vector<size_t> first_new(static_cast<size_t>(batch));  // where the step's tokens begin
  std::vector<std::optional<FinishStatus>> stops(static_cast<size_t>(batch));
  int64_t emitted_total = 0, drafted_total = 0, accepted_total = 0, continuing = 0;
  const std::vector<int32_t>& eos = target.config().eos_token_ids;
  const auto now = Clock::now();
  for (int64_t b = 0; b < batch; ++b) {
    Sequence& sequence = *running[static_cast<size_t>(b)];
    const int64_t drafted = proposals.counts[static_cast<size_t>(b)];
    const int64_t accepted = verdict.accepted[static_cast<size_t>(b)];
    outcomes[static_cast<size_t>(b)] = {static_cast<int64_t>(sequence.id),
                                        drafted,
                                        accepted,
                                        rows[static_cast<size_t>(b)].fixed < 0,
                                        calibration[static_cast<size_t>(b)],
                                        catch_up[static_cast<size_t>(b)]};
    drafted_total += drafted;
    accepted_total += accepted;
    SpeculativeStats& stats = sequence.stats;
    stats.record_step(drafted, accepted, draft_ms, verify_ms);
    if (sequence.own_controller) {
      sequence.own_controller->observe({drafted, accepted, draft_ms, verify_ms});
    }

    const GenerationOptions& generation = sequence.request.generation;
    std::optional<FinishStatus>& stop = stops[static_cast<size_t>(b)];
    first_new[static_cast<size_t>(b)] = sequence.committed.size();
    for (const int32_t token : verdict.row(b)) {
      if (generation.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
        stop = FinishStatus::kEndOfSequence;
        break;
      }
      sequence.committed.push_back(token);
      sequence.generated += 1;
      stats.tokens_generated = sequence.generated;
      stats.token_ms.push_back(milliseconds(sequence.submitted, now));
      if (stats.token_ms.size() == 1) stats.ttft_ms = stats.token_ms.front();
      if (sequence.generated >= generation.max_tokens) {
        stop = FinishStatus::kMaxTokens;
        break;
      }
    }
    emitted_total +=
        static_cast<int64_t>(sequence.committed.size() - first_new[static_cast<size_t>(b)]);
    if (stop) continue;
    continuing += 1;
    // Both caches keep the committed tokens but the new pending one.
    const int64_t keep = static_cast<int64_t>(sequence.committed.size()) - 1;
    target.kv_cache().truncate(sequence.target_kv, keep);
    if (sequence.drafts_with_model) {
      draft_proposer->rollback(static_cast<int64_t>(sequence.id), keep);
    }
  }
  goodput.observe(outcomes, draft_ms, verify_ms);
  {
    const KvCache& cache = target.kv_cache();
    std::lock_guard lock(mutex);
    counters.steps += 1;
    counters.sequence_steps += batch;
    counters.tokens_generated += emitted_total;
    counters.drafted += drafted_total;
    counters.accepted += accepted_total;
    counters.draft_ms += draft_ms;
    counters.target_ms += verify_ms;
    counters.running = continuing;
    counters.kv_tokens_free = cache.free_blocks() * cache.layout().block_size;
  }

  std::vector<std::unique_ptr<Sequence>> still_running;
  still_running.reserve(static_cast<size_t>(continuing));
  for (int64_t b = 0; b < batch; ++b) {
    std::unique_ptr<Sequence>& sequence = running[static_cast<size_t>(b)];
    const std::span<const int32_t> new_tokens =
        std::span<const int32_t>(sequence->committed).subspan(first_new[static_cast<size_t>(b)]);
    if (const std::optional<FinishStatus> stop = stops[static_cast<size_t>(b)]) {
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
