#include "kernels/cuda/matmul.h"

#include <algorithm>
#include <climits>
#include <cstddef>
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

// How a launch scales a quantized weight's codes (MatmulParams has the grid's layout).
enum class Scaling {
  kNone,   // not quantized
  kRow,    // one scale per output row (per channel or per tensor): applied to the finished sum
  kBlock,  // column blocks of a multiple of 16: applied to each chunk's widened codes
};

struct ScaleGrid {
  const float* scales;  // [grid rows, columns]; null when not quantized
  int64_t block_rows;   // output rows sharing a scale
  int64_t block_cols;   // input columns sharing a scale
  int64_t columns;      // scales per grid row
};

// One weight of a skinny launch: a group's targets share x and one launch, each owning a range of
// blockIdx.x.
struct SkinnySegment {
  const void* weight;    // [out_features, in_features]
  ScaleGrid grid;        // a quantized weight's scales
  const void* bias;      // [out_features] or null
  DType bias_dtype;      // the bias's dtype
  float* out;            // [rows, out_features]
  int64_t out_features;  // weight rows
  int64_t first_block;   // the segment's first blockIdx.x
};

struct SkinnySegments {
  SkinnySegment segment[kMaxMatmulGroup];
  int count;  // segments in use
};

// blockIdx.x: group of kFeatures output features; blockIdx.y: tile of kSkinnyMaxRows rows.
// kRows (1, 2, 4, 8 or 16) is the number of accumulators per feature a thread keeps; the tile's
// actual row count may be smaller, and the extra accumulators stay unused. kFeatures (4 or 8) is
// how many features each x vector a lane loads serves.
//
// The 16-byte path loads kUnroll chunks of each feature's weight before using the first (more
// bytes in flight: a 4096-wide FP8 row is only two chunks per lane), and widens a chunk a quarter
// (4 elements) at a time against 4 elements of every row's x, so registers hold the raw chunks,
// not their widened floats. Either way each (row, feature) accumulates its products in element
// order with fused multiply-adds: the order that batch invariance rests on.
template <DType kDType, int kRows, int kFeatures, bool kVector, Scaling kScaling>
__global__ void __launch_bounds__(kSkinnyThreads)
    skinny_matmul_kernel(const float* __restrict__ x,  // [rows, in_features]
                         const SkinnySegments segments, int64_t rows, int64_t in_features) {
  // This block's weight: the last segment starting at or before it.
  int s = 0;
  while (s + 1 < segments.count && blockIdx.x >= segments.segment[s + 1].first_block) ++s;
  const SkinnySegment& segment = segments.segment[s];
  const void* __restrict__ weight = segment.weight;
  const ScaleGrid grid = segment.grid;
  const void* __restrict__ bias = segment.bias;
  float* __restrict__ out = segment.out;
  const int64_t out_features = segment.out_features;
  using T = typename Stored<kDType>::Type;
  constexpr int kVec = kVector ? kVectorElements<kDType> : 1;  // elements per chunk
  constexpr int kQuarters = kVec / 4;
  constexpr int kUnroll = kVector && kRows == 1 ? 2 : 1;
  constexpr int64_t kStride = kSkinnyWarps * kWarpSize;  // chunks between a lane's steps
  __shared__ float warp_partials[kSkinnyWarps][kRows][kFeatures];

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first_feature =
      (static_cast<int64_t>(blockIdx.x) - segment.first_block) * kFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kSkinnyMaxRows;
  const int tile_rows = static_cast<int>(min(static_cast<int64_t>(kRows), rows - first_row));

  // Features past the end read row first_feature (always valid) and are never stored.
  const T* weight_rows[kFeatures];  // each [in_features]
  // Each feature's row of the scale grid.
  [[maybe_unused]] const float* scale_rows[kFeatures];
#pragma unroll
  for (int f = 0; f < kFeatures; ++f) {
    const int64_t feature = first_feature + f < out_features ? first_feature + f : first_feature;
    weight_rows[f] = static_cast<const T*>(weight) + feature * in_features;
    if constexpr (kScaling != Scaling::kNone) {
      scale_rows[f] = grid.scales + (feature / grid.block_rows) * grid.columns;
    }
  }
  const float* x_rows[kRows];  // each [in_features]
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    x_rows[r] = x + (first_row + (r < tile_rows ? r : 0)) * in_features;
  }

  float acc[kRows][kFeatures];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeatures; ++f) acc[r][f] = 0.0f;
  }

  // Chunk c covers elements [c * kVec, (c + 1) * kVec); this lane owns chunks lane + 32 * (warp +
  // 4 * i), i = 0, 1, ..., visited in increasing order. A warp's 32 loads of one step are 512
  // contiguous bytes of each weight row.
  const int64_t chunks = in_features / kVec;
  for (int64_t c0 = static_cast<int64_t>(warp) * kWarpSize + lane; c0 < chunks;
       c0 += kUnroll * kStride) {
    if constexpr (kVector) {
      uint4 raw[kUnroll][kFeatures];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStride;
        if (c < chunks) {
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) {
            raw[u][f] = __ldg(reinterpret_cast<const uint4*>(weight_rows[f] + c * kVec));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kStride;
        if (c >= chunks) break;
        // A chunk lies inside one column block (blocks are whole multiples of 16 columns).
        [[maybe_unused]] float block_scale[kFeatures];
        if constexpr (kScaling == Scaling::kBlock) {
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) {
            block_scale[f] = __ldg(scale_rows[f] + (c * kVec) / grid.block_cols);
          }
        }
#pragma unroll
        for (int q = 0; q < kQuarters; ++q) {
          // This quarter of every feature's chunk, widened once, then every row's x against it.
          float w[kFeatures][4];
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) {
            // The quarter must be a constant: the unrolled q selects it.
            if (q == 0) widen_quarter<kDType, 0>(raw[u][f], w[f]);
            if constexpr (kQuarters > 1) {
              if (q == 1) widen_quarter<kDType, 1>(raw[u][f], w[f]);
            }
            if constexpr (kQuarters > 2) {
              if (q == 2) widen_quarter<kDType, 2>(raw[u][f], w[f]);
              if (q == 3) widen_quarter<kDType, 3>(raw[u][f], w[f]);
            }
            if constexpr (kScaling == Scaling::kBlock) {
#pragma unroll
              for (int e = 0; e < 4; ++e) w[f][e] = __fmul_rn(w[f][e], block_scale[f]);
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            if (r < tile_rows) {
              const float4 four = __ldg(reinterpret_cast<const float4*>(x_rows[r] + c * kVec) + q);
              const float xv[4] = {four.x, four.y, four.z, four.w};
#pragma unroll
              for (int f = 0; f < kFeatures; ++f) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[r][f] = __fmaf_rn(xv[e], w[f][e], acc[r][f]);
              }
            }
          }
        }
      }
    } else {
      const int64_t c = c0;
      float w[kFeatures];
#pragma unroll
      for (int f = 0; f < kFeatures; ++f) {
        w[f] = Stored<kDType>::widen(weight_rows[f][c]);
        if constexpr (kScaling == Scaling::kBlock) {
          w[f] = __fmul_rn(w[f], __ldg(scale_rows[f] + c / grid.block_cols));
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < tile_rows) {
          const float xv = __ldg(x_rows[r] + c);
#pragma unroll
          for (int f = 0; f < kFeatures; ++f) acc[r][f] = __fmaf_rn(xv, w[f], acc[r][f]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kFeatures; ++f) {
      const float total = warp_sum(acc[r][f]);
      if (lane == 0) warp_partials[warp][r][f] = total;
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows * kFeatures) {
    const int r = threadIdx.x / kFeatures;
    const int f = threadIdx.x % kFeatures;
    const int64_t feature = first_feature + f;
    if (r < tile_rows && feature < out_features) {
      float total = warp_partials[0][r][f];
#pragma unroll
      for (int w = 1; w < kSkinnyWarps; ++w) total = __fadd_rn(total, warp_partials[w][r][f]);
      if constexpr (kScaling == Scaling::kRow) {
        // Not scale_rows[f]: a run-time index would put that array in local memory.
        total = __fmul_rn(total, __ldg(grid.scales + (feature / grid.block_rows) * grid.columns));
      }
      if (bias != nullptr) {
        total = __fadd_rn(total, load_element_f32(bias, segment.bias_dtype, feature));
      }
      out[(first_row + r) * out_features + feature] = total;
    }
  }
}

// Features per block: 8 for 8-bit weights with 2 to 8 rows (a chunk holds 16 codes, so x costs
// 4 bytes of L1 per weight byte per row, halved when each x vector serves 8 features); else 4 (one
// row reads little x, and twice the blocks fill the GPU on narrow matrices). The count changes
// which lane computes a product, not the order of any sum.
constexpr int skinny_features(DType weight_dtype, int rows) {
  return dtype_size(weight_dtype) == 1 && rows > 1 && rows <= 8 ? 8 : kSkinnyFeatures;
}

// What one skinny launch computes: every target's rows against the same x.
struct SkinnyLaunch {
  const MatmulTarget* targets;  // [count]: weights of one dtype and scale layout
  size_t count;                 // targets
  const float* x;               // [rows, in_features]
  int64_t rows;                 // activation rows
  int64_t in_features;          // reduction length
  bool vector;                  // 16-byte loads (skinny_loads_vectors for every target)
};

ScaleGrid scale_grid(const MatmulParams& p, const float* scales) {
  if (!is_quantized(p.weight_dtype)) return ScaleGrid{nullptr, 1, 1, 1};
  return ScaleGrid{scales, p.scale_block_rows, p.scale_block_cols, p.scale_grid_columns()};
}

template <DType kDType, int kRows, Scaling kScaling>
Status launch_skinny_rows(const SkinnyLaunch& launch, cudaStream_t stream) {
  constexpr int kFeatures = skinny_features(kDType, kRows);
  SkinnySegments segments{};
  int64_t blocks = 0;
  for (size_t i = 0; i < launch.count; ++i) {
    const MatmulTarget& t = launch.targets[i];
    SkinnySegment& segment = segments.segment[segments.count++];
    segment = {t.weight, scale_grid(t.params, t.weight_scales),
               t.bias,   t.params.bias_dtype,
               t.out,    t.params.out_features,
               blocks};
    blocks += (t.params.out_features + kFeatures - 1) / kFeatures;
  }
  const int64_t row_tiles = (launch.rows + kSkinnyMaxRows - 1) / kSkinnyMaxRows;
  if (blocks > INT32_MAX || row_tiles > 65535) {
    return Status::unsupported("matmul: shape too large for the skinny kernel's grid");
  }
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(row_tiles));
  if (launch.vector) {
    skinny_matmul_kernel<kDType, kRows, kFeatures, true, kScaling>
        <<<grid, kSkinnyThreads, 0, stream>>>(launch.x, segments, launch.rows, launch.in_features);
  } else {
    skinny_matmul_kernel<kDType, kRows, kFeatures, false, kScaling>
        <<<grid, kSkinnyThreads, 0, stream>>>(launch.x, segments, launch.rows, launch.in_features);
  }
  return launch_status("skinny matmul kernel");
}

template <DType kDType, Scaling kScaling>
Status launch_skinny_typed(const SkinnyLaunch& launch, cudaStream_t stream) {
  const int64_t tile_rows = std::min(launch.rows, kSkinnyMaxRows);
  if (tile_rows <= 1) return launch_skinny_rows<kDType, 1, kScaling>(launch, stream);
  if (tile_rows <= 2) return launch_skinny_rows<kDType, 2, kScaling>(launch, stream);
  if (tile_rows <= 4) return launch_skinny_rows<kDType, 4, kScaling>(launch, stream);
  if (tile_rows <= 8) return launch_skinny_rows<kDType, 8, kScaling>(launch, stream);
  return launch_skinny_rows<kDType, 16, kScaling>(launch, stream);
}

// A quantized weight's scale layout as the kernel applies it.
Scaling scaling_of(const MatmulParams& p) {
  if (!is_quantized(p.weight_dtype)) return Scaling::kNone;
  return p.scale_block_cols >= p.in_features ? Scaling::kRow : Scaling::kBlock;
}

template <DType kDType>
Status launch_skinny_quantized(const SkinnyLaunch& launch, cudaStream_t stream) {
  if (scaling_of(launch.targets[0].params) == Scaling::kRow) {
    return launch_skinny_typed<kDType, Scaling::kRow>(launch, stream);
  }
  return launch_skinny_typed<kDType, Scaling::kBlock>(launch, stream);
}

// Every target of `launch` shares the weight dtype and scaling.
Status launch_skinny(const SkinnyLaunch& launch, cudaStream_t stream) {
  switch (launch.targets[0].params.weight_dtype) {
    case DType::kF32:
      return launch_skinny_typed<DType::kF32, Scaling::kNone>(launch, stream);
    case DType::kF16:
      return launch_skinny_typed<DType::kF16, Scaling::kNone>(launch, stream);
    case DType::kBF16:
      return launch_skinny_typed<DType::kBF16, Scaling::kNone>(launch, stream);
    case DType::kF8E4M3:
      return launch_skinny_quantized<DType::kF8E4M3>(launch, stream);
    case DType::kI8:
      return launch_skinny_quantized<DType::kI8>(launch, stream);
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      break;  // refused by run_matmul_group (GGUF blocks are widened on the way up)
  }
  return Status::invalid_argument("matmul: unknown weight dtype");
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

// Rows [first_row, first_row + tile_rows) of a quantized weight as bf16: code * scale, rounded to
// nearest even, for the tensor-core GEMM. blockIdx.y: the tile's row; threads over the row's
// groups of kVec columns (kVector: 16 codes, with in_features % 16 == 0 and 16-byte aligned codes
// and tile, so a group lies in one scale block).
template <DType kDType, bool kVector>
__global__ void __launch_bounds__(kElementwiseThreads)
    dequantize_tile_kernel(const uint8_t* __restrict__ codes,  // [out_features, in_features]
                           ScaleGrid grid, int64_t first_row, int64_t in_features,
                           uint16_t* __restrict__ tile) {  // [tile_rows, in_features] bf16
  constexpr int kVec = kVector ? 16 : 1;
  const int64_t row = first_row + blockIdx.y;
  const float* scale_row = grid.scales + (row / grid.block_rows) * grid.columns;
  const uint8_t* source = codes + row * in_features;
  uint16_t* target = tile + static_cast<int64_t>(blockIdx.y) * in_features;
  const int64_t groups = in_features / kVec;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kElementwiseThreads + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * kElementwiseThreads) {
    const int64_t column = g * kVec;
    const float scale = __ldg(scale_row + column / grid.block_cols);
    if constexpr (kVector) {
      float values[16];
      load_vector<kDType>(source + column, values);
      uint32_t packed[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t low = __bfloat16_as_ushort(__float2bfloat16_rn(values[2 * i] * scale));
        const uint32_t high = __bfloat16_as_ushort(__float2bfloat16_rn(values[2 * i + 1] * scale));
        packed[i] = low | high << 16;
      }
      uint4* out = reinterpret_cast<uint4*>(target + column);
      out[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      out[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
    } else {
      target[column] =
          __bfloat16_as_ushort(__float2bfloat16_rn(Stored<kDType>::widen(source[column]) * scale));
    }
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

// Output rows of a quantized weight dequantized per GEMM: a bounded bf16 tile, not a bf16 copy of
// the weight (a 70B model's largest matrix would take 470 MB; its head 2 GB).
constexpr int64_t kDequantizedTileElements = int64_t{1} << 24;

// Whole multiples of 128 rows where the tile holds that many (GEMM tiles divide them evenly); at
// most 65535 (the grid's y dimension).
int64_t dequantized_tile_rows(const MatmulParams& p) {
  int64_t rows = kDequantizedTileElements / p.in_features;
  if (rows >= 128) rows = rows / 128 * 128;
  return std::clamp<int64_t>(rows, 1, std::min<int64_t>(p.out_features, 65535));
}

// Where the dequantized tile starts in the scratch: after x rounded to bf16, 256-byte aligned.
size_t dequantized_tile_offset(const MatmulParams& p) {
  const size_t rounded_x =
      static_cast<size_t>(p.rows) * static_cast<size_t>(p.in_features) * sizeof(uint16_t);
  return (rounded_x + 255) / 256 * 256;
}

Status launch_dequantize_tile(const MatmulParams& p, const void* weight, const ScaleGrid& grid,
                              int64_t first_row, int64_t tile_rows, uint16_t* tile,
                              cudaStream_t stream) {
  const auto* codes = static_cast<const uint8_t*>(weight);
  const bool vector = p.in_features % 16 == 0 && is_aligned(weight, 16) && is_aligned(tile, 16);
  const int64_t groups = p.in_features / (vector ? 16 : 1);
  const dim3 blocks(static_cast<unsigned>(std::min<int64_t>(
                        (groups + kElementwiseThreads - 1) / kElementwiseThreads, 1024)),
                    static_cast<unsigned>(tile_rows));
  if (p.weight_dtype == DType::kF8E4M3) {
    if (vector) {
      dequantize_tile_kernel<DType::kF8E4M3, true>
          <<<blocks, kElementwiseThreads, 0, stream>>>(codes, grid, first_row, p.in_features, tile);
    } else {
      dequantize_tile_kernel<DType::kF8E4M3, false>
          <<<blocks, kElementwiseThreads, 0, stream>>>(codes, grid, first_row, p.in_features, tile);
    }
  } else {
    if (vector) {
      dequantize_tile_kernel<DType::kI8, true>
          <<<blocks, kElementwiseThreads, 0, stream>>>(codes, grid, first_row, p.in_features, tile);
    } else {
      dequantize_tile_kernel<DType::kI8, false>
          <<<blocks, kElementwiseThreads, 0, stream>>>(codes, grid, first_row, p.in_features, tile);
    }
  }
  return launch_status("matmul dequantize kernel");
}

Status launch_gemm(const MatmulParams& p, const float* x, const void* weight,
                   const float* weight_scales, const void* bias, float* out,
                   const MatmulContext& context, cudaStream_t stream) {
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
    if (p.weight_dtype == DType::kBF16 || is_quantized(p.weight_dtype)) {
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
  if (is_quantized(p.weight_dtype)) {
    // A quantized weight: a tile of output rows at a time, dequantized to bf16, then multiplied
    // into its columns of out^T (the same ld, offset by the tile's first row).
    const ScaleGrid grid = scale_grid(p, weight_scales);
    auto* tile = reinterpret_cast<uint16_t*>(static_cast<std::byte*>(context.scratch) +
                                             dequantized_tile_offset(p));
    const int64_t tile_rows = dequantized_tile_rows(p);
    for (int64_t first = 0; first < p.out_features; first += tile_rows) {
      const int64_t count = std::min(tile_rows, p.out_features - first);
      if (Status dequantized = launch_dequantize_tile(p, weight, grid, first, count, tile, stream);
          !dequantized.is_ok()) {
        return dequantized;
      }
      status = cublasGemmEx(context.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(count), n, k,
                            &alpha, tile, CUDA_R_16BF, k, activations, CUDA_R_16BF, k, &beta,
                            out + first, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (status != CUBLAS_STATUS_SUCCESS) return cublas_status(status, "matmul: cublasGemmEx");
    }
  } else {
    status = cublasGemmEx(context.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, weight, type,
                          k, activations, type, k, &beta, out, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS) return cublas_status(status, "matmul: cublasGemmEx");
  }
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

int64_t skinny_vector_multiple(DType weight_dtype) {
  return dtype_size(weight_dtype) == 1 ? 16 : 8;
}

bool skinny_loads_vectors(const MatmulParams& params, const float* x, const void* weight) {
  return params.in_features % skinny_vector_multiple(params.weight_dtype) == 0 &&
         is_aligned(x, 16) && is_aligned(weight, 16);
}

bool runs_skinny(const MatmulParams& params, bool batch_invariant) {
  return !uses_gemm(params, batch_invariant);
}

size_t matmul_scratch_bytes(const MatmulParams& params, bool batch_invariant) {
  if (params.rows <= 0 || params.in_features <= 0 || !uses_gemm(params, batch_invariant) ||
      params.weight_dtype == DType::kF32) {
    return 0;
  }
  if (is_quantized(params.weight_dtype)) {
    return dequantized_tile_offset(params) + static_cast<size_t>(dequantized_tile_rows(params)) *
                                                 static_cast<size_t>(params.in_features) *
                                                 sizeof(uint16_t);
  }
  return static_cast<size_t>(params.rows) * static_cast<size_t>(params.in_features) *
         sizeof(uint16_t);
}

Status launch_matmul_group(const float* x, const MatmulTarget* targets, size_t count,
                           const MatmulContext& context, cudaStream_t stream) {
  if (Status status = check_matmul_group(targets, count); !status.is_ok()) return status;
  for (size_t i = 0; i < count; ++i) {
    if (targets[i].params.weight_layout != WeightLayout::kRows) {
      return Status::unsupported("matmul: the CUDA kernels read row-major weights only");
    }
    if (is_block_quantized(targets[i].params.weight_dtype)) {
      return Status::unsupported(
          "matmul: the CUDA kernels do not read GGUF blocks (widened at load)");
    }
  }
  const MatmulParams& first = targets[0].params;
  if (first.rows == 0) return Status::ok();
  // One launch for the group when every target runs the same skinny kernel; else one each.
  bool together = runs_skinny(first, context.batch_invariant);
  const bool vector = skinny_loads_vectors(first, x, targets[0].weight);
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    together = together && t.params.weight_dtype == first.weight_dtype &&
               scaling_of(t.params) == scaling_of(first) &&
               skinny_loads_vectors(t.params, x, t.weight) == vector;
  }
  if (together) {
    return launch_skinny({targets, count, x, first.rows, first.in_features, vector}, stream);
  }
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    Status status =
        uses_gemm(t.params, context.batch_invariant)
            ? launch_gemm(t.params, x, t.weight, t.weight_scales, t.bias, t.out, context, stream)
            : launch_skinny({&t, 1, x, t.params.rows, t.params.in_features,
                             skinny_loads_vectors(t.params, x, t.weight)},
                            stream);
    if (!status.is_ok()) return status;
  }
  return Status::ok();
}

}  // namespace specrun::kernels::cuda
