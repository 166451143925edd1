// The random numbers of sampling and speculative verification. Every number is a pure function of
// (the request's seed, an output position, what it is drawn for, an index), computed by
// Philox4x32-10 rather than taken from a generator's running state. So a sequence's randomness
// does not depend on its batch mates, on how many drafts a step verified, on how many numbers an
// earlier step happened to consume, or on the order anything ran in: the token at output position
// j is decided by the numbers of position j alone.
#pragma once

#include <cstdint>

#include "kernels/core/philox.h"

namespace specrun::kernels {

// What a draw is for. Each purpose has its own numbers at each position, so how many draws one
// makes never shifts another's.
enum class Draw : uint32_t {
  kToken = 1,  // the target's token at the position: plain sampling, a recovered or bonus token
  kAcceptance = 2,  // the acceptance test of the draft for the position (rejection sampling)
  kDraft = 3,       // the draft model's sample for the position (rejection sampling)
  kNoise = 4,       // shared noise: one number per (position, token), read by draft and target
};

class RandomStream {
 public:
  SPECRUN_HOST_DEVICE explicit RandomStream(uint64_t seed = 0)
      : key0_(static_cast<uint32_t>(seed)), key1_(static_cast<uint32_t>(seed >> 32)) {}

  // The seed the stream was made from.
  SPECRUN_HOST_DEVICE uint64_t seed() const {
    return static_cast<uint64_t>(key0_) | (static_cast<uint64_t>(key1_) << 32);
  }

  // Block `index` of (position, draw): four independent 32-bit words.
  SPECRUN_HOST_DEVICE PhiloxWords block(int64_t position, Draw draw, uint32_t index) const {
    const uint64_t p = static_cast<uint64_t>(position);
    return philox4x32_10(static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32),
                         static_cast<uint32_t>(draw), index, key0_, key1_);
  }

  // Uniform in [0, 1) with 53 random bits: the one number of (position, draw).
  SPECRUN_HOST_DEVICE double uniform(int64_t position, Draw draw) const {
    const PhiloxWords words = block(position, draw, 0);
    const uint64_t bits = (static_cast<uint64_t>(words.v[0]) << 32) | words.v[1];
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
  }

 private:
  uint32_t key0_;
  uint32_t key1_;
};

}  // namespace specrun::kernels
