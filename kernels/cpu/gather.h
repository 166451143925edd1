// Token ids moved on the backend: the reference for Backend::gather.
#pragma once

#include "kernels/backend.h"

namespace specrun::kernels::cpu {

// out[i] = source[index[i]] where index[i] >= 0, kept where it is -1. The first index outside
// [-1, source_count) is kOutOfRange, naming it; every valid entry is still moved, the bad ones
// left as they were (what a device does, reporting at its next host wait).
Status gather(const GatherParams& params,
              const int32_t* source,  // [source_count]
              const int32_t* index,   // [count]
              int32_t* out);          // [count]

// Backend::gather_rows: out[r] zeroed, then source[index[r]] written at its columns. The first bad
// index or column is kOutOfRange, naming it; a bad column is skipped, a bad index's row left zero.
Status gather_rows(const RowGatherParams& params,
                   const float* source,     // [source_rows, width]
                   const int32_t* index,    // [rows]
                   const int32_t* columns,  // [width], or null
                   float* out);             // [rows, out_width]

}  // namespace specrun::kernels::cpu
