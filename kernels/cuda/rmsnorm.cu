#include "kernels/cuda/rmsnorm.h"

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;

// Four consecutive weights widened to f32; `source` is aligned to four elements.
template <DType kDType>
__device__ __forceinline__ float4 load_four(const void* weight, int64_t first) {
  if constexpr (kDType == DType::kF32) {
    return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(weight) + first));
  } else {
    const uint2 bits =
        __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(weight) + first));
    return make_float4(Stored<kDType>::widen(static_cast<uint16_t>(bits.x & 0xffffu)),
                       Stored<kDType>::widen(static_cast<uint16_t>(bits.x >> 16)),
                       Stored<kDType>::widen(static_cast<uint16_t>(bits.y & 0xffffu)),
                       Stored<kDType>::widen(static_cast<uint16_t>(bits.y >> 16)));
  }
}

// x and out are not restrict: they may be the same buffer (without an addend). Every element is
// read (both passes) and written by the same thread, and the barrier inside the reduction
// separates the passes. kAdd: x += addend first, element by element, by the thread that then
// squares and normalises the sum (add_kernel's one rounded add).
template <DType kDType, bool kVector, bool kAdd>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(float* x,             // [rows, dim]
                                                           const float* addend,  // [rows, dim]
                                                           const void* weight,   // [dim]
                                                           float* out,           // [rows, dim]
                                                           int64_t dim, float eps) {
  __shared__ float warp_sums[kWarps];
  __shared__ float inverse_rms_shared;
  const int64_t row = blockIdx.x;
  float* source = x + row * dim;         // [dim]
  float* destination = out + row * dim;  // [dim]

  float sum = 0.0f;
  if constexpr (kVector) {
    for (int64_t v = threadIdx.x; v < dim / 4; v += kThreads) {
      float4 value = reinterpret_cast<const float4*>(source)[v];
      if constexpr (kAdd) {
        const float4 a = reinterpret_cast<const float4*>(addend + row * dim)[v];
        value.x = __fadd_rn(value.x, a.x);
        value.y = __fadd_rn(value.y, a.y);
        value.z = __fadd_rn(value.z, a.z);
        value.w = __fadd_rn(value.w, a.w);
        reinterpret_cast<float4*>(source)[v] = value;
      }
      sum = __fmaf_rn(value.x, value.x, sum);
      sum = __fmaf_rn(value.y, value.y, sum);
      sum = __fmaf_rn(value.z, value.z, sum);
      sum = __fmaf_rn(value.w, value.w, sum);
    }
  } else {
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
      if constexpr (kAdd) source[c] = __fadd_rn(source[c], addend[row * dim + c]);
      sum = __fmaf_rn(source[c], source[c], sum);
    }
  }
  sum = warp_sum(sum);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = warp_sums[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) total = __fadd_rn(total, warp_sums[w]);
    const float mean_square = __fdiv_rn(total, static_cast<float>(dim));
    inverse_rms_shared = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_square, eps)));
  }
  __syncthreads();
  const float inverse_rms = inverse_rms_shared;

  // (x * inverse_rms) * weight, the CPU reference's order of the two products.
  if constexpr (kVector) {
    for (int64_t v = threadIdx.x; v < dim / 4; v += kThreads) {
      const float4 value = reinterpret_cast<const float4*>(source)[v];
      const float4 gain = load_four<kDType>(weight, 4 * v);
      reinterpret_cast<float4*>(destination)[v] =
          make_float4(__fmul_rn(__fmul_rn(value.x, inverse_rms), gain.x),
                      __fmul_rn(__fmul_rn(value.y, inverse_rms), gain.y),
                      __fmul_rn(__fmul_rn(value.z, inverse_rms), gain.z),
                      __fmul_rn(__fmul_rn(value.w, inverse_rms), gain.w));
    }
  } else {
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
      const float gain = load_element_f32(weight, kDType, c);
      destination[c] = __fmul_rn(__fmul_rn(source[c], inverse_rms), gain);
    }
  }
}

// Whether launch_rmsnorm reads and writes 16 bytes at a time for these operands.
bool vector_path(const RmsNormParams& params, const void* x, const void* weight, const void* out) {
  return params.dim % 4 == 0 && is_aligned(x, 16) && is_aligned(out, 16) &&
         is_aligned(weight, 4 * dtype_size(params.weight_dtype));
}

template <DType kDType, bool kAdd>
void launch_typed(const RmsNormParams& params, const float* addend, float* x, const void* weight,
                  float* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(params.rows));
  if (vector_path(params, x, weight, out)) {
    rmsnorm_kernel<kDType, true, kAdd>
        <<<grid, kThreads, 0, stream>>>(x, addend, weight, out, params.dim, params.eps);
  } else {
    rmsnorm_kernel<kDType, false, kAdd>
        <<<grid, kThreads, 0, stream>>>(x, addend, weight, out, params.dim, params.eps);
  }
}

// The norm of x into out, after x += addend when kAdd.
template <bool kAdd>
Status launch_norm(const RmsNormParams& params, const float* addend, float* x, const void* weight,
                   float* out, cudaStream_t stream) {
  switch (params.weight_dtype) {
    case DType::kF32:
      launch_typed<DType::kF32, kAdd>(params, addend, x, weight, out, stream);
      break;
    case DType::kF16:
      launch_typed<DType::kF16, kAdd>(params, addend, x, weight, out, stream);
      break;
    case DType::kBF16:
      launch_typed<DType::kBF16, kAdd>(params, addend, x, weight, out, stream);
      break;
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return Status::unsupported("rmsnorm: a quantized weight (norms stay unquantized)");
  }
  return launch_status(kAdd ? "add_rmsnorm kernel" : "rmsnorm kernel");
}

// Backend's shape check (kernels/backend.h), then what this kernel cannot do.
Status check_rmsnorm_launch(const RmsNormParams& params, const char* op) {
  if (Status status = check_rmsnorm(params, op); !status.is_ok()) return status;
  if (params.rows > INT32_MAX) return Status::unsupported("rmsnorm: more than 2^31 - 1 rows");
  return Status::ok();
}

}  // namespace

Status launch_rmsnorm(const RmsNormParams& params, const float* x, const void* weight, float* out,
                      cudaStream_t stream) {
  if (Status status = check_rmsnorm_launch(params, "rmsnorm"); !status.is_ok()) return status;
  if (params.rows == 0) return Status::ok();
  // Without an addend the kernel only reads x (out may alias it).
  return launch_norm<false>(params, nullptr, const_cast<float*>(x), weight, out, stream);
}

Status launch_add_rmsnorm(const RmsNormParams& params, const float* addend, float* accumulator,
                          const void* weight, float* out, cudaStream_t stream) {
  if (Status status = check_rmsnorm_launch(params, "add_rmsnorm"); !status.is_ok()) return status;
  if (params.rows == 0) return Status::ok();
  if (vector_path(params, accumulator, weight, out) && !is_aligned(addend, 16)) {
    if (Status status = launch_add(params.rows * params.dim, addend, accumulator, stream);
        !status.is_ok()) {
      return status;
    }
    return launch_rmsnorm(params, accumulator, weight, out, stream);
  }
  return launch_norm<true>(params, addend, accumulator, weight, out, stream);
}

}  // namespace specrun::kernels::cuda
