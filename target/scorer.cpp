#include "target/scorer.h"

#include <algorithm>

#include "runtime/base/check.h"
#include "runtime/sampling/sampler.h"

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

const Scores& Scorer::score(std::span<const ScoreRequest> requests, Features* features) {
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
  edit_begin_.assign(1, 0);
  edits_.clear();
  masks_.clear();
  for (size_t b = 0; b < requests.size(); ++b) {
    const ScoreRequest& request = requests[b];
    const auto rows = static_cast<size_t>(logits_.row_begin[b + 1] - logits_.row_begin[b]);
    if (request.processor == nullptr) {
      edit_begin_.insert(edit_begin_.end(), rows, static_cast<int64_t>(edits_.size()));
      if (any_masks) masks_.resize(masks_.size() + rows * words, ~0u);
      continue;
    }
    SPECRUN_CHECK(rows == request.drafts.size() + 1)
        << "a row with logits processors brings alternates (" << rows << " rows for "
        << request.drafts.size() << " drafts)";
    request.processor->edits(request.drafts, rows, edits_, edit_begin_);
    if (request.processor->masks()) {
      request.processor->masks(request.drafts, rows, words, masks_);
    } else if (any_masks) {
      masks_.resize(masks_.size() + rows * words, ~0u);
    }
  }
  if (edits_.empty() && !any_masks) return;  // penalties with nothing yet to penalise
  kernels::Backend& backend = target_.backend();
  // One upload: the row offsets, the edits, the masks, each 8-byte aligned.
  const size_t begin_bytes = edit_begin_.size() * sizeof(int64_t);
  const size_t edit_bytes = (edits_.size() * sizeof(kernels::LogitEdit) + 7) / 8 * 8;
  const size_t mask_bytes = masks_.size() * sizeof(uint32_t);
  device_edits_.reserve(backend, begin_bytes + edit_bytes + mask_bytes, "logit edits");
  char* device = device_edits_.as<char>();
  SPECRUN_CHECK_OK(backend.copy_to_device(device, edit_begin_.data(), begin_bytes),
                   "uploading the logit edits");
  if (!edits_.empty()) {
    SPECRUN_CHECK_OK(backend.copy_to_device(device + begin_bytes, edits_.data(),
                                            edits_.size() * sizeof(kernels::LogitEdit)),
                     "uploading the logit edits");
  }
  if (any_masks) {
    SPECRUN_CHECK_OK(
        backend.copy_to_device(device + begin_bytes + edit_bytes, masks_.data(), mask_bytes),
        "uploading the grammar masks");
  }
  const int64_t rows = logits_.row_begin.back();
  // The rows are the scorer's until the target's next forward: edited where they lie.
  SPECRUN_CHECK_OK(
      backend.edit_logits({rows, logits_.vocab_size, any_masks ? static_cast<int64_t>(words) : 0},
                          reinterpret_cast<const int64_t*>(device),
                          reinterpret_cast<const kernels::LogitEdit*>(device + begin_bytes),
                          any_masks
                              ? reinterpret_cast<const uint32_t*>(device + begin_bytes + edit_bytes)
                              : nullptr,
                          const_cast<float*>(logits_.device)),
      "applying the requests' penalties, logit bias and grammars");
}

}  // namespace specrun
