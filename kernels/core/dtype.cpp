#include "kernels/core/dtype.h"

#include <cmath>

namespace specrun {

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "I8") return DType::kI8;
  return std::nullopt;
}

uint8_t f32_to_f8e4m3(float value) {
  const uint32_t bits = bit_cast_u32(value);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);                // NaN
  if (abs_bits >= bit_cast_u32(kF8E4M3Max)) return static_cast<uint8_t>(sign | 0x7eu);  // saturate
  if (abs_bits >= 0x3c800000u) {
    // Normal E4M3 (2^-6 up): the f32 mantissa rounded to its top 3 bits, to nearest even, in the
    // integer bits (a carry into the exponent is the next binade's first value, as it should be;
    // nothing below 448 rounds past it), then the exponent rebiased from 127 to 7.
    const uint32_t rounded = abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u);
    return static_cast<uint8_t>(sign | ((rounded >> 20) - (120u << 3)));
  }
  // Subnormal E4M3: steps of 2^-9, 0 to 8 of them (8 is 2^-6, the smallest normal's code). The
  // magnitude in steps is below 8, so adding 2^23 leaves the f32 unit at 1 and the hardware rounds
  // to the nearest step, ties to even.
  const float steps = bit_cast_f32(abs_bits) * 512.0f + 0x1.0p23f;
  return static_cast<uint8_t>(sign | (bit_cast_u32(steps) - bit_cast_u32(0x1.0p23f)));
}

uint16_t f32_to_f16(float value) {
  const uint32_t bits = bit_cast_u32(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs_bits >= 0x38800000u) {
    // Normal half: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
    const uint32_t rebiased = abs_bits - (112u << 23);
    const uint32_t rounded = rebiased + 0xfffu + ((rebiased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }
  if (abs_bits < 0x33000000u) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: shift the full mantissa (with its implicit bit) into place, rounding.
  const uint32_t exponent = abs_bits >> 23;
  const uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t remainder = mantissa & ((1u << shift) - 1u);
  uint32_t result = mantissa >> shift;
  if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

}  // namespace specrun
