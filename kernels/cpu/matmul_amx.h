// The matmul on AMX tiles (Intel's Advanced Matrix Extensions: Sapphire Rapids and later Xeons),
// for bf16 weights in pair tiles (kernels/core/weight_layout.h) against activations rounded to
// bf16. One tile multiply (tdpbf16ps) takes up to 16 activation rows x 32 columns against 16
// weight rows x 32 columns into 16 x 16 f32 sums; a sum adds its products in the unit's own
// fixed order, and the unit computes each activation row alone: a result depends on its row and
// its weight row only, never on how many rows share the call (fewer rows are fewer tile rows),
// which thread runs it or the group it is in. The results are not bitwise those of vdpbf16ps
// (kernels/cpu/vector_math.h): the tests hold them to the f32-summation bound of the rounded
// activations' exact products.
//
// Compiled with the AMX instruction set (kernels/CMakeLists.txt) and called only where
// has_amx_bf16() holds, by the "amx" copy of the matmul (matmul_dispatch.cpp).
#pragma once

#include <cstddef>

#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"

namespace specrun::kernels::cpu {

// Each target's out = bf16(x) @ weight^T, without bias (the caller adds it). The caller has
// checked the group (check_matmul_group) and that every weight is bf16 in kPairTiles.
void amx_matmul_group(const float* x,               // [rows, in_features] f32
                      const MatmulTarget* targets,  // [count], kPairTiles bf16 weights
                      size_t count, ThreadPool& pool);

}  // namespace specrun::kernels::cpu
