#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {
namespace {

// Activation rows and weight rows handled together: a 4 x 4 block of dot products reuses every
// loaded vector four times, keeping the block in registers. Four features are one tile of a
// kTiled weight.
constexpr int kRowGroup = 4;
constexpr int kFeatureGroup = 4;
static_assert(kFeatureGroup == kTileRows, "a feature group reads one tile");
// Activation rows kept hot in cache while a thread sweeps its weight rows.
constexpr int64_t kRowBlock = 64;
// Weight rows per scheduling grain.
constexpr int64_t kFeatureGrain = 16;

template <DType kDType, int kRows, int kFeatures>
void dot_tile(const MatmulParams& params, const float* x, int64_t first_row, const void* weight,
              const float* scales, const void* bias, int64_t first_feature, float* out) {
  const int64_t k = params.in_features;
  const float* rows[kRows];
  for (int r = 0; r < kRows; ++r) rows[r] = x + (first_row + r) * k;
  // The features lie in one tile when tiled (matmul_features groups them so).
  const void* weight_rows[kFeatures];
  int64_t column_step = 1;
  for (int f = 0; f < kFeatures; ++f) {
    const RowAddress address =
        row_address(params.weight_layout, first_feature + f, params.out_features, k);
    weight_rows[f] = static_cast<const char*>(weight) + address.first * dtype_size(kDType);
    column_step = address.column_step;
  }
  RowScales row_scales[kFeatures];
  if constexpr (is_quantized(kDType)) {
    for (int f = 0; f < kFeatures; ++f) {
      row_scales[f] = {
          scales + ((first_feature + f) / params.scale_block_rows) * params.scale_grid_columns(),
          params.scale_block_cols};
    }
  }
  float results[kRows][kFeatures];
  dot_block<kDType, kRows, kFeatures>(rows, weight_rows, k, results, row_scales, column_step);
  for (int f = 0; f < kFeatures; ++f) {
    const float bias_value =
        bias ? load_as_f32(bias, params.bias_dtype, static_cast<size_t>(first_feature + f)) : 0.0f;
    for (int r = 0; r < kRows; ++r) {
      out[(first_row + r) * params.out_features + first_feature + f] = results[r][f] + bias_value;
    }
  }
}

// All row counts 1..kRowGroup for a fixed feature count.
template <DType kDType, int kFeatures>
void dot_rows_tile(int64_t rows, const MatmulParams& params, const float* x, int64_t first_row,
                   const void* weight, const float* scales, const void* bias, int64_t first_feature,
                   float* out) {
  switch (rows) {
    case 4:
      dot_tile<kDType, 4, kFeatures>(params, x, first_row, weight, scales, bias, first_feature,
                                     out);
      break;
    case 3:
      dot_tile<kDType, 3, kFeatures>(params, x, first_row, weight, scales, bias, first_feature,
                                     out);
      break;
    case 2:
      dot_tile<kDType, 2, kFeatures>(params, x, first_row, weight, scales, bias, first_feature,
                                     out);
      break;
    case 1:
      dot_tile<kDType, 1, kFeatures>(params, x, first_row, weight, scales, bias, first_feature,
                                     out);
      break;
    default:
      break;
  }
}

template <DType kDType>
void matmul_features(const MatmulParams& params, const float* x, const void* weight,
                     const float* scales, const void* bias, float* out, int64_t feature_begin,
                     int64_t feature_end) {
  for (int64_t block = 0; block < params.rows; block += kRowBlock) {
    const int64_t block_end = std::min(params.rows, block + kRowBlock);
    for (int64_t feature = feature_begin; feature < feature_end;) {
      // A group of features never crosses a tile of a tiled weight: its rows are one stream.
      int64_t group_end = std::min<int64_t>(feature + kFeatureGroup, feature_end);
      if (params.weight_layout == WeightLayout::kTiled) {
        group_end = std::min(group_end, (feature / kTileRows + 1) * kTileRows);
      }
      const int64_t features = group_end - feature;
      for (int64_t row = block; row < block_end; row += kRowGroup) {
        const int64_t rows = std::min<int64_t>(kRowGroup, block_end - row);
        switch (features) {
          case 4:
            dot_rows_tile<kDType, 4>(rows, params, x, row, weight, scales, bias, feature, out);
            break;
          case 3:
            dot_rows_tile<kDType, 3>(rows, params, x, row, weight, scales, bias, feature, out);
            break;
          case 2:
            dot_rows_tile<kDType, 2>(rows, params, x, row, weight, scales, bias, feature, out);
            break;
          case 1:
            dot_rows_tile<kDType, 1>(rows, params, x, row, weight, scales, bias, feature, out);
            break;
          default:
            break;
        }
      }
      feature = group_end;
    }
  }
}

}  // namespace

namespace {

using FeatureKernel = void (*)(const MatmulParams&, const float*, const void*, const float*,
                               const void*, float*, int64_t, int64_t);

FeatureKernel feature_kernel(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return matmul_features<DType::kF32>;
    case DType::kF16:
      return matmul_features<DType::kF16>;
    case DType::kBF16:
      return matmul_features<DType::kBF16>;
    case DType::kF8E4M3:
      return matmul_features<DType::kF8E4M3>;
    case DType::kI8:
      return matmul_features<DType::kI8>;
  }
  return nullptr;
}

}  // namespace

Status matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool) {
  if (Status status = check_matmul_group(targets, count); !status.is_ok()) return status;
  static_assert(kLanes == 16, "check_matmul_group's scale blocks are whole lane groups");
  int64_t features = 0;  // over the whole group
  for (size_t t = 0; t < count; ++t) {
    if (feature_kernel(targets[t].params.weight_dtype) == nullptr) {
      return Status::invalid_argument("matmul: unknown weight dtype");
    }
    features += targets[t].params.out_features;
  }
  if (targets[0].params.rows == 0) return Status::ok();
  // One parallel region over the group's features laid end to end: a range that crosses targets
  // is split at their boundaries, and each part is its target's own kernel over its own rows.
  pool.parallel_for(features, kFeatureGrain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // the current target's first feature in the group
    for (size_t t = 0; t < count && first < end; ++t) {
      const MatmulTarget& target = targets[t];
      const int64_t last = first + target.params.out_features;
      const int64_t from = std::max(begin, first), to = std::min(end, last);
      if (from < to) {
        feature_kernel(target.params.weight_dtype)(target.params, x, target.weight,
                                                   target.weight_scales, target.bias, target.out,
                                                   from - first, to - first);
      }
      first = last;
    }
  });
  return Status::ok();
}

Status matmul(const MatmulParams& params, const float* x, const void* weight,
              const float* weight_scales, const void* bias, float* out, ThreadPool& pool) {
  const MatmulTarget target{params, weight, weight_scales, bias, out};
  return matmul_group(x, &target, 1, pool);
}

}  // namespace specrun::kernels::cpu
