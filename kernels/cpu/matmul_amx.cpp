#include "kernels/cpu/matmul_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

// GCC names the AMX macros __AMX_TILE__ and __AMX_BF16__, Clang __AMXTILE__ and __AMXBF16__.
#if !(defined(__AMX_TILE__) || defined(__AMXTILE__)) || \
    !(defined(__AMX_BF16__) || defined(__AMXBF16__)) || !defined(__AVX512BF16__)
#error "compiled with AMX-TILE, AMX-BF16 and AVX512-BF16 (kernels/CMakeLists.txt)"
#endif

namespace specrun::kernels::cpu {
namespace {

// A tile row holds at most 64 bytes: 32 bf16 activations, or one column pair of 16 weight rows.
constexpr int kTileRowBytes = 64;
// Activation rows per activation tile, and weight rows per weight tile.
constexpr int64_t kBlockRows = 16;
static_assert(kPairTileRows == 16 && kPairTileColumns == 32, "one tile is 16 x 32 bf16");
constexpr int64_t kTileElements = kPairTileRows * kPairTileColumns;  // one weight tile, 1 KiB
// How far ahead of each weight stream a decode prefetches: four tiles.
constexpr int64_t kPrefetchBytes = 4096;

// ldtilecfg's operand, palette 1: tile t has rows[t] rows of bytes_per_row[t] bytes; a tile
// with neither is unused.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// The tiles: sums 0..3 (activation block b, weight group g at 2b + g), activations 4..5 (block
// b), weights 6..7 (group g). Up to two 16-row blocks of activations meet up to two groups of 16
// weight rows: each tile loaded serves two multiplies. `rows0` and `rows1` are the blocks'
// activation rows (rows1 0: one block).
void configure_tiles(int rows0, int rows1) {
  TileConfig config;
  const auto set = [&](int tile, int rows) {
    config.rows[tile] = static_cast<uint8_t>(rows);
    config.bytes_per_row[tile] = rows > 0 ? kTileRowBytes : 0;
  };
  set(0, rows0);
  set(1, rows0);
  set(2, rows1);
  set(3, rows1);
  set(4, rows0);
  set(5, rows1);
  set(6, kPairTileRows);
  set(7, kPairTileRows);
  _tile_loadconfig(&config);
}

// The sums of one or two activation blocks (x: the first block's first tile, the second block's
// `group_elements` later) against one or two weight groups (weights: the first group's first
// tile; the second group follows it, group_elements later), over `tiles` 32-column tiles.
// `prefetch`: the weights come from memory (the first blocks a group meets), so each stream is
// prefetched ahead.
template <bool kTwoBlocks, bool kTwoGroups>
void multiply(const uint16_t* x, const uint16_t* weights, int64_t group_elements, int64_t tiles,
              bool prefetch) {
  _tile_zero(0);
  if constexpr (kTwoGroups) _tile_zero(1);
  if constexpr (kTwoBlocks) _tile_zero(2);
  if constexpr (kTwoBlocks && kTwoGroups) _tile_zero(3);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const uint16_t* w = weights + tile * kTileElements;
    if (prefetch) {
      const char* ahead = reinterpret_cast<const char*>(w) + kPrefetchBytes;
      for (int64_t line = 0; line < kTileElements * 2; line += 64) {
        _mm_prefetch(ahead + line, _MM_HINT_T0);
        if constexpr (kTwoGroups) _mm_prefetch(ahead + group_elements * 2 + line, _MM_HINT_T0);
      }
    }
    _tile_loadd(6, w, kTileRowBytes);
    if constexpr (kTwoGroups) _tile_loadd(7, w + group_elements, kTileRowBytes);
    const uint16_t* activations = x + tile * kTileElements;
    _tile_loadd(4, activations, kTileRowBytes);
    if constexpr (kTwoBlocks) _tile_loadd(5, activations + group_elements, kTileRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoGroups) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwoBlocks) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kTwoBlocks && kTwoGroups) _tile_dpbf16ps(3, 5, 7);
  }
}

// Stores sum tile `tile` (0..3) at `destination`, its rows `stride` bytes apart. (The tile
// instructions name their tiles in the instruction: a switch, not a parameter.)
void store_sums(int tile, void* destination, int64_t stride) {
  switch (tile) {
    case 0:
      _tile_stored(0, destination, stride);
      return;
    case 1:
      _tile_stored(1, destination, stride);
      return;
    case 2:
      _tile_stored(2, destination, stride);
      return;
    default:
      _tile_stored(3, destination, stride);
      return;
  }
}

// Writes sum tile `tile` ([rows, 16] f32) to out (rows out_stride floats apart), its first
// `columns` columns: straight from the tile when they are all 16, else through `staging`.
void store(int tile, int rows, int64_t columns, float* out, int64_t out_stride,
           float (&staging)[16][16]) {
  if (columns == kPairTileRows) {
    store_sums(tile, out, out_stride * static_cast<int64_t>(sizeof(float)));
    return;
  }
  store_sums(tile, staging, static_cast<int64_t>(sizeof(staging[0])));
  for (int r = 0; r < rows; ++r) {
    std::memcpy(out + r * out_stride, staging[r], static_cast<size_t>(columns) * sizeof(float));
  }
}

// x's rows rounded to bf16 (to nearest even, denormals to zero: vcvtneps2bf16, as the vdpbf16ps
// path rounds them) and laid out as the tile loads read them: blocks of 16 rows, each block's
// columns in 32-column tiles of [16 rows][32 columns] (1 KiB, one tile load), the tiles of a
// block one after another; zero past the rows and columns.
std::vector<uint16_t> round_activations(const float* x, int64_t rows, int64_t columns,
                                        int64_t tiles) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  std::vector<uint16_t> rounded(static_cast<size_t>(blocks * tiles * kTileElements), 0);
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* block = rounded.data() + (r / kBlockRows) * tiles * kTileElements +
                      (r % kBlockRows) * kPairTileColumns;
    for (int64_t i = 0; i < columns; i += 16) {
      const int64_t remaining = columns - i;
      const __mmask16 mask =
          remaining >= 16 ? __mmask16(0xffff) : __mmask16((1u << remaining) - 1u);
      const __m256bh lanes = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + r * columns + i));
      uint16_t* destination = block + (i / kPairTileColumns) * kTileElements + i % kPairTileColumns;
      _mm256_mask_storeu_epi16(destination, mask, (__m256i)lanes);
    }
  }
  return rounded;
}

}  // namespace

void amx_matmul_group(const float* x, const MatmulTarget* targets, size_t count, ThreadPool& pool) {
  const int64_t rows = targets[0].params.rows, in_features = targets[0].params.in_features;
  if (rows == 0) return;
  const int64_t stride = stored_columns(WeightLayout::kPairTiles, in_features);
  const int64_t tiles = stride / kPairTileColumns;  // per weight group
  const std::vector<uint16_t> rounded = round_activations(x, rows, in_features, tiles);
  int64_t groups = 0;  // 16-row weight groups over the whole group of targets
  for (size_t t = 0; t < count; ++t) {
    groups += stored_rows(WeightLayout::kPairTiles, targets[t].params.out_features) / kPairTileRows;
  }
  // One parallel region over the targets' weight groups laid end to end, in pairs (grain 2)
  // where a target has them; each thread sweeps its groups' weights once from memory and again
  // from its caches for every further 32 activation rows.
  pool.parallel_for(groups, 2, [&](int64_t begin, int64_t end) {
    int configured0 = -1, configured1 = -1;
    float staging[16][16];
    int64_t first = 0;  // the current target's first group
    for (size_t t = 0; t < count && first < end; ++t) {
      const MatmulParams& params = targets[t].params;
      const int64_t target_groups =
          stored_rows(WeightLayout::kPairTiles, params.out_features) / kPairTileRows;
      const int64_t from = std::max(begin, first), to = std::min(end, first + target_groups);
      const int64_t group_elements = tiles * kTileElements;
      const auto* weights = static_cast<const uint16_t*>(targets[t].weight);
      for (int64_t group = from; group < to; group += 2) {
        const bool two_groups = group + 1 < to;
        const int64_t feature = (group - first) * kPairTileRows;
        const int64_t columns0 = std::min<int64_t>(kPairTileRows, params.out_features - feature);
        const int64_t columns1 =
            two_groups ? std::min<int64_t>(kPairTileRows, params.out_features - feature - 16) : 0;
        const uint16_t* group_weights = weights + (group - first) * group_elements;
        for (int64_t row = 0; row < rows; row += 2 * kBlockRows) {
          const int rows0 = static_cast<int>(std::min<int64_t>(kBlockRows, rows - row));
          const int rows1 =
              static_cast<int>(std::clamp<int64_t>(rows - row - kBlockRows, 0, kBlockRows));
          if (rows0 != configured0 || rows1 != configured1) {
            configure_tiles(rows0, rows1);
            configured0 = rows0;
            configured1 = rows1;
          }
          const uint16_t* x_block = rounded.data() + (row / kBlockRows) * group_elements;
          const bool prefetch = row == 0;
          float* out = targets[t].out + row * params.out_features + feature;
          const int64_t out_stride = params.out_features;
          float* out1 = out + kBlockRows * out_stride;  // the second block's rows
          if (rows1 > 0 && two_groups) {
            multiply<true, true>(x_block, group_weights, group_elements, tiles, prefetch);
            store(0, rows0, columns0, out, out_stride, staging);
            store(1, rows0, columns1, out + 16, out_stride, staging);
            store(2, rows1, columns0, out1, out_stride, staging);
            store(3, rows1, columns1, out1 + 16, out_stride, staging);
          } else if (rows1 > 0) {
            multiply<true, false>(x_block, group_weights, group_elements, tiles, prefetch);
            store(0, rows0, columns0, out, out_stride, staging);
            store(2, rows1, columns0, out1, out_stride, staging);
          } else if (two_groups) {
            multiply<false, true>(x_block, group_weights, group_elements, tiles, prefetch);
            store(0, rows0, columns0, out, out_stride, staging);
            store(1, rows0, columns1, out + 16, out_stride, staging);
          } else {
            multiply<false, false>(x_block, group_weights, group_elements, tiles, prefetch);
            store(0, rows0, columns0, out, out_stride, staging);
          }
        }
      }
      first += target_groups;
    }
    // The tile state back to its initial, empty state: a context switch then saves none of it.
    _tile_release();
  });
}

}  // namespace specrun::kernels::cpu
