#include "kernels/backend.h"

#include <climits>
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

Status check_logits(const LogitsParams& params) {
  if (params.rows < 0 || params.vocab < 1 || params.vocab > INT32_MAX) {
    return Status::invalid_argument("logits: rows >= 0 and vocab in [1, 2^31 - 1], got " +
                                    std::to_string(params.rows) + " x " +
                                    std::to_string(params.vocab));
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

void Backend::for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) {
  for (int64_t i = 0; i < count; ++i) body(i);
}

}  // namespace specrun::kernels
