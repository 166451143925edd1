#include "runtime/engine/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/core/check.h"
#include "target/scorer.h"

namespace specrun {

SpeculativeMethod parse_method(const std::string& name) {
  if (name == "draft") return SpeculativeMethod::kDraftModel;
  if (name == "prompt_lookup") return SpeculativeMethod::kPromptLookup;
  if (name == "none") return SpeculativeMethod::kNone;
  throw Error("speculative method '" + name + "' is not one of draft, prompt_lookup, none");
}

const char* method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kDraftModel:
      return "draft";
    case SpeculativeMethod::kPromptLookup:
      return "prompt_lookup";
    case SpeculativeMethod::kNone:
      return "none";
  }
  return "?";
}

void validate_speculative(const SpeculativeOptions& options) {
  const GammaLimits& g = options.gamma;
  if (g.min < 0 || g.max < g.min || g.initial < g.min || g.initial > g.max) {
    throw Error("gamma settings must satisfy 0 <= gamma_min <= gamma <= gamma_max, got gamma_min " +
                std::to_string(g.min) + ", gamma " + std::to_string(g.initial) + ", gamma_max " +
                std::to_string(g.max));
  }
  if (g.max > 64) throw Error("gamma_max must be at most 64, got " + std::to_string(g.max));
  if (!(options.draft_p_min >= 0.0f && options.draft_p_min <= 1.0f)) {
    throw Error("draft_p_min must be in [0, 1], got " + std::to_string(options.draft_p_min));
  }
  if (options.lookup_min_ngram < 1 || options.lookup_max_ngram < options.lookup_min_ngram) {
    throw Error("prompt lookup n-gram sizes must satisfy 1 <= min <= max");
  }
}

void SpeculativeStats::record_step(int64_t drafted_now, int64_t accepted_now, double step_draft_ms,
                                   double step_target_ms) {
  steps += 1;
  drafted += drafted_now;
  accepted += accepted_now;
  rejections += accepted_now < drafted_now ? 1 : 0;
  committed_in_steps += accepted_now + 1;
  gamma_histogram[drafted_now] += 1;
  draft_ms += step_draft_ms;
  target_ms += step_target_ms;
}

SpeculativeStats::Latency SpeculativeStats::inter_token_latency() const {
  Latency latency;
  if (token_ms.size() < 2) return latency;
  std::vector<double> gaps;
  for (size_t i = 1; i < token_ms.size(); ++i) gaps.push_back(token_ms[i] - token_ms[i - 1]);
  double total = 0;
  for (const double gap : gaps) total += gap;
  latency.mean = total / static_cast<double>(gaps.size());
  std::sort(gaps.begin(), gaps.end());
  auto quantile = [&](double q) {
    // Nearest rank.
    const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(gaps.size())));
    return gaps[std::min(gaps.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  latency.p50 = quantile(0.50);
  latency.p99 = quantile(0.99);
  return latency;
}

namespace {

using Clock = std::chrono::steady_clock;

double milliseconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Removes a target sequence and the proposer's state however generation ends.
class SequenceScope {
 public:
  SequenceScope(Model& target, Proposer* proposer)
      : target_(target), proposer_(proposer), sequence_(target.kv_cache().add_sequence()) {
    if (proposer_ != nullptr) proposer_->add_sequence(kEngineSequence);
  }
  ~SequenceScope() {
    if (proposer_ != nullptr) proposer_->remove_sequence(kEngineSequence);
    target_.kv_cache().remove_sequence(sequence_);
  }
  SequenceScope(const SequenceScope&) = delete;
  SequenceScope& operator=(const SequenceScope&) = delete;
  SequenceId target_sequence() const { return sequence_; }
  static constexpr int64_t kEngineSequence = 0;  // this generator runs one sequence at a time

 private:
  Model& target_;
  Proposer* proposer_;
  SequenceId sequence_;
};

}  // namespace

SpeculativeGenerator::SpeculativeGenerator(Model& target, Model* draft,
                                           const GenerationOptions& generation,
                                           const SpeculativeOptions& speculative,
                                           const Verifier* verifier)
    : target_(target), draft_(draft), generation_(generation), speculative_(speculative) {
  validate_sampling(generation.sampling);
  validate_speculative(speculative);
  switch (speculative.method) {
    case SpeculativeMethod::kDraftModel:
      if (draft == nullptr) throw Error("speculative method 'draft' needs a draft model");
      proposer_ =
          std::make_unique<ModelProposer>(*draft, generation.sampling, speculative.draft_p_min);
      break;
    case SpeculativeMethod::kPromptLookup:
      proposer_ = std::make_unique<PromptLookupProposer>(speculative.lookup_min_ngram,
                                                         speculative.lookup_max_ngram);
      break;
    case SpeculativeMethod::kNone:
      break;
  }
  if (generation.sampling.temperature == 0.0f) {
    default_verifier_ = std::make_unique<GreedyVerifier>();
  } else {
    default_verifier_ = std::make_unique<RejectionSampler>();
  }
  verifier_ = verifier != nullptr ? verifier : default_verifier_.get();
  if (speculative.controller == ControllerKind::kGoodput) {
    goodput_ = std::make_unique<BatchGoodputController>(speculative.gamma.max);
  } else {
    controller_ = make_gamma_controller(speculative.controller, speculative.gamma);
  }
}

SpeculativeGenerator::~SpeculativeGenerator() = default;

GenerationResult SpeculativeGenerator::generate(std::span<const int32_t> prompt,
                                                const TokenCallback& on_token,
                                                SpeculativeStats* stats_out) {
  const auto start = Clock::now();
  validate_request(target_, prompt, generation_.max_tokens);
  const int64_t target_limit = target_.context_limit();
  const bool drafting = proposer_ != nullptr;
  const int64_t draft_limit =
      speculative_.method == SpeculativeMethod::kDraftModel ? draft_->context_limit() : INT64_MAX;
  SpeculativeStats stats;
  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> committed(prompt.begin(), prompt.end());
  const std::vector<int32_t>& eos = target_.config().eos_token_ids;
  auto finish = [&] {
    stats.total_ms = milliseconds(start, Clock::now());
    stats.tokens_generated = static_cast<int64_t>(result.tokens.size());
    // As the plain loop reports them: up to the first token, and after it.
    result.prefill_ms = stats.ttft_ms;
    result.decode_ms = stats.token_ms.empty() ? 0.0 : stats.total_ms - stats.ttft_ms;
    if (stats_out != nullptr) *stats_out = stats;
    return result;
  };
  if (generation_.max_tokens == 0) return finish();

  SequenceScope scope(target_, proposer_.get());
  const SequenceId target_sequence = scope.target_sequence();
  Scorer scorer(target_, generation_.sampling);
  Rng verify_rng(generation_.sampling.seed);
  Rng draft_rng(generation_.sampling.seed ^ kDraftSeedSalt);

  // The target holds every committed token but the last, which is fed with the drafts.
  if (committed.size() > 1) {
    const auto prefill_start = Clock::now();
    Logits unused;
    const SequenceInput prefill[] = {
        {target_sequence, std::span<const int32_t>(committed).first(committed.size() - 1), false}};
    target_.forward(prefill, &unused);
    stats.target_ms += milliseconds(prefill_start, Clock::now());
  }

  for (;;) {
    const int64_t n = static_cast<int64_t>(committed.size());
    const int64_t remaining = generation_.max_tokens - static_cast<int64_t>(result.tokens.size());
    if (n > target_limit) {  // no room to feed the pending token
      result.stop_reason = StopReason::kContextLimit;
      break;
    }
    // Limits: a step emits up to gamma + 1 tokens; the target feeds gamma + 1 positions from
    // n - 1; the draft feeds through d_{gamma - 1}, position n + gamma - 2.
    const int64_t cap = std::max<int64_t>(0, std::min({speculative_.gamma.max, remaining - 1,
                                                       target_limit - n, draft_limit - n + 1}));
    int64_t gamma = 0;
    bool calibration = false;  // free filler proposals, to measure the target's cost
    if (drafting && goodput_) {
      const BatchGoodputController::Row row[] = {{SequenceScope::kEngineSequence, cap,
                                                  std::min(speculative_.gamma.min, cap),
                                                  speculative_.gamma.initial, -1}};
      gamma = goodput_->choose(row)[0];
      calibration = goodput_->calibrating() && gamma > 0;
    } else if (drafting) {
      gamma = std::clamp<int64_t>(controller_->next_gamma(), 0, cap);
    }

    const auto step_start = Clock::now();
    Proposals proposals;
    int64_t catch_up = 0;  // committed tokens the draft reads before drafting
    if (gamma > 0) {
      const bool probed = goodput_ && goodput_->probing();
      const DraftRequest request[] = {{SequenceScope::kEngineSequence, committed, gamma, &draft_rng,
                                       nullptr, -1.0f,
                                       probed ? BatchGoodputController::kProbeCatchUp : 0}};
      if (calibration) {
        proposals =
            PromptLookupProposer(speculative_.lookup_min_ngram, speculative_.lookup_max_ngram, true)
                .propose(request);
      } else {
        if (speculative_.method == SpeculativeMethod::kDraftModel) {
          catch_up =
              n -
              static_cast<ModelProposer&>(*proposer_).cached_length(SequenceScope::kEngineSequence);
        }
        proposals = proposer_->propose(request);
      }
    } else {
      proposals.batch = 1;
      proposals.counts = {0};
    }
    const auto draft_done = Clock::now();
    const ScoreRequest score_request[] = {
        {target_sequence, committed.back(), proposals.row_tokens(0)}};
    const Scores scores = scorer.score(score_request);
    const Verdict verdict = verifier_->verify(proposals, scores, std::span<Rng>(&verify_rng, 1));
    const auto verify_done = Clock::now();

    const int64_t drafted = proposals.counts[0];
    const int64_t accepted = verdict.accepted[0];
    const double draft_ms = milliseconds(step_start, draft_done);
    const double verify_ms = milliseconds(draft_done, verify_done);
    stats.record_step(drafted, accepted, draft_ms, verify_ms);
    if (goodput_ && drafting) {
      const BatchGoodputController::Outcome outcome[] = {
          {SequenceScope::kEngineSequence, drafted, accepted, true, calibration, catch_up}};
      goodput_->observe(outcome, draft_ms, verify_ms);
    } else if (drafting) {
      controller_->observe({drafted, accepted, draft_ms, verify_ms});
    }

    // Commit the accepted drafts and the new token, stopping at EOS, the token limit or the
    // callback's word.
    bool stop = false;
    for (const int32_t token : verdict.row(0)) {
      if (generation_.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
        result.stop_reason = StopReason::kEndOfSequence;
        stop = true;
        break;
      }
      committed.push_back(token);
      result.tokens.push_back(token);
      stats.token_ms.push_back(milliseconds(start, Clock::now()));
      if (stats.token_ms.size() == 1) stats.ttft_ms = stats.token_ms.front();
      if (on_token && !on_token(token)) {
        result.stop_reason = StopReason::kStopped;
        stop = true;
        break;
      }
      if (static_cast<int64_t>(result.tokens.size()) >= generation_.max_tokens) {
        result.stop_reason = StopReason::kMaxTokens;
        stop = true;
        break;
      }
    }
    if (stop) break;
    // Roll back: both caches keep the committed tokens but the new pending one.
    const int64_t keep = static_cast<int64_t>(committed.size()) - 1;
    target_.kv_cache().truncate(target_sequence, keep);
    if (drafting) proposer_->rollback(SequenceScope::kEngineSequence, keep);
  }
  return finish();
}

}  // namespace specrun
