#include "verify/verifier.h"

#include <algorithm>
#include <vector>

#include "runtime/base/check.h"

namespace specrun {

int64_t alternate_index(const Proposals& proposals, int64_t b, int64_t i, int32_t token) {
  if (!proposals.has_alternates()) return -1;
  const std::span<const int32_t> alternates = proposals.alternates_of(b, i);
  const auto found = std::find(alternates.begin(), alternates.end(), token);
  if (token < 0 || found == alternates.end()) return -1;
  return found - alternates.begin();
}

int64_t accepted_alternate(const Proposals& proposals, const Verdict& verdict, int64_t b) {
  const int64_t accepted = verdict.accepted[static_cast<size_t>(b)];
  if (accepted == 0 || !proposals.has_alternates()) return -1;
  const int32_t token = verdict.row(b)[static_cast<size_t>(accepted - 1)];
  if (token == proposals.tokens[static_cast<size_t>(b * proposals.gamma + accepted - 1)]) return -1;
  return alternate_index(proposals, b, accepted - 1, token);
}

Verdict empty_verdict(const Proposals& proposals, const Scores& scores) {
  SPECRUN_CHECK(static_cast<int64_t>(scores.row_begin.size()) == proposals.batch + 1)
      << "scores for " << scores.row_begin.size() - 1 << " rows, proposals for " << proposals.batch;
  for (int64_t b = 0; b < proposals.batch; ++b) {
    SPECRUN_CHECK(scores.row_begin[static_cast<size_t>(b) + 1] -
                      scores.row_begin[static_cast<size_t>(b)] >=
                  proposals.counts[static_cast<size_t>(b)] + 1)
        << "row " << b << " needs one distribution more than its drafts";
  }
  Verdict verdict;
  verdict.batch = proposals.batch;
  verdict.width = proposals.gamma + 1;
  verdict.tokens.assign(static_cast<size_t>(verdict.batch * verdict.width), -1);
  verdict.accepted.assign(static_cast<size_t>(verdict.batch), 0);
  return verdict;
}

kernels::VerifyRule verify_rule(const SamplingParams& sampling) {
  if (sampling.temperature == 0.0f) return kernels::VerifyRule::kGreedy;
  return sampling.shared_noise ? kernels::VerifyRule::kSharedNoise
                               : kernels::VerifyRule::kRejection;
}

bool takes_alternates(kernels::VerifyRule rule) {
  return rule != kernels::VerifyRule::kRejection;
}

bool reads_draft_distributions(kernels::VerifyRule rule) {
  return rule == kernels::VerifyRule::kRejection;
}

kernels::VerifyParams verify_params(const Proposals& proposals, const Scores& scores,
                                    int64_t batch) {
  return {batch,
          proposals.gamma,
          scores.rows,
          scores.vocab,
          proposals.point_masses() ? 0 : proposals.vocab,
          proposals.has_alternates() ? proposals.alternates_width : 0};
}

void alternate_rows_of(const Proposals& proposals, const Scores& scores, int64_t b, int64_t* out) {
  const int64_t width = proposals.alternates_width;
  std::fill(out, out + proposals.gamma * width, -1);
  if (scores.alternate_rows.empty()) return;
  SPECRUN_CHECK(scores.alternates_width == width)
      << "alternates " << width << " wide scored " << scores.alternates_width << " wide";
  const int64_t count = proposals.counts[static_cast<size_t>(b)];
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t k = 0; k < width; ++k) {
      out[i * width + k] = scores.alternate_rows[scores.alternate_entry(b, i, k)];
    }
  }
}

Verdict Verifier::verify(const Proposals& proposals, const Scores& scores,
                         std::span<const RowDraws> draws) const {
  Verdict verdict = empty_verdict(proposals, scores);
  SPECRUN_CHECK(static_cast<int64_t>(draws.size()) >= proposals.batch)
      << draws.size() << " rows of random numbers for " << proposals.batch << " rows";
  for (int64_t b = 0; b < proposals.batch; ++b) {
    verdict.accepted[static_cast<size_t>(b)] =
        verify_row(proposals, scores, b, draws[static_cast<size_t>(b)], verdict.slots(b));
  }
  return verdict;
}

Verdict BackendVerification::verify(const Proposals& proposals, const Scores& scores,
                                    std::span<const kernels::VerifyRule> rules,
                                    std::span<const RowDraws> draws,
                                    std::vector<int64_t>* alternate_input) {
  enqueue(proposals, scores, rules, draws);
  return collect(proposals, scores, alternate_input);
}

void BackendVerification::enqueue(const Proposals& proposals, const Scores& scores,
                                  std::span<const kernels::VerifyRule> rules,
                                  std::span<const RowDraws> draws) {
  const int64_t batch = proposals.batch;
  SPECRUN_CHECK(static_cast<int64_t>(rules.size()) == batch &&
                static_cast<int64_t>(draws.size()) == batch)
      << rules.size() << " rules and " << draws.size() << " draws for " << batch << " rows";
  const kernels::VerifyParams params = verify_params(proposals, scores, batch);
  const int64_t gamma = params.gamma;
  const int64_t width = params.alternates_width;
  // A row whose rule takes no alternates decides as if it had none.
  rows_.clear();
  for (int64_t b = 0; b < batch; ++b) {
    const auto row = static_cast<size_t>(b);
    rows_.push_back({draws[row].stream.seed(), draws[row].position, scores.row_begin[row],
                     proposals.counts[row], rules[row]});
  }
  alternate_rows_.assign(static_cast<size_t>(batch * gamma * width), -1);
  for (int64_t b = 0; width > 0 && b < batch; ++b) {
    if (!takes_alternates(rules[static_cast<size_t>(b)])) continue;
    alternate_rows_of(proposals, scores, b, alternate_rows_.data() + b * gamma * width);
  }

  // q where the host holds it (drafts read back); drafts left on the backend keep theirs there.
  const bool q_on_host = params.vocab_q > 0 && !proposals.drafts_on_device();
  // The inputs where the backend reads them: in place where its memory is the host's, else
  // uploaded into one buffer, each part 64-byte aligned.
  struct Part {
    const void* host;
    size_t bytes;
    const void* device = nullptr;
  };
  Part parts[] = {
      {rows_.data(), rows_.size() * sizeof(kernels::VerifyRow), nullptr},
      {proposals.tokens.data(), proposals.tokens.size() * sizeof(int32_t), nullptr},
      {q_on_host ? proposals.probs.data() : nullptr,
       q_on_host ? proposals.probs.size() * sizeof(float) : 0, nullptr},
      {width > 0 ? proposals.alternates.data() : nullptr,
       width > 0 ? proposals.alternates.size() * sizeof(int32_t) : 0, nullptr},
      {width > 0 ? alternate_rows_.data() : nullptr,
       width > 0 ? alternate_rows_.size() * sizeof(int64_t) : 0, nullptr},
  };
  const auto aligned = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  if (backend_.uses_host_memory()) {
    for (Part& part : parts) part.device = part.host;
  } else {
    size_t total = 0;
    for (const Part& part : parts) total += aligned(part.bytes);
    inputs_.reserve(backend_, total, "verification inputs");
    size_t offset = 0;
    for (Part& part : parts) {
      if (part.host == nullptr || part.bytes == 0) continue;
      part.device = inputs_.as<char>() + offset;
      SPECRUN_CHECK_OK(
          backend_.copy_to_device(const_cast<void*>(part.device), part.host, part.bytes),
          "uploading the verification's inputs");
      offset += aligned(part.bytes);
    }
  }
  const size_t token_slots = static_cast<size_t>(batch * (gamma + 1));
  const bool on_device = proposals.drafts_on_device();
  const size_t draft_slots = on_device ? static_cast<size_t>(batch * gamma) : 0;
  const size_t verdict_words = token_slots + 2 * static_cast<size_t>(batch);
  results_.assign(verdict_words + draft_slots, -1);
  draft_gamma_ = on_device ? gamma : 0;
  draft_statuses_at_ = verdict_words;
  const size_t result_bytes = results_.size() * sizeof(int32_t);
  outputs_.reserve(backend_, result_bytes, "verification results");
  int32_t* tokens = outputs_.as<int32_t>();
  const int32_t* drafts = static_cast<const int32_t*>(parts[1].device);
  const float* q = static_cast<const float*>(parts[2].device);
  if (on_device) {
    // The drafts gathered from where the draft drew them ([batch, gamma], -1 past each row's
    // count), and each one's row status beside the verdict, read back with it.
    const DraftsOnDevice& from = proposals.on_device;
    SPECRUN_CHECK(from.draw_index.size() == draft_slots && from.status_index.size() == draft_slots)
        << "drafts on the backend for " << from.draw_index.size() << " entries, " << draft_slots
        << " wanted";
    staged_.assign(draft_slots, -1);
    staged_.insert(staged_.end(), from.draw_index.begin(), from.draw_index.end());
    staged_.insert(staged_.end(), from.status_index.begin(), from.status_index.end());
    gathered_.reserve(backend_, staged_.size() * sizeof(int32_t), "the drafts gathered");
    int32_t* gathered = gathered_.as<int32_t>();
    const int32_t* draw_index = gathered + draft_slots;
    const int32_t* status_index = draw_index + draft_slots;
    std::fill(results_.begin() + static_cast<ptrdiff_t>(verdict_words), results_.end(), 0);
    SPECRUN_CHECK_OK(
        backend_.copy_to_device(gathered, staged_.data(), staged_.size() * sizeof(int32_t)),
        "uploading where the drafts lie");
    SPECRUN_CHECK_OK(
        backend_.copy_to_device(tokens + verdict_words, results_.data() + verdict_words,
                                draft_slots * sizeof(int32_t)),
        "clearing the drafts' statuses");
    if (from.drawn != nullptr) {
      SPECRUN_CHECK_OK(backend_.wait(*from.drawn), "waiting for the draft's draws");
    }
    const auto count = static_cast<int64_t>(draft_slots);
    SPECRUN_CHECK_OK(backend_.gather({count, from.draw_count}, from.draws, draw_index, gathered),
                     "gathering the drafts");
    SPECRUN_CHECK_OK(backend_.gather({count, from.status_words}, from.statuses, status_index,
                                     tokens + verdict_words),
                     "gathering the drafts' statuses");
    drafts = gathered;
    if (from.q != nullptr) {
      // [batch, gamma, vocab_q]: each draft's q as verify reads it, zero past a reduced head's
      // tokens and past a row's count.
      q_.reserve(backend_, draft_slots * static_cast<size_t>(params.vocab_q) * sizeof(float),
                 "the drafts' distributions");
      SPECRUN_CHECK_OK(backend_.gather_rows({count, from.q_width, from.draw_count, params.vocab_q},
                                            from.q, draw_index, from.q_columns, q_.as<float>()),
                       "gathering the drafts' distributions");
      q = q_.as<float>();
    }
  }
  SPECRUN_CHECK_OK(
      backend_.verify(params, static_cast<const kernels::VerifyRow*>(parts[0].device), scores.probs,
                      scores.status, q, drafts, static_cast<const int32_t*>(parts[3].device),
                      static_cast<const int64_t*>(parts[4].device), tokens, tokens + token_slots,
                      tokens + token_slots + batch),
      "verifying the drafts");
}

kernels::RowStatus BackendVerification::draft_status(int64_t b) const {
  const size_t first = draft_statuses_at_ + static_cast<size_t>(draft_gamma_ * b);
  for (int64_t i = 0; i < draft_gamma_; ++i) {
    const int32_t status = results_[first + static_cast<size_t>(i)];
    if (status != 0) return static_cast<kernels::RowStatus>(status);
  }
  return kernels::RowStatus::kOk;
}

Verdict BackendVerification::collect(const Proposals& proposals, const Scores& scores,
                                     std::vector<int64_t>* alternate_input) {
  Verdict verdict = empty_verdict(proposals, scores);
  const int64_t batch = proposals.batch;
  const int64_t gamma = proposals.gamma;
  const int64_t width = proposals.alternates_width;
  const size_t token_slots = static_cast<size_t>(batch * (gamma + 1));
  SPECRUN_CHECK(results_.size() == token_slots + 2 * static_cast<size_t>(batch) +
                                       static_cast<size_t>(batch * draft_gamma_))
      << "collecting a verdict of " << batch << " rows of " << gamma
      << " drafts that was not enqueued";
  // The step's one wait: the verdict comes back.
  SPECRUN_CHECK_OK(
      backend_.copy_to_host(results_.data(), outputs_.data(), results_.size() * sizeof(int32_t)),
      "reading the verdict");

  std::copy(results_.begin(), results_.begin() + static_cast<ptrdiff_t>(token_slots),
            verdict.tokens.begin());
  alternate_input->assign(static_cast<size_t>(batch), -1);
  for (int64_t b = 0; b < batch; ++b) {
    const auto row = static_cast<size_t>(b);
    const int32_t accepted = results_[token_slots + row];
    if (accepted < 0) {
      // Which distribution failed, and why: read back only now that one did.
      std::vector<int32_t> status(static_cast<size_t>(scores.rows),
                                  static_cast<int32_t>(kernels::RowStatus::kOk));
      if (scores.status != nullptr) {
        SPECRUN_CHECK_OK(
            backend_.copy_to_host(status.data(), scores.status, status.size() * sizeof(int32_t)),
            "reading the rows' statuses");
      }
      for (int64_t r = scores.row_begin[row]; r < scores.row_begin[row + 1]; ++r) {
        const auto code = static_cast<kernels::RowStatus>(status[static_cast<size_t>(r)]);
        if (code != kernels::RowStatus::kOk) {
          throw_row_status(code, "row " + std::to_string(b) + "'s target logits");
        }
      }
      throw Error("row " + std::to_string(b) +
                  " could not be verified: a distribution it reads has no mass");
    }
    verdict.accepted[row] = accepted;
    const int32_t taken = results_[token_slots + static_cast<size_t>(batch) + row];
    if (taken >= 0) {
      const int64_t i = taken / width, k = taken % width;
      (*alternate_input)[row] = scores.alternate_inputs[scores.alternate_entry(b, i, k)];
    }
  }
  return verdict;
}

}  // namespace specrun
