#include "draft/step_drafter.h"

#include <algorithm>

namespace specrun {
namespace {

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

// `committed` followed by `drafts`: the text a draft continues from, as if they were accepted.
std::vector<int32_t> followed_by(std::span<const int32_t> committed,
                                 std::span<const int32_t> drafts) {
  std::vector<int32_t> text(committed.begin(), committed.end());
  text.insert(text.end(), drafts.begin(), drafts.end());
  return text;
}

// What the draft model is asked for `row`: `gamma` drafts continuing `text` from output
// `position`, with the request's confidence floor and prompt lookup, preferring lookup's offers
// as `contests` say.
DraftRequest draft_request(const DraftingRow& row, std::span<const int32_t> text, int64_t gamma,
                           int64_t position, int64_t max_catch_up, const LookupContests& contests,
                           int64_t alternates) {
  const SpeculationSettings& speculation = *row.speculation;
  DraftRequest request{row.sequence, text, gamma, row.random, position, row.sampling};
  request.draft_p_min = speculation.draft_p_min;
  request.max_catch_up = max_catch_up;
  request.lookup_min_ngram = speculation.draft_lookup_ngram;
  request.lookup_max_ngram = speculation.lookup_max_ngram;
  request.lookup_below = speculation.draft_lookup_below;
  request.prefer_lookup = contests.prefer_lookup();
  request.alternates = alternates;
  request.keep_distributions = row.keep_distributions;
  request.processor = row.processor;
  request.uncommitted =
      static_cast<int64_t>(text.size()) - static_cast<int64_t>(row.committed.size());
  return request;
}

}  // namespace

StepDrafter::StepDrafter(Model* draft, OverlapDrafting overlap, int64_t target_vocab)
    : overlap_(overlap), target_vocab_(target_vocab) {
  if (draft != nullptr) model_ = std::make_unique<ModelProposer>(*draft, SamplingParams{}, 0.0f);
}

void StepDrafter::propose(std::span<const DraftingRow> rows, StepDrafts& step) {
  const auto batch = rows.size();
  std::vector<DraftRequest> model_requests;
  std::vector<int64_t> model_rows;
  std::vector<std::pair<int64_t, Proposals>> point_mass;
  step.catch_up.assign(batch, 0);
  step.kept.assign(batch, Proposals{});
  step.from_kept.assign(batch, 0);
  step.text.assign(batch, {});
  for (size_t b = 0; b < batch; ++b) {
    const DraftingRow& row = rows[b];
    DraftingState& state = *row.state;
    // Drafts kept ahead are this step's first proposals when it drafts with the model, as far as
    // it wants them; the draft's cache keeps what it has fed of those taken (all but the last, as
    // if it had proposed them now) and drops the rest.
    int64_t rest = row.gamma;
    if (!state.ahead.tokens.empty()) {
      Proposals& kept = step.kept[b];
      kept = std::move(state.ahead);
      state.ahead = Proposals{};
      const int64_t available = kept.counts[0] - 1;
      int64_t& taken = step.from_kept[b];
      if (!row.filler && row.max_catch_up == 0) taken = std::min(row.gamma, available);
      model_->rollback_keeping(row.sequence, static_cast<int64_t>(row.committed.size()) - 1, taken);
      // The draft model proposes the rest, unless its confidence floor stopped drafting ahead.
      rest = taken == 0 ? row.gamma : (state.ahead_complete ? row.gamma - taken : 0);
    }
    state.ahead_complete = false;
    if (row.gamma == 0) continue;
    if (row.with_model && !row.filler) {
      if (rest == 0) continue;  // every proposal is a kept one
      // After kept drafts, the draft continues from them as if they were committed.
      const int64_t taken = step.from_kept[b];
      std::span<const int32_t> text = row.committed;
      if (taken > 0) {
        step.text[b] = followed_by(
            row.committed, step.kept[b].row_tokens(0).subspan(1, static_cast<size_t>(taken)));
        text = step.text[b];
      }
      model_requests.push_back(draft_request(row, text, rest, row.generated + taken,
                                             row.max_catch_up, state.contests_before,
                                             row.alternates));
      model_requests.back().alternate_floor = row.alternate_floor;
      model_rows.push_back(static_cast<int64_t>(b));
      step.catch_up[b] = static_cast<int64_t>(text.size()) - model_->cached_length(row.sequence);
    } else {
      const SpeculationSettings& speculation = *row.speculation;
      PromptLookupProposer lookup(speculation.lookup_min_ngram, speculation.lookup_max_ngram,
                                  /*pad_to_gamma=*/row.filler);
      const DraftRequest request[] = {
          {row.sequence, row.committed, row.gamma, row.random, row.generated}};
      point_mass.emplace_back(static_cast<int64_t>(b), lookup.propose(request));
    }
  }
  // The model's drafts may stay on its backend only where no other row proposes and nothing reads
  // them on the host before the verdict.
  const bool others_propose =
      std::any_of(step.from_kept.begin(), step.from_kept.end(),
                  [](int64_t taken) { return taken > 0; }) ||
      std::any_of(point_mass.begin(), point_mass.end(),
                  [](const auto& entry) { return entry.second.counts[0] > 0; });
  for (size_t r = 0; r < model_requests.size(); ++r) {
    const DraftingRow& row = rows[static_cast<size_t>(model_rows[r])];
    model_requests[r].host_reads_drafts =
        others_propose || row.host_reads_drafts || may_draft_ahead(row);
  }
  Proposals from_model;
  if (!model_requests.empty()) from_model = model_->propose(model_requests);
  assemble(rows, step, from_model, model_rows, point_mass);
}

void StepDrafter::assemble(std::span<const DraftingRow> rows, StepDrafts& step,
                           const Proposals& from_model, std::span<const int64_t> model_rows,
                           std::span<const std::pair<int64_t, Proposals>> point_mass) const {
  const auto batch = static_cast<int64_t>(rows.size());
  Proposals& proposals = step.proposals;
  proposals = Proposals{};
  proposals.batch = batch;
  for (const DraftingRow& row : rows) proposals.gamma = std::max(proposals.gamma, row.gamma);
  proposals.tokens.assign(static_cast<size_t>(batch * proposals.gamma), -1);
  proposals.counts.assign(static_cast<size_t>(batch), 0);
  const bool any_kept = std::any_of(step.from_kept.begin(), step.from_kept.end(),
                                    [](int64_t taken) { return taken > 0; });
  const bool any_drafts = !model_rows.empty() || any_kept;
  // q is materialised for every row when some row's rule reads it, else for none (point masses).
  // Drafts left on the draft's backend keep their q there too.
  const bool materialise =
      any_drafts && !from_model.drafts_on_device() &&
      std::any_of(rows.begin(), rows.end(), [](const auto& row) { return row.keep_distributions; });
  // Only the draft model's rows bring alternates (drafts kept ahead never do).
  const int64_t alternates_width = from_model.alternates_width;
  if (any_drafts) {
    proposals.vocab = std::max(from_model.vocab, target_vocab_);
    for (const Proposals& kept : step.kept) proposals.vocab = std::max(proposals.vocab, kept.vocab);
  }
  if (materialise) {
    proposals.probs.assign(static_cast<size_t>(batch * proposals.gamma * proposals.vocab), 0.0f);
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
    const int64_t taken = step.from_kept[static_cast<size_t>(b)];
    if (taken > 0) place(b, step.kept[static_cast<size_t>(b)], 0, 1, taken, 0);
  }
  for (size_t r = 0; r < model_rows.size(); ++r) {
    const int64_t b = model_rows[r];
    place(b, from_model, static_cast<int64_t>(r), 0, from_model.counts[r],
          step.from_kept[static_cast<size_t>(b)]);
  }
  for (const auto& [b, source] : point_mass) place(b, source, 0, 0, source.counts[0], 0);
  if (from_model.drafts_on_device()) {
    // Every drafting row is the model's: its entries, in the step's rows and stride.
    DraftsOnDevice& on_device = proposals.on_device;
    on_device = from_model.on_device;
    const auto entries = static_cast<size_t>(batch * proposals.gamma);
    on_device.draw_index.assign(entries, -1);
    on_device.status_index.assign(entries, -1);
    for (size_t r = 0; r < model_rows.size(); ++r) {
      const auto from = static_cast<ptrdiff_t>(r) * from_model.gamma;
      const auto to = model_rows[r] * proposals.gamma;
      const int32_t count = from_model.counts[r];
      std::copy_n(from_model.on_device.draw_index.begin() + from, count,
                  on_device.draw_index.begin() + to);
      std::copy_n(from_model.on_device.status_index.begin() + from, count,
                  on_device.status_index.begin() + to);
    }
  }
}

bool StepDrafter::may_draft_ahead(const DraftingRow& row) const {
  return model_ != nullptr && row.with_model && !row.filler && row.max_catch_up == 0 &&
         (overlap_ == OverlapDrafting::kOn ||
          (overlap_ == OverlapDrafting::kAuto && row.draft_ahead));
}

void StepDrafter::draft_ahead(std::span<const DraftingRow> rows, StepDrafts& step) {
  if (model_ == nullptr || overlap_ == OverlapDrafting::kOff) return;
  if (step.proposals.drafts_on_device()) return;  // no row may: see propose()
  std::vector<DraftRequest> requests;
  step.ahead_row.assign(rows.size(), -1);
  for (size_t b = 0; b < rows.size(); ++b) {
    const DraftingRow& row = rows[b];
    const int64_t drafted = step.proposals.counts[b];
    // A row stopped by the confidence floor has fed its last draft and found the draft unsure.
    if (!may_draft_ahead(row) || drafted == 0 || drafted < row.gamma) {
      continue;
    }
    // The next step starts drafted + 1 tokens later: it could verify this many.
    const int64_t next_cap =
        std::max<int64_t>(0, std::min(row.speculation->gamma_max, row.room - drafted - 1));
    const int64_t wanted = std::min(row.gamma, next_cap) + 1;
    if (wanted < 2) continue;  // the next step could verify none of them
    std::vector<int32_t>& text = step.text[b];
    text = followed_by(row.committed, step.proposals.row_tokens(static_cast<int64_t>(b)));
    step.ahead_row[b] = static_cast<int64_t>(requests.size());
    step.ahead_wanted.push_back(wanted);
    // Drafts ahead are taken only where every draft was accepted: no alternate of theirs would be.
    requests.push_back(
        draft_request(row, text, wanted, row.generated + drafted, 0, row.state->contests, 0));
  }
  if (!requests.empty()) step.ahead = model_->propose(requests);
}

AheadUse StepDrafter::roll_back(const DraftingRow& row, const StepDrafts& step, int64_t b,
                                const RowVerdict& verdict) {
  const int64_t ahead_row = step.ahead_row.empty() ? -1 : step.ahead_row[static_cast<size_t>(b)];
  const int64_t ahead_count = step.drafted_ahead(b);
  const int64_t drafted = step.proposals.counts[static_cast<size_t>(b)];
  if (ahead_row >= 0 && !verdict.stopped && verdict.accepted == drafted &&
      !verdict.took_alternate && ahead_count >= 2 &&
      step.ahead.tokens[static_cast<size_t>(ahead_row * step.ahead.gamma)] == verdict.new_token) {
    DraftingState& state = *row.state;
    state.ahead = one_row(step.ahead, ahead_row);
    state.ahead_complete = ahead_count == step.ahead_wanted[static_cast<size_t>(ahead_row)];
    model_->rollback_keeping(row.sequence, verdict.keep, state.ahead.counts[0], verdict.committed);
    return AheadUse::kTaken;
  }
  model_->rollback_keeping(row.sequence, verdict.draft_keep, 0, verdict.committed);
  return ahead_row >= 0 ? AheadUse::kDropped : AheadUse::kNone;
}

LookupCount StepDrafter::tally_contests(DraftingState& state, const Proposals& proposals, int64_t b,
                                        std::span<const int32_t> decided,
                                        const RowVerdict& verdict) {
  state.contests_before = state.contests;
  LookupCount count;
  if (!proposals.has_contests()) return count;
  const int64_t drafted = proposals.counts[static_cast<size_t>(b)];
  // Past an accepted alternate (the last accepted token) no draft was decided: they followed the
  // draft it replaced, which was rejected.
  const int64_t accepted_drafts = verdict.took_alternate ? verdict.accepted - 1 : verdict.accepted;
  for (int64_t i = 0; i < std::min(drafted, accepted_drafts + 1); ++i) {
    const auto slot = static_cast<size_t>(b * proposals.gamma + i);
    const int32_t model = proposals.model_offers[slot];
    const int32_t lookup = proposals.lookup_offers[slot];
    if (model < 0) continue;
    const int32_t target_token = decided[static_cast<size_t>(i)];
    if (target_token == lookup) state.contests.lookup_won += 1;
    if (target_token == model) state.contests.model_won += 1;
    if (proposals.tokens[slot] == lookup) {
      count.looked_up += 1;
      if (i < accepted_drafts) count.accepted += 1;
    }
  }
  return count;
}

}  // namespace specrun
