#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace specrun::kernels::cpu {
namespace {

void rotate_heads(float* heads, int64_t num_heads, int64_t head_dim, RopeStyle style,
                  const float* cosines, const float* sines) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < num_heads; ++h) {
    float* head = heads + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      // The two channels rotated together by angle i.
      float& first = style == RopeStyle::kRotateHalf ? head[i] : head[2 * i];
      float& second = style == RopeStyle::kRotateHalf ? head[i + half] : head[2 * i + 1];
      const float x1 = first;
      const float x2 = second;
      first = x1 * cosines[i] - x2 * sines[i];
      second = x2 * cosines[i] + x1 * sines[i];
    }
  }
}

}  // namespace

Status rope(const RopeParams& params, const int32_t* positions, const float* inv_freq, float* q,
            float* k, ThreadPool& pool) {
  if (Status status = check_rope(params); !status.is_ok()) return status;
  const int64_t half = params.head_dim / 2;
  pool.parallel_for(params.num_tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> cosines(static_cast<size_t>(half));
    std::vector<float> sines(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // The angle in double: positions reach 10^5 and more, where an f32 product would lose
        // the low bits of the phase.
        const double angle = static_cast<double>(positions[t]) * static_cast<double>(inv_freq[i]);
        cosines[static_cast<size_t>(i)] = static_cast<float>(std::cos(angle));
        sines[static_cast<size_t>(i)] = static_cast<float>(std::sin(angle));
      }
      rotate_heads(q + t * params.num_heads * params.head_dim, params.num_heads, params.head_dim,
                   params.style, cosines.data(), sines.data());
      rotate_heads(k + t * params.num_kv_heads * params.head_dim, params.num_kv_heads,
                   params.head_dim, params.style, cosines.data(), sines.data());
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
