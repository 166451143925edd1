#include "kernels/core/weight_layout.h"

#include <cstring>

namespace specrun::kernels {

void pack_tiled(const void* source, int64_t out_features, int64_t in_features, DType dtype,
                void* destination) {
  const size_t element = dtype_size(dtype);
  const int64_t padded = stored_columns(WeightLayout::kTiled, in_features);
  const auto* from = static_cast<const unsigned char*>(source);
  auto* to = static_cast<unsigned char*>(destination);
  for (int64_t row = 0; row < out_features; ++row) {
    const RowAddress address = row_address(WeightLayout::kTiled, row, out_features, in_features);
    for (int64_t chunk = 0; chunk < padded; chunk += kTileColumns) {
      const int64_t count = in_features - chunk < kTileColumns ? in_features - chunk : kTileColumns;
      unsigned char* out =
          to + static_cast<size_t>(address.first + chunk * address.column_step) * element;
      std::memcpy(out, from + static_cast<size_t>(row * in_features + chunk) * element,
                  static_cast<size_t>(count) * element);
      std::memset(out + static_cast<size_t>(count) * element, 0,
                  static_cast<size_t>(kTileColumns - count) * element);
    }
  }
}

}  // namespace specrun::kernels
