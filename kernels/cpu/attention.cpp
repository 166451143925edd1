#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {

Status kv_write(const KvWriteParams& params, const float* k, const float* v, const int32_t* slots,
                float* k_cache, float* v_cache, ThreadPool& pool) {
  if (params.num_tokens < 0 || params.num_kv_heads <= 0 || params.head_dim <= 0) {
    return Status::invalid_argument("kv_write: bad shape");
  }
  for (int64_t t = 0; t < params.num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= params.num_slots) {
      return Status::out_of_range("kv_write: slot " + std::to_string(slots[t]) +
                                  " outside the cache of " + std::to_string(params.num_slots));
    }
  }
  const int64_t row = params.num_kv_heads * params.head_dim;
  pool.parallel_for(params.num_tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const size_t bytes = static_cast<size_t>(row) * sizeof(float);
      std::memcpy(k_cache + static_cast<int64_t>(slots[t]) * row, k + t * row, bytes);
      std::memcpy(v_cache + static_cast<int64_t>(slots[t]) * row, v + t * row, bytes);
    }
  });
  return Status::ok();
}

Status attention(const AttentionParams& params, const float* q, const float* k_cache,
                 const float* v_cache, const int32_t* query_start, const int32_t* context_lengths,
                 const int32_t* block_tables, float* out, ThreadPool& pool) {
  const AttentionParams& p = params;
  if (p.num_seqs < 0 || p.num_tokens < 0 || p.head_dim <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 || p.block_size <= 0 || p.sliding_window < 0) {
    return Status::invalid_argument("attention: bad shape");
  }
  if (query_start[0] != 0 || query_start[p.num_seqs] != p.num_tokens) {
    return Status::invalid_argument("attention: query_start does not cover the tokens");
  }
  int64_t max_context = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t new_tokens = query_start[s + 1] - query_start[s];
    if (new_tokens < 0 || context_lengths[s] < new_tokens ||
        context_lengths[s] > p.max_blocks_per_seq * p.block_size) {
      return Status::invalid_argument("attention: sequence " + std::to_string(s) +
                                      " has an impossible context length");
    }
    max_context = std::max<int64_t>(max_context, context_lengths[s]);
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_row = p.num_kv_heads * p.head_dim;

  pool.parallel_for(p.num_tokens * p.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(max_context));
    std::vector<float> accumulator(static_cast<size_t>(p.head_dim));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t token = item / p.num_heads;
      const int64_t head = item % p.num_heads;
      const int64_t seq =
          std::upper_bound(query_start, query_start + p.num_seqs + 1, token) - query_start - 1;
      const int64_t new_tokens = query_start[seq + 1] - query_start[seq];
      const int64_t position = context_lengths[seq] - new_tokens + (token - query_start[seq]);
      const int64_t first =
          p.sliding_window > 0 ? std::max<int64_t>(0, position - p.sliding_window + 1) : 0;
      const int32_t* blocks = block_tables + seq * p.max_blocks_per_seq;
      const int64_t kv_head = head / group;
      const float* query = q + (token * p.num_heads + head) * p.head_dim;
      auto slot_of = [&](int64_t pos) {
        return static_cast<int64_t>(blocks[pos / p.block_size]) * p.block_size + pos % p.block_size;
      };

      float max_score = -INFINITY;
      for (int64_t pos = first; pos <= position; ++pos) {
        const float* key = k_cache + slot_of(pos) * kv_row + kv_head * p.head_dim;
        const float score = dot_f32(query, key, p.head_dim) * p.scale;
        scores[static_cast<size_t>(pos - first)] = score;
        max_score = std::max(max_score, score);
      }
      std::fill(accumulator.begin(), accumulator.end(), 0.0f);
      float denominator = 0.0f;
      for (int64_t pos = first; pos <= position; ++pos) {
        const float weight = std::exp(scores[static_cast<size_t>(pos - first)] - max_score);
        denominator += weight;
        const float* value = v_cache + slot_of(pos) * kv_row + kv_head * p.head_dim;
        for (int64_t c = 0; c < p.head_dim; ++c) {
          accumulator[static_cast<size_t>(c)] =
              multiply_add(weight, value[c], accumulator[static_cast<size_t>(c)]);
        }
      }
      float* destination = out + (token * p.num_heads + head) * p.head_dim;
      const float inverse = 1.0f / denominator;
      for (int64_t c = 0; c < p.head_dim; ++c) {
        destination[c] = accumulator[static_cast<size_t>(c)] * inverse;
      }
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
