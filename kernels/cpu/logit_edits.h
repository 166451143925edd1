// A request's logits processors on one row: the reference for every backend's edit_logits
// (kernels/backend.h). Penalties and logit bias arrive as edits of single logits, a grammar's
// constraint as a bitmask of the tokens it allows.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/backend.h"

namespace specrun::kernels::cpu {

// logits[e.token] = (x > 0 ? x / e.repetition : x * e.repetition) + e.add for each edit whose token
// lies in the row (each token at most once), in one rounding each: the division or product, then
// the sum. Then, where `mask` is not empty ((size + 31) / 32 words), every token whose bit is clear
// becomes -infinity.
void edit_logits(std::span<const LogitEdit> edits, std::span<const uint32_t> mask,
                 std::span<float> logits);

}  // namespace specrun::kernels::cpu
