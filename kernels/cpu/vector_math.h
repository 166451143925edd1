// Deterministic building blocks of the CPU kernels. Each reduction keeps kLanes independent
// partial sums that advance in index order and are folded by one fixed tree, so a result depends
// only on its inputs: never on how many rows share a call, which thread computes it, or how the
// compiler vectorises the lanes. The kernels are compiled with -ffp-contract=off so that the only
// fused multiply-adds are the explicit ones below.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/core/dtype.h"

namespace specrun::kernels::cpu {

inline constexpr int kLanes = 16;

// acc + a * b, fused where the target has FMA (one rounding), otherwise two roundings; either
// way the same everywhere in one build.
inline float multiply_add(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return acc + a * b;
#endif
}

// Folds the lanes pairwise: ((0+8)+(4+12)) + ... in one fixed order.
inline float fold_lanes(float (&lanes)[kLanes]) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// Widens `count` (<= kLanes) elements of a weight row starting at `offset` into `out`; the rest of
// `out` is zero.
template <DType kDType>
inline void load_lanes(const void* row, int64_t offset, int count, float (&out)[kLanes]) {
  if constexpr (kDType == DType::kF32) {
    const float* source = static_cast<const float*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = l < count ? source[l] : 0.0f;
  } else if constexpr (kDType == DType::kBF16) {
    const uint16_t* source = static_cast<const uint16_t*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = l < count ? bf16_to_f32(source[l]) : 0.0f;
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = l < count ? f16_to_f32(source[l]) : 0.0f;
  }
}

// Full-width variant of load_lanes, without the per-lane bounds test in the hot loop.
template <DType kDType>
inline void load_full_lanes(const void* row, int64_t offset, float (&out)[kLanes]) {
  if constexpr (kDType == DType::kF32) {
    const float* source = static_cast<const float*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = source[l];
  } else if constexpr (kDType == DType::kBF16) {
    const uint16_t* source = static_cast<const uint16_t*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = bit_cast_f32(static_cast<uint32_t>(source[l]) << 16);
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(row) + offset;
#if defined(__F16C__) && defined(__FLT16_MANT_DIG__)
    for (int l = 0; l < kLanes; ++l) {
      _Float16 half;
      std::memcpy(&half, source + l, sizeof(half));
      out[l] = static_cast<float>(half);
    }
#else
    for (int l = 0; l < kLanes; ++l) out[l] = f16_to_f32(source[l]);
#endif
  }
}

// results[r] = dot(x[r], weight_row) for kRows activation rows against one weight row of length n.
template <DType kDType, int kRows>
inline void dot_rows(const float* const (&x)[kRows], const void* weight_row, int64_t n,
                     float (&results)[kRows]) {
  float acc[kRows][kLanes] = {};
  float w[kLanes];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    load_full_lanes<kDType>(weight_row, i, w);
    for (int r = 0; r < kRows; ++r) {
      for (int l = 0; l < kLanes; ++l) acc[r][l] = multiply_add(x[r][i + l], w[l], acc[r][l]);
    }
  }
  if (i < n) {
    const int count = static_cast<int>(n - i);
    load_lanes<kDType>(weight_row, i, count, w);
    for (int r = 0; r < kRows; ++r) {
      for (int l = 0; l < count; ++l) acc[r][l] = multiply_add(x[r][i + l], w[l], acc[r][l]);
    }
  }
  for (int r = 0; r < kRows; ++r) results[r] = fold_lanes(acc[r]);
}

// dot(a, b) over f32 vectors with the same lane order as dot_rows.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  const float* rows[1] = {a};
  float result[1];
  dot_rows<DType::kF32, 1>(rows, b, n, result);
  return result[0];
}

}  // namespace specrun::kernels::cpu
