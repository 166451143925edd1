// The generator behind synthetic weights, shared by every backend: value i of a fill depends on
// (seed, i) alone, so the CPU and CUDA backends write the same weights bit for bit, however the
// work is split.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECRUN_HOST_DEVICE __host__ __device__
#else
#define SPECRUN_HOST_DEVICE
#endif

namespace specrun::kernels {

// SplitMix64's finaliser: a bijection on 64 bits that scrambles every input bit into every
// output bit.
SPECRUN_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Uniform in [0, 1) from 24 random bits, so that it is exact in f32.
SPECRUN_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t index) {
  return static_cast<float>(mix64(seed ^ mix64(index + 0x9e3779b97f4a7c15ull)) >> 40) *
         (1.0f / 16777216.0f);
}

}  // namespace specrun::kernels
