#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/core/dtype.h"
#include "runtime/base/check.h"
#include "runtime/sampling/rng.h"

namespace specrun {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_FALSE(parse_dtype("I64").has_value());
  EXPECT_FALSE(parse_dtype("bf16").has_value());  // the format spells dtypes in capitals
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is half way too: rounds up to the even neighbour.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81);  // just above half way
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
}

TEST(DType, Bf16RoundTripIsExactForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = bf16_to_f32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_bf16(value), bits);
  }
}

TEST(DType, F16RoundTripIsExactForEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = f16_to_f32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(value))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(value), bits) << "pattern " << bits;
  }
}

TEST(DType, F16ConversionMatchesTheHardwareType) {
#if defined(__FLT16_MANT_DIG__)
  // The compiler's _Float16 conversions are correctly rounded: use them as the oracle over random
  // values spanning subnormals, normals and overflow.
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    const double magnitude = std::ldexp(rng.uniform(), static_cast<int>(rng.next() % 50) - 30);
    const float value = static_cast<float>(rng.next() % 2 ? magnitude : -magnitude);
    const _Float16 half = static_cast<_Float16>(value);
    uint16_t expected;
    std::memcpy(&expected, &half, sizeof(expected));
    ASSERT_EQ(f32_to_f16(value), expected) << value;
    ASSERT_EQ(f16_to_f32(expected), static_cast<float>(half));
  }
#else
  GTEST_SKIP() << "no _Float16 in this compiler";
#endif
}

TEST(DType, F16EdgeCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);    // the largest half
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);    // half way to the next: rounds to infinity
  EXPECT_EQ(f32_to_f16(0x1.0p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1.0p-25f), 0x0000);  // half of it: ties to even (zero)
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1.0p-24f);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
}

TEST(Check, ThrowsWithExpressionFileAndContext) {
  try {
    const int value = 3;
    SPECRUN_CHECK(value == 4) << "value was " << value;
    FAIL() << "no throw";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("value == 4"), std::string::npos) << message;
    EXPECT_NE(message.find("test_dtype.cpp"), std::string::npos) << message;
    EXPECT_NE(message.find("value was 3"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(SPECRUN_CHECK(1 + 1 == 2));
}

TEST(Check, StatusBecomesAnErrorNamingTheOperation) {
  try {
    SPECRUN_CHECK_OK(Status::invalid_argument("rows must be positive"), "layer 3 q_proj");
    FAIL() << "no throw";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("layer 3 q_proj"), std::string::npos) << message;
    EXPECT_NE(message.find("invalid argument: rows must be positive"), std::string::npos);
  }
  EXPECT_NO_THROW(SPECRUN_CHECK_OK(Status::ok(), "nothing"));
}

TEST(Check, DebugCheckIsCompiledOutUnderNdebug) {
  int evaluations = 0;
  SPECRUN_DCHECK(++evaluations > 0);
#ifdef NDEBUG
  EXPECT_EQ(evaluations, 0);
#else
  EXPECT_EQ(evaluations, 1);
#endif
}

}  // namespace
}  // namespace specrun
