#include "kernels/cpu/elementwise.h"

#include <cmath>

namespace specrun::kernels::cpu {

// Elements per scheduling grain: enough to amortise waking a thread.
constexpr int64_t kElementGrain = 16384;

Status swiglu(const SwigluParams& params, const float* gate, const float* up, float* out,
              ThreadPool& pool) {
  if (params.rows < 0 || params.dim <= 0) return Status::invalid_argument("swiglu: bad shape");
  pool.parallel_for(params.rows * params.dim, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
  return Status::ok();
}

Status add(int64_t count, const float* addend, float* accumulator, ThreadPool& pool) {
  if (count < 0) return Status::invalid_argument("add: negative count");
  pool.parallel_for(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) accumulator[i] += addend[i];
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
