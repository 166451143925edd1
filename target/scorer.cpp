#include "target/scorer.h"

#include <algorithm>

#include "runtime/base/check.h"
#include "runtime/sampling/sampling_params.h"

namespace specrun {

void committed_features(std::span<const float> fed, size_t width, int64_t accepted,
                        int64_t alternate_input, std::vector<float>& out) {
  const auto rows = static_cast<int64_t>(fed.size() / width);
  SPECRUN_CHECK(width > 0 && fed.size() % width == 0 && accepted >= 0 && accepted < rows &&
                alternate_input < rows && (alternate_input < 0 || alternate_input > accepted))
      << accepted << " accepted of " << rows << " rows fed, the alternate fed at "
      << alternate_input;
  const int64_t chain = alternate_input >= 0 ? accepted : accepted + 1;
  out.assign(fed.begin(), fed.begin() + chain * static_cast<ptrdiff_t>(width));
  if (alternate_input >= 0) {
    const auto row = fed.subspan(static_cast<size_t>(alternate_input) * width, width);
    out.insert(out.end(), row.begin(), row.end());
  }
}

Scorer::Scorer(Model& target, const SamplingParams& sampling)
    : target_(target), sampling_(sampling) {
  validate_sampling(sampling);
}

void Scorer::gather_ids(std::span<const ScoreRequest> requests, const DraftsOnDevice& drafts,
                        std::span<SequenceInput> batch) {
  kernels::Backend& backend = target_.backend();
  const auto gamma = static_cast<int64_t>(drafts.draw_index.size()) /
                     std::max<int64_t>(1, static_cast<int64_t>(requests.size()));
  SPECRUN_CHECK(drafts.draw_index.size() == requests.size() * static_cast<size_t>(gamma))
      << "drafts on the backend for " << drafts.draw_index.size() << " entries, " << requests.size()
      << " rows";
  size_t fed = 0;
  for (const ScoreRequest& request : requests) {
    SPECRUN_CHECK(request.alternates.empty() && request.processor == nullptr)
        << "drafts left on the backend with alternates or logits processors";
    SPECRUN_CHECK(static_cast<int64_t>(request.drafts.size()) <= gamma);
    fed += 1 + request.drafts.size();
  }
  // [fed] the ids as far as the host knows them (the pending tokens), then [fed] where each of
  // the others lies among the draws.
  staged_ids_.assign(2 * fed, 0);
  size_t at = 0;
  for (size_t b = 0; b < requests.size(); ++b) {
    staged_ids_[at] = requests[b].pending;
    staged_ids_[fed + at] = -1;
    for (size_t i = 0; i < requests[b].drafts.size(); ++i) {
      staged_ids_[fed + at + 1 + i] = drafts.draw_index[b * static_cast<size_t>(gamma) + i];
    }
    at += 1 + requests[b].drafts.size();
  }
  const size_t bytes = staged_ids_.size() * sizeof(int32_t);
  ids_.reserve(backend, bytes, "the target's token ids");
  int32_t* ids = ids_.as<int32_t>();
  SPECRUN_CHECK_OK(backend.copy_to_device(ids, staged_ids_.data(), bytes),
                   "uploading the target's token ids");
  if (drafts.drawn != nullptr) {
    SPECRUN_CHECK_OK(backend.wait(*drafts.drawn), "waiting for the draft's draws");
  }
  SPECRUN_CHECK_OK(
      backend.gather({static_cast<int64_t>(fed), drafts.draw_count}, drafts.draws, ids + fed, ids),
      "gathering the draft's draws");
  at = 0;
  for (SequenceInput& input : batch) {
    input.device_tokens = ids + at;
    at += input.tokens.size();
  }
}

const Scores& Scorer::score(std::span<const ScoreRequest> requests, Features* features,
                            const DraftsOnDevice* drafts_on_device) {
  inputs_.resize(requests.size());
  parents_.resize(requests.size());
  std::vector<SequenceInput> batch;
  batch.reserve(requests.size());
  Scores& scores = scores_;
  scores.alternates_width = 0;
  scores.alternate_begin.clear();
  scores.alternate_rows.clear();
  scores.alternate_inputs.clear();
  bool any_alternates = false;
  for (size_t b = 0; b < requests.size(); ++b) {
    const ScoreRequest& request = requests[b];
    std::vector<int32_t>& input = inputs_[b];
    input.assign(1, request.pending);
    input.insert(input.end(), request.drafts.begin(), request.drafts.end());
    std::vector<int32_t>& parents = parents_[b];
    parents.clear();
    if (!request.alternates.empty()) {
      SPECRUN_CHECK(request.alternates_width > 0 &&
                    request.alternates.size() ==
                        request.drafts.size() * static_cast<size_t>(request.alternates_width))
          << "alternates for " << request.drafts.size() << " drafts, " << request.alternates_width
          << " each, in " << request.alternates.size() << " entries";
      SPECRUN_CHECK(scores.alternates_width == 0 ||
                    scores.alternates_width == request.alternates_width)
          << "rows of one call bring alternates of different widths";
      scores.alternates_width = request.alternates_width;
      any_alternates = true;
      // The chain, then each alternate forking where its draft does: the alternate for draft i
      // (from 0) follows the token fed at i (the pending token or d_i).
      for (int32_t i = 0; i <= static_cast<int32_t>(request.drafts.size()); ++i) {
        parents.push_back(i - 1);
      }
      for (size_t entry = 0; entry < request.alternates.size(); ++entry) {
        if (request.alternates[entry] < 0) continue;
        input.push_back(request.alternates[entry]);
        parents.push_back(
            static_cast<int32_t>(entry / static_cast<size_t>(request.alternates_width)));
      }
    }
    batch.push_back({request.sequence, input, true, {}, parents});
  }
  // The drafts' places hold stand-ins (0) the KV cache records until the verdict names them.
  if (drafts_on_device != nullptr) {
    for (std::vector<int32_t>& input : inputs_) std::fill(input.begin() + 1, input.end(), 0);
    gather_ids(requests, *drafts_on_device, batch);
  }
  logits_.keep_on_device = true;
  target_.forward(batch, &logits_, features);
  // Each sequence's rows as the forward laid them out: p_0..p_n, then the distributions after its
  // alternates in the order they were fed.
  const int64_t rows = logits_.row_begin.back();
  scores.vocab = logits_.vocab_size;
  scores.rows = rows;
  scores.row_begin = logits_.row_begin;
  if (any_alternates) {
    scores.alternate_begin.assign(1, 0);
    for (const ScoreRequest& request : requests) {
      scores.alternate_begin.push_back(scores.alternate_begin.back() +
                                       static_cast<int64_t>(request.drafts.size()) *
                                           scores.alternates_width);
    }
    scores.alternate_rows.assign(static_cast<size_t>(scores.alternate_begin.back()), -1);
    scores.alternate_inputs.assign(static_cast<size_t>(scores.alternate_begin.back()), -1);
  }
  settings_.clear();
  for (size_t b = 0; b < requests.size(); ++b) {
    const ScoreRequest& request = requests[b];
    const kernels::LogitsSettings settings =
        logits_settings(request.sampling ? *request.sampling : sampling_);
    const int64_t first = logits_.row_begin[b];
    settings_.insert(settings_.end(), static_cast<size_t>(logits_.row_begin[b + 1] - first),
                     settings);
    int64_t fed = static_cast<int64_t>(request.drafts.size()) + 1;
    for (size_t entry = 0; entry < request.alternates.size(); ++entry) {
      if (request.alternates[entry] < 0) continue;
      const auto at = static_cast<size_t>(scores.alternate_begin[b]) + entry;
      scores.alternate_rows[at] = first + fed;
      scores.alternate_inputs[at] = fed;
      ++fed;
    }
  }
  kernels::Backend& backend = target_.backend();
  apply_processors(requests);
  device_settings_.reserve(backend, settings_.size() * sizeof(kernels::LogitsSettings),
                           "sampling settings");
  probs_.reserve(backend, static_cast<size_t>(rows * scores.vocab) * sizeof(float),
                 "target distributions");
  status_.reserve(backend, static_cast<size_t>(rows) * sizeof(int32_t), "row statuses");
  SPECRUN_CHECK_OK(backend.copy_to_device(device_settings_.data(), settings_.data(),
                                          settings_.size() * sizeof(kernels::LogitsSettings)),
                   "uploading sampling settings");
  SPECRUN_CHECK_OK(backend.process_logits({rows, scores.vocab}, logits_.device,
                                          device_settings_.as<kernels::LogitsSettings>(),
                                          probs_.as<float>(), status_.as<int32_t>()),
                   "processing the target's logits");
  scores.probs = probs_.as<float>();
  scores.status = status_.as<int32_t>();
  scores.logits = logits_.device;
  return scores;
}

void Scorer::apply_processors(std::span<const ScoreRequest> requests) {
  const bool any = std::any_of(requests.begin(), requests.end(),
                               [](const ScoreRequest& request) { return request.processor; });
  if (!any) return;
  const bool any_masks = std::any_of(requests.begin(), requests.end(), [](const auto& request) {
    return request.processor && request.processor->masks();
  });
  const auto words = static_cast<size_t>((logits_.vocab_size + 31) / 32);
  edits_.clear(any_masks ? words : 0);
  for (size_t b = 0; b < requests.size(); ++b) {
    const ScoreRequest& request = requests[b];
    const auto rows = static_cast<size_t>(logits_.row_begin[b + 1] - logits_.row_begin[b]);
    if (request.processor == nullptr) {
      edits_.add_untouched(rows);
      continue;
    }
    SPECRUN_CHECK(rows == request.drafts.size() + 1)
        << "a row with logits processors brings alternates (" << rows << " rows for "
        << request.drafts.size() << " drafts)";
    request.processor->edits(request.drafts, rows, edits_.edits(), edits_.row_ends());
    if (request.processor->masks()) {
      request.processor->masks(request.drafts, rows, words, edits_.masks());
    } else if (any_masks) {
      edits_.masks().resize(edits_.masks().size() + rows * words, ~0u);
    }
  }
  // The rows are the scorer's until the target's next forward: edited where they lie.
  edits_.apply(target_.backend(), logits_.vocab_size, const_cast<float*>(logits_.device),
               "applying the requests' penalties, logit bias and grammars");
}

}  // namespace specrun
