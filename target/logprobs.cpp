#include "target/logprobs.h"

#include <algorithm>
#include <cstring>

#include "runtime/base/check.h"

namespace specrun {

void LogprobReader::enqueue(const Scores& scores, std::span<const int64_t> tops,
                            const int32_t* tokens, int64_t width) {
  pending_ = false;
  tops_.assign(tops.begin(), tops.end());
  first_.assign(tops.size(), -1);
  slots_.clear();
  top_ = 0;
  for (size_t b = 0; b < tops.size(); ++b) {
    if (tops[b] < 0) continue;
    top_ = std::max(top_, tops[b]);
    first_[b] = static_cast<int64_t>(slots_.size());
    const int64_t rows = scores.row_begin[b + 1] - scores.row_begin[b];
    SPECRUN_CHECK(rows <= width) << "row " << b << " scored " << rows << " rows for " << width
                                 << " token slots: a row asking for logprobs brings alternates";
    for (int64_t i = 0; i < rows; ++i) {
      slots_.push_back(static_cast<int32_t>(static_cast<int64_t>(b) * width + i));
    }
  }
  if (slots_.empty()) return;
  SPECRUN_CHECK(scores.logits != nullptr) << "reading log-probabilities of scores without logits";
  const auto entries = static_cast<int64_t>(slots_.size());
  results_.assign(static_cast<size_t>(entries * (1 + 2 * top_)), 0);
  const size_t slot_bytes = slots_.size() * sizeof(int32_t);
  device_.reserve(backend_, slot_bytes + results_.size() * sizeof(uint32_t), "log-probabilities");
  SPECRUN_CHECK_OK(backend_.copy_to_device(device_.data(), slots_.data(), slot_bytes),
                   "uploading the log-probabilities' token slots");
  auto* slots = device_.as<int32_t>();
  auto* chosen = reinterpret_cast<float*>(slots + entries);
  auto* top_tokens = reinterpret_cast<int32_t*>(chosen + entries);
  auto* top_logprobs = reinterpret_cast<float*>(top_tokens + entries * top_);
  // One launch per asking row over its own rows of logits, which lie together.
  for (size_t b = 0; b < tops.size(); ++b) {
    if (first_[b] < 0) continue;
    const int64_t first = first_[b];
    const int64_t rows = scores.row_begin[b + 1] - scores.row_begin[b];
    SPECRUN_CHECK_OK(backend_.token_logprobs(
                         {rows, scores.vocab, top_},
                         scores.logits + scores.row_begin[b] * scores.vocab, slots + first, tokens,
                         chosen + first, top_tokens + first * top_, top_logprobs + first * top_),
                     "reading the target's log-probabilities");
  }
  pending_ = true;
}

void LogprobReader::collect() {
  if (!pending_) return;
  const size_t slot_bytes = slots_.size() * sizeof(int32_t);
  SPECRUN_CHECK_OK(backend_.copy_to_host(results_.data(), device_.as<char>() + slot_bytes,
                                         results_.size() * sizeof(uint32_t)),
                   "reading the log-probabilities");
}

std::vector<TokenLogprob> LogprobReader::read_prompt(const float* logits, int64_t vocab,
                                                     std::span<const int32_t> next, int64_t top) {
  const auto rows = static_cast<int64_t>(next.size());
  std::vector<TokenLogprob> logprobs;
  if (rows == 0) return logprobs;
  // Slots, then the tokens they index, in; the chosen log-probabilities and top tokens out.
  std::vector<int32_t> inputs(static_cast<size_t>(2 * rows));
  for (int64_t j = 0; j < rows; ++j) {
    inputs[static_cast<size_t>(j)] = static_cast<int32_t>(j);
    inputs[static_cast<size_t>(rows + j)] = next[static_cast<size_t>(j)];
  }
  std::vector<uint32_t> outputs(static_cast<size_t>(rows * (1 + 2 * top)));
  DeviceBuffer buffer(backend_, (inputs.size() + outputs.size()) * sizeof(uint32_t),
                      "the prompt's log-probabilities");
  auto* slots = buffer.as<int32_t>();
  SPECRUN_CHECK_OK(backend_.copy_to_device(slots, inputs.data(), inputs.size() * sizeof(int32_t)),
                   "uploading the prompt's tokens");
  auto* chosen = reinterpret_cast<float*>(slots + 2 * rows);
  auto* top_tokens = reinterpret_cast<int32_t*>(chosen + rows);
  auto* top_logprobs = reinterpret_cast<float*>(top_tokens + rows * top);
  SPECRUN_CHECK_OK(backend_.token_logprobs({rows, vocab, top}, logits, slots, slots + rows, chosen,
                                           top_tokens, top_logprobs),
                   "reading the prompt's log-probabilities");
  SPECRUN_CHECK_OK(backend_.copy_to_host(outputs.data(), chosen, outputs.size() * sizeof(uint32_t)),
                   "reading the prompt's log-probabilities");
  const auto as_float = [](uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  };
  for (int64_t j = 0; j < rows; ++j) {
    TokenLogprob& logprob = logprobs.emplace_back();
    logprob.token = next[static_cast<size_t>(j)];
    logprob.logprob = as_float(outputs[static_cast<size_t>(j)]);
    for (int64_t k = 0; k < top; ++k) {
      const auto token = static_cast<int32_t>(outputs[static_cast<size_t>(rows + j * top + k)]);
      if (token < 0) break;
      logprob.top.push_back(
          {token, as_float(outputs[static_cast<size_t>(rows + rows * top + j * top + k)])});
    }
  }
  return logprobs;
}

TokenLogprob LogprobReader::at(int64_t b, int64_t i) const {
  const int64_t first = first_[static_cast<size_t>(b)];
  SPECRUN_CHECK(first >= 0 && pending_) << "row " << b << " asked for no log-probabilities";
  const auto entries = static_cast<int64_t>(slots_.size());
  const int64_t entry = first + i;
  const auto word = [&](int64_t index) { return results_[static_cast<size_t>(index)]; };
  const auto as_float = [](uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  };
  TokenLogprob logprob;
  logprob.logprob = as_float(word(entry));
  const int64_t asked = tops_[static_cast<size_t>(b)];
  for (int64_t k = 0; k < asked; ++k) {
    const auto token = static_cast<int32_t>(word(entries + entry * top_ + k));
    if (token < 0) break;
    logprob.top.push_back({token, as_float(word(entries + entries * top_ + entry * top_ + k))});
  }
  return logprob;
}

}  // namespace specrun
