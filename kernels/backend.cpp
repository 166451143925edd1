#include "kernels/backend.h"

namespace specrun::kernels {

Status check_matmul_group(const MatmulTarget* targets, size_t count) {
  if (count == 0 || count > kMaxMatmulGroup) {
    return Status::invalid_argument("matmul group: 1 to 3 targets");
  }
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    const MatmulParams& p = t.params;
    if (p.rows < 0 || p.in_features <= 0 || p.out_features <= 0) {
      return Status::invalid_argument("matmul: bad shape");
    }
    if (p.rows != targets[0].params.rows || p.in_features != targets[0].params.in_features) {
      return Status::invalid_argument("matmul group: every target must share rows and in_features");
    }
    if (is_quantized(p.weight_dtype) &&
        (t.weight_scales == nullptr || p.scale_block_rows <= 0 || p.scale_block_cols <= 0 ||
         (p.scale_block_cols % 16 != 0 && p.scale_block_cols < p.in_features))) {
      return Status::invalid_argument(
          "matmul: a quantized weight needs scales in blocks of whole 16-column groups");
    }
  }
  return Status::ok();
}

void Backend::for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace specrun::kernels
