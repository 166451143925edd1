// The step's drafting strategies, composed per row from the request's settings: the draft model
// (a feature-reading one included, with prompt lookup's contests and alternates inside it), prompt
// lookup alone, a calibration step's free filler, and drafts kept from drafting ahead. The engine
// hands each step's rows in, gets one [batch, gamma] set of proposals back, and after the verdict
// tells the drafter what each row committed, so that the draft's cache and the drafts kept ahead
// follow.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "draft/proposer.h"
#include "specrun/settings.hpp"

namespace specrun {

// How often prompt lookup and the draft model, offering different tokens for a draft, offered
// the one the target committed. Lookup is preferred until the model has won more often: a draft
// that agrees with its target soon keeps its own tokens; one that cannot copy from its context
// gives way where the text repeats itself.
struct LookupContests {
  int64_t lookup_won = 0;  // contests where lookup's token was the target's
  int64_t model_won = 0;   // contests where the model's was
  bool prefer_lookup() const { return lookup_won >= model_won; }
};

// What a sequence's drafting carries from one step to the next.
struct DraftingState {
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

// One running sequence in a step, as drafting sees it.
struct DraftingRow {
  int64_t sequence = 0;                      // the engine's id, also the draft model's sequence
  std::span<const int32_t> committed;        // prompt then every generated token
  int64_t generated = 0;                     // tokens generated: the output position of the next
  RandomStream random;                       // its random numbers
  const SamplingParams* sampling = nullptr;  // its sampling settings
  const SpeculationSettings* speculation = nullptr;  // its speculation settings
  bool with_model = false;  // drafts with the draft model; else prompt lookup proposes
  // The gamma policy's plan (verify/gamma_policy.h's DraftPlan): drafts wanted, whether they are
  // a calibration step's filler, the bound on the draft's catch-up, whether it drafts ahead, the
  // floor under an alternate's chance.
  int64_t gamma = 0;
  bool filler = false;
  int64_t max_catch_up = 0;
  bool draft_ahead = false;
  float alternate_floor = 0.0f;
  int64_t alternates = 0;          // alternates to offer beside each draft (its rule takes them)
  bool keep_distributions = true;  // its rule reads q (rejection sampling)
  // Drafts a step starting now could verify, gamma_max aside: the tokens still to come less the
  // one a step always adds, and room in both models' contexts. May be negative.
  int64_t room = 0;
  DraftingState* state = nullptr;  // the sequence's, carried across steps
  // Its penalties, bias and grammar (the draft's rows are processed as the target's); null: none.
  const LogitProcessor* processor = nullptr;
  // Its drafts are read on the host before the verdict by someone other than the drafter (a
  // replacement verifier): they may not stay where the draft drew them.
  bool host_reads_drafts = false;
};

// One step's drafting, from proposal to the verdict; rows are the step's, in order.
struct StepDrafts {
  Proposals proposals;                     // [batch, gamma]
  std::vector<int64_t> catch_up;           // [batch] committed tokens the draft read first
  std::vector<Proposals> kept;             // [batch] drafts kept ahead (DraftingState::ahead)
  std::vector<int64_t> from_kept;          // [batch] proposals taken from `kept`
  std::vector<std::vector<int32_t>> text;  // [batch] what a draft request reads
  Proposals ahead;                         // [rows drafting ahead, gamma + 1]
  std::vector<int64_t> ahead_row;          // [batch] its row in `ahead`, -1: none
  std::vector<int64_t> ahead_wanted;       // [rows drafting ahead] drafts asked for

  // Drafts row b proposed ahead of its verification (0: it did not draft ahead).
  int64_t drafted_ahead(int64_t b) const {
    const int64_t row = ahead_row.empty() ? -1 : ahead_row[static_cast<size_t>(b)];
    return row < 0 ? 0 : ahead.counts[static_cast<size_t>(row)];
  }
};

// What the verdict did to a row, as its drafting needs to know.
struct RowVerdict {
  int64_t accepted = 0;         // drafts accepted (an accepted alternate counts as one)
  bool took_alternate = false;  // the last accepted token is an alternate
  bool stopped = false;         // the sequence ends with this step
  int32_t new_token = -1;       // the last token committed: the next step's pending one
  int64_t keep = 0;             // committed tokens the caches keep (all but the pending one)
  int64_t draft_keep = 0;       // of them, those the draft's cache holds the right token at
  // The sequence's committed text after the verdict: what names the drafts the draft fed without
  // the host reading them (Proposals::on_device), where its cache keeps them.
  std::span<const int32_t> committed;
};

// What happened to a row's drafts ahead at the verdict.
enum class AheadUse {
  kNone,     // it did not draft ahead
  kDropped,  // it did, and they were dropped
  kTaken,    // it did, and the next step proposes them
};

// Of a row's decided drafts, those prompt lookup proposed, and of them those accepted.
struct LookupCount {
  int64_t looked_up = 0;
  int64_t accepted = 0;
};

class StepDrafter {
 public:
  // `draft` may be null (then every row proposes by prompt lookup). `target_vocab` is the width
  // of the q rows a batch mixing the model's rows and point masses materialises.
  StepDrafter(Model* draft, OverlapDrafting overlap, int64_t target_vocab);

  // The draft model's proposer (null without a draft model): admission and retirement add and
  // remove its sequences, start them from cached prefixes and hand a feature-reading draft the
  // target's features.
  ModelProposer* model() const { return model_.get(); }

  // The step's proposals, in `step.proposals`: rows drafting with the model in one batched call
  // (drafts kept from the last step's drafting ahead first, as far as the row wants them), the
  // rest by prompt lookup or a calibration filler; q is materialised for every row when some
  // row's rule reads it. Where every drafting row drafts with the model and nothing the host does
  // before the verdict reads the drafts (no row drafts ahead or is read by a host verifier), and
  // the model's call leaves them on its backend (ModelProposer), the proposals say where they lie
  // (Proposals::on_device). Throws where the draft model's forward fails.
  void propose(std::span<const DraftingRow> rows, StepDrafts& step);
  // Overlapped drafting: every row the model proposed for in full, and whose plan says so, goes
  // on drafting past its last draft as if all were accepted: first the token verification would
  // then add, then as many drafts as the next step could verify (this step's gamma at most). A
  // backend with a stream per model runs this beside the verification enqueued before it. Proposals
  // left on the backend never draft ahead. Throws where the draft model's forward fails.
  void draft_ahead(std::span<const DraftingRow> rows, StepDrafts& step);
  // After the verdict, for a row drafting with the model: its drafts ahead are kept when every
  // draft was accepted and the new token is their first (the draft's cache keeps them too);
  // otherwise they are dropped and the draft's cache rolls back to what it holds of the text.
  AheadUse roll_back(const DraftingRow& row, const StepDrafts& step, int64_t b,
                     const RowVerdict& verdict);
  // Each draft the verdict decided (those accepted and the first rejected) on which prompt lookup
  // and the draft model offered different tokens counts for the one that offered `decided`'s
  // token (the target's). Called for every row of every step.
  static LookupCount tally_contests(DraftingState& state, const Proposals& proposals, int64_t b,
                                    std::span<const int32_t> decided, const RowVerdict& verdict);

 private:
  // Whether the row may draft ahead of this step (draft_ahead would ask for it).
  bool may_draft_ahead(const DraftingRow& row) const;
  // The step's one [batch, gamma] proposals from the model's rows and the point-mass rows.
  void assemble(std::span<const DraftingRow> rows, StepDrafts& step, const Proposals& from_model,
                std::span<const int64_t> model_rows,
                std::span<const std::pair<int64_t, Proposals>> point_mass) const;

  std::unique_ptr<ModelProposer> model_;
  OverlapDrafting overlap_;
  int64_t target_vocab_;
};

}  // namespace specrun
