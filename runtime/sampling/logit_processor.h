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
#include "runtime/base/device_buffer.h"
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

// One call's rows of edits and masks, staged on the host by their processors and applied in one
// upload and one edit_logits: what the target's scorer and the draft's rounds share. Reused from
// call to call.
class LogitEditBatch {
 public:
  // Starts a batch of rows `words` mask words wide (0: no row is masked).
  void clear(size_t words) {
    words_ = words;
    row_ends_.assign(1, 0);
    edits_.clear();
    masks_.clear();
  }
  // The staging a processor appends a row's edits to (LogitProcessor::edits) and where the row
  // ends are pushed; then its mask (LogitProcessor::masks), if masked().
  std::vector<kernels::LogitEdit>& edits() { return edits_; }
  std::vector<int64_t>& row_ends() { return row_ends_; }
  std::vector<uint32_t>& masks() { return masks_; }
  bool masked() const { return words_ > 0; }
  // `rows` rows no processor touches: no edits, every token allowed.
  void add_untouched(size_t rows) {
    row_ends_.insert(row_ends_.end(), rows, static_cast<int64_t>(edits_.size()));
    masks_.resize(masks_.size() + rows * words_, ~0u);
  }
  // Edits `logits` ([rows staged, width], on `backend`) in place, where anything changes them.
  void apply(kernels::Backend& backend, int64_t width, float* logits, const char* what);

 private:
  size_t words_ = 0;
  std::vector<int64_t> row_ends_;          // [rows + 1]
  std::vector<kernels::LogitEdit> edits_;  // the rows' edits
  std::vector<uint32_t> masks_;            // [rows, words_]
  DeviceBuffer device_;                    // row_ends_, edits_, masks_
};

}  // namespace specrun
