// A request's logits processors beyond temperature and the filters: penalties on the tokens of the
// text so far and a bias per token, as edits of single logits (kernels::LogitEdit) that the
// backend applies in place (Backend::edit_logits) before it processes a row. A speculative step
// scores positions after drafted tokens, so the edits of each row are those of the committed text
// followed by the drafts before it: the target's distribution at every position is the one
// decoding without a draft would have had there, and verification keeps the output exactly the
// processed target's.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
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
  // `prompt`, and `bias` added to its tokens' logits at every position.
  LogitProcessor(const SamplingSettings& sampling, std::span<const int32_t> prompt,
                 const std::map<int32_t, float>& bias);

  // Whether any row's logits change: a sequence without penalties or bias needs no processor.
  static bool edits_logits(const SamplingSettings& sampling, const std::map<int32_t, float>& bias);

  // The sequence generated these tokens (in order, after those before).
  void commit(std::span<const int32_t> generated);

  // Appends to `out` the edits of `rows` rows, row i the position after the committed text and
  // drafts[0, i) (tokens generated but not yet committed: the drafts before the position a row
  // scores), and pushes out.size() after each row onto `row_ends`. Each token at most once a row,
  // in token order. rows - 1 <= drafts.size().
  void edits(std::span<const int32_t> drafts, size_t rows, std::vector<kernels::LogitEdit>& out,
             std::vector<int64_t>& row_ends) const;

 private:
  float frequency_;
  float presence_;
  float repetition_;
  std::unordered_set<int32_t> prompt_tokens_;           // for the repetition penalty
  std::unordered_map<int32_t, int32_t> output_counts_;  // generated tokens, with their counts
  std::map<int32_t, float> bias_;
};

}  // namespace specrun
