// Checks every checkpoint format (safetensors, GGUF) applies to its table of tensors, written once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace specrun {

// "[begin, end)"
std::string byte_range_to_string(uint64_t begin, uint64_t end);

// The product of `extents` times `element_bytes`, or nullopt when it, an extent or a product on
// the way (a later zero extent would hide it) exceeds INT64_MAX: a file's dimensions are
// attacker-controlled, and element counts are multiplied out in int64 in that order.
std::optional<uint64_t> checked_byte_count(std::span<const uint64_t> extents,
                                           uint64_t element_bytes = 1);

struct TensorByteRange {
  const std::string* name;  // the tensor, for the message
  uint64_t begin;           // first byte
  uint64_t end;             // one past the last byte
};

// The first two non-empty ranges that overlap, in begin order ({later, one before it that reaches
// past its begin}), or nullopt when none does.
std::optional<std::pair<TensorByteRange, TensorByteRange>> find_overlap(
    std::vector<TensorByteRange> ranges);

}  // namespace specrun
