// Token embedding lookup on the device: gathers table rows, widened to f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {

// out[t, :] = table[token_ids[t], :]. One block per token; 16-byte loads when dim is a multiple of
// the vector width and both buffers are aligned.
//
// Contract against the CPU backend: the shape checks (kInvalidArgument) are made here, before the
// launch. Token ids live in device memory, so they are checked by the kernel: a row whose id is
// outside [0, vocab_size) is filled with NaN instead of read, and the first such id is recorded in
// `errors` (kOutOfRange when the backend reads the record at its next host wait). The runtime
// model validates ids on the host before it feeds them, so this is a second line of defence.
Status launch_embedding(const EmbeddingParams& params,
                        const int32_t* token_ids,   // [num_tokens]
                        const void* table,          // [vocab_size, dim] table_dtype
                        float* out,                 // [num_tokens, dim]
                        DeviceErrorRecord* errors,  // may be null: invalid ids still read nothing
                        cudaStream_t stream);

}  // namespace specrun::kernels::cuda
