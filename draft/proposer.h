// Proposers: given each sequence's committed tokens, propose up to gamma next tokens and the
// processed distribution each was drawn from.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/sampling/sampler.h"
#include "runtime/sampling/speculative_step.h"

namespace specrun {

struct DraftRequest {
  int64_t sequence;                    // the engine's id for the sequence
  std::span<const int32_t> committed;  // every committed token, prompt included
  int64_t gamma;                       // drafts wanted; 0 for none
  RandomStream stream{};               // the sequence's random numbers
  int64_t position = 0;  // output position d_1 is proposed for (d_i for position + i - 1)
  // The sequence's own sampling settings; null: the proposer's. Lets one batch mix requests.
  const SamplingParams* sampling = nullptr;
  float draft_p_min = -1.0f;  // the sequence's own confidence floor; negative: the proposer's
  // Read at most this many unseen committed tokens before drafting, restarting the draft's context
  // at them (a probe from plain decoding measures acceptance; reading everything it skipped would
  // cost as much as having drafted all along). 0: read every unseen token, and the whole context
  // again if an earlier bound cut it.
  int64_t max_catch_up = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void add_sequence(int64_t sequence) = 0;
  virtual void remove_sequence(int64_t sequence) = 0;
  // Proposals for every request, in request order; a row may hold fewer than its gamma.
  virtual Proposals propose(std::span<const DraftRequest> requests) = 0;
  // The first `committed_prefix` committed tokens are final: forget any state past them.
  virtual void rollback(int64_t sequence, int64_t committed_prefix) = 0;
};

// Runs a small model gamma steps per sequence on its own KV cache, sampling each draft from the
// processed distribution q (the same settings as the target's for that sequence) with the numbers
// of the position it proposes (Draw::kDraft, or the shared noise), batched across sequences.
// Drafting stops early for a row when the draft model's own top probability (its unprocessed
// softmax) falls below `draft_p_min`: a draft it does not believe in is rarely accepted.
class ModelProposer : public Proposer {
 public:
  ModelProposer(Model& draft, const SamplingParams& sampling, float draft_p_min);
  ~ModelProposer() override;

  void add_sequence(int64_t sequence) override;
  void remove_sequence(int64_t sequence) override;
  Proposals propose(std::span<const DraftRequest> requests) override;
  void rollback(int64_t sequence, int64_t committed_prefix) override;
  // As rollback(), but keeps up to `drafts` cached positions past the committed prefix: drafts
  // proposed ahead that are still wanted (overlapped drafting). They are not sealed.
  void rollback_keeping(int64_t sequence, int64_t committed_prefix, int64_t drafts);
  // Committed tokens the draft has accounted for: those its cache holds plus those a bounded
  // catch-up skipped. The next proposal reads the committed tokens past this.
  int64_t cached_length(int64_t sequence) const;
  // Committed tokens skipped by a bounded catch-up (0: the draft's context is the whole text).
  int64_t skipped(int64_t sequence) const;

 private:
  Model& draft_;
  SamplingParams sampling_;
  float draft_p_min_;
  struct DraftSequence {
    int64_t id;          // the engine's
    SequenceId kv;       // the draft's KV sequence
    int64_t offset = 0;  // cache position i holds committed token offset + i
  };
  std::vector<DraftSequence> sequences_;
  DraftSequence& state(int64_t sequence);
  const DraftSequence& state(int64_t sequence) const;
};

// Prompt lookup: finds the latest earlier occurrence of the longest suffix n-gram
// (max_ngram down to min_ngram) of the committed tokens and proposes what followed it. No model;
// its q is a point mass on each proposal, which verification handles exactly.
// With `pad_to_gamma`, every row holds exactly its gamma: what the lookup found, then the last
// token repeated. The goodput controller's calibration steps use it to have the target score a
// chosen number of tokens without running the draft model; any point-mass proposal, filler
// included, keeps verification exact.
class PromptLookupProposer : public Proposer {
 public:
  PromptLookupProposer(int64_t min_ngram, int64_t max_ngram, bool pad_to_gamma = false);

  void add_sequence(int64_t) override {}
  void remove_sequence(int64_t) override {}
  Proposals propose(std::span<const DraftRequest> requests) override;
  void rollback(int64_t, int64_t) override {}

 private:
  int64_t min_ngram_;
  int64_t max_ngram_;
  bool pad_to_gamma_;
};

}  // namespace specrun
