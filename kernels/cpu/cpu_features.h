// What the running CPU can execute, by x86-64 micro-architecture level, for the code that keeps
// one copy per instruction set and picks one at run time (the matmul's copies, the sampler's
// exponential). False on other architectures.
#pragma once

namespace specrun::kernels::cpu {

bool has_x86_64_v3();       // AVX2, FMA, BMI1/2
bool has_x86_64_v4();       // v3 and AVX-512 F, BW, VL, DQ, CD
bool has_x86_64_v4_bf16();  // v4, AVX512-BF16 (vdpbf16ps) and AVX512-VNNI (vpdpbusd)
// AMX-TILE and AMX-BF16 (tdpbf16ps), with the tile state enabled by the OS and granted to this
// process (Linux asks each process to request it: the first call does, once).
bool has_amx_bf16();

}  // namespace specrun::kernels::cpu
