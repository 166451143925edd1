#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyThreads = kSkinnyWarps * kWarpSize;
// Output features per block. Each lane loads this many weight vectors per step, so every x vector
// it reads serves this many products per element.
constexpr int kSkinnyFeatures = 4;

constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 65536;

// blockIdx.x: group of kSkinnyFeatures output features; blockIdx.y: tile of kSkinnyMaxRows rows.
// kRows (1, 2, 4, 8 or 16) is the number of accumulators per feature a thread keeps; the tile's
// actual row count may be smaller, and the extra accumulators stay unused.
template <DType kDType, int kRows, bool kVector>
__global__ void __launch_bounds__(kSkinnyThreads)
    skinny_matmul_kernel(const float* __restrict__ x,                // [rows, in_features]
                         const void* __restrict__ weight,            // [out_features, in_features]
                         const void* __restrict__ bias,              // [out_features] or null
                         DType bias_dtype, float* __restrict__ out,  // [rows, out_features]
                         int64_t rows, int64_t in_features, int64_t out_features) {
  using T = typename Stored<kDType>::Type;
  constexpr int kVec = kVector ? kVectorElements<kDType> : 1;  // elements per chunk
  __shared__ float warp_partials[kSkinnyWarps][kRows][kSkinnyFeatures];

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first_feature = static_cast<int64_t>(blockIdx.x) * kSkinnyFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kSkinnyMaxRows;
  const int tile_rows = static_cast<int>(min(static_cast<int64_t>(kRows), rows - first_row));

  // Features past the end read row first_feature (always valid) and are never stored.
  const T* weight_rows[kSkinnyFeatures];  // each [in_features]
#pragma unroll
  for (int f = 0; f < kSkinnyFeatures; ++f) {
    const int64_t feature = first_feature + f < out_features ? first_feature + f : first_feature;
    weight_rows[f] = static_cast<const T*>(weight) + feature * in_features;
  }
  const float* x_rows[kRows];  // each [in_features]
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    x_rows[r] = x + (first_row + (r < tile_rows ? r : 0)) * in_features;
  }

  float acc[kRows][kSkinnyFeatures];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kSkinnyFeatures; ++f) acc[r][f] = 0.0f;
  }

  // Chunk c covers elements [c * kVec, (c + 1) * kVec); this lane owns chunks lane + 32 * (warp +
  // 4 * i), i = 0, 1, ..., visited in increasing order. A warp's 32 loads of one step are 512
  // contiguous bytes of each weight row.
  const int64_t chunks = in_features / kVec;
  for (int64_t c = static_cast<int64_t>(warp) * kWarpSize + lane; c < chunks;
       c += kSkinnyWarps * kWarpSize) {
    float w[kSkinnyFeatures][kVec];
#pragma unroll
    for (int f = 0; f < kSkinnyFeatures; ++f) {
      if constexpr (kVector) {
        load_vector<kDType>(weight_rows[f] + c * kVec, w[f]);
      } else {
        w[f][0] = Stored<kDType>::widen(weight_rows[f][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < tile_rows) {
        float xv[kVec];
        if constexpr (kVector) {
#pragma unroll
          for (int i = 0; i < kVec / 4; ++i) {
            const float4 four = __ldg(reinterpret_cast<const float4*>(x_rows[r] + c * kVec) + i);
            xv[4 * i] = four.x;
            xv[4 * i + 1] = four.y;
            xv[4 * i + 2] = four.z;
            xv[4 * i + 3] = four.w;
          }
        } else {
          xv[0] = __ldg(x_rows[r] + c);
        }
#pragma unroll
        for (int f = 0; f < kSkinnyFeatures; ++f) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[r][f] = __fmaf_rn(xv[e], w[f][e], acc[r][f]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kSkinnyFeatures; ++f) {
      const float total = warp_sum(acc[r][f]);
      if (lane == 0) warp_partials[warp][r][f] = total;
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows * kSkinnyFeatures) {
    const int r = threadIdx.x / kSkinnyFeatures;
    const int f = threadIdx.x % kSkinnyFeatures;
    const int64_t feature = first_feature + f;
    if (r < tile_rows && feature < out_features) {
      float total = warp_partials[0][r][f];
#pragma unroll
      for (int w = 1; w < kSkinnyWarps; ++w) total = __fadd_rn(total, warp_partials[w][r][f]);
      if (bias != nullptr) total = __fadd_rn(total, load_element_f32(bias, bias_dtype, feature));
      out[(first_row + r) * out_features + feature] = total;
    }
  }
}

template <DType kDType, int kRows>
void launch_skinny_rows(const MatmulParams& p, const float* x, const void* weight, const void* bias,
                        float* out, bool vector, dim3 grid, cudaStream_t stream) {
  if (vector) {
    skinny_matmul_kernel<kDType, kRows, true><<<grid, kSkinnyThreads, 0, stream>>>(
        x, weight, bias, p.bias_dtype, out, p.rows, p.in_features, p.out_features);
  } else {
    skinny_matmul_kernel<kDType, kRows, false><<<grid, kSkinnyThreads, 0, stream>>>(
        x, weight, bias, p.bias_dtype, out, p.rows, p.in_features, p.out_features);
  }
}

template <DType kDType>
void launch_skinny_typed(const MatmulParams& p, const float* x, const void* weight,
                         const void* bias, float* out, bool vector, dim3 grid,
                         cudaStream_t stream) {
  const int64_t tile_rows = std::min(p.rows, kSkinnyMaxRows);
  if (tile_rows <= 1) {
    launch_skinny_rows<kDType, 1>(p, x, weight, bias, out, vector, grid, stream);
  } else if (tile_rows <= 2) {
    launch_skinny_rows<kDType, 2>(p, x, weight, bias, out, vector, grid, stream);
  } else if (tile_rows <= 4) {
    launch_skinny_rows<kDType, 4>(p, x, weight, bias, out, vector, grid, stream);
  } else if (tile_rows <= 8) {
    launch_skinny_rows<kDType, 8>(p, x, weight, bias, out, vector, grid, stream);
  } else {
    launch_skinny_rows<kDType, 16>(p, x, weight, bias, out, vector, grid, stream);
  }
}

Status launch_skinny(const MatmulParams& p, const float* x, const void* weight, const void* bias,
                     float* out, cudaStream_t stream) {
  const int64_t feature_blocks = (p.out_features + kSkinnyFeatures - 1) / kSkinnyFeatures;
  const int64_t row_tiles = (p.rows + kSkinnyMaxRows - 1) / kSkinnyMaxRows;
  if (feature_blocks > INT32_MAX || row_tiles > 65535) {
    return Status::unsupported("matmul: shape too large for the skinny kernel's grid");
  }
  const dim3 grid(static_cast<unsigned>(feature_blocks), static_cast<unsigned>(row_tiles));
  const bool vector = skinny_loads_vectors(p, x, weight);
  switch (p.weight_dtype) {
    case DType::kF32:
      launch_skinny_typed<DType::kF32>(p, x, weight, bias, out, vector, grid, stream);
      break;
    case DType::kF16:
      launch_skinny_typed<DType::kF16>(p, x, weight, bias, out, vector, grid, stream);
      break;
    case DType::kBF16:
      launch_skinny_typed<DType::kBF16>(p, x, weight, bias, out, vector, grid, stream);
      break;
    case DType::kF8E4M3:
    case DType::kI8:
      return Status::unsupported("matmul: quantized weights are not supported on CUDA yet");
  }
  return launch_status("skinny matmul kernel");
}

// ---- GEMM path
// -----------------------------------------------------------------------------------

unsigned elementwise_blocks(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>(
      (items + kElementwiseThreads - 1) / kElementwiseThreads, 1, kMaxElementwiseBlocks));
}

template <DType kDType>
__device__ __forceinline__ uint16_t round_to_half(float value) {
  if constexpr (kDType == DType::kBF16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  } else {
    return __half_as_ushort(__float2half_rn(value));
  }
}

// x rounded to nearest even in the weight's 16-bit dtype, for the tensor-core GEMM.
template <DType kDType, bool kVector>
__global__ void __launch_bounds__(kElementwiseThreads)
    round_activations_kernel(const float* __restrict__ x,     // [count]
                             uint16_t* __restrict__ rounded,  // [count]
                             int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kElementwiseThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kElementwiseThreads + threadIdx.x;
  if constexpr (kVector) {
    for (int64_t v = first; v < count / 4; v += stride) {
      const float4 four = reinterpret_cast<const float4*>(x)[v];
      const uint32_t low = static_cast<uint32_t>(round_to_half<kDType>(four.x)) |
                           static_cast<uint32_t>(round_to_half<kDType>(four.y)) << 16;
      const uint32_t high = static_cast<uint32_t>(round_to_half<kDType>(four.z)) |
                            static_cast<uint32_t>(round_to_half<kDType>(four.w)) << 16;
      reinterpret_cast<uint2*>(rounded)[v] = make_uint2(low, high);
    }
  } else {
    for (int64_t i = first; i < count; i += stride) rounded[i] = round_to_half<kDType>(x[i]);
  }
}

// out[r, f] += bias[f]
__global__ void __launch_bounds__(kElementwiseThreads)
    add_bias_kernel(float* __restrict__ out,        // [rows, out_features]
                    const void* __restrict__ bias,  // [out_features]
                    DType bias_dtype, int64_t count, int64_t out_features) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kElementwiseThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kElementwiseThreads + threadIdx.x; i < count;
       i += stride) {
    out[i] = __fadd_rn(out[i], load_element_f32(bias, bias_dtype, i % out_features));
  }
}

template <DType kDType>
void launch_round(const float* x, void* rounded, int64_t count, cudaStream_t stream) {
  auto* target = static_cast<uint16_t*>(rounded);
  if (count % 4 == 0 && is_aligned(x, 16) && is_aligned(rounded, 8)) {
    round_activations_kernel<kDType, true>
        <<<elementwise_blocks(count / 4), kElementwiseThreads, 0, stream>>>(x, target, count);
  } else {
    round_activations_kernel<kDType, false>
        <<<elementwise_blocks(count), kElementwiseThreads, 0, stream>>>(x, target, count);
  }
}

Status cublas_status(cublasStatus_t status, const char* what) {
  return Status::error(StatusCode::kDeviceError,
                       std::string(what) + ": " + cublasGetStatusString(status));
}

Status launch_gemm(const MatmulParams& p, const float* x, const void* weight, const void* bias,
                   float* out, const MatmulContext& context, cudaStream_t stream) {
  if (p.rows > INT_MAX || p.in_features > INT_MAX || p.out_features > INT_MAX) {
    return Status::unsupported("matmul: a dimension above 2^31 - 1 for cuBLAS");
  }
  if (context.cublas == nullptr) return Status::invalid_argument("matmul: no cuBLAS handle");
  const int m = static_cast<int>(p.out_features);
  const int n = static_cast<int>(p.rows);
  const int k = static_cast<int>(p.in_features);
  cublasStatus_t status = cublasSetStream(context.cublas, stream);
  if (status != CUBLAS_STATUS_SUCCESS) return cublas_status(status, "cublasSetStream");

  const void* activations = x;
  cudaDataType_t type = CUDA_R_32F;
  if (p.weight_dtype != DType::kF32) {
    const size_t needed = matmul_scratch_bytes(p, false);
    if (context.scratch == nullptr || context.scratch_bytes < needed) {
      return Status::invalid_argument("matmul: scratch smaller than matmul_scratch_bytes");
    }
    if (p.weight_dtype == DType::kBF16) {
      launch_round<DType::kBF16>(x, context.scratch, p.rows * p.in_features, stream);
      type = CUDA_R_16BF;
    } else {
      launch_round<DType::kF16>(x, context.scratch, p.rows * p.in_features, stream);
      type = CUDA_R_16F;
    }
    if (Status launched = launch_status("matmul rounding kernel"); !launched.is_ok()) {
      return launched;
    }
    activations = context.scratch;
  }

  // Column-major view: out^T [out_features x rows] = W [in x out]^T @ x^T [in x rows]. The weight,
  // row-major [out_features, in_features], is the column-major [in x out] matrix with ld = in;
  // x, row-major [rows, in], is column-major [in x rows] with ld = in; out, row-major
  // [rows, out_features], is column-major [out x rows] with ld = out_features.
  const float alpha = 1.0f;
  const float beta = 0.0f;
  status = cublasGemmEx(context.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, weight, type, k,
                        activations, type, k, &beta, out, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS) return cublas_status(status, "matmul: cublasGemmEx");
  if (bias != nullptr) {
    const int64_t count = p.rows * p.out_features;
    add_bias_kernel<<<elementwise_blocks(count), kElementwiseThreads, 0, stream>>>(
        out, bias, p.bias_dtype, count, p.out_features);
    return launch_status("matmul bias kernel");
  }
  return Status::ok();
}

bool uses_gemm(const MatmulParams& params, bool batch_invariant) {
  return params.rows > kSkinnyMaxRows && !batch_invariant;
}

}  // namespace

bool skinny_loads_vectors(const MatmulParams& params, const float* x, const void* weight) {
  return params.in_features % 8 == 0 && is_aligned(x, 16) && is_aligned(weight, 16);
}

bool runs_skinny(const MatmulParams& params, bool batch_invariant) {
  return !uses_gemm(params, batch_invariant);
}

size_t matmul_scratch_bytes(const MatmulParams& params, bool batch_invariant) {
  if (params.rows <= 0 || params.in_features <= 0 || !uses_gemm(params, batch_invariant) ||
      params.weight_dtype == DType::kF32) {
    return 0;
  }
  return static_cast<size_t>(params.rows) * static_cast<size_t>(params.in_features) *
         sizeof(uint16_t);
}

Status launch_matmul(const MatmulParams& params, const float* x, const void* weight,
                     const void* bias, float* out, const MatmulContext& context,
                     cudaStream_t stream) {
  if (params.rows < 0 || params.in_features <= 0 || params.out_features <= 0) {
    return Status::invalid_argument("matmul: bad shape");
  }
  if (params.rows == 0) return Status::ok();
  if (uses_gemm(params, context.batch_invariant)) {
    return launch_gemm(params, x, weight, bias, out, context, stream);
  }
  return launch_skinny(params, x, weight, bias, out, stream);
}

}  // namespace specrun::kernels::cuda
