#include "kernels/core/dtype.h"

namespace specrun {

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
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
