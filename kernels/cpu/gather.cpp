#include "kernels/cpu/gather.h"

#include <algorithm>
#include <string>

namespace specrun::kernels::cpu {

Status gather(const GatherParams& params, const int32_t* source, const int32_t* index,
              int32_t* out) {
  Status status = Status::ok();
  for (int64_t i = 0; i < params.count; ++i) {
    const int64_t from = index[i];
    if (from >= 0 && from < params.source_count) {
      out[i] = source[from];
    } else if (from != -1 && status.is_ok()) {
      status = Status::out_of_range("gather: index " + std::to_string(from) + " at entry " +
                                    std::to_string(i) + " is outside [-1, " +
                                    std::to_string(params.source_count) + ")");
    }
  }
  return status;
}

Status gather_rows(const RowGatherParams& params, const float* source, const int32_t* index,
                   const int32_t* columns, float* out) {
  Status status = Status::ok();
  const auto fail = [&](const std::string& what) {
    if (status.is_ok()) status = Status::out_of_range("gather_rows: " + what);
  };
  for (int64_t r = 0; r < params.rows; ++r) {
    float* row = out + r * params.out_width;
    std::fill(row, row + params.out_width, 0.0f);
    const int64_t from = index[r];
    if (from == -1) continue;
    if (from < 0 || from >= params.source_rows) {
      fail("index " + std::to_string(from) + " at row " + std::to_string(r) + " is outside [-1, " +
           std::to_string(params.source_rows) + ")");
      continue;
    }
    const float* values = source + from * params.width;
    for (int64_t c = 0; c < params.width; ++c) {
      const int64_t column = columns == nullptr ? c : columns[c];
      if (column < 0 || column >= params.out_width) {
        fail("column " + std::to_string(column) + " of entry " + std::to_string(c) +
             " is outside [0, " + std::to_string(params.out_width) + ")");
        continue;
      }
      row[column] = values[c];
    }
  }
  return status;
}

}  // namespace specrun::kernels::cpu
