// Uniform fills on the device: synthetic weights written where they will be used, bit for bit the
// values the CPU backend writes (kernels/core/uniform_hash.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/core/status.h"

namespace specrun::kernels::cuda {

// out[i] = low + (high - low) * uniform_at(seed, i), one rounded product and one rounded sum (no
// fused multiply-add, as on the CPU), then rounded to `dtype` (nearest even). Grid-stride.
Status launch_fill_uniform(int64_t count, DType dtype, uint64_t seed, float low, float high,
                           void* out,  // [count] dtype
                           cudaStream_t stream);

}  // namespace specrun::kernels::cuda
