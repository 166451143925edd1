// Every CPU kernel against a naive double-precision reference, and the batch invariance the
// speculative verifier relies on.
//
// Tolerances: the kernels accumulate in f32 (each step one rounding of relative size
// u = 2^-24), so a length-n reduction is within n * u * sum|terms| of the exact value (the
// classical bound for recursive summation; the lane split only shortens the chains). The tests
// use that bound per element, with the reference in double standing in for the exact value.
#include <gtest/gtest.h>

#include <array>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/core/uniform_hash.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fill.h"
#include "kernels/cpu/logit_edits.h"
#include "kernels/cpu/logprobs.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/vector_math.h"
#include "runtime/sampling/rng.h"
#include "tests/test_support.h"

namespace specrun::kernels::cpu {
namespace {

constexpr double kUnitRoundoff = 0x1.0p-24;

using testing::random_floats;
using testing::store;
using testing::StoredTensor;

class CpuKernels : public ::testing::TestWithParam<int> {
 protected:
  ThreadPool pool_{GetParam()};
};

// `weight` ([out_features, in_features] of `dtype`, row-major) laid out in `layout`.
std::vector<uint8_t> laid_out(WeightLayout layout, const void* weight, int64_t out_features,
                              int64_t in_features, DType dtype) {
  std::vector<uint8_t> packed(stored_weight_bytes(layout, out_features, in_features, dtype), 0xAB);
  EXPECT_TRUE(
      lay_out_weight(layout, weight, out_features, in_features, dtype, packed.data()).is_ok());
  return packed;
}

std::vector<uint8_t> tiled(const void* weight, int64_t out_features, int64_t in_features,
                           DType dtype) {
  return laid_out(WeightLayout::kTiled, weight, out_features, in_features, dtype);
}

// The amx copy of the matmul where this build has it and this CPU runs it, else null.
const MatmulVariant* amx_variant() {
  for (const MatmulVariant& variant : matmul_variants()) {
    if (variant.bf16_pairs_layout == WeightLayout::kPairTiles && variant.supported()) {
      return &variant;
    }
  }
  return nullptr;
}

// The bf16-activation layouts this CPU's copies read, each with the copy that reads it.
std::vector<std::pair<WeightLayout, const MatmulVariant*>> bf16_activation_layouts() {
  std::vector<std::pair<WeightLayout, const MatmulVariant*>> layouts = {
      {WeightLayout::kRows, nullptr}, {WeightLayout::kTiled, nullptr}};
  if (const MatmulVariant* amx = amx_variant()) layouts.emplace_back(WeightLayout::kPairTiles, amx);
  return layouts;
}

TEST_P(CpuKernels, EmbeddingGathersRowsInEveryDtype) {
  const int64_t vocab = 37, dim = 19;
  const std::vector<int32_t> tokens = {0, 36, 5, 5, 17};
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const StoredTensor table = store(random_floats(vocab * dim, 1), dtype);
    std::vector<float> out(tokens.size() * dim);
    ASSERT_TRUE(embedding({static_cast<int64_t>(tokens.size()), vocab, dim, dtype}, tokens.data(),
                          table.data(dtype), out.data(), pool_)
                    .is_ok());
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (int64_t c = 0; c < dim; ++c) {
        EXPECT_EQ(out[t * dim + c], table.floats[tokens[t] * dim + c]);
      }
    }
  }
}

TEST_P(CpuKernels, EmbeddingRejectsTokensOutsideTheVocabulary) {
  const std::vector<float> table(4 * 3, 1.0f);
  std::vector<float> out(3);
  const int32_t too_large[] = {4};
  const int32_t negative[] = {-1};
  EXPECT_EQ(embedding({1, 4, 3, DType::kF32}, too_large, table.data(), out.data(), pool_).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(embedding({1, 4, 3, DType::kF32}, negative, table.data(), out.data(), pool_).code(),
            StatusCode::kOutOfRange);
}

TEST_P(CpuKernels, RmsNormMatchesReference) {
  const int64_t rows = 5, dim = 67;
  const float eps = 1e-5f;
  const std::vector<float> x = random_floats(rows * dim, 2, 3.0f);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const StoredTensor weight = store(random_floats(dim, 3), dtype);
    std::vector<float> out(rows * dim);
    ASSERT_TRUE(
        rmsnorm({rows, dim, eps, dtype}, x.data(), weight.data(dtype), out.data(), pool_).is_ok());
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < dim; ++c) sum += double(x[r * dim + c]) * x[r * dim + c];
      const double scale = 1.0 / std::sqrt(sum / dim + eps);
      for (int64_t c = 0; c < dim; ++c) {
        const double expected = x[r * dim + c] * scale * weight.floats[c];
        // Mean square: dim roundings; then three products.
        const double tolerance = (dim + 4) * kUnitRoundoff * std::abs(expected) + 1e-30;
        EXPECT_NEAR(out[r * dim + c], expected, tolerance) << "row " << r << " col " << c;
      }
    }
  }
}

TEST_P(CpuKernels, MatmulMatchesReferenceForEveryDtypeAndShape) {
  // Shapes cover the 16-lane tail, the 4-row groups and their tails, and the row blocking.
  const int64_t shapes[][3] = {{1, 16, 8}, {3, 37, 21}, {4, 64, 33}, {7, 100, 17}, {70, 48, 5}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], in = shape[1], out_features = shape[2];
    const std::vector<float> x = random_floats(rows * in, 4);
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const StoredTensor weight = store(random_floats(out_features * in, 5), dtype);
      const StoredTensor bias = store(random_floats(out_features, 6), dtype);
      for (const bool with_bias : {false, true}) {
        std::vector<float> out(rows * out_features);
        ASSERT_TRUE(matmul({rows, in, out_features, dtype, dtype}, x.data(), weight.data(dtype),
                           nullptr, with_bias ? bias.data(dtype) : nullptr, out.data(), pool_)
                        .is_ok());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t f = 0; f < out_features; ++f) {
            double expected = with_bias ? bias.floats[f] : 0.0;
            double magnitude = std::abs(expected);
            for (int64_t i = 0; i < in; ++i) {
              const double term = double(x[r * in + i]) * weight.floats[f * in + i];
              expected += term;
              magnitude += std::abs(term);
            }
            const double tolerance = (in + 2) * kUnitRoundoff * magnitude;
            ASSERT_NEAR(out[r * out_features + f], expected, tolerance)
                << "shape " << rows << "x" << in << "x" << out_features << " dtype "
                << dtype_name(dtype) << " row " << r << " feature " << f;
          }
        }
      }
    }
  }
}

TEST_P(CpuKernels, MatmulIsBatchInvariantBitwise) {
  // Each row alone, and the rows inside batches of every size, give identical bits.
  const int64_t rows = 13, in = 83, out_features = 29;
  const std::vector<float> x = random_floats(rows * in, 7);
  const StoredTensor weight = store(random_floats(out_features * in, 8), DType::kBF16);
  std::vector<float> all(rows * out_features);
  ASSERT_TRUE(matmul({rows, in, out_features, DType::kBF16, DType::kF32}, x.data(),
                     weight.data(DType::kBF16), nullptr, nullptr, all.data(), pool_)
                  .is_ok());
  for (int64_t batch = 1; batch <= rows; ++batch) {
    for (int64_t first = 0; first + batch <= rows; first += batch) {
      std::vector<float> part(batch * out_features);
      ASSERT_TRUE(matmul({batch, in, out_features, DType::kBF16, DType::kF32},
                         x.data() + first * in, weight.data(DType::kBF16), nullptr, nullptr,
                         part.data(), pool_)
                      .is_ok());
      ASSERT_EQ(0, std::memcmp(part.data(), all.data() + first * out_features,
                               part.size() * sizeof(float)))
          << "rows " << first << ".." << first + batch;
    }
  }
}

// ---- quantized weights -------------------------------------------------------------------------

// A quantized weight for the tests: random codes of `dtype` and a scale grid of blocks
// block_rows x block_cols, and the weights they stand for (code value times scale, rounded to f32
// as the kernel rounds it).
struct QuantizedTensor {
  std::vector<uint8_t> codes;  // [rows, columns]
  std::vector<float> scales;   // the grid
  std::vector<float> weights;  // [rows, columns] what the kernel multiplies by
  MatmulParams params(int64_t batch) const { return params_with(batch); }
  MatmulParams params_with(int64_t batch) const {
    return {batch, columns, rows, dtype, DType::kF32, block_rows, block_cols};
  }
  DType dtype;
  int64_t rows, columns, block_rows, block_cols;
};

QuantizedTensor quantized(DType dtype, int64_t rows, int64_t columns, int64_t block_rows,
                          int64_t block_cols, uint64_t seed) {
  QuantizedTensor t{{}, {}, {}, dtype, rows, columns, block_rows, block_cols};
  Rng rng(seed);
  const MatmulParams p = t.params(1);
  const int64_t grid_rows = (rows + block_rows - 1) / block_rows;
  for (int64_t i = 0; i < grid_rows * p.scale_grid_columns(); ++i) {
    t.scales.push_back(static_cast<float>(0.001 + 0.02 * rng.uniform()));
  }
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t i = 0; i < columns; ++i) {
      uint8_t code;
      if (dtype == DType::kI8) {
        code = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(rng.next() % 255) - 127));
      } else {
        do code = static_cast<uint8_t>(rng.next() % 256);
        while ((code & 0x7f) == 0x7f);  // no NaN codes
      }
      t.codes.push_back(code);
      const float scale = t.scales[(o / block_rows) * p.scale_grid_columns() + i / block_cols];
      const float value =
          dtype == DType::kI8 ? static_cast<float>(static_cast<int8_t>(code)) : f8e4m3_to_f32(code);
      t.weights.push_back(value * scale);
    }
  }
  return t;
}

TEST(Fp8, EveryCodeDecodesExactlyAndRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 7;
    const float value = f8e4m3_to_f32(static_cast<uint8_t>(code));
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      EXPECT_EQ(f32_to_f8e4m3(value) & 0x7f, 0x7f);
      continue;
    }
    // E4M3: bias 7; exponent 0 is subnormal (mantissa / 8 * 2^-6).
    const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                           : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
    EXPECT_EQ(value, sign ? -magnitude : magnitude) << "code " << code;
    EXPECT_EQ(f32_to_f8e4m3(value), sign && magnitude == 0 ? 0x80 : code) << "code " << code;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f32_to_f8e4m3(1e9f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_f8e4m3(-500.0f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);     // halfway between 1 and 1.125: to even (1)
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);     // halfway between 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(f32_to_f8e4m3(0x1.0p-10f), 0x00);  // half the smallest subnormal: to even (0)
  EXPECT_EQ(f32_to_f8e4m3(0x1.8p-10f), 0x01);  // three quarters: up
}

TEST(Fp8, RoundsEveryValueToTheNearestCodeTiesToEven) {
  // Against the definition, by search over the 127 finite magnitudes: the nearest, a tie to the
  // code with an even mantissa, 448 and beyond saturating. At every midpoint between neighbouring
  // codes and one f32 step either side, and at values of every magnitude from 2^-12 to 2^9.
  const auto nearest = [](float value) {
    const float magnitude = std::fabs(value);
    int best = 0;
    for (int code = 1; code < 0x7f; ++code) {
      const double distance = std::fabs(double(f8e4m3_to_f32(uint8_t(code))) - magnitude);
      const double best_distance = std::fabs(double(f8e4m3_to_f32(uint8_t(best))) - magnitude);
      if (distance < best_distance || (distance == best_distance && code % 2 == 0)) best = code;
    }
    if (magnitude >= kF8E4M3Max) best = 0x7e;
    return static_cast<uint8_t>((std::signbit(value) ? 0x80 : 0) | best);
  };
  std::vector<float> values;
  for (int code = 0; code < 0x7e; ++code) {
    const float midpoint = static_cast<float>(
        (double(f8e4m3_to_f32(uint8_t(code))) + double(f8e4m3_to_f32(uint8_t(code + 1)))) / 2);
    for (const float v :
         {std::nextafter(midpoint, 0.0f), midpoint, std::nextafter(midpoint, 1000.0f)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::ldexp(mantissa(rng), static_cast<int>(rng() % 22) - 12);
    values.push_back(rng() % 2 ? v : -v);
  }
  values.push_back(std::numeric_limits<float>::denorm_min());
  values.push_back(std::numeric_limits<float>::infinity());
  for (const float value : values) {
    ASSERT_EQ(f32_to_f8e4m3(value), nearest(value)) << std::hexfloat << value;
  }
}

TEST_P(CpuKernels, QuantizedMatmulMatchesReference) {
  // Every scale layout: per output channel, per tensor, 128 x 128 blocks (the block-wise FP8
  // checkpoints') and small 2 x 32 blocks; lengths with and without a tail.
  struct Layout {
    int64_t block_rows, block_cols;
  };
  for (const DType dtype : {DType::kI8, DType::kF8E4M3}) {
    for (const auto& shape :
         std::vector<std::array<int64_t, 3>>{{1, 64, 7}, {5, 83, 9}, {17, 300, 130}}) {
      const int64_t rows = shape[0], in = shape[1], out_features = shape[2];
      for (const Layout layout :
           {Layout{1, in}, Layout{out_features, in}, Layout{128, 128}, Layout{2, 32}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" +
                     std::to_string(in) + "x" + std::to_string(out_features) + " blocks " +
                     std::to_string(layout.block_rows) + "x" + std::to_string(layout.block_cols));
        const QuantizedTensor w =
            quantized(dtype, out_features, in, layout.block_rows, layout.block_cols, 31 + in);
        const std::vector<float> x = random_floats(rows * in, 32);
        const std::vector<float> bias = random_floats(out_features, 33);
        std::vector<float> out(rows * out_features);
        ASSERT_TRUE(matmul(w.params(rows), x.data(), w.codes.data(), w.scales.data(), bias.data(),
                           out.data(), pool_)
                        .is_ok());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t f = 0; f < out_features; ++f) {
            double expected = bias[f], magnitude = std::abs(bias[f]);
            for (int64_t i = 0; i < in; ++i) {
              const double term = double(x[r * in + i]) * w.weights[f * in + i];
              expected += term;
              magnitude += std::abs(term);
            }
            ASSERT_NEAR(out[r * out_features + f], expected, (in + 2) * kUnitRoundoff * magnitude)
                << "row " << r << " feature " << f;
          }
        }
      }
    }
  }
}

TEST_P(CpuKernels, QuantizedMatmulWidensEveryCodeExactly) {
  // Every code but NaN, each at every position of a 16-code vector across the rows (rotations),
  // against one-hot activations: each output is one code times its row's scale (a power of two,
  // so exact), in every copy of the kernel, both layouts and f32 and bf16 activations (one-hot
  // rows are exact in bf16). Where the kernels have VBMI, codes of whole tiles widen by table
  // lookups: FP8 to bf16 pairs and to f32, INT8 to bf16 pairs (up to 4 rows); 254 rows also widen a
  // block's codes once for its other row groups.
  for (const DType dtype : {DType::kI8, DType::kF8E4M3}) {
    std::vector<uint8_t> codes_used;
    for (int code = 0; code < 256; ++code) {
      const bool nan = dtype == DType::kF8E4M3 && (code & 0x7f) == 0x7f;
      if (!nan && !(dtype == DType::kI8 && code == 0x80)) codes_used.push_back(uint8_t(code));
    }
    const int64_t in = static_cast<int64_t>(codes_used.size()), out_features = 5;
    std::vector<uint8_t> codes(static_cast<size_t>(out_features * in));
    std::vector<float> scales(static_cast<size_t>(out_features));
    for (int64_t f = 0; f < out_features; ++f) {
      scales[f] = std::ldexp(1.0f, static_cast<int>(f) - 2);
      for (int64_t i = 0; i < in; ++i) codes[f * in + i] = codes_used[(i + 3 * f) % in];
    }
    std::vector<float> identity(static_cast<size_t>(in * in), 0.0f);
    for (int64_t i = 0; i < in; ++i) identity[i * in + i] = 1.0f;
    const std::vector<uint8_t> packed = tiled(codes.data(), out_features, in, dtype);
    for (const MatmulVariant& variant : matmul_variants()) {
      if (!variant.supported()) continue;
      for (const auto& [layout, activations] :
           {std::pair{WeightLayout::kRows, Activations::kF32},
            std::pair{WeightLayout::kTiled, Activations::kF32},
            std::pair{WeightLayout::kRows, Activations::kBF16},
            std::pair{WeightLayout::kTiled, Activations::kBF16}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(variant.name) +
                     (activations == Activations::kBF16 ? " bf16" : " f32"));
        MatmulParams params{in, in, out_features, dtype, DType::kF32, 1, in};
        params.weight_layout = layout;
        const void* weight = layout == WeightLayout::kTiled
                                 ? static_cast<const void*>(packed.data())
                                 : static_cast<const void*>(codes.data());
        // All rows in one call (blocks that widen their codes once), and 16 at a time (the codes
        // read directly, as a decode or a verification reads them); the same results.
        std::vector<float> out(static_cast<size_t>(in * out_features));
        ASSERT_TRUE(matmul(params, identity.data(), weight, scales.data(), nullptr, out.data(),
                           pool_, activations, &variant)
                        .is_ok());
        std::vector<float> in_sixteens(out.size());
        for (int64_t first = 0; first < in; first += 16) {
          MatmulParams slice = params;
          slice.rows = std::min<int64_t>(16, in - first);
          ASSERT_TRUE(matmul(slice, identity.data() + first * in, weight, scales.data(), nullptr,
                             in_sixteens.data() + first * out_features, pool_, activations,
                             &variant)
                          .is_ok());
        }
        ASSERT_EQ(0, std::memcmp(out.data(), in_sixteens.data(), out.size() * sizeof(float)));
        for (int64_t i = 0; i < in; ++i) {
          for (int64_t f = 0; f < out_features; ++f) {
            const uint8_t code = codes[f * in + i];
            const float value = dtype == DType::kI8 ? static_cast<float>(static_cast<int8_t>(code))
                                                    : f8e4m3_to_f32(code);
            ASSERT_EQ(out[i * out_features + f], value * scales[f])
                << "code " << int(code) << " feature " << f;
          }
        }
      }
    }
  }
}

TEST_P(CpuKernels, QuantizedMatmulIsBatchInvariantBitwise) {
  // 37 rows: a block of more than 16 rows widens the codes once for all its row groups, which
  // must give the bits of each row alone (read directly); per-row and 16 x 16 block scales, both
  // layouts.
  const int64_t rows = 37, in = 96, out_features = 21;
  const std::vector<float> x = random_floats(rows * in, 34);
  for (const DType dtype : {DType::kI8, DType::kF8E4M3}) {
    for (const int64_t block : {int64_t{0}, int64_t{16}}) {
      const QuantizedTensor w = block == 0 ? quantized(dtype, out_features, in, 1, in, 35)
                                           : quantized(dtype, out_features, in, 16, 16, 36);
      const std::vector<uint8_t> packed = tiled(w.codes.data(), out_features, in, dtype);
      for (const WeightLayout layout : {WeightLayout::kRows, WeightLayout::kTiled}) {
        const void* codes = layout == WeightLayout::kTiled
                                ? static_cast<const void*>(packed.data())
                                : static_cast<const void*>(w.codes.data());
        MatmulParams params = w.params(rows);
        params.weight_layout = layout;
        std::vector<float> all(rows * out_features);
        ASSERT_TRUE(
            matmul(params, x.data(), codes, w.scales.data(), nullptr, all.data(), pool_).is_ok());
        params.rows = 1;
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> one(out_features);
          ASSERT_TRUE(
              matmul(params, x.data() + r * in, codes, w.scales.data(), nullptr, one.data(), pool_)
                  .is_ok());
          ASSERT_EQ(
              0, std::memcmp(one.data(), all.data() + r * out_features, one.size() * sizeof(float)))
              << dtype_name(dtype) << " block " << block << " row " << r;
        }
      }
    }
  }
}

TEST_P(CpuKernels, QuantizedMatmulRefusesMissingOrMisshapedScales) {
  const QuantizedTensor w = quantized(DType::kI8, 4, 64, 1, 64, 36);
  const std::vector<float> x(64, 1.0f);
  std::vector<float> out(4);
  EXPECT_EQ(
      matmul(w.params(1), x.data(), w.codes.data(), nullptr, nullptr, out.data(), pool_).code(),
      StatusCode::kInvalidArgument);
  MatmulParams odd = w.params(1);
  odd.scale_block_cols = 24;  // not whole 16-column groups
  EXPECT_EQ(
      matmul(odd, x.data(), w.codes.data(), w.scales.data(), nullptr, out.data(), pool_).code(),
      StatusCode::kInvalidArgument);
  // Embeddings and norms stay unquantized.
  const int32_t token[] = {0};
  EXPECT_EQ(embedding({1, 4, 64, DType::kI8}, token, w.codes.data(), out.data(), pool_).code(),
            StatusCode::kUnsupported);
}

TEST(CpuKernelsThreads, MatmulIsThreadCountInvariantBitwise) {
  const int64_t rows = 9, in = 130, out_features = 75;
  const std::vector<float> x = random_floats(rows * in, 9);
  const StoredTensor weight = store(random_floats(out_features * in, 10), DType::kF16);
  std::vector<float> reference;
  for (const int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    std::vector<float> out(rows * out_features);
    ASSERT_TRUE(matmul({rows, in, out_features, DType::kF16, DType::kF32}, x.data(),
                       weight.data(DType::kF16), nullptr, nullptr, out.data(), pool)
                    .is_ok());
    if (reference.empty()) reference = out;
    ASSERT_EQ(0, std::memcmp(out.data(), reference.data(), out.size() * sizeof(float)))
        << threads << " threads";
  }
}

// Naive RoPE in double for one head.
void reference_rope(std::vector<double>& head, int64_t position, const std::vector<float>& inv_freq,
                    RopeStyle style) {
  const size_t half = head.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    const size_t a = style == RopeStyle::kRotateHalf ? i : 2 * i;
    const size_t b = style == RopeStyle::kRotateHalf ? i + half : 2 * i + 1;
    const double angle = position * double(inv_freq[i]);
    const double x1 = head[a], x2 = head[b];
    head[a] = x1 * std::cos(angle) - x2 * std::sin(angle);
    head[b] = x2 * std::cos(angle) + x1 * std::sin(angle);
  }
}

TEST_P(CpuKernels, RopeMatchesReferenceInBothStyles) {
  const int64_t tokens = 4, heads = 3, kv_heads = 1, head_dim = 8;
  const std::vector<int32_t> positions = {0, 1, 17, 4095};
  std::vector<float> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / head_dim));
  }
  for (const RopeStyle style : {RopeStyle::kRotateHalf, RopeStyle::kInterleaved}) {
    std::vector<float> q = random_floats(tokens * heads * head_dim, 11);
    std::vector<float> k = random_floats(tokens * kv_heads * head_dim, 12);
    const std::vector<float> q_in = q, k_in = k;
    ASSERT_TRUE(rope({tokens, heads, kv_heads, head_dim, style}, positions.data(), inv_freq.data(),
                     q.data(), k.data(), pool_)
                    .is_ok());
    auto check = [&](const std::vector<float>& in, const std::vector<float>& out, int64_t count) {
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < count; ++h) {
          const size_t base = (t * count + h) * head_dim;
          std::vector<double> head(in.begin() + base, in.begin() + base + head_dim);
          reference_rope(head, positions[t], inv_freq, style);
          for (int64_t c = 0; c < head_dim; ++c) {
            // cos/sin rounded to f32, then two products and a sum.
            EXPECT_NEAR(out[base + c], head[c], 8 * kUnitRoundoff * 2.0) << "token " << t;
          }
        }
      }
    };
    check(q_in, q, heads);
    check(k_in, k, kv_heads);
  }
}

TEST_P(CpuKernels, RopeStylesAgreeOnPermutedChannels) {
  // Interleaved RoPE on channels (x0, y0, x1, y1, ...) equals rotate-half RoPE on
  // (x0, x1, ..., y0, y1, ...): the two conventions differ only in the weight layout.
  const int64_t head_dim = 16, half = head_dim / 2;
  const int32_t positions[] = {123};
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(0.7f, static_cast<float>(i));
  const std::vector<float> interleaved_in = random_floats(head_dim, 13);
  std::vector<float> rotate_half_in(head_dim);
  for (int64_t i = 0; i < half; ++i) {
    rotate_half_in[i] = interleaved_in[2 * i];
    rotate_half_in[i + half] = interleaved_in[2 * i + 1];
  }
  std::vector<float> a = interleaved_in, a_k = interleaved_in;
  std::vector<float> b = rotate_half_in, b_k = rotate_half_in;
  ASSERT_TRUE(rope({1, 1, 1, head_dim, RopeStyle::kInterleaved}, positions, inv_freq.data(),
                   a.data(), a_k.data(), pool_)
                  .is_ok());
  ASSERT_TRUE(rope({1, 1, 1, head_dim, RopeStyle::kRotateHalf}, positions, inv_freq.data(),
                   b.data(), b_k.data(), pool_)
                  .is_ok());
  for (int64_t i = 0; i < half; ++i) {
    EXPECT_EQ(a[2 * i], b[i]);
    EXPECT_EQ(a[2 * i + 1], b[i + half]);
  }
}

TEST_P(CpuKernels, RopeRejectsOddHeadDim) {
  std::vector<float> q(3), k(3);
  const int32_t positions[] = {0};
  const float inv_freq[] = {1.0f};
  EXPECT_EQ(
      rope({1, 1, 1, 3, RopeStyle::kRotateHalf}, positions, inv_freq, q.data(), k.data(), pool_)
          .code(),
      StatusCode::kInvalidArgument);
}

// A paged cache with scattered blocks for several sequences, and naive attention over the same
// keys and values laid out contiguously.
struct PagedAttentionCase {
  int64_t heads = 4, kv_heads = 2, head_dim = 12, block_size = 4;
  std::vector<int64_t> new_tokens = {3, 1, 6};
  std::vector<int64_t> context = {9, 14, 6};
  int64_t window = 0;
  DType cache_dtype = DType::kF32;  // bf16: the cache holds the random values rounded to bf16
  // Key gaps (Backend::attention): per query token, [begin, end) positions it skips; empty: none.
  std::vector<std::pair<int32_t, int32_t>> gaps = {};
};

// The values as a cache of `dtype` stores them (bf16: rounded, in uint16_t bits), and in place the
// values that cache holds, widened back to f32 for the reference.
std::vector<uint8_t> as_cache(std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBF16) {
      const uint16_t bits = f32_to_bf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
      values[i] = bf16_to_f32(bits);
    } else {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    }
  }
  return bytes;
}

// Checks attention against the double-precision reference; `result`, if given, receives the
// output.
void check_paged_attention(const PagedAttentionCase& c, ThreadPool& pool,
                           std::vector<float>* result = nullptr) {
  const int64_t seqs = static_cast<int64_t>(c.context.size());
  int64_t max_blocks = 0, total_blocks = 0;
  for (const int64_t length : c.context) {
    max_blocks = std::max(max_blocks, (length + c.block_size - 1) / c.block_size);
    total_blocks += (length + c.block_size - 1) / c.block_size;
  }
  total_blocks += 3;  // unused blocks in the pool
  // Hand out blocks in a scrambled order so that tables are not contiguous.
  std::vector<int32_t> free_blocks(total_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  Rng rng(21);
  for (size_t i = free_blocks.size() - 1; i > 0; --i) {
    std::swap(free_blocks[i], free_blocks[rng.next() % (i + 1)]);
  }
  const int64_t row = c.kv_heads * c.head_dim;
  std::vector<float> k_cache = random_floats(total_blocks * c.block_size * row, 22);
  std::vector<float> v_cache = random_floats(total_blocks * c.block_size * row, 23);
  const std::vector<uint8_t> k_stored = as_cache(k_cache, c.cache_dtype);
  const std::vector<uint8_t> v_stored = as_cache(v_cache, c.cache_dtype);
  std::vector<int32_t> tables(seqs * max_blocks, 0);
  std::vector<int32_t> query_start = {0};
  size_t next_free = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t b = 0; b < (c.context[s] + c.block_size - 1) / c.block_size; ++b) {
      tables[s * max_blocks + b] = free_blocks[next_free++];
    }
    query_start.push_back(query_start.back() + static_cast<int32_t>(c.new_tokens[s]));
  }
  const int64_t tokens = query_start.back();
  const std::vector<float> q = random_floats(tokens * c.heads * c.head_dim, 24);
  std::vector<int32_t> lengths(c.context.begin(), c.context.end());
  std::vector<float> out(tokens * c.heads * c.head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  std::vector<int32_t> gaps;
  for (const auto& [begin, end] : c.gaps) gaps.insert(gaps.end(), {begin, end});
  ASSERT_TRUE(attention({seqs, tokens, c.heads, c.kv_heads, c.head_dim, c.block_size, max_blocks,
                         scale, c.window, c.cache_dtype},
                        q.data(), k_stored.data(), v_stored.data(), query_start.data(),
                        lengths.data(), tables.data(), gaps.empty() ? nullptr : gaps.data(),
                        out.data(), pool)
                  .is_ok());
  if (result != nullptr) *result = out;

  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t i = 0; i < c.new_tokens[s]; ++i) {
      const int64_t token = query_start[s] + i;
      const int64_t position = c.context[s] - c.new_tokens[s] + i;
      // The positions the token reads: all up to its own but its gap's, the latest `window`.
      std::vector<int64_t> attended;
      for (int64_t p = 0; p <= position; ++p) {
        if (c.gaps.empty() || p < c.gaps[token].first || p >= c.gaps[token].second) {
          attended.push_back(p);
        }
      }
      if (c.window > 0 && static_cast<int64_t>(attended.size()) > c.window) {
        attended.erase(attended.begin(), attended.end() - c.window);
      }
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t kv_head = h / (c.heads / c.kv_heads);
        const float* query = &q[(token * c.heads + h) * c.head_dim];
        std::vector<double> scores;
        for (const int64_t p : attended) {
          const int64_t slot =
              tables[s * max_blocks + p / c.block_size] * c.block_size + p % c.block_size;
          double dot = 0.0;
          for (int64_t d = 0; d < c.head_dim; ++d) {
            dot += double(query[d]) * k_cache[slot * row + kv_head * c.head_dim + d];
          }
          scores.push_back(dot * scale);
        }
        const double max_score = *std::max_element(scores.begin(), scores.end());
        double total = 0.0;
        for (double& score : scores) total += (score = std::exp(score - max_score));
        for (int64_t d = 0; d < c.head_dim; ++d) {
          double expected = 0.0;
          for (size_t k = 0; k < attended.size(); ++k) {
            const int64_t p = attended[k];
            const int64_t slot =
                tables[s * max_blocks + p / c.block_size] * c.block_size + p % c.block_size;
            expected += scores[k] / total * v_cache[slot * row + kv_head * c.head_dim + d];
          }
          // Scores carry head_dim roundings into exp (values ~1, |v| <= 1): a few hundred ulps
          // of the output scale at these sizes.
          const double tolerance = (c.head_dim + position + 8) * kUnitRoundoff * 4.0;
          EXPECT_NEAR(out[(token * c.heads + h) * c.head_dim + d], expected, tolerance)
              << "seq " << s << " token " << i << " head " << h;
        }
      }
    }
  }
}

TEST_P(CpuKernels, PagedAttentionMatchesReference) {
  check_paged_attention({}, pool_);
}

TEST_P(CpuKernels, PagedAttentionWithSlidingWindow) {
  PagedAttentionCase c;
  c.window = 5;
  check_paged_attention(c, pool_);
}

// A bf16 cache: keys and values widen exactly, so the tolerance against the reference over the
// same (rounded) values is the f32 cache's.
TEST_P(CpuKernels, PagedAttentionOverABf16CacheMatchesReference) {
  for (const int64_t head_dim : {12, 64, 80}) {  // partial, whole and 1 + partial 16-lane chunks
    for (const int64_t window : {0, 5}) {
      PagedAttentionCase c;
      c.head_dim = head_dim;
      c.window = window;
      c.cache_dtype = DType::kBF16;
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " window " + std::to_string(window));
      check_paged_attention(c, pool_);
    }
  }
}

TEST_P(CpuKernels, AttentionAndKvWriteRejectACacheDtypeOtherThanBf16OrF32) {
  const int32_t query_start[] = {0, 1};
  const int32_t lengths[] = {1};
  const int32_t tables[] = {0};
  std::vector<float> q(4), cache(4 * 4), out(4);
  const Status attended =
      attention({1, 1, 1, 1, 4, 4, 1, 0.5f, 0, DType::kF16}, q.data(), cache.data(), cache.data(),
                query_start, lengths, tables, nullptr, out.data(), pool_);
  EXPECT_EQ(attended.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(attended.message().find("F16"), std::string::npos) << attended.message();
  const int32_t slots[] = {0};
  const Status written = kv_write({1, 1, 4, 4, DType::kI8}, q.data(), q.data(), slots, cache.data(),
                                  cache.data(), pool_);
  EXPECT_EQ(written.code(), StatusCode::kInvalidArgument);
}

TEST(CpuAttentionThreads, GroupedQueryHeadsGiveTheSameBitsForEveryThreadCount) {
  // Three query heads a KV head: with many threads and few tokens the groups are split into parts
  // (each head alone, or two and one); a head's output must not depend on its part.
  for (const bool decode : {true, false}) {
    for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
      PagedAttentionCase c;
      c.heads = 9;
      c.kv_heads = 3;
      c.head_dim = 64;
      c.block_size = 16;
      c.new_tokens = {decode ? 1 : 7};
      c.context = {decode ? 70 : 7};
      c.cache_dtype = cache_dtype;
      std::vector<float> first;
      for (const int threads : {1, 2, 3, 4, 16}) {
        ThreadPool pool(threads);
        std::vector<float> out;
        check_paged_attention(c, pool, &out);
        if (first.empty()) {
          first = out;
        } else {
          ASSERT_EQ(0, std::memcmp(out.data(), first.data(), out.size() * sizeof(float)))
              << threads << " threads, " << (decode ? "decode" : "prefill") << ", "
              << dtype_name(cache_dtype) << " cache";
        }
      }
    }
  }
}

// A token tree in one call: sequence 0's 6 new tokens (positions 8..13) are a chain of 4 and two
// branches forking from it, sequence 1's 3 are siblings of one another (each skips the earlier).
TEST_P(CpuKernels, PagedAttentionWithKeyGapsReadsOnlyEachTokensBranch) {
  for (const DType cache_dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t window : {0, 3, 6}) {
      PagedAttentionCase c;
      c.new_tokens = {6, 3};
      c.context = {14, 5};
      c.window = window;
      c.cache_dtype = cache_dtype;
      // Sequence 0: 8..11 the chain; 12 forks after 9 (skips 10, 11); 13 forks after 8.
      // Sequence 1: 2, 3, 4 are siblings after position 1.
      c.gaps = {{8, 8}, {9, 9}, {10, 10}, {11, 11}, {10, 12}, {9, 13}, {2, 2}, {2, 3}, {2, 4}};
      SCOPED_TRACE(std::string(dtype_name(cache_dtype)) + " window " + std::to_string(window));
      check_paged_attention(c, pool_);
    }
  }
}

TEST_P(CpuKernels, AttentionRejectsAKeyGapThatHidesTheTokenItself) {
  const int32_t query_start[] = {0, 1};
  const int32_t lengths[] = {3};
  const int32_t tables[] = {0};
  std::vector<float> q(4), cache(4 * 4), out(4);
  for (const auto& gap : {std::array<int32_t, 2>{1, 3}, std::array<int32_t, 2>{2, 1},
                          std::array<int32_t, 2>{-1, 1}}) {
    const Status status =
        attention({1, 1, 1, 1, 4, 4, 1, 0.5f, 0, DType::kF32}, q.data(), cache.data(), cache.data(),
                  query_start, lengths, tables, gap.data(), out.data(), pool_);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << gap[0] << ", " << gap[1];
    EXPECT_NE(status.message().find("key gap"), std::string::npos) << status.message();
  }
}

TEST_P(CpuKernels, PagedAttentionMultiHeadAndBlockOfOne) {
  PagedAttentionCase c;
  c.heads = 3;
  c.kv_heads = 3;
  c.block_size = 1;
  c.new_tokens = {1, 4};
  c.context = {1, 7};
  check_paged_attention(c, pool_);
}

TEST_P(CpuKernels, AttentionRejectsImpossibleContext) {
  const int32_t query_start[] = {0, 2};
  const int32_t lengths[] = {1};  // fewer cached positions than new tokens
  const int32_t tables[] = {0};
  std::vector<float> q(2 * 4), cache(4 * 4), out(2 * 4);
  EXPECT_EQ(attention({1, 2, 1, 1, 4, 4, 1, 0.5f, 0, DType::kF32}, q.data(), cache.data(),
                      cache.data(), query_start, lengths, tables, nullptr, out.data(), pool_)
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CpuKernels, KvWriteStoresRowsAtSlotsAndRejectsBadSlots) {
  const int64_t kv_heads = 2, head_dim = 3, slots_in_cache = 8;
  const std::vector<float> k = random_floats(2 * kv_heads * head_dim, 25);
  const std::vector<float> v = random_floats(2 * kv_heads * head_dim, 26);
  std::vector<float> k_cache(slots_in_cache * kv_heads * head_dim, 0.0f), v_cache = k_cache;
  const int32_t slots[] = {5, 2};
  ASSERT_TRUE(kv_write({2, kv_heads, head_dim, slots_in_cache, DType::kF32}, k.data(), v.data(),
                       slots, k_cache.data(), v_cache.data(), pool_)
                  .is_ok());
  for (int t = 0; t < 2; ++t) {
    for (int64_t i = 0; i < kv_heads * head_dim; ++i) {
      EXPECT_EQ(k_cache[slots[t] * kv_heads * head_dim + i], k[t * kv_heads * head_dim + i]);
      EXPECT_EQ(v_cache[slots[t] * kv_heads * head_dim + i], v[t * kv_heads * head_dim + i]);
    }
  }
  const int32_t bad[] = {8};
  EXPECT_EQ(kv_write({1, kv_heads, head_dim, slots_in_cache, DType::kF32}, k.data(), v.data(), bad,
                     k_cache.data(), v_cache.data(), pool_)
                .code(),
            StatusCode::kOutOfRange);
}

TEST_P(CpuKernels, KvWriteToABf16CacheRoundsToNearestEven) {
  const int64_t kv_heads = 2, head_dim = 4, slots_in_cache = 4;
  std::vector<float> k = random_floats(kv_heads * head_dim, 27);
  std::vector<float> v = random_floats(kv_heads * head_dim, 28);
  // Ties and specials: halfway between two bf16 values (to even, both ways), the largest finite
  // float (rounds up to infinity), infinity and NaN.
  k[0] = bit_cast_f32(0x3f808000u);
  k[1] = bit_cast_f32(0x3f818000u);
  k[2] = std::numeric_limits<float>::max();
  v[0] = std::numeric_limits<float>::infinity();
  v[1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint16_t> k_cache(slots_in_cache * kv_heads * head_dim, 0);
  std::vector<uint16_t> v_cache = k_cache;
  const int32_t slots[] = {3};
  ASSERT_TRUE(kv_write({1, kv_heads, head_dim, slots_in_cache, DType::kBF16}, k.data(), v.data(),
                       slots, k_cache.data(), v_cache.data(), pool_)
                  .is_ok());
  const int64_t row = kv_heads * head_dim;
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(k_cache[3 * row + i], f32_to_bf16(k[i])) << i;
    EXPECT_EQ(v_cache[3 * row + i], f32_to_bf16(v[i])) << i;
    EXPECT_EQ(k_cache[i], 0) << "slot 0 untouched";
  }
  EXPECT_EQ(k_cache[3 * row + 0], 0x3f80);  // tie to even: down
  EXPECT_EQ(k_cache[3 * row + 1], 0x3f82);  // tie to even: up
  EXPECT_EQ(k_cache[3 * row + 2], 0x7f80);  // past bf16's largest finite value: infinity
  EXPECT_TRUE(std::isnan(bf16_to_f32(v_cache[3 * row + 1])));
}

TEST(VectorMath, ExpIsWithinTwoUlpAndSaturates) {
  // Every 2^-10 step over the range where e^x is a normal f32, against e^x in double.
  double worst_ulps = 0;
  for (float x = -87.0f; x <= 88.5f; x += 0x1.0p-10f) {
    const double exact = std::exp(double(x));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    worst_ulps = std::max(worst_ulps, std::abs(double(exp_f32(x)) - exact) / ulp);
  }
  EXPECT_LE(worst_ulps, 2.0);
  // Subnormal results within two of the smallest subnormal; beyond the range, 0 and infinity.
  for (float x = -103.0f; x < -87.0f; x += 0.01f) {
    EXPECT_NEAR(exp_f32(x), std::exp(double(x)), 2 * 0x1.0p-149) << x;
  }
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_f32(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exp_f32(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST_P(CpuKernels, SwigluIsExpF32sFormulaBitwiseWhereverAnElementLands) {
  // 16 at a time where the kernels have AVX-512 (exp_lanes), one at a time for the tails: the
  // same bits as the formula with exp_f32, for every element; ranges with every tail length.
  const int64_t rows = 1, dim = 16 * 40 + 7;
  std::vector<float> gate = random_floats(rows * dim, 29, 12.0f);
  gate[0] = -200.0f;  // e^200: infinity, and the product -0
  gate[1] = 0.0f;
  const std::vector<float> up = random_floats(rows * dim, 30);
  std::vector<float> out(rows * dim);
  for (const int64_t count : {dim, int64_t{15}, int64_t{17}, int64_t{33}}) {
    ASSERT_TRUE(gated_activation({1, count}, gate.data(), up.data(), out.data(), pool_).is_ok());
    for (int64_t i = 0; i < count; ++i) {
      const float expected = gate[i] / (1.0f + exp_f32(-gate[i])) * up[i];
      ASSERT_EQ(std::memcmp(&out[i], &expected, sizeof(float)), 0)
          << i << " of " << count << ": " << out[i] << " against " << expected;
    }
  }
}

TEST_P(CpuKernels, SwigluAndAddMatchReference) {
  const int64_t rows = 3, dim = 40000;  // large enough to split across threads
  const std::vector<float> gate = random_floats(rows * dim, 27, 6.0f);
  const std::vector<float> up = random_floats(rows * dim, 28);
  std::vector<float> out(rows * dim);
  ASSERT_TRUE(gated_activation({rows, dim}, gate.data(), up.data(), out.data(), pool_).is_ok());
  for (int64_t i = 0; i < rows * dim; i += 97) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], expected, 8 * kUnitRoundoff * std::abs(g * up[i]) + 1e-30);
  }
  std::vector<float> accumulator = up;
  ASSERT_TRUE(add(rows * dim, gate.data(), accumulator.data(), pool_).is_ok());
  for (int64_t i = 0; i < rows * dim; ++i) ASSERT_EQ(accumulator[i], up[i] + gate[i]);
}

// The repetition penalty divides a positive logit and multiplies a negative one, then the
// additions (penalties, bias) apply; a mask bans every token whose bit is clear, edited or not.
TEST(CpuLogits, EditsScaleThenAddThenMask) {
  std::vector<float> logits = {2.5f, -2.0f, 0.0f, 1.0f, 3.0f, -1.0f, 0.5f, 7.0f};
  const std::vector<kernels::LogitEdit> edits = {
      {0, 1.25f, 0.0f}, {1, 1.5f, 0.0f}, {2, 2.0f, -0.5f}, {3, 1.0f, 4.0f}, {8, 2.0f, 9.0f}};
  kernels::cpu::edit_logits(edits, {}, logits);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -3.0f, -0.5f, 5.0f, 3.0f, -1.0f, 0.5f, 7.0f}));
  const std::vector<uint32_t> mask = {0b01011001u};  // tokens 0, 3, 4, 6
  kernels::cpu::edit_logits({}, mask, logits);
  const float banned = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(logits, (std::vector<float>{2.0f, banned, banned, 5.0f, 3.0f, banned, 0.5f, banned}));
}

// Log-probabilities are the log of the softmax, computed here the long way in double; the top
// tokens come highest first, the lower id among equals, banned tokens last.
TEST(CpuLogits, LogprobsAreTheLogOfTheSoftmax) {
  const float banned = -std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, banned, 0.25f};
  double total = 0.0;
  for (const float x : logits) total += std::exp(static_cast<double>(x));
  float chosen = 0.0f;
  std::array<int32_t, 6> top{};
  std::array<float, 6> top_logprobs{};
  kernels::cpu::token_logprobs(logits, 5, &chosen, top, top_logprobs);
  EXPECT_FLOAT_EQ(chosen, static_cast<float>(std::log(std::exp(0.25) / total)));
  EXPECT_EQ(top, (std::array<int32_t, 6>{1, 3, 0, 5, 2, 4}));
  for (size_t k = 0; k < top.size(); ++k) {
    const double x = logits[static_cast<size_t>(top[k])];
    EXPECT_FLOAT_EQ(top_logprobs[k], static_cast<float>(x - std::log(total))) << k;
  }
  kernels::cpu::token_logprobs(logits, 6, &chosen, {}, {});
  EXPECT_EQ(chosen, 0.0f) << "a token outside the row has none";
  kernels::cpu::token_logprobs(logits, -1, &chosen, {}, {});
  EXPECT_EQ(chosen, 0.0f);
}

// GeGLU (Gemma's MLP): PyTorch's gelu(approximate="tanh") times up, against the formula in double.
// f32 rounds x^3, the inner sum and tanh's argument (a few ulp of g, where tanh's slope is at most
// one and 0.5 g (1 + t) has |g|'s scale), then tanh within an ulp: 16 u |g u| bounds it.
TEST_P(CpuKernels, GeluTanhMatchesTheFormulaInDouble) {
  const int64_t rows = 3, dim = 40000;
  const std::vector<float> gate = random_floats(rows * dim, 31, 8.0f);
  const std::vector<float> up = random_floats(rows * dim, 32);
  std::vector<float> out(rows * dim);
  ASSERT_TRUE(gated_activation({rows, dim, GateActivation::kGeluTanh}, gate.data(), up.data(),
                               out.data(), pool_)
                  .is_ok());
  for (int64_t i = 0; i < rows * dim; i += 37) {
    const double g = gate[i];
    const double expected =
        0.5 * g *
        (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g))) * up[i];
    EXPECT_NEAR(out[i], expected, 16 * kUnitRoundoff * std::abs(g * up[i]) + 1e-30) << g;
  }
  // It is GELU: zero at zero, the identity far right, zero far left.
  const std::vector<float> points = {0.0f, 30.0f, -30.0f};
  const std::vector<float> ones(3, 1.0f);
  std::vector<float> at(3);
  ASSERT_TRUE(gated_activation({1, 3, GateActivation::kGeluTanh}, points.data(), ones.data(),
                               at.data(), pool_)
                  .is_ok());
  EXPECT_EQ(at[0], 0.0f);
  EXPECT_EQ(at[1], 30.0f);
  EXPECT_EQ(at[2], -0.0f);
}

TEST_P(CpuKernels, AMatmulGroupIsEachTargetsMatmulBitwise) {
  // One parallel region over three weights of different dtypes (bf16, f32, INT8 with a scale a
  // row), widths that make thread ranges cross target boundaries: each out as its matmul alone.
  const int64_t in = 80;
  const int64_t widths[] = {37, 5, 50};
  const StoredTensor bf16 = store(random_floats(widths[0] * in, 11), DType::kBF16);
  const StoredTensor f32 = store(random_floats(widths[1] * in, 12), DType::kF32);
  std::vector<int8_t> codes(static_cast<size_t>(widths[2] * in));
  const std::vector<float> draws = random_floats(codes.size(), 13);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(draws[i] * 127.0f);
  std::vector<float> scales(static_cast<size_t>(widths[2]));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f + 0.001f * static_cast<float>(i);
  const std::vector<float> bias = random_floats(static_cast<size_t>(widths[1]), 14);
  for (const int64_t rows : {1, 5, 70}) {
    const std::vector<float> x = random_floats(rows * in, 15 + rows);
    std::vector<std::vector<float>> grouped(3), alone(3);
    MatmulTarget targets[3] = {{{rows, in, widths[0], DType::kBF16, DType::kF32},
                                bf16.data(DType::kBF16),
                                nullptr,
                                nullptr,
                                nullptr},
                               {{rows, in, widths[1], DType::kF32, DType::kF32},
                                f32.data(DType::kF32),
                                nullptr,
                                bias.data(),
                                nullptr},
                               {{rows, in, widths[2], DType::kI8, DType::kF32, 1, in},
                                codes.data(),
                                scales.data(),
                                nullptr,
                                nullptr}};
    for (int t = 0; t < 3; ++t) {
      grouped[t].assign(static_cast<size_t>(rows * widths[t]), -1.0f);
      alone[t].assign(static_cast<size_t>(rows * widths[t]), -2.0f);
      targets[t].out = grouped[t].data();
    }
    ASSERT_TRUE(matmul_group(x.data(), targets, 3, pool_).is_ok());
    for (int t = 0; t < 3; ++t) {
      const MatmulTarget& target = targets[t];
      ASSERT_TRUE(matmul(target.params, x.data(), target.weight, target.weight_scales, target.bias,
                         alone[t].data(), pool_)
                      .is_ok());
      EXPECT_EQ(grouped[t], alone[t]) << "target " << t << " rows " << rows;
    }
    MatmulTarget mismatched[2] = {targets[0], targets[1]};
    mismatched[1].params.in_features = in - 16;
    EXPECT_EQ(matmul_group(x.data(), mismatched, 2, pool_).code(), StatusCode::kInvalidArgument);
  }
}

// ---- the tiled weight layout -------------------------------------------------------------------

TEST(WeightLayoutTest, PackingPutsEveryElementAtItsOffsetAndPadsWithZeros) {
  for (const WeightLayout layout : {WeightLayout::kTiled, WeightLayout::kPairTiles}) {
    for (const int64_t out_features : {1, 3, 4, 5, 9, 16, 17, 33}) {
      for (const int64_t in_features : {1, 15, 16, 19, 32, 48, 70}) {
        std::vector<uint16_t> weight(static_cast<size_t>(out_features * in_features));
        std::iota(weight.begin(), weight.end(), uint16_t{1});
        const std::vector<uint8_t> bytes =
            laid_out(layout, weight.data(), out_features, in_features, DType::kBF16);
        std::vector<uint16_t> packed(bytes.size() / 2);
        std::memcpy(packed.data(), bytes.data(), bytes.size());
        const int64_t padded_columns = stored_columns(layout, in_features);
        const int64_t padded_rows = stored_rows(layout, out_features);
        ASSERT_EQ(static_cast<int64_t>(packed.size()), padded_rows * padded_columns);
        std::vector<bool> written(packed.size(), false);
        for (int64_t row = 0; row < out_features; ++row) {
          for (int64_t column = 0; column < in_features; ++column) {
            const int64_t at = element_offset(layout, row, column, out_features, in_features);
            ASSERT_FALSE(written[static_cast<size_t>(at)]) << "two elements at " << at;
            ASSERT_EQ(packed[static_cast<size_t>(at)], weight[row * in_features + column])
                << out_features << "x" << in_features << " at " << row << "," << column;
            written[static_cast<size_t>(at)] = true;
          }
        }
        for (size_t i = 0; i < packed.size(); ++i) {
          if (!written[i]) {
            ASSERT_EQ(packed[i], 0) << "padding at " << i;
          }
        }
      }
    }
  }
  // A pair tile is what the tile multiply reads as its second operand: 16 column pairs of 16
  // rows, 64 bytes each.
  EXPECT_EQ(element_offset(WeightLayout::kPairTiles, 0, 1, 16, 64), 1);
  EXPECT_EQ(element_offset(WeightLayout::kPairTiles, 1, 0, 16, 64), 2);
  EXPECT_EQ(element_offset(WeightLayout::kPairTiles, 0, 2, 16, 64), 32);
  EXPECT_EQ(element_offset(WeightLayout::kPairTiles, 0, 32, 16, 64), 512);
  EXPECT_EQ(element_offset(WeightLayout::kPairTiles, 16, 0, 32, 64), 1024);
  std::vector<uint8_t> destination(
      stored_weight_bytes(WeightLayout::kPairTiles, 4, 4, DType::kF32));
  const std::vector<float> f32(16, 1.0f);
  EXPECT_EQ(
      lay_out_weight(WeightLayout::kPairTiles, f32.data(), 4, 4, DType::kF32, destination.data())
          .code(),
      StatusCode::kInvalidArgument);
  for (const int64_t out_features : {1, 5, 9}) {
    for (const int64_t in_features : {1, 19, 48}) {
      EXPECT_EQ(element_offset(WeightLayout::kRows, out_features - 1, in_features - 1, out_features,
                               in_features),
                out_features * in_features - 1);
    }
  }
}

TEST_P(CpuKernels, TiledWeightsGiveTheRowMajorResultsBitwise) {
  // Every dtype, tails of rows (37 = 9 tiles and one row), columns (19, 83: padded chunks) and
  // activation rows; quantized with per-row and 16 x 16 block scales.
  for (const int64_t in : {19, 64, 83}) {
    const int64_t out_features = 37;
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI8}) {
      const bool quantized_dtype = is_quantized(dtype);
      const int64_t block_rows = quantized_dtype && in % 16 == 0 ? 16 : 1;
      const int64_t block_cols = quantized_dtype && in % 16 == 0 ? 16 : in;
      StoredTensor weight;
      QuantizedTensor codes{};
      const void* row_major = nullptr;
      const float* scales = nullptr;
      if (quantized_dtype) {
        codes = quantized(dtype, out_features, in, block_rows, block_cols, 31 + in);
        row_major = codes.codes.data();
        scales = codes.scales.data();
      } else {
        weight = store(random_floats(out_features * in, 30 + in), dtype);
        row_major = weight.data(dtype);
      }
      const std::vector<uint8_t> packed = tiled(row_major, out_features, in, dtype);
      for (const int64_t rows : {1, 3, 5, 70}) {
        const std::vector<float> x = random_floats(rows * in, 40 + rows);
        MatmulParams params{rows, in, out_features, dtype, DType::kF32, block_rows, block_cols};
        std::vector<float> expected(rows * out_features), actual(rows * out_features, -1.0f);
        ASSERT_TRUE(
            matmul(params, x.data(), row_major, scales, nullptr, expected.data(), pool_).is_ok());
        params.weight_layout = WeightLayout::kTiled;
        ASSERT_TRUE(
            matmul(params, x.data(), packed.data(), scales, nullptr, actual.data(), pool_).is_ok());
        ASSERT_EQ(0, std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)))
            << dtype_name(dtype) << " in " << in << " rows " << rows;
      }
    }
  }
}

TEST_P(CpuKernels, AGroupOfTiledWeightsSplitMidTileIsEachMatmulBitwise) {
  // Widths that put thread ranges' starts inside tiles of the second and third targets.
  const int64_t in = 80;
  const int64_t widths[] = {37, 6, 50};
  std::vector<StoredTensor> weights;
  std::vector<std::vector<uint8_t>> packed;
  for (int t = 0; t < 3; ++t) {
    weights.push_back(store(random_floats(widths[t] * in, 50 + t), DType::kBF16));
    packed.push_back(tiled(weights[t].data(DType::kBF16), widths[t], in, DType::kBF16));
  }
  for (const int64_t rows : {1, 5}) {
    const std::vector<float> x = random_floats(rows * in, 60 + rows);
    MatmulTarget targets[3];
    std::vector<std::vector<float>> grouped(3), alone(3);
    for (int t = 0; t < 3; ++t) {
      grouped[t].assign(static_cast<size_t>(rows * widths[t]), -1.0f);
      alone[t].assign(static_cast<size_t>(rows * widths[t]), -2.0f);
      MatmulParams params{rows, in, widths[t], DType::kBF16, DType::kF32};
      ASSERT_TRUE(matmul(params, x.data(), weights[t].data(DType::kBF16), nullptr, nullptr,
                         alone[t].data(), pool_)
                      .is_ok());
      params.weight_layout = WeightLayout::kTiled;
      targets[t] = {params, packed[t].data(), nullptr, nullptr, grouped[t].data()};
    }
    ASSERT_TRUE(matmul_group(x.data(), targets, 3, pool_).is_ok());
    for (int t = 0; t < 3; ++t) EXPECT_EQ(grouped[t], alone[t]) << "target " << t;
  }
}

TEST_P(CpuKernels, EmbeddingGathersRowsOfATiledTable) {
  const int64_t vocab = 37, dim = 19;
  const std::vector<int32_t> tokens = {0, 36, 5, 5, 17, 35};
  const StoredTensor table = store(random_floats(vocab * dim, 70), DType::kBF16);
  for (const WeightLayout layout : {WeightLayout::kTiled, WeightLayout::kPairTiles}) {
    const std::vector<uint8_t> packed =
        laid_out(layout, table.data(DType::kBF16), vocab, dim, DType::kBF16);
    std::vector<float> out(tokens.size() * dim);
    ASSERT_TRUE(embedding({static_cast<int64_t>(tokens.size()), vocab, dim, DType::kBF16, layout},
                          tokens.data(), packed.data(), out.data(), pool_)
                    .is_ok());
    for (size_t t = 0; t < tokens.size(); ++t) {
      for (int64_t c = 0; c < dim; ++c) {
        EXPECT_EQ(out[t * dim + c], table.floats[tokens[t] * dim + c])
            << int(layout) << ": " << t << "," << c;
      }
    }
  }
}

// ---- bf16 activations ---------------------------------------------------------------------------

TEST_P(CpuKernels, Bf16ActivationsAreTheRoundedActivationsExactProductsSummedInF32) {
  // Rounding x to bf16 is the only change: products of two bf16 values are exact in f32, so
  // against the rounded activations in double the bound is f32 summation's, n * u * sum|terms|.
  // Against the f32 activations each term moves by up to 2^-9 of itself more (bf16 rounding).
  // The same bound holds for the tile multiply (pair tiles, where AMX runs), whatever order its
  // sums take inside the unit. Shapes cover tails of 16-row activation blocks, of 16-row weight
  // groups and of 32-column tiles.
  const int64_t shapes[][3] = {{1, 16, 8},  {3, 37, 21},  {6, 64, 33},  {7, 100, 17},
                               {70, 48, 5}, {33, 64, 48}, {17, 200, 40}};
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], in = shape[1], out_features = shape[2];
    const std::vector<float> x = random_floats(rows * in, 80);
    const StoredTensor weight = store(random_floats(out_features * in, 81), DType::kBF16);
    const StoredTensor bias = store(random_floats(out_features, 82), DType::kBF16);
    for (const auto& [layout, variant] : bf16_activation_layouts()) {
      const std::vector<uint8_t> packed =
          laid_out(layout, weight.data(DType::kBF16), out_features, in, DType::kBF16);
      MatmulParams params{rows, in, out_features, DType::kBF16, DType::kBF16};
      params.weight_layout = layout;
      std::vector<float> out(rows * out_features);
      ASSERT_TRUE(matmul(params, x.data(), packed.data(), nullptr, bias.data(DType::kBF16),
                         out.data(), pool_, Activations::kBF16, variant)
                      .is_ok());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t f = 0; f < out_features; ++f) {
          double rounded = bias.floats[f], exact = bias.floats[f], magnitude = std::abs(exact);
          for (int64_t i = 0; i < in; ++i) {
            const double w = weight.floats[f * in + i];
            rounded += double(bf16_to_f32(f32_to_bf16(x[r * in + i]))) * w;
            exact += double(x[r * in + i]) * w;
            magnitude += std::abs(double(x[r * in + i]) * w);
          }
          const float value = out[r * out_features + f];
          ASSERT_NEAR(value, rounded, (in + 2) * kUnitRoundoff * 1.01 * magnitude)
              << rows << "x" << in << "x" << out_features << " row " << r << " feature " << f
              << " layout " << int(layout);
          ASSERT_NEAR(value, exact, (0x1.0p-9 + (in + 2) * kUnitRoundoff) * 1.01 * magnitude);
        }
      }
    }
  }
}

TEST_P(CpuKernels, Bf16ActivationsMeetEightBitCodesWithOneScalePerRowExactly) {
  // INT8 and FP8 weights with one scale per row (per channel, per tensor): the codes' values are
  // exact in bf16, so a result is the scale times the rounded activations' exact products with
  // the code values, summed in f32 (the bound of the bf16 test above, with one more rounding for
  // the scale). Block-wise scales keep f32 activations: bitwise the f32 call's result. Both
  // layouts; shapes with tails of 16-row activation blocks and of 32-column chunks, and 90 rows of
  // 4,100 columns: two blocks of the bf16-pair kernel's rows (64 and 26), each widening the codes
  // again.
  struct Layout {
    int64_t block_rows, block_cols;
  };
  for (const DType dtype : {DType::kI8, DType::kF8E4M3}) {
    for (const auto& shape : std::vector<std::array<int64_t, 3>>{
             {1, 64, 9}, {5, 83, 9}, {7, 100, 17}, {70, 48, 5}, {17, 300, 40}, {90, 4100, 9}}) {
      const int64_t rows = shape[0], in = shape[1], out_features = shape[2];
      for (const Layout scales : {Layout{1, in}, Layout{out_features, in}, Layout{16, 16}}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" +
                     std::to_string(in) + "x" + std::to_string(out_features) + " blocks " +
                     std::to_string(scales.block_rows) + "x" + std::to_string(scales.block_cols));
        const QuantizedTensor w =
            quantized(dtype, out_features, in, scales.block_rows, scales.block_cols, 60 + in);
        const std::vector<float> x = random_floats(rows * in, 61);
        const std::vector<float> bias = random_floats(out_features, 62);
        for (const MatmulVariant& variant : matmul_variants()) {
          if (!variant.supported()) continue;
          SCOPED_TRACE(std::string(variant.name));
          for (const WeightLayout layout : {WeightLayout::kRows, WeightLayout::kTiled}) {
            const std::vector<uint8_t> packed =
                laid_out(layout, w.codes.data(), out_features, in, dtype);
            MatmulParams params = w.params(rows);
            params.weight_layout = layout;
            std::vector<float> out(rows * out_features), f32(rows * out_features);
            ASSERT_TRUE(matmul(params, x.data(), packed.data(), w.scales.data(), bias.data(),
                               out.data(), pool_, Activations::kBF16, &variant)
                            .is_ok());
            ASSERT_TRUE(matmul(params, x.data(), packed.data(), w.scales.data(), bias.data(),
                               f32.data(), pool_, Activations::kF32, &variant)
                            .is_ok());
            if (scales.block_cols < in) {
              ASSERT_EQ(0, std::memcmp(out.data(), f32.data(), out.size() * sizeof(float)));
              continue;
            }
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t f = 0; f < out_features; ++f) {
                const double scale = w.scales[f / scales.block_rows];
                double sum = 0, magnitude = 0;
                for (int64_t i = 0; i < in; ++i) {
                  const uint8_t code = w.codes[f * in + i];
                  const double value = dtype == DType::kI8
                                           ? static_cast<double>(static_cast<int8_t>(code))
                                           : static_cast<double>(f8e4m3_to_f32(code));
                  const double term = double(bf16_to_f32(f32_to_bf16(x[r * in + i]))) * value;
                  sum += term;
                  magnitude += std::abs(term);
                }
                ASSERT_NEAR(
                    out[r * out_features + f], sum * scale + bias[f],
                    (in + 3) * kUnitRoundoff * 1.01 * (magnitude * scale + std::abs(bias[f])))
                    << "layout " << int(layout) << " row " << r << " feature " << f;
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(CpuKernels, Bf16AndInt8ActivationsAreBatchInvariantBitwise) {
  // Rows alone and in batches of every size (the bf16-pair kernel takes six rows at a time, the
  // tile multiply two blocks of 16), for bf16 weights and for 8-bit ones with one scale per row;
  // INT8 ones against int8 activations too.
  const int64_t rows = 40, in = 83, out_features = 45;
  const std::vector<float> x = random_floats(rows * in, 83);
  const StoredTensor weight = store(random_floats(out_features * in, 84), DType::kBF16);
  std::vector<std::tuple<DType, WeightLayout, const MatmulVariant*, Activations>> cases;
  for (const auto& [layout, variant] : bf16_activation_layouts()) {
    cases.emplace_back(DType::kBF16, layout, variant, Activations::kBF16);
  }
  for (const DType dtype : {DType::kI8, DType::kF8E4M3}) {
    for (const WeightLayout layout : {WeightLayout::kRows, WeightLayout::kTiled}) {
      cases.emplace_back(dtype, layout, nullptr, Activations::kBF16);
    }
  }
  // And INT8 weights meeting int8 activations, in every copy of the kernels.
  for (const MatmulVariant& variant : matmul_variants()) {
    if (!variant.supported()) continue;
    for (const WeightLayout layout : {WeightLayout::kRows, WeightLayout::kTiled}) {
      cases.emplace_back(DType::kI8, layout, &variant, Activations::kInt8);
    }
  }
  for (const auto& [dtype, layout, variant, activations] : cases) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " layout " + std::to_string(int(layout)) +
                 (activations == Activations::kInt8 ? " int8 activations" : ""));
    const QuantizedTensor codes =
        is_quantized(dtype) ? quantized(dtype, out_features, in, 1, in, 85) : QuantizedTensor{};
    const std::vector<uint8_t> packed =
        is_quantized(dtype) ? laid_out(layout, codes.codes.data(), out_features, in, dtype)
                            : laid_out(layout, weight.data(dtype), out_features, in, dtype);
    const float* scales = is_quantized(dtype) ? codes.scales.data() : nullptr;
    MatmulParams params{rows, in, out_features, dtype, DType::kF32, 1, in};
    params.weight_layout = layout;
    std::vector<float> all(rows * out_features);
    ASSERT_TRUE(matmul(params, x.data(), packed.data(), scales, nullptr, all.data(), pool_,
                       activations, variant)
                    .is_ok());
    for (int64_t batch = 1; batch <= rows; ++batch) {
      for (int64_t first = 0; first + batch <= rows; first += batch) {
        std::vector<float> part(batch * out_features);
        params.rows = batch;
        ASSERT_TRUE(matmul(params, x.data() + first * in, packed.data(), scales, nullptr,
                           part.data(), pool_, activations, variant)
                        .is_ok());
        ASSERT_EQ(0, std::memcmp(part.data(), all.data() + first * out_features,
                                 part.size() * sizeof(float)))
            << "rows " << first << ".." << first + batch;
      }
    }
  }
}

// ---- int8 activations ---------------------------------------------------------------------------

// Activations::kInt8's quantization of one row, as documented: codes round(x * 127 / max |x|) to
// nearest even, scale max |x| / 127.
struct Int8Row {
  std::vector<int32_t> codes;
  float scale = 0.0f;
};

Int8Row quantize_row(const float* x, int64_t k) {
  Int8Row row;
  float largest = 0.0f;
  for (int64_t i = 0; i < k; ++i) largest = std::max(largest, std::fabs(x[i]));
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    row.codes.push_back(static_cast<int32_t>(std::nearbyint(x[i] * inverse)));
  }
  row.scale = largest / 127.0f;
  return row;
}

// x ([rows, w.columns]) times w (INT8, laid out tiled) with int8 activations, through the best
// copy of the kernels.
std::vector<float> int8_activations_matmul(const std::vector<float>& x, int64_t rows,
                                           const QuantizedTensor& w, ThreadPool& pool) {
  const std::vector<uint8_t> packed = tiled(w.codes.data(), w.rows, w.columns, DType::kI8);
  MatmulParams params = w.params(rows);
  params.weight_layout = WeightLayout::kTiled;
  std::vector<float> out(rows * w.rows);
  EXPECT_TRUE(matmul(params, x.data(), packed.data(), w.scales.data(), nullptr, out.data(), pool,
                     Activations::kInt8)
                  .is_ok());
  return out;
}

TEST_P(CpuKernels, Int8ActivationsMeetInt8WeightsAsExactIntegerSumsScaledOnce) {
  // INT8 weights with one scale per row against rows quantized per token: each result is the
  // exact sum of code products, as an f32, times (the row's scale times the weight row's), plus
  // the bias: bitwise, in every copy of the kernels (VNNI or not) and both layouts. Shapes with
  // tails of 16-column chunks, of tiles and of the kernel's 6-row groups, thread ranges that
  // start inside a tile, and rows in two blocks (140 rows of 4,100 columns).
  for (const auto& shape : std::vector<std::array<int64_t, 3>>{
           {1, 64, 16}, {1, 83, 9}, {5, 100, 17}, {7, 48, 40}, {13, 300, 45}, {140, 4100, 18}}) {
    const int64_t rows = shape[0], in = shape[1], out_features = shape[2];
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(in) + "x" +
                 std::to_string(out_features));
    for (const int64_t scale_rows : {int64_t{1}, out_features}) {
      const QuantizedTensor w = quantized(DType::kI8, out_features, in, scale_rows, in, 90 + in);
      std::vector<float> x = random_floats(rows * in, 91);
      // A row of zeros, and rows whose largest element repeats (codes of +-127 at once).
      std::fill(x.begin(), x.begin() + in, 0.0f);
      if (rows > 1) x[in + in / 2] = -x[in + 1] * 1.5f;
      const std::vector<float> bias = random_floats(out_features, 92);
      std::vector<float> expected(rows * out_features);
      for (int64_t r = 0; r < rows; ++r) {
        const Int8Row row = quantize_row(x.data() + r * in, in);
        for (int64_t f = 0; f < out_features; ++f) {
          int64_t sum = 0;
          for (int64_t i = 0; i < in; ++i) {
            sum += row.codes[i] * int64_t{static_cast<int8_t>(w.codes[f * in + i])};
          }
          const float scale = row.scale * w.scales[f / scale_rows];
          expected[r * out_features + f] = static_cast<float>(sum) * scale + bias[f];
        }
      }
      for (const MatmulVariant& variant : matmul_variants()) {
        if (!variant.supported()) continue;
        SCOPED_TRACE(std::string(variant.name));
        for (const WeightLayout layout : {WeightLayout::kRows, WeightLayout::kTiled}) {
          const std::vector<uint8_t> packed =
              laid_out(layout, w.codes.data(), out_features, in, DType::kI8);
          MatmulParams params = w.params(rows);
          params.weight_layout = layout;
          std::vector<float> out(rows * out_features);
          ASSERT_TRUE(matmul(params, x.data(), packed.data(), w.scales.data(), bias.data(),
                             out.data(), pool_, Activations::kInt8, &variant)
                          .is_ok());
          ASSERT_EQ(0, std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)))
              << "layout " << int(layout);
        }
      }
    }
  }
}

TEST_P(CpuKernels, Int8ActivationsStayWithinTheirQuantizationErrorOfTheExactProduct) {
  // The stated tolerance: a code is within half a step (the row's scale) of x * 127 / max |x|, so
  // a result is within scale_x / 2 x sum |code value x weight scale| of the exact product of the
  // f32 row and the weight's values (plus f32 rounding). Rows with an outlier 50 times their
  // other elements, where per-token scales are at their coarsest, too.
  const int64_t rows = 9, in = 512, out_features = 24;
  const QuantizedTensor w = quantized(DType::kI8, out_features, in, 1, in, 93);
  std::vector<float> x = random_floats(rows * in, 94);
  for (int64_t r = 0; r < rows; r += 2) x[r * in + 7 * r] = 50.0f;
  const std::vector<float> out = int8_activations_matmul(x, rows, w, pool_);
  double worst = 0;  // the largest error as a share of its bound
  for (int64_t r = 0; r < rows; ++r) {
    const Int8Row row = quantize_row(x.data() + r * in, in);
    for (int64_t f = 0; f < out_features; ++f) {
      double exact = 0, weight_sum = 0, magnitude = 0;
      for (int64_t i = 0; i < in; ++i) {
        const double value = static_cast<int8_t>(w.codes[f * in + i]) * double(w.scales[f]);
        exact += x[r * in + i] * value;
        weight_sum += std::abs(value);
        magnitude += std::abs(x[r * in + i] * value);
      }
      const double bound = 0.5 * row.scale * weight_sum + 4 * kUnitRoundoff * magnitude;
      const double error = std::abs(out[r * out_features + f] - exact);
      ASSERT_LE(error, bound) << "row " << r << " feature " << f;
      worst = std::max(worst, error / bound);
    }
  }
  // Rounding errors that do not cancel: the bound is not loose by orders of magnitude.
  EXPECT_GT(worst, 0.01);
}

TEST_P(CpuKernels, Int8ActivationsLeaveOtherWeightsToBf16AndF32AndRefuseTooLongRows) {
  // kInt8 is kBF16 for bf16 and FP8 weights, and f32 for block-wise INT8 scales, bitwise; a row
  // with a NaN or an infinity gives NaN results in that row alone; rows of more than 133,000
  // columns (whose code sums int32 might not hold) are refused.
  const int64_t rows = 8, in = 70, out_features = 12;
  std::vector<float> x = random_floats(rows * in, 95);
  x[2 * in + 5] = std::numeric_limits<float>::quiet_NaN();
  x[5 * in + 9] = std::numeric_limits<float>::infinity();
  const StoredTensor bf16 = store(random_floats(out_features * in, 96), DType::kBF16);
  struct Case {
    DType dtype;
    int64_t block_cols;
    Activations same_as;
  };
  for (const Case c :
       {Case{DType::kBF16, 0, Activations::kBF16}, Case{DType::kF8E4M3, in, Activations::kBF16},
        Case{DType::kI8, 16, Activations::kF32}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    const QuantizedTensor q = is_quantized(c.dtype)
                                  ? quantized(c.dtype, out_features, in, 1, c.block_cols, 97)
                                  : QuantizedTensor{};
    const void* weight = is_quantized(c.dtype) ? q.codes.data() : bf16.data(DType::kBF16);
    const std::vector<uint8_t> packed = tiled(weight, out_features, in, c.dtype);
    MatmulParams params{rows, in, out_features, c.dtype, DType::kF32, 1, c.block_cols};
    params.weight_layout = WeightLayout::kTiled;
    const float* scales = is_quantized(c.dtype) ? q.scales.data() : nullptr;
    std::vector<float> int8(rows * out_features), other(rows * out_features);
    ASSERT_TRUE(matmul(params, x.data(), packed.data(), scales, nullptr, int8.data(), pool_,
                       Activations::kInt8)
                    .is_ok());
    ASSERT_TRUE(
        matmul(params, x.data(), packed.data(), scales, nullptr, other.data(), pool_, c.same_as)
            .is_ok());
    ASSERT_EQ(0, std::memcmp(int8.data(), other.data(), int8.size() * sizeof(float)));
  }
  const QuantizedTensor w = quantized(DType::kI8, out_features, in, 1, in, 98);
  const std::vector<float> out = int8_activations_matmul(x, rows, w, pool_);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t f = 0; f < out_features; ++f) {
      EXPECT_EQ(r == 2 || r == 5, std::isnan(out[r * out_features + f])) << r << " " << f;
    }
  }
  const int64_t long_row = 133'001;
  const QuantizedTensor wide = quantized(DType::kI8, 1, long_row, 1, long_row, 99);
  const std::vector<float> long_x(long_row, 1.0f);
  float one_out = 0;
  const Status status = matmul(wide.params(1), long_x.data(), wide.codes.data(), wide.scales.data(),
                               nullptr, &one_out, pool_, Activations::kInt8);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("133,000 columns"), std::string::npos) << status.message();
}

// ---- the tile multiply (AMX) --------------------------------------------------------------------

TEST_P(CpuKernels, AGroupOfPairTiledWeightsIsEachMatmulBitwise) {
  // Widths that leave tails of 16-row groups and make thread ranges cross targets; a bias on
  // one; rows in one block, two, and two and a tail.
  const MatmulVariant* amx = amx_variant();
  if (amx == nullptr) GTEST_SKIP() << "no AMX here";
  const int64_t in = 72;
  const int64_t widths[] = {37, 16, 5};
  std::vector<StoredTensor> weights;
  std::vector<std::vector<uint8_t>> packed;
  for (int t = 0; t < 3; ++t) {
    weights.push_back(store(random_floats(widths[t] * in, 20 + t), DType::kBF16));
    packed.push_back(laid_out(WeightLayout::kPairTiles, weights[t].data(DType::kBF16), widths[t],
                              in, DType::kBF16));
  }
  const StoredTensor bias = store(random_floats(widths[1], 24), DType::kBF16);
  for (const int64_t rows : {1, 6, 32, 37}) {
    const std::vector<float> x = random_floats(rows * in, 25 + rows);
    std::vector<std::vector<float>> grouped(3), alone(3);
    MatmulTarget targets[3];
    for (int t = 0; t < 3; ++t) {
      MatmulParams params{rows, in, widths[t], DType::kBF16, DType::kBF16};
      params.weight_layout = WeightLayout::kPairTiles;
      grouped[t].assign(static_cast<size_t>(rows * widths[t]), -1.0f);
      alone[t].assign(static_cast<size_t>(rows * widths[t]), -2.0f);
      targets[t] = {params, packed[t].data(), nullptr, t == 1 ? bias.data(DType::kBF16) : nullptr,
                    grouped[t].data()};
    }
    ASSERT_TRUE(matmul_group(x.data(), targets, 3, pool_, Activations::kBF16, amx).is_ok());
    for (int t = 0; t < 3; ++t) {
      ASSERT_TRUE(matmul(targets[t].params, x.data(), targets[t].weight, nullptr, targets[t].bias,
                         alone[t].data(), pool_, Activations::kBF16, amx)
                      .is_ok());
      EXPECT_EQ(grouped[t], alone[t]) << "target " << t << " rows " << rows;
    }
  }
}

TEST(CpuKernelsThreads, PairTiledMatmulIsThreadCountInvariantBitwise) {
  const MatmulVariant* amx = amx_variant();
  if (amx == nullptr) GTEST_SKIP() << "no AMX here";
  const int64_t rows = 35, in = 130, out_features = 75;
  const std::vector<float> x = random_floats(rows * in, 30);
  const StoredTensor weight = store(random_floats(out_features * in, 31), DType::kBF16);
  const std::vector<uint8_t> packed =
      laid_out(WeightLayout::kPairTiles, weight.data(DType::kBF16), out_features, in, DType::kBF16);
  MatmulParams params{rows, in, out_features, DType::kBF16, DType::kF32};
  params.weight_layout = WeightLayout::kPairTiles;
  std::vector<float> reference;
  for (const int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    std::vector<float> out(rows * out_features);
    ASSERT_TRUE(matmul(params, x.data(), packed.data(), nullptr, nullptr, out.data(), pool,
                       Activations::kBF16, amx)
                    .is_ok());
    if (reference.empty()) reference = out;
    ASSERT_EQ(0, std::memcmp(out.data(), reference.data(), out.size() * sizeof(float)))
        << threads << " threads";
  }
}

TEST_P(CpuKernels, PairTiledWeightsAreReadOnlyByTheTileMultiplyWithBf16Activations) {
  const int64_t rows = 2, in = 32, out_features = 16;
  const std::vector<float> x = random_floats(rows * in, 32);
  const StoredTensor weight = store(random_floats(out_features * in, 33), DType::kBF16);
  const std::vector<uint8_t> packed =
      laid_out(WeightLayout::kPairTiles, weight.data(DType::kBF16), out_features, in, DType::kBF16);
  MatmulParams params{rows, in, out_features, DType::kBF16, DType::kF32};
  params.weight_layout = WeightLayout::kPairTiles;
  std::vector<float> out(rows * out_features);
  // Every other copy refuses them, whatever the activations.
  for (const MatmulVariant& variant : matmul_variants()) {
    if (variant.bf16_pairs_layout == WeightLayout::kPairTiles || !variant.supported()) continue;
    for (const Activations activations : {Activations::kF32, Activations::kBF16}) {
      const Status status = matmul(params, x.data(), packed.data(), nullptr, nullptr, out.data(),
                                   pool_, activations, &variant);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << variant.name;
      EXPECT_NE(status.message().find("pair tiles"), std::string::npos) << status.message();
    }
  }
  const MatmulVariant* amx = amx_variant();
  if (amx == nullptr) return;
  // The amx copy refuses them with f32 activations (it has no exact-f32 tile multiply).
  const Status status = matmul(params, x.data(), packed.data(), nullptr, nullptr, out.data(), pool_,
                               Activations::kF32, amx);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bf16 activations"), std::string::npos) << status.message();
}

TEST_P(CpuKernels, Bf16ActivationsLeaveOtherWeightDtypesExact) {
  // In a group with a bf16 weight, an f32 weight still multiplies the f32 activations.
  const int64_t rows = 5, in = 48;
  const std::vector<float> x = random_floats(rows * in, 85);
  const StoredTensor bf16 = store(random_floats(12 * in, 86), DType::kBF16);
  const StoredTensor f32 = store(random_floats(8 * in, 87), DType::kF32);
  std::vector<float> grouped_bf16(rows * 12), grouped_f32(rows * 8), exact_f32(rows * 8),
      exact_bf16(rows * 12);
  const MatmulTarget targets[2] = {{{rows, in, 12, DType::kBF16, DType::kF32},
                                    bf16.data(DType::kBF16),
                                    nullptr,
                                    nullptr,
                                    grouped_bf16.data()},
                                   {{rows, in, 8, DType::kF32, DType::kF32},
                                    f32.data(DType::kF32),
                                    nullptr,
                                    nullptr,
                                    grouped_f32.data()}};
  ASSERT_TRUE(matmul_group(x.data(), targets, 2, pool_, Activations::kBF16).is_ok());
  ASSERT_TRUE(matmul(targets[1].params, x.data(), f32.data(DType::kF32), nullptr, nullptr,
                     exact_f32.data(), pool_)
                  .is_ok());
  EXPECT_EQ(grouped_f32, exact_f32);
  ASSERT_TRUE(matmul(targets[0].params, x.data(), bf16.data(DType::kBF16), nullptr, nullptr,
                     exact_bf16.data(), pool_)
                  .is_ok());
  EXPECT_NE(grouped_bf16, exact_bf16);  // the rounded activations did change the bf16 target
}

// ---- the matmul's copies per instruction set ---------------------------------------------------

TEST_P(CpuKernels, EveryCopyOfTheMatmulGivesTheSameBitsForF32Activations) {
  // The build's copies (a native build keeps an x86-64-v3 one; a portable build an AVX-512 one)
  // share one reduction order: whichever the CPU gets, a result is the same.
  std::vector<const MatmulVariant*> runnable;
  for (const MatmulVariant& variant : matmul_variants()) {
    if (variant.supported()) runnable.push_back(&variant);
  }
  EXPECT_EQ(&best_matmul_variant(), runnable.front());
  if (runnable.size() < 2) GTEST_SKIP() << "one copy of the matmul runs on this CPU";
  const int64_t in = 83, out_features = 37;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kI8}) {
    StoredTensor weight;
    QuantizedTensor codes{};
    const void* row_major = nullptr;
    const float* scales = nullptr;
    if (is_quantized(dtype)) {
      codes = quantized(dtype, out_features, in, 1, in, 90);
      row_major = codes.codes.data();
      scales = codes.scales.data();
    } else {
      weight = store(random_floats(out_features * in, 91), dtype);
      row_major = weight.data(dtype);
    }
    const std::vector<uint8_t> packed = tiled(row_major, out_features, in, dtype);
    for (const int64_t rows : {1, 5, 70}) {
      const std::vector<float> x = random_floats(rows * in, 92 + rows);
      MatmulParams params{rows, in, out_features, dtype, DType::kF32, 1, in};
      params.weight_layout = WeightLayout::kTiled;
      std::vector<float> first(rows * out_features);
      ASSERT_TRUE(matmul(params, x.data(), packed.data(), scales, nullptr, first.data(), pool_,
                         Activations::kF32, runnable[0])
                      .is_ok());
      for (size_t v = 1; v < runnable.size(); ++v) {
        std::vector<float> other(rows * out_features, -1.0f);
        ASSERT_TRUE(matmul(params, x.data(), packed.data(), scales, nullptr, other.data(), pool_,
                           Activations::kF32, runnable[v])
                        .is_ok());
        ASSERT_EQ(0, std::memcmp(other.data(), first.data(), other.size() * sizeof(float)))
            << runnable[v]->name << " against " << runnable[0]->name << ", " << dtype_name(dtype)
            << ", rows " << rows;
      }
    }
  }
}

TEST_P(CpuKernels, FillIsTheHashRoundedToTheDtype) {
  const int64_t count = 100003;  // not a multiple of any chunk
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> out(static_cast<size_t>(count) * dtype_size(dtype));
    ASSERT_TRUE(fill_uniform({count, dtype, 77, -0.5f, 0.25f}, out.data(), pool_).is_ok());
    double sum = 0;
    for (int64_t i = 0; i < count; ++i) {
      const float expected = -0.5f + 0.75f * uniform_at(77, static_cast<uint64_t>(i));
      const float stored = load_as_f32(out.data(), dtype, static_cast<size_t>(i));
      const float rounded = dtype == DType::kF32    ? expected
                            : dtype == DType::kBF16 ? bf16_to_f32(f32_to_bf16(expected))
                                                    : f16_to_f32(f32_to_f16(expected));
      ASSERT_EQ(stored, rounded) << i;
      ASSERT_GE(stored, -0.5f);
      ASSERT_LE(stored, 0.25f);
      sum += stored;
    }
    EXPECT_NEAR(sum / double(count), -0.125, 0.005);  // a uniform's mean
  }
  std::vector<float> constant(10);
  ASSERT_TRUE(fill_uniform({10, DType::kF32, 1, 1.0f, 1.0f}, constant.data(), pool_).is_ok());
  for (const float value : constant) EXPECT_EQ(value, 1.0f);
  EXPECT_EQ(fill_uniform({10, DType::kF32, 1, 1.0f, 0.0f}, constant.data(), pool_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(fill_uniform({-1, DType::kF32, 1, 0.0f, 1.0f}, constant.data(), pool_).code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CpuKernels, FillWritesQuantizedCodesRoundedToNearestEven) {
  // Codes over their whole range (and past it, where they saturate): synthetic quantized weights.
  const int64_t count = 100003;
  std::vector<uint8_t> fp8(static_cast<size_t>(count));
  ASSERT_TRUE(fill_uniform({count, DType::kF8E4M3, 5, -500.0f, 500.0f}, fp8.data(), pool_).is_ok());
  std::vector<int8_t> int8(static_cast<size_t>(count));
  ASSERT_TRUE(fill_uniform({count, DType::kI8, 6, -130.0f, 130.0f}, int8.data(), pool_).is_ok());
  int saturated_fp8 = 0, saturated_int8 = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float fp8_value = -500.0f + 1000.0f * uniform_at(5, static_cast<uint64_t>(i));
    ASSERT_EQ(fp8[static_cast<size_t>(i)], f32_to_f8e4m3(fp8_value)) << i;
    ASSERT_LE(std::fabs(f8e4m3_to_f32(fp8[static_cast<size_t>(i)])), kF8E4M3Max) << i;
    saturated_fp8 += std::fabs(fp8_value) > kF8E4M3Max;
    const float int8_value = -130.0f + 260.0f * uniform_at(6, static_cast<uint64_t>(i));
    const float rounded = std::clamp(std::nearbyint(int8_value), -128.0f, 127.0f);
    ASSERT_EQ(int8[static_cast<size_t>(i)], static_cast<int8_t>(rounded)) << i;
    ASSERT_LE(std::fabs(int8[static_cast<size_t>(i)] - int8_value), 3.0f) << i;
    saturated_int8 += std::fabs(int8_value) > 127.5f;
  }
  EXPECT_GT(saturated_fp8, 0);
  EXPECT_GT(saturated_int8, 0);
}

INSTANTIATE_TEST_SUITE_P(Threads, CpuKernels, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "threads";
                         });

}  // namespace
}  // namespace specrun::kernels::cpu
