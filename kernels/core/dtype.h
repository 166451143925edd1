// Storage types of weights and their conversions. Activations are always f32; weights stay in
// their stored dtype and are widened on the fly. The 8-bit types are quantized: an element is a
// code that a scale (per output channel, per block, or per tensor; see MatmulParams) turns back
// into the weight, so only matmul weights take them. The block types are GGUF's (llama.cpp's
// ggml-common.h), kept as a file stores them: blocks of 32 elements, each block its own f16 scale
// (and offset) with 4- or 8-bit codes, multiplied by matmuls and read by embedding lookups as they
// lie.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "kernels/core/isa_namespace.h"

namespace specrun {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // OCP FP8 E4M3 ("E4M3FN"): no infinities, NaN at 0x7F/0xFF, largest finite 448
  kI8,      // signed 8-bit integer codes
  kQ4_0,    // GGUF Q4_0 blocks: {f16 d, 16 bytes of nibbles}: x = (nibble - 8) * d
  kQ4_1,    // GGUF Q4_1 blocks: {f16 d, f16 m, 16 bytes of nibbles}: x = nibble * d + m
  kQ8_0,    // GGUF Q8_0 blocks: {f16 d, 32 int8 codes}: x = code * d
};

// Parses the safetensors spelling; nullopt for anything else (including dtypes specrun does not
// compute in, such as I64 or F64).
std::optional<DType> parse_dtype(std::string_view name);

// f32 to IEEE binary16, round to nearest even, overflow to infinity.
uint16_t f32_to_f16(float value);

// f32 to FP8 E4M3, round to nearest even; magnitudes past 448 saturate to 448 (quantization scales
// keep values inside); NaN stays NaN.
uint8_t f32_to_f8e4m3(float value);

// The inline functions, compiled again by each copy of the CPU matmul
// (kernels/core/isa_namespace.h).
inline namespace SPECRUN_ISA_NAMESPACE {

// Bytes of one element; 0 for the block types, whose elements are not whole bytes (dtype_bytes
// counts them).
constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kI8:
      return 1;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return 0;
  }
  return 0;
}

// Whether elements lie in GGUF blocks, each with its own scale (kQ4_0, kQ4_1, kQ8_0).
constexpr bool is_block_quantized(DType dtype) {
  return dtype == DType::kQ4_0 || dtype == DType::kQ4_1 || dtype == DType::kQ8_0;
}

// Elements one block holds: 32 for the block types, 1 for the others. A tensor of a block type has
// rows of whole blocks.
inline constexpr int64_t kQuantBlockElements = 32;
constexpr int64_t dtype_block_elements(DType dtype) {
  return is_block_quantized(dtype) ? kQuantBlockElements : 1;
}

// Bytes of one block (of one element where blocks are elements).
constexpr size_t dtype_block_bytes(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return 18;
    case DType::kQ4_1:
      return 20;
    case DType::kQ8_0:
      return 34;
    default:
      return dtype_size(dtype);
  }
}

// Bytes of `elements` elements of `dtype` (for a block type, a whole number of blocks).
constexpr uint64_t dtype_bytes(DType dtype, uint64_t elements) {
  return elements / static_cast<uint64_t>(dtype_block_elements(dtype)) * dtype_block_bytes(dtype);
}

// Whether elements are codes that need a scale to be weights.
constexpr bool is_quantized(DType dtype) {
  return dtype == DType::kF8E4M3 || dtype == DType::kI8;
}

// The safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "I8"; GGUF's for the block types
// ("Q4_0", "Q4_1", "Q8_0").
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kI8:
      return "I8";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ8_0:
      return "Q8_0";
  }
  return "?";
}

inline float bit_cast_f32(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint32_t bit_cast_u32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// bfloat16 is the top half of an f32, so widening is exact.
inline float bf16_to_f32(uint16_t bits) {
  return bit_cast_f32(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinities.
inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = bit_cast_u32(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16 to f32, exact, including subnormals, infinities and NaN.
inline float f16_to_f32(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) return bit_cast_f32(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bit_cast_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bit_cast_f32(sign);
  // Subnormal: normalise the mantissa.
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  mantissa &= 0x3ffu;
  return bit_cast_f32(sign | static_cast<uint32_t>(113 - shift) << 23 | (mantissa << 13));
}

// The largest finite FP8 E4M3 value.
inline constexpr float kF8E4M3Max = 448.0f;

// FP8 E4M3 to f32, exact, subnormals included; 0x7F and 0xFF are NaN.
inline float f8e4m3_to_f32(uint8_t code) {
  if ((code & 0x7fu) == 0x7fu) return std::numeric_limits<float>::quiet_NaN();
  // The exponent and mantissa bits placed at f32's mantissa top, then rescaled by 2^120: one
  // formula for normals and subnormals (the same the vector kernels use).
  const uint32_t bits =
      (static_cast<uint32_t>(code & 0x80u) << 24) | (static_cast<uint32_t>(code & 0x7fu) << 20);
  return bit_cast_f32(bits) * 0x1.0p120f;
}

// A block's little-endian f16 at byte `at` (blocks are only 2-byte aligned), widened.
inline float block_f16(const uint8_t* block, int at) {
  return f16_to_f32(static_cast<uint16_t>(block[at] | block[at + 1] << 8));
}

// Element j (0..31) of one block of a block type, as ggml dequantises it: codes 0..15 in the low
// nibbles of a Q4 block's 16 bytes, 16..31 in the high ones. The products are exact in f32 (a
// 4- or 8-bit code times an f16); Q4_1's offset is one rounding.
inline float block_element(const uint8_t* block, DType dtype, int j) {
  switch (dtype) {
    case DType::kQ4_0: {
      const uint8_t byte = block[2 + (j & 15)];
      return static_cast<float>((j < 16 ? byte & 0x0f : byte >> 4) - 8) * block_f16(block, 0);
    }
    case DType::kQ4_1: {
      const uint8_t byte = block[4 + (j & 15)];
      return static_cast<float>(j < 16 ? byte & 0x0f : byte >> 4) * block_f16(block, 0) +
             block_f16(block, 2);
    }
    case DType::kQ8_0:
      return static_cast<float>(static_cast<int8_t>(block[2 + j])) * block_f16(block, 0);
    default:
      return 0.0f;
  }
}

// One block of a block type to its 32 f32 values.
inline void dequantize_block(const uint8_t* block, DType dtype, float* out) {
  for (int j = 0; j < kQuantBlockElements; ++j) out[j] = block_element(block, dtype, j);
}

// Whether a block's scale (and offset) are finite: a block that is not turns every product NaN.
inline bool block_scales_finite(const uint8_t* block, DType dtype) {
  const bool scale_finite = std::isfinite(block_f16(block, 0));
  return dtype == DType::kQ4_1 ? scale_finite && std::isfinite(block_f16(block, 2)) : scale_finite;
}

// Reads element `index` of a buffer of `dtype` as f32 (a block type's element: its value).
inline float load_as_f32(const void* data, DType dtype, size_t index) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[index]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[index]);
    case DType::kF8E4M3:  // the code's value: its scale is applied by the caller
      return f8e4m3_to_f32(static_cast<const uint8_t*>(data)[index]);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(data)[index]);
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return block_element(static_cast<const uint8_t*>(data) +
                               index / kQuantBlockElements * dtype_block_bytes(dtype),
                           dtype, static_cast<int>(index % kQuantBlockElements));
  }
  return 0.0f;
}

}  // namespace SPECRUN_ISA_NAMESPACE
}  // namespace specrun
