#include "kernels/cuda/logit_edits.h"

#include <cmath>

#include "kernels/cuda/common.cuh"

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    edit_logits_kernel(const int64_t* edit_begin,  // [rows + 1]
                       const LogitEdit* edits,     // [edit_begin[rows]]
                       const uint32_t* masks,      // [rows, mask_words] or null
                       int64_t vocab, int64_t mask_words,
                       float* logits) {  // [rows, vocab]
  const int64_t r = blockIdx.x;
  float* row = logits + r * vocab;
  for (int64_t e = edit_begin[r] + threadIdx.x; e < edit_begin[r + 1]; e += kThreads) {
    const LogitEdit edit = edits[e];
    if (edit.token < 0 || edit.token >= vocab) continue;
    const float x = row[edit.token];
    const float scaled = x > 0.0f ? __fdiv_rn(x, edit.repetition) : __fmul_rn(x, edit.repetition);
    row[edit.token] = __fadd_rn(scaled, edit.add);
  }
  if (masks == nullptr) return;
  // The mask wins over an edit of the same token, as on the CPU, which edits first.
  __syncthreads();
  const uint32_t* mask = masks + r * mask_words;
  for (int64_t t = threadIdx.x; t < vocab; t += kThreads) {
    if (((mask[t / 32] >> (t % 32)) & 1u) == 0) row[t] = -INFINITY;
  }
}

}  // namespace

Status launch_edit_logits(const LogitEditParams& params, const int64_t* edit_begin,
                          const LogitEdit* edits, const uint32_t* masks, float* logits,
                          CUstream_st* stream) {
  if (Status status = check_logit_edits(params, masks); !status.is_ok()) return status;
  if (params.rows > INT32_MAX) return Status::unsupported("edit_logits: more than 2^31 - 1 rows");
  if (params.rows == 0) return Status::ok();
  if (edit_begin == nullptr || logits == nullptr) {
    return Status::invalid_argument("edit_logits: null pointer");
  }
  edit_logits_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(
      edit_begin, edits, masks, params.vocab, params.mask_words, logits);
  return launch_status("edit_logits kernel");
}

}  // namespace specrun::kernels::cuda
