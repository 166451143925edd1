// The phases of a step, in the order step() runs them: admit, plan, propose, score, draft ahead,
// collect the verdict, commit, deliver (the architecture's "One step").
#include <algorithm>
#include <set>

#include "runtime/base/check.h"
#include "runtime/engine/engine_state.h"
#include "verify/commit.h"

namespace specrun {

// Admit and prefill: one batched target prefill of every prompt but its last token (which is fed
// with the first step's drafts), after the cached blocks it starts with; the prefilled prompt is
// sealed, so that later requests reuse it. Requests admitted together whose prompts begin with the
// same block (n choices of one prompt, a shared system prompt) are prefilled in waves: the first
// of them in the first wave, whose sealed blocks the others then reuse in the next, so the shared
// prefix is computed once. The draft catches up in its first proposal. A request for no tokens at
// all finishes here.
void BatchEngine::State::admit(std::vector<std::unique_ptr<Sequence>> admitted) {
  KvCache& cache = target.kv_cache();
  const auto block = static_cast<size_t>(cache.layout().block_size);
  while (!admitted.empty()) {
    std::vector<std::unique_ptr<Sequence>> wave, later;
    std::set<std::vector<int32_t>> claimed;  // the first blocks this wave prefills
    for (auto& sequence : admitted) {
      const std::vector<int32_t>& prompt = sequence->committed;
      if (cache.prefix_caching() && prompt.size() > block &&
          !claimed.emplace(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(block)).second) {
        later.push_back(std::move(sequence));
      } else {
        wave.push_back(std::move(sequence));
      }
    }
    admit_wave(std::move(wave));
    admitted = std::move(later);
  }
}

void BatchEngine::State::admit_wave(std::vector<std::unique_ptr<Sequence>> admitted) {
  const auto start = Clock::now();
  std::vector<std::unique_ptr<Sequence>> starting;
  std::vector<SequenceInput> prefill;
  std::vector<std::pair<Sequence*, int64_t>> prefilled;  // and the first position it computes
  std::vector<Sequence*> whole_prompts;  // prompts whose log-probabilities are asked for
  const bool reads_features = drafter.model() != nullptr && drafter.model()->reads_features();
  for (auto& sequence : admitted) {
    sequence->stats.queue_ms = milliseconds(sequence->submitted, start);
    sequence->target_kv = target.kv_cache().add_sequence();
    if (sequence->drafts_with_model)
      drafter.model()->add_sequence(static_cast<int64_t>(sequence->id));
    if (sequence->request.sampling.max_tokens == 0) {
      finish(std::move(sequence), FinishReason::kMaxTokens, "");
      continue;
    }
    const std::span<const int32_t> fed =
        std::span<const int32_t>(sequence->committed).first(sequence->committed.size() - 1);
    if (sequence->request.prompt_logprobs >= 0) {
      if (!fed.empty()) whole_prompts.push_back(sequence.get());
      starting.push_back(std::move(sequence));
      continue;
    }
    const int64_t reused = reuse_cached_prefix(*sequence, fed);
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
        drafter.model()->observe_features(static_cast<int64_t>(sequence->id), first,
                                          features.of(static_cast<int64_t>(s)));
      }
    }
    for (Sequence* sequence : whole_prompts) prefill_reading_logprobs(*sequence);
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

// A prompt whose log-probabilities are asked for is computed whole (nothing from the prefix cache),
// every token's row of logits kept: in chunks of at most options.prompt_logprob_logits logits
// each, so a long prompt with a large vocabulary never holds all its rows at once, each chunk's
// read on the backend before the next.
void BatchEngine::State::prefill_reading_logprobs(Sequence& sequence) {
  const std::span<const int32_t> committed = sequence.committed;
  const auto fed = static_cast<int64_t>(committed.size()) - 1;
  const int64_t chunk =
      std::max<int64_t>(1, options.prompt_logprob_logits / target.config().vocab_size);
  const bool hands_features = sequence.drafts_with_model && drafter.model()->reads_features();
  for (int64_t first = 0; first < fed; first += chunk) {
    const auto count = static_cast<size_t>(std::min(chunk, fed - first));
    const SequenceInput input[] = {
        {sequence.target_kv, committed.subspan(static_cast<size_t>(first), count), true}};
    Logits logits;
    logits.keep_on_device = true;
    Features features;
    target.forward(input, &logits, hands_features ? &features : nullptr);
    const std::vector<TokenLogprob> part = logprobs.read_prompt(
        logits.device, logits.device_width,
        committed.subspan(static_cast<size_t>(first) + 1, count), sequence.request.prompt_logprobs);
    sequence.prompt_logprobs.insert(sequence.prompt_logprobs.end(), part.begin(), part.end());
    if (hands_features) {
      drafter.model()->observe_features(static_cast<int64_t>(sequence.id), first, features.of(0));
    }
  }
}

// A draft reading the target's features needs them from the position before the first token it
// computes: the target reuses no more of its cache than the draft, and where it reuses as much, the
// feature at its last reused position comes from the block there (annotate_sealed kept it), or the
// target computes that block again.
int64_t BatchEngine::State::reuse_cached_prefix(Sequence& sequence, std::span<const int32_t> fed) {
  const auto id = static_cast<int64_t>(sequence.id);
  const bool hands_features = sequence.drafts_with_model && drafter.model()->reads_features();
  std::span<const int32_t> reusable = fed;
  int64_t draft_reused = 0;
  if (hands_features) {
    draft_reused = drafter.model()->reuse_prefix(id, sequence.committed);
    reusable = fed.first(static_cast<size_t>(draft_reused));
  }
  KvCache& cache = target.kv_cache();
  const int64_t block = cache.layout().block_size;
  int64_t reused = cache.reuse_prefix(sequence.target_kv, reusable);
  if (hands_features && reused > 0 && reused == draft_reused) {
    const std::span<const float> feature = cache.annotation(sequence.target_kv, reused / block - 1);
    if (feature.empty()) {
      reused -= block;
      cache.truncate(sequence.target_kv, reused);
    } else {
      drafter.model()->observe_features(id, reused - 1, feature);
    }
  }
  sequence.annotated_blocks = reused / block;
  sequence.stats.cached_prompt_tokens = reused;
  return reused;
}

void BatchEngine::State::annotate_sealed(Sequence& sequence) {
  if (!sequence.drafts_with_model || !drafter.model()->reads_features()) return;
  KvCache& cache = target.kv_cache();
  const int64_t block = cache.layout().block_size;
  for (; sequence.annotated_blocks < cache.sealed_blocks(sequence.target_kv);
       ++sequence.annotated_blocks) {
    const std::span<const float> feature = drafter.model()->target_feature(
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

// Propose: each row as drafting sees it (its plan, its rule's needs, its room), then the drafter's
// strategies for all of them (draft/step_drafter.h): the draft model for its rows in one batched
// call, prompt lookup or a calibration step's filler per row.
void BatchEngine::State::propose(StepWork& work) {
  const auto start = Clock::now();
  work.rows.clear();
  work.rows.reserve(running.size());
  for (size_t b = 0; b < running.size(); ++b) {
    Sequence& sequence = *running[b];
    const DraftPlan& plan = work.plans[b];
    DraftingRow& row = work.rows.emplace_back();
    row.sequence = static_cast<int64_t>(sequence.id);
    row.committed = sequence.committed;
    row.generated = sequence.generated;
    row.random = sequence.random;
    row.sampling = &sequence.sampling;
    row.speculation = &sequence.request.speculation;
    row.with_model = sequence.drafts_with_model;
    row.gamma = plan.gamma;
    row.filler = plan.filler;
    row.max_catch_up = plan.max_catch_up;
    row.draft_ahead = plan.draft_ahead;
    row.alternate_floor = plan.alternate_floor;
    row.alternates = alternates_for(sequence);
    row.keep_distributions = rule_reads_draft_distributions(sequence);
    row.room = room(sequence);
    row.state = &sequence.drafting;
    row.processor = sequence.processor.get();
    row.host_reads_drafts = options.verifier != nullptr;
  }
  try {
    drafter.propose(work.rows, work.drafts);
  } catch (const std::exception& error) {
    work.failure = std::string("drafting failed: ") + error.what();
    return;
  }
  work.draft_ms = milliseconds(start, Clock::now());
}

// Overlapped drafting (StepDrafter::draft_ahead), enqueued after the target's forward and
// verification, so that a backend with the draft on a stream of its own runs it beside them: the
// host waits for the draft's draws here, and for the target's verdict only after.
void BatchEngine::State::draft_ahead(StepWork& work) {
  const auto start = Clock::now();
  try {
    drafter.draft_ahead(work.rows, work.drafts);
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
    if (work.drafts.proposals.has_alternates())
      drop_alternates_past_room(work.drafts.proposals, b, sequence);
    ScoreRequest& request = score_requests.emplace_back();
    request = {sequence.target_kv, sequence.committed.back(), work.drafts.proposals.row_tokens(b),
               &sequence.sampling};
    request.processor = sequence.processor.get();
    if (work.drafts.proposals.has_alternates()) {
      const Proposals& proposals = work.drafts.proposals;
      request.alternates_width = proposals.alternates_width;
      request.alternates =
          std::span<const int32_t>(proposals.alternates)
              .subspan(static_cast<size_t>(b * proposals.gamma * proposals.alternates_width),
                       request.drafts.size() * static_cast<size_t>(proposals.alternates_width));
    }
  }
  try {
    const bool reads_features = drafter.model() != nullptr && drafter.model()->reads_features();
    Proposals& proposals = work.drafts.proposals;
    if (options.skip_draft_wait) proposals.on_device.drawn = nullptr;
    work.scores = &scorer.score(score_requests, reads_features ? &work.target_features : nullptr,
                                proposals.drafts_on_device() ? &proposals.on_device : nullptr);
    work.draws.clear();
    std::vector<kernels::VerifyRule> rules;
    for (const auto& sequence : running) {
      work.draws.push_back({sequence->random, sequence->generated});
      rules.push_back(verify_rule(sequence->sampling));
    }
    if (options.verifier == nullptr) {
      verification.enqueue(work.drafts.proposals, *work.scores, rules, work.draws);
      // Read where the verification leaves its tokens, before the step waits for them.
      logprobs.enqueue(*work.scores, logprob_tops(), verification.tokens(),
                       work.drafts.proposals.gamma + 1);
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
      work.verdict = verification.collect(work.drafts.proposals, scores, &work.alternate_input);
      logprobs.collect();
      for (int64_t b = 0; work.drafts.proposals.drafts_on_device() && b < batch; ++b) {
        // A draft row that could not be sampled drew 0s, which the verification judged like any
        // draft; the request still fails, naming the draft.
        const kernels::RowStatus status = verification.draft_status(b);
        if (status == kernels::RowStatus::kOk) continue;
        work.failure = "drafting failed: the draft's row for sequence " +
                       std::to_string(running[static_cast<size_t>(b)]->id) + ": " +
                       kernels::row_status_message(status);
        return;
      }
    } else {
      // A test's rule, on the host (the scores are in host memory: see the constructor).
      Verdict& verdict = work.verdict;
      verdict = options.verifier->verify(work.drafts.proposals, scores, work.draws);
      work.alternate_input.assign(static_cast<size_t>(batch), -1);
      for (int64_t b = 0; work.drafts.proposals.has_alternates() && b < batch; ++b) {
        const int64_t k = accepted_alternate(work.drafts.proposals, verdict, b);
        if (k < 0) continue;
        const int64_t replaced = verdict.accepted[static_cast<size_t>(b)] - 1;  // the draft's
        work.alternate_input[static_cast<size_t>(b)] =
            scores.alternate_inputs[scores.alternate_entry(b, replaced, k)];
      }
      // The host's verdict is in host memory, which a test's rule needs its backend to use.
      logprobs.enqueue(scores, logprob_tops(), verdict.tokens.data(), verdict.width);
      logprobs.collect();
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
  work.logprobs.assign(batch, {});
  work.first_new.assign(batch, 0);
  work.accepted_new.assign(batch, 0);
  int64_t emitted_total = 0, drafted_total = 0, accepted_total = 0, continuing = 0;
  int64_t drafted_ahead = 0, ahead_taken = 0;
  for (size_t b = 0; b < batch; ++b) {
    Sequence& sequence = *running[b];
    const RowVerdict verdict = commit_row(work, b, outcomes[b]);
    if (sequence.drafts_with_model) {
      const AheadUse ahead =
          drafter.roll_back(work.rows[b], work.drafts, static_cast<int64_t>(b), verdict);
      drafted_ahead += ahead != AheadUse::kNone ? 1 : 0;
      ahead_taken += ahead == AheadUse::kTaken ? 1 : 0;
    }
    drafted_total += outcomes[b].drafted;
    accepted_total += outcomes[b].accepted;
    emitted_total += static_cast<int64_t>(sequence.committed.size() - work.first_new[b]);
    if (!work.stops[b]) continuing += 1;
  }
  for (const auto& [kind, members] : work.rows_of) {
    policy(kind).observe(outcomes, work.draft_ms, work.verify_ms);
  }
  const KvCache& cache = target.kv_cache();
  std::lock_guard lock(mutex);
  for (const DraftOutcome& outcome : outcomes) {
    const auto drafted = static_cast<size_t>(outcome.drafted);
    if (counters.drafted_at.size() < drafted) {
      counters.drafted_at.resize(drafted, 0);
      counters.accepted_at.resize(drafted, 0);
    }
    for (size_t i = 0; i < drafted; ++i) {
      counters.drafted_at[i] += 1;
      counters.accepted_at[i] += static_cast<int64_t>(i) < outcome.accepted ? 1 : 0;
    }
  }
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

RowVerdict BatchEngine::State::commit_row(StepWork& work, size_t b, DraftOutcome& outcome) {
  Sequence& sequence = *running[b];
  const Proposals& proposals = work.drafts.proposals;
  const int64_t drafted = proposals.counts[b];
  const int64_t accepted = work.verdict.accepted[b];
  const int64_t fed = work.alternate_input.empty() ? -1 : work.alternate_input[b];
  const std::span<const int32_t> decided = work.verdict.row(static_cast<int64_t>(b));
  outcome = {static_cast<int64_t>(sequence.id),
             drafted,
             accepted,
             work.plans[b].filler,
             work.drafts.catch_up[b],
             work.drafts.from_kept[b],
             work.drafts.drafted_ahead(static_cast<int64_t>(b))};
  outcome.alternate_taken = fed >= 0;
  RequestStats& stats = sequence.stats;
  record_step(stats, drafted, accepted, work.draft_ms, work.verify_ms);
  stats.host_waits += work.transfers.host_waits;
  stats.bytes_to_host += work.transfers.bytes_to_host;
  if (proposals.has_alternates()) {
    const auto first = proposals.alternates.begin() +
                       static_cast<ptrdiff_t>(b) * proposals.gamma * proposals.alternates_width;
    outcome.alternates = std::count_if(first, first + drafted * proposals.alternates_width,
                                       [](int32_t token) { return token >= 0; });
    stats.alternates += outcome.alternates;
    stats.alternates_accepted += outcome.alternate_taken ? 1 : 0;
  }

  const SamplingSettings& sampling = sequence.request.sampling;
  const int64_t length = static_cast<int64_t>(sequence.committed.size());
  const RowCommit commit = decide_commit(decided, length, accepted, fed,
                                         {target.config().eos_token_ids, sampling.stop_at_eos,
                                          sampling.max_tokens - sequence.generated});
  RowVerdict verdict{accepted,          fed >= 0, commit.stop.has_value(), -1, commit.keep,
                     commit.draft_keep, {}};
  const LookupCount looked_up = StepDrafter::tally_contests(
      sequence.drafting, proposals, static_cast<int64_t>(b), decided, verdict);
  stats.looked_up += looked_up.looked_up;
  stats.looked_up_accepted += looked_up.accepted;

  work.stops[b] = commit.stop;
  work.first_new[b] = sequence.committed.size();
  // The row's accepted drafts come first among its tokens: those committed, where it stopped.
  work.accepted_new[b] = std::min(accepted, commit.tokens);
  const auto now = Clock::now();
  for (int64_t i = 0; i < commit.tokens; ++i) {
    sequence.committed.push_back(decided[static_cast<size_t>(i)]);
    sequence.generated += 1;
    sequence.token_ms.push_back(milliseconds(sequence.submitted, now));
    if (sequence.request.logprobs >= 0) {
      TokenLogprob& logprob =
          work.logprobs[b].emplace_back(logprobs.at(static_cast<int64_t>(b), i));
      logprob.token = decided[static_cast<size_t>(i)];
    }
  }
  if (sequence.processor)
    sequence.processor->commit(decided.first(static_cast<size_t>(commit.tokens)));
  stats.tokens_generated = sequence.generated;
  if (!sequence.token_ms.empty()) stats.ttft_ms = sequence.token_ms.front();
  verdict.new_token = sequence.committed.back();
  verdict.committed = sequence.committed;
  roll_back_target(work, b, commit, length);
  return verdict;
}

// The target's cache keeps what row b committed (an accepted alternate's keys and values moved to
// its place) and seals it; a feature-reading draft gets the target's features there.
void BatchEngine::State::roll_back_target(StepWork& work, size_t b, const RowCommit& commit,
                                          int64_t length) {
  Sequence& sequence = *running[b];
  KvCache& cache = target.kv_cache();
  if (commit.alternate_to >= 0) {
    cache.copy_position(sequence.target_kv, commit.alternate_from, commit.alternate_to);
  }
  if (work.drafts.proposals.drafts_on_device() && commit.keep > length) {
    // The forward fed the drafts from the backend, the cache recording stand-ins: the accepted
    // ones are committed text now (pending at length - 1, d_i at length - 1 + i).
    cache.rewrite_tokens(
        sequence.target_kv, length,
        std::span<const int32_t>(sequence.committed)
            .subspan(static_cast<size_t>(length), static_cast<size_t>(commit.keep - length)));
  }
  cache.truncate(sequence.target_kv, commit.keep);
  cache.seal(sequence.target_kv, commit.keep);
  if (sequence.drafts_with_model && drafter.model()->reads_features() && !commit.stop) {
    // The target's features at the positions now committed for good: the pending token's and
    // the accepted drafts', the last of them an accepted alternate's (scored past the drafts).
    const int64_t fed = work.alternate_input.empty() ? -1 : work.alternate_input[b];
    committed_features(work.target_features.of(static_cast<int64_t>(b)),
                       static_cast<size_t>(work.target_features.width), work.verdict.accepted[b],
                       fed, work.committed_features);
    drafter.model()->observe_features(static_cast<int64_t>(sequence.id), length - 1,
                                      work.committed_features);
    annotate_sealed(sequence);
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
    RequestUpdate update;
    update.id = sequence->id;
    update.drafted = work.drafts.proposals.counts[b];
    update.accepted_drafts = work.accepted_new[b];
    update.logprobs = work.logprobs[b];
    update.prompt_logprobs = sequence->prompt_logprobs;
    if (const std::optional<FinishReason> stop = work.stops[b]) {
      // The final update carries this step's tokens.
      const std::vector<int32_t> last(new_tokens.begin(), new_tokens.end());
      update.tokens = last;
      finish(std::move(sequence), *stop, "", update);
      continue;
    }
    if (sequence->on_update) {
      update.tokens = new_tokens;
      update.stats = &sequence->stats;
      sequence->on_update(update);
    }
    sequence->prompt_logprobs.clear();  // delivered with the first update
    still_running.push_back(std::move(sequence));
  }
  running = std::move(still_running);
}

}  // namespace specrun
