#include "runtime/model/tensor_checks.h"

#include <algorithm>
#include <cstdint>

namespace specrun {

std::string byte_range_to_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::optional<std::pair<TensorByteRange, TensorByteRange>> find_overlap(
    std::vector<TensorByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const TensorByteRange& a, const TensorByteRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorByteRange* furthest = nullptr;  // the non-empty range reaching furthest so far
  for (const TensorByteRange& current : ranges) {
    if (current.end == current.begin) continue;
    if (furthest != nullptr && current.begin < furthest->end) {
      return std::pair<TensorByteRange, TensorByteRange>(current, *furthest);
    }
    if (furthest == nullptr || current.end > furthest->end) furthest = &current;
  }
  return std::nullopt;
}

}  // namespace specrun
