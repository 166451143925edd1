#include "kernels/cpu/cpu_features.h"

namespace specrun::kernels::cpu {

#if defined(__x86_64__)
// The levels by their features, as far as both compilers' __builtin_cpu_supports name them
// (Clang's takes neither level names nor F16C or MOVBE, which every AVX2 CPU has).
bool has_x86_64_v3() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
}

bool has_x86_64_v4() {
  return has_x86_64_v3() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512cd");
}

bool has_x86_64_v4_bf16() {
  return has_x86_64_v4() && __builtin_cpu_supports("avx512bf16");
}
#else
bool has_x86_64_v3() {
  return false;
}
bool has_x86_64_v4() {
  return false;
}
bool has_x86_64_v4_bf16() {
  return false;
}
#endif

}  // namespace specrun::kernels::cpu
