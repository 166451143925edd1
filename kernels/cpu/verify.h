// Speculative verification on the host, one row at a time: the reference for every backend's
// verify op (kernels/backend.h), and what the CPU backend runs. The rules and why they keep the
// output exactly the target's are in verify/verifier.h.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace specrun::kernels::cpu {

// Decides row `row` of a verification as Backend::verify does: p holds every row of the call
// ([params.p_rows, params.vocab]) and p_status its rows' RowStatus (null: all kOk); q ([gamma,
// vocab_q] or null), drafts ([gamma]), alternates and alternate_rows ([gamma, alternates_width] or
// null) are this row's; tokens ([gamma + 1]), accepted and alternate_taken receive its verdict.
void verify_row(const VerifyParams& params, const VerifyRow& row, const float* p,
                const int32_t* p_status, const float* q, const int32_t* drafts,
                const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                int32_t* accepted, int32_t* alternate_taken);

}  // namespace specrun::kernels::cpu
