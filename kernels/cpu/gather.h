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

}  // namespace specrun::kernels::cpu
