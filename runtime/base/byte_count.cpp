#include "runtime/base/byte_count.h"

namespace specrun {

std::optional<uint64_t> checked_byte_count(std::span<const uint64_t> extents,
                                           uint64_t element_bytes) {
  uint64_t count = element_bytes;
  for (const uint64_t extent : extents) {
    if (extent > static_cast<uint64_t>(INT64_MAX) ||
        __builtin_mul_overflow(count, extent, &count) || count > static_cast<uint64_t>(INT64_MAX)) {
      return std::nullopt;
    }
  }
  return count;
}

}  // namespace specrun
