// The scorer: one target forward over [pending, d_1..d_n] per sequence gives the processed
// distributions p_0..p_n that verification compares against the drafts, and with alternates the
// distribution after each of them (a token tree: [pending, d_1..d_n, alternates] in the cache).
// The logits stay on the target's backend and are processed there (Backend::process_logits):
// nothing of them is copied to the host or waited for.
#pragma once

#include <span>

#include "runtime/base/device_buffer.h"
#include "runtime/model/model.h"
#include "runtime/sampling/logit_processor.h"
#include "runtime/sampling/sampling_params.h"
#include "runtime/sampling/speculative_step.h"

namespace specrun {

struct ScoreRequest {
  SequenceId sequence;  // the target's KV sequence; holds every committed token but the last
  int32_t pending;      // the last committed token, not yet fed
  std::span<const int32_t> drafts;  // d_1..d_n
  // The sequence's own sampling settings; null: the scorer's. Lets one batch mix requests.
  const SamplingParams* sampling = nullptr;
  // Other guesses for each draft's position (Proposals::alternates): [n, alternates_width], -1
  // where none. Each is fed as a branch of a token tree forking where its draft does, after the
  // drafts, and scored (Scores::alternate_rows). Empty: none.
  std::span<const int32_t> alternates{};
  int64_t alternates_width = 0;
  // The request's penalties and bias (runtime/sampling/logit_processor.h), applied to each row's
  // logits as the text before its position (the drafts before it counted) makes them; null:
  // none. A row with a processor brings no alternates.
  const LogitProcessor* processor = nullptr;
};

// The target's features at the positions a row's verification committed, from those of its fed
// tokens (`fed`: [pending, drafts, alternates], `width` each): the pending token's and those of
// the `accepted` tokens after it, the last of which is the alternate fed at `alternate_input`
// where the row took one (-1: none). [accepted + 1, width] in `out`.
void committed_features(std::span<const float> fed, size_t width, int64_t accepted,
                        int64_t alternate_input, std::vector<float>& out);

class Scorer {
 public:
  Scorer(Model& target, const SamplingParams& sampling);
  // Feeds every row in one batched forward (the target cache grows by n + 1 per row) and
  // returns p_0..p_n per row, processed with the sampling settings on the target's backend; with
  // `features`, the target's features at every token fed too (each row's [pending, drafts,
  // alternates]). Rows of requests with a processor have their logits edited first (Scores::logits
  // keeps them so). The scores are the scorer's own, valid until its next call: their rows of
  // vocabulary-wide distributions (megabytes a step) are written over in place, in the backend's
  // memory. A row that could not be processed (corrupt logits) is marked in Scores::status, for
  // the verification to refuse. With `drafts_on_device` ([batch, gamma] of the requests' rows),
  // the requests' drafts give only their counts: the ids are gathered on the target's stream from
  // where the draft drew them, once it has waited for the draft's event, and the target's KV cache
  // records stand-ins for them until the verdict names them (KvCache::rewrite_tokens).
  const Scores& score(std::span<const ScoreRequest> requests, Features* features = nullptr,
                      const DraftsOnDevice* drafts_on_device = nullptr);

 private:
  // Edits the rows of requests with a processor in place (Backend::edit_logits).
  void apply_processors(std::span<const ScoreRequest> requests);
  // The forward's ids where the drafts are on the backend: [pending, d_1..d_n] per row, back to
  // back in one buffer of the target's memory, each row's inputs pointed at its part.
  void gather_ids(std::span<const ScoreRequest> requests, const DraftsOnDevice& drafts,
                  std::span<SequenceInput> batch);

  Model& target_;
  SamplingParams sampling_;
  std::vector<std::vector<int32_t>> inputs_;   // reused per call
  std::vector<std::vector<int32_t>> parents_;  // a token tree's, per row with alternates
  Logits logits_;
  Scores scores_;                                  // what score returns
  std::vector<kernels::LogitsSettings> settings_;  // [rows] host, reused per call
  LogitEditBatch edits_;             // the rows' penalties, bias and masks, reused per call
  DeviceBuffer device_settings_;     // [rows] LogitsSettings
  DeviceBuffer probs_;               // [rows, vocab] f32
  DeviceBuffer status_;              // [rows] RowStatus
  std::vector<int32_t> staged_ids_;  // [fed tokens] the pending ids, then [fed tokens] gather
                                     // indices (-1 at each pending id), reused per call
  DeviceBuffer ids_;                 // staged_ids_ on the backend, the drafts gathered in
};

}  // namespace specrun
