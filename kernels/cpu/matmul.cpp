#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {
namespace {

// Rows handled together against one weight row: the weight row is widened once per group.
constexpr int kRowGroup = 4;
// Activation rows kept hot in cache while a thread sweeps its weight rows.
constexpr int64_t kRowBlock = 64;
// Weight rows per scheduling grain.
constexpr int64_t kFeatureGrain = 16;

template <DType kDType, int kRows>
void dot_group(const float* x, int64_t first_row, const void* weight_row, int64_t in_features,
               float* out, int64_t out_features, int64_t feature, float bias) {
  const float* rows[kRows];
  for (int r = 0; r < kRows; ++r) rows[r] = x + (first_row + r) * in_features;
  float results[kRows];
  dot_rows<kDType, kRows>(rows, weight_row, in_features, results);
  for (int r = 0; r < kRows; ++r) out[(first_row + r) * out_features + feature] = results[r] + bias;
}

template <DType kDType>
void matmul_features(const MatmulParams& params, const float* x, const void* weight,
                     const void* bias, float* out, int64_t feature_begin, int64_t feature_end) {
  const int64_t k = params.in_features;
  const size_t row_bytes = static_cast<size_t>(k) * dtype_size(kDType);
  for (int64_t block = 0; block < params.rows; block += kRowBlock) {
    const int64_t block_end = std::min(params.rows, block + kRowBlock);
    for (int64_t feature = feature_begin; feature < feature_end; ++feature) {
      const void* weight_row = static_cast<const char*>(weight) + feature * row_bytes;
      const float bias_value =
          bias ? load_as_f32(bias, params.bias_dtype, static_cast<size_t>(feature)) : 0.0f;
      int64_t row = block;
      for (; row + kRowGroup <= block_end; row += kRowGroup) {
        dot_group<kDType, kRowGroup>(x, row, weight_row, k, out, params.out_features, feature,
                                     bias_value);
      }
      switch (block_end - row) {
        case 3:
          dot_group<kDType, 3>(x, row, weight_row, k, out, params.out_features, feature,
                               bias_value);
          break;
        case 2:
          dot_group<kDType, 2>(x, row, weight_row, k, out, params.out_features, feature,
                               bias_value);
          break;
        case 1:
          dot_group<kDType, 1>(x, row, weight_row, k, out, params.out_features, feature,
                               bias_value);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

Status matmul(const MatmulParams& params, const float* x, const void* weight, const void* bias,
              float* out, ThreadPool& pool) {
  if (params.rows < 0 || params.in_features <= 0 || params.out_features <= 0) {
    return Status::invalid_argument("matmul: bad shape");
  }
  if (params.rows == 0) return Status::ok();
  auto run = [&](auto kernel) {
    pool.parallel_for(params.out_features, kFeatureGrain, [&](int64_t begin, int64_t end) {
      kernel(params, x, weight, bias, out, begin, end);
    });
  };
  switch (params.weight_dtype) {
    case DType::kF32:
      run(matmul_features<DType::kF32>);
      break;
    case DType::kF16:
      run(matmul_features<DType::kF16>);
      break;
    case DType::kBF16:
      run(matmul_features<DType::kBF16>);
      break;
  }
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
