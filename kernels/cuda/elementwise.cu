#include "kernels/cuda/elementwise.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the loops stride past it.
constexpr int64_t kMaxBlocks = 65536;

// The CPU reference's expressions, rounded step by step as it rounds them.
template <GateActivation kActivation>
__device__ __forceinline__ float activated_times(float g, float u) {
  if constexpr (kActivation == GateActivation::kSilu) {
    // g / (1 + exp(-g)) * u
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
  } else {
    // 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * u
    const float cube = __fmul_rn(__fmul_rn(g, g), g);
    const float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(g, __fmul_rn(0.044715f, cube)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), u);
  }
}

// gate, up and out are not restrict: out may alias gate.
template <GateActivation kActivation, bool kVector>
__global__ void __launch_bounds__(kThreads) gated_kernel(const float* gate,  // [count]
                                                         const float* up,    // [count]
                                                         float* out,         // [count]
                                                         int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (kVector) {
    for (int64_t v = first; v < count / 4; v += stride) {
      const float4 g = reinterpret_cast<const float4*>(gate)[v];
      const float4 u = reinterpret_cast<const float4*>(up)[v];
      reinterpret_cast<float4*>(out)[v] = make_float4(
          activated_times<kActivation>(g.x, u.x), activated_times<kActivation>(g.y, u.y),
          activated_times<kActivation>(g.z, u.z), activated_times<kActivation>(g.w, u.w));
    }
  } else {
    for (int64_t i = first; i < count; i += stride)
      out[i] = activated_times<kActivation>(gate[i], up[i]);
  }
}

template <bool kVector>
__global__ void __launch_bounds__(kThreads) add_kernel(const float* addend,  // [count]
                                                       float* accumulator,   // [count]
                                                       int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if constexpr (kVector) {
    for (int64_t v = first; v < count / 4; v += stride) {
      const float4 a = reinterpret_cast<const float4*>(addend)[v];
      float4 value = reinterpret_cast<float4*>(accumulator)[v];
      value.x = __fadd_rn(value.x, a.x);
      value.y = __fadd_rn(value.y, a.y);
      value.z = __fadd_rn(value.z, a.z);
      value.w = __fadd_rn(value.w, a.w);
      reinterpret_cast<float4*>(accumulator)[v] = value;
    }
  } else {
    for (int64_t i = first; i < count; i += stride) {
      accumulator[i] = __fadd_rn(accumulator[i], addend[i]);
    }
  }
}

// Blocks for `items` work items, one per thread.
unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

}  // namespace

Status launch_gated_activation(const GatedActivationParams& params, const float* gate,
                               const float* up, float* out, cudaStream_t stream) {
  if (Status status = check_gated_activation(params); !status.is_ok()) return status;
  const int64_t count = params.rows * params.dim;
  if (count == 0) return Status::ok();
  const bool vector =
      count % 4 == 0 && is_aligned(gate, 16) && is_aligned(up, 16) && is_aligned(out, 16);
  const bool gelu = params.activation == GateActivation::kGeluTanh;
  const unsigned blocks = blocks_for(vector ? count / 4 : count);
  if (gelu && vector) {
    gated_kernel<GateActivation::kGeluTanh, true>
        <<<blocks, kThreads, 0, stream>>>(gate, up, out, count);
  } else if (gelu) {
    gated_kernel<GateActivation::kGeluTanh, false>
        <<<blocks, kThreads, 0, stream>>>(gate, up, out, count);
  } else if (vector) {
    gated_kernel<GateActivation::kSilu, true>
        <<<blocks, kThreads, 0, stream>>>(gate, up, out, count);
  } else {
    gated_kernel<GateActivation::kSilu, false>
        <<<blocks, kThreads, 0, stream>>>(gate, up, out, count);
  }
  return launch_status("gated activation kernel");
}

Status launch_add(int64_t count, const float* addend, float* accumulator, cudaStream_t stream) {
  if (Status status = check_add(count); !status.is_ok()) return status;
  if (count == 0) return Status::ok();
  const bool vector = count % 4 == 0 && is_aligned(addend, 16) && is_aligned(accumulator, 16);
  if (vector) {
    add_kernel<true><<<blocks_for(count / 4), kThreads, 0, stream>>>(addend, accumulator, count);
  } else {
    add_kernel<false><<<blocks_for(count), kThreads, 0, stream>>>(addend, accumulator, count);
  }
  return launch_status("add kernel");
}

}  // namespace specrun::kernels::cuda
