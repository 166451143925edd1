#include "kernels/cuda/rope.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace specrun::kernels::cuda {
namespace {

constexpr int kThreads = 128;

struct RopeArgs {
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [half]
  float* q;                  // [num_tokens, num_heads, head_dim]
  float* k;                  // [num_tokens, num_kv_heads, head_dim]
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  bool interleaved;
  // Fused cache write; k_cache is null for plain rope.
  const float* v;        // [num_tokens, num_kv_heads, head_dim]
  const int32_t* slots;  // [num_tokens]
  void* k_cache;         // [num_slots, num_kv_heads, head_dim] f32, or bf16 when cache_bf16
  void* v_cache;         // [num_slots, num_kv_heads, head_dim] f32, or bf16 when cache_bf16
  int64_t num_slots;
  DeviceErrorRecord* errors;
  bool cache_bf16;
};

// Element `index` of a cache row, stored in the cache's dtype.
__device__ __forceinline__ void store_cache(void* row, int64_t index, float value, bool bf16) {
  if (bf16) {
    static_cast<uint16_t*>(row)[index] = round_to_bf16(value);
  } else {
    static_cast<float*>(row)[index] = value;
  }
}

// Rotates channel pair `i` of one head in place; returns the two rotated values through
// first/second for a fused cache write.
__device__ __forceinline__ void rotate_pair(float* head, int64_t i, int64_t half, bool interleaved,
                                            float cosine, float sine, int64_t* first_index,
                                            int64_t* second_index, float* first, float* second) {
  const int64_t a = interleaved ? 2 * i : i;
  const int64_t b = interleaved ? 2 * i + 1 : i + half;
  const float x1 = head[a];
  const float x2 = head[b];
  *first = __fsub_rn(__fmul_rn(x1, cosine), __fmul_rn(x2, sine));
  *second = __fadd_rn(__fmul_rn(x2, cosine), __fmul_rn(x1, sine));
  head[a] = *first;
  head[b] = *second;
  *first_index = a;
  *second_index = b;
}

// blockIdx.x: token; blockIdx.y: a slice of the token's rotations (and cache copies), striding by
// the grid's width in y so that one token's work spreads over several multiprocessors (a decode
// step has one token). Each block computes the token's angles for itself. Dynamic shared memory:
// [2, half] floats, the token's cos and sin.
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs args) {
  extern __shared__ float angles[];  // [2, half]
  const int64_t token = blockIdx.x;
  const int64_t half = args.head_dim / 2;
  float* cosines = angles;
  float* sines = angles + half;
  const double position = static_cast<double>(args.positions[token]);
  for (int64_t i = threadIdx.x; i < half; i += kThreads) {
    double s, c;
    sincos(position * static_cast<double>(args.inv_freq[i]), &s, &c);
    cosines[i] = static_cast<float>(c);
    sines[i] = static_cast<float>(s);
  }
  __syncthreads();

  // Work item e = head * half + i: consecutive threads take consecutive pairs of one head, so the
  // rotate-half loads of a warp are contiguous and the interleaved ones nearly so.
  float* q_row = args.q + token * args.num_heads * args.head_dim;  // [num_heads, head_dim]
  const int64_t first = blockIdx.y * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kThreads;
  for (int64_t e = first; e < args.num_heads * half; e += stride) {
    const int64_t head = e / half;
    const int64_t i = e % half;
    int64_t a, b;
    float first, second;
    rotate_pair(q_row + head * args.head_dim, i, half, args.interleaved, cosines[i], sines[i], &a,
                &b, &first, &second);
  }

  const int64_t kv_row = args.num_kv_heads * args.head_dim;
  float* k_row = args.k + token * kv_row;  // [num_kv_heads, head_dim]
  bool store = false;
  int64_t slot = 0;
  if (args.k_cache != nullptr) {
    slot = args.slots[token];
    store = slot >= 0 && slot < args.num_slots;
    if (!store && threadIdx.x == 0 && blockIdx.y == 0) {
      report_device_error(args.errors, DeviceCheck::kSlot, token, slot, args.num_slots);
    }
  }
  const int64_t element_bytes = args.cache_bf16 ? 2 : 4;
  // [num_kv_heads, head_dim] of the cache
  void* k_target =
      store ? static_cast<char*>(args.k_cache) + slot * kv_row * element_bytes : nullptr;
  for (int64_t e = first; e < args.num_kv_heads * half; e += stride) {
    const int64_t head = e / half;
    const int64_t i = e % half;
    int64_t a, b;
    float first, second;
    rotate_pair(k_row + head * args.head_dim, i, half, args.interleaved, cosines[i], sines[i], &a,
                &b, &first, &second);
    if (store) {
      store_cache(k_target, head * args.head_dim + a, first, args.cache_bf16);
      store_cache(k_target, head * args.head_dim + b, second, args.cache_bf16);
    }
  }
  if (store) {
    const float* v_row = args.v + token * kv_row;  // [num_kv_heads, head_dim]
    void* v_target = static_cast<char*>(args.v_cache) + slot * kv_row * element_bytes;
    for (int64_t c = first; c < kv_row; c += stride) {
      store_cache(v_target, c, v_row[c], args.cache_bf16);
    }
  }
}

// Four f32 values in the cache's element type: as they are, or rounded to bf16.
__device__ __forceinline__ float4 to_cache4(float4 value, float) {
  return value;
}
__device__ __forceinline__ uint2 to_cache4(float4 value, uint16_t) {
  return make_uint2(round_to_bf16(value.x) | static_cast<uint32_t>(round_to_bf16(value.y)) << 16,
                    round_to_bf16(value.z) | static_cast<uint32_t>(round_to_bf16(value.w)) << 16);
}
__device__ __forceinline__ float to_cache(float value, float) {
  return value;
}
__device__ __forceinline__ uint16_t to_cache(float value, uint16_t) {
  return round_to_bf16(value);
}

// blockIdx.x: token. Stores one k row and one v row ([num_kv_heads * head_dim] each) as Element:
// float for an f32 cache, uint16_t (bf16 bits) for a bf16 one.
template <typename Element, bool kVector>
__global__ void __launch_bounds__(kThreads)
    kv_write_kernel(const float* k,        // [num_tokens, row]
                    const float* v,        // [num_tokens, row]
                    const int32_t* slots,  // [num_tokens]
                    Element* k_cache,      // [num_slots, row]
                    Element* v_cache,      // [num_slots, row]
                    int64_t row, int64_t num_slots, DeviceErrorRecord* errors) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= num_slots) {
    if (threadIdx.x == 0) report_device_error(errors, DeviceCheck::kSlot, token, slot, num_slots);
    return;
  }
  if constexpr (kVector) {
    using Quad = decltype(to_cache4(float4{}, Element{}));
    const float4* k_source = reinterpret_cast<const float4*>(k + token * row);
    const float4* v_source = reinterpret_cast<const float4*>(v + token * row);
    Quad* k_target = reinterpret_cast<Quad*>(k_cache + slot * row);
    Quad* v_target = reinterpret_cast<Quad*>(v_cache + slot * row);
    for (int64_t i = threadIdx.x; i < row / 4; i += kThreads) {
      k_target[i] = to_cache4(k_source[i], Element{});
      v_target[i] = to_cache4(v_source[i], Element{});
    }
  } else {
    for (int64_t i = threadIdx.x; i < row; i += kThreads) {
      k_cache[slot * row + i] = to_cache(k[token * row + i], Element{});
      v_cache[slot * row + i] = to_cache(v[token * row + i], Element{});
    }
  }
}

template <typename Element>
void launch_kv_write_kernel(bool vector, unsigned tokens, const float* k, const float* v,
                            const int32_t* slots, void* k_cache, void* v_cache, int64_t row,
                            int64_t num_slots, DeviceErrorRecord* errors, cudaStream_t stream) {
  auto* keys = static_cast<Element*>(k_cache);
  auto* values = static_cast<Element*>(v_cache);
  if (vector) {
    kv_write_kernel<Element, true>
        <<<tokens, kThreads, 0, stream>>>(k, v, slots, keys, values, row, num_slots, errors);
  } else {
    kv_write_kernel<Element, false>
        <<<tokens, kThreads, 0, stream>>>(k, v, slots, keys, values, row, num_slots, errors);
  }
}

// Backend's shape check (kernels/backend.h), then what this kernel cannot do.
Status check_rope_shape(const RopeParams& params) {
  if (Status status = check_rope(params); !status.is_ok()) return status;
  if (params.num_tokens > INT32_MAX) return Status::unsupported("rope: more than 2^31 - 1 tokens");
  // The angles of one token live in shared memory.
  if (params.head_dim * static_cast<int64_t>(sizeof(float)) > 48 * 1024) {
    return Status::unsupported("rope: head_dim above 12288");
  }
  return Status::ok();
}

Status launch_rope_kernel(const RopeArgs& args, int64_t num_tokens, cudaStream_t stream) {
  const size_t shared_bytes = static_cast<size_t>(args.head_dim) * sizeof(float);  // 2 * half
  // Enough slices for the query rotations of one token, at most 16: one thread per rotation.
  const int64_t rotations = args.num_heads * (args.head_dim / 2);
  const auto slices =
      static_cast<unsigned>(std::clamp<int64_t>((rotations + kThreads - 1) / kThreads, 1, 16));
  const dim3 grid(static_cast<unsigned>(num_tokens), slices);
  rope_kernel<<<grid, kThreads, shared_bytes, stream>>>(args);
  return launch_status("rope kernel");
}

}  // namespace

Status launch_rope(const RopeParams& params, const int32_t* positions, const float* inv_freq,
                   float* q, float* k, cudaStream_t stream) {
  if (Status status = check_rope_shape(params); !status.is_ok()) return status;
  if (params.num_tokens == 0) return Status::ok();
  const RopeArgs args{positions,
                      inv_freq,
                      q,
                      k,
                      params.num_heads,
                      params.num_kv_heads,
                      params.head_dim,
                      params.style == RopeStyle::kInterleaved,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr,
                      0,
                      nullptr,
                      false};
  return launch_rope_kernel(args, params.num_tokens, stream);
}

Status launch_kv_write(const KvWriteParams& params, const float* k, const float* v,
                       const int32_t* slots, void* k_cache, void* v_cache,
                       DeviceErrorRecord* errors, cudaStream_t stream) {
  if (Status status = check_kv_write(params); !status.is_ok()) return status;
  if (params.num_tokens == 0) return Status::ok();
  if (params.num_tokens > INT32_MAX) {
    return Status::unsupported("kv_write: more than 2^31 - 1 tokens");
  }
  const int64_t row = params.num_kv_heads * params.head_dim;
  const bool bf16 = params.cache_dtype == DType::kBF16;
  // Four elements a load and a store: 16 bytes of k and v, 16 (f32) or 8 (bf16) of the cache.
  const size_t cache_quad_bytes = bf16 ? 8 : 16;
  const bool vector = row % 4 == 0 && is_aligned(k, 16) && is_aligned(v, 16) &&
                      is_aligned(k_cache, cache_quad_bytes) &&
                      is_aligned(v_cache, cache_quad_bytes);
  const auto tokens = static_cast<unsigned>(params.num_tokens);
  if (bf16) {
    launch_kv_write_kernel<uint16_t>(vector, tokens, k, v, slots, k_cache, v_cache, row,
                                     params.num_slots, errors, stream);
  } else {
    launch_kv_write_kernel<float>(vector, tokens, k, v, slots, k_cache, v_cache, row,
                                  params.num_slots, errors, stream);
  }
  return launch_status("kv_write kernel");
}

Status launch_rope_kv_write(const RopeKvWriteParams& params, const int32_t* positions,
                            const float* inv_freq, const int32_t* slots, float* q, float* k,
                            const float* v, void* k_cache, void* v_cache, DeviceErrorRecord* errors,
                            cudaStream_t stream) {
  // The cache write describes the rotation's tokens and heads by construction: its own check
  // (shape and dtype) and the rotation's are all there is.
  const RopeParams& rope = params.rope;
  if (Status status = check_rope_shape(rope); !status.is_ok()) return status;
  if (Status status = check_kv_write({rope.num_tokens, rope.num_kv_heads, rope.head_dim,
                                      params.num_slots, params.cache_dtype});
      !status.is_ok()) {
    return status;
  }
  if (params.rope.num_tokens == 0) return Status::ok();
  const RopeArgs args{positions,
                      inv_freq,
                      q,
                      k,
                      params.rope.num_heads,
                      params.rope.num_kv_heads,
                      params.rope.head_dim,
                      params.rope.style == RopeStyle::kInterleaved,
                      v,
                      slots,
                      k_cache,
                      v_cache,
                      params.num_slots,
                      errors,
                      params.cache_dtype == DType::kBF16};
  return launch_rope_kernel(args, params.rope.num_tokens, stream);
}

}  // namespace specrun::kernels::cuda
