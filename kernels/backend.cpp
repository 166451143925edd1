#include "kernels/backend.h"

#include <climits>
#include <cmath>
#include <string>

namespace specrun::kernels {

Status check_matmul_group(const MatmulTarget* targets, size_t count) {
  if (count == 0 || count > kMaxMatmulGroup) {
    return Status::invalid_argument("matmul group: 1 to 3 targets");
  }
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    const MatmulParams& p = t.params;
    if (p.rows < 0 || p.in_features <= 0 || p.out_features <= 0) {
      return Status::invalid_argument("matmul: bad shape");
    }
    if (p.rows != targets[0].params.rows || p.in_features != targets[0].params.in_features) {
      return Status::invalid_argument("matmul group: every target must share rows and in_features");
    }
    if (is_quantized(p.weight_dtype) &&
        (t.weight_scales == nullptr || p.scale_block_rows <= 0 || p.scale_block_cols <= 0 ||
         (p.scale_block_cols % 16 != 0 && p.scale_block_cols < p.in_features))) {
      return Status::invalid_argument(
          "matmul: a quantized weight needs scales in blocks of whole 16-column groups");
    }
    if (is_block_quantized(p.weight_dtype) &&
        (p.in_features % kQuantBlockElements != 0 || p.weight_layout != WeightLayout::kRows)) {
      return Status::invalid_argument(
          "matmul: a weight of GGUF blocks needs rows of whole 32-element blocks, laid out in "
          "rows");
    }
  }
  return Status::ok();
}

const char* row_status_message(RowStatus status) {
  switch (status) {
    case RowStatus::kOk:
      return "ok";
    case RowStatus::kBadSettings:
      return "sampling settings out of range";
    case RowStatus::kCorruptLogits:
      return "the logits hold NaN or +infinity: the model's output is corrupt";
    case RowStatus::kAllBanned:
      return "every token's logit is -infinity: nothing can be sampled";
  }
  return "an unknown row status";
}

Status check_embedding(const EmbeddingParams& params) {
  if (params.num_tokens < 0 || params.dim <= 0 || params.vocab_size <= 0) {
    return Status::invalid_argument("embedding: bad shape");
  }
  if (!std::isfinite(params.scale)) return Status::invalid_argument("embedding: scale not finite");
  return Status::ok();
}

Status check_rmsnorm(const RmsNormParams& params, const char* op) {
  if (params.rows < 0 || params.dim <= 0 || !(params.eps >= 0.0f)) {
    return Status::invalid_argument(std::string(op) + ": bad shape or eps");
  }
  return Status::ok();
}

Status check_matmul(const MatmulParams& params, const float* weight_scales) {
  const MatmulTarget target{params, nullptr, weight_scales, nullptr, nullptr};
  return check_matmul_group(&target, 1);
}

Status check_rope(const RopeParams& params) {
  if (params.num_tokens < 0 || params.head_dim <= 0 || params.head_dim % 2 != 0 ||
      params.num_heads <= 0 || params.num_kv_heads <= 0) {
    return Status::invalid_argument("rope: bad shape (head_dim must be even)");
  }
  return Status::ok();
}

Status check_kv_write(const KvWriteParams& params) {
  if (params.num_tokens < 0 || params.num_kv_heads <= 0 || params.head_dim <= 0) {
    return Status::invalid_argument("kv_write: bad shape");
  }
  if (!is_kv_cache_dtype(params.cache_dtype)) {
    return Status::invalid_argument("kv_write: a KV cache is stored as BF16 or F32, not " +
                                    std::string(dtype_name(params.cache_dtype)));
  }
  return Status::ok();
}

Status check_rope_kv_write(const RopeParams& rope, const KvWriteParams& cache) {
  if (Status status = check_rope(rope); !status.is_ok()) return status;
  if (Status status = check_kv_write(cache); !status.is_ok()) return status;
  if (rope.num_tokens != cache.num_tokens || rope.num_kv_heads != cache.num_kv_heads ||
      rope.head_dim != cache.head_dim) {
    return Status::invalid_argument(
        "rope_kv_write: the rotation and the cache write describe different tokens or heads");
  }
  return Status::ok();
}

Status check_attention(const AttentionParams& p) {
  if (p.num_seqs < 0 || p.num_tokens < 0 || p.head_dim <= 0 || p.num_kv_heads <= 0 ||
      p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.block_size <= 0 ||
      p.max_blocks_per_seq < 0 || p.sliding_window < 0) {
    return Status::invalid_argument("attention: bad shape");
  }
  if (!is_kv_cache_dtype(p.cache_dtype)) {
    return Status::invalid_argument("attention: a KV cache is stored as BF16 or F32, not " +
                                    std::string(dtype_name(p.cache_dtype)));
  }
  return Status::ok();
}

Status check_gated_activation(const GatedActivationParams& params) {
  if (params.rows < 0 || params.dim <= 0) {
    return Status::invalid_argument("gated_activation: bad shape");
  }
  if (params.activation != GateActivation::kSilu &&
      params.activation != GateActivation::kGeluTanh) {
    return Status::invalid_argument("gated_activation: unknown activation");
  }
  return Status::ok();
}

Status check_fill(const FillParams& params) {
  if (params.count < 0) return Status::invalid_argument("fill: negative count");
  if (is_block_quantized(params.dtype)) {
    return Status::invalid_argument("fill: GGUF blocks are read, never filled");
  }
  if (!std::isfinite(params.low) || !std::isfinite(params.high) || params.high < params.low) {
    return Status::invalid_argument("fill: the range must be finite with low <= high");
  }
  return Status::ok();
}

Status check_add(int64_t count) {
  if (count < 0) return Status::invalid_argument("add: negative count");
  return Status::ok();
}

Status check_gather(const GatherParams& params) {
  if (params.count < 0 || params.source_count < 0) {
    return Status::invalid_argument("gather: negative count (" + std::to_string(params.count) +
                                    " from " + std::to_string(params.source_count) + ")");
  }
  return Status::ok();
}

Status check_gather_rows(const RowGatherParams& params) {
  if (params.rows < 0 || params.source_rows < 0 || params.width < 0 ||
      params.out_width < params.width) {
    return Status::invalid_argument(
        "gather_rows: rows and source rows >= 0 and 0 <= width <= out_width, got " +
        std::to_string(params.rows) + " rows of " + std::to_string(params.width) + " into " +
        std::to_string(params.out_width) + " from " + std::to_string(params.source_rows));
  }
  return Status::ok();
}

Status check_logits(const LogitsParams& params) {
  if (params.rows < 0 || params.vocab < 1 || params.vocab > INT32_MAX) {
    return Status::invalid_argument("logits: rows >= 0 and vocab in [1, 2^31 - 1], got " +
                                    std::to_string(params.rows) + " x " +
                                    std::to_string(params.vocab));
  }
  return Status::ok();
}

Status check_logit_edits(const LogitEditParams& params, const uint32_t* masks) {
  if (Status status = check_logits({params.rows, params.vocab}); !status.is_ok()) return status;
  const int64_t words = (params.vocab + 31) / 32;
  if ((params.mask_words != 0 && params.mask_words != words) ||
      (params.mask_words != 0) != (masks != nullptr)) {
    return Status::invalid_argument(
        "edit_logits: mask_words 0 without masks or " + std::to_string(words) + " with them, got " +
        std::to_string(params.mask_words) + (masks != nullptr ? " with masks" : " without masks"));
  }
  return Status::ok();
}

Status check_logprobs(const LogprobParams& params) {
  if (Status status = check_logits({params.rows, params.vocab}); !status.is_ok()) return status;
  if (params.top < 0 || params.top > kMaxTopLogprobs) {
    return Status::invalid_argument("token_logprobs: top in [0, " +
                                    std::to_string(kMaxTopLogprobs) + "], got " +
                                    std::to_string(params.top));
  }
  return Status::ok();
}

Status check_verify(const VerifyParams& params, const float* q, const int32_t* alternates,
                    const int64_t* alternate_rows) {
  if (params.batch < 0 || params.gamma < 0 || params.p_rows < 0 || params.vocab < 1 ||
      params.vocab > INT32_MAX || params.vocab_q < 0 || params.vocab_q > INT32_MAX) {
    return Status::invalid_argument("verify: bad shape");
  }
  if (q != nullptr && params.vocab_q < 1) {
    return Status::invalid_argument("verify: q without its width");
  }
  if (params.alternates_width < 0 || params.alternates_width > kMaxAlternates ||
      (params.alternates_width > 0) != (alternates != nullptr) ||
      (alternates != nullptr) != (alternate_rows != nullptr)) {
    return Status::invalid_argument(
        "verify: alternates need their width (1 to 16) and the rows scored after them");
  }
  return Status::ok();
}

Status check_sample(const SampleParams& params, const int32_t* tokens) {
  if (params.rows < 0 || params.width < 1 || params.width > INT32_MAX ||
      params.vocab < params.width || params.vocab > INT32_MAX ||
      (tokens == nullptr && params.vocab != params.width)) {
    return Status::invalid_argument(
        "sample: rows >= 0, width in [1, 2^31 - 1] and vocab at least width (equal without a "
        "token map), got " +
        std::to_string(params.rows) + " x " + std::to_string(params.width) + ", vocab " +
        std::to_string(params.vocab));
  }
  return Status::ok();
}

// ---- the ops: shapes checked once, then the backend's implementation ----------------------

Status Backend::embedding(const EmbeddingParams& params, const int32_t* token_ids,
                          const void* table, float* out) {
  if (Status status = check_embedding(params); !status.is_ok()) return status;
  return run_embedding(params, token_ids, table, out);
}
Status Backend::rmsnorm(const RmsNormParams& params, const float* x, const void* weight,
                        float* out) {
  if (Status status = check_rmsnorm(params, "rmsnorm"); !status.is_ok()) return status;
  return run_rmsnorm(params, x, weight, out);
}
Status Backend::matmul(const MatmulParams& params, const float* x, const void* weight,
                       const float* weight_scales, const void* bias, float* out) {
  if (Status status = check_matmul(params, weight_scales); !status.is_ok()) return status;
  return run_matmul(params, x, weight, weight_scales, bias, out);
}
Status Backend::matmul_group(const float* x, const MatmulTarget* targets, size_t count) {
  if (Status status = check_matmul_group(targets, count); !status.is_ok()) return status;
  return run_matmul_group(x, targets, count);
}
Status Backend::rope(const RopeParams& params, const int32_t* positions, const float* inv_freq,
                     float* q, float* k) {
  if (Status status = check_rope(params); !status.is_ok()) return status;
  return run_rope(params, positions, inv_freq, q, k);
}
Status Backend::rope_kv_write(const RopeParams& rope, const KvWriteParams& cache,
                              const int32_t* positions, const float* inv_freq, const int32_t* slots,
                              float* q, float* k, const float* v, void* k_cache, void* v_cache) {
  if (Status status = check_rope_kv_write(rope, cache); !status.is_ok()) return status;
  return run_rope_kv_write(rope, cache, positions, inv_freq, slots, q, k, v, k_cache, v_cache);
}
Status Backend::kv_write(const KvWriteParams& params, const float* k, const float* v,
                         const int32_t* slots, void* k_cache, void* v_cache) {
  if (Status status = check_kv_write(params); !status.is_ok()) return status;
  return run_kv_write(params, k, v, slots, k_cache, v_cache);
}
Status Backend::attention(const AttentionParams& params, const float* q, const void* k_cache,
                          const void* v_cache, const int32_t* query_start,
                          const int32_t* context_lengths, const int32_t* block_tables,
                          const int32_t* key_gaps, float* out) {
  if (Status status = check_attention(params); !status.is_ok()) return status;
  return run_attention(params, q, k_cache, v_cache, query_start, context_lengths, block_tables,
                       key_gaps, out);
}
Status Backend::gated_activation(const GatedActivationParams& params, const float* gate,
                                 const float* up, float* out) {
  if (Status status = check_gated_activation(params); !status.is_ok()) return status;
  return run_gated_activation(params, gate, up, out);
}
Status Backend::fill_uniform(const FillParams& params, void* out) {
  if (Status status = check_fill(params); !status.is_ok()) return status;
  return run_fill_uniform(params, out);
}
Status Backend::gather(const GatherParams& params, const int32_t* source, const int32_t* index,
                       int32_t* out) {
  if (Status status = check_gather(params); !status.is_ok()) return status;
  return run_gather(params, source, index, out);
}
Status Backend::gather_rows(const RowGatherParams& params, const float* source,
                            const int32_t* index, const int32_t* columns, float* out) {
  if (Status status = check_gather_rows(params); !status.is_ok()) return status;
  return run_gather_rows(params, source, index, columns, out);
}
Status Backend::process_logits(const LogitsParams& params, const float* logits,
                               const LogitsSettings* settings, float* probs, int32_t* row_status) {
  if (Status status = check_logits(params); !status.is_ok()) return status;
  return run_process_logits(params, logits, settings, probs, row_status);
}
Status Backend::argmax(const LogitsParams& params, const float* values, int32_t* out) {
  if (Status status = check_logits(params); !status.is_ok()) return status;
  return run_argmax(params, values, out);
}
Status Backend::edit_logits(const LogitEditParams& params, const int64_t* edit_begin,
                            const LogitEdit* edits, const uint32_t* masks, float* logits) {
  if (Status status = check_logit_edits(params, masks); !status.is_ok()) return status;
  return run_edit_logits(params, edit_begin, edits, masks, logits);
}
Status Backend::token_logprobs(const LogprobParams& params, const float* logits,
                               const int32_t* token_slots, const int32_t* tokens, float* chosen,
                               int32_t* top_tokens, float* top_logprobs) {
  if (Status status = check_logprobs(params); !status.is_ok()) return status;
  return run_token_logprobs(params, logits, token_slots, tokens, chosen, top_tokens, top_logprobs);
}
Status Backend::verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                       const int32_t* p_status, const float* q, const int32_t* drafts,
                       const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                       int32_t* accepted, int32_t* alternate_taken) {
  if (Status status = check_verify(params, q, alternates, alternate_rows); !status.is_ok())
    return status;
  return run_verify(params, rows, p, p_status, q, drafts, alternates, alternate_rows, tokens,
                    accepted, alternate_taken);
}
Status Backend::sample(const SampleParams& params, const SampleRow* rows, const float* logits,
                       const int32_t* tokens, float* q, SampledRow* out, int32_t* drawn) {
  if (Status status = check_sample(params, tokens); !status.is_ok()) return status;
  return run_sample(params, rows, logits, tokens, q, out, drawn);
}
Status Backend::add(int64_t count, const float* addend, float* accumulator) {
  if (Status status = check_add(count); !status.is_ok()) return status;
  return run_add(count, addend, accumulator);
}
Status Backend::add_rmsnorm(const RmsNormParams& params, const float* addend, float* accumulator,
                            const void* weight, float* out) {
  if (Status status = check_rmsnorm(params, "add_rmsnorm"); !status.is_ok()) return status;
  return run_add_rmsnorm(params, addend, accumulator, weight, out);
}

// The fused ops' defaults: the ops they fuse, one after another.
Status Backend::run_matmul_group(const float* x, const MatmulTarget* targets, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    if (Status status = matmul(t.params, x, t.weight, t.weight_scales, t.bias, t.out);
        !status.is_ok()) {
      return status;
    }
  }
  return Status::ok();
}

Status Backend::run_rope_kv_write(const RopeParams& rope, const KvWriteParams& cache,
                                  const int32_t* positions, const float* inv_freq,
                                  const int32_t* slots, float* q, float* k, const float* v,
                                  void* k_cache, void* v_cache) {
  if (Status status = this->rope(rope, positions, inv_freq, q, k); !status.is_ok()) return status;
  return kv_write(cache, k, v, slots, k_cache, v_cache);
}

Status Backend::run_add_rmsnorm(const RmsNormParams& params, const float* addend,
                                float* accumulator, const void* weight, float* out) {
  if (Status status = add(params.rows * params.dim, addend, accumulator); !status.is_ok()) {
    return status;
  }
  return rmsnorm(params, accumulator, weight, out);
}

void Backend::for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace specrun::kernels
