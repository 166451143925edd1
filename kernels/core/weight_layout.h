// How a matmul weight's [out_features, in_features] elements lie in memory. A backend says which
// layout its matmul reads fastest (Backend::matmul_weight_layout); the model lays its weights out
// that way once, at load.
//
// kTiled is the CPU's. A decode step streams every weight once, and four weight rows read side by
// side are four streams a core's prefetchers follow poorly: on a 2-core EPYC they sustained half
// the bandwidth of one sequential stream. Tiled, the rows a micro-kernel reads together are one
// stream: rows in tiles of kTileRows (the last tile may be narrower), each tile's columns in
// chunks of kTileColumns, and each chunk holding its tile's rows one after another:
//
//   tile t (rows 4t..4t+3): [r0 c0..15][r1 c0..15][r2 c0..15][r3 c0..15][r0 c16..31][r1 c16..31]...
//
// Rows are padded with zeros to a whole number of chunks, so that column c of a tile's row r lies
// at tile_start + chunk_start(c) * width + r * 16 + c % 16 for every chunk alike.
//
// kPairTiles is what AMX's tile multiply reads as its right-hand operand (the "VNNI" layout), for
// 16-bit weights: rows in groups of kPairTileRows (16), each group's columns in tiles of
// kPairTileColumns (32), a tile holding its 16 column pairs one after another and each pair as
// [row 0: c, c+1][row 1: c, c+1]...[row 15: c, c+1]:
//
//   group g, tile j: [c0 c1 of rows 0..15][c2 c3 of rows 0..15] ... [c30 c31 of rows 0..15]
//
// One tile is 1 KiB (16 rows x 32 columns x 2 bytes), loaded whole by one instruction; a group's
// tiles follow each other, so a group is one stream. Rows are padded with zeros to whole groups,
// columns to whole tiles. A row's elements lie two by two: there is no RowAddress for it.
#pragma once

#include <cstdint>

#include "kernels/core/dtype.h"
#include "kernels/core/status.h"

namespace specrun::kernels {

enum class WeightLayout : uint8_t {
  kRows,       // row-major: out_features rows of in_features elements
  kTiled,      // tiles of kTileRows rows interleaved by kTileColumns columns (above)
  kPairTiles,  // 16-bit weights: groups of 16 rows in 32-column tiles of column pairs (above)
};

inline constexpr int64_t kTileRows = 4;
inline constexpr int64_t kTileColumns = 16;
inline constexpr int64_t kPairTileRows = 16;
inline constexpr int64_t kPairTileColumns = 32;

constexpr int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Elements a row occupies: in_features, rounded up to whole chunks or tiles.
constexpr int64_t stored_columns(WeightLayout layout, int64_t in_features) {
  switch (layout) {
    case WeightLayout::kTiled:
      return round_up(in_features, kTileColumns);
    case WeightLayout::kPairTiles:
      return round_up(in_features, kPairTileColumns);
    case WeightLayout::kRows:
      break;
  }
  return in_features;
}

// Rows stored: out_features, rounded up to whole groups of pair tiles.
constexpr int64_t stored_rows(WeightLayout layout, int64_t out_features) {
  return layout == WeightLayout::kPairTiles ? round_up(out_features, kPairTileRows) : out_features;
}

// Elements of a [out_features, in_features] weight in `layout`, padding included.
constexpr uint64_t stored_elements(WeightLayout layout, int64_t out_features, int64_t in_features) {
  return static_cast<uint64_t>(stored_rows(layout, out_features)) *
         static_cast<uint64_t>(stored_columns(layout, in_features));
}

// Bytes of a [out_features, in_features] weight of `dtype` in `layout` (GGUF blocks: kRows).
constexpr uint64_t stored_weight_bytes(WeightLayout layout, int64_t out_features,
                                       int64_t in_features, DType dtype) {
  return dtype_bytes(dtype, stored_elements(layout, out_features, in_features));
}

// Where a row's elements start and how far apart its chunks are, in elements, in kRows or kTiled:
// column c (a chunk's first, or any column of a row-major weight) of `row` is at
// first + c * column_step.
struct RowAddress {
  int64_t first;        // element offset of the row's column 0
  int64_t column_step;  // 1 row-major; the tile's width when tiled
};

constexpr RowAddress row_address(WeightLayout layout, int64_t row, int64_t out_features,
                                 int64_t in_features) {
  if (layout == WeightLayout::kRows) return {row * in_features, 1};
  const int64_t tile_start = row / kTileRows * kTileRows;
  const int64_t width =
      out_features - tile_start < kTileRows ? out_features - tile_start : kTileRows;
  return {tile_start * stored_columns(layout, in_features) + (row - tile_start) * kTileColumns,
          width};
}

// Element offset of (row, column) in `layout`.
constexpr int64_t element_offset(WeightLayout layout, int64_t row, int64_t column,
                                 int64_t out_features, int64_t in_features) {
  if (layout == WeightLayout::kPairTiles) {
    const int64_t tiles = stored_columns(layout, in_features) / kPairTileColumns;
    const int64_t tile = (row / kPairTileRows) * tiles + column / kPairTileColumns;
    const int64_t pair = (column % kPairTileColumns) / 2;
    return (tile * (kPairTileColumns / 2) + pair) * (2 * kPairTileRows) +
           (row % kPairTileRows) * 2 + column % 2;
  }
  const RowAddress address = row_address(layout, row, out_features, in_features);
  if (layout == WeightLayout::kRows) return address.first + column;
  const int64_t chunk_start = column / kTileColumns * kTileColumns;
  return address.first + chunk_start * address.column_step + (column - chunk_start);
}

// Copies a row-major [out_features, in_features] weight of `dtype` into `destination`
// (stored_weight_bytes of `layout`), padding with zeros. kPairTiles takes 16-bit dtypes only, and
// GGUF blocks take kRows only (kInvalidArgument otherwise).
Status lay_out_weight(WeightLayout layout, const void* source, int64_t out_features,
                      int64_t in_features, DType dtype, void* destination);

}  // namespace specrun::kernels
