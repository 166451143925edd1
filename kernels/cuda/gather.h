// Token ids moved on the device (Backend::gather); kernels/cpu/gather.h is the reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {

// out[i] = source[index[i]] where index[i] >= 0, kept where it is -1; one thread an entry,
// grid-stride. The indices live in device memory, so the kernel checks them: an entry whose index
// is outside [-1, source_count) is left as it was and the first such index is recorded in
// `errors` (kOutOfRange when the backend reads the record at its next host wait), as the CPU
// reports it.
Status launch_gather(const GatherParams& params,
                     const int32_t* source,      // [source_count]
                     const int32_t* index,       // [count]
                     int32_t* out,               // [count]
                     DeviceErrorRecord* errors,  // may be null: bad entries are still left alone
                     cudaStream_t stream);

// out[r] zeroed, then source[index[r]] written at its columns; one block a row, which zeroes its
// row and, after a barrier, scatters into it. A bad index (the row stays zero) or column (skipped)
// is recorded in `errors` as kOutOfRange, as the CPU reports it.
Status launch_gather_rows(const RowGatherParams& params,
                          const float* source,        // [source_rows, width]
                          const int32_t* index,       // [rows]
                          const int32_t* columns,     // [width], or null
                          float* out,                 // [rows, out_width]
                          DeviceErrorRecord* errors,  // may be null
                          cudaStream_t stream);

}  // namespace specrun::kernels::cuda
