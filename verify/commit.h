// What a row commits of its verdict, and what each model's KV cache keeps: the one place the
// step's acceptance turns into committed text and rollback positions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "specrun/settings.hpp"

namespace specrun {

struct RowCommit {
  int64_t tokens = 0;                // of the verdict's row, how many are committed
  std::optional<FinishReason> stop;  // why the sequence ends with this step, if it does
  // Positions both caches keep: the committed text but its last token, the next step's pending
  // one (sealed for reuse, a finishing sequence's too, so that a request continuing its text
  // finds it cached).
  int64_t keep = 0;
  // Of those, what the draft's cache keeps: fewer where an alternate was accepted, since the
  // draft's cache holds the draft it replaced there (the draft reads the alternate again).
  int64_t draft_keep = 0;
  // An accepted alternate was scored past the drafts: the target's keys and values at
  // alternate_from move to alternate_to, its position in the text (both -1: nothing moves).
  int64_t alternate_from = -1;
  int64_t alternate_to = -1;
};

struct CommitRule {
  std::span<const int32_t> eos;  // the target's end-of-sequence ids
  bool stop_at_eos = true;       // an end-of-sequence token ends the sequence, uncommitted
  int64_t tokens_left = 0;       // tokens the request may still generate (max_tokens - generated)
};

// Row `decided` of a verdict (its accepted drafts, then the new token) for a sequence of `length`
// committed tokens before the step (the last, the pending token, fed first), of which `accepted`
// were accepted; `alternate_input` is where the target's forward fed the alternate the row
// accepted among the row's tokens (0 the pending token), -1 where it accepted none. Tokens are
// committed in order until an end-of-sequence token (not committed) or the token limit.
RowCommit decide_commit(std::span<const int32_t> decided, int64_t length, int64_t accepted,
                        int64_t alternate_input, const CommitRule& rule);

}  // namespace specrun
