// GGUF's 4- and 8-bit blocks (Q4_0, Q4_1, Q8_0) kept as stored: their values, the CPU matmul of
// every copy against the rule kernels/cpu/matmul.h states (enumerated here one product at a time)
// and against the dequantised weights in double, batch invariance, the embedding lookup, and the
// shapes the backends refuse.
//
// Tolerance of the per-block int8 path against the exact product: an activation block quantized
// with scale s = max |x| / 127 puts each activation within s / 2 of its value, so a block's result
// is within (s / 2) * sum |w| of the exact one; the f32 sums add at most k * 2^-24 * sum |x w|
// (each step one rounding, the lane split only shortening the chains), doubled for the scales'
// products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/core/weight_layout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fill.h"
#include "kernels/cpu/matmul.h"
#include "runtime/model/gguf.h"
#include "tests/test_support.h"

namespace specrun::kernels::cpu {
namespace {

constexpr DType kBlockTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0};

void put_f16(uint8_t* at, float value) {
  const uint16_t bits = f32_to_f16(value);
  at[0] = static_cast<uint8_t>(bits & 0xff);
  at[1] = static_cast<uint8_t>(bits >> 8);
}

// [rows, k] of `dtype`: random codes, scales in [0.002, 0.05] (negative for some blocks, as
// llama.cpp's quantizer writes them) and Q4_1 offsets in [-0.4, 0.1].
std::vector<uint8_t> random_blocks(DType dtype, int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), offset(-0.4f, 0.1f);
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t block_bytes = dtype_block_bytes(dtype);
  std::vector<uint8_t> blocks(dtype_bytes(dtype, static_cast<uint64_t>(rows * k)));
  for (size_t at = 0; at < blocks.size(); at += block_bytes) {
    uint8_t* block = blocks.data() + at;
    for (size_t i = 0; i < block_bytes; ++i) block[i] = static_cast<uint8_t>(byte(random));
    put_f16(block, (at / block_bytes) % 5 == 3 ? -scale(random) : scale(random));
    if (dtype == DType::kQ4_1) put_f16(block + 2, offset(random));
  }
  return blocks;
}

std::vector<float> dequantized(const std::vector<uint8_t>& blocks, DType dtype, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = load_as_f32(blocks.data(), dtype, i);
  return values;
}

// The per-block int8 rule of kernels/cpu/matmul.h, one product at a time: each activation block
// quantized (codes round(x * 127 / max |x|), scale max |x| / 127), the code products summed in
// eight lanes of four columns, each lane's sum times the two blocks' scales added to the lane with
// one rounding (a fused multiply-add), the lanes folded (l + l+4, l + l+2, 0 + 1), Q4_1's offsets
// times the activation block's scale times its codes' sum added (fused) on their own, then once.
float rule_dot(const float* x, const uint8_t* row, DType dtype, int64_t k) {
  float lanes[8] = {};
  float offsets = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    const uint8_t* block = row + b * dtype_block_bytes(dtype);
    float largest = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      largest = std::max(largest, std::fabs(xb[j]));
      finite = finite && std::isfinite(xb[j]);
    }
    const float inverse = finite && largest > 0.0f ? 127.0f / largest : 0.0f;
    const float x_scale = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
    int codes[32];
    int code_sum = 0;
    for (int j = 0; j < 32; ++j) {
      codes[j] = static_cast<int>(std::nearbyint(xb[j] * inverse));
      code_sum += codes[j];
    }
    const float d = block_f16(block, 0);
    for (int l = 0; l < 8; ++l) {
      int sum = 0;
      for (int j = 4 * l; j < 4 * l + 4; ++j) {
        int w = 0;
        if (dtype == DType::kQ8_0) {
          w = static_cast<int8_t>(block[2 + j]);
        } else {
          const uint8_t byte = block[(dtype == DType::kQ4_1 ? 4 : 2) + j % 16];
          w = j < 16 ? byte & 15 : byte >> 4;
          if (dtype == DType::kQ4_0) w -= 8;
        }
        sum += w * codes[j];
      }
      lanes[l] = std::fma(static_cast<float>(sum), d * x_scale, lanes[l]);
    }
    if (dtype == DType::kQ4_1) {
      offsets = std::fma(block_f16(block, 2), x_scale * static_cast<float>(code_sum), offsets);
    }
  }
  for (int width = 4; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0] + offsets;
}

// The copies of the matmul this CPU runs.
std::vector<const MatmulVariant*> runnable_variants() {
  std::vector<const MatmulVariant*> runnable;
  for (const MatmulVariant& variant : matmul_variants()) {
    if (variant.supported()) runnable.push_back(&variant);
  }
  return runnable;
}

// Whether a copy fuses its multiply-adds (every x86 copy but a portable build's), so that the
// rule's fused steps are its bits.
bool fuses(const MatmulVariant& variant) {
  return variant.name != "portable";
}

class GgufBlockMatmul : public ::testing::TestWithParam<int> {
 protected:
  ThreadPool pool_{GetParam()};
};

TEST(GgufBlockDtype, SizesNamesAndValues) {
  EXPECT_TRUE(is_block_quantized(DType::kQ4_0));
  EXPECT_FALSE(is_block_quantized(DType::kI8));
  EXPECT_FALSE(is_quantized(DType::kQ8_0));  // no scale grid: the scales are in the blocks
  EXPECT_EQ(dtype_bytes(DType::kQ4_0, 64), 36u);
  EXPECT_EQ(dtype_bytes(DType::kQ4_1, 96), 60u);
  EXPECT_EQ(dtype_bytes(DType::kQ8_0, 32), 34u);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 3), 6u);
  EXPECT_EQ(dtype_name(DType::kQ4_1), "Q4_1");
  EXPECT_EQ(kernels::stored_weight_bytes(WeightLayout::kRows, 3, 64, DType::kQ8_0), 3u * 68u);
  // Hand-made blocks: d = 0.5 (and m = -1), codes 0..15 in the low nibbles, 15..0 in the high.
  uint8_t q4[20] = {};
  put_f16(q4, 0.5f);
  for (int j = 0; j < 16; ++j) q4[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_0, 0), -4.0f);   // (0 - 8) * 0.5
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_0, 15), 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_0, 16), 3.5f);   // high nibble of byte 0: 15
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_0, 31), -4.0f);  // high nibble of byte 15: 0
  put_f16(q4 + 2, -1.0f);
  for (int j = 0; j < 16; ++j) q4[4 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_1, 3), 0.5f);   // 3 * 0.5 - 1
  EXPECT_EQ(load_as_f32(q4, DType::kQ4_1, 16), 6.5f);  // 15 * 0.5 - 1
  uint8_t q8[34] = {};
  put_f16(q8, 0.25f);
  q8[2 + 5] = static_cast<uint8_t>(-128);
  q8[2 + 31] = 127;
  EXPECT_EQ(load_as_f32(q8, DType::kQ8_0, 5), -32.0f);
  EXPECT_EQ(load_as_f32(q8, DType::kQ8_0, 31), 31.75f);
  EXPECT_EQ(load_as_f32(q8, DType::kQ8_0, 6), 0.0f);
  // One definition of the bits: the GGUF reader's dequantiser is this one.
  const std::vector<uint8_t> blocks = random_blocks(DType::kQ4_1, 1, 64, 3);
  std::vector<float> read(64);
  dequantize(kGgmlQ4_1, blocks.data(), 64, read.data());
  EXPECT_EQ(read, dequantized(blocks, DType::kQ4_1, 64));
}

TEST_P(GgufBlockMatmul, F32ActivationsAreBitwiseTheDequantisedWeights) {
  for (const DType dtype : kBlockTypes) {
    for (const int64_t k : {32, 96, 576}) {
      const int64_t out_features = 37;
      const std::vector<uint8_t> blocks = random_blocks(dtype, out_features, k, 11);
      const std::vector<float> widened = dequantized(blocks, dtype, out_features * k);
      const std::vector<float> bias = testing::random_floats(out_features, 12);
      for (const int64_t rows : {1, 3, 6, 17}) {
        const std::vector<float> x = testing::random_floats(rows * k, 13 + rows);
        for (const MatmulVariant* variant : runnable_variants()) {
          MatmulParams params{rows, k, out_features, dtype, DType::kF32};
          std::vector<float> out(rows * out_features, -1.0f), reference(out.size(), -2.0f);
          ASSERT_TRUE(matmul(params, x.data(), blocks.data(), nullptr, bias.data(), out.data(),
                             pool_, Activations::kF32, variant)
                          .is_ok());
          params.weight_dtype = DType::kF32;
          ASSERT_TRUE(matmul(params, x.data(), widened.data(), nullptr, bias.data(),
                             reference.data(), pool_, Activations::kF32, variant)
                          .is_ok());
          ASSERT_EQ(0, std::memcmp(out.data(), reference.data(), out.size() * sizeof(float)))
              << dtype_name(dtype) << " k " << k << " rows " << rows << " " << variant->name;
        }
      }
    }
  }
}

TEST_P(GgufBlockMatmul, Int8BlocksFollowTheRuleAndStayWithinItsBound) {
  for (const DType dtype : kBlockTypes) {
    for (const int64_t k : {32, 160, 1536}) {
      const int64_t out_features = 19;
      const std::vector<uint8_t> blocks = random_blocks(dtype, out_features, k, 21);
      const std::vector<float> widened = dequantized(blocks, dtype, out_features * k);
      const int64_t row_bytes = static_cast<int64_t>(dtype_bytes(dtype, static_cast<uint64_t>(k)));
      for (const int64_t rows : {1, 2, 5, 8, 9, 16}) {
        const std::vector<float> x = testing::random_floats(rows * k, 23 + rows);
        for (const MatmulVariant* variant : runnable_variants()) {
          for (const Activations activations :
               {Activations::kBF16, Activations::kInt8, Activations::kF32Int8Blocks}) {
            const MatmulParams params{rows, k, out_features, dtype, DType::kF32};
            std::vector<float> out(rows * out_features, -1.0f);
            ASSERT_TRUE(matmul(params, x.data(), blocks.data(), nullptr, nullptr, out.data(), pool_,
                               activations, variant)
                            .is_ok());
            for (int64_t r = 0; r < rows; ++r) {
              const float* xr = x.data() + r * k;
              for (int64_t f = 0; f < out_features; ++f) {
                const float got = out[r * out_features + f];
                const float rule = rule_dot(xr, blocks.data() + f * row_bytes, dtype, k);
                if (fuses(*variant)) {
                  ASSERT_EQ(got, rule) << dtype_name(dtype) << " k " << k << " rows " << rows
                                       << " row " << r << " feature " << f << " " << variant->name;
                }
                double exact = 0.0, bound = 0.0, magnitude = 0.0;
                for (int64_t b = 0; b < k / 32; ++b) {
                  double largest = 0.0, weights = 0.0;
                  for (int64_t j = b * 32; j < b * 32 + 32; ++j) {
                    const double w = widened[f * k + j];
                    exact += static_cast<double>(xr[j]) * w;
                    magnitude += std::fabs(static_cast<double>(xr[j]) * w);
                    largest = std::max(largest, std::fabs(static_cast<double>(xr[j])));
                    weights += std::fabs(w);
                  }
                  bound += largest / 127.0 / 2.0 * weights;
                }
                bound += 2.0 * static_cast<double>(k) * 0x1.0p-24 * (magnitude + bound);
                ASSERT_NEAR(got, exact, bound) << dtype_name(dtype) << " k " << k << " row " << r;
              }
            }
          }
        }
      }
    }
  }
}

TEST_P(GgufBlockMatmul, EveryCopyEveryRowCountAndEveryGroupGivesTheSameBits) {
  const std::vector<const MatmulVariant*> variants = runnable_variants();
  for (const DType dtype : kBlockTypes) {
    const int64_t k = 576, out_features = 45;
    const std::vector<uint8_t> blocks = random_blocks(dtype, out_features, k, 31);
    const int64_t rows = 13;
    const std::vector<float> x = testing::random_floats(rows * k, 32);
    for (const Activations activations : {Activations::kF32, Activations::kInt8}) {
      const MatmulParams params{rows, k, out_features, dtype, DType::kF32};
      std::vector<float> all(rows * out_features);
      ASSERT_TRUE(matmul(params, x.data(), blocks.data(), nullptr, nullptr, all.data(), pool_,
                         activations, variants[0])
                      .is_ok());
      // Each row alone, on every copy (the x86 copies with FMA agree bit for bit).
      for (const MatmulVariant* variant : variants) {
        if (fuses(*variant) != fuses(*variants[0])) continue;
        for (int64_t r = 0; r < rows; ++r) {
          const MatmulParams one{1, k, out_features, dtype, DType::kF32};
          std::vector<float> alone(out_features);
          ASSERT_TRUE(matmul(one, x.data() + r * k, blocks.data(), nullptr, nullptr, alone.data(),
                             pool_, activations, variant)
                          .is_ok());
          ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + r * out_features,
                                   alone.size() * sizeof(float)))
              << dtype_name(dtype) << " row " << r << " " << variant->name;
        }
      }
      // In a group with a bf16 weight of another width, the same bits.
      const int64_t other_features = 7;
      const testing::StoredTensor other =
          testing::store(testing::random_floats(other_features * k, 33), DType::kBF16);
      std::vector<float> grouped(rows * out_features), other_out(rows * other_features);
      MatmulParams other_params{rows, k, other_features, DType::kBF16, DType::kF32};
      other_params.weight_layout = WeightLayout::kTiled;
      const std::vector<uint8_t> other_tiled(
          stored_weight_bytes(WeightLayout::kTiled, other_features, k, DType::kBF16));
      ASSERT_TRUE(lay_out_weight(WeightLayout::kTiled, other.data(DType::kBF16), other_features, k,
                                 DType::kBF16, const_cast<uint8_t*>(other_tiled.data()))
                      .is_ok());
      const MatmulTarget targets[] = {
          {other_params, other_tiled.data(), nullptr, nullptr, other_out.data()},
          {params, blocks.data(), nullptr, nullptr, grouped.data()}};
      ASSERT_TRUE(matmul_group(x.data(), targets, 2, pool_, activations, variants[0]).is_ok());
      ASSERT_EQ(0, std::memcmp(grouped.data(), all.data(), all.size() * sizeof(float)))
          << dtype_name(dtype);
    }
  }
}

TEST_P(GgufBlockMatmul, ARowThatIsNotFiniteGivesNaNOnlyInItsOwnResults) {
  const int64_t k = 64, out_features = 5, rows = 3;
  const std::vector<uint8_t> blocks = random_blocks(DType::kQ4_1, out_features, k, 41);
  std::vector<float> x = testing::random_floats(rows * k, 42);
  x[1 * k + 40] = std::numeric_limits<float>::infinity();
  std::vector<float> out(rows * out_features);
  const MatmulParams params{rows, k, out_features, DType::kQ4_1, DType::kF32};
  ASSERT_TRUE(matmul(params, x.data(), blocks.data(), nullptr, nullptr, out.data(), pool_,
                     Activations::kInt8)
                  .is_ok());
  for (int64_t f = 0; f < out_features; ++f) {
    EXPECT_TRUE(std::isfinite(out[f]));
    EXPECT_TRUE(std::isnan(out[out_features + f]));
    EXPECT_TRUE(std::isfinite(out[2 * out_features + f]));
  }
  // A row of zeros is zero (its scale is zero, not NaN).
  std::fill(x.begin(), x.begin() + k, 0.0f);
  ASSERT_TRUE(matmul(params, x.data(), blocks.data(), nullptr, nullptr, out.data(), pool_,
                     Activations::kInt8)
                  .is_ok());
  for (int64_t f = 0; f < out_features; ++f) EXPECT_EQ(out[f], 0.0f);
}

TEST_P(GgufBlockMatmul, BadShapesAreRefused) {
  const std::vector<uint8_t> blocks = random_blocks(DType::kQ8_0, 4, 64, 51);
  const std::vector<float> x(64, 1.0f);
  std::vector<float> out(4);
  // in_features not a whole number of blocks.
  MatmulParams params{1, 48, 4, DType::kQ8_0, DType::kF32};
  EXPECT_EQ(matmul(params, x.data(), blocks.data(), nullptr, nullptr, out.data(), pool_).code(),
            StatusCode::kInvalidArgument);
  // Blocks lie in rows only.
  params.in_features = 64;
  params.weight_layout = WeightLayout::kTiled;
  EXPECT_EQ(matmul(params, x.data(), blocks.data(), nullptr, nullptr, out.data(), pool_).code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> laid(blocks.size());
  EXPECT_EQ(
      lay_out_weight(WeightLayout::kTiled, blocks.data(), 4, 64, DType::kQ8_0, laid.data()).code(),
      StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      lay_out_weight(WeightLayout::kRows, blocks.data(), 4, 64, DType::kQ8_0, laid.data()).is_ok());
  EXPECT_EQ(laid, blocks);
  // Blocks are read, never filled.
  const FillParams fill{64, DType::kQ4_0, 1, -1.0f, 1.0f};
  EXPECT_EQ(fill_uniform(fill, laid.data(), pool_).code(), StatusCode::kInvalidArgument);
}

TEST_P(GgufBlockMatmul, EmbeddingLooksUpTheBlocksValues) {
  for (const DType dtype : kBlockTypes) {
    const int64_t vocab = 11, dim = 96;
    const std::vector<uint8_t> table = random_blocks(dtype, vocab, dim, 61);
    const std::vector<float> values = dequantized(table, dtype, vocab * dim);
    const int32_t tokens[] = {3, 0, 10, 3};
    const EmbeddingParams params{4, vocab, dim, dtype, WeightLayout::kRows, 0.5f};
    std::vector<float> out(4 * dim);
    ASSERT_TRUE(embedding(params, tokens, table.data(), out.data(), pool_).is_ok());
    for (int t = 0; t < 4; ++t) {
      for (int64_t c = 0; c < dim; ++c) {
        ASSERT_EQ(out[t * dim + c], values[tokens[t] * dim + c] * 0.5f) << dtype_name(dtype);
      }
    }
    const EmbeddingParams ragged{1, vocab, 48, dtype};
    EXPECT_EQ(embedding(ragged, tokens, table.data(), out.data(), pool_).code(),
              StatusCode::kInvalidArgument);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GgufBlockMatmul, ::testing::Values(1, 2));

}  // namespace
}  // namespace specrun::kernels::cpu
