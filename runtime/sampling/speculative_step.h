// The plain data one speculative step passes between its roles, through the engine: what the
// draft proposes (Proposals), what the target scores (Scores), what the verifier decides (Verdict).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specrun {

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

  bool point_masses() const { return probs.empty(); }
  bool has_contests() const { return !model_offers.empty(); }
  std::span<const int32_t> row_tokens(int64_t b) const {
    return {tokens.data() + b * gamma, static_cast<size_t>(counts[static_cast<size_t>(b)])};
  }
  std::span<const float> q(int64_t b, int64_t i) const {  // q_{i+1} of row b, i from 0
    return {probs.data() + (b * gamma + i) * vocab, static_cast<size_t>(vocab)};
  }
};

// The target's processed distributions p_0..p_n for each row, n its number of drafts.
struct Scores {
  int64_t vocab = 0;         // row width
  std::vector<float> probs;  // [sum over rows of (count + 1), vocab]
  std::vector<int64_t>
      row_begin;  // [batch + 1]: row b owns distributions [row_begin[b], row_begin[b+1])

  std::span<const float> p(int64_t b, int64_t i) const {  // p_i of row b
    return {probs.data() + (row_begin[static_cast<size_t>(b)] + i) * vocab,
            static_cast<size_t>(vocab)};
  }
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
