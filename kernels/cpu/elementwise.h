// Elementwise ops: a gated MLP's activation (SwiGLU, GeGLU) and the residual add.
#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

Status gated_activation(const GatedActivationParams& params,
                        const float* gate,  // [rows, dim]
                        const float* up,    // [rows, dim]
                        float* out,         // [rows, dim]; may alias gate
                        ThreadPool& pool);

Status add(int64_t count,
           const float* addend,  // [count]
           float* accumulator,   // [count]
           ThreadPool& pool);

}  // namespace specrun::kernels::cpu
