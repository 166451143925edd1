// Elementwise ops on the device: a gated MLP's activation (SwiGLU, GeGLU) and the residual add.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/backend.h"

namespace specrun::kernels::cuda {

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up; out may alias gate (each element is read
// and written by one thread). Grid-stride, 16-byte accesses when all three are aligned.
Status launch_gated_activation(const GatedActivationParams& params,
                               const float* gate,  // [rows, dim]
                               const float* up,    // [rows, dim]
                               float* out,         // [rows, dim]
                               cudaStream_t stream);

// accumulator += addend, elementwise (the residual connection).
Status launch_add(int64_t count,
                  const float* addend,  // [count]
                  float* accumulator,   // [count]
                  cudaStream_t stream);

}  // namespace specrun::kernels::cuda
