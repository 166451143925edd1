#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace specrun::kernels::cpu {

Status kv_write(const KvWriteParams& params, const float* k, const float* v, const int32_t* slots,
                void* k_cache, void* v_cache, ThreadPool& pool) {
  if (Status status = check_kv_write(params); !status.is_ok()) return status;
  for (int64_t t = 0; t < params.num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= params.num_slots) {
      return Status::out_of_range("kv_write: slot " + std::to_string(slots[t]) +
                                  " outside the cache of " + std::to_string(params.num_slots));
    }
  }
  const int64_t row = params.num_kv_heads * params.head_dim;
  const bool bf16 = params.cache_dtype == DType::kBF16;
  pool.parallel_for(params.num_tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t at = static_cast<int64_t>(slots[t]) * row;
      if (bf16) {
        auto* keys = static_cast<uint16_t*>(k_cache) + at;
        auto* values = static_cast<uint16_t*>(v_cache) + at;
        for (int64_t c = 0; c < row; ++c) {
          keys[c] = f32_to_bf16(k[t * row + c]);
          values[c] = f32_to_bf16(v[t * row + c]);
        }
      } else {
        const size_t bytes = static_cast<size_t>(row) * sizeof(float);
        std::memcpy(static_cast<float*>(k_cache) + at, k + t * row, bytes);
        std::memcpy(static_cast<float*>(v_cache) + at, v + t * row, bytes);
      }
    }
  });
  return Status::ok();
}

namespace {

// Query heads attended together (they share a KV head): each key is one weight row of a
// dot_block against all of them.
constexpr int64_t kQueryGroup = 4;

// The keys one query attends to, and where its KV head's rows are: positions [first, last] but
// those in the gap [gap_begin, gap_end), numbered 0..count() - 1 in position order.
struct KeySpan {
  int64_t first;          // first position attended (a sliding window's start, else 0)
  int64_t last;           // the query's own position
  const int64_t* rows;    // [context] each position's first element in the cache, KV head 0's
  int64_t offset;         // the KV head's first channel in a cache row
  int64_t gap_begin = 0;  // within [first, last + 1]; gap_end == gap_begin: no gap
  int64_t gap_end = 0;

  int64_t count() const { return last - first + 1 - (gap_end - gap_begin); }
  int64_t position(int64_t key) const {
    const int64_t position = first + key;
    return position < gap_begin ? position : position + (gap_end - gap_begin);
  }
};

// out[h] = softmax(q[h] . keys * scale) . values for kHeads consecutive query heads of one token
// ([kHeads, head_dim] at query and destination). Each head's result is computed exactly as if it
// were alone: its scores are dot_block reductions (four keys at a time), the softmax and the sum
// over values run in position order.
template <DType kCache, int kHeads>
void attend_heads(const AttentionParams& p, const KeySpan& span, const float* query,
                  const void* k_cache, const void* v_cache, std::vector<float>& scores,
                  float* destination) {
  using Element = std::conditional_t<kCache == DType::kF32, float, uint16_t>;
  const int64_t count = span.count();
  // Key `key`'s row (the key-th position attended).
  const auto cache_row = [&](const void* cache, int64_t key) {
    return static_cast<const Element*>(cache) + span.rows[span.position(key)] + span.offset;
  };
  const float* queries[kHeads];
  float max_score[kHeads];
  for (int h = 0; h < kHeads; ++h) {
    queries[h] = query + h * p.head_dim;
    max_score[h] = -INFINITY;
  }
  const auto keep = [&](int h, int64_t key, float dot) {
    const float score = dot * p.scale;
    scores[static_cast<size_t>(h * count + key)] = score;
    max_score[h] = std::max(max_score[h], score);
  };
  int64_t pos = 0;  // a key's number, in position order
  for (; pos + 4 <= count; pos += 4) {
    const void* keys[4] = {cache_row(k_cache, pos), cache_row(k_cache, pos + 1),
                           cache_row(k_cache, pos + 2), cache_row(k_cache, pos + 3)};
    float dots[kHeads][4];
    dot_block<kCache, kHeads, 4>(queries, keys, p.head_dim, dots);
    for (int h = 0; h < kHeads; ++h) {
      for (int k = 0; k < 4; ++k) keep(h, pos + k, dots[h][k]);
    }
  }
  for (; pos < count; ++pos) {
    const void* keys[1] = {cache_row(k_cache, pos)};
    float dots[kHeads][1];
    dot_block<kCache, kHeads, 1>(queries, keys, p.head_dim, dots);
    for (int h = 0; h < kHeads; ++h) keep(h, pos, dots[h][0]);
  }
  // The softmax's weights, over the scores (16 at a time where there is AVX-512: exp_lanes and
  // exp_f32 give the same bits), and their sums, in position order: each sum one chain of
  // dependent additions, run beside the other heads' (with AVX-512, beside the values' sums
  // below), not one head after another.
  float denominator[kHeads] = {};
  for (int h = 0; h < kHeads; ++h) {
    float* weights = scores.data() + h * count;
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 max_lanes = _mm512_set1_ps(max_score[h]);
    for (; i + 16 <= count; i += 16) {
      _mm512_storeu_ps(weights + i,
                       exp_lanes(_mm512_sub_ps(_mm512_loadu_ps(weights + i), max_lanes)));
    }
#endif
    for (; i < count; ++i) weights[i] = exp_f32(weights[i] - max_score[h]);
  }
  // Value rows are a few hundred bytes scattered over the cache's blocks, which the hardware's
  // prefetchers do not follow: each is fetched kValuesAhead positions before its turn (on the
  // 2-core EPYC this sum was most of attention's time, stalled on those loads).
  constexpr int64_t kValuesAhead = 4;
  const auto row_bytes = static_cast<int64_t>(p.head_dim * sizeof(Element));
  const auto prefetch_value = [&](int64_t key) {
    if (key + kValuesAhead < count) {
      const char* ahead = reinterpret_cast<const char*>(cache_row(v_cache, key + kValuesAhead));
      for (int64_t line = 0; line < row_bytes; line += 64) __builtin_prefetch(ahead + line);
    }
  };
  // destination[h] = sum over positions of weight * value / denominator: each channel a chain
  // of fused multiply-adds in position order.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
  // In registers, kChunks 16-channel chunks of every head at a time (the generic loop below keeps
  // its sums in memory, one store-to-load round trip a step): as many as the registers hold, or
  // four where a head has no more than 64 channels (more would be masked-off multiplies).
  const auto accumulate = [&]<int kChunks>() {
    for (int64_t first_channel = 0; first_channel < p.head_dim; first_channel += 16 * kChunks) {
      __mmask16 masks[kChunks];
      for (int j = 0; j < kChunks; ++j) {
        const int64_t left = p.head_dim - (first_channel + 16 * j);
        masks[j] = left >= 16 ? __mmask16(0xffff)
                   : left > 0 ? __mmask16((1u << left) - 1u)
                              : __mmask16(0);
      }
      __m512 sums[kHeads][kChunks];
      for (int h = 0; h < kHeads; ++h) {
        for (int j = 0; j < kChunks; ++j) sums[h][j] = _mm512_setzero_ps();
      }
      for (pos = 0; pos < count; ++pos) {
        prefetch_value(pos);
        const Element* value = cache_row(v_cache, pos) + first_channel;
        __m512 values[kChunks];
        for (int j = 0; j < kChunks; ++j) {
          values[j] = load_widened<kCache>(value, 16 * j, masks[j]);
        }
        for (int h = 0; h < kHeads; ++h) {
          const float scalar_weight = scores[static_cast<size_t>(h * count + pos)];
          if (first_channel == 0) denominator[h] += scalar_weight;
          const __m512 weight = _mm512_set1_ps(scalar_weight);
          for (int j = 0; j < kChunks; ++j) {
            sums[h][j] = _mm512_fmadd_ps(weight, values[j], sums[h][j]);
          }
        }
      }
      for (int h = 0; h < kHeads; ++h) {
        const __m512 inverse = _mm512_set1_ps(1.0f / denominator[h]);
        for (int j = 0; j < kChunks; ++j) {
          _mm512_mask_storeu_ps(destination + h * p.head_dim + first_channel + 16 * j, masks[j],
                                _mm512_mul_ps(sums[h][j], inverse));
        }
      }
    }
  };
  if (p.head_dim <= 64) {
    accumulate.template operator()<4>();
  } else {
    accumulate.template operator()<(16 / kHeads < 8 ? 16 / kHeads : 8)>();
  }
#else
  for (int64_t i = 0; i < count; ++i) {
    for (int h = 0; h < kHeads; ++h) denominator[h] += scores[static_cast<size_t>(h * count + i)];
  }
  // The sums in the destination rows, scaled in place at the end.
  std::fill(destination, destination + kHeads * p.head_dim, 0.0f);
  for (pos = 0; pos < count; ++pos) {
    prefetch_value(pos);
    const Element* value = cache_row(v_cache, pos);
    for (int h = 0; h < kHeads; ++h) {
      const float weight = scores[static_cast<size_t>(h * count + pos)];
      float* sum = destination + h * p.head_dim;
      for (int64_t c = 0; c < p.head_dim; ++c) {
        sum[c] = multiply_add(weight, load_as_f32(value, kCache, static_cast<size_t>(c)), sum[c]);
      }
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    const float inverse = 1.0f / denominator[h];
    for (int64_t c = 0; c < p.head_dim; ++c) destination[h * p.head_dim + c] *= inverse;
  }
#endif
}

// attend_heads for a part of `heads` (1 to kQueryGroup) query heads.
template <DType kCache>
void attend(int64_t heads, const AttentionParams& p, const KeySpan& span, const float* query,
            const void* k_cache, const void* v_cache, std::vector<float>& scores,
            float* destination) {
  switch (heads) {
    case 4:
      return attend_heads<kCache, 4>(p, span, query, k_cache, v_cache, scores, destination);
    case 3:
      return attend_heads<kCache, 3>(p, span, query, k_cache, v_cache, scores, destination);
    case 2:
      return attend_heads<kCache, 2>(p, span, query, k_cache, v_cache, scores, destination);
    default:
      return attend_heads<kCache, 1>(p, span, query, k_cache, v_cache, scores, destination);
  }
}

}  // namespace

Status attention(const AttentionParams& params, const float* q, const void* k_cache,
                 const void* v_cache, const int32_t* query_start, const int32_t* context_lengths,
                 const int32_t* block_tables, const int32_t* key_gaps, float* out,
                 ThreadPool& pool) {
  const AttentionParams& p = params;
  if (Status status = check_attention(p); !status.is_ok()) return status;
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
    for (int64_t t = query_start[s]; key_gaps != nullptr && t < query_start[s + 1]; ++t) {
      // A gap lies before the row's own position and within the sequence.
      const int64_t position = context_lengths[s] - new_tokens + (t - query_start[s]);
      if (key_gaps[2 * t] < 0 || key_gaps[2 * t] > key_gaps[2 * t + 1] ||
          key_gaps[2 * t + 1] > position) {
        return Status::invalid_argument("attention: query row " + std::to_string(t) +
                                        " has an impossible key gap");
      }
    }
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_row = p.num_kv_heads * p.head_dim;
  // Each sequence's cache rows in position order, looked up in its block table once here rather
  // than for every key of every query row and head (a division and a table load per key).
  std::vector<int64_t> sequence_rows(static_cast<size_t>(p.num_seqs) + 1);
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    sequence_rows[static_cast<size_t>(s) + 1] =
        sequence_rows[static_cast<size_t>(s)] + context_lengths[s];
  }
  std::vector<int64_t> cache_rows(static_cast<size_t>(sequence_rows.back()));
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int32_t* blocks = block_tables + s * p.max_blocks_per_seq;
    int64_t* rows = cache_rows.data() + sequence_rows[static_cast<size_t>(s)];
    for (int64_t pos = 0; pos < context_lengths[s]; ++pos) {
      const int64_t slot =
          static_cast<int64_t>(blocks[pos / p.block_size]) * p.block_size + pos % p.block_size;
      rows[pos] = slot * kv_row;
    }
  }

  // One item per token, KV head and part of its query heads: the heads of a part read each key
  // and value once. A part is every head of the group (up to kQueryGroup) unless that leaves
  // fewer than two items a thread (a decode step of a model with few KV heads): then the groups
  // are split. A head's result does not depend on the heads it shares a part with.
  const int64_t kv_items = p.num_tokens * p.num_kv_heads;
  const int64_t wanted_parts =
      std::clamp<int64_t>((2 * pool.num_threads() + kv_items - 1) / kv_items, 1, group);
  const int64_t heads_per_part =
      std::min<int64_t>(kQueryGroup, (group + wanted_parts - 1) / wanted_parts);
  const int64_t parts = (group + heads_per_part - 1) / heads_per_part;
  pool.parallel_for(kv_items * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(kQueryGroup * max_context));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t token = item / (p.num_kv_heads * parts);
      const int64_t kv_head = item / parts % p.num_kv_heads;
      const int64_t part = item % parts;
      const int64_t seq =
          std::upper_bound(query_start, query_start + p.num_seqs + 1, token) - query_start - 1;
      const int64_t new_tokens = query_start[seq + 1] - query_start[seq];
      const int64_t position = context_lengths[seq] - new_tokens + (token - query_start[seq]);
      const int64_t gap_begin = key_gaps != nullptr ? key_gaps[2 * token] : 0;
      const int64_t gap_end = key_gaps != nullptr ? key_gaps[2 * token + 1] : 0;
      // The window counts positions of the row's own branch, where the gap is not: its start
      // in the branch, then in the cache (past the gap if it starts beyond it).
      const int64_t gap = gap_end - gap_begin;
      const int64_t branch_first =
          p.sliding_window > 0 ? std::max<int64_t>(0, position - gap - p.sliding_window + 1) : 0;
      const bool before_gap = branch_first < gap_begin;
      KeySpan span{before_gap ? branch_first : branch_first + gap, position,
                   cache_rows.data() + sequence_rows[static_cast<size_t>(seq)],
                   kv_head * p.head_dim};
      span.gap_begin = before_gap ? gap_begin : 0;
      span.gap_end = before_gap ? gap_end : 0;
      {
        const int64_t first_head = kv_head * group + part * heads_per_part;
        const int64_t heads = std::min(heads_per_part, (kv_head + 1) * group - first_head);
        const float* query = q + (token * p.num_heads + first_head) * p.head_dim;
        float* destination = out + (token * p.num_heads + first_head) * p.head_dim;
        if (p.cache_dtype == DType::kBF16) {
          attend<DType::kBF16>(heads, p, span, query, k_cache, v_cache, scores, destination);
        } else {
          attend<DType::kF32>(heads, p, span, query, k_cache, v_cache, scores, destination);
        }
      }
    }
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
