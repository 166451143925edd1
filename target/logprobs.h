// The target's log-probabilities of the tokens a step commits, for the requests that ask
// (Request::logprobs): read on the target's backend from the rows it scored (Scores::logits, after
// penalties and bias), at the tokens the verification chose, which stay where the verification
// wrote them. The numbers come back after the verdict, in one copy, a few per token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "runtime/base/device_buffer.h"
#include "runtime/sampling/speculative_step.h"
#include "specrun/logprobs.hpp"

namespace specrun {

class LogprobReader {
 public:
  explicit LogprobReader(kernels::Backend& backend) : backend_(backend) {}

  // Enqueues the log-probabilities of every scored row p_0..p_n of each row b whose tops[b] >= 0
  // (that many top tokens; -1: the row asks for none): row i's chosen token is tokens[b * width +
  // i], in the backend's memory (a verdict's [batch, width] tokens). Nothing is waited for. A row
  // that asks brings no alternates: its scored rows are p_0..p_n alone.
  void enqueue(const Scores& scores, std::span<const int64_t> tops, const int32_t* tokens,
               int64_t width);
  // Whether the last enqueue() asked anything (then collect() reads it).
  bool pending() const { return pending_; }
  // Reads what enqueue() asked, once the tokens it reads were written: one copy.
  void collect();
  // Row b's log-probabilities at its position i (0: the token p_0 decided), as collected.
  TokenLogprob at(int64_t b, int64_t i) const;

  // A prompt's log-probabilities (a client's echo): row j of `logits` ([next.size(), vocab], on the
  // backend, as a prefill left them) at next[j], the prompt's token after the one it followed,
  // with `top` top tokens; read back at once (a prefill is not a step: this wait is its own).
  std::vector<TokenLogprob> read_prompt(const float* logits, int64_t vocab,
                                        std::span<const int32_t> next, int64_t top);

 private:
  kernels::Backend& backend_;
  bool pending_ = false;
  int64_t top_ = 0;                // top tokens read per row: the most any row asks
  std::vector<int64_t> tops_;      // [batch] as asked
  std::vector<int64_t> first_;     // [batch] each asking row's first entry, -1 elsewhere
  std::vector<int32_t> slots_;     // [entries] the chosen token's slot in `tokens`
  std::vector<uint32_t> results_;  // chosen [entries] f32, then top tokens, then top logprobs
  DeviceBuffer device_;            // slots_, then results_
};

}  // namespace specrun
