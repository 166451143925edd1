#include "kernels/cuda/fill.h"

#include <algorithm>
#include <cmath>

#include "kernels/backend.h"
#include "kernels/core/uniform_hash.h"
#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

template <DType kDType>
__global__ void __launch_bounds__(kThreads)
    fill_uniform_kernel(typename Stored<kDType>::Type* out,  // [count]
                        int64_t count, uint64_t seed, float low, float width) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    const float value =
        __fadd_rn(low, __fmul_rn(width, uniform_at(seed, static_cast<uint64_t>(i))));
    if constexpr (kDType == DType::kF32) {
      out[i] = value;
    } else if constexpr (kDType == DType::kF16) {
      out[i] = __half_as_ushort(__float2half_rn(value));
    } else if constexpr (kDType == DType::kF8E4M3) {
      out[i] = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
    } else if constexpr (kDType == DType::kI8) {
      out[i] =
          static_cast<uint8_t>(static_cast<int8_t>(min(max(__float2int_rn(value), -128), 127)));
    } else {
      out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
    }
  }
}

}  // namespace

Status launch_fill_uniform(int64_t count, DType dtype, uint64_t seed, float low, float high,
                           void* out, cudaStream_t stream) {
  if (Status status = check_fill({count, dtype, seed, low, high}); !status.is_ok()) return status;
  if (count == 0) return Status::ok();
  const float width = high - low;  // the CPU backend's rounded difference
  const auto blocks =
      static_cast<unsigned>(std::clamp<int64_t>((count + kThreads - 1) / kThreads, 1, kMaxBlocks));
  switch (dtype) {
    case DType::kF32:
      fill_uniform_kernel<DType::kF32>
          <<<blocks, kThreads, 0, stream>>>(static_cast<float*>(out), count, seed, low, width);
      break;
    case DType::kF16:
      fill_uniform_kernel<DType::kF16>
          <<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(out), count, seed, low, width);
      break;
    case DType::kBF16:
      fill_uniform_kernel<DType::kBF16>
          <<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(out), count, seed, low, width);
      break;
    case DType::kF8E4M3:
      fill_uniform_kernel<DType::kF8E4M3>
          <<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(out), count, seed, low, width);
      break;
    case DType::kI8:
      fill_uniform_kernel<DType::kI8>
          <<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(out), count, seed, low, width);
      break;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      break;  // refused by check_fill
  }
  return launch_status("fill kernel");
}

}  // namespace specrun::kernels::cuda
