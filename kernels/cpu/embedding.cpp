#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <string>

namespace specrun::kernels::cpu {

Status embedding(const EmbeddingParams& params, const int32_t* token_ids, const void* table,
                 float* out, ThreadPool& pool) {
  if (Status status = check_embedding(params); !status.is_ok()) return status;
  if (is_quantized(params.table_dtype)) {
    return Status::unsupported("embedding: a quantized table (embeddings stay in bf16)");
  }
  for (int64_t t = 0; t < params.num_tokens; ++t) {
    if (token_ids[t] < 0 || token_ids[t] >= params.vocab_size) {
      return Status::out_of_range("token id " + std::to_string(token_ids[t]) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(params.vocab_size) + ")");
    }
  }
  const bool blocks = is_block_quantized(params.table_dtype);
  if (blocks &&
      (params.dim % kQuantBlockElements != 0 || params.table_layout != WeightLayout::kRows)) {
    return Status::invalid_argument(
        "embedding: a table of GGUF blocks needs rows of whole blocks, laid out in rows");
  }
  const size_t element_size = dtype_size(params.table_dtype);
  pool.parallel_for(params.num_tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* destination = out + t * params.dim;
      if (blocks) {
        const size_t row_bytes = dtype_bytes(params.table_dtype, static_cast<uint64_t>(params.dim));
        const auto* row = static_cast<const uint8_t*>(table) + token_ids[t] * row_bytes;
        for (int64_t c = 0; c < params.dim; c += kQuantBlockElements) {
          dequantize_block(row + c / kQuantBlockElements * dtype_block_bytes(params.table_dtype),
                           params.table_dtype, destination + c);
        }
        continue;
      }
      if (params.table_layout == WeightLayout::kPairTiles) {
        // A row lies two elements at a time, a tile's worth of rows apart.
        for (int64_t c = 0; c < params.dim; ++c) {
          destination[c] =
              load_as_f32(table, params.table_dtype,
                          static_cast<size_t>(element_offset(params.table_layout, token_ids[t], c,
                                                             params.vocab_size, params.dim)));
        }
        continue;
      }
      const RowAddress address =
          row_address(params.table_layout, token_ids[t], params.vocab_size, params.dim);
      const auto* row = static_cast<const char*>(table) + address.first * element_size;
      // Column c of the row: in its chunk (the whole row when row-major), at chunk * step + rest.
      const int64_t chunk_columns =
          params.table_layout == WeightLayout::kTiled ? kTileColumns : params.dim;
      for (int64_t chunk = 0; chunk < params.dim; chunk += chunk_columns) {
        const int64_t chunk_end = std::min(params.dim, chunk + chunk_columns);
        for (int64_t c = chunk; c < chunk_end; ++c) {
          destination[c] =
              load_as_f32(row, params.table_dtype,
                          static_cast<size_t>(chunk * address.column_step + (c - chunk)));
        }
      }
    }
    if (params.scale != 1.0f) {
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t c = 0; c < params.dim; ++c) out[t * params.dim + c] *= params.scale;
      }
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
