#include "kernels/cpu/gather.h"

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

}  // namespace specrun::kernels::cpu
