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
  if (abs_bits > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  const float magnitude = bit_cast_f32(abs_bits);
  if (magnitude >= kF8E4M3Max) return static_cast<uint8_t>(sign | 0x7eu);  // saturate
  // Normal E4M3 numbers have f32 exponents 121..135 (2^-6 .. 2^8); below, the subnormal steps are
  // 2^-9 apart. Both are rounded to nearest even by scaling the step to 1 and using the FPU.
  const int exponent = static_cast<int>(abs_bits >> 23) - 127;
  const int step_exponent = exponent >= -6 ? exponent - 3 : -9;  // value of one mantissa step
  const float steps = std::nearbyint(std::ldexp(magnitude, -step_exponent));
  // `steps` counts units of 2^step_exponent; rebuild the code from the rounded value (which may
  // have carried into the next binade).
  const float rounded = std::ldexp(steps, step_exponent);
  if (rounded >= kF8E4M3Max) return static_cast<uint8_t>(sign | 0x7eu);
  if (rounded < 0x1.0p-6f) {
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::ldexp(rounded, 9)));
  }
  const uint32_t rounded_bits = bit_cast_u32(rounded);
  const uint32_t e = ((rounded_bits >> 23) & 0xffu) - 127u + 7u;  // 1..15
  const uint32_t m = (rounded_bits >> 20) & 0x7u;
  return static_cast<uint8_t>(sign | (e << 3) | m);
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
