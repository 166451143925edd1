#include "kernels/cpu/rmsnorm.h"

#include <cmath>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {

Status rmsnorm(const RmsNormParams& params, const float* x, const void* weight, float* out,
               ThreadPool& pool) {
  if (Status status = check_rmsnorm(params, "rmsnorm"); !status.is_ok()) return status;
  if (is_quantized(params.weight_dtype)) {
    return Status::unsupported("rmsnorm: a quantized weight (norms stay unquantized)");
  }
  pool.parallel_for(params.rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * params.dim;
      float* destination = out + r * params.dim;
      const float mean_square = dot_f32(row, row, params.dim) / static_cast<float>(params.dim);
      const float inverse_rms = 1.0f / std::sqrt(mean_square + params.eps);
      for (int64_t c = 0; c < params.dim; ++c) {
        destination[c] =
            row[c] * inverse_rms * load_as_f32(weight, params.weight_dtype, static_cast<size_t>(c));
      }
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
