// The linear layer on the device: out = x @ weight^T + bias, with activations in f32 and the
// weight in its stored dtype: f32, f16, bf16, or 8-bit codes (FP8 E4M3, INT8) with their scale
// grid (MatmulParams).
//
// Two paths:
// - Skinny (rows <= kSkinnyMaxRows: decode and speculative verification). The weight is read from
//   memory exactly once for all rows. A block (128 threads) owns F consecutive output features
//   (4; 8 for 8-bit weights with 2 to 8 rows); its four warps split the reduction: element chunk c
//   (16 bytes of weight: 16 codes, 8 halves or 4 floats) belongs to warp (c / 32) % 4, lane c % 32,
//   and each lane walks its chunks in increasing order, loading the chunk of all F features with
//   16-byte loads (two steps ahead at one row) and multiplying each by every row's x (read through
//   L1: x is small and shared by every block; each x vector a lane loads serves F features). Every
//   (row, feature) keeps its own f32 accumulator. Grid: (out_features / F summed over a group's
//   targets, row tiles of 16). Codes widen exactly (FP8 by the hardware's E4M3-to-f16
//   conversion, INT8 by a byte permute into 2^23's mantissa); a scale per output row multiplies the
//   finished sum, block scales (blocks of a multiple of 16 columns) multiply each chunk's widened
//   codes. Every quantized byte is read once for all rows.
// - GEMM (rows > kSkinnyMaxRows: prefill). cuBLAS on tensor cores: x is rounded to the weight's
//   dtype (bf16 or f16) in the backend's scratch buffer, multiplied with f32 accumulation and f32
//   output; f32 weights use a plain f32 GEMM (no TF32). The bias, if any, is added by a small
//   kernel afterwards. The rounding of x makes this path differ from the CPU reference by up to
//   2^-9 (bf16) or 2^-11 (f16) of sum_k |x_k w_k| per element. Quantized weights are dequantized
//   (code * scale, rounded to bf16) a tile of at most 2^24 weights at a time into the scratch, and
//   each tile multiplied by a bf16 GEMM: the weight's rounding adds another 2^-9. Prefill is
//   compute-bound, so the tile's extra write and read cost little; an FP8 tensor-core GEMM (which
//   also needs x quantized per token) is not implemented.
//
// Batch invariance. In the skinny path an output element (r, f) is the sum of the products
// x[r, k] * w[f, k] accumulated with fused multiply-adds in one fixed order that depends only on
// in_features: per lane in chunk order, then a fixed butterfly across the lanes, then the four warp
// sums in warp order, then the bias. The row count only selects how many accumulators a thread
// keeps (a template parameter), never the order, so row r's output is bitwise the same whether it
// is computed alone or among up to 16 rows. The GEMM path is not batch invariant (cuBLAS picks its
// tiling by shape, and x is rounded); with MatmulContext::batch_invariant the skinny kernel runs
// for every row count instead, over tiles of 16 rows (the weight is then read once per tile).
// The 16-byte path needs in_features % skinny_vector_multiple == 0 and 16-byte aligned x and
// weight; otherwise a scalar path with the same structure (one element per chunk) runs. The choice
// depends only on the shape and the alignment of the buffers, not on the row count.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/backend.h"

namespace specrun::kernels::cuda {

inline constexpr int64_t kSkinnyMaxRows = 16;

// What the backend owns and lends to the GEMM path.
struct MatmulContext {
  cublasHandle_t cublas;  // bound to the launch stream
  void* scratch;          // device scratch, at least matmul_scratch_bytes(params)
  size_t scratch_bytes;   // its size
  bool batch_invariant;   // skinny kernel for every row count
};

// Scratch the launch needs: x rounded to the weight dtype when the GEMM path runs on half weights,
// and for quantized weights also a bf16 tile of at most 2^24 dequantized weights; zero otherwise.
size_t matmul_scratch_bytes(const MatmulParams& params, bool batch_invariant);

// The multiple of in_features the skinny kernel's 16-byte loads need: 16 for 8-bit weights, else 8.
int64_t skinny_vector_multiple(DType weight_dtype);

// Whether the skinny kernel reads with 16-byte loads for these operands: in_features a multiple of
// skinny_vector_multiple and x and weight 16-byte aligned; otherwise it reads one element at a time
// (slower).
bool skinny_loads_vectors(const MatmulParams& params, const float* x, const void* weight);

// Whether launch_matmul runs the skinny kernel for these rows (else cuBLAS).
bool runs_skinny(const MatmulParams& params, bool batch_invariant);

// Each target's out = x @ weight^T + bias, as one launch where every target runs the skinny kernel
// with the same weight dtype, scale layout and loads (q, k and v at decode: one ramp and tail
// instead of three), one launch each otherwise; either way every output element has the bits a
// launch of its target alone gives. 1 to kMaxMatmulGroup targets sharing rows and in_features.
Status launch_matmul_group(const float* x,  // [rows, in_features]; aliases no target's out
                           const MatmulTarget* targets,  // [count]
                           size_t count, const MatmulContext& context, cudaStream_t stream);

}  // namespace specrun::kernels::cuda
