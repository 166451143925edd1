#include "kernels/cuda/embedding.h"

#include <cstdint>

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// blockIdx.x: token. The vector path moves 16 bytes of the table per thread and step; it needs dim
// to be a multiple of the vector width and both buffers 16-byte aligned, so that every row starts
// aligned too.
template <DType kDType, bool kVector>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const int32_t* token_ids,  // [num_tokens]
                     const void* table,         // [vocab_size, dim]
                     float* out,                // [num_tokens, dim]
                     int64_t vocab_size, int64_t dim, float scale, DeviceErrorRecord* errors) {
  using T = typename Stored<kDType>::Type;
  const int64_t token = blockIdx.x;
  const int32_t id = token_ids[token];
  float* destination = out + token * dim;  // [dim]
  if (id < 0 || id >= vocab_size) {
    if (threadIdx.x == 0) report_device_error(errors, DeviceCheck::kTokenId, token, id, vocab_size);
    for (int64_t c = threadIdx.x; c < dim; c += kThreads)
      destination[c] = __int_as_float(0x7fc00000);
    return;
  }
  const T* row = static_cast<const T*>(table) + static_cast<int64_t>(id) * dim;  // [dim]
  if constexpr (kVector) {
    constexpr int kVec = kVectorElements<kDType>;
    for (int64_t v = threadIdx.x; v < dim / kVec; v += kThreads) {
      float values[kVec];
      load_vector<kDType>(row + v * kVec, values);
      float4* target = reinterpret_cast<float4*>(destination + v * kVec);
#pragma unroll
      for (int i = 0; i < kVec / 4; ++i) {
        target[i] =
            make_float4(__fmul_rn(values[4 * i], scale), __fmul_rn(values[4 * i + 1], scale),
                        __fmul_rn(values[4 * i + 2], scale), __fmul_rn(values[4 * i + 3], scale));
      }
    }
  } else {
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
      destination[c] = __fmul_rn(Stored<kDType>::widen(row[c]), scale);
    }
  }
}

template <DType kDType>
void launch_typed(const EmbeddingParams& params, const int32_t* token_ids, const void* table,
                  float* out, DeviceErrorRecord* errors, cudaStream_t stream) {
  const bool vector =
      params.dim % kVectorElements<kDType> == 0 && is_aligned(table, 16) && is_aligned(out, 16);
  const dim3 grid(static_cast<unsigned>(params.num_tokens));
  if (vector) {
    embedding_kernel<kDType, true><<<grid, kThreads, 0, stream>>>(
        token_ids, table, out, params.vocab_size, params.dim, params.scale, errors);
  } else {
    embedding_kernel<kDType, false><<<grid, kThreads, 0, stream>>>(
        token_ids, table, out, params.vocab_size, params.dim, params.scale, errors);
  }
}

}  // namespace

Status launch_embedding(const EmbeddingParams& params, const int32_t* token_ids, const void* table,
                        float* out, DeviceErrorRecord* errors, cudaStream_t stream) {
  if (Status status = check_embedding(params); !status.is_ok()) return status;
  if (params.table_layout != WeightLayout::kRows) {
    return Status::unsupported("embedding: the CUDA kernel reads a row-major table only");
  }
  if (params.num_tokens == 0) return Status::ok();
  if (params.num_tokens > INT32_MAX) {
    return Status::unsupported("embedding: more than 2^31 - 1 tokens in one call");
  }
  switch (params.table_dtype) {
    case DType::kF32:
      launch_typed<DType::kF32>(params, token_ids, table, out, errors, stream);
      break;
    case DType::kF16:
      launch_typed<DType::kF16>(params, token_ids, table, out, errors, stream);
      break;
    case DType::kBF16:
      launch_typed<DType::kBF16>(params, token_ids, table, out, errors, stream);
      break;
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ8_0:
      return Status::unsupported("embedding: a quantized table (embeddings stay in bf16)");
  }
  return launch_status("embedding kernel");
}

}  // namespace specrun::kernels::cuda
