#include "verify/commit.h"

#include <algorithm>

namespace specrun {

RowCommit decide_commit(std::span<const int32_t> decided, int64_t length, int64_t accepted,
                        int64_t alternate_input, const CommitRule& rule) {
  RowCommit commit;
  for (const int32_t token : decided) {
    if (rule.stop_at_eos && std::find(rule.eos.begin(), rule.eos.end(), token) != rule.eos.end()) {
      commit.stop = FinishReason::kEndOfSequence;
      break;
    }
    commit.tokens += 1;
    if (commit.tokens >= rule.tokens_left) {
      commit.stop = FinishReason::kMaxTokens;
      break;
    }
  }
  commit.keep = length + commit.tokens - 1;
  commit.draft_keep = commit.keep;
  if (alternate_input >= 0) {
    const int64_t pending = length - 1;  // where the forward fed the row's first token
    const int64_t position = pending + accepted;
    if (position < commit.keep) {
      commit.alternate_from = pending + alternate_input;
      commit.alternate_to = position;
    }
    commit.draft_keep = std::min(commit.keep, position);
  }
  return commit;
}

}  // namespace specrun
