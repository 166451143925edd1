#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/cpu/matmul_blocks.h"
#include "kernels/cpu/vector_math.h"

// Compiled once per instruction set (kernels/CMakeLists.txt), each copy in its own namespace;
// matmul_dispatch.cpp chooses one at run time.
#if !defined(SPECRUN_MATMUL_VARIANT)
#error "SPECRUN_MATMUL_VARIANT names the instruction set this copy is compiled for"
#endif

namespace specrun::kernels::cpu::SPECRUN_MATMUL_VARIANT {
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
// 8-bit codes take up to four instructions to widen, which compete with the multiply-adds once
// per row group: where a block has more rows than this (a prefill), each group of weight rows is
// widened once for all of them (bitwise the same products). It costs a pass that does not overlap
// the weights' stream with arithmetic, so fewer rows (a decode step, a verification) read the
// codes directly. On the 2-core EPYC, f32 activations: FP8 prefill 1,210 -> 1,725 tokens/s, INT8
// 1,500 -> 1,775 (bf16: 1,767).
constexpr int64_t kWidenAboveRows = 16;

// `widened`: null, or the group's weight rows widened (widen_weights), [kFeatures, k] from
// first_feature on.
template <DType kDType, int kRows, int kFeatures>
void dot_tile(const MatmulParams& params, const float* x, int64_t first_row, const void* weight,
              const float* scales, const void* bias, int64_t first_feature, float* out,
              const float* widened) {
  const int64_t k = params.in_features;
  const float* rows[kRows];
  for (int r = 0; r < kRows; ++r) rows[r] = x + (first_row + r) * k;
  // The features lie in one tile when tiled (matmul_features groups them so).
  const void* weight_rows[kFeatures];
  int64_t column_step = 1;
  for (int f = 0; f < kFeatures; ++f) {
    if (widened != nullptr) {
      weight_rows[f] = widened + f * k;
      continue;
    }
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
  if (widened != nullptr) {
    dot_block<kDType, kRows, kFeatures, true>(rows, weight_rows, k, results, row_scales);
  } else {
    dot_block<kDType, kRows, kFeatures>(rows, weight_rows, k, results, row_scales, column_step);
  }
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
                   float* out, const float* widened) {
  switch (rows) {
    case 4:
      return dot_tile<kDType, 4, kFeatures>(params, x, first_row, weight, scales, bias,
                                            first_feature, out, widened);
    case 3:
      return dot_tile<kDType, 3, kFeatures>(params, x, first_row, weight, scales, bias,
                                            first_feature, out, widened);
    case 2:
      return dot_tile<kDType, 2, kFeatures>(params, x, first_row, weight, scales, bias,
                                            first_feature, out, widened);
    case 1:
      return dot_tile<kDType, 1, kFeatures>(params, x, first_row, weight, scales, bias,
                                            first_feature, out, widened);
    default:
      return;
  }
}

// Activation rows [row_begin, row_end), kRowGroup at a time, against one group of `features`
// (1..kFeatureGroup) weight rows from first_feature on (dot_tile has the rest).
template <DType kDType>
void dot_row_groups(int64_t features, int64_t row_begin, int64_t row_end,
                    const MatmulParams& params, const float* x, const void* weight,
                    const float* scales, const void* bias, int64_t first_feature, float* out,
                    const float* widened) {
  for (int64_t row = row_begin; row < row_end; row += kRowGroup) {
    const int64_t rows = std::min<int64_t>(kRowGroup, row_end - row);
    const auto tile = [&]<int kFeatures>() {
      dot_rows_tile<kDType, kFeatures>(rows, params, x, row, weight, scales, bias, first_feature,
                                       out, widened);
    };
    switch (features) {
      case 4:
        tile.template operator()<4>();
        break;
      case 3:
        tile.template operator()<3>();
        break;
      case 2:
        tile.template operator()<2>();
        break;
      case 1:
        tile.template operator()<1>();
        break;
      default:
        break;
    }
  }
}

// The end of the feature group that starts at `feature`: kFeatureGroup features, never crossing
// a tile of a tiled weight (its rows are one stream).
int64_t feature_group_end(const MatmulParams& params, int64_t feature, int64_t feature_end) {
  int64_t group_end = std::min<int64_t>(feature + kFeatureGroup, feature_end);
  if (params.weight_layout == WeightLayout::kTiled) {
    group_end = std::min(group_end, (feature / kTileRows + 1) * kTileRows);
  }
  return group_end;
}

template <DType kDType>
void matmul_features(const MatmulParams& params, const float* x, const void* weight,
                     const float* scales, const void* bias, float* out, int64_t feature_begin,
                     int64_t feature_end) {
  const int64_t k = params.in_features;
  // 8-bit codes widen once per block of many rows (kWidenAboveRows); 16-bit weights (one or two
  // instructions) are always read directly.
  // Not a std::vector<float>: its members, compiled here with this copy's instructions, would share
  // their names with every other file's (kernels/core/isa_namespace.h).
  std::unique_ptr<float[]> widened;
  for (int64_t block = 0; block < params.rows; block += kRowBlock) {
    const int64_t block_end = std::min(params.rows, block + kRowBlock);
    const bool widen = is_quantized(kDType) && block_end - block > kWidenAboveRows;
    if (widen && widened == nullptr) {
      widened.reset(new float[static_cast<size_t>(kFeatureGroup * k)]);
    }
    for (int64_t feature = feature_begin; feature < feature_end;) {
      const int64_t group_end = feature_group_end(params, feature, feature_end);
      const int64_t features = group_end - feature;
      if (widen) {
        for (int64_t f = 0; f < features; ++f) {
          const RowAddress address =
              row_address(params.weight_layout, feature + f, params.out_features, k);
          widen_weights<kDType>(
              static_cast<const char*>(weight) + address.first * dtype_size(kDType),
              address.column_step, k, widened.get() + f * k);
        }
      }
      dot_row_groups<kDType>(features, block, block_end, params, x, weight, scales, bias, feature,
                             out, widen ? widened.get() : nullptr);
      feature = group_end;
    }
  }
}

// Activation rows per block of the bf16-pair and int8 kernels, rows of `row_bytes` each: as many
// as half an L2 of 1 MiB holds, at least kRowBlock. A block reads each weight group once (8-bit
// codes widen once per block), and the kernels stream the block's rows from L2 whatever their
// number. With 64-row blocks, 8-bit weights with bf16 activations prefilled at 0.81x-0.88x of
// bf16 weights' on the 2-core EPYC (256 tokens of the ~100M model, specbench --activations bf16);
// bf16 weights prefill alike with either.
int64_t rows_per_block(int64_t row_bytes) {
  return std::max<int64_t>(kRowBlock, (int64_t{512} << 10) / row_bytes);
}

// Whether a weight meets activations rounded to bf16 when a call's activations are bf16: bf16
// weights, and 8-bit weights with one scale per row, whose sums of code values times activations
// are scaled once (their codes widen to bf16 exactly: an INT8 code's value has at most 8
// significant bits, an FP8 code's value times 2^-8 at most 4 and an exponent bf16 holds, so they
// are multiplied as bf16 weights are). Block-wise scales multiply the codes first: f32.
bool meets_bf16_activations(const MatmulParams& params) {
  return params.weight_dtype == DType::kBF16 ||
         (is_quantized(params.weight_dtype) && params.scale_block_cols >= params.in_features);
}

// Whether a weight meets activations quantized to int8 when a call's activations are kInt8: INT8
// weights with one scale per row (the sums of code products are scaled once).
bool meets_int8_activations(const MatmulParams& params) {
  return params.weight_dtype == DType::kI8 && params.scale_block_cols >= params.in_features;
}

// The most columns an int8 activation row may have: |sum of code products| <= 127^2 x columns
// stays within int32.
constexpr int64_t kInt8MaxColumns = 133'000;
static_assert(127 * 127 * kInt8MaxColumns <= std::numeric_limits<int32_t>::max());

// Activation rows quantized per token for Activations::kInt8 (quantize_rows_int8).
struct Int8Rows {
  // Not std::vectors: see matmul_features.
  std::unique_ptr<int8_t[]> codes;       // [rows, stride]: round(x * 127 / max |x|), zero past k
  std::unique_ptr<float[]> scales;       // [rows]: max |x| / 127, NaN where a row is not finite
  std::unique_ptr<int32_t[]> code_sums;  // [rows]: each row's codes summed
  int64_t stride = 0;                    // in_features in whole 16-column chunks
};

// Rows of x quantized to int8 per token. A row with a NaN or an infinity has a NaN scale, so its
// results are NaN as f32 arithmetic's would be; a row of zeros has codes and scale zero. Every
// copy computes the same codes: round-to-nearest-even of one f32 product each.
// GCC 12's intrinsic headers trip -Wmaybe-uninitialized in the reductions and _mm512_abs_ps, whose
// "undefined" operands they read (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
Int8Rows quantize_rows_int8(const float* x, int64_t rows, int64_t k) {
  Int8Rows q;
  q.stride = (k + kTileColumns - 1) / kTileColumns * kTileColumns;
  q.codes.reset(new int8_t[static_cast<size_t>(rows * q.stride)]());
  q.scales.reset(new float[static_cast<size_t>(rows)]);
  q.code_sums.reset(new int32_t[static_cast<size_t>(rows)]);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * k;
    int8_t* codes = q.codes.get() + r * q.stride;
    float largest = 0.0f;
    bool finite = true;
    int32_t code_sum = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
    __m512 largest_lanes = _mm512_setzero_ps();
    __mmask16 not_finite = 0;
    for (int64_t i = 0; i < k; i += kLanes) {
      const __mmask16 mask = first_lanes(k - i);
      const __m512 v = _mm512_maskz_loadu_ps(mask, row + i);
      largest_lanes = _mm512_max_ps(largest_lanes, _mm512_abs_ps(v));
      not_finite |= _mm512_fpclass_ps_mask(v, 0x99);  // either NaN, either infinity
    }
    largest = _mm512_reduce_max_ps(largest_lanes);
    finite = not_finite == 0;
    const __m512 inverse = _mm512_set1_ps(largest > 0.0f ? 127.0f / largest : 0.0f);
    __m512i sums = _mm512_setzero_si512();
    for (int64_t i = 0; finite && i < k; i += kLanes) {
      const __mmask16 mask = first_lanes(k - i);
      // The default rounding: to nearest, ties to even, as std::nearbyint.
      const __m512i code =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, row + i), inverse));
      sums = _mm512_add_epi32(sums, code);
      _mm512_mask_cvtsepi32_storeu_epi8(codes + i, mask, code);
    }
    code_sum = _mm512_reduce_add_epi32(sums);
#else
    for (int64_t i = 0; i < k; ++i) {
      largest = std::max(largest, std::fabs(row[i]));
      finite = finite && std::isfinite(row[i]);
    }
    const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
    for (int64_t i = 0; finite && i < k; ++i) {
      const auto code = static_cast<int32_t>(std::nearbyint(row[i] * inverse));
      codes[i] = static_cast<int8_t>(code);
      code_sum += code;
    }
#endif
    q.scales[r] = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
    q.code_sums[r] = finite ? code_sum : 0;
  }
  return q;
}
#pragma GCC diagnostic pop

// Activation rows and whole tiles of weights the int8 kernel takes together: 6 x 4 accumulators,
// four weight registers and one of activations fit the 32 vector registers. Blocks of
// kWidenAboveRows rows or fewer (a decode step, a verification), whose weights come from memory,
// take one tile at a time instead: one stream, as the bf16-pair kernel reads. (Four tiles at a
// time are four streams, and a decode step of the ~100M model took 2.8 ms against 2.0 so:
// `specbench --activations int8 --quantize int8` on the 2-core EPYC.)
constexpr int kInt8RowGroup = 6;
constexpr int kInt8Tiles = 4;

template <int kRows, int kTiles>
void int8_tile(const MatmulParams& params, const Int8Rows& x, int64_t first_row,
               const int8_t* tiles, int64_t features, const float* scales, const void* bias,
               int64_t first_feature, float* out) {
  int32_t sums[kRows][kTiles * kTileRows];
  dot_block_int8<kRows, kTiles>(x.codes.get() + first_row * x.stride, x.stride,
                                x.code_sums.get() + first_row, tiles, x.stride, sums);
  for (int64_t f = 0; f < features; ++f) {
    const int64_t feature = first_feature + f;
    const float weight_scale =
        scales[feature / params.scale_block_rows * params.scale_grid_columns()];
    const float bias_value =
        bias ? load_as_f32(bias, params.bias_dtype, static_cast<size_t>(feature)) : 0.0f;
    for (int r = 0; r < kRows; ++r) {
      const float scale = x.scales[first_row + r] * weight_scale;
      out[(first_row + r) * params.out_features + feature] =
          static_cast<float>(sums[r][f]) * scale + bias_value;
    }
  }
}

// Rows [block, block_end) against kTiles tiles, kInt8RowGroup rows at a time.
template <int kTiles>
void int8_row_groups(const MatmulParams& params, const Int8Rows& x, int64_t block,
                     int64_t block_end, const int8_t* tiles, int64_t features, const float* scales,
                     const void* bias, int64_t first_feature, float* out) {
  for (int64_t row = block; row < block_end; row += kInt8RowGroup) {
    const auto tile = [&]<int kRows>() {
      int8_tile<kRows, kTiles>(params, x, row, tiles, features, scales, bias, first_feature, out);
    };
    switch (std::min<int64_t>(kInt8RowGroup, block_end - row)) {
      case 6:
        tile.template operator()<6>();
        break;
      case 5:
        tile.template operator()<5>();
        break;
      case 4:
        tile.template operator()<4>();
        break;
      case 3:
        tile.template operator()<3>();
        break;
      case 2:
        tile.template operator()<2>();
        break;
      default:
        tile.template operator()<1>();
        break;
    }
  }
}

// matmul_features for INT8 weights with one scale per row and activations quantized to int8
// (Activations::kInt8). Whole tiles of the tiled layout are read where they lie, up to kInt8Tiles
// at a time; features that are not one (a row-major weight, a narrow last tile, a thread's range
// starting inside a tile) are copied into one first, a group of at most a tile's rows at a time.
void int8_features(const MatmulParams& params, const Int8Rows& x, const void* weight,
                   const float* scales, const void* bias, float* out, int64_t feature_begin,
                   int64_t feature_end) {
  const int64_t k = params.in_features;
  std::unique_ptr<int8_t[]> loose;  // [x.stride / 16 chunks, kTileRows, 16]: a tile's layout
  const int64_t block_rows = rows_per_block(x.stride);  // a byte a code
  for (int64_t block = 0; block < params.rows; block += block_rows) {
    const int64_t block_end = std::min(params.rows, block + block_rows);
    for (int64_t feature = feature_begin; feature < feature_end;) {
      const int64_t most_tiles = block_end - block > kWidenAboveRows ? kInt8Tiles : 1;
      const int64_t whole_tiles =
          params.weight_layout == WeightLayout::kTiled && feature % kTileRows == 0
              ? std::min<int64_t>(most_tiles, (feature_end - feature) / kTileRows)
              : 0;
      if (whole_tiles == 0) {
        const int64_t group_end = feature_group_end(params, feature, feature_end);
        const int64_t features = group_end - feature;
        if (loose == nullptr) loose.reset(new int8_t[static_cast<size_t>(kTileRows * x.stride)]);
        for (int64_t f = 0; f < kTileRows; ++f) {
          const RowAddress address =
              f < features ? row_address(params.weight_layout, feature + f, params.out_features, k)
                           : RowAddress{};
          for (int64_t c = 0; c < x.stride; c += kTileColumns) {
            int8_t* chunk = loose.get() + c * kTileRows + f * kTileColumns;
            const int64_t count = f < features ? std::min<int64_t>(kTileColumns, k - c) : 0;
            std::memcpy(
                chunk, static_cast<const int8_t*>(weight) + address.first + c * address.column_step,
                static_cast<size_t>(count));
            std::memset(chunk + count, 0, static_cast<size_t>(kTileColumns - count));
          }
        }
        int8_row_groups<1>(params, x, block, block_end, loose.get(), features, scales, bias,
                           feature, out);
        feature = group_end;
        continue;
      }
      const auto run = [&]<int kTiles>() {
        // A tiled weight's tiles lie one after another.
        const int8_t* tiles =
            static_cast<const int8_t*>(weight) +
            row_address(params.weight_layout, feature, params.out_features, k).first;
        int8_row_groups<kTiles>(params, x, block, block_end, tiles, kTiles * kTileRows, scales,
                                bias, feature, out);
      };
      switch (whole_tiles) {
        case 4:
          run.template operator()<4>();
          break;
        case 3:
          run.template operator()<3>();
          break;
        case 2:
          run.template operator()<2>();
          break;
        default:
          run.template operator()<1>();
          break;
      }
      feature += whole_tiles * kTileRows;
    }
  }
}

// matmul_features for GGUF blocks meeting f32 activations (Activations::kF32): each group of weight
// rows widened to its f32 values, then multiplied as an f32 weight is, bitwise an f32 weight
// holding those values (the reference for the per-block int8 path).
template <DType kQ>
void block_f32_features(const MatmulParams& params, const float* x, const void* weight,
                        const void* bias, float* out, int64_t feature_begin, int64_t feature_end) {
  const int64_t k = params.in_features;
  const auto row_bytes = static_cast<int64_t>(dtype_bytes(kQ, static_cast<uint64_t>(k)));
  // Not a std::vector: see matmul_features.
  const std::unique_ptr<float[]> widened(new float[static_cast<size_t>(kFeatureGroup * k)]);
  MatmulParams widened_params = params;
  widened_params.weight_dtype = DType::kF32;
  for (int64_t feature = feature_begin; feature < feature_end;) {
    const int64_t group_end = std::min<int64_t>(feature + kFeatureGroup, feature_end);
    const int64_t features = group_end - feature;
    for (int64_t f = 0; f < features; ++f) {
      const auto* row = static_cast<const uint8_t*>(weight) + (feature + f) * row_bytes;
      for (int64_t b = 0; b < k / kQuantBlockElements; ++b) {
        block_matmul::widen_block<kQ>(row + b * static_cast<int64_t>(dtype_block_bytes(kQ)),
                                      widened.get() + f * k + b * kQuantBlockElements);
      }
    }
    dot_row_groups<DType::kF32>(features, 0, params.rows, widened_params, x, nullptr, nullptr, bias,
                                feature, out, widened.get());
    feature = group_end;
  }
}

// A block type's two paths, chosen per call.
struct BlockKernels {
  void (*f32)(const MatmulParams&, const float*, const void*, const void*, float*, int64_t,
              int64_t);
  void (*int8)(const MatmulParams&, const block_matmul::BlockRows&, const void*, const void*,
               float*, int64_t, int64_t);
};

template <DType kQ>
constexpr BlockKernels kBlockKernels{block_f32_features<kQ>, block_matmul::block_int8_features<kQ>};

const BlockKernels* block_kernels(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return &kBlockKernels<DType::kQ4_0>;
    case DType::kQ4_1:
      return &kBlockKernels<DType::kQ4_1>;
    case DType::kQ8_0:
      return &kBlockKernels<DType::kQ8_0>;
    default:
      return nullptr;
  }
}

#if defined(SPECRUN_CPU_BF16_PAIRS)
// Activation rows per block of the bf16-pair kernel: 6 x 4 accumulators and 4 weight registers
// fit the 32 vector registers, and verifying 5 drafts (6 rows) reads each weight tile once.
constexpr int kPairRowGroup = 6;

// Where a group of kFeatures weight rows lies as bf16, for the bf16-pair kernel.
template <int kFeatures>
struct PairRows {
  const void* rows[kFeatures];  // each row's column 0
  int64_t column_step = 1;      // as RowAddress's
  // The rows are one whole tile of the tiled layout (rows[f] = rows[0] + f * kTileColumns,
  // column_step = kFeatures): the kernel addresses them from one pointer.
  bool whole_tile = false;
  const float* scales = nullptr;  // [kFeatures] each row's sum times this; null: unscaled (bf16)
  // 8-bit codes: where the kernel also leaves them widened to bf16 (dot_block_bf16_pairs'
  // kKeepWidened), rows keep_stride apart unless whole_tile; null: nowhere.
  uint16_t* keep = nullptr;
  int64_t keep_stride = 0;
};

// The group's rows of a bf16 weight (or of 8-bit codes), where they lie. Four features of the
// tiled layout are one whole tile: the feature loops end every group at a tile's end, so a group
// of four starts at one, and a tile of width four is whole.
template <int kFeatures>
PairRows<kFeatures> stored_rows(const MatmulParams& params, const void* weight,
                                int64_t first_feature) {
  PairRows<kFeatures> rows;
  const auto element_bytes = static_cast<int64_t>(dtype_size(params.weight_dtype));
  for (int f = 0; f < kFeatures; ++f) {
    const RowAddress address = row_address(params.weight_layout, first_feature + f,
                                           params.out_features, params.in_features);
    rows.rows[f] = static_cast<const char*>(weight) + address.first * element_bytes;
    rows.column_step = address.column_step;
  }
  rows.whole_tile = kFeatures == kTileRows && params.weight_layout == WeightLayout::kTiled &&
                    rows.column_step == kFeatures;
  return rows;
}

// kWeights: what the rows hold, bf16 weights or 8-bit codes (dot_block_bf16_pairs).
template <DType kWeights, int kRows, int kFeatures>
void pair_tile(const MatmulParams& params, const uint16_t* x, int64_t x_stride, int64_t first_row,
               const PairRows<kFeatures>& weights, const void* bias, int64_t first_feature,
               float* out) {
  const uint16_t* rows = x + first_row * x_stride;
  float results[kRows][kFeatures];
  const auto dot = [&]<bool kWholeTile, bool kKeep>() {
    dot_block_bf16_pairs<kRows, kFeatures, kWholeTile, kWeights, kKeep>(
        rows, x_stride, weights.rows, params.in_features, results, weights.column_step,
        weights.keep, weights.keep_stride);
  };
  // Only a block's first row group keeps codes widened, and it is whole (quantized_pair_features).
  constexpr bool kMayKeep = kWeights != DType::kBF16 && kRows == kPairRowGroup;
  const bool keep = kMayKeep && weights.keep != nullptr;
  if (kFeatures == kTileRows && weights.whole_tile) {
    if constexpr (kFeatures == kTileRows) {
      keep ? dot.template operator()<true, kMayKeep>() : dot.template operator()<true, false>();
    }
  } else {
    keep ? dot.template operator()<false, kMayKeep>() : dot.template operator()<false, false>();
  }
  for (int f = 0; f < kFeatures; ++f) {
    const float bias_value =
        bias ? load_as_f32(bias, params.bias_dtype, static_cast<size_t>(first_feature + f)) : 0.0f;
    for (int r = 0; r < kRows; ++r) {
      const float sum = weights.scales ? results[r][f] * weights.scales[f] : results[r][f];
      out[(first_row + r) * params.out_features + first_feature + f] = sum + bias_value;
    }
  }
}

template <DType kWeights, int kFeatures>
void pair_rows_tile(int64_t rows, const MatmulParams& params, const uint16_t* x, int64_t x_stride,
                    int64_t first_row, const PairRows<kFeatures>& weights, const void* bias,
                    int64_t first_feature, float* out) {
  switch (rows) {
    case 6:
      return pair_tile<kWeights, 6, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    case 5:
      return pair_tile<kWeights, 5, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    case 4:
      return pair_tile<kWeights, 4, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    case 3:
      return pair_tile<kWeights, 3, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    case 2:
      return pair_tile<kWeights, 2, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    case 1:
      return pair_tile<kWeights, 1, kFeatures>(params, x, x_stride, first_row, weights, bias,
                                               first_feature, out);
    default:
      return;
  }
}

// Every row group of a row block against one group of `features` weight rows; `rows_of(kF)` gives
// the group's PairRows<kF>.
template <DType kWeights, typename RowsOf>
void pair_row_groups(const MatmulParams& params, const uint16_t* x, int64_t x_stride, int64_t block,
                     int64_t block_end, int64_t features, const RowsOf& rows_of, const void* bias,
                     int64_t feature, float* out) {
  const auto each_row_group = [&]<int kFeatures>() {
    const PairRows<kFeatures> weights = rows_of.template operator()<kFeatures>();
    for (int64_t row = block; row < block_end; row += kPairRowGroup) {
      const int64_t rows = std::min<int64_t>(kPairRowGroup, block_end - row);
      pair_rows_tile<kWeights, kFeatures>(rows, params, x, x_stride, row, weights, bias, feature,
                                          out);
    }
  };
  switch (features) {
    case 4:
      return each_row_group.template operator()<4>();
    case 3:
      return each_row_group.template operator()<3>();
    case 2:
      return each_row_group.template operator()<2>();
    case 1:
      return each_row_group.template operator()<1>();
    default:
      return;
  }
}

// matmul_features for bf16 weights and bf16 activations (`x`: rows of x_stride elements).
void pair_features(const MatmulParams& params, const uint16_t* x, int64_t x_stride,
                   const void* weight, const void* bias, float* out, int64_t feature_begin,
                   int64_t feature_end) {
  const int64_t block_rows = rows_per_block(2 * x_stride);
  for (int64_t block = 0; block < params.rows; block += block_rows) {
    const int64_t block_end = std::min(params.rows, block + block_rows);
    for (int64_t feature = feature_begin; feature < feature_end;) {
      const int64_t group_end = feature_group_end(params, feature, feature_end);
      const auto rows_of = [&]<int kFeatures>() {
        return stored_rows<kFeatures>(params, weight, feature);
      };
      pair_row_groups<DType::kBF16>(params, x, x_stride, block, block_end, group_end - feature,
                                    rows_of, bias, feature, out);
      feature = group_end;
    }
  }
}

// matmul_features for INT8 and FP8 weights with one scale per row and bf16 activations: the codes
// widened to bf16 (exactly) and multiplied by the rows of x as bf16 weights are, each sum scaled
// once as dot_block scales it (its code values' sum times scale x kWidenedUnit). The kernel widens
// codes in registers as it reads them; in a block of more than kWidenAboveRows rows, the first
// row group also leaves each feature group widened, laid out as the group's weights are (a whole
// tile as a tile), and the other row groups read that copy as bf16 weights. Both give the same
// bits. (On the 2-core EPYC, three alternating rounds of specbench --activations bf16 --quantize
// fp8,int8: INT8 and FP8 weights prefill at 0.91x-0.97x of bf16 weights' so, at 0.89x-0.92x with
// a widening pass of its own before the first row group.)
template <DType kDType>
void quantized_pair_features(const MatmulParams& params, const uint16_t* x, int64_t x_stride,
                             const void* weight, const float* scales, const void* bias, float* out,
                             int64_t feature_begin, int64_t feature_end) {
  // Not std::vectors: see matmul_features.
  std::unique_ptr<uint16_t[]> group;
  const int64_t block_rows = rows_per_block(2 * x_stride);
  for (int64_t block = 0; block < params.rows; block += block_rows) {
    const int64_t block_end = std::min(params.rows, block + block_rows);
    const bool widen = block_end - block > kWidenAboveRows;
    static_assert(kWidenAboveRows >= kPairRowGroup, "the row group that widens is whole");
    if (widen && group == nullptr) {
      // As the kernel leaves it: four rows of x_stride columns, or a tile of as many.
      group.reset(new uint16_t[static_cast<size_t>(kFeatureGroup * x_stride)]);
    }
    for (int64_t feature = feature_begin; feature < feature_end;) {
      const int64_t group_end = feature_group_end(params, feature, feature_end);
      const int64_t features = group_end - feature;
      float row_scales[kFeatureGroup];
      for (int64_t f = 0; f < features; ++f) {
        row_scales[f] =
            scales[(feature + f) / params.scale_block_rows * params.scale_grid_columns()] *
            kWidenedUnit<kDType>;
      }
      const auto codes_of = [&]<int kFeatures>() {
        PairRows<kFeatures> rows = stored_rows<kFeatures>(params, weight, feature);
        rows.scales = row_scales;
        if (widen) {
          rows.keep = group.get();
          rows.keep_stride = x_stride;
        }
        return rows;
      };
      const int64_t codes_end = widen ? block + kPairRowGroup : block_end;
      pair_row_groups<kDType>(params, x, x_stride, block, codes_end, features, codes_of, bias,
                              feature, out);
      if (widen) {
        const auto widened_of = [&]<int kFeatures>() {
          const PairRows<kFeatures> codes = codes_of.template operator()<kFeatures>();
          PairRows<kFeatures> rows;
          for (int f = 0; f < kFeatures; ++f) {
            rows.rows[f] = group.get() + (codes.whole_tile ? f * kTileColumns : f * x_stride);
          }
          rows.column_step = codes.whole_tile ? kTileRows : 1;
          rows.whole_tile = codes.whole_tile;
          rows.scales = row_scales;
          return rows;
        };
        pair_row_groups<DType::kBF16>(params, x, x_stride, codes_end, block_end, features,
                                      widened_of, bias, feature, out);
      }
      feature = group_end;
    }
  }
}
#endif

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
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      break;  // block_kernels
  }
  return nullptr;
}

}  // namespace

bool multiplies_bf16_pairs() {
#if defined(SPECRUN_CPU_BF16_PAIRS)
  return true;
#else
  return false;
#endif
}

Status matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool,
                    Activations activations) {
  if (Status status = check_matmul_group(targets, count); !status.is_ok()) return status;
  static_assert(kLanes == 16, "check_matmul_group's scale blocks are whole lane groups");
  // Which activations a target's weight meets: int8 codes (kInt8 and INT8 weights with one scale
  // per row), else bf16 (kBF16 or kInt8, and weights that meet them), else f32.
  const auto meets_int8 = [&](const MatmulParams& params) {
    return activations == Activations::kInt8 && meets_int8_activations(params);
  };
  const auto meets_bf16 = [&](const MatmulParams& params) {
    return rounds_to_bf16(activations) && meets_bf16_activations(params) && !meets_int8(params);
  };
  // GGUF blocks meet activations quantized per block but under kF32.
  const auto meets_int8_blocks = [&](const MatmulParams& params) {
    return activations != Activations::kF32 && is_block_quantized(params.weight_dtype);
  };
  int64_t features = 0;  // over the whole group
  // A target meets_bf16: x is rounded to bf16 once per call, for every such target.
  bool rounded = false;
  bool any_meets_int8 = false;         // a target that meets_int8
  bool any_meets_int8_blocks = false;  // a target that meets_int8_blocks
  for (size_t t = 0; t < count; ++t) {
    if (feature_kernel(targets[t].params.weight_dtype) == nullptr &&
        block_kernels(targets[t].params.weight_dtype) == nullptr) {
      return Status::invalid_argument("matmul: unknown weight dtype");
    }
    if (targets[t].params.weight_layout == WeightLayout::kPairTiles) {
      return Status::invalid_argument("matmul: weights in pair tiles are read by the amx copy");
    }
    features += targets[t].params.out_features;
    rounded = rounded || meets_bf16(targets[t].params);
    any_meets_int8 = any_meets_int8 || meets_int8(targets[t].params);
    any_meets_int8_blocks = any_meets_int8_blocks || meets_int8_blocks(targets[t].params);
  }
  const int64_t rows = targets[0].params.rows, in_features = targets[0].params.in_features;
  if (any_meets_int8 && in_features > kInt8MaxColumns) {
    return Status::invalid_argument("matmul: int8 activations take at most 133,000 columns");
  }
  if (rows == 0) return Status::ok();
  // x quantized once per call for the targets that meet int8 activations.
  const Int8Rows x_int8 = any_meets_int8 ? quantize_rows_int8(x, rows, in_features) : Int8Rows{};
  // And per block for the targets of GGUF blocks (check_matmul_group: whole blocks).
  const block_matmul::BlockRows x_blocks =
      any_meets_int8_blocks ? block_matmul::quantize_block_rows(x, rows, in_features)
                            : block_matmul::BlockRows{};
#if defined(SPECRUN_CPU_BF16_PAIRS)
  // As bf16, rows zero-padded to whole 32-column chunks.
  const int64_t x_stride = (in_features + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes);
  // Not a std::vector: see matmul_features.
  const std::unique_ptr<uint16_t[]> x_bf16(
      rounded ? new uint16_t[static_cast<size_t>(rows * x_stride)]() : nullptr);
  for (int64_t r = 0; rounded && r < rows; ++r) {
    // Rounded to nearest even (denormals to zero, as vdpbf16ps reads them anyway).
    for (int64_t i = 0; i < in_features; i += kLanes) {
      const __mmask16 mask = first_lanes(in_features - i);
      const __m256bh rounded_lanes =
          _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + r * in_features + i));
      _mm256_mask_storeu_epi16(x_bf16.get() + r * x_stride + i, mask, (__m256i)rounded_lanes);
    }
  }
#else
  // Rounded to bf16 and widened back: the f32 path then multiplies bf16 by bf16.
  // Not a std::vector: see matmul_features.
  const int64_t rounded_count = rounded ? rows * in_features : 0;
  const std::unique_ptr<float[]> x_rounded(rounded ? new float[static_cast<size_t>(rounded_count)]
                                                   : nullptr);
  for (int64_t i = 0; i < rounded_count; ++i) x_rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
#endif
  // One parallel region over the group's features laid end to end: a range that crosses targets
  // is split at their boundaries, and each part is its target's own kernel over its own rows.
  pool.parallel_for(features, kFeatureGrain, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // the current target's first feature in the group
    for (size_t t = 0; t < count && first < end; ++t) {
      const MatmulTarget& target = targets[t];
      const int64_t last = first + target.params.out_features;
      const int64_t from = std::max(begin, first), to = std::min(end, last);
      const DType dtype = target.params.weight_dtype;
      if (from < to && is_block_quantized(dtype)) {
        const BlockKernels& kernels = *block_kernels(dtype);
        if (meets_int8_blocks(target.params)) {
          kernels.int8(target.params, x_blocks, target.weight, target.bias, target.out,
                       from - first, to - first);
        } else {
          kernels.f32(target.params, x, target.weight, target.bias, target.out, from - first,
                      to - first);
        }
      } else if (from < to && meets_int8(target.params)) {
        int8_features(target.params, x_int8, target.weight, target.weight_scales, target.bias,
                      target.out, from - first, to - first);
      } else if (from < to && meets_bf16(target.params)) {
#if defined(SPECRUN_CPU_BF16_PAIRS)
        if (dtype == DType::kBF16) {
          pair_features(target.params, x_bf16.get(), x_stride, target.weight, target.bias,
                        target.out, from - first, to - first);
        } else {
          (dtype == DType::kI8
               ? quantized_pair_features<DType::kI8>
               : quantized_pair_features<DType::kF8E4M3>)(target.params, x_bf16.get(), x_stride,
                                                          target.weight, target.weight_scales,
                                                          target.bias, target.out, from - first,
                                                          to - first);
        }
#else
        feature_kernel(dtype)(target.params, x_rounded.get(), target.weight, target.weight_scales,
                              target.bias, target.out, from - first, to - first);
#endif
      } else if (from < to) {
        feature_kernel(target.params.weight_dtype)(target.params, x, target.weight,
                                                   target.weight_scales, target.bias, target.out,
                                                   from - first, to - first);
      }
      first = last;
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu::SPECRUN_MATMUL_VARIANT
