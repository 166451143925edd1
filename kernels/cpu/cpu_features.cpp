#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cstdint>

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
  return has_x86_64_v4() && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512vnni");
}

bool has_amx_bf16() {
  // Asked once: the answer, and the permission the request obtains, last the process.
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // CPUID.(7,0):EDX
    if ((edx & kAmxBf16) == 0 || (edx & kAmxTile) == 0) return false;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0)
      return false;  // OSXSAVE
    uint32_t xcr0_low = 0, xcr0_high = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    constexpr uint32_t kTileState = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((xcr0_low & kTileState) != kTileState) return false;
#if defined(__linux__)
    // Linux (5.16 and later) gives a process the 8 KiB of tile data only on request
    // (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a tile instruction before it
    // kills the process.
    constexpr long kRequestPermission = 0x1023;
    constexpr long kTileData = 18;
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
    return false;
#endif
  }();
  return usable;
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
bool has_amx_bf16() {
  return false;
}
#endif

}  // namespace specrun::kernels::cpu
