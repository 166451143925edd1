// Proposers: given each sequence's committed tokens, propose up to gamma next tokens and the
// processed distribution each was drawn from.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/base/device_buffer.h"
#include "runtime/model/model.h"
#include "runtime/sampling/logit_processor.h"
#include "runtime/sampling/sampling_params.h"
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
  // Where the text so far (this call's drafts included) ends in an n-gram of lookup_min_ngram to
  // lookup_max_ngram tokens that occurred before and the draft model's top probability is below
  // lookup_below (1: whatever it is), the model gives way to prompt lookup: the token that
  // followed the latest such occurrence is proposed with a point-mass q (repeated names and
  // phrases, which a small draft rarely copies). lookup_min_ngram 0: the model's tokens only.
  int64_t lookup_min_ngram = 0;
  int64_t lookup_max_ngram = 0;
  float lookup_below = 1.0f;
  // Where both offer a token and they differ (a contest, recorded in Proposals::model_offers and
  // lookup_offers): propose lookup's, else the model's. The engine decides from past contests.
  bool prefer_lookup = true;
  // Other guesses to offer beside each draft, for the target to score as siblings in a token tree
  // (Proposals::alternates): where lookup and the model differed, the one not proposed, then the
  // model's next most likely tokens (at temperature 0 by its logits, with shared noise those next
  // to win its draw from q, else by q). Only for rules that take them (greedy, shared noise).
  int64_t alternates = 0;
  // An alternate is offered only where the draft puts the chance that it is the target's token at
  // least this high: its own probability of the alternate (its softmax, unprocessed) times that of
  // the row's drafts before it, the chance the step gets that far. A token the target scores
  // costs time; the controller sets this to what one costs, in tokens committed (DraftPlan).
  float alternate_floor = 0.0f;
  // Whether the proposals keep q, the draft's processed distribution at each draft, which
  // rejection sampling reads. Greedy and shared-noise verification read the drafts alone: without
  // it the proposals are point masses (Proposals::point_masses), and no row of the vocabulary's
  // width is kept per draft. A call keeps them if any of its requests asks.
  bool keep_distributions = true;
  // The sequence's penalties, bias and grammar (runtime/sampling/logit_processor.h), applied to
  // the draft's logits as to the target's, so that it drafts what the target may accept (the
  // verification is exact whatever q is); null: none. Its committed text is `committed` but the
  // last `uncommitted` tokens (drafts of the step being verified, when drafting ahead). A call
  // with a processor settles each round: the next round's edits follow the drafts so far.
  const LogitProcessor* processor = nullptr;
  int64_t uncommitted = 0;
  // Whether the host reads the row's drafts before the verdict (drafting ahead from them, a
  // replacement verifier on the host). A call none of whose rows does, and that needs no decision
  // of the host's between or after its rounds (no lookup, confidence floor, alternates or
  // processors, not reading features), leaves its drafts and their q where the backend drew them
  // (Proposals::on_device): the host does not wait for the draft at all.
  bool host_reads_drafts = true;
};

// Prompt lookup's match: the index of the token after the latest earlier occurrence of the
// longest suffix n-gram of `text` (max_ngram tokens down to min_ngram) that has a token after it;
// -1 when no suffix of min_ngram tokens or more occurred before.
int64_t lookup_continuation(std::span<const int32_t> text, int64_t min_ngram, int64_t max_ngram);

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
// softmax) falls below `draft_p_min`: a draft it does not believe in is rarely accepted. A request
// may have prompt lookup propose in the model's place where the text repeats itself
// (DraftRequest::lookup_min_ngram); the model then reads the looked-up token as its own draft.
//
// A draft that reads its target's features (ModelConfig::feature_width) reads, beside each
// committed token, the target's feature at the position before it, which the engine hands over
// as the target computes them (observe_features); beside each of its own drafts it reads its own
// output feature at the position before. Its cache positions fed its own features are dropped at
// rollback, the committed tokens there read again with the target's.
class ModelProposer : public Proposer {
 public:
  ModelProposer(Model& draft, const SamplingParams& sampling, float draft_p_min);
  ~ModelProposer() override;

  void add_sequence(int64_t sequence) override;
  void remove_sequence(int64_t sequence) override;
  Proposals propose(std::span<const DraftRequest> requests) override;
  void rollback(int64_t sequence, int64_t committed_prefix) override;
  // As rollback(), but keeps up to `drafts` cached positions past the committed prefix: drafts
  // proposed ahead that are still wanted (overlapped drafting). They are not sealed. `text` is the
  // committed text: where the last call left its drafts on the backend, the cache recorded
  // stand-ins for the ids it fed from there, and the text names those the prefix keeps. A
  // rollback keeping such positions without the text is a bug (CHECK).
  void rollback_keeping(int64_t sequence, int64_t committed_prefix, int64_t drafts,
                        std::span<const int32_t> text = {});
  // Committed tokens the draft has accounted for: those its cache holds plus those a bounded
  // catch-up skipped. The next proposal reads the committed tokens past this.
  int64_t cached_length(int64_t sequence) const;
  // Committed tokens skipped by a bounded catch-up (0: the draft's context is the whole text).
  int64_t skipped(int64_t sequence) const;
  // Whether the draft reads its target's features (then the engine calls observe_features).
  bool reads_features() const { return draft_.config().reads_features(); }
  // The target's features at committed positions [first_position, first_position + rows), as
  // its forwards compute them: [rows, feature_width].
  void observe_features(int64_t sequence, int64_t first_position, std::span<const float> rows);
  // The target's feature at committed position `position` as handed over, [feature_width];
  // empty where it was not (served from the target's prefix cache, or not yet computed).
  std::span<const float> target_feature(int64_t sequence, int64_t position) const;
  // Starts a new sequence's draft context from cached blocks of `prompt` (never its last token)
  // and returns how many tokens it reused. A feature-reading draft needs the target's features
  // from the position before the first it reads: the engine lets the target reuse no more, and
  // hands over the feature the target's last reused block keeps (KvCache::annotate).
  int64_t reuse_prefix(int64_t sequence, std::span<const int32_t> prompt);

 private:
  Model& draft_;
  SamplingParams sampling_;
  float draft_p_min_;
  struct DraftSequence {
    int64_t id;          // the engine's
    SequenceId kv;       // the draft's KV sequence
    int64_t offset = 0;  // cache position i holds committed token offset + i
    // A feature-reading draft's: the target's features by committed position, [positions,
    // feature_width], known from position features_from on (earlier ones were served from the
    // target's prefix cache and never computed), and how many cache positions were computed
    // from the target's features (the rest from the draft's own).
    std::vector<float> features{};
    int64_t features_from = 0;
    int64_t read_target_features = 0;
    // The first cache position whose recorded token is a stand-in (a draft fed from the backend's
    // memory that the host never read), to be rewritten from the committed text; -1: none.
    int64_t stand_ins_from = -1;
  };
  std::vector<DraftSequence> sequences_;

  // One propose() call's state, shared by its phases (defined in proposer.cpp).
  struct Call;
  // Each round of drafting samples its rows on the draft's backend (Backend::sample). Round r's
  // rows are entries [r * round_rows_, (r + 1) * round_rows_) of the sampling rows and drawn
  // tokens; its results block (its SampledRows, then their q where the call keeps them) follows
  // the blocks of the rounds before it, and comes back with them in one copy. Reused from call
  // to call.
  int64_t round_rows_ = 0;                       // rows of the call's first round
  std::vector<kernels::SampleRow> sample_rows_;  // [rounds, round_rows_] as the host wrote them
  std::vector<uint64_t> results_host_;           // the results blocks read back
  DeviceBuffer sample_rows_device_;              // [rounds, round_rows_] SampleRow
  DeviceBuffer results_device_;                  // the rounds' results blocks
  DeviceBuffer drawn_device_;  // [rounds, round_rows_] int32: what each round's rows drew
  // q on the backend where the host does not read it: every round's rows, [rounds, round_rows_,
  // row width], where a call leaves its drafts there and keeps q (for the target to gather);
  // else [round_rows_, row width] that each round overwrites.
  DeviceBuffer q_device_;
  DeviceBuffer head_tokens_device_;  // a reduced head's output_token_ids
  // Recorded after the last round of a call that leaves its drafts on the backend.
  std::unique_ptr<kernels::Event> drawn_event_;
  // The round's logits processing, where its requests have processors: host staging and the
  // upload (row offsets, edits, masks), reused from round to round.
  LogitEditBatch edits_;
  std::vector<uint32_t> token_mask_;  // one row's mask over the vocabulary, before mapping

  // The round's forward: each row of the round reads its unseen committed tokens (round 0) or
  // its previous draft, from the host or, where the call settles its rounds at the end, straight
  // from the draft's memory.
  void feed(Call& call, int64_t round);
  // Round 0's input for row b: the committed tokens the draft has not read, its context first
  // restarted where the request bounds the catch-up.
  void catch_up(Call& call, int64_t b);
  // Enqueues the sampling of the round's rows of the forward's logits.
  void enqueue_sample(Call& call, int64_t round, const Logits& logits);
  // Edits the round's rows of the forward's logits by their requests' processors (a reduced
  // head's columns through its map), in place, before they are sampled.
  void enqueue_processing(Call& call, int64_t round, const Logits& logits);
  // Reads back the results blocks of rounds [first, first + count) in one copy.
  void read_back(const Call& call, int64_t first, int64_t count);
  // The host's decisions for one row of a round read back (lookup, the confidence floor,
  // alternates, q): records its draft, and says whether the row drafts on.
  bool settle(Call& call, int64_t round, size_t row);
  // A call that settled at the end fed every row up to its gamma: the cache positions past the
  // drafts a row kept are dropped, and the kept ones learn their token ids.
  void trim_after_settling(Call& call);
  // A call that leaves its drafts on the backend: every row drafted its gamma; the proposals say
  // where each draft, its q (where kept) and its row's status lie, and an event marks the last
  // draw.
  void leave_on_device(Call& call);
  DraftSequence& state(int64_t sequence);
  // Where a feature-reading draft's context may start: past the positions whose target features
  // were never computed (served from the target's prefix cache); 0 for any other draft.
  int64_t earliest_context(const DraftSequence& entry) const {
    return reads_features() && entry.features_from > 0 ? entry.features_from + 1 : 0;
  }
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
