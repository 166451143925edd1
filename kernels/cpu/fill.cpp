#include "kernels/cpu/fill.h"

#include <algorithm>
#include <cmath>

#include "kernels/core/uniform_hash.h"

namespace specrun::kernels::cpu {

Status fill_uniform(const FillParams& params, void* out, ThreadPool& pool) {
  if (Status status = check_fill(params); !status.is_ok()) return status;
  const float width = params.high - params.low;
  // Big chunks: each element is a few integer operations, so splitting finely only adds overhead.
  pool.parallel_for(params.count, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Compiled without contraction, so this is the CUDA kernel's mul-then-add exactly.
      const float value = params.low + width * uniform_at(params.seed, static_cast<uint64_t>(i));
      switch (params.dtype) {
        case DType::kF32:
          static_cast<float*>(out)[i] = value;
          break;
        case DType::kF16:
          static_cast<uint16_t*>(out)[i] = f32_to_f16(value);
          break;
        case DType::kBF16:
          static_cast<uint16_t*>(out)[i] = f32_to_bf16(value);
          break;
        case DType::kF8E4M3:
          static_cast<uint8_t*>(out)[i] = f32_to_f8e4m3(value);
          break;
        case DType::kI8:
          static_cast<int8_t*>(out)[i] =
              static_cast<int8_t>(std::clamp(std::nearbyint(value), -128.0f, 127.0f));
          break;
        case DType::kQ4_0:
        case DType::kQ4_1:
        case DType::kQ8_0:
          break;  // refused by check_fill
      }
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
