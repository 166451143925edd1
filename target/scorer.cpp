#include "target/scorer.h"

namespace specrun {

Scorer::Scorer(Model& target, const SamplingParams& sampling)
    : target_(target), sampling_(sampling) {
  validate_sampling(sampling);
}

Scores Scorer::score(std::span<const ScoreRequest> requests, Features* features) {
  inputs_.resize(requests.size());
  std::vector<SequenceInput> batch;
  batch.reserve(requests.size());
  for (size_t b = 0; b < requests.size(); ++b) {
    std::vector<int32_t>& input = inputs_[b];
    input.assign(1, requests[b].pending);
    input.insert(input.end(), requests[b].drafts.begin(), requests[b].drafts.end());
    batch.push_back({requests[b].sequence, input, true});
  }
  target_.forward(batch, &logits_, features);
  Scores scores;
  scores.vocab = logits_.vocab_size;
  scores.row_begin = logits_.row_begin;
  scores.probs.resize(logits_.values.size());
  for (size_t b = 0; b < requests.size(); ++b) {
    const SamplingParams& sampling = requests[b].sampling ? *requests[b].sampling : sampling_;
    for (int64_t r = logits_.row_begin[b]; r < logits_.row_begin[b + 1]; ++r) {
      process_logits(sampling, logits_.row(r),
                     std::span<float>(scores.probs.data() + r * scores.vocab,
                                      static_cast<size_t>(scores.vocab)));
    }
  }
  return scores;
}

}  // namespace specrun
