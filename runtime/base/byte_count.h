// Sizes computed from extents that may come from a file or a user, checked for overflow.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace specrun {

// The product of `extents` times `element_bytes`, or nullopt when it, an extent or a product on
// the way (a later zero extent would hide it) exceeds INT64_MAX: a file's dimensions are
// attacker-controlled, and element counts are multiplied out in int64 in that order.
std::optional<uint64_t> checked_byte_count(std::span<const uint64_t> extents,
                                           uint64_t element_bytes = 1);

}  // namespace specrun
