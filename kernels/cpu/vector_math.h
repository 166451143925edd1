// Deterministic building blocks of the CPU kernels. Each reduction keeps kLanes independent
// partial sums that advance in index order and are folded by one fixed tree, so a result depends
// only on its inputs: never on how many rows share a call, which thread computes it, or how the
// compiler vectorises the lanes. The kernels are compiled with -ffp-contract=off so that the only
// fused multiply-adds are the explicit ones below.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/core/dtype.h"
#include "kernels/core/isa_namespace.h"
#include "kernels/core/weight_layout.h"

// Compiled again by each copy of the matmul, with its instructions: SPECRUN_ISA_NAMESPACE keeps the
// copies apart (kernels/core/isa_namespace.h).
namespace specrun::kernels::cpu {
inline namespace SPECRUN_ISA_NAMESPACE {

inline constexpr int kLanes = 16;
// How far ahead of each weight stream the AVX-512 loops prefetch (see dot_block).
inline constexpr int64_t kPrefetchBytes = 4096;

#if defined(__AVX512F__) || defined(__AVX2__)
// Software prefetch of a weight stream's cache line at `address`, kPrefetchBytes or more ahead of
// its loads. Into L2 (T1), not L1: a decode step or a verification reads each weight once, and
// lines fetched into L1 that far ahead likely hold the L1's few miss buffers from the loads. On the
// 2-core EPYC, in an hour when its memory was slow (SmolLM2-135M decoding at 10-12 ms a token),
// verifying 2-6 tokens cost 0.8-1.1 decode steps with T1 against 1.0-1.4 with T0, and the demo's
// speedup on two of its questions rose by about 0.1x; in a later hour, the memory faster, the two
// measured alike. Neither was slower in any alternating measurement, prefill included
// (bench/results/cpu-epyc-2c-prefetch-l2.json).
inline void prefetch_weights(const void* address) {
  _mm_prefetch(static_cast<const char*>(address), _MM_HINT_T1);
}
#endif

// acc + a * b, fused where the target has FMA (one rounding), otherwise two roundings; either
// way the same everywhere in one build.
inline float multiply_add(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return acc + a * b;
#endif
}

// e^x in f32, the same bits from exp_f32 and from each lane of exp_lanes (AVX-512), so that a
// kernel may take either for any element: x = n ln2 + r (two-part ln2, |r| <= ln2/2), e^r by its
// Taylor polynomial of degree 7 in fused steps, times 2^n exactly (ldexp / vscalefps, one
// rounding where the result is subnormal). Within 2 ulp of e^x for normal results (tested); x is
// clamped to [-110, 90] first, so e^x is 0 below about -103.3 and infinity above about 88.7;
// NaN stays NaN.
namespace exp_detail {
inline constexpr float kLowest = -110.0f, kHighest = 90.0f;
inline constexpr float kLog2e = 1.44269502f;
inline constexpr float kLn2High = 0.693145751953125f;  // few bits: n * kLn2High is exact
inline constexpr float kLn2Low = 1.42860677e-06f;
// 1/7!, 1/6!, ..., 1/2!, 1, 1: Horner's order.
inline constexpr float kTaylor[8] = {1.98412701e-04f,
                                     1.38888892e-03f,
                                     8.33333377e-03f,
                                     4.16666679e-02f,
                                     1.66666672e-01f,
                                     0.5f,
                                     1.0f,
                                     1.0f};
}  // namespace exp_detail

inline float exp_f32(float x) {
  using namespace exp_detail;
  if (std::isnan(x)) return x;
  x = x < kLowest ? kLowest : (x > kHighest ? kHighest : x);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2High, x);
  r = std::fma(-n, kLn2Low, r);
  float p = kTaylor[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, r, kTaylor[i]);
  return std::ldexp(p, static_cast<int>(n));
}

#if defined(__AVX512F__)
// GCC 12's intrinsic headers trip -Wmaybe-uninitialized in _mm512_max_ps, _mm512_min_ps and the
// unmasked shuffles, whose "undefined" pass-through operand they read (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
inline __m512 exp_lanes(__m512 x) {
  using namespace exp_detail;
  // max/min return their second operand when either is NaN: a NaN lane passes through.
  x = _mm512_min_ps(_mm512_set1_ps(kHighest), _mm512_max_ps(_mm512_set1_ps(kLowest), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

// Folds a register's 16 lanes in fold_lanes' order.
inline float fold_register(__m512 v) {
  const __m256 eight = _mm256_add_ps(
      _mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));
}

// Folds four registers' lanes, each in fold_lanes' order (bitwise fold_register's four results),
// the four folds sharing their shuffles and adds: 14 instructions rather than 4 x 8. A block of
// several rows against a tile of 4 features folds 4 x rows registers per tile, and those
// instructions take the FP ports from the multiplies (`specbench --model <a 5.4M model>
// --activations bf16`, 2-core Zen 5: prefill 3-6% faster with either activations).
inline void fold_four_registers(__m512 a, __m512 b, __m512 c, __m512 d, float (&out)[4]) {
  // lane l += lane l + 8: [a 0..7 | b 0..7] and [c 0..7 | d 0..7], each of 128-bit blocks.
  const __m512 ab =
      _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd =
      _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // lane l += lane l + 4: one 128-bit block each of a, b, c and d.
  __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));  // lane l += lane l + 2
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));  // lane l += lane l + 1
  alignas(64) float lanes[kLanes];
  _mm512_store_ps(lanes, v);
  for (int i = 0; i < 4; ++i) out[i] = lanes[4 * i];
}

// One row's kFeatures accumulators folded, each in fold_lanes' order.
template <int kFeatures>
inline void fold_row(const __m512 (&v)[kFeatures], float (&out)[kFeatures]) {
  if constexpr (kFeatures == 4) {
    fold_four_registers(v[0], v[1], v[2], v[3], out);
  } else {
    for (int f = 0; f < kFeatures; ++f) out[f] = fold_register(v[f]);
  }
}
#pragma GCC diagnostic pop
#endif

// Folds the lanes pairwise: ((0+8)+(4+12)) + ... in one fixed order.
inline float fold_lanes(float (&lanes)[kLanes]) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// The scales of one quantized weight row: column i's is row[i / block_cols]. block_cols is a
// multiple of kLanes or at least the row's length, so one lane group shares one scale.
struct RowScales {
  const float* row = nullptr;  // the row's part of the scale grid; null for unquantized weights
  int64_t block_cols = 0;      // columns sharing a scale

  float at(int64_t column) const { return row[column / block_cols]; }
};

// Widens `count` (<= kLanes) elements of a weight row starting at `offset` into `out`; the rest of
// `out` is zero. Quantized elements come out as their codes' values (unscaled).
template <DType kDType>
inline void load_lanes(const void* row, int64_t offset, int count, float (&out)[kLanes]) {
  if constexpr (kDType == DType::kF8E4M3) {
    const uint8_t* source = static_cast<const uint8_t*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = l < count ? f8e4m3_to_f32(source[l]) : 0.0f;
  } else if constexpr (kDType == DType::kI8) {
    const int8_t* source = static_cast<const int8_t*>(row) + offset;
    for (int l = 0; l < kLanes; ++l) out[l] = l < count ? static_cast<float>(source[l]) : 0.0f;
  } else if constexpr (kDType == DType::kF32) {
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
  if constexpr (is_quantized(kDType)) {
    load_lanes<kDType>(row, offset, kLanes, out);
  } else if constexpr (kDType == DType::kF32) {
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

// What the vector loads below widen a code to, as a multiple of its value: FP8 codes widen
// (exactly) to 2^-8 of their values, which their scales are multiplied by this to make up for.
template <DType kDType>
inline constexpr float kWidenedUnit = kDType == DType::kF8E4M3 ? 256.0f : 1.0f;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
// The first `count` of a register's 16 lanes: all of them from 16 on, none from 0 down.
inline __mmask16 first_lanes(int64_t count) {
  return count >= kLanes ? __mmask16(0xffff)
         : count > 0     ? __mmask16((1u << count) - 1u)
                         : __mmask16(0);
}

// Elements at..at+15 of a weight row (lanes off in `mask` read as zero), widened to f32 exactly:
// 8-bit codes as their values, FP8's times 2^-8 (the scales make up for it).
// GCC 12's own intrinsic headers trip -Wmaybe-uninitialized in _mm512_cvtepu16_epi32 and
// _mm512_cvtph_ps, whose "undefined" operands they read (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <DType kDType>
inline __m512 load_widened(const void* row, int64_t at, __mmask16 mask) {
  if constexpr (kDType == DType::kI8) {
    const __m128i codes = _mm_maskz_loadu_epi8(mask, static_cast<const int8_t*>(row) + at);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
  } else if constexpr (kDType == DType::kF8E4M3) {
    // An E4M3 code is an f16 with a 4-bit exponent. Sign-extended to 16 bits and shifted left by
    // 7, its exponent and mantissa sit where f16 has them and its sign fills bits 15 and 14; the
    // mask clears bit 14. The hardware's f16 conversion then widens it exactly (subnormals
    // included) to 2^-8 of its value. (NaN codes are refused at load.)
    const __m256i words =
        _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(mask, static_cast<const int8_t*>(row) + at));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(words, 7),
                                            _mm256_set1_epi16(static_cast<int16_t>(0xBF80))));
  } else if constexpr (kDType == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(row) + at);
  } else {
    const __m256i halves = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(row) + at);
    if constexpr (kDType == DType::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
    } else {
      return _mm512_cvtph_ps(halves);
    }
  }
}
#pragma GCC diagnostic pop
#endif

// The bf16 bits of what load_widened widens an 8-bit code of magnitude `magnitude` (0-127, its sign
// bit clear) to: an INT8 code's value, an FP8 E4M3 code's value times 2^-8. Every such value is a
// normal bf16 (FP8: 2^-17 to 1.75), so vdpbf16ps, which flushes denormals, reads it as it is;
// shifted into an f32's high half it is load_widened's f32.
template <DType kDType>
constexpr uint16_t widened_bf16_bits(unsigned magnitude) {
  static_assert(is_quantized(kDType), "8-bit codes");
  float value = static_cast<float>(magnitude);  // INT8: at most 7 significant bits, exact
  if constexpr (kDType == DType::kF8E4M3) {
    const unsigned exponent = (magnitude >> 3) & 0xfu, mantissa = magnitude & 7u;
    // Subnormal codes: mantissa x 2^-9; normal ones (8 + mantissa) x 2^(exponent - 10). Powers of
    // two are exact, so these are the values times 2^-8 exactly.
    value = exponent == 0 ? static_cast<float>(mantissa) : static_cast<float>(8 + mantissa);
    for (unsigned halvings = exponent == 0 ? 17 : 18 - exponent; halvings > 0; --halvings) {
      value *= 0.5f;
    }
  }
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
}

#if defined(__AVX512VBMI__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__FMA__)
// Where the build has AVX512-VBMI, whole tiles of 8-bit codes widen by table lookups (vpermi2b)
// of their magnitudes rather than by conversions: dot_block_bf16_pairs to bf16 pairs (FP8 and
// INT8), dot_block to f32 (FP8, whose conversion is the dearer), to the same values.
#define SPECRUN_CPU_CODE_TABLES 1

// The tables and byte permutes of the lookups, as bytes.
struct CodeTableBytes {
  alignas(64) uint8_t low[128];   // the low bytes of the 128 magnitudes' widened bf16 bits
  alignas(64) uint8_t high[128];  // their high bytes (sign clear)
  // vpermt2b indices over (low, high) lookups of a two-row register ([row 0: columns 0-15][row 1:
  // 0-15][row 0: 16-31][row 1: 16-31]): row 0's, then row 1's, 32 bf16 words in column order.
  alignas(64) uint8_t pair_rows[2][64];
  // vpermt2b indices over (low, high) lookups of a chunk of a tile ([row 0: columns 0-15][row 1]
  // [row 2][row 3]): row f's 16 columns as f32 bits (the bf16 bits in the high half; the low
  // half's bytes are masked to zero).
  alignas(64) uint8_t f32_rows[kTileRows][64];
};

template <DType kDType>
constexpr CodeTableBytes make_code_table_bytes() {
  CodeTableBytes bytes{};
  for (unsigned magnitude = 0; magnitude < 128; ++magnitude) {
    const uint16_t bits = widened_bf16_bits<kDType>(magnitude);
    bytes.low[magnitude] = static_cast<uint8_t>(bits & 0xffu);
    bytes.high[magnitude] = static_cast<uint8_t>(bits >> 8);
  }
  // Indices 0-63 pick a lookup's low byte, 64-127 its high byte.
  for (unsigned k = 0; k < 32; ++k) {
    const unsigned at = k < 16 ? k : 32 + (k - 16);
    for (unsigned row = 0; row < 2; ++row) {
      bytes.pair_rows[row][2 * k] = static_cast<uint8_t>(16 * row + at);
      bytes.pair_rows[row][2 * k + 1] = static_cast<uint8_t>(64 + 16 * row + at);
    }
  }
  for (unsigned row = 0; row < kTileRows; ++row) {
    for (unsigned lane = 0; lane < 16; ++lane) {
      bytes.f32_rows[row][4 * lane + 2] = static_cast<uint8_t>(16 * row + lane);
      bytes.f32_rows[row][4 * lane + 3] = static_cast<uint8_t>(64 + 16 * row + lane);
    }
  }
  return bytes;
}

template <DType kDType>
inline constexpr CodeTableBytes kCodeTableBytes = make_code_table_bytes<kDType>();

// The tables in registers, for the length of a kernel's loop.
struct CodeTables {
  __m512i low[2];           // CodeTableBytes::low: magnitudes 0-63, 64-127
  __m512i high[2];          // CodeTableBytes::high
  __m512i pair_first_row;   // CodeTableBytes::pair_rows[0] (the bf16 kernel's)
  __m512i pair_second_row;  // CodeTableBytes::pair_rows[1]
};

template <DType kDType>
inline CodeTables code_tables() {
  const CodeTableBytes& bytes = kCodeTableBytes<kDType>;
  return {{_mm512_load_si512(bytes.low), _mm512_load_si512(bytes.low + 64)},
          {_mm512_load_si512(bytes.high), _mm512_load_si512(bytes.high + 64)},
          _mm512_load_si512(bytes.pair_rows[0]),
          _mm512_load_si512(bytes.pair_rows[1])};
}

// The low and high bytes of 64 codes' widened bf16 bits, the code's sign in the high byte's.
struct WidenedBytes {
  __m512i low, high;
};

template <DType kDType>
inline WidenedBytes look_up_codes(__m512i codes, const CodeTables& tables) {
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  // An FP8 code's magnitude is its low 7 bits, which are all vpermi2b reads of an index; an INT8
  // code's is its absolute value (quantization keeps codes in [-127, 127]).
  const __m512i magnitudes = kDType == DType::kI8 ? _mm512_abs_epi8(codes) : codes;
  return {
      _mm512_permutex2var_epi8(tables.low[0], magnitudes, tables.low[1]),
      // high | (codes & sign)
      _mm512_ternarylogic_epi32(
          _mm512_permutex2var_epi8(tables.high[0], magnitudes, tables.high[1]), codes, sign, 0xf8)};
}

// One 64-byte chunk of a whole tile of codes (16 columns of its four rows) widened to f32, row f
// in rows[f]: bitwise load_widened's values.
template <DType kDType>
inline void widen_tile_chunk_f32(const uint8_t* chunk, const CodeTables& tables,
                                 __m512 (&rows)[kTileRows]) {
  const WidenedBytes bytes = look_up_codes<kDType>(_mm512_loadu_si512(chunk), tables);
  constexpr __mmask64 kHighHalves = 0xccccccccccccccccull;  // bytes 2 and 3 of each f32
#pragma GCC unroll 4
  for (int f = 0; f < kTileRows; ++f) {
    rows[f] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(
        kHighHalves, bytes.low, _mm512_load_si512(kCodeTableBytes<kDType>.f32_rows[f]),
        bytes.high));
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The AVX2 path of dot_block, kRows activation rows against kFeatures weight rows (at most four
// products): the 16 lanes of each reduction as two 8-lane halves (ymm), eight accumulators that
// the 16 registers hold with their operands. Lanes past n read as zero, as on AVX-512.
template <DType kDType>
inline __m256 avx2_load_weights(const void* row, int64_t at) {
  if constexpr (kDType == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + at);
  } else if constexpr (kDType == DType::kBF16) {
    const __m128i halves =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  } else if constexpr (kDType == DType::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + at)));
  } else if constexpr (kDType == DType::kI8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(row) + at))));
  } else {
    // E4M3 as on AVX-512: 2^-8 of the value, exactly, through the f16 conversion.
    const __m128i words = _mm_cvtepi8_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(row) + at)));
    return _mm256_cvtph_ps(
        _mm_and_si128(_mm_slli_epi16(words, 7), _mm_set1_epi16(static_cast<int16_t>(0xBF80))));
  }
}

template <DType kDType, int kRows, int kFeatures, bool kWidened>
inline void avx2_dot_block(const float* const* x, const void* const* weight_rows, int64_t n,
                           float (*results)[4], const RowScales* scales, int64_t column_step,
                           bool one_scale_per_row) {
  static_assert(kRows * kFeatures <= 4, "eight accumulators at most");
  constexpr bool kQuantized = is_quantized(kDType);
  constexpr float kUnit = kWidenedUnit<kDType>;
  constexpr DType kLoad = kWidened ? DType::kF32 : kDType;  // codes, or their widened values
  constexpr auto kElementBytes = static_cast<int64_t>(dtype_size(kLoad));
  __m256 acc[kRows][kFeatures][2];
  __m256 block_scale[kFeatures];
  for (int f = 0; f < kFeatures; ++f) {
    for (int r = 0; r < kRows; ++r) acc[r][f][0] = acc[r][f][1] = _mm256_setzero_ps();
    block_scale[f] = _mm256_set1_ps(1.0f);
  }
  int64_t block_end = 0;
  // One lane group: xs[r] (16 activations), and each feature's 16 weights at ws[f] + at[f].
  const auto step = [&](int64_t i, const float* const* xs, const void* const* ws,
                        const int64_t* at) {
    if constexpr (kQuantized) {
      if (!one_scale_per_row && i >= block_end) {
        const int64_t block = i / scales[0].block_cols;
        for (int f = 0; f < kFeatures; ++f) {
          block_scale[f] = _mm256_set1_ps(scales[f].row[block] * kUnit);
        }
        block_end = (block + 1) * scales[0].block_cols;
      }
    }
    for (int half = 0; half < 2; ++half) {
      __m256 w[kFeatures];
      for (int f = 0; f < kFeatures; ++f) {
        w[f] = avx2_load_weights<kLoad>(ws[f], at[f] + 8 * half);
        if constexpr (kQuantized) {
          if (!one_scale_per_row) w[f] = _mm256_mul_ps(w[f], block_scale[f]);
        }
      }
      for (int r = 0; r < kRows; ++r) {
        const __m256 xh = _mm256_loadu_ps(xs[r] + 8 * half);
        for (int f = 0; f < kFeatures; ++f) {
          acc[r][f][half] = _mm256_fmadd_ps(xh, w[f], acc[r][f][half]);
        }
      }
    }
  };
  int64_t i = 0;
  int64_t at[kFeatures];
  const float* xs[kRows];
  for (; i + kLanes <= n; i += kLanes) {
    if (kWidened) {
      // In the caches already.
    } else if (column_step == 1) {
      for (int f = 0; f < kFeatures; ++f) {
        prefetch_weights(static_cast<const char*>(weight_rows[f]) + i * kElementBytes +
                         kPrefetchBytes);
      }
    } else {
      const char* chunk =
          static_cast<const char*>(weight_rows[0]) + i * column_step * kElementBytes;
      for (int64_t line = 0; line < kFeatures * kLanes * kElementBytes; line += 64) {
        prefetch_weights(chunk + line + kPrefetchBytes);
      }
    }
    for (int f = 0; f < kFeatures; ++f) at[f] = i * column_step;
    for (int r = 0; r < kRows; ++r) xs[r] = x[r] + i;
    step(i, xs, weight_rows, at);
  }
  if (i < n) {
    // The tail, zero-padded to a whole lane group.
    const int64_t count = n - i;
    alignas(32) float x_tail[kRows][kLanes] = {};
    alignas(32) unsigned char w_tail[kFeatures][kLanes * 4] = {};
    const void* tails[kFeatures];
    for (int r = 0; r < kRows; ++r) {
      for (int64_t l = 0; l < count; ++l) x_tail[r][l] = x[r][i + l];
      xs[r] = x_tail[r];
    }
    for (int f = 0; f < kFeatures; ++f) {
      std::memcpy(
          w_tail[f],
          static_cast<const unsigned char*>(weight_rows[f]) + i * column_step * kElementBytes,
          static_cast<size_t>(count * kElementBytes));
      tails[f] = w_tail[f];
      at[f] = 0;
    }
    step(i, xs, tails, at);
  }
  // Fold in fold_lanes' order: lane l += lane l+8 (the halves), then l+4, l+2, l+1.
  for (int r = 0; r < kRows; ++r) {
    for (int f = 0; f < kFeatures; ++f) {
      const __m256 eight = _mm256_add_ps(acc[r][f][0], acc[r][f][1]);
      const __m128 four =
          _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
      const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
      float result = _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));
      if constexpr (kQuantized) {
        if (one_scale_per_row) result *= scales[f].row[0] * kUnit;
      }
      results[r][f] = result;
    }
  }
}

// dot_block's AVX2 results over sub-blocks from (kRow0, kFeature0) on, row-major: one row
// against every feature (a decode step reads a tile once), or for several rows, 2 x 2 blocks
// whose weights and activations each serve two products.
template <DType kDType, int kRows, int kFeatures, bool kWidened, int kRow0, int kFeature0>
inline void avx2_dot_sub_blocks(const float* const* x, const void* const* weight_rows, int64_t n,
                                float (*results)[4], const RowScales* scales, int64_t column_step,
                                bool one_scale_per_row) {
  if constexpr (kRow0 < kRows) {
    constexpr int kR = kRows == 1 ? 1 : (kRows - kRow0 < 2 ? kRows - kRow0 : 2);
    if constexpr (kFeature0 < kFeatures) {
      constexpr int kMaxF = kR == 1 ? 4 : 2;
      constexpr int kF = kFeatures - kFeature0 < kMaxF ? kFeatures - kFeature0 : kMaxF;
      float partial[kR][4];
      avx2_dot_block<kDType, kR, kF, kWidened>(x + kRow0, weight_rows + kFeature0, n, partial,
                                               scales + kFeature0, column_step, one_scale_per_row);
      for (int r = 0; r < kR; ++r) {
        for (int f = 0; f < kF; ++f) results[kRow0 + r][kFeature0 + f] = partial[r][f];
      }
      avx2_dot_sub_blocks<kDType, kRows, kFeatures, kWidened, kRow0, kFeature0 + kF>(
          x, weight_rows, n, results, scales, column_step, one_scale_per_row);
    } else {
      avx2_dot_sub_blocks<kDType, kRows, kFeatures, kWidened, kRow0 + kR, 0>(
          x, weight_rows, n, results, scales, column_step, one_scale_per_row);
    }
  }
}
#endif

// results[r][f] = dot(x[r], weight_rows[f]) for kRows activation rows against kFeatures weight
// rows: every weight vector loaded once feeds kRows products, every activation vector kFeatures.
// Each result accumulates its lanes in one fixed order (the portable path's), so blocking changes
// no bit. With AVX-512 the block is written with intrinsics (one 16-lane register per accumulator):
// the compiler's vectorisation of the portable loop keeps the widened weights in memory. A
// quantized weight is widened and multiplied by its lane group's scale (one rounding) before the
// product.
//
// Column i (a multiple of kLanes) of weight row f starts at element weight_rows[f] + i *
// column_step: 1 for row-major rows, the tile's width for rows of one kTiled tile
// (kernels/core/weight_layout.h), whose kFeatures rows then make one stream.
//
// kWidened: the weight rows hold f32 values that widen_weights<kDType> made of the codes (f32
// rows, column_step 1); the result is bitwise the one of the codes themselves.
template <DType kDType, int kRows, int kFeatures, bool kWidened = false>
inline void dot_block(const float* const (&x)[kRows], const void* const (&weight_rows)[kFeatures],
                      int64_t n, float (&results)[kRows][kFeatures],
                      const RowScales (&scales)[kFeatures] = {}, int64_t column_step = 1) {
  [[maybe_unused]] int64_t i = 0;
  // What the loads read: the codes, or their widened values.
  constexpr DType kLoad = kWidened ? DType::kF32 : kDType;
  [[maybe_unused]] constexpr auto kElementBytes = static_cast<int64_t>(dtype_size(kLoad));
  constexpr bool kQuantized = is_quantized(kDType);
  // A row with one scale (per tensor or per output channel) sums the codes' products and scales
  // the sum once; block-wise scales multiply each lane group's widened codes first. Either way a
  // result is its codes' exact values times their scales, rounded the same on every path.
  [[maybe_unused]] const bool one_scale_per_row = kQuantized && scales[0].block_cols >= n;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
  static_assert(kLanes == 16, "one zmm register per accumulator");
  [[maybe_unused]] constexpr float kUnit = kWidenedUnit<kDType>;
#pragma GCC diagnostic push
  // GCC 12's own intrinsic headers trip these warnings in _mm512_cvtepu16_epi32 and
  // _mm512_extractf64x4_pd, whose "undefined" operands they read (GCC bug 105593).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
  __m512 vacc[kRows][kFeatures];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int f = 0; f < kFeatures; ++f) vacc[r][f] = _mm512_setzero_ps();
  }
  // Block-wise scales: the current block's, per feature (times the widening's unit), refreshed at
  // each block boundary; one scale per row is applied to the finished sums instead.
  __m512 block_scale[kFeatures];
  int64_t block_end = 0;
  // The rows of one whole tile of FP8 codes widen a chunk at a time by table lookups (the tiled
  // layout pads every chunk with zero codes, so the last one loads whole too).
#if defined(SPECRUN_CPU_CODE_TABLES)
  constexpr bool kE4m3Tile = kDType == DType::kF8E4M3 && !kWidened && kFeatures == kTileRows;
  bool whole_tile = kE4m3Tile && column_step == kTileRows;
  for (int f = 1; f < kFeatures && whole_tile; ++f) {
    whole_tile = static_cast<const uint8_t*>(weight_rows[f]) ==
                 static_cast<const uint8_t*>(weight_rows[0]) + f * kTileColumns;
  }
  CodeTables tables;
  if constexpr (kE4m3Tile) tables = code_tables<kDType>();
#else
  constexpr bool whole_tile = false;
#endif
  // The tail runs the same loop body on masked loads: lanes past n read as zero and add zero.
  for (; i < n; i += kLanes) {
    const __mmask16 mask = first_lanes(n - i);
    if constexpr (kQuantized) {
      if (!one_scale_per_row && i >= block_end) {
        const int64_t block = i / scales[0].block_cols;
        for (int f = 0; f < kFeatures; ++f) {
          block_scale[f] = _mm512_set1_ps(scales[f].row[block] * kUnit);
        }
        block_end = (block + 1) * scales[0].block_cols;
      }
    }
    // A software prefetch well ahead of the weights: the hardware's alone left a decode step at
    // 37% of the read bandwidth on a 2-core EPYC (its samples on these loads). Tiled rows are one
    // stream, a cache line at a time; row-major rows one stream each. Past the end it reaches the
    // weights read next; a prefetch never faults. Widened rows are in the caches already.
    if (kWidened) {
    } else if (column_step == 1) {
      for (int f = 0; f < kFeatures; ++f) {
        prefetch_weights(static_cast<const char*>(weight_rows[f]) + i * kElementBytes +
                         kPrefetchBytes);
      }
    } else {
      const char* chunk =
          static_cast<const char*>(weight_rows[0]) + i * column_step * kElementBytes;
      for (int64_t line = 0; line < kFeatures * kLanes * kElementBytes; line += 64) {
        prefetch_weights(chunk + line + kPrefetchBytes);
      }
    }
    __m512 w[kFeatures];
#if defined(SPECRUN_CPU_CODE_TABLES)
    if constexpr (kE4m3Tile) {
      if (whole_tile) {
        widen_tile_chunk_f32<kDType>(static_cast<const uint8_t*>(weight_rows[0]) + i * kTileRows,
                                     tables, w);
      }
    }
#endif
    for (int f = 0; f < kFeatures; ++f) {
      if (!whole_tile) {
        const int64_t at = i * column_step;  // element offset of the chunk in row f
        w[f] = load_widened<kLoad>(weight_rows[f], at, mask);
      }
      if constexpr (kQuantized) {
        if (!one_scale_per_row) w[f] = _mm512_mul_ps(w[f], block_scale[f]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 xr = _mm512_maskz_loadu_ps(mask, x[r] + i);
#pragma GCC unroll 4
      for (int f = 0; f < kFeatures; ++f) vacc[r][f] = _mm512_fmadd_ps(xr, w[f], vacc[r][f]);
    }
  }
// Fold in registers, in fold_lanes' order: lane l += lane l+8, then l+4, l+2, l+1.
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
    fold_row<kFeatures>(vacc[r], results[r]);
    if constexpr (kQuantized) {
      if (one_scale_per_row) {
        for (int f = 0; f < kFeatures; ++f) results[r][f] *= scales[f].row[0] * kUnit;
      }
    }
  }
#pragma GCC diagnostic pop
  return;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  float block_results[kRows][4];
  avx2_dot_sub_blocks<kDType, kRows, kFeatures, kWidened, 0, 0>(
      x, weight_rows, n, block_results, scales, column_step, one_scale_per_row);
  for (int r = 0; r < kRows; ++r) {
    for (int f = 0; f < kFeatures; ++f) results[r][f] = block_results[r][f];
  }
  return;
#else
  float acc[kRows][kFeatures][kLanes] = {};
  const auto scale = [&](int f, int64_t column, float(&lanes)[kLanes]) {
    if constexpr (kQuantized) {
      if (one_scale_per_row) return;
      const float s = scales[f].at(column);
      for (int l = 0; l < kLanes; ++l) lanes[l] *= s;
    }
  };
  for (; i + kLanes <= n; i += kLanes) {
    float w[kFeatures][kLanes] = {};  // every lane is loaded; GCC 12 cannot tell
    for (int f = 0; f < kFeatures; ++f) {
      load_full_lanes<kLoad>(weight_rows[f], i * column_step, w[f]);
      scale(f, i, w[f]);
    }
    for (int r = 0; r < kRows; ++r) {
      for (int f = 0; f < kFeatures; ++f) {
        for (int l = 0; l < kLanes; ++l) {
          acc[r][f][l] = multiply_add(x[r][i + l], w[f][l], acc[r][f][l]);
        }
      }
    }
  }
  if (i < n) {
    const int count = static_cast<int>(n - i);
    float w[kFeatures][kLanes];
    for (int f = 0; f < kFeatures; ++f) {
      load_lanes<kLoad>(weight_rows[f], i * column_step, count, w[f]);
      scale(f, i, w[f]);
    }
    for (int r = 0; r < kRows; ++r) {
      for (int f = 0; f < kFeatures; ++f) {
        for (int l = 0; l < count; ++l) {
          acc[r][f][l] = multiply_add(x[r][i + l], w[f][l], acc[r][f][l]);
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int f = 0; f < kFeatures; ++f) {
      results[r][f] = fold_lanes(acc[r][f]);
      if constexpr (kQuantized) {
        if (one_scale_per_row) results[r][f] *= scales[f].row[0];
      }
    }
  }
#endif
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
// Where the build has AVX512-BF16: dot_block_bf16_pairs below.
#define SPECRUN_CPU_BF16_PAIRS 1

#if defined(SPECRUN_CPU_CODE_TABLES)
// The 32 columns at `columns` of a whole tile of 8-bit codes (two 64-byte chunks of the tiled
// layout, 16 columns of its four rows each) as each row's 32 bf16 weights, paired as
// dot_block_bf16_pairs pairs them: bitwise load_widened's values rounded to bf16 (exact). Two
// rows at a time: [first's row 2p, 2p+1][second's 2p, 2p+1], looked up, then each row's words
// gathered (vpermt2b) from the low and high bytes.
template <DType kDType>
inline void widen_tile_chunk_bf16(const uint8_t* columns, const CodeTables& tables,
                                  __m512bh (&rows)[kTileRows]) {
  const __m512i first = _mm512_loadu_si512(columns);                              // columns 0-15
  const __m512i second = _mm512_loadu_si512(columns + kTileRows * kTileColumns);  // 16-31
#pragma GCC unroll 2
  for (int pair = 0; pair < 2; ++pair) {
    const __m512i codes = pair == 0 ? _mm512_shuffle_i64x2(first, second, _MM_SHUFFLE(1, 0, 1, 0))
                                    : _mm512_shuffle_i64x2(first, second, _MM_SHUFFLE(3, 2, 3, 2));
    const WidenedBytes bytes = look_up_codes<kDType>(codes, tables);
    rows[2 * pair] =
        (__m512bh)_mm512_permutex2var_epi8(bytes.low, tables.pair_first_row, bytes.high);
    rows[2 * pair + 1] =
        (__m512bh)_mm512_permutex2var_epi8(bytes.low, tables.pair_second_row, bytes.high);
  }
}
#endif

// results[r][f] = dot(x row r, weight_rows[f]) for bf16 activations (row r of x at
// x + r * x_stride, zero-padded to a multiple of 32 columns) against bf16 weights, by vdpbf16ps:
// lane l of each accumulator adds the products of columns 32c + 2l + 1 and 32c + 2l of every
// 32-column chunk c, in the instruction's fixed order (products exact, sums rounded to nearest
// even, denormals flushed), and the lanes fold as fold_lanes does. Half the multiply instructions
// of the f32 path and no widening of the weights. Weight columns are addressed as in dot_block
// (column_step). kWholeTile: the features are the rows of one whole tile of the tiled layout
// (weight_rows[f] = weight_rows[0] + f * kTileColumns, column_step = kFeatures), so that one
// pointer and constant offsets address them all; the same sums, with the loop's pointers kept in
// registers (with four row pointers and a run-time step, GCC spilled them; `specbench
// --activations bf16` on the 2-core EPYC, alternating runs: prefill 1.04x-1.19x llama.cpp's where
// it was 0.91x-1.07x). kWeights kI8 or kF8E4M3: the weight rows hold 8-bit codes, widened
// in registers as load_widened widens them (values exact in bf16) and paired as bf16 weights are,
// so the sums are bitwise those of the codes widened to bf16 beforehand. kKeepWidened (codes
// only): the kernel also stores the codes it widened at `widened`, as bf16 weights laid out for
// this kernel to read back: a whole tile as a tile (kWholeTile, column_step kFeatures), other rows
// one after another, `widened_stride` apart (column_step 1); every 32-column chunk whole, columns
// past n zero. The first rows that meet a group of codes leave it widened for the rest, at the
// cost of a few stores beside the multiplies rather than a pass of its own.
template <int kRows, int kFeatures, bool kWholeTile, DType kWeights = DType::kBF16,
          bool kKeepWidened = false>
inline void dot_block_bf16_pairs(const uint16_t* x, int64_t x_stride,
                                 const void* const (&weight_rows)[kFeatures], int64_t n,
                                 float (&results)[kRows][kFeatures], int64_t column_step,
                                 uint16_t* widened = nullptr, int64_t widened_stride = 0) {
  static_assert(!kWholeTile || kFeatures == kTileRows, "a whole tile's rows");
  static_assert(kWeights == DType::kBF16 || is_quantized(kWeights), "bf16 weights or 8-bit codes");
  static_assert(!kKeepWidened || kWeights != DType::kBF16, "only codes are widened");
  using Element = std::conditional_t<kWeights == DType::kBF16, uint16_t, uint8_t>;
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
  // Every loop over the accumulators is unrolled whole (GCC peels at most 16 iterations by
  // itself): one indexed access keeps the array in memory, a store per accumulator per step.
  __m512 vacc[kRows][kFeatures];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int f = 0; f < kFeatures; ++f) vacc[r][f] = _mm512_setzero_ps();
  }
  const auto* tile = static_cast<const Element*>(weight_rows[0]);
  // Whole 32-column chunks of a whole tile of codes widen by table lookups (the last, partial
  // chunk as other codes do: its second half may lie past the tile). FP8 codes always; INT8 codes
  // up to 4 rows, beyond which the tables' registers cost more than the conversion they save
  // (`specbench --matmul Nx4096x2048 --quantize int8 --activations bf16` on the 2-core EPYC, the
  // weights in the caches: 1 row 85 -> 69 us, 2 rows 97 -> 86, 3 rows 107 -> 103, 4 alike, 6
  // rows 150 -> 170 with the tables).
#if defined(SPECRUN_CPU_CODE_TABLES)
  constexpr bool kTableWidening =
      kWholeTile && (kWeights == DType::kF8E4M3 || (kWeights == DType::kI8 && kRows <= 4));
  CodeTables tables;
  if constexpr (kTableWidening) tables = code_tables<kWeights>();
#else
  constexpr bool kTableWidening = false;
#endif
  // Element offset of column `column` (a multiple of 16) of feature f.
  const auto at = [&](int f, int64_t column) __attribute__((always_inline)) {
    if constexpr (kWholeTile) {
      return tile + f * kTileColumns + column * kFeatures;
    } else {
      return static_cast<const Element*>(weight_rows[f]) + column * column_step;
    }
  };
  // Twice dot_block's lead: this loop takes a tile's bytes in fewer instructions, and with the
  // 4 KiB lead a decode step fell behind the f32 path's when the memory was fast (`specbench
  // --activations bf16` on the 2-core EPYC at 71-72 GB/s: 276-290 against 309-317 tokens/s;
  // with 8 KiB, alternating runs at 70-72 GB/s, 307-327 against 312-329).
  constexpr int64_t kLeadBytes = 2 * kPrefetchBytes;
  // One 32-column chunk: its two 16-column halves (apart when tiled), then every row's pairs
  // against every feature's. Whole chunks load without masks; the last, partial chunk reads
  // columns past n as zero, so it adds the same sums.
  const auto add_chunk = [&]<bool kPartial>(int64_t i) __attribute__((always_inline)) {
    if (!kWholeTile && column_step == 1) {
      for (int f = 0; f < kFeatures; ++f) {
        prefetch_weights(reinterpret_cast<const char*>(at(f, i)) + kLeadBytes);
      }
    } else {
      const char* chunk = reinterpret_cast<const char*>(at(0, i));
      constexpr int64_t kChunkBytes = 2 * kFeatures * kLanes * sizeof(Element);
      for (int64_t line = 0; line < kChunkBytes; line += 64) {
        prefetch_weights(chunk + line + kLeadBytes);
      }
    }
    const int64_t remaining = kPartial ? n - i : 2 * kLanes;
    const __mmask16 low = first_lanes(remaining), high = first_lanes(remaining - kLanes);
    __m512bh w[kFeatures];
#if defined(SPECRUN_CPU_CODE_TABLES)
    // Nested: Clang checks a call that does not depend on kPartial against every instantiation
    // the outer condition does not discard (bf16 weights, narrow tiles).
    if constexpr (kTableWidening) {
      if constexpr (!kPartial) widen_tile_chunk_bf16<kWeights>(at(0, i), tables, w);
    }
#endif
#pragma GCC unroll 4
    for (int f = 0; f < kFeatures; ++f) {
      if constexpr (kWeights != DType::kBF16) {
        if constexpr (!kTableWidening || kPartial) {
          // vcvtne2ps2bf16 puts its second operand's 16 values first: the columns keep their
          // order.
          w[f] = _mm512_cvtne2ps_pbh(load_widened<kWeights>(at(f, i + kLanes), 0, high),
                                     load_widened<kWeights>(at(f, i), 0, low));
        }
        if constexpr (kKeepWidened) {
          const auto chunk = (__m512i)w[f];
          if constexpr (kWholeTile) {
            // A tile's chunk holds 16 columns of each of its rows: the two halves lie apart.
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(widened + f * kTileColumns + i * kFeatures),
                _mm512_castsi512_si256(chunk));
            _mm256_storeu_si256(
                reinterpret_cast<__m256i*>(widened + f * kTileColumns + (i + kLanes) * kFeatures),
                _mm512_extracti64x4_epi64(chunk, 1));
          } else {
            _mm512_storeu_si512(widened + f * widened_stride + i, chunk);
          }
        }
      } else {
        __m256i first, second;
        if constexpr (kPartial) {
          first = _mm256_maskz_loadu_epi16(low, at(f, i));
          second = _mm256_maskz_loadu_epi16(high, at(f, i + kLanes));
        } else {
          first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(f, i)));
          second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at(f, i + kLanes)));
        }
        w[f] = (__m512bh)_mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512bh xr = (__m512bh)_mm512_loadu_si512(x + r * x_stride + i);
#pragma GCC unroll 4
      for (int f = 0; f < kFeatures; ++f) vacc[r][f] = _mm512_dpbf16_ps(vacc[r][f], xr, w[f]);
    }
  };
  const int64_t whole = n / (2 * kLanes) * (2 * kLanes);
  for (int64_t i = 0; i < whole; i += 2 * kLanes) add_chunk.template operator()<false>(i);
  if (whole < n) add_chunk.template operator()<true>(whole);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) fold_row<kFeatures>(vacc[r], results[r]);
#pragma GCC diagnostic pop
}
#endif

// sums[r][t * kTileRows + f] = the exact sum over columns of x row r (codes at x + r * x_stride)
// times row f of tile t, for INT8 weights meeting activations quantized to int8 per token. The
// tiles are whole tiles of the tiled layout, one after another as kTiled lays out 8-bit codes:
// tile t at tiles + t x 4 padded_n, its 16-column chunk at column c (a multiple of 16) holding
// the four rows' codes one after another at + 4 c. `padded_n` (a multiple of 16) columns are read;
// x's codes past the row's end are zero, so the tiles' padding adds nothing. Integer sums are
// exact: every copy of the kernel gives the same bits, however it orders them (|sum| < 127^2 n,
// which int32 holds for n < 133,000). With AVX512-VNNI, vpdpbusd multiplies unsigned bytes by
// signed ones: the weights go in as unsigned (code + 128, their sign bit flipped) against the
// activations' signed codes, and 128 x (the row's code sum) comes off each sum at the end
// (two's-complement arithmetic, exact wherever the result is). One instruction takes a whole chunk
// of a tile (16 columns of its four rows) against the row's 16 codes repeated four times: 64
// products.
template <int kRows, int kTiles>
inline void dot_block_int8(const int8_t* x, int64_t x_stride, const int32_t* x_code_sums,
                           const int8_t* tiles, int64_t padded_n,
                           int32_t (&sums)[kRows][kTiles * kTileRows]) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
  static_assert(kTileRows * kTileColumns == 64, "a chunk of a tile is one register");
  __m512i acc[kRows][kTiles];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < kTiles; ++t) acc[r][t] = _mm512_setzero_si512();
  }
  const __m512i sign_bits = _mm512_set1_epi8(static_cast<char>(0x80));
  // As the bf16-pair kernel's: each tile is one stream, a cache line a chunk.
  constexpr int64_t kLeadBytes = 2 * kPrefetchBytes;
  for (int64_t c = 0; c < padded_n; c += kTileColumns) {
    __m512i w[kTiles];
#pragma GCC unroll 4
    for (int t = 0; t < kTiles; ++t) {
      const int8_t* chunk = tiles + (t * padded_n + c) * kTileRows;
      prefetch_weights(reinterpret_cast<const char*>(chunk) + kLeadBytes);
      w[t] = _mm512_xor_si512(_mm512_loadu_si512(chunk), sign_bits);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512i xr = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + r * x_stride + c)));
#pragma GCC unroll 4
      for (int t = 0; t < kTiles; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], w[t], xr);
    }
  }
  // Lanes 4f..4f+3 of a tile's accumulator (its 128-bit block f) hold row f's sums. Two
  // horizontal adds of its halves leave block f's total in lane kFolded[f]. (Folded with 512-bit
  // shuffles instead, GCC 12 kept the accumulators in memory, a store of each per chunk.)
  constexpr int kFolded[kTileRows] = {0, 4, 1, 5};
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const uint32_t offset = 128u * static_cast<uint32_t>(x_code_sums[r]);
#pragma GCC unroll 4
    for (int t = 0; t < kTiles; ++t) {
      const __m256i pairs = _mm256_hadd_epi32(_mm512_extracti64x4_epi64(acc[r][t], 0),
                                              _mm512_extracti64x4_epi64(acc[r][t], 1));
      alignas(32) uint32_t folded[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(folded), _mm256_hadd_epi32(pairs, pairs));
#pragma GCC unroll 4
      for (int f = 0; f < kTileRows; ++f) {
        sums[r][t * kTileRows + f] = static_cast<int32_t>(folded[kFolded[f]] - offset);
      }
    }
  }
#pragma GCC diagnostic pop
#elif defined(__AVX2__)
  // Without VNNI: codes widened to 16 bits and multiplied in pairs by vpmaddwd, exactly (the
  // 8-bit vpmaddubsw's 16-bit sums of two products would saturate). Two rows against one tile at
  // a time: eight accumulators, the tile's four rows and the two rows' codes fit 16 registers.
  (void)x_code_sums;
  const auto widen = [](const int8_t* codes) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  };
  const auto add_rows = [&]<int kPair>(int first_row, int t) {
    __m256i acc[kPair][kTileRows];
    for (int r = 0; r < kPair; ++r) {
      for (int f = 0; f < kTileRows; ++f) acc[r][f] = _mm256_setzero_si256();
    }
    for (int64_t c = 0; c < padded_n; c += kTileColumns) {
      const int8_t* chunk = tiles + (t * padded_n + c) * kTileRows;
      prefetch_weights(reinterpret_cast<const char*>(chunk) + 2 * kPrefetchBytes);
      __m256i w[kTileRows];
      for (int f = 0; f < kTileRows; ++f) w[f] = widen(chunk + f * kTileColumns);
      for (int r = 0; r < kPair; ++r) {
        const __m256i xr = widen(x + (first_row + r) * x_stride + c);
        for (int f = 0; f < kTileRows; ++f) {
          acc[r][f] = _mm256_add_epi32(acc[r][f], _mm256_madd_epi16(xr, w[f]));
        }
      }
    }
    for (int r = 0; r < kPair; ++r) {
      for (int f = 0; f < kTileRows; ++f) {
        alignas(32) int32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[r][f]);
        uint32_t sum = 0;  // wrapping, as the exact result fits
        for (int l = 0; l < 8; ++l) sum += static_cast<uint32_t>(lanes[l]);
        sums[first_row + r][t * kTileRows + f] = static_cast<int32_t>(sum);
      }
    }
  };
  for (int t = 0; t < kTiles; ++t) {
    int r = 0;
    for (; r + 2 <= kRows; r += 2) add_rows.template operator()<2>(r, t);
    if (r < kRows) add_rows.template operator()<1>(r, t);
  }
#else
  (void)x_code_sums;
  for (int r = 0; r < kRows; ++r) {
    const int8_t* row = x + r * x_stride;
    for (int t = 0; t < kTiles; ++t) {
      for (int f = 0; f < kTileRows; ++f) {
        int32_t sum = 0;
        for (int64_t c = 0; c < padded_n; c += kTileColumns) {
          const int8_t* codes = tiles + (t * padded_n + c) * kTileRows + f * kTileColumns;
          for (int j = 0; j < kTileColumns; ++j) sum += int32_t{row[c + j]} * int32_t{codes[j]};
        }
        sums[r][t * kTileRows + f] = sum;
      }
    }
  }
#endif
}

// out[0..n) = columns 0..n of a weight row (column c at row + c * column_step for a chunk's first
// column, as in dot_block) widened to f32 exactly as dot_block's loads widen them: what
// dot_block<kDType, ..., kWidened = true> reads. Rows read by several row blocks are widened
// once instead of once per block.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
template <DType kDType>
inline void widen_weights(const void* row, int64_t column_step, int64_t n, float* out) {
  [[maybe_unused]] constexpr auto kElementBytes = static_cast<int64_t>(dtype_size(kDType));
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 mask = first_lanes(n - i);
    // The codes come from memory: prefetched as dot_block's are.
    prefetch_weights(static_cast<const char*>(row) + i * column_step * kElementBytes +
                     kPrefetchBytes);
    _mm512_mask_storeu_ps(out + i, mask, load_widened<kDType>(row, i * column_step, mask));
  }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    prefetch_weights(static_cast<const char*>(row) + i * column_step * kElementBytes +
                     kPrefetchBytes);
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_ps(out + i + 8 * half,
                       avx2_load_weights<kDType>(row, i * column_step + 8 * half));
    }
  }
  if (i < n) {
    alignas(32) unsigned char codes[kLanes * 4] = {};
    alignas(32) float lanes[kLanes];
    std::memcpy(codes, static_cast<const unsigned char*>(row) + i * column_step * kElementBytes,
                static_cast<size_t>((n - i) * kElementBytes));
    for (int half = 0; half < 2; ++half) {
      _mm256_storeu_ps(lanes + 8 * half, avx2_load_weights<kDType>(codes, 8 * half));
    }
    std::memcpy(out + i, lanes, static_cast<size_t>(n - i) * sizeof(float));
  }
#else
  for (int64_t i = 0; i < n; i += kLanes) {
    const int count = static_cast<int>(n - i < kLanes ? n - i : kLanes);
    float lanes[kLanes];
    load_lanes<kDType>(row, i * column_step, count, lanes);
    std::memcpy(out + i, lanes, static_cast<size_t>(count) * sizeof(float));
  }
#endif
}
#pragma GCC diagnostic pop

// dot(a, b) over f32 vectors, with the lane order of every other reduction.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  const float* rows[1] = {a};
  const void* weights[1] = {b};
  float result[1][1];
  dot_block<DType::kF32, 1, 1>(rows, weights, n, result);
  return result[0][0];
}

}  // namespace SPECRUN_ISA_NAMESPACE
}  // namespace specrun::kernels::cpu
