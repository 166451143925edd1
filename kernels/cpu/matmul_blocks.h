// The matmul of GGUF's 4- and 8-bit blocks (Q4_0, Q4_1, Q8_0) as a file stores them, for
// matmul.cpp, which includes it inside each copy's namespace (compiled once per instruction set).
//
// Activations meet a block quantized per block (Activations' comment has the rule): one weight
// row is read once, block by block, by up to kBlockRowGroup activation rows, and each block's
// codes are unpacked to 32 signed bytes in registers. A decode step reads each thread's weight rows
// as one stream; a verification's rows share each unpacked block.
//
// The reference for the bits is block_dot_reference (and the tests' own enumeration of the rule).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu/vector_math.h"

#if !defined(SPECRUN_MATMUL_VARIANT)
#error "included by matmul.cpp, compiled once per instruction set"
#endif

namespace specrun::kernels::cpu::SPECRUN_MATMUL_VARIANT::block_matmul {

// Activation rows per pass over a weight row: eight accumulators, the unpacked block and the
// temporaries fit AVX2's 16 registers, and verifying up to 7 drafts reads each block once.
constexpr int kBlockRowGroup = 8;
// Up to this many rows (a decode step, a short verification), two weight rows at a time.
constexpr int kPairedRows = 2;
// Integer lanes a block's sum is kept in: lane j sums columns 4j..4j+3.
constexpr int kBlockLanes = 8;

// Activation rows quantized per block of 32 columns (quantize_block_rows).
struct BlockRows {
  // Not std::vectors: see matmul_features.
  std::unique_ptr<int8_t[]> codes;  // [rows, k]: round(x * 127 / max |x| of its block)
  std::unique_ptr<float[]> scales;  // [rows, blocks]: max |x| / 127; NaN where not finite
  std::unique_ptr<float[]> sums;    // [rows, blocks]: the scale times the block's codes' sum
  int64_t k = 0;                    // columns
  int64_t blocks = 0;               // k / 32
};

// The rule, one element at a time: every copy computes the same codes (one f32 division by 127
// for the inverse's numerator, one product, round to nearest even).
inline BlockRows quantize_block_rows(const float* x, int64_t rows, int64_t k) {
  BlockRows q;
  q.k = k;
  q.blocks = k / kQuantBlockElements;
  q.codes.reset(new int8_t[static_cast<size_t>(rows * k)]);
  q.scales.reset(new float[static_cast<size_t>(rows * q.blocks)]);
  q.sums.reset(new float[static_cast<size_t>(rows * q.blocks)]);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < q.blocks; ++b) {
      const float* block = x + r * k + b * kQuantBlockElements;
      int8_t* codes = q.codes.get() + r * k + b * kQuantBlockElements;
      float largest = 0.0f;
      bool finite = true;
      for (int j = 0; j < kQuantBlockElements; ++j) {
        largest = std::max(largest, std::fabs(block[j]));
        finite = finite && std::isfinite(block[j]);
      }
      const float inverse = finite && largest > 0.0f ? 127.0f / largest : 0.0f;
      int32_t code_sum = 0;
      for (int j = 0; j < kQuantBlockElements; ++j) {
        // A block that is not finite has codes zero (and a NaN scale): no NaN is converted.
        const auto code = finite ? static_cast<int32_t>(std::nearbyint(block[j] * inverse)) : 0;
        codes[j] = static_cast<int8_t>(code);
        code_sum += code;
      }
      const float scale = finite ? largest / 127.0f : std::numeric_limits<float>::quiet_NaN();
      q.scales[r * q.blocks + b] = scale;
      q.sums[r * q.blocks + b] = scale * static_cast<float>(code_sum);
    }
  }
  return q;
}

// Where a block's codes start and whether it has an offset.
template <DType kQ>
constexpr int kCodesAt = kQ == DType::kQ4_1 ? 4 : 2;
template <DType kQ>
constexpr bool kHasOffset = kQ == DType::kQ4_1;

// A block's f16 at byte `at`, widened (exact either way).
inline float block_half(const uint8_t* block, int at) {
#if defined(__F16C__)
  uint16_t bits;
  std::memcpy(&bits, block + at, sizeof(bits));
  return _cvtsh_ss(bits);
#else
  return block_f16(block, at);
#endif
}

// Code j of a block as a signed value (Q4_0: nibble - 8; Q4_1: the nibble; Q8_0: the code).
template <DType kQ>
inline int block_code(const uint8_t* block, int j) {
  if constexpr (kQ == DType::kQ8_0) {
    return static_cast<int8_t>(block[kCodesAt<kQ> + j]);
  } else {
    const uint8_t byte = block[kCodesAt<kQ> + (j & 15)];
    const int nibble = j < 16 ? byte & 0x0f : byte >> 4;
    return kQ == DType::kQ4_0 ? nibble - 8 : nibble;
  }
}

// Folds eight lanes pairwise: (l + l+4), then (l + l+2), then (0 + 1), as the AVX2 path does.
inline float fold_block_lanes(float (&lanes)[kBlockLanes]) {
  for (int width = kBlockLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// results[r] = the rule's dot product of activation row `first_row + r` with one weight row of
// blocks (`row`), in scalar code: the reference for the vector path's bits.
template <DType kQ, int kRows>
inline void block_dot_reference(const BlockRows& x, int64_t first_row, const uint8_t* row,
                                float (&results)[kRows]) {
  float lanes[kRows][kBlockLanes] = {};
  float offsets[kRows] = {};
  for (int64_t b = 0; b < x.blocks; ++b) {
    const uint8_t* block = row + b * dtype_block_bytes(kQ);
    const float weight_scale = block_half(block, 0);
    for (int r = 0; r < kRows; ++r) {
      const int64_t at = (first_row + r) * x.blocks + b;
      const int8_t* codes = x.codes.get() + (first_row + r) * x.k + b * kQuantBlockElements;
      const float scale = weight_scale * x.scales[at];
      for (int l = 0; l < kBlockLanes; ++l) {
        int32_t sum = 0;
        for (int j = 4 * l; j < 4 * l + 4; ++j) sum += block_code<kQ>(block, j) * codes[j];
        lanes[r][l] = multiply_add(static_cast<float>(sum), scale, lanes[r][l]);
      }
      if constexpr (kHasOffset<kQ>) {
        offsets[r] = multiply_add(block_half(block, 2), x.sums[at], offsets[r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) results[r] = fold_block_lanes(lanes[r]) + offsets[r];
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// A block's 32 codes as signed bytes, in column order.
template <DType kQ>
inline __m256i load_block_codes(const uint8_t* block) {
  if constexpr (kQ == DType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kCodesAt<kQ>));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kCodesAt<kQ>));
    const __m128i low_nibbles = _mm_set1_epi8(0x0f);
    const __m128i low = _mm_and_si128(packed, low_nibbles);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
    const __m256i nibbles = _mm256_set_m128i(high, low);
    if constexpr (kQ == DType::kQ4_0) return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    return nibbles;
  }
}

// Eight int32 lanes, lane j the exact sum of the products of columns 4j..4j+3 of unsigned weight
// codes and signed activation codes. A signed weight's sign is moved onto the activation first
// (vpsignb), so that the unsigned-by-signed multiply sees |w| (at most 128) and x * sign(w) (at
// most 127 in magnitude): a pair's sum stays below 2^15, so vpmaddubsw never saturates, and
// vpdpbusd's sums are the same.
inline __m256i code_sums(__m256i unsigned_weights, __m256i signed_activations) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned_weights, signed_activations);
#else
  const __m256i pairs = _mm256_maddubs_epi16(unsigned_weights, signed_activations);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// fold_block_lanes' order in registers.
inline float fold_block_register(__m256 v) {
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}
#endif

// A block's 32 values in f32, bitwise dequantize_block's (each code times d exact in f32, Q4_1's
// offset one rounding): the exact path's widening (Activations::kF32).
template <DType kQ>
inline void widen_block(const uint8_t* block, float* out) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  const __m256i codes = load_block_codes<kQ>(block);
  const __m256 scale = _mm256_set1_ps(block_half(block, 0));
  const __m128i halves[2] = {_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1)};
  for (int h = 0; h < 2; ++h) {
    for (int q = 0; q < 2; ++q) {
      const __m128i eight = q == 0 ? halves[h] : _mm_srli_si128(halves[h], 8);
      __m256 values = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), scale);
      if constexpr (kHasOffset<kQ>) {
        values = _mm256_add_ps(values, _mm256_set1_ps(block_half(block, 2)));
      }
      _mm256_storeu_ps(out + 16 * h + 8 * q, values);
    }
  }
#else
  dequantize_block(block, kQ, out);
#endif
}

// The rule's dot products of kRows activation rows with kFeatures weight rows of blocks, each pair
// its own chain of multiply-adds: two features give a decode step two chains to overlap and
// share each activation load.
template <DType kQ, int kRows, int kFeatures>
inline void block_dot(const BlockRows& x, int64_t first_row,
                      const uint8_t* const (&weight_rows)[kFeatures],
                      float (&results)[kRows][kFeatures]) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 lanes[kRows][kFeatures];
  float offsets[kRows][kFeatures] = {};
  for (int r = 0; r < kRows; ++r) {
    for (int f = 0; f < kFeatures; ++f) lanes[r][f] = _mm256_setzero_ps();
  }
  const int8_t* codes = x.codes.get() + first_row * x.k;
  const float* scales = x.scales.get() + first_row * x.blocks;
  const float* sums = x.sums.get() + first_row * x.blocks;
  constexpr auto kBlockBytes = static_cast<int64_t>(dtype_block_bytes(kQ));
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m256i weights[kFeatures];  // unsigned: Q4_1's nibbles, the others' magnitudes
    __m256i signs[kFeatures];    // the others' codes, whose signs the activations take
    float weight_scale[kFeatures];
    float weight_offset[kFeatures] = {};
    for (int f = 0; f < kFeatures; ++f) {
      const uint8_t* block = weight_rows[f] + b * kBlockBytes;
      prefetch_weights(block + kPrefetchBytes);
      weights[f] = load_block_codes<kQ>(block);
      if constexpr (kHasOffset<kQ>) {
        // d and m side by side: one conversion.
        uint32_t both_bits;
        std::memcpy(&both_bits, block, sizeof(both_bits));
        const __m128 both = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(both_bits)));
        weight_scale[f] = _mm_cvtss_f32(both);
        weight_offset[f] = _mm_cvtss_f32(_mm_movehdup_ps(both));
      } else {
        weight_scale[f] = block_half(block, 0);
        signs[f] = weights[f];
        weights[f] = _mm256_sign_epi8(weights[f], weights[f]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m256i activations = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(codes + r * x.k + b * kQuantBlockElements));
      const float activation_scale = scales[r * x.blocks + b];
      for (int f = 0; f < kFeatures; ++f) {
        // Q4_1's nibbles are unsigned already; the others' magnitudes meet signed activations.
        const __m256i signed_activations =
            kHasOffset<kQ> ? activations : _mm256_sign_epi8(activations, signs[f]);
        const __m256 products = _mm256_cvtepi32_ps(code_sums(weights[f], signed_activations));
        lanes[r][f] = _mm256_fmadd_ps(products, _mm256_set1_ps(weight_scale[f] * activation_scale),
                                      lanes[r][f]);
        if constexpr (kHasOffset<kQ>) {
          offsets[r][f] = multiply_add(weight_offset[f], sums[r * x.blocks + b], offsets[r][f]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int f = 0; f < kFeatures; ++f) {
      results[r][f] = fold_block_register(lanes[r][f]) + offsets[r][f];
    }
  }
#else
  for (int f = 0; f < kFeatures; ++f) {
    float one[kRows];
    block_dot_reference<kQ, kRows>(x, first_row, weight_rows[f], one);
    for (int r = 0; r < kRows; ++r) results[r][f] = one[r];
  }
#endif
}

// Rows [0, params.rows) of the quantized activations against weight rows [feature_begin,
// feature_end) of blocks: out[row, feature] = the rule's dot product + bias. Up to
// kPairedRows rows take two features at a time; more take one at a time, kBlockRowGroup rows
// at a time.
template <DType kQ>
void block_int8_features(const MatmulParams& params, const BlockRows& x, const void* weight,
                         const void* bias, float* out, int64_t feature_begin, int64_t feature_end) {
  const auto row_bytes = static_cast<int64_t>(dtype_bytes(kQ, static_cast<uint64_t>(x.k)));
  const bool paired = params.rows <= kPairedRows;
  for (int64_t feature = feature_begin; feature < feature_end;) {
    const int64_t features = paired && feature + 1 < feature_end ? 2 : 1;
    const auto run = [&]<int kRows, int kFeatures>(int64_t first) {
      const uint8_t* weight_rows[kFeatures];
      for (int f = 0; f < kFeatures; ++f) {
        weight_rows[f] = static_cast<const uint8_t*>(weight) + (feature + f) * row_bytes;
      }
      float results[kRows][kFeatures];
      block_dot<kQ, kRows, kFeatures>(x, first, weight_rows, results);
      for (int f = 0; f < kFeatures; ++f) {
        const float bias_value =
            bias ? load_as_f32(bias, params.bias_dtype, static_cast<size_t>(feature + f)) : 0.0f;
        for (int r = 0; r < kRows; ++r) {
          out[(first + r) * params.out_features + feature + f] = results[r][f] + bias_value;
        }
      }
    };
    const auto rows_of = [&]<int kFeatures>(int64_t first) {
      switch (std::min<int64_t>(kBlockRowGroup, params.rows - first)) {
        case 8:
          return run.template operator()<8, kFeatures>(first);
        case 7:
          return run.template operator()<7, kFeatures>(first);
        case 6:
          return run.template operator()<6, kFeatures>(first);
        case 5:
          return run.template operator()<5, kFeatures>(first);
        case 4:
          return run.template operator()<4, kFeatures>(first);
        case 3:
          return run.template operator()<3, kFeatures>(first);
        case 2:
          return run.template operator()<2, kFeatures>(first);
        default:
          return run.template operator()<1, kFeatures>(first);
      }
    };
    for (int64_t first = 0; first < params.rows; first += kBlockRowGroup) {
      features == 2 ? rows_of.template operator()<2>(first) : rows_of.template operator()<1>(first);
    }
    feature += features;
  }
}

}  // namespace specrun::kernels::cpu::SPECRUN_MATMUL_VARIANT::block_matmul
