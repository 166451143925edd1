#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// How activations meet bf16 weights.
enum class Activations : uint8_t {
  kF32,   // exactly: each f32 activation times the widened weight, f32 sums (the reference)
  kBF16,  // rounded to bf16 first, as llama.cpp and the GPUs' bf16 GEMMs do: then products of
          // two bf16 pairs a vdpbf16ps where the build has AVX512-BF16 (half the instructions,
          // no widening), else widened to f32 as kF32 does. Other weight dtypes take kF32.
};

// Each target's out = x @ weight^T + bias (Backend::matmul_group; a single matmul is a group of
// one). Threads split the group's output features in one parallel region; every element is one
// dot_block reduction, so the result is bitwise independent of rows, thread count and the group it
// is computed in. A quantized weight is scaled lane group by lane group inside that reduction
// (MatmulParams has the layout).
Status matmul_group(const float* x,               // [rows, in_features]
                    const MatmulTarget* targets,  // [count], sharing rows and in_features
                    size_t count, ThreadPool& pool, Activations activations = Activations::kF32);

// A group of one.
Status matmul(const MatmulParams& params,
              const float* x,              // [rows, in_features]
              const void* weight,          // [out_features, in_features] weight_dtype
              const float* weight_scales,  // the scale grid of a quantized weight, or null
              const void* bias,            // [out_features] bias_dtype, or null
              float* out,                  // [rows, out_features]
              ThreadPool& pool, Activations activations = Activations::kF32);

}  // namespace specrun::kernels::cpu
