#include "runtime/sampling/logit_processor.h"

#include <cmath>
#include <string>

#include "runtime/base/check.h"
#include "specrun/error.hpp"

namespace specrun {

void validate_logit_bias(const std::map<int32_t, float>& bias, int64_t vocab) {
  if (bias.size() > kMaxLogitBias) {
    throw Error("logit_bias holds " + std::to_string(bias.size()) + " tokens, more than " +
                std::to_string(kMaxLogitBias));
  }
  for (const auto& [token, value] : bias) {
    if (token < 0 || token >= vocab) {
      throw Error("logit_bias names token " + std::to_string(token) +
                  ", outside the vocabulary of " + std::to_string(vocab));
    }
    if (!std::isfinite(value) || value < -100.0f || value > 100.0f) {
      throw Error("logit_bias for token " + std::to_string(token) +
                  " must be in [-100, 100], got " + std::to_string(value));
    }
  }
}

bool LogitProcessor::processes_logits(const SamplingSettings& sampling,
                                      const std::map<int32_t, float>& bias, bool constrained) {
  return sampling.frequency_penalty != 0.0f || sampling.presence_penalty != 0.0f ||
         sampling.repetition_penalty != 1.0f || !bias.empty() || constrained;
}

LogitProcessor::LogitProcessor(const SamplingSettings& sampling, std::span<const int32_t> prompt,
                               const std::map<int32_t, float>& bias,
                               std::optional<grammar::Matcher> matcher)
    : frequency_(sampling.frequency_penalty),
      presence_(sampling.presence_penalty),
      repetition_(sampling.repetition_penalty),
      bias_(bias),
      matcher_(std::move(matcher)) {
  if (repetition_ != 1.0f) prompt_tokens_.insert(prompt.begin(), prompt.end());
}

void LogitProcessor::commit(std::span<const int32_t> generated) {
  for (const int32_t token : generated) {
    output_counts_[token] += 1;
    // A token the grammar refuses is committed only where it allowed nothing (an end-of-sequence
    // id let through, masks()) or the request ignores end-of-sequence; the matcher stays put.
    if (matcher_) matcher_->accept_token(token);
  }
}

void LogitProcessor::masks(std::span<const int32_t> drafts, size_t rows, size_t words,
                           std::vector<uint32_t>& out, size_t first_row) const {
  SPECRUN_CHECK(matcher_ && words >= matcher_->vocabulary().mask_words() &&
                (rows == 0 || rows - 1 <= drafts.size()))
      << rows << " masks of " << words << " words after " << drafts.size() << " drafts";
  grammar::Matcher probe = *matcher_;
  bool followed = true;  // every draft so far is one the grammar allows
  for (size_t row = 0; row < rows; ++row) {
    if (row > 0 && followed) followed = probe.accept_token(drafts[row - 1]);
    if (row < first_row) continue;
    const size_t first = out.size();
    out.resize(first + words, followed ? 0u : ~0u);
    if (!followed) continue;
    const std::span<uint32_t> mask(out.data() + first, words);
    if (probe.fill_mask(mask) == 0) {
      for (const int32_t id : probe.vocabulary().eos_ids()) {
        if (id >= 0 && static_cast<size_t>(id) < words * 32) mask[id / 32] |= 1u << (id % 32);
      }
    }
  }
}

void LogitProcessor::edits(std::span<const int32_t> drafts, size_t rows,
                           std::vector<kernels::LogitEdit>& out, std::vector<int64_t>& row_ends,
                           size_t first_row) const {
  SPECRUN_CHECK(rows == 0 || rows - 1 <= drafts.size())
      << rows << " rows after " << drafts.size() << " drafts";
  // Each token that any edit touches, with its count in the output so far and whether the
  // repetition penalty reaches it: a map keyed by token, so each row comes out in token order.
  struct Seen {
    int32_t count = 0;
    bool repeated = false;  // in the prompt or the output
  };
  std::map<int32_t, Seen> seen;
  const bool counts = frequency_ != 0.0f || presence_ != 0.0f || repetition_ != 1.0f;
  if (counts) {
    for (const auto& [token, count] : output_counts_) seen[token] = {count, true};
  }
  if (repetition_ != 1.0f) {
    for (const int32_t token : prompt_tokens_) seen[token].repeated = true;
  }
  for (const auto& [token, value] : bias_) seen.try_emplace(token);
  for (size_t row = 0; row < rows; ++row) {
    if (row > 0 && counts) {
      Seen& entry = seen[drafts[row - 1]];
      entry.count += 1;
      entry.repeated = true;
    }
    if (row < first_row) continue;
    for (const auto& [token, entry] : seen) {
      const auto bias = bias_.find(token);
      const float penalty =
          -(frequency_ * static_cast<float>(entry.count)) - (entry.count > 0 ? presence_ : 0.0f);
      const float add = bias == bias_.end() ? penalty : penalty + bias->second;
      const float repetition = entry.repeated ? repetition_ : 1.0f;
      if (repetition != 1.0f || add != 0.0f) out.push_back({token, repetition, add});
    }
    row_ends.push_back(static_cast<int64_t>(out.size()));
  }
}

void LogitEditBatch::apply(kernels::Backend& backend, int64_t width, float* logits,
                           const char* what) {
  if (edits_.empty() && !masked()) return;  // penalties with nothing yet to penalise
  // One upload: the row offsets, the edits, the masks, each 8-byte aligned.
  const size_t end_bytes = row_ends_.size() * sizeof(int64_t);
  const size_t edit_bytes = (edits_.size() * sizeof(kernels::LogitEdit) + 7) / 8 * 8;
  const size_t mask_bytes = masks_.size() * sizeof(uint32_t);
  device_.reserve(backend, end_bytes + edit_bytes + mask_bytes, "logit edits");
  char* device = device_.as<char>();
  SPECRUN_CHECK_OK(backend.copy_to_device(device, row_ends_.data(), end_bytes),
                   "uploading the logit edits");
  if (!edits_.empty()) {
    SPECRUN_CHECK_OK(backend.copy_to_device(device + end_bytes, edits_.data(),
                                            edits_.size() * sizeof(kernels::LogitEdit)),
                     "uploading the logit edits");
  }
  if (masked()) {
    SPECRUN_CHECK_OK(
        backend.copy_to_device(device + end_bytes + edit_bytes, masks_.data(), mask_bytes),
        "uploading the grammar masks");
  }
  const auto rows = static_cast<int64_t>(row_ends_.size()) - 1;
  SPECRUN_CHECK_OK(
      backend.edit_logits(
          {rows, width, static_cast<int64_t>(words_)}, reinterpret_cast<const int64_t*>(device),
          reinterpret_cast<const kernels::LogitEdit*>(device + end_bytes),
          masked() ? reinterpret_cast<const uint32_t*>(device + end_bytes + edit_bytes) : nullptr,
          logits),
      what);
}

}  // namespace specrun
