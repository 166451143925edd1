// The inline namespace that holds header code whose instructions depend on the compiler's target.
//
// The CPU matmul is compiled once per instruction set (kernels/CMakeLists.txt) and chosen at run
// time, and the inline functions of the headers it includes are compiled again in each copy, with
// that copy's instructions. The linker keeps one definition of each inline function: without a
// namespace of its own per copy, it could hand the AVX-512 copy's body of a helper to code that
// runs on an AVX2 machine. Headers whose code the copies compile put it in
// SPECRUN_ISA_NAMESPACE, an inline namespace (callers name nothing new) that is `isa_<copy>` in a
// copy's file (SPECRUN_MATMUL_VARIANT, set by CMake) and `isa_baseline` everywhere else. Types stay
// outside it: they carry no code, and functions across the copies' boundary take them.
#pragma once

#define SPECRUN_ISA_JOIN_INNER(a, b) a##b
#define SPECRUN_ISA_JOIN(a, b) SPECRUN_ISA_JOIN_INNER(a, b)
#if defined(SPECRUN_MATMUL_VARIANT)
#define SPECRUN_ISA_NAMESPACE SPECRUN_ISA_JOIN(isa_, SPECRUN_MATMUL_VARIANT)
#else
#define SPECRUN_ISA_NAMESPACE isa_baseline
#endif
