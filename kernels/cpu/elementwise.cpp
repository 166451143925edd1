#include "kernels/cpu/elementwise.h"

#include <cmath>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {
namespace {

// Elements per scheduling grain: enough to amortise waking a thread.
constexpr int64_t kElementGrain = 16384;

// PyTorch's gelu(approximate="tanh"), in f32 as it computes it (x^3 as x * x * x).
float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.0f + std::tanh(inner));
}

}  // namespace

Status gated_activation(const GatedActivationParams& params, const float* gate, const float* up,
                        float* out, ThreadPool& pool) {
  if (Status status = check_gated_activation(params); !status.is_ok()) return status;
  if (params.activation == GateActivation::kGeluTanh) {
    pool.parallel_for(params.rows * params.dim, kElementGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
    });
    return Status::ok();
  }
  // 16 elements at a time where there is AVX-512, the same bits as one at a time (exp_lanes).
  pool.parallel_for(params.rows * params.dim, kElementGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= end; i += 16) {
      const __m512 g = _mm512_loadu_ps(gate + i);
      const __m512 e = exp_lanes(_mm512_sub_ps(_mm512_setzero_ps(), g));
      _mm512_storeu_ps(
          out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + exp_f32(-g)) * up[i];
    }
  });
  return Status::ok();
}

Status add(int64_t count, const float* addend, float* accumulator, ThreadPool& pool) {
  if (Status status = check_add(count); !status.is_ok()) return status;
  pool.parallel_for(count, kElementGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) accumulator[i] += addend[i];
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
