// A request's logits processors on the device (Backend::edit_logits): penalties and logit bias as
// edits of single logits, a grammar's allowed tokens as a bitmask, applied in place to the rows
// before they are processed, so the logits never leave the device. Bitwise the CPU's
// (kernels/cpu/logit_edits.h): each edit is one correctly rounded division or product and one sum.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/core/status.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace specrun::kernels::cuda {

// One block per row: its threads apply the row's edits (distinct tokens, so no two threads write
// one logit), then set every token the row's mask clears to -infinity.
Status launch_edit_logits(const LogitEditParams& params,
                          const int64_t* edit_begin,  // [rows + 1]
                          const LogitEdit* edits,     // [edit_begin[rows]]
                          const uint32_t* masks,      // [rows, mask_words] or null
                          float* logits,              // [rows, vocab] in place
                          CUstream_st* stream);

}  // namespace specrun::kernels::cuda
