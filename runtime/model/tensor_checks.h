// Checks every checkpoint format (safetensors, GGUF) applies to its table of tensors, written once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/byte_count.h"

namespace specrun {

// "[begin, end)"
std::string byte_range_to_string(uint64_t begin, uint64_t end);

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
