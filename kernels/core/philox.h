// Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011): a counter-based generator. Its output is a pure function of a 128-bit counter and a
// 64-bit key, so any draw can be computed on its own, in any order, on the host or the device,
// and come out bit for bit the same. cuRAND, PyTorch and JAX use the same function.
#pragma once

#include <cstdint>

#include "kernels/core/uniform_hash.h"  // SPECRUN_HOST_DEVICE

namespace specrun::kernels {

struct PhiloxWords {
  uint32_t v[4];
};

namespace philox_detail {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // the golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

SPECRUN_HOST_DEVICE inline void round(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
  const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
  c[0] = hi1 ^ c[1] ^ k0;
  c[1] = lo1;
  c[2] = hi0 ^ c[3] ^ k1;
  c[3] = lo0;
}

}  // namespace philox_detail

// The four words of block `counter` under `key`: ten rounds, the key bumped by the Weyl constants
// between them (Random123's philox4x32_10).
SPECRUN_HOST_DEVICE inline PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                     uint32_t c3, uint32_t k0, uint32_t k1) {
  uint32_t c[4] = {c0, c1, c2, c3};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += philox_detail::kWeyl0;
      k1 += philox_detail::kWeyl1;
    }
    philox_detail::round(c, k0, k1);
  }
  return {{c[0], c[1], c[2], c[3]}};
}

}  // namespace specrun::kernels
