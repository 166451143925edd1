#include "runtime/engine/batch_engine.h"

#include <algorithm>

#include "runtime/base/check.h"
#include "runtime/engine/engine_state.h"

namespace specrun {
namespace {

// The options, once the pair is known to work together under them.
const BatchEngineOptions& checked(Model& target, Model* draft, const BatchEngineOptions& options) {
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
  }
  return options;
}

}  // namespace

BatchEngine::BatchEngine(Model& target, Model* draft, const BatchEngineOptions& options)
    : state_(std::make_unique<State>(target, draft, checked(target, draft, options))) {
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
  validate_logit_bias(request.logit_bias, s.target.config().vocab_size);
  if ((request.grammar == nullptr) != (request.vocabulary == nullptr) ||
      (request.vocabulary && request.vocabulary->size() > s.target.config().vocab_size)) {
    throw Error("a grammar needs the target's vocabulary beside it (" +
                std::to_string(request.vocabulary ? request.vocabulary->size() : 0) +
                " tokens given, the target has " + std::to_string(s.target.config().vocab_size) +
                ")");
  }
  if (request.logprobs < -1 || request.logprobs > kMaxTopLogprobs) {
    throw Error("logprobs must be -1 (none) or top tokens in [0, " +
                std::to_string(kMaxTopLogprobs) + "], got " + std::to_string(request.logprobs));
  }
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > kMaxTopLogprobs) {
    throw Error("prompt_logprobs must be -1 (none) or top tokens in [0, " +
                std::to_string(kMaxTopLogprobs) + "], got " +
                std::to_string(request.prompt_logprobs));
  }

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
  sequence->stats.prompt_tokens = prompt;
  sequence->committed = request.prompt;
  sequence->sampling = sampling_params(request.sampling, request.speculation.verification);
  sequence->random = RandomStream(request.sampling.seed);
  if (LogitProcessor::processes_logits(request.sampling, request.logit_bias,
                                       request.grammar != nullptr)) {
    std::optional<grammar::Matcher> matcher;
    if (request.grammar) matcher.emplace(request.grammar, request.vocabulary);
    sequence->processor = std::make_unique<LogitProcessor>(request.sampling, request.prompt,
                                                           request.logit_bias, std::move(matcher));
  }
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
        completion.logprobs.insert(completion.logprobs.end(), update.logprobs.begin(),
                                   update.logprobs.end());
        completion.prompt_logprobs.insert(completion.prompt_logprobs.end(),
                                          update.prompt_logprobs.begin(),
                                          update.prompt_logprobs.end());
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
                                const std::string& error, const RequestUpdate& last) {
  if (sequence->target_kv >= 0) {
    target.kv_cache().remove_sequence(sequence->target_kv);
    reserved_target_blocks -= sequence->reserved_target_blocks;
    reserved_draft_blocks -= sequence->reserved_draft_blocks;
    if (sequence->drafts_with_model)
      drafter.model()->remove_sequence(static_cast<int64_t>(sequence->id));
    for (auto& [kind, policy] : policies) policy->forget(static_cast<int64_t>(sequence->id));
  }
  RequestStats& stats = sequence->stats;
  record_timeline(stats, sequence->token_ms, milliseconds(sequence->submitted, Clock::now()));
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
    update.tokens = last.tokens;
    update.drafted = last.drafted;
    update.accepted_drafts = last.accepted_drafts;
    update.logprobs = last.logprobs;
    update.prompt_logprobs = sequence->prompt_logprobs;  // a request ending in its first step
    update.finished = true;
    update.reason = reason;
    update.error = error;
    update.stats = &stats;
    sequence->on_update(update);
  }
}

int64_t BatchEngine::State::room(const Sequence& sequence) const {
  const int64_t length = static_cast<int64_t>(sequence.committed.size());
  const int64_t remaining = sequence.request.sampling.max_tokens - sequence.generated;
  int64_t room = std::min(remaining - 1, target.context_limit() - length);
  if (sequence.drafts_with_model) room = std::min(room, draft->context_limit() - length + 1);
  return room;
}

int64_t BatchEngine::State::cap(const Sequence& sequence) const {
  const SpeculationSettings& speculation = sequence.request.speculation;
  const bool lookup = speculation.method == SpeculationMethod::kPromptLookup;
  if (!sequence.drafts_with_model && !lookup) return 0;
  return std::max<int64_t>(std::min(speculation.gamma_max, room(sequence)), 0);
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

}  // namespace specrun
