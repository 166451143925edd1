#include "kernels/core/weight_layout.h"

#include <cstring>

namespace specrun::kernels {

Status lay_out_weight(WeightLayout layout, const void* source, int64_t out_features,
                      int64_t in_features, DType dtype, void* destination) {
  const size_t element = dtype_size(dtype);
  const auto* from = static_cast<const unsigned char*>(source);
  auto* to = static_cast<unsigned char*>(destination);
  if (is_block_quantized(dtype) && layout != WeightLayout::kRows) {
    return Status::invalid_argument("weight layout: GGUF blocks lie in rows only");
  }
  switch (layout) {
    case WeightLayout::kRows:
      std::memcpy(to, from, dtype_bytes(dtype, static_cast<uint64_t>(out_features * in_features)));
      return Status::ok();
    case WeightLayout::kTiled: {
      const int64_t padded = stored_columns(layout, in_features);
      for (int64_t row = 0; row < out_features; ++row) {
        const RowAddress address = row_address(layout, row, out_features, in_features);
        for (int64_t chunk = 0; chunk < padded; chunk += kTileColumns) {
          const int64_t count =
              in_features - chunk < kTileColumns ? in_features - chunk : kTileColumns;
          unsigned char* out =
              to + static_cast<size_t>(address.first + chunk * address.column_step) * element;
          std::memcpy(out, from + static_cast<size_t>(row * in_features + chunk) * element,
                      static_cast<size_t>(count) * element);
          std::memset(out + static_cast<size_t>(count) * element, 0,
                      static_cast<size_t>(kTileColumns - count) * element);
        }
      }
      return Status::ok();
    }
    case WeightLayout::kPairTiles: {
      if (element != 2) {
        return Status::invalid_argument("weight layout: pair tiles hold 16-bit weights only");
      }
      // In the destination's order (element_offset's), a column pair at a time: the pairs of a
      // tile's 16 rows, the tile's 16 pairs, a group's tiles, the groups. Padding reads as zero.
      const auto* from16 = reinterpret_cast<const uint16_t*>(from);
      auto* to16 = reinterpret_cast<uint16_t*>(to);
      const int64_t columns = stored_columns(layout, in_features);
      for (int64_t group = 0; group < stored_rows(layout, out_features); group += kPairTileRows) {
        for (int64_t tile = 0; tile < columns; tile += kPairTileColumns) {
          for (int64_t pair = tile; pair < tile + kPairTileColumns; pair += 2) {
            for (int64_t row = group; row < group + kPairTileRows; ++row) {
              const bool present = row < out_features;
              const uint16_t* row_source = from16 + row * in_features;
              *to16++ = present && pair < in_features ? row_source[pair] : 0;
              *to16++ = present && pair + 1 < in_features ? row_source[pair + 1] : 0;
            }
          }
        }
      }
      return Status::ok();
    }
  }
  return Status::invalid_argument("weight layout: unknown layout");
}

}  // namespace specrun::kernels
