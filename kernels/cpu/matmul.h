#pragma once

#include <span>
#include <string_view>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// How activations meet bf16 weights, and INT8 and FP8 weights with one scale per row (their
// codes' values are exact in bf16 and their sums are scaled once, so they are multiplied as bf16
// weights are), and GGUF's 4- and 8-bit blocks.
//
// GGUF blocks meet activations quantized per block under every mode but kF32: each activation
// row's 32 columns of a block become int8 codes round(x * 127 / max |x|) with one f32 scale,
// max |x| / 127 (as llama.cpp's Q8_0 activations, with an f32 scale where it keeps f16), and each
// block's result is the exact integer sum of code products times the two blocks' scales (plus
// Q4_1's offset times the activation block's scale times its codes' sum). Integer sums taken in
// eight lanes of four columns (vpdpbusd where the copy has AVX512-VNNI, vpmaddubsw and vpmaddwd in
// AVX2, the same sums) and the lanes' f32 sums in one fixed order: the same bits from every copy
// with FMA, for any number of rows.
enum class Activations : uint8_t {
  kF32,   // exactly: each f32 activation times the widened weight, f32 sums (the reference); GGUF
          // blocks widened to their f32 values first (bitwise an f32 weight of those values)
  kBF16,  // rounded to bf16 first, as llama.cpp and the GPUs' bf16 GEMMs do: then products of
          // two bf16 pairs a vdpbf16ps where the build has AVX512-BF16 (half the instructions,
          // no widening), AMX tile multiplies for weights in pair tiles (the "amx" copy), else
          // widened to f32 as kF32 does. Other weights (f32, f16, block-wise scales) take kF32.
  kInt8,  // as kBF16, and INT8 weights with one scale per row meet the rows quantized to int8
          // per token (symmetric: a row's codes are round(x * 127 / max |x|), its scale
          // max |x| / 127), as W8A8 deployments do: each result is the exact integer sum of code
          // products times the row's scale times the weight row's (vpdpbusd, 64 code pairs an
          // instruction, where the copy has AVX512-VNNI; vpmaddwd in the AVX2 copy). Integer
          // sums: the same bits from every copy of the kernels. Coarser than kBF16: each
          // activation within half a step, max |x| / 254, of its value.
  kF32Int8Blocks,  // as kF32 for every weight but GGUF blocks, which meet activations quantized
                   // per block (above): what "auto" is where the CPU has no bf16 pairs in hardware
};

// Whether activations that meet bf16 weights (and 8-bit ones with a scale per row) are rounded to
// bf16 first.
constexpr bool rounds_to_bf16(Activations activations) {
  return activations == Activations::kBF16 || activations == Activations::kInt8;
}

// One instruction set's copy of the matmul kernels. The matmul is the one loop whose best
// instructions differ from CPU to CPU (AVX-512 and vdpbf16ps, or AVX2), so it is compiled once per
// instruction set in the build's list (kernels/CMakeLists.txt) and chosen at run time: a binary
// built on one machine runs on another. For f32 activations every copy gives the same bits (one
// reduction order); bf16 activations differ between copies with and without AVX512-BF16, and
// with AMX.
struct MatmulVariant {
  std::string_view name;  // "amx", "native", "x86-64-v4+bf16", "x86-64-v3", "portable"
  bool (*supported)();    // whether this CPU runs it
  Status (*group)(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool,
                  Activations activations);
  // Whether this copy multiplies bf16 pairs in hardware (AMX tiles, or vdpbf16ps where it has
  // AVX512-BF16): only there do bf16 activations save time.
  bool (*multiplies_bf16_pairs)();
  // The layout this copy reads bf16 weights in fastest when activations are bf16: kPairTiles for
  // AMX's tile multiply, kTiled for the others (as every other weight).
  WeightLayout bf16_pairs_layout = WeightLayout::kTiled;
};

// This build's copies, the preferred first: "native" where the build targets its own machine,
// else the widest first.
std::span<const MatmulVariant> matmul_variants();
// The first of matmul_variants() this CPU supports.
const MatmulVariant& best_matmul_variant();

// Each target's out = x @ weight^T + bias (Backend::matmul_group; a single matmul is a group of
// one). Threads split the group's output features in one parallel region; every element is one
// dot_block reduction, so the result is bitwise independent of rows, thread count and the group it
// is computed in. A quantized weight is scaled lane group by lane group inside that reduction
// (MatmulParams has the layout). `variant`: a copy of the kernels; null for the best.
Status matmul_group(const float* x,               // [rows, in_features]
                    const MatmulTarget* targets,  // [count], sharing rows and in_features
                    size_t count, ThreadPool& pool, Activations activations = Activations::kF32,
                    const MatmulVariant* variant = nullptr);

// A group of one.
Status matmul(const MatmulParams& params,
              const float* x,              // [rows, in_features]
              const void* weight,          // [out_features, in_features] weight_dtype
              const float* weight_scales,  // the scale grid of a quantized weight, or null
              const void* bias,            // [out_features] bias_dtype, or null
              float* out,                  // [rows, out_features]
              ThreadPool& pool, Activations activations = Activations::kF32,
              const MatmulVariant* variant = nullptr);

}  // namespace specrun::kernels::cpu
