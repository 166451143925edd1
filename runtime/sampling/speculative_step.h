// The plain data one speculative step passes between its roles, through the engine: what the
// draft proposes (Proposals), what the target scores (Scores), what the verifier decides (Verdict).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace specrun::kernels {
class Event;
}  // namespace specrun::kernels

namespace specrun {

// Drafts the host has not read: where a draft model's draws lie in the backend's memory, for the
// target's ops to gather (Backend::gather) once its stream has waited for `drawn`. The host learns
// the accepted ones from the verdict, the one copy a step reads back.
struct DraftsOnDevice {
  const int32_t* draws = nullptr;  // [draw_count] the draft's drawn ids, in the order drawn
  int64_t draw_count = 0;
  std::vector<int32_t> draw_index;  // [batch, gamma] the entry of draws holding each draft, -1
                                    // past a row's count
  // [status_words] 32-bit words of the draft's results, among them the RowStatus of each draw
  // (kernels::SampledRow::status): a draw whose row could not be sampled is a 0 in draws, and the
  // step fails naming the draft once the verdict comes back with these.
  const int32_t* statuses = nullptr;
  int64_t status_words = 0;
  std::vector<int32_t> status_index;  // [batch, gamma] the word of statuses for each draft, -1
                                      // past a row's count
  // Where rows keep q (rejection sampling): [draw_count, q_width], row e the distribution draw e
  // was drawn from, over a reduced head's columns where q_columns ([q_width] token ids) is given;
  // null: point masses.
  const float* q = nullptr;
  int64_t q_width = 0;
  const int32_t* q_columns = nullptr;
  // Recorded on the draft's stream after its last draw: what an op reading draws or statuses on
  // another stream waits for. Null only where a test drops the wait on purpose.
  const kernels::Event* drawn = nullptr;
};

// Up to gamma proposed tokens per sequence, with the processed draft distribution each was drawn
// from.
struct Proposals {
  int64_t batch = 0;            // sequences
  int64_t gamma = 0;            // the most drafts any row may hold (row stride)
  int64_t vocab = 0;            // row width of probs; 0 when every row is a point mass
  std::vector<int32_t> tokens;  // [batch, gamma] drafts, -1 past a row's count
  std::vector<int32_t> counts;  // [batch] drafts actually proposed (<= gamma)
  // [batch, gamma, vocab] processed distributions q_1..q_gamma. Empty when the proposer's q is a
  // point mass on each draft token (prompt lookup): q_i(x) = [x == d_i].
  std::vector<float> probs;
  // Contests (DraftRequest::lookup_min_ngram): where prompt lookup and the draft model offered
  // different tokens for a draft, what each offered (the draft is one of the two); -1 elsewhere.
  // [batch, gamma] each; empty when no row had a contest.
  std::vector<int32_t> model_offers;
  std::vector<int32_t> lookup_offers;
  // Alternates (DraftRequest::alternates): up to alternates_width other guesses for each draft's
  // position, siblings of d_i in a token tree that the target scores beside the drafts, -1 where
  // none: [batch, gamma, alternates_width]. Only rules that accept a token for being the
  // target's own (greedy, shared noise) take them. Empty: none.
  int64_t alternates_width = 0;
  std::vector<int32_t> alternates;
  // Where the drafts lie when the host has not read them (then `tokens` holds -1 throughout, and
  // probs, contests and alternates are empty: q, where kept, is on the backend too); draws null:
  // the drafts are `tokens`.
  DraftsOnDevice on_device;

  bool point_masses() const { return probs.empty() && on_device.q == nullptr; }
  bool drafts_on_device() const { return on_device.draws != nullptr; }
  bool has_alternates() const { return !alternates.empty(); }
  // Row b's alternates for draft i (from 0): [alternates_width], -1 past those it has.
  std::span<const int32_t> alternates_of(int64_t b, int64_t i) const {
    return {alternates.data() + (b * gamma + i) * alternates_width,
            static_cast<size_t>(alternates_width)};
  }
  bool has_contests() const { return !model_offers.empty(); }
  std::span<const int32_t> row_tokens(int64_t b) const {
    return {tokens.data() + b * gamma, static_cast<size_t>(counts[static_cast<size_t>(b)])};
  }
  std::span<const float> q(int64_t b, int64_t i) const {  // q_{i+1} of row b, i from 0
    return {probs.data() + (b * gamma + i) * vocab, static_cast<size_t>(vocab)};
  }
};

// The target's processed distributions p_0..p_n for each row, n its number of drafts, and after
// each of its alternates.
struct Scores {
  int64_t vocab = 0;  // row width
  int64_t rows = 0;   // rows of probs
  // [rows, vocab] in the memory of the backend that processed them (valid until the scorer's next
  // call): the host reads them only where that backend uses host memory (a Verifier on the host,
  // tests). Each row's RowStatus beside them ([rows]; null: every row kOk).
  const float* probs = nullptr;
  const int32_t* status = nullptr;
  // [rows, vocab] the logits they were processed from, in the same memory, after the requests'
  // penalties and bias (LogitProcessor): what their log-probabilities are read from. Null for
  // scores made on the host.
  const float* logits = nullptr;
  // [batch + 1]: row b's p_i is row row_begin[b] + i (i = 0..n); the rows after its p_n, up to
  // row_begin[b + 1], are the distributions after its alternates.
  std::vector<int64_t> row_begin;

  // With alternates (Proposals::alternates): row b's entries for its n drafts' alternates,
  // [n, alternates_width] from alternate_begin[b]; for each, the row of probs holding the target's
  // distribution after that alternate and where the target's forward fed it among the row's
  // tokens (0 is the pending token, 1..n the drafts); -1 where none. Empty when no alternate was
  // scored.
  int64_t alternates_width = 0;
  std::vector<int64_t> alternate_begin;  // [batch + 1]
  std::vector<int64_t> alternate_rows;
  std::vector<int64_t> alternate_inputs;

  // Scores made on the host (tests): points probs at `host_rows` ([rows, vocab]), which the
  // scores (and their copies) then share.
  void hold(std::vector<float> host_rows) {
    held_ = std::make_shared<const std::vector<float>>(std::move(host_rows));
    probs = held_->data();
    rows = vocab == 0 ? 0 : static_cast<int64_t>(held_->size()) / vocab;
    status = nullptr;
    logits = nullptr;
  }

  // Row b's entry for alternate k of draft i (from 0).
  size_t alternate_entry(int64_t b, int64_t i, int64_t k) const {
    return static_cast<size_t>(alternate_begin[static_cast<size_t>(b)] + i * alternates_width + k);
  }

  std::span<const float> row(int64_t index) const {
    return {probs + index * vocab, static_cast<size_t>(vocab)};
  }
  std::span<const float> p(int64_t b, int64_t i) const {  // p_i of row b
    return row(row_begin[static_cast<size_t>(b)] + i);
  }
  std::span<const float> p_after_alternate(size_t entry) const {
    return row(alternate_rows[entry]);
  }

 private:
  std::shared_ptr<const std::vector<float>> held_;
};

// The verifier's decision for each row: k accepted drafts then one recovered or bonus token.
struct Verdict {
  int64_t batch = 0;              // rows
  int64_t width = 0;              // gamma + 1 (row stride)
  std::vector<int32_t> tokens;    // [batch, gamma + 1]: d_1..d_k, then the new token, then -1
  std::vector<int32_t> accepted;  // [batch] k, the number of drafts accepted

  std::span<const int32_t> row(int64_t b) const {  // the k + 1 tokens to commit
    return {tokens.data() + b * width, static_cast<size_t>(accepted[static_cast<size_t>(b)] + 1)};
  }
  std::span<int32_t> slots(int64_t b) {  // row b's gamma + 1 slots, for a verifier to fill
    return {tokens.data() + b * width, static_cast<size_t>(width)};
  }
};

}  // namespace specrun
