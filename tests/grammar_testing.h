// Helpers for the grammar tests: a matcher's mask as fill_mask writes it, and the reference it is
// held to, each token tried on a copy of the matcher.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/grammar/matcher.h"

namespace specrun::testing {

inline std::vector<uint32_t> mask_of(const grammar::Matcher& matcher) {
  std::vector<uint32_t> bits(matcher.vocabulary().mask_words());
  matcher.fill_mask(bits);
  return bits;
}

// The reference: each token accepted (or not) by a copy of the matcher.
inline std::vector<uint32_t> brute_force_mask(const grammar::Matcher& matcher) {
  std::vector<uint32_t> bits(matcher.vocabulary().mask_words());
  for (int32_t id = 0; id < matcher.vocabulary().size(); ++id) {
    grammar::Matcher copy = matcher;
    if (copy.accept_token(id)) bits[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
  return bits;
}

}  // namespace specrun::testing
