#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/fill.h"
#include "kernels/cpu/gather.h"
#include "kernels/cpu/logit_edits.h"
#include "kernels/cpu/logprobs.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/verify.h"

namespace specrun::kernels::cpu {

namespace {
// Cache-line alignment: enough for every dtype and for 512-bit vector loads.
constexpr size_t kAlignment = 64;
}  // namespace

CpuBackend::CpuBackend(std::shared_ptr<ThreadPool> pool, Activations activations,
                       const MatmulVariant* variant)
    : pool_(std::move(pool)),
      activations_(activations),
      variant_(variant != nullptr ? variant : &best_matmul_variant()) {}

namespace {

// A CPU event: nothing to mark, since every op has run when its call returns.
class InlineEvent final : public Event {};

}  // namespace

std::unique_ptr<Backend> CpuBackend::create_stream() {
  auto stream = std::make_unique<CpuBackend>(pool_, activations_, variant_);
  stream->set_notice_handler(notice_handler());
  return stream;
}

std::unique_ptr<Event> CpuBackend::create_event() {
  return std::make_unique<InlineEvent>();
}

Status CpuBackend::record(Event& event) {
  if (dynamic_cast<InlineEvent*>(&event) == nullptr) {
    return Status::invalid_argument("record: an event of another backend");
  }
  return Status::ok();
}

Status CpuBackend::wait(const Event& event) {
  if (dynamic_cast<const InlineEvent*>(&event) == nullptr) {
    return Status::invalid_argument("wait: an event of another backend");
  }
  return Status::ok();
}

std::string_view CpuBackend::matmul_activations() const {
  switch (activations_) {
    case Activations::kF32:
      return "f32";
    case Activations::kBF16:
      return "bf16";
    case Activations::kInt8:
      return "int8";
    case Activations::kF32Int8Blocks:
      return "f32 (int8 for GGUF blocks)";
  }
  return "f32";
}

WeightLayout CpuBackend::matmul_weight_layout(DType weight_dtype) const {
  if (is_block_quantized(weight_dtype)) return WeightLayout::kRows;  // GGUF blocks as stored
  return rounds_to_bf16(activations_) && weight_dtype == DType::kBF16 ? variant_->bf16_pairs_layout
                                                                      : WeightLayout::kTiled;
}

void* CpuBackend::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  return std::aligned_alloc(kAlignment, rounded);
}

void CpuBackend::deallocate(void* pointer) noexcept {
  std::free(pointer);
}

Status CpuBackend::available_memory(uint64_t* bytes) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") {
      *bytes = kilobytes * 1024;
      return Status::ok();
    }
  }
  return Status::unsupported("available memory: no MemAvailable in /proc/meminfo");
}

void CpuBackend::for_each_on_host(int64_t count, const std::function<void(int64_t)>& body) {
  // The pool's threads must not throw: the first exception waits here for the others to finish.
  std::mutex mutex;
  std::exception_ptr first_error;
  pool_->parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        body(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
    }
  });
  if (first_error) std::rethrow_exception(first_error);
}

Status CpuBackend::time_ms(const std::function<Status()>& work, double* milliseconds) {
  const auto start = std::chrono::steady_clock::now();
  const Status status = work();
  *milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return status;
}

Status CpuBackend::copy_to_device(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes != 0) std::memcpy(device_dst, host_src, bytes);
  return Status::ok();
}

Status CpuBackend::copy_to_host(void* host_dst, const void* device_src, size_t bytes) {
  count_copy_to_host(bytes);
  if (bytes != 0) std::memcpy(host_dst, device_src, bytes);
  return Status::ok();
}

Status CpuBackend::copy_on_device(void* device_dst, const void* device_src, size_t bytes) {
  if (bytes != 0) std::memmove(device_dst, device_src, bytes);
  return Status::ok();
}

Status CpuBackend::run_embedding(const EmbeddingParams& params, const int32_t* token_ids,
                                 const void* table, float* out) {
  return cpu::embedding(params, token_ids, table, out, *pool_);
}

Status CpuBackend::run_rmsnorm(const RmsNormParams& params, const float* x, const void* weight,
                               float* out) {
  return cpu::rmsnorm(params, x, weight, out, *pool_);
}

Status CpuBackend::run_matmul(const MatmulParams& params, const float* x, const void* weight,
                              const float* weight_scales, const void* bias, float* out) {
  return cpu::matmul(params, x, weight, weight_scales, bias, out, *pool_, activations_, variant_);
}

Status CpuBackend::run_matmul_group(const float* x, const MatmulTarget* targets, size_t count) {
  return cpu::matmul_group(x, targets, count, *pool_, activations_, variant_);
}

Status CpuBackend::run_rope(const RopeParams& params, const int32_t* positions,
                            const float* inv_freq, float* q, float* k) {
  return cpu::rope(params, positions, inv_freq, q, k, *pool_);
}

Status CpuBackend::run_kv_write(const KvWriteParams& params, const float* k, const float* v,
                                const int32_t* slots, void* k_cache, void* v_cache) {
  return cpu::kv_write(params, k, v, slots, k_cache, v_cache, *pool_);
}

Status CpuBackend::run_attention(const AttentionParams& params, const float* q, const void* k_cache,
                                 const void* v_cache, const int32_t* query_start,
                                 const int32_t* context_lengths, const int32_t* block_tables,
                                 const int32_t* key_gaps, float* out) {
  return cpu::attention(params, q, k_cache, v_cache, query_start, context_lengths, block_tables,
                        key_gaps, out, *pool_);
}

Status CpuBackend::run_gated_activation(const GatedActivationParams& params, const float* gate,
                                        const float* up, float* out) {
  return cpu::gated_activation(params, gate, up, out, *pool_);
}

Status CpuBackend::run_add(int64_t count, const float* addend, float* accumulator) {
  return cpu::add(count, addend, accumulator, *pool_);
}

Status CpuBackend::run_fill_uniform(const FillParams& params, void* out) {
  return cpu::fill_uniform(params, out, *pool_);
}

Status CpuBackend::run_gather(const GatherParams& params, const int32_t* source,
                              const int32_t* index, int32_t* out) {
  return cpu::gather(params, source, index, out);
}

Status CpuBackend::run_gather_rows(const RowGatherParams& params, const float* source,
                                   const int32_t* index, const int32_t* columns, float* out) {
  return cpu::gather_rows(params, source, index, columns, out);
}

Status CpuBackend::run_process_logits(const LogitsParams& params, const float* logits,
                                      const LogitsSettings* settings, float* probs,
                                      int32_t* row_status) {
  const auto vocab = static_cast<size_t>(params.vocab);
  for_each_on_host(params.rows, [&](int64_t r) {
    const auto offset = static_cast<size_t>(r) * vocab;
    row_status[r] = static_cast<int32_t>(
        cpu::process_logits(settings[r], {logits + offset, vocab}, {probs + offset, vocab}));
  });
  return Status::ok();
}

Status CpuBackend::run_argmax(const LogitsParams& params, const float* values, int32_t* out) {
  const auto vocab = static_cast<size_t>(params.vocab);
  for (int64_t r = 0; r < params.rows; ++r) {
    out[r] = cpu::argmax({values + static_cast<size_t>(r) * vocab, vocab});
  }
  return Status::ok();
}

Status CpuBackend::run_edit_logits(const LogitEditParams& params, const int64_t* edit_begin,
                                   const LogitEdit* edits, const uint32_t* masks, float* logits) {
  const auto vocab = static_cast<size_t>(params.vocab);
  const auto words = static_cast<size_t>(params.mask_words);
  for_each_on_host(params.rows, [&](int64_t r) {
    const auto first = static_cast<size_t>(edit_begin[r]);
    const auto count = static_cast<size_t>(edit_begin[r + 1] - edit_begin[r]);
    cpu::edit_logits({edits + first, count},
                     masks == nullptr ? std::span<const uint32_t>()
                                      : std::span<const uint32_t>(masks + r * words, words),
                     {logits + static_cast<size_t>(r) * vocab, vocab});
  });
  return Status::ok();
}

Status CpuBackend::run_token_logprobs(const LogprobParams& params, const float* logits,
                                      const int32_t* token_slots, const int32_t* tokens,
                                      float* chosen, int32_t* top_tokens, float* top_logprobs) {
  const auto vocab = static_cast<size_t>(params.vocab);
  const auto top = static_cast<size_t>(params.top);
  for_each_on_host(params.rows, [&](int64_t r) {
    const int32_t token = token_slots[r] >= 0 ? tokens[token_slots[r]] : -1;
    cpu::token_logprobs({logits + static_cast<size_t>(r) * vocab, vocab}, token, chosen + r,
                        {top_tokens + static_cast<size_t>(r) * top, top},
                        {top_logprobs + static_cast<size_t>(r) * top, top});
  });
  return Status::ok();
}

Status CpuBackend::run_sample(const SampleParams& params, const SampleRow* rows,
                              const float* logits, const int32_t* tokens, float* q, SampledRow* out,
                              int32_t* drawn) {
  const auto width = static_cast<size_t>(params.width);
  const std::span<const int32_t> map =
      tokens == nullptr ? std::span<const int32_t>() : std::span<const int32_t>(tokens, width);
  for_each_on_host(params.rows, [&](int64_t r) {
    const size_t offset = static_cast<size_t>(r) * width;
    cpu::sample_row(rows[r], {logits + offset, width}, map, {q + offset, width}, out + r);
    if (drawn != nullptr) drawn[r] = std::max(out[r].token, 0);
  });
  return Status::ok();
}

Status CpuBackend::run_verify(const VerifyParams& params, const VerifyRow* rows, const float* p,
                              const int32_t* p_status, const float* q, const int32_t* drafts,
                              const int32_t* alternates, const int64_t* alternate_rows,
                              int32_t* tokens, int32_t* accepted, int32_t* alternate_taken) {
  const int64_t gamma = params.gamma;
  const int64_t width = params.alternates_width;
  for_each_on_host(params.batch, [&](int64_t b) {
    cpu::verify_row(params, rows[b], p, p_status,
                    q == nullptr ? nullptr : q + b * gamma * params.vocab_q, drafts + b * gamma,
                    alternates == nullptr ? nullptr : alternates + b * gamma * width,
                    alternate_rows == nullptr ? nullptr : alternate_rows + b * gamma * width,
                    tokens + b * (gamma + 1), accepted + b, alternate_taken + b);
  });
  return Status::ok();
}

}  // namespace specrun::kernels::cpu
