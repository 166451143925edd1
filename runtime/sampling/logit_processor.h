// A request's logits processors beyond temperature and the filters: penalties on the tokens of the
// text so far and a bias per token, as edits of single logits (kernels::LogitEdit), and a grammar
// the output must follow (structured output), as a mask of the tokens it allows; the backend
// applies both in place (Backend::edit_logits) before it processes a row. A speculative step
// scores positions after drafted tokens, so the edits and mask of each row are those of the
// committed text followed by the drafts before it: the target's distribution at every position is
// the one decoding without a draft would have had there, and verification keeps the output exactly
// the processed target's (a draft the grammar refuses has no probability, and is never accepted).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "runtime/grammar/matcher.h"
#include "specrun/settings.hpp"

namespace specrun {

// The most entries a request's logit bias may hold (OpenAI's limit is 300 tokens too).
inline constexpr size_t kMaxLogitBias = 300;

// Throws Error naming the token and value where a bias entry is outside [-100, 100] (OpenAI's
// range) or not finite, a token outside [0, vocab), or there are more than kMaxLogitBias entries.
void validate_logit_bias(const std::map<int32_t, float>& bias, int64_t vocab);

class LogitProcessor {
 public:
  // The penalties of `sampling` (frequency, presence, repetition) over the text that starts with
  // `prompt`, `bias` added to its tokens' logits at every position, and where given the grammar
  // the generated text follows, from its start.
  LogitProcessor(const SamplingSettings& sampling, std::span<const int32_t> prompt,
                 const std::map<int32_t, float>& bias,
                 std::optional<grammar::Matcher> matcher = std::nullopt);

  // Whether any row's logits change: a sequence without penalties, bias or a grammar needs no
  // processor.
  static bool processes_logits(const SamplingSettings& sampling,
                               const std::map<int32_t, float>& bias, bool constrained);

  // The sequence generated these tokens (in order, after those before).
  void commit(std::span<const int32_t> generated);

  // Whether the rows are masked (a grammar).
  bool masks() const { return matcher_.has_value(); }
  // The fewest words a mask row takes: the grammar vocabulary's (0 without a grammar).
  size_t mask_words() const { return matcher_ ? matcher_->vocabulary().mask_words() : 0; }
  // Appends to `out` the masks of `rows` rows of `words` words each (at least the vocabulary's;
  // bit t % 32 of word t / 32 set: token t allowed), row i the position after the committed text
  // and drafts[0, i). A row past a draft the grammar refuses allows every token: no verification
  // reads it, as the target gives that draft no probability. Where the grammar allows no token at
  // all (the vocabulary cannot spell any continuation), the end-of-sequence ids are allowed, so
  // that the request ends rather than failing its batch.
  void masks(std::span<const int32_t> drafts, size_t rows, size_t words, std::vector<uint32_t>& out,
             size_t first_row = 0) const;

  // Appends to `out` the edits of `rows` rows, row i the position after the committed text and
  // drafts[0, i) (tokens generated but not yet committed: the drafts before the position a row
  // scores), and pushes out.size() after each row onto `row_ends`. Each token at most once a row,
  // in token order. rows - 1 <= drafts.size(). Rows before `first_row` are left out (a draft's
  // round reads the last row alone).
  void edits(std::span<const int32_t> drafts, size_t rows, std::vector<kernels::LogitEdit>& out,
             std::vector<int64_t>& row_ends, size_t first_row = 0) const;

 private:
  float frequency_;
  float presence_;
  float repetition_;
  std::unordered_set<int32_t> prompt_tokens_;           // for the repetition penalty
  std::unordered_map<int32_t, int32_t> output_counts_;  // generated tokens, with their counts
  std::map<int32_t, float> bias_;
  std::optional<grammar::Matcher> matcher_;  // at the end of the committed text
};

}  // namespace specrun
